"""Benchmark: `ReportGenerationEvaluator` (bootstrap by weights) against the documented evaluator's bootstrap, in one
run.

Workload: 1,000 (reference, hypothesis) pairs from the synthetic demo corpus (the studies' findings against the
simulated `sim-omit` generator's reports), 5 built-in metrics (BLEU-4, ROUGE-L, METEOR via the jar, CIDEr-D,
CheXpert-F1 on 5 labels) and 1,000 bootstrap replicates.

Timed approaches (same pairs, same draws `stats.resample_weights(1000, 1000, seed)`):
- ours: `ReportGenerationEvaluator(...).evaluate()` end to end: reading the dataset, calling the (look-up) generator,
  every metric's per-pair statistics once (one METEOR JVM), then all 1,000 replicates of all metrics as weight-matrix
  products (`stats.bootstrap_metrics`). Also reported: the bootstrap step alone on the precomputed statistics.
- the documented evaluator (paper 001): the point estimate on all pairs, then, for each replicate, the resampled list of
  pairs (pair i repeated W[r, i] times) scored again by every metric (`cxr_audit.metrics.score`, one METEOR JVM per
  replicate). Far too slow to run 1,000 times here, so `--baseline-reps` replicates (default 5) are timed and the time
  per replicate is scaled linearly to 1,000 (reported as such).

The timed baseline replicates are compared with ours: BLEU-4, ROUGE-L, METEOR and CheXpert-F1 agree to rounding;
CIDEr-D differs slightly by design (ours holds the IDF of the full set fixed; a re-run recomputes it per resample).
Writes benchmarks/results/evaluator.json and prints it. No assertions on time.
Run: .venv/bin/python benchmarks/bench_evaluator.py [--n 1000] [--reps 1000] [--baseline-reps 5] [--repeat 3]
"""
import os
import platform
import time

import numpy as np

from _timing import best_of, options, write_result
from cxr_audit.evaluator import ReportGenerationEvaluator, _score
from cxr_audit.metrics import score
from cxr_audit.stats import resample_weights
from cxr_audit.synth import make_demo_corpus

METRICS = ["bleu_4", "rouge_l", "meteor", "cider", "chexpert_f1_5"]
SEED = 2026


def make_dataset(n):
    "n sample dicts (image path, report text) and the look-up generator of sim-omit's reports."
    demo = make_demo_corpus(n_patients=max(4, n // 3 + 10), seed=0)
    st = demo.studies.iloc[:n]
    if len(st) < n: raise SystemExit(f"demo corpus too small: {len(st)} < {n}")
    hyp = demo.generations.query("system == 'sim-omit'").set_index("study_id").hypothesis
    written = {ps[0]: hyp[sid] for sid, ps in zip(st.study_id, st.image_paths)}
    samples = [{"img": ps[0], "study_id": sid, "report": text} for sid, ps,
               text in zip(st.study_id, st.image_paths, st.text)]
    return samples, (lambda imgs: [written[p] for p in imgs])


def main():
    a = options(n=1000, reps=1000, baseline_reps=5, repeat=3)
    samples, generator = make_dataset(a.n)
    mk = lambda: ReportGenerationEvaluator(generator, dataset=samples, metrics=METRICS, n_bootstrap=a.reps,
                                           bootstrap_seed=SEED)

    # ours, end to end
    ev = mk(); ours_df = ev.evaluate()
    ours_s = best_of(lambda: mk().evaluate(), a.repeat)
    boot_s = best_of(lambda: _score(ev.stats_, a.reps, SEED), a.repeat)
    n = len(ev.pairs_)

    # the documented evaluator: point estimate, then every metric re-run on each resample
    refs, hyps = ev.pairs_.reference.to_numpy(), ev.pairs_.hypothesis.to_numpy()
    t = time.perf_counter(); point = score(refs.tolist(), hyps.tolist(), METRICS); point_s = time.perf_counter() - t
    W = resample_weights(n, a.reps, seed=SEED)
    diffs, times = {m: [] for m in METRICS}, []
    for r in range(a.baseline_reps):
        rows = np.repeat(np.arange(n), W[r])
        t = time.perf_counter(); out = score(refs[rows].tolist(), hyps[rows].tolist(),
                                             METRICS); times.append(time.perf_counter() - t)
        for m, v in zip(out.metric, out.value): diffs[m].append(abs(float(v) - float(ours_df[m].iloc[r + 1])))
    per_rep = float(np.median(times))
    baseline_s = point_s + per_rep * a.reps

    res = {
        "benchmark": "evaluator",
        "workload": f"{n} pairs (demo corpus findings vs sim-omit), {len(METRICS)} metrics, {a.reps} bootstrap "
                    "replicates",
        "metrics": METRICS,
        "n_pairs": n, "reps": a.reps,
        "ours_s": round(ours_s, 3),
        "ours_bootstrap_only_s": round(boot_s, 4),
        "ours_stats_and_generation_s": round(ours_s - boot_s, 3),
        "baseline_s": round(baseline_s, 1),
        "baseline_point_estimate_s": round(point_s, 3),
        "baseline_per_replicate_s": round(per_rep, 3),
        "baseline_replicates_timed": a.baseline_reps,
        "baseline_scaled": f"{a.baseline_reps} of {a.reps} replicates timed (median), scaled linearly; plus the point "
                           "estimate",
        "speedup": round(baseline_s / ours_s, 1),
        "speedup_bootstrap_only": round(per_rep * a.reps / boot_s, 1),
        "max_abs_diff_vs_rerun": {m: float(np.max(d)) for m, d in diffs.items()},
        "note": ("bleu_4, rouge_l, meteor and chexpert_f1_5 equal the re-run on the same draws up to rounding; cider "
                 "differs by design: ours holds the IDF of the full set fixed, a re-run recomputes it from each "
                 "resample's references"),
        "point_estimates": {m: float(v) for m, v in zip(point.metric, point.value)},
        "repeat": a.repeat,
        "machine": {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count()},
    }
    write_result("evaluator", res)


if __name__ == "__main__":
    main()
