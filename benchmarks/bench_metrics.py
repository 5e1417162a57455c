"""Benchmark: BLEU-1..4, ROUGE-L and CIDEr-D of `cxr_audit.metrics` against pycocoevalcap on 3,000 real IU X-ray report
pairs, and METEOR through one long-lived JVM against one JVM per call.

Pairs: the findings of the IU X-ray validation studies in the ReXrank JSON (296 studies; `--data`, default
/work/shared/data/iu_valid_rexrank.json, else the 50-study sample in tests/fixtures/iu_real), each pair a study's
findings (its impression when it has none) as the reference and another study's as the hypothesis, drawn with
`--seed`. Both sides are prepared once with the R2Gen cleaning (`tokenizer("r2gen")`), outside the timings, as
`compare_with_pycocoevalcap` does.

Timed (best of --repeat runs each, in the same run):
- ours_s: the per-sample statistics of bleu_1..bleu_4, rouge_l and cider (`Metric.stats`, the input of the bootstrap)
  plus each metric's corpus value and per-sample values (the caches of the module cleared before each run);
- baseline_s: pycocoevalcap's `Bleu(4)`, `Rouge()` and `Cider()` `compute_score` on the same prepared texts.
The script asserts that the corpus values and every per-sample value agree to 1e-12 and writes the largest difference.
METEOR (needs Java): --meteor-calls calls of `run_meteor` on --meteor-pairs pairs each, "before" with a fresh JVM per
call (the old behaviour, reproduced by `close_meteor()` before each call), "after" with the process's one JVM (its
start-up included once); the statistics must be equal.
Writes benchmarks/results/metrics.json and prints it. No assertions on time (target: speedup >= 5).
Run: .venv/bin/python benchmarks/bench_metrics.py [--pairs 3000] [--repeat 3] [--meteor-calls 5]
"""
import json
import os
import platform
import shutil
import time
from pathlib import Path

import numpy as np

from _timing import options, timed, write_result
from cxr_audit import metrics as M

ROOT = Path(__file__).resolve().parents[1]
DATA = [Path("/work/shared/data/iu_valid_rexrank.json"),
        ROOT / "tests" / "fixtures" / "iu_real" / "iu_valid_rexrank_sample.json"]
NAMES = ["bleu_1", "bleu_2", "bleu_3", "bleu_4", "rouge_l", "cider"]


def iu_pairs(path: Path, n: int, seed: int) -> tuple[list[str], list[str]]:
    "`n` (reference, hypothesis) pairs of real IU findings: a study against another study, drawn with `seed`."
    studies = list(json.loads(path.read_text()).values())
    texts = [s["section_findings"] or s["section_impression"] for s in studies]
    texts = [t for t in texts if t and t.strip()]
    g = np.random.default_rng(seed)
    i = g.integers(0, len(texts), n)
    j = (i + g.integers(1, len(texts), n)) % len(texts)             # never the same study
    return [texts[k] for k in i], [texts[k] for k in j]


def ours(refs, hyps) -> dict:
    "Statistics, corpus value and per-sample values of the six metrics (caches cleared first)."
    M._pair_counts4.cache_clear()
    out = {}
    for name in NAMES:
        m = M.get_metric(name, tokenize=None)
        S = m.stats(refs, hyps)
        out[name] = (float(m.value(S.sum(0))), np.asarray(m.value(S), dtype=float))
    return out


def baseline(refs, hyps) -> dict:
    "pycocoevalcap's corpus and per-sample values of the same six metrics."
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.rouge.rouge import Rouge
    gts, res = {i: [r] for i, r in enumerate(refs)}, {i: [h] for i, h in enumerate(hyps)}
    b, bl = Bleu(4).compute_score(gts, res, verbose=0)
    r, rl = Rouge().compute_score(gts, res)
    c, cl = Cider().compute_score(gts, res)
    out = {f"bleu_{n}": (b[n - 1], np.asarray(bl[n - 1], dtype=float)) for n in range(1, 5)}
    out["rouge_l"], out["cider"] = (float(r), np.asarray(rl, dtype=float)), (float(c), np.asarray(cl, dtype=float))
    return out


def max_diff(a: dict, b: dict) -> float:
    "Largest absolute difference over the corpus values and every per-sample value."
    return max(max(abs(a[k][0] - b[k][0]), float(np.max(np.abs(a[k][1] - b[k][1]), initial=0.0))) for k in NAMES)


def meteor_timing(refs, hyps, calls: int, per_call: int) -> dict:
    "Wall time of `calls` METEOR calls with a fresh JVM each (before) and with the process's one JVM (after)."
    chunks = [(refs[i * per_call:(i + 1) * per_call], hyps[i * per_call:(i + 1) * per_call]) for i in range(calls)]
    def run(fresh: bool):
        M.close_meteor()
        out = []
        for r, h in chunks:
            if fresh: M.close_meteor()
            out.append(M.run_meteor(r, h).stats)
        M.close_meteor()
        return np.vstack(out)
    t = time.perf_counter(); before = run(True); before_s = time.perf_counter() - t
    t = time.perf_counter(); after = run(False); after_s = time.perf_counter() - t
    assert np.array_equal(before, after), "METEOR statistics differ between one JVM per call and one JVM per process"
    return {"meteor_calls": calls, "meteor_pairs_per_call": per_call, "meteor_before_s": round(before_s, 3),
            "meteor_after_s": round(after_s, 3), "meteor_speedup": round(before_s / after_s, 2)}


def main():
    o = options(__doc__.split("\n")[0], pairs=3000, seed=0, repeat=3, data="", meteor_calls=5, meteor_pairs=200,
                no_meteor=(False, "skip the METEOR timing"))
    path = Path(o.data) if o.data else next(p for p in DATA if p.exists())
    raw_refs, raw_hyps = iu_pairs(path, o.pairs, o.seed)
    t = M.tokenizer("r2gen")
    refs, hyps = [t(x) for x in raw_refs], [t(x) for x in raw_hyps]
    ours_s, mine = timed(lambda: ours(refs, hyps), o.repeat)
    base_s, theirs = timed(lambda: baseline(refs, hyps), o.repeat)
    diff = max_diff(mine, theirs)
    assert diff < 1e-12, f"values differ from pycocoevalcap by {diff}"
    result = {"pairs": len(refs), "data": path.name, "seed": o.seed, "repeat": o.repeat, "metrics": NAMES,
              "ours_s": round(ours_s, 4), "baseline_s": round(base_s, 4), "speedup": round(base_s / ours_s, 2),
              "max_abs_diff": diff, "values": {k: mine[k][0] for k in NAMES},
              "rapidfuzz": M._LCSseq is not None, "cores": os.cpu_count(),
              "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
              "load_avg_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
              "python": platform.python_version(), "machine": platform.machine()}
    if not o.no_meteor and shutil.which("java"):
        result.update(meteor_timing(refs, hyps, o.meteor_calls, o.meteor_pairs))
    write_result("metrics", result)


if __name__ == "__main__":
    main()
