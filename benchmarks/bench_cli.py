"""Benchmark: how fast `cxr-audit --help` and a subcommand's `--help` answer, against a same-run baseline.

Each command imports what it needs when it runs, so help text costs a Python start and fastcore's docments, not numpy
or pandas. Baselines in the same run: a bare `python -c pass`, and importing every analysis module up front (what an
eager command line would pay). Writes benchmarks/results/cli.json; no assertions.
Run: .venv/bin/python benchmarks/bench_cli.py [--repeat N]
"""
import shutil
import subprocess
import sys
from pathlib import Path

from _timing import best_of, options, write_result

EAGER = ("import cxr_audit.audit, cxr_audit.evaluator, cxr_audit.reref_sensitivity, cxr_audit.longitudinal, "
         "cxr_audit.review, cxr_audit.generate")


def run(*args):
    subprocess.run(args, check=True, capture_output=True)


def main():
    repeat = options(repeat=5).repeat
    exe = shutil.which("cxr-audit", path=str(Path(sys.executable).parent)) or "cxr-audit"
    res = {"python_start_s": best_of(lambda: run(sys.executable, "-c", "pass"), repeat),
           "help_s": best_of(lambda: run(exe, "--help"), repeat),
           "score_help_s": best_of(lambda: run(exe, "score", "--help"), repeat),
           "review_prepare_help_s": best_of(lambda: run(exe, "review", "prepare", "--help"), repeat),
           "eager_imports_s": best_of(lambda: run(sys.executable, "-c", EAGER), repeat)}
    res = {k: round(v, 3) for k, v in res.items()}
    res["ratio_help_over_eager_imports"] = round(res["help_s"] / res["eager_imports_s"], 2)
    res["ratio_help_over_python_start"] = round(res["help_s"] / res["python_start_s"], 2)
    res["ratio_score_help_over_python_start"] = round(res["score_help_s"] / res["python_start_s"], 2)
    write_result("cli", res)


if __name__ == "__main__":
    main()
