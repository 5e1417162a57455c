"""Shared helpers of the benchmark scripts (run as `python benchmarks/bench_x.py`, so this folder is on sys.path):
timing, the command line's options, and writing the result."""
import argparse
import json
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def timed(fn, repeat: int = 5) -> tuple[float, object]:
    "Smallest wall time of `repeat` calls of `fn()`, in seconds, and the last call's result."
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter(); out = fn(); times.append(time.perf_counter() - t)
    return min(times), out


def best_of(fn, repeat: int = 5) -> float:
    "Smallest wall time of `repeat` calls of `fn()`, in seconds."
    return timed(fn, repeat)[0]


def options(description: str | None = None, **defaults) -> argparse.Namespace:
    """The script's command-line options: `--some-name` for each keyword `some_name`, of its default's type (a `False`
    default makes a flag); a value `(default, help)` adds a help text."""
    ap = argparse.ArgumentParser(description=description)
    for name, value in defaults.items():
        default, text = value if isinstance(value, tuple) else (value, None)
        flag = "--" + name.replace("_", "-")
        if isinstance(default, bool): ap.add_argument(flag, action="store_true", help=text)
        else: ap.add_argument(flag, type=type(default), default=default, help=text)
    return ap.parse_args()


def write_result(name: str, result: dict) -> Path:
    "Write `result` to benchmarks/results/<name>.json and print it as one JSON line."
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return path


def run_with_peak(args: list, interval: float = 0.1) -> dict:
    """Run a command; its wall seconds and the peak resident memory of its process tree (the command and every process
    it starts, summed, sampled every `interval` seconds with psutil), its exit code and the end of its stderr."""
    import subprocess

    import psutil
    t0 = time.perf_counter()
    proc = subprocess.Popen([str(a) for a in args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    ps, peak = psutil.Process(proc.pid), 0
    while proc.poll() is None:
        total = 0
        for p in [ps, *ps.children(recursive=True)]:
            try: total += p.memory_info().rss
            except psutil.Error: pass   # ended meanwhile
        peak = max(peak, total)
        time.sleep(interval)
    return {"wall_s": round(time.perf_counter() - t0, 2), "peak_rss_gb": round(peak / 2**30, 3),
            "returncode": proc.returncode, "stderr": proc.stderr.read()[-3000:]}
