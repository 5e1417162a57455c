"""Benchmark: the corpus audit of generated reports (`cxr_audit.concentration.audit_concentration`) on 1,000,000
reports.

The SYNTHETIC generations table has 5 configurations of 200,000 reports each, assembled from a sentence bank with
slots (findings, locations, severities, changes, measurements, devices and a long tail of rare terms, about 2,400
token types in all), shaped like the demo's simulated systems: two verbose systems that almost never repeat a report,
a terse one that often does, a template-collapsing one under beam search, and the same under sampling with invalid
outputs (empty strings, missing values, leaked special tokens, loops cut at the token cap and flagged `truncated`).

Timed (best of --repeat runs for ours; the baseline once, in the same run):
- ours_s: `audit_concentration(table)` with every measure (validity with reasons, unique-report ratio, duplicate rate,
  top-5 share, prefix rate, repeated 4-gram rate, Distinct-1/2, length median/IQR) plus its per-report flags table
  (its intervals and comparisons are computed on first access, and are not part of this timing);
- baseline_s: a plain-Python implementation with `collections.Counter` (per report: regular-expression tokenization,
  the same validity rules, normalization, a set of 4-grams; per group: Counters of normalized texts, sets of
  n-grams, sorted lengths), producing the same summary and the same per-report flags.
- polars_baseline_s: what a user would write today in polars (`polars_baseline`): the same normalization as a string
  expression, duplicate groups by `group_by` on the normalized text, tokens by `str.extract_all`, n-grams by list
  expressions, the validity rules as row expressions; it gives the same summary and the same flags (valid, duplicate
  group size, top-5, prefix, repeated 4-gram, length; its reasons are not spelled out).
`ours_cpu_s` (the least process CPU time of the runs, all threads; each run's in `ours_cpu_runs_s`) and the load average
are recorded too: on a shared
machine the wall times of all three rise together. The script checks that all three give the same summary (to 1e-12) and
the same flags. Writes
benchmarks/results/concentration.json and prints it. No assertions on time (target: ours <= 2 s, >= 5x the baseline).
Run: .venv/bin/python benchmarks/bench_concentration.py [--n 1000000] [--repeat 3]
"""
import os
import platform
import re
import resource
import time
from collections import Counter, defaultdict

import numpy as np
import pandas as pd
import polars as pl

from _plain_concentration import ngram_repeats, normalize, quantile, reasons, tokens
from _timing import options, write_result
from cxr_audit.concentration import DEFAULT_PREFIXES, VALIDITY_RULES, audit_concentration

MAX_TOKENS = 160

# ---------------------------------------------------------------- synthetic generations
FIND = ["pleural effusion", "pneumothorax", "consolidation", "atelectasis", "pulmonary edema", "opacity", "nodule",
        "airspace disease", "vascular congestion", "interstitial thickening", "hilar enlargement", "cardiomegaly"]
LOC = ["right upper lobe", "left upper lobe", "right lower lobe", "left lower lobe", "right lung base",
       "left lung base", "lingula", "right middle lobe", "retrocardiac region", "both lung bases", "right apex",
       "left apex", "perihilar region"]
SEV = ["small", "moderate", "large", "trace", "mild", "subtle", "extensive", "minimal"]
CHG = ["new", "unchanged", "increased", "decreased", "improved", "worsened", "stable", "slightly larger",
       "slightly smaller"]
NORMAL = ["The lungs are clear.", "There is no focal consolidation.", "No pleural effusion or pneumothorax.",
          "Heart size is normal.", "The cardiomediastinal silhouette is within normal limits.",
          "No acute osseous abnormality.", "The hila are unremarkable.", "Pulmonary vascularity is normal.",
          "The mediastinum is not widened.",
          "There is no pneumothorax.", "The visualized bones are intact.", "No free air below the diaphragm."]
TEMPLATES = ["No acute cardiopulmonary process. The heart size is within normal limits. The lungs are clear. There is "
             "no pleural effusion or pneumothorax.",
             "No acute cardiopulmonary process. The heart size is within normal limits. The mediastinal contours are "
             "unremarkable.",
             "The heart size is within normal limits. Lungs are clear bilaterally. No pleural effusion or "
             "pneumothorax.",
             "No acute cardiopulmonary process. Cardiomediastinal silhouette is normal. No focal airspace disease."]
RARE = [f"finding{i}" for i in range(2000)]


def _finding_sentences(g, m):
    "m random finding sentences (vectorized choices, Python formatting)."
    kind, f, l, s, c = (g.integers(0, 6, m), g.integers(0, len(FIND), m), g.integers(0, len(LOC), m),
                        g.integers(0, len(SEV), m), g.integers(0, len(CHG), m))
    num, rare = g.integers(5, 95, m), g.integers(0, len(RARE), m)
    use_rare = g.random(m) < 0.05
    out = []
    for i in range(m):
        k = kind[i]
        if k == 0: t = f"There is a {SEV[s[i]]} {FIND[f[i]]} in the {LOC[l[i]]}."
        elif k == 1: t = f"{CHG[c[i]].capitalize()} {SEV[s[i]]} {FIND[f[i]]} in the {LOC[l[i]]}."
        elif k == 2: t = f"The {FIND[f[i]]} in the {LOC[l[i]]} is {CHG[c[i]]} compared with the prior study."
        elif k == 3: t = f"An endotracheal tube terminates {num[i] / 10:.1f} cm above the carina."
        elif k == 4: t = f"A {num[i] // 10} mm {FIND[f[i]]} projects over the {LOC[l[i]]}."
        else: t = f"No {FIND[f[i]]} is seen."
        out.append(t[:-1] + f" with {RARE[rare[i]]}." if use_rare[i] else t)
    return out


def make_generations(n: int, seed: int = 0) -> pd.DataFrame:
    "A SYNTHETIC generations table of about `n` reports in 5 configurations."
    g = np.random.default_rng(seed)
    per = n // 5
    rows = []
    for s, (system, policy) in enumerate([("verbose", "B4"), ("omit", "B4"), ("terse", "B4"), ("template", "B4"),
                                          ("template", "K50")]):
        m = per if s < 4 else n - 4 * per
        hyp, trunc = [], np.zeros(m, bool)
        if s < 2:
            k = g.integers(2, 5, m); normal = g.integers(0, len(NORMAL),
                                                         (m, 6)); found = iter(_finding_sentences(g, int(k.sum())))
            for i in range(m):
                hyp.append(" ".join([next(found)
                                     for _ in range(k[i])] + [NORMAL[j] for j in dict.fromkeys(normal[i, :4 + s])]))
        elif s == 2:
            idx = g.integers(0, len(NORMAL), (m, 3)); two = g.random(m) < 0.5
            hyp = [" ".join(NORMAL[j] for j in (r[:2] if t else r)) for r, t in zip(idx, two)]
        elif s == 3:
            t = g.choice(4, m, p=[0.5, 0.25, 0.15, 0.1]); add = g.random(m) < 0.15
            extra = iter(_finding_sentences(g, int(add.sum())))
            hyp = [TEMPLATES[t[i]] + (" " + next(extra) if add[i] else "") for i in range(m)]
        else:
            t = g.choice(4, m); u = g.random(m); extra = iter(_finding_sentences(g, m))
            loop = g.integers(0, len(NORMAL), m)
            for i in range(m):
                e = next(extra)
                if u[i] < 0.01: hyp.append("")
                elif u[i] < 0.015: hyp.append(None)
                elif u[i] < 0.025: hyp.append("<unk> " + e if u[i] < 0.02 else e + "</s>")
                elif u[i] < 0.04:
                    hyp.append(" ".join(((NORMAL[loop[i]] + " ") * 40).split()[:MAX_TOKENS]))
                    trunc[i] = True
                else:
                    sents = re.split(r"(?<=\.) ", TEMPLATES[t[i]]); g.shuffle(sents)
                    hyp.append(" ".join(sents[: g.integers(2, len(sents) + 1)] + [e]))
        rows.append(pd.DataFrame({"study_id": [f"s{i:07d}" for i in range(m)], "system": system, "policy": policy,
                                  "hypothesis": pd.array(hyp, dtype="str"), "truncated": trunc}))
    return pd.concat(rows, ignore_index=True)


# ---------------------------------------------------------------- the plain-Python baseline
def baseline(texts, groups, truncated, prefixes=DEFAULT_PREFIXES, k=5, rules=VALIDITY_RULES):
    "Every measure and the per-report flags, report by report in plain Python with Counters."
    norm_ids, per_report = {}, []
    for t, cut in zip(texts, truncated):
        toks = tokens(t)
        grams4 = ngram_repeats(toks, 4)
        why = reasons(t, cut, rules, toks, grams4 if rules["loop_n"] == 4 else None)
        norm = normalize(t)
        nid = norm_ids.setdefault(norm, len(norm_ids))
        per_report.append((not why, ";".join(why), nid, any(norm.startswith(p) for p in prefixes), grams4[1] > 0, toks))
    by = defaultdict(list)
    for i, gname in enumerate(groups): by[gname].append(i)
    summary, flags = {}, [None] * len(per_report)
    for gname, idx in sorted(by.items()):
        counts = Counter(per_report[i][2] for i in idx)
        top = {nid for nid, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:k]}
        d1, d2, t1, t2, lengths = set(), set(), 0, 0, []
        for i in idx:
            valid, why, nid, prefix, rep, toks = per_report[i]
            d1.update(toks); d2.update(zip(toks, toks[1:])); t1 += len(toks); t2 += max(len(toks) - 1,
                                                                                        0); lengths.append(len(toks))
            flags[i] = (valid, why, nid, counts[nid], nid in top, prefix, rep, len(toks))
        n = len(idx)
        summary[gname] = {"n": n, "validity_rate": sum(per_report[i][0] for i in idx) / n,
                          "unique_report_ratio": len(counts) / n,
                          "duplicate_rate": sum(v for v in counts.values() if v > 1) / n,
                          f"top_{k}_share": sum(sorted(counts.values(), reverse=True)[:k]) / n,
                          "prefix_rate": sum(per_report[i][3] for i in idx) / n,
                          "repeated_4gram_rate": sum(per_report[i][4] for i in idx) / n, "distinct_1": len(d1) / t1,
                          "distinct_2": len(d2) / t2, "length_median": quantile(lengths, 0.5),
                          "length_iqr": quantile(lengths, 0.75) - quantile(lengths, 0.25)}
    return summary, flags


# ---------------------------------------------------------------- the polars baseline
def _grams(n: int) -> pl.Expr:
    "The n-gram starting at each token of the exploded token table (null where it would cross into the next report)."
    inside = pl.col("row").shift(-(n - 1)) == pl.col("row")
    return pl.when(inside).then(pl.concat_str([pl.col("tok").shift(-j) for j in range(n)], separator=" "))


def polars_baseline(table: pd.DataFrame, k: int = 5, prefix: str = DEFAULT_PREFIXES[0], rules: dict = VALIDITY_RULES):
    """What a user would write today in polars: normalized text grouped with `group_by`, tokens with `str.extract_all`
    exploded into one long table, n-grams by shifting that table, the validity rules as row expressions (the same
    normalization and rules)."""
    special = "|".join([re.escape(t) for t in rules["special_tokens"]] + list(rules["special_patterns"]))
    t, keys = pl.col("hypothesis").fill_null(""), ["system", "policy"]
    df = pl.from_pandas(table[["system", "policy", "hypothesis", "truncated"]]).with_row_index("row").with_columns(
        norm=t.str.to_lowercase().str.replace_all(r"\s+",
                                                  " ").str.strip_chars().str.strip_chars_end(".,;:!? \t\n\r\f\v"),
        toks=t.str.to_lowercase().str.extract_all(r"[^\W_]+"), has_special=t.str.contains(special))
    tk = (df.select("row", *keys, pl.col("toks").alias("tok")).explode("tok").drop_nulls("tok")
          .with_columns(g2=_grams(2), g4=_grams(4)))
    per_row = tk.group_by("row").agg(n4=pl.col("g4").count(), u4=pl.col("g4").drop_nulls().n_unique())
    df = df.join(per_row, on="row", how="left", maintain_order="left").with_columns(
        pl.col("n4", "u4").fill_null(0), length=pl.col("toks").list.len(),
        words=pl.when("has_special").then(t.str.replace_all(special, " ").str.extract_all(r"[^\W_]+").list.len())
        .otherwise(pl.col("toks").list.len()))
    n4, u4 = pl.col("n4"), pl.col("u4")
    looping = (n4 >= rules["loop_min_ngrams"]) & (n4 - u4 >= rules["loop_share"] * n4)
    bad = (pl.col("hypothesis").is_null() | pl.col("has_special") | t.str.contains_any(list(rules["bad_characters"]))
           | (t == "") | ((pl.col("length") > 0) & (pl.col("words") < rules["min_words"])) | (pl.col("length") == 0)
           | pl.col("truncated") | looping)
    df = df.with_columns(valid=~bad, repeated=n4 > u4, prefix_hit=pl.col("norm").str.starts_with(prefix),
                         first=pl.col("row").min().over("norm"))
    counts = (df.group_by(keys + ["norm"]).agg(size=pl.len(), first=pl.col("first").first())
              .with_columns(rank=pl.struct(-pl.col("size").cast(pl.Int64), "first").rank("ordinal").over(keys) - 1))
    df = df.join(counts.select(keys + ["norm", "size", "rank"]), on=keys + ["norm"], how="left", maintain_order="left")
    distinct = tk.group_by(keys).agg(distinct_1=pl.col("tok").n_unique() / pl.len(),
                                     distinct_2=pl.col("g2").drop_nulls().n_unique() / pl.col("g2").count())
    summary = (df.group_by(keys).agg(n=pl.len(), validity_rate=pl.col("valid").mean(),
                                     prefix_rate=pl.col("prefix_hit").mean(),
                                     repeated_4gram_rate=pl.col("repeated").mean(),
                                     length_median=pl.col("length").median(),
                                     length_iqr=pl.col("length").quantile(0.75, "linear")
                                     - pl.col("length").quantile(0.25, "linear"))
               .join(counts.group_by(keys).agg(distinct_norm=pl.len(),
                                               dup=pl.col("size").filter(pl.col("size") > 1).sum(),
                                               top=pl.col("size").filter(pl.col("rank") < k).sum()), on=keys)
               .join(distinct, on=keys)
               .with_columns(unique_report_ratio=pl.col("distinct_norm") / pl.col("n"),
                             duplicate_rate=pl.col("dup") / pl.col("n"),
                             **{f"top_{k}_share": pl.col("top") / pl.col("n")}))
    flags = df.select("valid", "size", (pl.col("rank") < k).alias("top"), "prefix_hit", "repeated", "length")
    return summary.to_pandas(), flags


# ---------------------------------------------------------------- run
def main():
    args = options(n=1_000_000, repeat=3)
    t = time.perf_counter(); table = make_generations(args.n); build = time.perf_counter() - t
    rss_table = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    ours, cpu = [], []
    for _ in range(args.repeat):
        c = time.process_time(); t = time.perf_counter(); audit = audit_concentration(table)
        ours.append(time.perf_counter() - t); cpu.append(time.process_time() - c)
    rss_ours = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t = time.perf_counter()
    texts = table["hypothesis"].astype(object).where(table["hypothesis"].notna(), None).tolist()
    groups = list(zip(table["system"].tolist(), table["policy"].tolist()))
    summary, flags = baseline(texts, groups, table["truncated"].tolist())
    base = time.perf_counter() - t
    mine = audit.summary().set_index(["system", "policy"])
    worst = max(abs(mine.loc[g, m] - v) for g, row in summary.items() for m, v in row.items())
    f = audit.flags
    same_flags = (f.valid.tolist() == [x[0] for x in flags] and f.reasons.tolist() == [x[1] for x in flags]
                  and f.duplicate_group.tolist() == [x[2] for x in flags]
                  and f.duplicate_group_size.tolist() == [x[3] for x in flags]
                  and f.in_top_5.tolist() == [x[4] for x in flags] and f.prefix_hit.tolist() == [x[5] for x in flags]
                  and f.repeated_4gram.tolist() == [x[6] for x in flags] and f.length.tolist() == [x[7] for x in flags])
    t = time.perf_counter(); psum, pflags = polars_baseline(table); pbase = time.perf_counter() - t
    psum = psum.set_index(["system", "policy"])
    worst_pl = max(abs(mine.loc[g, m] - psum.loc[g, m]) for g in mine.index for m in summary[next(iter(summary))])
    same_pl_flags = all(np.array_equal(f[a].to_numpy(), pflags[b].to_numpy()) for a, b in
                        (("valid", "valid"), ("duplicate_group_size", "size"), ("in_top_5", "top"),
                         ("prefix_hit", "prefix_hit"), ("repeated_4gram", "repeated"), ("length", "length")))
    res = {"reports": len(table), "groups": len(mine), "distinct_texts": int(table.hypothesis.nunique(dropna=False)),
           "build_table_s": round(build, 2), "ours_s": round(min(ours), 3), "ours_runs_s": [round(x, 3) for x in ours],
           "ours_cpu_s": round(min(cpu), 3), "ours_cpu_runs_s": [round(x, 3) for x in cpu],
           "load_average_1min": round(os.getloadavg()[0], 2), "baseline_s": round(base, 3),
           "speedup": round(base / min(ours), 1),
           "baseline": "plain Python: per-report re tokenization, validity rules, normalization and a set of 4-grams; "
                       "per group Counters and n-gram sets",
           "polars_baseline_s": round(pbase, 3), "speedup_vs_polars": round(pbase / min(ours), 1),
           "polars_baseline": "polars: normalized text grouped with group_by, str.extract_all tokens exploded, n-grams "
                              "by shifting that table, validity as row expressions",
           "same_summary_as_polars": bool(worst_pl <= 1e-12), "same_flags_as_polars": bool(same_pl_flags),
           "same_summary_as_baseline": bool(worst <= 1e-12), "max_abs_summary_diff": float(worst),
           "same_flags_as_baseline": bool(same_flags), "peak_rss_mb_after_table": round(rss_table),
           "peak_rss_mb_after_ours": round(rss_ours), "target_s": 2.0, "target_speedup": 5.0,
           "python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count()}
    write_result("concentration", res)
    print(audit.summary().to_string())


if __name__ == "__main__":
    main()
