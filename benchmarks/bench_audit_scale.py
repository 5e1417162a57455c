"""Benchmark: the full audit (`cxr-audit demo`: every stage, 5 configurations) at three sizes of the synthetic corpus.

Per size: studies, generations, the run's wall time, each stage's seconds (from the run's own manifest.json) and the
peak resident memory of the process tree (the command and every process it starts, the METEOR jar and the second
stage process included), sampled every 0.1 s with psutil. Between consecutive sizes, the growth exponent
log(y2 / y1) / log(studies2 / studies1) of wall time, of peak memory and of each stage (1: linear; below 1: slower than
the data). Writes benchmarks/results/audit_scale.json; no assertions.
Run: .venv/bin/python benchmarks/bench_audit_scale.py [--patients 320,1600,6350] [--workers 1]
"""
import json
import math
import shutil
import sys
import tempfile
from pathlib import Path

import psutil
import pyarrow.parquet as pq
from _timing import options, run_with_peak, write_result


def run_demo(exe: str, patients: int, workers: int, out: Path) -> dict:
    "One `cxr-audit demo` run: wall seconds, peak tree memory, the table sizes and the manifest's stage seconds."
    r = run_with_peak([exe, "demo", "--out", out, "--n-patients", patients, "--workers", workers])
    if r["returncode"] != 0:
        raise SystemExit(f"demo with {patients} patients failed ({r['returncode']}):\n{r['stderr']}")
    m = json.loads((out / "manifest.json").read_text())
    rows = {t: pq.ParquetFile(out / f"{t}.parquet").metadata.num_rows for t in ("studies", "generations")}
    return {"patients": patients, "studies": rows["studies"], "generations": rows["generations"],
            "wall_s": round(r["wall_s"], 1), "peak_rss_gb": round(r["peak_rss_gb"], 2),
            "stage_seconds": m["stage_seconds"]}


def exponent(a: float, b: float, n1: int, n2: int) -> float | None:
    "log(b / a) / log(n2 / n1), or None when either value is not positive."
    return round(math.log(b / a) / math.log(n2 / n1), 2) if a > 0 and b > 0 and n2 != n1 else None


def main():
    opt = options(patients="320,1600,6350", workers=1)
    exe = shutil.which("cxr-audit", path=str(Path(sys.executable).parent)) or "cxr-audit"
    runs = []
    for n in [int(x) for x in opt.patients.split(",")]:
        with tempfile.TemporaryDirectory() as d:
            runs.append(run_demo(exe, n, opt.workers, Path(d) / "out"))
        print(json.dumps({k: v for k, v in runs[-1].items() if k != "stage_seconds"}), flush=True)
    growth = []
    for a, b in zip(runs, runs[1:]):
        n1, n2 = a["studies"], b["studies"]
        stages = {s: exponent(a["stage_seconds"][s], b["stage_seconds"][s], n1, n2)
                  for s in a["stage_seconds"] if s in b["stage_seconds"]}
        growth.append({"from_studies": n1, "to_studies": n2, "wall": exponent(a["wall_s"], b["wall_s"], n1, n2),
                       "peak_rss": exponent(a["peak_rss_gb"], b["peak_rss_gb"], n1, n2), "stages": stages})
    write_result("audit_scale", {"command": "cxr-audit demo (the full audit on the synthetic corpus, 5 configurations)",
                                 "workers": opt.workers, "cpus": psutil.cpu_count(), "runs": runs,
                                 "growth_exponents": growth})


if __name__ == "__main__":
    main()
