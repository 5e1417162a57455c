"""Batch files (cxr_audit.llm_batch): exported files against the documented OpenAI batch input format, a ReRef run
finished through export -> execute -> import rounds against the real llama.cpp server (tests/conftest.py), idempotent
re-import, and a kill -9 in the middle of an import. ReRef's end-to-end test against the real server is here too: its
live
calls are the first round of the live run the batch test compares against (the `live` fixture), so they are made once.

`provider_stand_in` below is a TEST STAND-IN for the batch provider (OpenAI / Azure Batch, `vllm run-batch`): it posts
each exported line's body to the real local llama.cpp server and writes the provider's output (and error) JSONL format.
A body
the live run already sent (seen by `RecordingRelay`) gets the server's reply to that identical request instead of a
second,
identical computation. Nothing else is simulated: the cache is a real SQLite file, the model a real GGUF served over
HTTP. """
import fcntl
import http.client
import http.server
import json
import os
import pty
import signal
import sqlite3
import struct
import subprocess
import sys
import termios
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import jsonschema
import numpy as np
import pandas as pd
import pytest

from cxr_audit import reref as R
from cxr_audit.core import InputError
from cxr_audit.llm import ChatCache, OpenAIChat, RuleChat, run_batch
from cxr_audit.llm_batch import BatchCollector, batch_status, export_batch, import_batch

# The documented input line of OpenAI's Batch API (also read by Azure OpenAI global batch and `vllm run-batch`):
# custom_id (a string of at most 64 characters, unique in the file), method POST, url, body (a chat-completions
# request).
BATCH_LINE_SCHEMA = {
    "type": "object", "additionalProperties": False, "required": ["custom_id", "method", "url", "body"],
    "properties": {
        "custom_id": {"type": "string", "minLength": 1, "maxLength": 64},
        "method": {"const": "POST"},
        "url": {"enum": ["/v1/chat/completions", "/chat/completions"]},
        "body": {"type": "object", "required": ["model", "messages"], "properties": {
            "model": {"type": "string", "minLength": 1},
            "messages": {"type": "array", "minItems": 1, "items": {
                "type": "object", "required": ["role", "content"],
                "properties": {"role": {"enum": ["system", "developer", "user", "assistant"]},
                               "content": {"type": "string"}}}},
            "response_format": {"type": "object", "required": ["type"]},
            "max_tokens": {"type": "integer", "minimum": 1}, "max_completion_tokens": {"type": "integer", "minimum": 1},
            "temperature": {"type": "number", "minimum": 0}, "seed": {"type": "integer"}}}}}
OPENAI_MAX_LINES, OPENAI_MAX_BYTES = 50_000, 200 * 1000 * 1000


def check_batch_file(path: Path, max_lines=OPENAI_MAX_LINES, max_bytes=OPENAI_MAX_BYTES) -> list[dict]:
    "Every line valid against the documented schema, ids unique, one model and one url per file, under the limits."
    lines = path.read_text(encoding="utf-8").splitlines()
    objs = [json.loads(x) for x in lines]
    for o in objs: jsonschema.validate(o, BATCH_LINE_SCHEMA)
    assert len({o["custom_id"] for o in objs}) == len(objs)
    assert len({o["body"]["model"] for o in objs}) == 1 and len({o["url"] for o in objs}) == 1
    assert 0 < len(objs) <= max_lines and path.stat().st_size <= max_bytes
    return objs


class RecordingRelay:
    """A loopback HTTP relay in front of the real server: it forwards each POST unchanged and keeps the server's reply
    under the
    exact request (path and body), so that a later identical request can be answered without computing it again."""
    def __init__(self, upstream_base_url: str):
        up, relay = urlsplit(upstream_base_url), self
        self.upstream, self.replies = (up.hostname, up.port), {}

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            def log_message(self, *args): pass
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                conn = http.client.HTTPConnection(*relay.upstream, timeout=3600)
                conn.request("POST", self.path, body, {"Content-Type": "application/json"})
                resp = conn.getresponse(); status, data = resp.status, resp.read(); conn.close()
                relay.replies[relay.key(self.path, json.loads(body))] = (status, json.loads(data or b"{}"))
                self.send_response(status); self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data))); self.end_headers(); self.wfile.write(data)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    @staticmethod
    def key(path: str, body: dict) -> str:
        """The request as a string: top-level fields in name order, everything inside in its own order (the schema's
        steers the reply)."""
        return path + " " + json.dumps({k: body[k] for k in sorted(body)})
    def close(self): self.httpd.shutdown(); self.httpd.server_close()


def provider_stand_in(in_path: Path, out_path: Path, err_path: Path, base_url: str, served: dict | None = None) -> int:
    """TEST STAND-IN for the batch provider: POST each line's body to the server, write output/error lines as OpenAI
    does.
    A body in `served` (a `RecordingRelay`'s replies) gets the reply the server gave to that identical request before
    (the server
    decodes deterministically); any other body is posted. Returns the number of lines answered from `served`."""
    root = f"{urlsplit(base_url).scheme}://{urlsplit(base_url).netloc}"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    reused = 0
    with open(out_path, "w") as out, open(err_path, "w") as err:
        for n, raw in enumerate(in_path.read_text().splitlines()):
            line = json.loads(raw)
            if (served or {}).get(RecordingRelay.key(line["url"], line["body"])):
                (status, body), reused = served[RecordingRelay.key(line["url"], line["body"])], reused + 1
            else:
                req = urllib.request.Request(root + line["url"], data=json.dumps(line["body"]).encode(), method="POST",
                                             headers={"Content-Type": "application/json"})
                try:
                    with opener.open(req, timeout=3600) as r: status, body = r.status, json.loads(r.read())
                except urllib.error.HTTPError as e: status, body = e.code, json.loads(e.read() or b"{}")
            rec = {"id": f"batch_req_{in_path.stem}_{n}", "custom_id": line["custom_id"],
                   "response": {"status_code": status, "request_id": f"req_{n}", "body": body}, "error": None}
            (out if status == 200 else err).write(json.dumps(rec) + "\n")
    return reused


class CountingOpenAIChat(OpenAIChat):
    "OpenAIChat that counts the requests it really sends (the batch path must send none)."
    sent = 0
    def _send(self, kw):
        type(self).sent += 1
        return super()._send(kw)


def _toy(m, s): return {"longitudinal": "stable" in m[-1]["content"].lower()}

TOY_SCHEMA = {"title": "T", "type": "object",
              "properties": {"longitudinal": {"type": "boolean"}, "evidence": {"type": "string"}},
              "required": ["longitudinal"]}   # properties deliberately not in alphabetical order


# --- exported files ----------------------------------------------------------------------------------------------

def test_exported_files_follow_the_documented_batch_input_format_and_limits(tmp_path):
    cache = ChatCache(tmp_path / "c.sqlite")
    llm = OpenAIChat("gpt-4o-mini", api_key="sk-test-not-real")          # never called: the collector records
    reqs = [{"request_id": i, "messages": f"Sentence {i}: heart size is stable.", "schema": TOY_SCHEMA, "seed": i}
            for i in range(40)]
    run = run_batch(reqs, BatchCollector(llm, cache), cache=cache, progress=False)
    assert run.n_pending == 40 and llm._client is None
    files = export_batch(cache, tmp_path / "out", max_lines=15)
    assert files.requests.tolist() == [15, 15, 10]
    objs = [o for f in files.file for o in check_batch_file(tmp_path / "out" / f, max_lines=15)]
    assert sorted(o["custom_id"] for o in objs) == sorted(run.to_frame().key)     # custom_id is the cache key
    body = objs[0]["body"]
    assert body["response_format"]["type"] == "json_schema" and "max_completion_tokens" in body
    # the body is exactly what the live client would send, key order included (the schema's property order steers the
    # reply)
    req = next(r for r in reqs if run.to_frame().key[r["request_id"]] == objs[0]["custom_id"])
    live = llm._request([{"role": "user", "content": req["messages"]}], TOY_SCHEMA, "json_schema", 0.0, req["seed"],
                        1024, None, None, None)
    assert json.dumps(body) == json.dumps(live)
    # a size limit splits too
    small = export_batch(cache, tmp_path / "small", max_bytes=2500, again=True)
    for f in small.file: check_batch_file(tmp_path / "small" / f, max_bytes=2500)
    assert small.requests.sum() == 40 and len(small) > 3
    manifest = json.loads(next((tmp_path / "out").glob("*.manifest.json")).read_text())
    assert manifest["requests"] == 40 and set(manifest["outputs"]) == set(files.file)


def test_azure_lines_use_the_deployment_and_the_unversioned_path(tmp_path):
    az = OpenAIChat.azure("my-batch-deployment", endpoint="https://res.openai.azure.com", api_key="k",
                          api_version="2024-10-21")
    cache = ChatCache(tmp_path / "c.sqlite")
    run_batch([{"request_id": 1, "messages": "x"}], BatchCollector(az, cache), cache=cache, progress=False)
    f = export_batch(cache, tmp_path / "o")
    (o,) = check_batch_file(tmp_path / "o" / f.file[0])
    assert (o["url"], o["body"]["model"]) == ("/chat/completions", "my-batch-deployment")


def test_export_of_a_request_over_the_size_limit_names_it(tmp_path):
    cache = ChatCache(tmp_path / "c.sqlite")
    run_batch([{"request_id": 1, "messages": "x" * 5000}], BatchCollector(RuleChat(_toy), cache), cache=cache,
              progress=False)
    with pytest.raises(InputError, match="over max_bytes=1000"): export_batch(cache, tmp_path / "o", max_bytes=1000)
    assert batch_status(cache).to_export.sum() == 1      # nothing was marked exported


# --- the real server, round by round -----------------------------------------------------------------------------

def _studies():
    return pd.DataFrame({"study_id": ["s1", "s2"], "dataset": ["mimic-cxr", "mimic-cxr"],
                         "findings": ["No pleural effusion. No pneumothorax. Heart size is normal.",
                                      "Mild cardiomegaly. No focal consolidation."],
                         "impression": ["No acute process.", "Mild cardiomegaly."]})


SETTINGS = dict(generator_max_tokens=160, verifier_max_tokens=160)


@pytest.fixture(scope="module")
def live(tmp_path_factory, llama_server):
    """The live ReRef runs of `_studies()` on "negation:implicit" against the real server, all through one
    `RecordingRelay` and one
    cache. First one round (two requests at a time) and the same run again (test_end_to_end_on_a_real_llama_cpp_server),
    then two
    rounds (one request at a time), the live run the batch test compares against: its first round is the same requests,
    answered
    by the cache, so only its second round reaches the server. The relay keeps the server's reply to every request."""
    tmp = tmp_path_factory.mktemp("live")
    # the live runs reach the server through it; it keeps each reply under its exact request
    relay = RecordingRelay(llama_server.base_url)
    llm = OpenAIChat("smollm2", base_url=relay.base_url, structured="json_object_schema")
    studies = _studies().assign(restricted=[True, True])
    # one round (about 700 prompt tokens per call); the retry and give-up paths are covered by tests/test_reref.py's
    # scripted test
    one = R.ReRef(llm, llm, max_rounds=1, **SETTINGS)
    kw = dict(cache=tmp / "cache.sqlite", retries=0, max_concurrency=2)
    # restricted rows: allowed, the server is on loopback
    first = R.rewrite_table(studies, "negation:implicit", one, **kw)
    second = R.rewrite_table(studies, "negation:implicit", one, **kw)
    cache = ChatCache(tmp / "cache.sqlite"); by_model = cache.stats()["by_model"]; cache.close()
    # no time limit on the live calls: on a busy machine a 120 s limit fails calls the batch path would answer
    two = R.rewrite_table(_studies(), "negation:implicit", R.ReRef(llm, llm, max_rounds=2, **SETTINGS),
                          cache=tmp / "cache.sqlite", retries=0, max_concurrency=1, timeout_s=3600)
    relay.close()
    return dict(first=first, second=second, by_model=by_model, two=two, replies=relay.replies)


def test_end_to_end_on_a_real_llama_cpp_server(live):   # the session's server (tests/conftest.py); ReRef's live test
    first, second = live["first"], live["second"]
    rounds, s1 = first.rounds, first.calls
    assert len(first.references) == 4 and len(rounds) == 2 and (first.references.iterations == [0, 1, 0, 1]).all()
    assert s1["requests"] >= 3 and s1["tokens_in"] > 1000 and s1["tokens_out"] > 0
    ok = rounds[rounds.generator_status == "ok"]
    assert len(ok) >= 1 and ok.findings.map(lambda x: isinstance(x, str)).all()
    # every round either produced a rewrite or recorded why not; verdicts, when present, are booleans
    assert ((rounds.generator_status == "ok") | rounds.error.notna()).all()
    judged = rounds[rounds.verifier_status == "ok"]
    assert judged.is_valid_perturbation.map(lambda x: isinstance(x, (bool, np.bool_))).all()
    # the prompts went to the server in the packaged templates, through run_batch and its cache
    assert live["by_model"]
    assert second.calls["cached"] == s1["ok"] > 0
    if s1["failed"] == 0:
        assert second.calls["called"] == 0
        pd.testing.assert_frame_equal(first.references, second.references)


def test_reref_finishes_through_batch_files_with_no_live_call_and_the_live_references(tmp_path, llama_server, live):
    base, replies, live = llama_server.base_url, live["replies"], live["two"]   # `live`: the two-round live run
    settings = dict(max_rounds=2, **SETTINGS)
    CountingOpenAIChat.sent = 0
    llm = CountingOpenAIChat("smollm2", base_url=base, structured="json_object_schema")
    cache = ChatCache(tmp_path / "batch.sqlite")
    collector = BatchCollector(llm, cache)
    loop, outputs, trail, lines, reused = R.ReRef(collector, collector, **settings), [], [], 0, 0
    for k in range(1, 9):
        run = R.rewrite_table(_studies(), "negation:implicit", loop, cache=cache, retries=0)
        trail.append(run.status())
        if run.complete: break
        assert run.calls["pending"] > 0 and run.references.findings.isna().sum() == len(run.pending)
        # MIMIC rows: the files run here, locally
        files = export_batch(cache, tmp_path / f"round{k}", allow_restricted=True)
        assert len(files) > 0, "pending requests but nothing to export"
        for f in files.file:
            objs = check_batch_file(tmp_path / f"round{k}" / f)
            assert all(o["body"]["response_format"]["type"] == "json_object" for o in objs)
            out, err = tmp_path / f"round{k}" / f"{f}.output", tmp_path / f"round{k}" / f"{f}.errors"
            # the stand-in provider answers a body the live run sent with the server's reply to it (llama.cpp decodes
            # greedily or
            # with the request's seed, so a second POST would return the same), and posts any other body to the server
            reused += provider_stand_in(tmp_path / f"round{k}" / f, out, err, base, served=replies)
            lines += len(objs)
            outputs += [out, err]
            import_batch(cache, [out, err])
    assert run.complete and CountingOpenAIChat.sent == 0            # the run itself never called the server
    # every exported body is a request the live run sent (top-level field order aside)
    assert lines > 0 and reused == lines
    assert len(trail) >= 3 and trail[0]["step"].tolist() == ["generate"]   # round 1 Generator, then its Verifier, ...
    cols = [c for c in live.references.columns if c != "error"]
    logs = {"live": live.rounds[["task_id", "round", "generator_status", "verifier_status", "accepted",
                                 "error"]].to_dict("records"),
            "batch": run.rounds[["task_id", "round", "generator_status", "verifier_status", "accepted",
                                 "error"]].to_dict("records")}
    assert run.references[cols].equals(live.references[cols]), logs
    pd.testing.assert_frame_equal(run.references[cols], live.references[cols])
    assert (run.references.error.isna() == live.references.error.isna()).all()
    # re-import is idempotent: nothing new stored, the same answers and status
    before, status = len(cache), batch_status(cache)
    again = import_batch(cache, outputs)
    assert not again.stored.any() and len(cache) == before
    pd.testing.assert_frame_equal(batch_status(cache), status)
    assert status.waiting.sum() == 0 and status.to_export.sum() == 0


# --- kill -9 during an import --------------------------------------------------------------------------------------

def _big_ledger(cache_path: Path, out_path: Path, n: int) -> None:
    "n recorded requests (inserted directly: this is setup) and a provider output file answering all of them."
    cache = ChatCache(cache_path)
    rule = RuleChat(_toy, name="toy")
    reqs = [{"request_id": 0, "messages": "seed"}]
    run_batch(reqs, BatchCollector(rule, cache), cache=cache, progress=False)   # creates the ledger tables
    con = sqlite3.connect(cache_path)
    con.executemany("INSERT INTO batch_requests (key, kind, model, body_json, schema_json, restricted, state, "
                    "recorded_utc) VALUES (?, 'rule', 'toy', '{}', ?, 0, 'exported', '2026-01-01T00:00:00Z')",
                    [(f"{i:064x}", json.dumps(TOY_SCHEMA)) for i in range(n)])
    con.commit(); con.close(); cache.close()
    body = {"model": "toy", "usage": {"prompt_tokens": 9, "completion_tokens": 3},
            "choices": [{"index": 0, "message": {"role": "assistant", "content": '{"longitudinal": true}'},
                         "finish_reason": "stop"}]}
    with open(out_path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"r{i}", "custom_id": f"{i:064x}", "response": {"status_code": 200, "body": body},
                                "error": None}) + "\n")


def _answers(cache_path: Path) -> int:
    con = sqlite3.connect(cache_path, timeout=60)
    try: return con.execute("SELECT COUNT(*) FROM chat_cache").fetchone()[0]
    finally: con.close()


def test_kill_9_during_import_loses_nothing(tmp_path):
    n, chunk = 60_000, 100
    cache_path, out = tmp_path / "c.sqlite", tmp_path / "output.jsonl"
    _big_ledger(cache_path, out, n)
    code = (f"from cxr_audit.llm_batch import import_batch; import_batch({str(cache_path)!r}, {str(out)!r}, "
            f"chunk={chunk})")
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE)
    t_end = time.monotonic() + 120
    while _answers(cache_path) < 5 * chunk:
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        assert time.monotonic() < t_end, "the import made no progress"
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL); proc.wait()
    assert proc.returncode == -signal.SIGKILL
    con = sqlite3.connect(cache_path)
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    con.close()
    got = _answers(cache_path)
    assert 0 < got < n, f"the import was not interrupted ({got} of {n})"
    assert got % chunk == 0                    # whole transactions only: no half-written chunk
    rows = import_batch(cache_path, out)       # resume: the rest is stored, what was there is kept
    assert (rows.status == "ok").all() and int(rows.stored.sum()) == n - got and _answers(cache_path) == n
    assert batch_status(cache_path).answered.sum() == n


# --- progress: a tqdm bar on a terminal only ----------------------------------------------------------------------

_PROGRESS = ("from cxr_audit.llm import RuleChat, run_batch\n"
             "run_batch([{'request_id': i, 'messages': f'm{i}'} for i in range(30)], RuleChat(lambda m, s: 'ok'), "
             "cache=False)\n")


def test_run_batch_progress_is_a_tqdm_bar_on_a_terminal_and_silent_otherwise():
    piped = subprocess.run([sys.executable, "-c", _PROGRESS], capture_output=True, text=True, timeout=120)
    assert piped.returncode == 0 and piped.stderr == ""          # not a terminal (tests, logs, docs): nothing at all
    master, slave = pty.openpty()
    # a real terminal has a size (a new pty: 0 x 0)
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    proc = subprocess.Popen([sys.executable, "-c", _PROGRESS], stderr=slave, stdout=subprocess.DEVNULL)
    os.close(slave)
    chunks = []
    while True:
        try: data = os.read(master, 4096)
        except OSError: break                                      # the child closed the terminal
        if not data: break
        chunks.append(data)
    proc.wait(timeout=120); os.close(master)
    shown = b"".join(chunks).decode(errors="replace")
    # tqdm's bar and rate
    assert proc.returncode == 0 and "llm batch" in shown and "30/30" in shown and "req/s" in shown


def test_export_refuses_restricted_requests_unless_allowed(tmp_path):
    """Recorded for a local server (allowed), restricted requests do not leave in a batch file without the explicit
    opt-in."""
    from cxr_audit.llm import RestrictedDataError
    cache = ChatCache(tmp_path / "c.sqlite")
    local = OpenAIChat("local-model", base_url="http://127.0.0.1:9/v1", api_key="sk-test-not-real")   # never called
    reqs = [{"request_id": i, "messages": f"Sentence {i}.", "restricted": i < 2} for i in range(4)]
    assert run_batch(reqs, BatchCollector(local, cache), cache=cache, progress=False).n_pending == 4
    with pytest.raises(RestrictedDataError, match=r"2 of the 4 requests waiting are restricted data"):
        export_batch(cache, tmp_path / "out")
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("*.jsonl"))   # nothing written
    r = subprocess.run([Path(sys.executable).parent / "cxr-audit", "llm-batch", "export", "--cache",
                        tmp_path / "c.sqlite", "--out", tmp_path / "cli"], capture_output=True, text=True)
    assert r.returncode == 2 and "restricted data" in r.stderr and "Traceback" not in r.stderr
    assert export_batch(cache, tmp_path / "ok", allow_restricted=True).requests.sum() == 4
