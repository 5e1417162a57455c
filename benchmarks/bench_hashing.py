"""Benchmark: content hashing of tables (`sha256_frame`) against a same-run baseline.

Baseline: sha256 of `DataFrame.to_csv()` bytes, the usual quick way to fingerprint a table (which,
unlike `sha256_frame`, depends on the pandas version's float formatting and is not polars-aware).
Writes benchmarks/results/hashing.json with the ratio; no assertions on time.
Run: .venv/bin/python benchmarks/bench_hashing.py [--rows N]
"""
import hashlib

import numpy as np
import pandas as pd

from cxr_audit.core import sha256_frame
from _timing import best_of, options, write_result


def main():
    n = options(rows=100_000).rows
    g = np.random.default_rng(0)
    df = pd.DataFrame({"study_id": [f"s{i:07d}" for i in range(n)], "score": g.random(n),
                       "n_tokens": g.integers(0, 200, n), "text": ["no acute cardiopulmonary process"] * n})
    base = best_of(lambda: hashlib.sha256(df.to_csv(index=False).encode()).hexdigest())
    ours = best_of(lambda: sha256_frame(df))
    res = {"rows": n, "baseline_csv_sha256_s": round(base, 4), "sha256_frame_s": round(ours, 4),
           "ratio_ours_over_baseline": round(ours / base, 2)}
    write_result("hashing", res)


if __name__ == "__main__":
    main()
