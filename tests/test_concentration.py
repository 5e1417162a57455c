"""Cross-checks of cxr_audit.concentration against a plain-Python reference, on random and hand-made corpora.
The per-report rules of the reference (tokens, normalization, validity reasons) are benchmarks/_plain_concentration.py,
which the benchmark's baseline uses too.

The notebook (nbs/05_concentration.ipynb) holds the worked examples; here: a naive implementation of every measure
and flag compared on random corpora (unicode, missing and non-text values, special tokens, odd whitespace, texts
shared between groups), the invariants (doubling, permutation), the bootstrap against naive recounts on the same
draws (with and without clusters, and with tiny chunks), the shares-vs-recount coverage simulation, the fallback
paths of the engine for large vocabularies, determinism, and the command-line helper.
"""
import importlib.util
import math
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pandas as pd
import polars as pl
import pytest

import cxr_audit.stats as stats
from cxr_audit.concentration import (REASONS, VALIDITY_RULES, ConcentrationAudit, _codes, _Corpus, _dense,
                                     _distinct_per, _normalize, audit_concentration, distinct_n, has_repeated_ngram,
                                     normalize_for_matching, surface_validity, tokenize)
from cxr_audit.core import sha256_frame
from cxr_audit.stats import resample_indices
from cxr_audit.synth import make_demo_corpus

# ---------------------------------------------------------------- a plain-Python reference
ROOT = Path(__file__).resolve().parents[1]


def load_plain():
    "The plain-Python reference of the per-report rules, shared with the benchmark's baseline."
    spec = importlib.util.spec_from_file_location("_plain_concentration",
                                                  ROOT / "benchmarks" / "_plain_concentration.py")
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    return mod


PLAIN = load_plain()
ref_tokens, ref_norm, ref_quantile = PLAIN.tokens, PLAIN.normalize, PLAIN.quantile


def ref_reasons(t, cut=False, r=VALIDITY_RULES):
    return ";".join(PLAIN.reasons(t, cut, r))


def ref_audit(texts, groups, k=5, prefixes=("no acute cardiopulmonary process",)):
    "Summary (dict per group) and per-report flags, the slow obvious way."
    nid = {}
    norm = [ref_norm(t) for t in texts]
    ids = [nid.setdefault(x, len(nid)) for x in norm]
    by = defaultdict(list)
    for i, g in enumerate(groups): by[g].append(i)
    summary, flags = {}, [None] * len(texts)
    for g, idx in by.items():
        cnt = Counter(ids[i] for i in idx)
        top = {x for x, _ in sorted(cnt.items(), key=lambda kv: (-kv[1], kv[0]))[:k]}
        toks = {i: ref_tokens(texts[i]) for i in idx}
        n = len(idx)
        rep = {i: len(list(zip(*[toks[i][j:] for j in range(4)]))) > len(set(zip(*[toks[i][j:] for j in range(4)])))
               for i in idx}
        pre = {i: any(norm[i].startswith(p) for p in prefixes) for i in idx}
        reasons = {i: ref_reasons(texts[i]) for i in idx}
        d = {}
        for m in (1, 2):
            grams = [gr for i in idx for gr in zip(*[toks[i][j:] for j in range(m)])]
            d[m] = len(set(grams)) / len(grams) if grams else float("nan")
        lens = [len(toks[i]) for i in idx]
        summary[g] = {"n": n, "validity_rate": sum(reasons[i] == "" for i in idx) / n,
                      "unique_report_ratio": len(cnt) / n, "duplicate_rate": sum(v for v in cnt.values() if v > 1) / n,
                      f"top_{k}_share": sum(sorted(cnt.values())[-k:]) / n,
                      "prefix_rate": sum(pre.values()) / n, "repeated_4gram_rate": sum(rep.values()) / n,
                      "distinct_1": d[1], "distinct_2": d[2], "length_median": ref_quantile(lens, 0.5),
                      "length_iqr": ref_quantile(lens, 0.75) - ref_quantile(lens, 0.25)}
        for i in idx:
            flags[i] = (reasons[i] == "", reasons[i], ids[i], cnt[ids[i]], ids[i] in top, pre[i], rep[i], len(toks[i]))
    return summary, flags


WORDS = ["No", "acute", "cardiopulmonary", "process", "effusion", "pleural", "left", "right", "4.2", "cm",
         "Épanchement", "naïve", "x_y", "<unk>", "</s>", "[PAD]", "<|im_end|>", "\ufffd", "heart", "size", "normal",
         "...", "", "no"]
SEPS = [" ", "  ", ". ", ".", "\n", "\t", ", ", " . "]


def random_corpus(seed, n=400, groups=("A", "B", "C")):
    g = np.random.default_rng(seed)
    pool = []
    for _ in range(n // 3):
        k = g.integers(0, 14)
        pool.append("".join(str(g.choice(WORDS)) + str(g.choice(SEPS)) for _ in range(k)))
    pool += ["No acute cardiopulmonary process.", "no acute cardiopulmonary process", "", "   ",
             "The heart is normal. " * 6, "No acute cardiopulmonary process. Small left effusion."]
    texts = [pool[i] for i in g.integers(0, len(pool), n)]
    for i in g.choice(n, 12, replace=False): texts[i] = [None, float("nan"), 3, ["x"], b"bytes", pd.NA][i % 6]
    return pd.DataFrame({"system": [groups[i] for i in g.integers(0, len(groups), n)],
                         "hypothesis": pd.Series(texts, dtype=object)})


# ---------------------------------------------------------------- exact agreement with the reference
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_summary_and_flags_equal_plain_python_reference(seed):
    df = random_corpus(seed)
    a = audit_concentration(df, by="system")
    want, flags = ref_audit(df.hypothesis.tolist(), df.system.tolist())
    got = a.summary().set_index("system")
    for g, row in want.items():
        for m, v in row.items():
            assert (math.isnan(v) and math.isnan(got.loc[g, m])) or got.loc[g, m] == pytest.approx(v, abs=1e-12), (g, m)
    f = a.flags
    assert f.reasons.tolist() == [x[1] for x in flags]
    assert f.valid.tolist() == [x[0] for x in flags]
    assert (f.duplicate_group.tolist() == [x[2] for x in flags]
            and f.duplicate_group_size.tolist() == [x[3] for x in flags])
    assert f.in_top_5.tolist() == [x[4] for x in flags] and f.prefix_hit.tolist() == [x[5] for x in flags]
    assert f.repeated_4gram.tolist() == [x[6] for x in flags] and f.length.tolist() == [x[7] for x in flags]


def test_single_functions_equal_reference():
    df = random_corpus(7)
    texts = df.hypothesis.tolist()
    for n in (1, 2, 3):
        grams = [gr for t in texts for gr in zip(*[ref_tokens(t)[j:] for j in range(n)])]
        assert distinct_n(texts, n) == len(set(grams)) / len(grams)
    assert surface_validity(texts).reasons.tolist() == [ref_reasons(t) for t in texts]
    for n in (2, 4, 5):
        assert has_repeated_ngram(texts, n).tolist() == [
            len(list(zip(*[ref_tokens(t)[j:] for j in range(n)]))) > len(set(zip(*[ref_tokens(t)[j:]
                                                                                   for j in range(n)]))) for t in texts]
    assert [normalize_for_matching(t) for t in texts] == [ref_norm(t) for t in texts]
    assert [tokenize(t) for t in texts] == [ref_tokens(t) for t in texts]
    assert set(REASONS) >= {"missing", "not_text", "empty", "looping", "token_limit"}


# ---------------------------------------------------------------- invariants
@pytest.mark.parametrize("seed", [4, 5])
def test_doubling_halves_distinct_n_and_unique_ratio_exactly(seed):
    df = random_corpus(seed)
    one = audit_concentration(df, by="system", distinct=(1, 2, 3)).summary()
    two = audit_concentration(pd.concat([df, df]), by="system", distinct=(1, 2, 3)).summary()
    for m in ("distinct_1", "distinct_2", "distinct_3", "unique_report_ratio"):
        assert (two[m] == one[m] / 2).all(), m
    for m in ("validity_rate", "top_5_share", "prefix_rate", "repeated_4gram_rate"):
        assert (two[m] == one[m]).all(), m
    assert (two.duplicate_rate == 1).all() and (two.n == 2 * one.n).all()


@pytest.mark.parametrize("seed", [6, 7])
def test_permuting_reports_changes_nothing(seed):
    df = random_corpus(seed)
    a = audit_concentration(df, by="system")
    perm = np.random.default_rng(seed).permutation(len(df))
    b = audit_concentration(df.iloc[perm], by="system")
    pd.testing.assert_frame_equal(a.summary(), b.summary())
    cols = ["valid", "reasons", "duplicate_group_size", "prefix_hit", "repeated_4gram", "length"]
    pd.testing.assert_frame_equal(a.flags[cols].iloc[perm].reset_index(drop=True), b.flags[cols].reset_index(drop=True))


# ---------------------------------------------------------------- bootstrap = naive recount on the same draws
def naive_measures(texts, idx, k=5):
    norm = [ref_norm(texts[i]) for i in idx]; toks = [ref_tokens(texts[i]) for i in idx]; n = len(idx)
    cnt = Counter(norm); lens = [len(t) for t in toks]
    out = {"unique_report_ratio": len(cnt) / n, "duplicate_rate": sum(v for v in cnt.values() if v > 1) / n,
           f"top_{k}_share": sum(sorted(cnt.values())[-k:]) / n,
           "validity_rate": sum(ref_reasons(texts[i]) == "" for i in idx) / n,
           "prefix_rate": sum(x.startswith("no acute cardiopulmonary process") for x in norm) / n,
           "length_median": ref_quantile(lens, 0.5), "length_iqr": ref_quantile(lens, 0.75) - ref_quantile(lens, 0.25)}
    for m in (1, 2):
        grams = [gr for t in toks for gr in zip(*[t[j:] for j in range(m)])]
        out[f"distinct_{m}"] = len(set(grams)) / len(grams)
    return out


@pytest.mark.parametrize("clustered", [False, True])
def test_recount_replicates_equal_naive_recount(clustered):
    df = random_corpus(11, n=300, groups=("A",))
    texts = df.hypothesis.tolist()
    cl = [f"c{i // 4}" for i in range(len(df))] if clustered else None
    res = audit_concentration(df, by=()).bootstrap_results(reps=150, seed=5, scheme="recount", clusters=cl)
    if clustered:
        members = defaultdict(list)
        for i, c in enumerate(cl): members[c].append(i)
        names = list(members)
        draws = [[i for c in d for i in members[names[c]]] for d in resample_indices(len(names), 150, seed=5)]
    else:
        draws = [list(d) for d in resample_indices(len(df), 150, seed=5)]
    loop = [naive_measures(texts, d) for d in draws]
    for m in loop[0]:
        assert np.array_equal(res[m].replicates, np.array([x[m] for x in loop])), m


def test_chunked_resampling_gives_the_same_replicates(monkeypatch):
    df = random_corpus(12, n=200, groups=("A",))
    a = audit_concentration(df, by=())
    whole = a.bootstrap_results(reps=60, seed=1, scheme="recount")
    monkeypatch.setattr(stats, "_CHUNK_BYTES", 8 * 200 * 3)        # about 3 replicates per chunk
    chunked = a.bootstrap_results(reps=60, seed=1, scheme="recount")
    for m in whole:
        assert np.array_equal(whole[m].replicates, chunked[m].replicates, equal_nan=True), m
        assert np.allclose(whole[m].jackknife, chunked[m].jackknife, equal_nan=True), m


def test_bootstrap_is_deterministic_and_shares_estimates_equal_summary():
    demo = make_demo_corpus(n_patients=20, seed=3)
    a = audit_concentration(demo.generations)
    pid = demo.studies.set_index("study_id").patient_id
    t1 = a.bootstrap(reps=200, seed=9, clusters=pid)
    t2 = audit_concentration(demo.generations).bootstrap(reps=200, seed=9, clusters=pid)
    assert sha256_frame(t1) == sha256_frame(t2)
    est = t1.pivot(index="group", columns="metric", values="estimate").loc[a.labels, a.metrics]
    assert np.allclose(est.to_numpy(), a.summary()[a.metrics].to_numpy(), rtol=0, atol=1e-12, equal_nan=True)
    kw = dict(reps=400, seed=9, clusters=pid, baseline="sim-verbose+B4", compare_metrics=["prefix_rate", "distinct_2"])
    c1 = audit_concentration(demo.generations, **kw).comparison_table()
    assert sha256_frame(c1) == sha256_frame(audit_concentration(demo.generations, **kw).comparison_table())
    assert np.allclose(c1.p_holm, stats.holm(c1.p)) and (c1.significant == (c1.p_holm < 0.05)).all()


@pytest.mark.parametrize("K,N,a", [(300, 400, 1.0), (20000, 1000, 1.3)])
def test_coverage_shares_vs_recount(K, N, a):
    # Reports drawn from a Zipf-like generator over K templates; the estimand is the expected value at sample size N.
    # Shares intervals cover it; recounted duplicate rates and unique ratios are biased and miss it.
    g = np.random.default_rng(K)
    p = 1 / np.arange(1, K + 1) ** a; p /= p.sum()

    def measures(v):
        c = np.bincount(v, minlength=K); c = c[c > 0]
        return {"duplicate_rate": c[c >= 2].sum() / N, "top_5_share": np.sort(c)[-5:].sum() / N,
                "unique_report_ratio": len(c) / N}
    sims = [measures(g.choice(K, N, p=p)) for _ in range(3000)]
    truth = {m: np.mean([s[m] for s in sims]) for m in sims[0]}
    D, cover = 80, Counter()
    for d in range(D):
        t = pd.DataFrame({"hypothesis": [f"report {x}" for x in g.choice(K, N, p=p)]})
        au = audit_concentration(t, by=())
        for s in ("shares", "recount"):
            res = au.bootstrap_results(0, list(truth), reps=400, seed=d, scheme=s)
            for m in truth:
                cover[(m, s)] += res[m].ci_low <= truth[m] <= res[m].ci_high
    for m in truth: assert cover[(m, "shares")] / D >= 0.85, (m, cover)
    assert cover[("duplicate_rate", "recount")] / D <= 0.1 and cover[("unique_report_ratio",
                                                                      "recount")] / D <= 0.1, cover


# ---------------------------------------------------------------- engine fallbacks for large vocabularies
def test_dense_and_distinct_fallback_paths_agree_with_numpy():
    g = np.random.default_rng(0)
    keys = g.integers(0, 1 << 40, 5000)
    keys[::7] = keys[0]
    ids, K = _dense(keys)
    u, inv = np.unique(keys, return_inverse=True)
    assert K == len(u) and np.array_equal(ids, inv)
    who, it = g.integers(0, 3000, 20000), g.integers(0, 30000, 20000)      # W * K above the bitmap limit
    want = np.array([len(set(it[who == w])) for w in range(3000)])
    assert np.array_equal(_distinct_per(who, it, 30000, 3000), want)


def test_repeats_fallback_when_packing_does_not_fit(monkeypatch):
    import cxr_audit.concentration as conc
    texts = ["a b c d a b c d e", "x y z w", "p q p q p q", None] * 3
    want = [[len(list(zip(*[ref_tokens(t)[j:] for j in range(n)]))) - len(set(zip(*[ref_tokens(t)[j:]
                                                                                    for j in range(n)])))
             for t in _Corpus.of(texts).uniq] for n in (2, 4, 6)]
    chunked = [_Corpus.of(texts).repeats(n).tolist() for n in (2, 4, 6)]
    monkeypatch.setattr(conc, "_CHUNK_MIN_BITS", 64)  # no room for raw token ids: packed halves (dense (n/2)-gram ids)
    packed = [_Corpus.of(texts).repeats(n).tolist() for n in (2, 4, 6)]
    monkeypatch.setattr(conc, "_PACK_BITS", 0)            # force the dense n-gram ids instead of packed halves
    fallback = [_Corpus.of(texts).repeats(n).tolist() for n in (2, 4, 6)]
    assert chunked == packed == want == fallback and want[1] == [1, 0, 1, 0]


# ---------------------------------------------------------------- the hashed fast path (issue 23)
def load_bench():
    "benchmarks/bench_concentration.py as a module (its corpus generator and its polars baseline)."
    import sys
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location("bench_concentration",
                                                      ROOT / "benchmarks" / "bench_concentration.py")
        mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    finally: sys.path.remove(str(ROOT / "benchmarks"))
    return mod


def test_codes_are_first_appearance_numbers_even_when_hashes_collide():
    g = np.random.default_rng(0)
    vals = ["".join(g.choice(list("ab é.\t"), g.integers(0, 6))) for _ in range(3000)]
    first = {}
    want = [first.setdefault(v, len(first)) for v in vals]
    at = [vals.index(v) for v in first]
    codes, pos = _codes(pl.Series(vals))
    assert codes.tolist() == want and pos.tolist() == at
    # 3 hash values for hundreds of strings: the exact fallback
    few = pl.Series(np.arange(len(vals)) % 3, dtype=pl.UInt64)
    codes, pos = _codes(pl.Series(vals), few)
    assert codes.tolist() == want and pos.tolist() == at


def test_whitespace_precheck_equals_the_regex_on_every_code_point():
    # the normalization runs its regular expression only on texts with a tab-like control, two spaces, or non-ASCII text
    chars = [chr(i) for i in range(0x3100) if not 0xD800 <= i < 0xE000] + ["\U0001F600", "\uFEFF"]
    texts = pl.Series([f" A{c}b{c}{c}C {c}" for c in chars] + [f"x{c}y" for c in chars])
    full = texts.str.to_lowercase().str.replace_all(r"\s{2,}|[^\S ]",
                                                    " ").str.strip_chars().str.strip_chars_end(".,;:!? \t\n\r\f\v")
    assert _normalize(texts).to_list() == full.to_list()


def test_benchmark_corpus_equals_both_baselines():
    # the benchmark's synthetic corpus (a slice) through the fast path, the plain-Python reference and the polars
    # baseline
    bench = load_bench()
    table = bench.make_generations(6000, seed=3)
    a = audit_concentration(table)
    mine = a.summary().set_index(["system", "policy"])
    texts = table["hypothesis"].astype(object).where(table["hypothesis"].notna(), None).tolist()
    summary, flags = bench.baseline(texts, list(zip(table.system, table.policy)), table.truncated.tolist())
    assert all(mine.loc[g, m] == pytest.approx(v, abs=1e-12) for g, row in summary.items() for m, v in row.items())
    assert (a.flags.reasons.tolist() == [x[1] for x in flags]
            and a.flags.duplicate_group.tolist() == [x[2] for x in flags])
    psum, pflags = bench.polars_baseline(table)
    psum = psum.set_index(["system", "policy"])
    assert all(mine.loc[g, m] == pytest.approx(psum.loc[g, m], abs=1e-12) for g in mine.index for m in mine.columns)
    for col, p in (("valid", "valid"), ("duplicate_group_size", "size"), ("in_top_5", "top"),
                   ("prefix_hit", "prefix_hit"), ("repeated_4gram", "repeated"), ("length", "length")):
        assert np.array_equal(a.flags[col].to_numpy(), pflags[p].to_numpy()), col


# ---------------------------------------------------------------- bad input, CLI, report
def test_bad_values_are_invalid_never_dropped():
    vals = [None, float("nan"), pd.NA, 7, 3.5, ["a"], {"b": 1}, "", "   ", "..."]
    a = audit_concentration(pd.DataFrame({"system": "s", "hypothesis": pd.Series(vals, dtype=object)}), by="system")
    assert a.summary().n[0] == len(vals) and a.summary().validity_rate[0] == 0
    assert a.flags.reasons.tolist() == ["missing"] * 3 + ["not_text"] * 4 + ["empty", "no_words", "no_words"]
    with pytest.raises(ValueError, match=r"missing column\(s\) 'policy'"):
        audit_concentration(pd.DataFrame({"system": ["s"], "hypothesis": ["x"]}))


def test_save_with_a_cluster_column_recount_and_a_baseline(tmp_path):
    demo = make_demo_corpus(n_patients=12, seed=1)
    gens = demo.generations.merge(demo.studies[["study_id", "patient_id"]], on="study_id")
    a = audit_concentration(gens, reps=400, clusters="patient_id", baseline="sim-verbose+B4", scheme="recount")
    paths = a.save(tmp_path / "out", inputs={"generations": gens})
    assert a.headline().startswith("**sim-template+B4** is the most concentrated")
    iv = pd.read_csv(paths["intervals"])
    assert set(iv.scheme.dropna()) == {"recount"} and (iv.n_clusters == 12).all()
    cmp = pd.read_csv(paths["comparisons"])
    assert (cmp["first"] == "sim-verbose+B4").all() and len(cmp) == 8
    assert (cmp.significant == (cmp.p_holm < 0.05)).all()
    assert paths["top_k_share.svg"].read_text().lstrip().startswith("<svg")


# ---------------------------------------------------------------- the result object and the numbers of the release
# before it
def test_demo_intervals_equal_those_before_the_one_call_api():
    # recorded with the release before issue 16 (`concentration_report_blocks` on the demo, seed 2026, 2,000 resamples,
    # patients as clusters): the one call with the same seed gives the same estimates and intervals, to the last bit
    demo = make_demo_corpus(n_patients=60, seed=0)
    pid = demo.studies.set_index("study_id").patient_id
    iv = audit_concentration(demo.generations, reps=2000, seed=2026,
                             clusters=pid).to_frame().set_index(["group", "metric"])
    before = {("sim-template+B4", "top_5_share"): (0.9047619047619048, 0.8604651162790697, 0.9473684210526315),
              ("sim-template+B4", "unique_report_ratio"): (0.12169312169312171, 0.079356164392188, 0.16411421340876553),
              ("sim-template+B4", "distinct_2"): (0.028114521537271047, 0.02079564910081992, 0.03593394283241876),
              ("sim-template+K50", "validity_rate"): (0.9629629629629629, 0.9358288770053476, 0.9853711303939962),
              ("sim-template+K50", "duplicate_rate"): (0.2857142857142857, 0.22285566247224278, 0.35135135135135137),
              ("sim-template+K50", "prefix_rate"): (0.5661375661375662, 0.49455740879560217, 0.6342887864823348)}
    for key, want in before.items():
        got = tuple(iv.loc[key, ["estimate", "ci_low", "ci_high"]])
        assert got == pytest.approx(want, rel=0, abs=1e-15), key


def test_result_protocol():
    demo = make_demo_corpus(n_patients=15, seed=2)
    a = audit_concentration(demo.generations, reps=400, seed=4, baseline="sim-verbose+B4")
    assert isinstance(a, ConcentrationAudit) and callable(a.summary)
    with pytest.raises(Exception, match="cannot assign"):
        a.reps = 10
    assert list(a.to_frame().columns[:4]) == ["system", "policy", "group", "metric"] and "measure" not in a.to_frame()
    assert set(a.comparisons) == {"validity_rate", "prefix_rate"}
    assert all(type(r).__name__ == "PairedResult" for r in a.comparisons.values())
    t = a.comparison_table()
    assert np.allclose(t.p_holm,
                       stats.holm(t.p)) and (t.significant == (t.p_holm < 0.05)).all() and not t.ci_adjusted.any()
    assert isinstance(a.compare("duplicate_rate"), stats.PairedResult)
    for kind in ("top_k", "profile", "distinct_n", "forest"):
        assert type(a.plot(kind)).__module__.startswith("altair"), kind
    assert "most concentrated" in a._repr_markdown_() and "p_holm < 0.05" in a.note()
    assert a.seed == 4 and audit_concentration(demo.generations).seed == 0     # core.DEFAULT_SEED


# ---------------------------------------------------------------- paper 004: exact-text groups and the surface-validity
# rule
@pytest.mark.parametrize("seed", [0, 3])
def test_exact_grouping_equals_plain_counter_of_raw_text(seed):
    df = random_corpus(seed)
    df.loc[df.index[:40:2], "hypothesis"] = "No acute cardiopulmonary process."    # variants that normalization merges
    df.loc[df.index[1:40:2], "hypothesis"] = "no acute cardiopulmonary process "
    a = audit_concentration(df, by="system", grouping="exact")
    key = [t if isinstance(t, str) else "" for t in df.hypothesis]
    got = a.summary().set_index("system")
    for g, idx in df.groupby("system").indices.items():
        cnt = Counter(key[i] for i in idx); n = len(idx)
        assert got.loc[g, "unique_report_ratio"] == pytest.approx(len(cnt) / n, abs=1e-12)
        assert got.loc[g, "duplicate_rate"] == pytest.approx(sum(v for v in cnt.values() if v > 1) / n, abs=1e-12)
        assert got.loc[g, "top_5_share"] == pytest.approx(sum(sorted(cnt.values())[-5:]) / n, abs=1e-12)
        assert a.flags.duplicate_group_size.iloc[idx].tolist() == [cnt[key[i]] for i in idx]
    normalized = audit_concentration(df, by="system").summary().set_index("system")
    assert (got.prefix_rate == normalized.prefix_rate).all()                 # the prefix rule still normalizes
    assert (got.unique_report_ratio > normalized.unique_report_ratio).all()  # the variants are apart only under "exact"
    assert a.params["grouping"] == "exact" and normalized.shape == got.shape


@pytest.mark.parametrize("seed", [1, 2])
def test_flag_columns_and_the_surface_validity_rule(seed):
    df = random_corpus(seed)
    g = np.random.default_rng(seed)
    df["truncated"] = g.random(len(df)) < 0.1
    strict = audit_concentration(df, by="system")
    paper = audit_concentration(df, by="system", validity_rule="surface")
    codes = [set(r.split(";")) - {""} for r in strict.flags.reasons]
    for col, code in (("hit_token_limit", "token_limit"), ("looping", "looping"), ("too_few_words", "too_few_words")):
        assert strict.flags[col].tolist() == [code in c for c in codes]
        assert paper.flags[col].tolist() == strict.flags[col].tolist()         # the flags do not depend on the rule
    soft = {"token_limit", "looping", "too_few_words"}
    assert paper.flags.valid.tolist() == [not (c - soft) for c in codes]
    assert strict.flags.valid.tolist() == [not c for c in codes]
    assert (paper.summary().validity_rate >= strict.summary().validity_rate).all()
    assert (paper.flags.valid != strict.flags.valid).any()                     # the random corpus has flagged outputs
    sv = surface_validity(df.hypothesis, truncated=df.truncated, validity_rule="surface")
    assert sv.valid.tolist() == paper.flags.valid.tolist()
    with pytest.raises(Exception, match="validity_rule must be one of"):
        audit_concentration(df, by="system", validity_rule="paper")


def _corpus_with_counts(sizes, seed):
    "Reports in groups of the given sizes (each group one exact text), in random order."
    texts = [f"Report number {i}." for i, s in enumerate(sizes) for _ in range(s)]
    return list(np.random.default_rng(seed).permutation(np.array(texts, dtype=object)))


def test_paper_concentration_counts_recomputed_with_exact_grouping():
    b4 = _corpus_with_counts([300, 150, 60, 30, 22, 7] + [1] * 6, 0)                         # MIMIC→IU ON+B4
    k50 = _corpus_with_counts([20, 14, 10, 8, 6] + [3] * 30 + [2] * 30 + [1] * 193, 1)        # IU→MIMIC ON+K50
    mg = _corpus_with_counts([100, 60, 44, 30, 20, 3] + [2] * 62 + [1] * 194, 2)                 # MedGemma on IU
    df = pd.DataFrame({"system": ["b4"] * len(b4) + ["k50"] * len(k50) + ["mg"] * len(mg), "hypothesis": b4 + k50 + mg})
    s = audit_concentration(df, by="system", grouping="exact", reps=10).summary().set_index("system")
    counts = s[["unique_report_ratio", "duplicate_rate", "top_5_share"]].mul(s.n, axis=0).round().astype(int)
    assert s.n.tolist() == [575, 401, 575]
    assert counts.loc["b4"].tolist() == [12, 569, 562] and counts.loc["k50"].tolist() == [258, 208, 58]
    assert counts.loc["mg", ["duplicate_rate", "top_5_share"]].tolist() == [381, 254]
    pct = (s[["unique_report_ratio", "duplicate_rate", "top_5_share"]] * 100).round(1)
    assert pct.loc["b4"].tolist() == [2.1, 99.0, 97.7] and pct.loc["k50"].tolist() == [64.3, 51.9, 14.5]
    assert round(s.loc["mg", "duplicate_rate"], 4) == 0.6626 and round(s.loc["mg", "top_5_share"], 4) == 0.4417


@pytest.mark.parametrize("vocab", [8, 20000])   # 20000 words: bigram keys too many for a bitmap (the unique-key path)
def test_distinct_from_pieces_equals_naive_sets(vocab):
    "Distinct-1/2 are counted from the distinct pieces ('.'-cut) of the texts: equal to naive per-group n-gram sets."
    g = np.random.default_rng(vocab)
    words = [f"w{i}" for i in range(vocab)] + [".", "..", " . ", "Ünï", "4.2"]
    texts = [" ".join(g.choice(words, g.integers(0, 30))) for _ in range(400)]
    texts += texts[:80] + [".", "", "a. .b", "b. .a"]                 # texts shared between groups, empty pieces
    groups = g.choice(["A", "B", "C"], len(texts))
    s = audit_concentration(pd.DataFrame({"system": groups, "hypothesis": texts}), by="system", distinct=(1, 2, 3),
                            reps=10).summary().set_index("system")
    for grp in "ABC":
        toks = [ref_tokens(t) for t, x in zip(texts, groups) if x == grp]
        for n in (1, 2, 3):
            grams = [tuple(tk[i:i + n]) for tk in toks for i in range(len(tk) - n + 1)]
            assert s.loc[grp, f"distinct_{n}"] == len(set(grams)) / len(grams)
