"""Shared timing helper of the benchmark scripts (run as `python benchmarks/bench_x.py`, so this folder is on sys.path)."""
import time


def best_of(fn, repeat: int = 5) -> float:
    "Smallest wall time of `repeat` calls of `fn()`, in seconds."
    times = []
    for _ in range(repeat):
        t = time.perf_counter(); fn(); times.append(time.perf_counter() - t)
    return min(times)
