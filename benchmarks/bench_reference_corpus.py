"""Benchmark: `cxr-audit reference-corpus` on a corpus of 200,000 synthetic reference reports.

The corpus: the sentences of the synthetic demo corpus's findings (`synth.make_demo_corpus`, 600 patients) drawn again
with a seeded generator, 2 to 8 per report, and one report in eight the normal template "No acute cardiopulmonary
process." alone, so that the texts are mostly distinct and one template is frequent, as in real corpora; written to a
parquet file with a second, long text column that the audit never needs to read. Runs in the same session, each in its
own process with its wall time and the peak resident memory of its process tree:
- `read`: pandas reading the whole file (every column), the floor of any table-based audit;
- `naive`: the whole file read, then per report in Python: normalized text counted, words counted (no labels);
- `audit, no labels`: `cxr-audit reference-corpus --labeler none`;
- `audit`: `cxr-audit reference-corpus` with the default rule labeler.
Writes benchmarks/results/reference_corpus.json with ratios to `read` and `naive`; no assertions.
Run: .venv/bin/python benchmarks/bench_reference_corpus.py [--reports 200000]
"""
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from _timing import options, run_with_peak, write_result

NAIVE = """import re, sys, collections, pandas as pd
df = pd.read_parquet(sys.argv[1])
counts, words = collections.Counter(), []
for t in df["findings"]:
    t = t if isinstance(t, str) else ""
    counts[" ".join(t.lower().split()).rstrip(".,;:!? ")] += 1
    words.append(len(re.findall(r"[^\\W_]+", t)))
print(len(counts), sorted(words)[len(words) // 2])
"""


def synthetic_corpus(n: int, path: Path, seed: int = 0) -> Path:
    "`n` reports built from the demo corpus's sentences (see the module docstring), written to `path`."
    from cxr_audit.synth import make_demo_corpus
    st = make_demo_corpus(n_patients=600, seed=seed).studies
    sents = sorted({s.strip() + "." for t in st.findings for s in t.split(".") if s.strip()})
    g = np.random.default_rng(seed)
    k = g.integers(2, 9, n)
    picks = g.integers(0, len(sents), k.sum())
    cuts = np.cumsum(k)[:-1]
    reports = [" ".join(sents[j] for j in part) for part in np.split(picks, cuts)]
    normal = g.random(n) < 1 / 8
    reports = ["No acute cardiopulmonary process." if z else r for z, r in zip(normal, reports)]
    pd.DataFrame({"study_id": [f"s{i}" for i in range(n)], "findings": reports,
                  "impression": [r * 4 for r in reports]}).to_parquet(path, index=False)
    return path


def main():
    opt = options(reports=200_000)
    exe = shutil.which("cxr-audit", path=str(Path(sys.executable).parent)) or "cxr-audit"
    with tempfile.TemporaryDirectory() as d:
        path = synthetic_corpus(opt.reports, Path(d) / "reports.parquet")
        runs = {"read": run_with_peak([sys.executable, "-c", "import sys, pandas as pd; pd.read_parquet(sys.argv[1])",
                                       path]),
                "naive": run_with_peak([sys.executable, "-c", NAIVE, path]),
                "audit, no labels": run_with_peak([exe, "reference-corpus", path, "--out", Path(d) / "a", "--labeler",
                                                   "none"]),
                "audit": run_with_peak([exe, "reference-corpus", path, "--out", Path(d) / "b"])}
        summary = pd.read_csv(Path(d) / "b" / "summary.csv").set_index("measure")["value"].round(4).to_dict()
    for name, r in runs.items():
        if r["returncode"] != 0: raise SystemExit(f"{name} failed ({r['returncode']}):\n{r['stderr']}")
        r.pop("stderr"); r.pop("returncode")
    res = {"reports": opt.reports, "corpus": "synthetic (demo-corpus sentences recombined; 1 in 8 the normal template)",
           "runs": runs, "audit_summary": summary,
           "ratio_audit_over_read": round(runs["audit"]["wall_s"] / runs["read"]["wall_s"], 2),
           "ratio_audit_no_labels_over_naive": round(runs["audit, no labels"]["wall_s"] / runs["naive"]["wall_s"], 2)}
    write_result("reference_corpus", res)


if __name__ == "__main__":
    main()
