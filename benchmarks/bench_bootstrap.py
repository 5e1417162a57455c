"""Benchmark: the vectorized paired bootstrap (`cxr_audit.stats`) against the evaluator practice, in one run.

Workload: 9 systems x 10 metrics (5 mean-type, 5 corpus/micro-type) on N=3,000 synthetic (reference, hypothesis)
pairs with 14 binary labels each, 5,000 paired replicates, all 36 pairwise comparisons per metric.

Timed approaches (all on the same synthetic data, the same draws `resample_indices(N, reps, seed)`):
- ours: `bootstrap_metrics` on precomputed per-sample sufficient statistics -> replicates, paired differences,
  percentile CIs, p-values, win probabilities, Holm over the whole family, and per-system CIs.
- evaluator practice (paper 001's evaluator): for each replicate, draw the indices and re-run every metric's own
  pure-Python computation on the resampled (reference, hypothesis) pairs. It is far too slow to run 5,000 times,
  so `--baseline-reps` replicates are timed and the time is scaled up linearly (reported as such). Only the
  replicate values are produced; the CI/p-value post-processing is not even counted for it.
- loop over precomputed statistics: for each replicate, index the per-sample statistics and sum them, then apply
  the value function (again replicate values only).
- scipy.stats.bootstrap for the mean-type metrics only (one-sample percentile CIs for each system, 45 calls),
  against ours computing the same 45 per-system CIs.

The replicate values of the timed baseline replicates are compared with ours (same draws): count-based metrics
must be bit-identical; mean-type metrics agree to floating-point summation order (max |diff| reported).
Writes benchmarks/results/bootstrap.json and prints it. No assertions on time.
Run: .venv/bin/python benchmarks/bench_bootstrap.py [--n 3000] [--reps 5000] [--baseline-reps 2]
"""
import os
import platform
import time
import tracemalloc
from collections import Counter

import numpy as np
from scipy import stats as sps

from _timing import options, write_result
from cxr_audit.stats import (bleu_stats, bootstrap_metrics, corpus_bleu, holm_family, macro_f1, macro_stats, mean,
                             mean_stats, micro_f1, micro_precision, micro_stats, resample_indices)

N_LABELS = 14
SEED = 2026


# ---------------------------------------------------------------- synthetic data
def make_data(n, n_systems, seed=0):
    g = np.random.default_rng(seed)
    vocab = [f"w{i}" for i in range(400)]
    refs = [list(g.choice(vocab, g.integers(15, 60))) for _ in range(n)]
    ref_labels = (g.random((n, N_LABELS)) < 0.15).astype(int)
    systems = {}
    for s in range(n_systems):
        keep, flip = 0.55 + 0.03 * s, 0.04 + 0.01 * (s % 4)
        hyps = []
        for r in refs:
            h = [w if g.random() < keep else str(g.choice(vocab)) for w in r if g.random() < 0.9]
            hyps.append(h + list(g.choice(vocab, g.integers(0, 6))) if h else ["w0"])
        labels = np.where(g.random((n, N_LABELS)) < flip, 1 - ref_labels, ref_labels)
        systems[f"sys{s}"] = (hyps, labels.tolist())
    return refs, ref_labels.tolist(), systems


# ---------------------------------------------------------------- the metrics, pure Python (as an evaluator runs them)
def _overlap(r, h): return sum((Counter(h) & Counter(r)).values())

def token_f1(r, h):
    ov = _overlap(r, h)
    if ov == 0: return 0.0
    p, q = ov / len(h), ov / len(r)
    return 2 * p * q / (p + q)

def unigram_precision(r, h): return _overlap(r, h) / len(h)
def unigram_recall(r, h): return _overlap(r, h) / len(r)
def length_ratio(r, h): return len(h) / len(r)
def labels_equal(lr, lh): return float(lr == lh)

def label_counts(lr, lh):
    tp = sum(a and b for a, b in zip(lr, lh)); fp = sum((not a) and b for a, b in zip(lr, lh))
    return tp, fp, sum(a and not b for a, b in zip(lr, lh))

def label_class_counts(lr, lh):
    out = []
    for a, b in zip(lr, lh): out += [int(a and b), int((not a) and b), int(a and not b)]
    return out

def _ngrams(t, k): return Counter(tuple(t[i:i + k]) for i in range(len(t) - k + 1))

def bleu2_counts(r, h):
    m = [sum((_ngrams(h, k) & _ngrams(r, k)).values()) for k in (1, 2)]
    return m + [max(len(h) - k + 1, 0) for k in (1, 2)] + [len(h), len(r)]

def token_micro_counts(r, h):
    ov = _overlap(r, h); return ov, len(h) - ov, len(r) - ov

# corpus-level metric functions on a list of pairs: what an evaluator re-runs on each resample
def _avg(xs): return sum(xs) / len(xs)

def _f1(tp, fp, fn):
    d = 2 * tp + fp + fn
    return 2 * tp / d if d else float("nan")

def corpus_bleu2(pairs):
    t = np.sum([bleu2_counts(r, h) for r, h in pairs], axis=0).astype(float)
    s = 0.0
    for k in range(2): s += np.log(t[k] / t[2 + k])
    return (np.exp(1 - t[5] / t[4]) if t[4] < t[5] else 1.0) * np.exp(s / 2)

def label_macro(lpairs):
    tot = np.sum([label_class_counts(a, b) for a, b in lpairs], axis=0).reshape(-1, 3).astype(float)
    den = 2 * tot[:, 0] + tot[:, 1] + tot[:, 2]
    f1, acc = np.where(den > 0, 2 * tot[:, 0] / np.where(den > 0, den, 1), 0.0), 0.0
    for v in f1: acc += v
    return acc / len(f1)

def label_micro(lpairs, which):
    tp, fp, fn = (sum(v) for v in zip(*[label_counts(a, b) for a, b in lpairs]))
    return _f1(tp, fp, fn) if which == "f1" else (tp / (tp + fp) if tp + fp else float("nan"))

def token_micro(pairs):
    return _f1(*(sum(v) for v in zip(*[token_micro_counts(r, h) for r, h in pairs])))

METRICS = {  # name: (kind, corpus function on (text pairs, label pairs))
    "token_f1": ("mean", lambda P, L: _avg([token_f1(r, h) for r, h in P])),
    "unigram_precision": ("mean", lambda P, L: _avg([unigram_precision(r, h) for r, h in P])),
    "unigram_recall": ("mean", lambda P, L: _avg([unigram_recall(r, h) for r, h in P])),
    "length_ratio": ("mean", lambda P, L: _avg([length_ratio(r, h) for r, h in P])),
    "exact_label_match": ("mean", lambda P, L: _avg([labels_equal(a, b) for a, b in L])),
    "label_micro_f1": ("corpus", lambda P, L: label_micro(L, "f1")),
    "label_micro_precision": ("corpus", lambda P, L: label_micro(L, "precision")),
    "label_macro_f1": ("corpus", lambda P, L: label_macro(L)),
    "corpus_bleu2": ("corpus", lambda P, L: corpus_bleu2(P)),
    "token_micro_f1": ("corpus", lambda P, L: token_micro(P)),
}
VALUE = {"token_f1": mean, "unigram_precision": mean, "unigram_recall": mean, "length_ratio": mean,
         "exact_label_match": mean, "label_micro_f1": micro_f1, "label_micro_precision": micro_precision,
         "label_macro_f1": macro_f1, "corpus_bleu2": corpus_bleu, "token_micro_f1": micro_f1}


def per_sample_stats(refs, ref_labels, hyps, labels):
    "The per-sample sufficient statistics of every metric (computed once, on the original pairs)."
    P, L = list(zip(refs, hyps)), list(zip(ref_labels, labels))
    lab = np.array([label_counts(a, b) for a, b in L], dtype=float)
    cls = np.array([label_class_counts(a, b) for a, b in L], dtype=float).reshape(len(L), N_LABELS, 3)
    bl = np.array([bleu2_counts(r, h) for r, h in P], dtype=float)
    return {"token_f1": mean_stats([token_f1(r, h) for r, h in P]),
            "unigram_precision": mean_stats([unigram_precision(r, h) for r, h in P]),
            "unigram_recall": mean_stats([unigram_recall(r, h) for r, h in P]),
            "length_ratio": mean_stats([length_ratio(r, h) for r, h in P]),
            "exact_label_match": mean_stats([labels_equal(a, b) for a, b in L]),
            "label_micro_f1": micro_stats(*lab.T), "label_micro_precision": micro_stats(*lab.T),
            "label_macro_f1": macro_stats(cls[..., 0], cls[..., 1], cls[..., 2]),
            "corpus_bleu2": bleu_stats(bl[:, :2], bl[:, 2:4], bl[:, 4], bl[:, 5]),
            "token_micro_f1": micro_stats(*np.array([token_micro_counts(r, h) for r, h in P], dtype=float).T)}


# ---------------------------------------------------------------- the three ways to bootstrap
def ours(stats, metrics, reps):
    res = bootstrap_metrics({m: ({s: stats[s][m] for s in stats}, VALUE[m]) for m in metrics}, reps=reps, seed=SEED)
    table = holm_family(res)                                   # 36 pairs x metrics, CI, p, p_holm, win_prob
    per_system = [r.systems_frame() for r in res.values()]     # each system's own CI
    return res, table, per_system


def evaluator_practice(refs, ref_labels, systems, idx):
    out = np.empty((len(METRICS), len(systems), len(idx)))
    for b, rows in enumerate(idx):
        for j, (hyps, labels) in enumerate(systems.values()):
            P = [(refs[i], hyps[i]) for i in rows]; L = [(ref_labels[i], labels[i]) for i in rows]
            for k, (_, fn) in enumerate(METRICS.values()): out[k, j, b] = fn(P, L)
    return out


def loop_precomputed(stats, idx):
    names = list(stats)
    out = np.empty((len(METRICS), len(names), len(idx)))
    for b, rows in enumerate(idx):
        for j, s in enumerate(names):
            for k, m in enumerate(METRICS): out[k, j, b] = VALUE[m](stats[s][m][rows].sum(0))
    return out


def main():
    a = options(n=3000, reps=5000, systems=9, baseline_reps=(2, "replicates of the evaluator practice actually timed"),
                loop_reps=(0, "replicates of the precomputed loop (default 0: all)"))
    n, reps, loop_reps = a.n, a.reps, a.loop_reps or a.reps

    refs, ref_labels, systems = make_data(n, a.systems)
    t = time.perf_counter()
    stats = {s: per_sample_stats(refs, ref_labels, h, l) for s, (h, l) in systems.items()}
    precompute_s = time.perf_counter() - t
    metrics = list(METRICS)

    runs = []
    for _ in range(3):
        t = time.perf_counter(); res, table, _ = ours(stats, metrics, reps); runs.append(time.perf_counter() - t)
    ours_s = float(np.median(runs))
    tracemalloc.start(); ours(stats, metrics,
                              reps); peak_mb = tracemalloc.get_traced_memory()[1] / 2 ** 20; tracemalloc.stop()

    idx = resample_indices(n, reps, seed=SEED)
    t = time.perf_counter(); base = evaluator_practice(refs, ref_labels, systems, idx[:a.baseline_reps])
    base_sub_s = time.perf_counter() - t
    baseline_s = base_sub_s / a.baseline_reps * reps

    t = time.perf_counter(); loop = loop_precomputed(stats, idx[:loop_reps]); loop_sub_s = time.perf_counter() - t
    loop_s = loop_sub_s / loop_reps * reps

    # identical numbers: ours vs evaluator practice (same draws) and vs the precomputed loop
    ours_R = np.stack([res[m].replicates for m in metrics])                 # metrics x systems x reps
    diff_eval = np.abs(ours_R[:, :, :a.baseline_reps] - base)
    diff_loop = np.abs(ours_R[:, :, :loop_reps] - loop)
    per_metric = {m: {"kind": METRICS[m][0], "max_abs_diff_vs_evaluator": float(np.nanmax(diff_eval[k])),
                      "bit_identical_vs_evaluator": bool(np.array_equal(ours_R[k, :, :a.baseline_reps], base[k],
                                                                        equal_nan=True)),
                      "max_abs_diff_vs_loop": float(np.nanmax(diff_loop[k]))} for k, m in enumerate(metrics)}
    counts_exact = all(v["bit_identical_vs_evaluator"] for m, v in per_metric.items()
                       if m in ("exact_label_match", "label_micro_f1", "label_micro_precision", "label_macro_f1",
                                "corpus_bleu2", "token_micro_f1"))
    identical = bool(counts_exact and max(v["max_abs_diff_vs_evaluator"] for v in per_metric.values()) <= 1e-12
                     and max(v["max_abs_diff_vs_loop"] for v in per_metric.values()) <= 1e-12)

    # scipy.stats.bootstrap for the mean-type metrics (one-sample percentile CIs per system)
    mean_metrics = [m for m in metrics if METRICS[m][0] == "mean"]
    t = time.perf_counter()
    sc = {(m, s): sps.bootstrap((stats[s][m][:, 0],), np.mean, n_resamples=reps, method="percentile",
                                rng=np.random.default_rng(1)).confidence_interval
          for m in mean_metrics for s in stats}
    scipy_s = time.perf_counter() - t
    t = time.perf_counter()
    rm = bootstrap_metrics({m: ({s: stats[s][m] for s in stats}, "mean") for m in mean_metrics}, reps=reps, seed=SEED)
    sysf = {m: r.systems_frame().set_index("system") for m, r in rm.items()}
    ours_mean_s = time.perf_counter() - t
    mc = max(max(abs(sysf[m].loc[s, "ci_low"] - ci.low),
                 abs(sysf[m].loc[s, "ci_high"] - ci.high)) / sysf[m].loc[s, "se"]
             for (m, s), ci in sc.items())

    out = {
        "workload": {"systems": a.systems, "metrics": len(metrics), "mean_type": len(mean_metrics),
                     "corpus_type": len(metrics) - len(mean_metrics), "n_units": n, "reps": reps,
                     "comparisons": int(len(table)), "seed": SEED},
        "ours_s": round(ours_s, 4), "ours_runs_s": [round(r, 4) for r in runs],
        "ours_peak_traced_mb": round(peak_mb, 1),
        "precompute_stats_s": round(precompute_s, 3),
        "baseline_s": round(baseline_s, 1),
        "baseline_note": (f"evaluator practice (re-run each metric's pure-Python computation on the resampled pairs); "
                          f"{a.baseline_reps} of {reps} replicates timed ({base_sub_s:.2f} s) and scaled linearly"),
        "speedup": round(baseline_s / ours_s, 1),
        "speedup_including_precompute": round(baseline_s / (ours_s + precompute_s), 1),
        "loop_precomputed_s": round(loop_s, 2),
        "loop_precomputed_note": f"{loop_reps} of {reps} replicates timed" + ("" if loop_reps == reps
                                                                              else " and scaled"),
        "speedup_vs_loop_precomputed": round(loop_s / ours_s, 1),
        "scipy_mean_s": round(scipy_s, 3), "ours_mean_s": round(ours_mean_s, 4),
        "speedup_vs_scipy_mean": round(scipy_s / ours_mean_s, 1),
        "scipy_mean_note": (f"{len(sc)} one-sample percentile CIs (mean-type metrics x systems) with "
                            f"scipy.stats.bootstrap vs the same CIs from bootstrap_metrics; max CI bound difference "
                            f"{mc:.3f} bootstrap SEs (Monte Carlo: different draws)"),
        "identical": identical,
        "identical_note": ("count-based metrics bit-identical to the evaluator loop; mean-type metrics equal up to "
                           "floating-point summation order (max_abs_diff <= 1e-12)"),
        "per_metric": per_metric,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__},
    }
    write_result("bootstrap", out)


if __name__ == "__main__":
    main()
