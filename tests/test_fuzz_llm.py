"""Issue 22, the LLM layer: secrets redacted, the guard on the URL really called and on restricted datasets, the cache
key's endpoint, empty and malformed replies, fail-fast batches, and a kill -9 resume against the real llama.cpp server.

One piece is a stub, on purpose: `BadServer` below. The real server cannot be made to echo an API key in an error
body, answer `content: null`, drop `choices` or send garbage with HTTP 200 on cue, so those are played by a small
purpose-built HTTP server that counts what it receives. The missing-extra test hides `openai` with monkeypatch
(it is installed here; the test needs it absent).
"""
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from cxr_audit.cli import main as cli_main
from cxr_audit.core import InputError, write_manifest
from cxr_audit.llm import (BatchAbortedError, LLMHTTPError, OpenAIChat, RestrictedDataError, RuleChat, check_restricted,
                           describe_error, is_restricted, request_key, run_batch)
from test_llm import CountingProxy, ScriptedStub, _cached_keys, _requests, crash_script

KEY = "sk-live-SECRET-0123456789"
PW = "pw-SECRET-9876"


class BadServer(ScriptedStub):
    """A STUB OpenAI-compatible server (not a model): echoes credentials in an error, answers garbage, `content: null`,
    empty content or no `choices` with HTTP 200, as the script says."""

    def reply(self, step, headers):
        if step == "echo401":  # a server that copies the credentials it got into its error message
            return 401, {"error": {"message": f"invalid key {headers.get('Authorization')}; key={KEY}"}}, []
        if step == "echo500":  # a proxy that quotes every header it got, Basic credentials included
            return 500, {"error": {"message": f"upstream refused; headers: {dict(headers)}"}}, []
        if step == "echokey":  # a 200 answer whose text repeats the key and the URL credentials
            return 200, {"id": "x", "object": "chat.completion", "created": 0, "model": "stub", "choices": [{
                "index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": f"your key is {KEY}; "
                f"auth {headers.get('Authorization')}; user pw {PW}"}}],
                         "usage": {"prompt_tokens": 3, "completion_tokens": 1}}, []
        if step == "garbage":
            return 200, b"<html>proxy error</html>", []
        choices = [] if step == "nochoices" else [{"index": 0, "finish_reason": "stop", "message": {
            "role": "assistant", "content": {"null": None, "empty": "", "ok": "fine"}[step]}}]
        return 200, {"id": "x", "object": "chat.completion", "created": 0, "model": "stub",
                     "choices": choices, "usage": {"prompt_tokens": 3, "completion_tokens": 1}}, []


@pytest.fixture
def bad():
    servers = []

    def make(scripts):
        servers.append(BadServer(scripts))
        return servers[-1]
    yield make
    for s in servers:
        s.close()


def _reqs(names):
    return [{"request_id": n, "messages": n} for n in names]


# --- 1. secrets ------------------------------------------------------------------------------------------------

def test_secret_echoed_by_server_is_redacted_everywhere(bad, tmp_path, caplog):
    srv = bad({"*": ["echo401"]})
    llm = OpenAIChat("stub", base_url=srv.base_url, api_key=KEY)
    with caplog.at_level(logging.INFO, logger="cxr_audit.llm"):
        out = run_batch(_reqs(["a"]), llm, cache=False, retries=0, progress=False).to_frame()
    assert out.status[0] == "failed" and out.error[0].startswith("LLMHTTPError: HTTP 401")
    assert KEY not in out.error[0] and "<redacted>" in out.error[0]
    assert KEY not in caplog.text and "HTTP 401" in caplog.text
    with pytest.raises(LLMHTTPError) as e:
        llm.chat("b")
    assert KEY not in str(e.value) and "Bearer <redacted>" in str(e.value)


def test_userinfo_in_base_url_is_redacted(tmp_path):
    url = f"http://user:{KEY}@llm.example.org/v1"
    llm = OpenAIChat("m", base_url=url, api_key="sk-other-key")
    assert KEY not in repr(llm) and KEY not in json.dumps(llm.identity())
    m = write_manifest(tmp_path / "manifest.json", params={"base_url": url, "model": "m"})
    text = (tmp_path / "manifest.json").read_text()
    assert KEY not in text and m["params"]["base_url"] == "http://<redacted>@llm.example.org/v1"
    assert KEY not in describe_error(LLMHTTPError(500, f"upstream {url} failed"))
    assert KEY not in describe_error(RuntimeError(f"Authorization: Bearer {KEY}"))


def _basic(user, pw):
    import base64
    return base64.b64encode(f"{user}:{pw}".encode()).decode()


def test_url_credentials_quoted_by_a_server_never_reach_the_outputs(bad, tmp_path):
    "A credential in the base URL travels as `Authorization: Basic`; a server that quotes it lands nowhere at rest."
    srv = bad({"*": ["echo500"]})
    url = srv.base_url.replace("http://", f"http://alice:{PW}@")
    out = run_batch(_reqs(["a"]), OpenAIChat("stub", base_url=url, api_key=KEY), cache=False, retries=0,
                    progress=False).to_frame()
    text = out.to_json()
    assert out.status[0] == "failed" and "HTTP 500" in out.error[0]
    for secret in (PW, KEY, _basic("alice", PW)):
        assert secret not in text, secret


def test_an_echoed_key_is_masked_in_the_answer_and_never_stored(bad, tmp_path):
    from cxr_audit.llm import ChatCache
    srv = bad({"*": ["echokey"]})
    url = srv.base_url.replace("http://", f"http://alice:{PW}@")
    cache = ChatCache(tmp_path / "cache.sqlite")
    out = run_batch(_reqs(["a"]), OpenAIChat("stub", base_url=url, api_key=KEY), cache=cache, retries=0,
                    progress=False).to_frame()
    assert out.status[0] == "ok" and "your key is <redacted>" in out.text[0] and PW not in out.text[0]
    cache._conn().execute("PRAGMA wal_checkpoint(FULL)")
    for f in tmp_path.iterdir():   # every file the cache wrote (database, WAL, shared memory)
        raw = f.read_bytes()
        for secret in (KEY, PW, _basic("alice", PW)):
            assert secret.encode() not in raw, (f.name, secret)
    assert len(cache) == 1


def test_basic_and_header_credentials_are_redacted_in_messages():
    from cxr_audit.core import redact
    assert redact("Authorization: Basic YWxpY2U6cHctU0VDUkVU") == "Authorization: Basic <redacted>"
    assert redact('{"x-api-key": "abc123secret"}') == '{"x-api-key": "<redacted>"}'
    assert redact("proxy-authorization=sk-abcdefgh") == "proxy-authorization=<redacted>"


def test_configured_key_value_is_redacted(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    assert describe_error(ValueError(f"bad key {KEY}")) == "ValueError: bad key <redacted>"


# --- 2. the guard ------------------------------------------------------------------------------------------------

def test_guard_uses_the_url_the_client_calls():
    pytest.importorskip("openai")
    llm = OpenAIChat("m", base_url="https://llm.example.org/v1", api_key="sk-x")
    with pytest.raises(AttributeError):
        llm.endpoint = "http://127.0.0.1:8080/v1"  # no longer a way around the guard
    llm.client()
    # even a private change: the client still calls the remote host
    llm.__dict__["_endpoint"] = "http://127.0.0.1:8080/v1"
    with pytest.raises(RestrictedDataError, match="llm.example.org"):
        check_restricted(llm, 1)


def test_restricted_by_dataset_blank_or_missing_column():
    remote = RuleChat(lambda m, s: "x", name="r")
    remote.endpoint = "https://llm.example.org/v1"
    for extra in ({"dataset": "mimic-cxr"}, {"dataset": "MIMIC-CXR", "restricted": None},
                  {"dataset": "mimic-cxr", "restricted": ""}, {"dataset": "hospital-a"}):
        reqs = [{"request_id": "s1", "messages": "hi", **extra}]
        ds = ["hospital-a"] if extra["dataset"] == "hospital-a" else ()
        with pytest.raises(RestrictedDataError) as e:
            run_batch(reqs, remote, cache=False, progress=False, restricted_datasets=ds)
        assert isinstance(e.value, InputError) and "request_id='s1'" in str(e.value)
    assert run_batch([{"request_id": "s", "messages": "hi", "dataset": "iu-xray"}], remote, cache=False,
                     progress=False).n_ok == 1
    assert is_restricted([{"dataset": "mimic-cxr", "restricted": False}]) == [True]


def test_guard_refusal_is_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-real")
    studies = tmp_path / "studies.csv"
    studies.write_text("study_id,dataset,findings,impression\ns1,mimic-cxr,Small left effusion.,Effusion.\n")
    code = cli_main(["reref", "--studies", str(studies), "--out", str(tmp_path / "o"), "--backend", "openai",
                     "--model", "m", "--base-url", "http://10.255.255.1:9/v1"])
    err = capsys.readouterr().err
    assert code == 2 and "refused" in err and "Traceback" not in err


# --- 3. cache key, empty and malformed replies -------------------------------------------------------------------

def test_cache_key_includes_endpoint():
    a = OpenAIChat("same", base_url="http://127.0.0.1:8001/v1")
    b = OpenAIChat("same", base_url="http://127.0.0.1:8002/v1")
    c = OpenAIChat("same", base_url="http://u:pw@127.0.0.1:8001/v1")
    assert request_key(a, "hi") != request_key(b, "hi")
    assert request_key(a, "hi") == request_key(c, "hi")  # credentials are not part of the identity


@pytest.mark.parametrize("step", ["null", "empty", "nochoices", "garbage"])
def test_unusable_200_reply_retried_then_failed_readably(bad, tmp_path, step):
    srv = bad({"a": [step], "b": [step, "ok"]})
    llm = OpenAIChat("stub", base_url=srv.base_url)
    cache = tmp_path / "c.sqlite"
    out = run_batch(_reqs("ab"), llm, cache=cache, retries=2, backoff_s=0.01,
                    progress=False).to_frame().set_index("request_id")
    assert srv.received == {"a": 3, "b": 2}
    assert out.status.to_dict() == {"a": "failed", "b": "ok"} and out.text["b"] == "fine"
    assert out.error["a"].startswith("LLMReplyError: ") and "object has no attribute" not in out.error["a"]
    assert len(_cached_keys(cache)) == 1  # only the real answer is stored


# --- 4. fail fast ------------------------------------------------------------------------------------------------

def test_unreachable_server_stops_the_batch(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    llm = OpenAIChat("m", base_url=f"http://127.0.0.1:{port}/v1")
    t0 = time.monotonic()
    with pytest.raises(BatchAbortedError, match="first 5 requests all failed .*LLMConnectionError"):
        run_batch(_reqs([f"q{i}" for i in range(200)]), llm, cache=False, retries=1, backoff_s=0.01, max_concurrency=2,
                  progress=False)
    assert time.monotonic() - t0 < 30


def test_same_error_at_start_stops_the_batch_and_sends_no_more(bad):
    srv = bad({"*": ["echo401"]})
    llm = OpenAIChat("stub", base_url=srv.base_url, api_key=KEY)
    with pytest.raises(BatchAbortedError) as e:
        run_batch(_reqs([f"q{i}" for i in range(100)]), llm, cache=False, max_concurrency=1, fail_fast=3,
                  progress=False)
    assert sum(srv.received.values()) == 3 and KEY not in str(e.value) and isinstance(e.value, InputError)
    out = run_batch(_reqs([f"q{i}" for i in range(6)]), llm, cache=False, max_concurrency=1, fail_fast=0,
                    progress=False)
    assert out.n_failed == 6 and out.nothing_succeeded and "6 failed" in out.headline()


def test_missing_llm_extra_raises_before_any_call(bad, monkeypatch):
    srv = bad({"*": ["ok"]})
    monkeypatch.setitem(sys.modules, "openai", None)  # hide the installed package: `import openai` now fails
    llm = OpenAIChat("stub", base_url=srv.base_url)
    with pytest.raises(ImportError, match=r"llm"):
        run_batch(_reqs(["a", "b"]), llm, cache=False, progress=False)
    assert srv.received == {}


def test_partial_failure_is_counted(bad):
    srv = bad({"a": ["ok"], "b": ["null"]})
    run = run_batch(_reqs("ab"), OpenAIChat("stub", base_url=srv.base_url), cache=False, retries=0, progress=False)
    assert (run.n_ok, run.n_failed, run.nothing_succeeded) == (1, 1, False)


# --- 6. kill -9 and resume against the real server ----------------------------------------------------------------

def test_kill_9_resume_counts_lost_and_repeated(llama_server, tmp_path):
    proxy = CountingProxy(llama_server.base_url)
    try:
        cache, script = tmp_path / "k.sqlite", tmp_path / "batch.py"
        script.write_text(crash_script(24, 3))
        proc = subprocess.Popen([sys.executable, str(script), proxy.base_url, str(cache)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        t_end = time.monotonic() + 300
        while len(_cached_keys(cache)) < 8:   # the kill comes with about 16 of its 24 requests still to send
            assert proc.poll() is None and time.monotonic() < t_end, proc.stdout.read().decode()
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert proc.returncode == -signal.SIGKILL
        time.sleep(0.5)  # let the relay finish the requests that were in flight
        with proxy.lock:
            sent_before = [b["messages"][-1]["content"] for b in proxy.bodies]
            proxy.bodies.clear()
        done_before = _cached_keys(cache)
        reqs = _requests(24)
        run = run_batch(reqs, OpenAIChat("smollm2", base_url=proxy.base_url), cache=cache, max_concurrency=3,
                        max_tokens=6, progress=False)
        out = run.to_frame()
        sent_after = proxy.user_texts()
        lost = int((out.status != "ok").sum())
        repeated = len(set(sent_before) & set(sent_after))
        print(f"kill -9 resume: {len(done_before)} cached before the kill, {len(sent_before)} sent before, "
              f"lost={lost}, repeated={repeated}")
        assert lost == 0 and run.n_ok == 24 and out.cached.sum() == len(done_before)
        assert repeated <= 3, f"{repeated} requests were sent twice (at most the 3 in flight may be)"
        assert len(sent_after) == 24 - len(done_before)
    finally:
        proxy.close()


def test_a_server_that_never_answers_fails_the_cli_run_within_the_timeout_asked(tmp_path):
    """A STUB listener that accepts connections and never replies: with --timeout 2 the run ends, clearly, exit 1 (a
    request
    that times out before the server answered anything is not retried); with --budget the whole run stops when it is
    spent."""
    import pandas as pd
    srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(16)
    held = []
    def accept():
        while True:
            try: held.append(srv.accept()[0])   # keep the connection open, say nothing
            except OSError: return
    import threading
    threading.Thread(target=accept, daemon=True).start()
    pd.DataFrame({"study_id": ["s1"], "dataset": ["iu-xray"], "findings": ["Small left pleural effusion. Heart size "
                                                                           "is normal."],
                  "impression": ["Small effusion."]}).to_csv(tmp_path / "st.csv", index=False)
    def reref(out, *waiting):
        return subprocess.run([sys.executable, "-c", "from cxr_audit.cli import main; raise SystemExit(main())",
                               "reref", "--studies", str(tmp_path / "st.csv"), "--out", str(tmp_path / out),
                               "--backend", "openai", "--model", "m",
                               "--base-url", f"http://127.0.0.1:{srv.getsockname()[1]}/v1", "--variations",
                               "negation:implicit", *waiting, "--cache", str(tmp_path / "c.sqlite")],
                              capture_output=True, text=True, timeout=120,
                              env={**os.environ, "OPENAI_API_KEY": "sk-test"})
    r = reref("o", "--timeout", "2")
    budgeted = reref("b", "--timeout", "600", "--budget", "2")   # one 600 s wait would outlast this test's 120 s limit
    srv.close()
    for c in held: c.close()
    assert r.returncode == 1 and "none of" in r.stderr and "LLM calls succeeded" in r.stderr, r.stderr[-2000:]
    import pandas as pd
    errors = pd.read_parquet(tmp_path / "o" / "rounds.parquet").error.dropna()
    # --timeout reached the client
    assert len(errors) and errors.str.startswith("LLMTimeoutError: no answer from").all()
    assert budgeted.returncode == 1 and "none of" in budgeted.stderr, budgeted.stderr[-2000:]
    assert pd.read_parquet(tmp_path / "b" / "rounds.parquet").error.dropna().str.startswith("LLMTimeoutError").all()
    assert cli_main(["reref", "--studies", str(tmp_path / "st.csv"), "--out", str(tmp_path / "x"), "--budget",
                     "-1"]) == 2
    assert cli_main(["reref", "--studies", str(tmp_path / "st.csv"), "--out", str(tmp_path / "x"), "--timeout",
                     "0"]) == 2
