"""The paper notebooks on real inputs: with CXR_AUDIT_IU pointing at a real IU X-ray file, paper 004's notebook runs end to end;
with an OpenAI-compatible HTTP server as its annotator (the suite's real llama.cpp server, and an in-process server answering by
rules), paper 003's notebook runs its LLM path end to end."""
import json
import sqlite3
from pathlib import Path

import pandas as pd

from nbdev.config import get_config
from nbdev.test import test_nb as run_nb  # renamed so pytest does not collect it

from cxr_audit.llm import LocalEndpoint
from cxr_audit.longitudinal import rule_chat

ROOT = Path(__file__).resolve().parents[1]
PAPER_004 = ROOT / "nbs" / "papers" / "004_crossdomain.ipynb"
PAPER_003 = ROOT / "nbs" / "papers" / "003_longitudinal.ipynb"
IU_REAL = ROOT / "tests" / "fixtures" / "iu_real" / "iu_valid_rexrank_sample.json"


def test_paper_004_runs_on_a_real_iu_file(monkeypatch):
    # the IU cohort, concentration, labels and the bootstrap family run on 50 real IU X-ray studies (ReXrank JSON),
    # with only the path changed; MIMIC-CXR stays simulated (restricted data is not in the repository)
    assert IU_REAL.is_file() and PAPER_004.is_file()
    monkeypatch.setenv("CXR_AUDIT_IU", str(IU_REAL))
    monkeypatch.setenv("CXR_AUDIT_REPS", "200")
    skip = get_config(path=ROOT).get("tst_flags", "").split()
    ok, _ = run_nb(PAPER_004, skip_flags=skip, showerr=True)
    assert ok, "004_crossdomain.ipynb failed on the real IU file (the traceback is printed above)"


def test_a_failing_step_fails_the_run(monkeypatch):
    # the runner must report a failure, not swallow it: a path that does not exist stops the notebook
    monkeypatch.setenv("CXR_AUDIT_IU", str(ROOT / "tests" / "fixtures" / "iu_real" / "no_such_file.json"))
    ok, _ = run_nb(PAPER_004, skip_flags=[], showerr=False)
    assert not ok


def test_paper_003_llm_path_over_http(monkeypatch, tmp_path):
    # plumbing and labelling, not quality: the page's LLM path (OpenAIChat -> an OpenAI-compatible HTTP server, PAPER_003's
    # prompts, the few-shot grid, the sampling runs) on a few demo reports. The server is the module's in-process endpoint
    # answering by rules (`rule_chat`), so that every evaluation section has longitudinal content to score (SmolLM2-135M, in the
    # test below, marks none: the page then says so instead of showing numbers).
    assert PAPER_003.is_file()
    out = tmp_path / "ev"
    with LocalEndpoint(rule_chat()) as ep:
        for k, v in {"CXR_AUDIT_LLM_MODEL": "rule-chat", "CXR_AUDIT_LLM_BASE_URL": ep.base_url,
                     "CXR_AUDIT_LLM_CACHE": str(tmp_path / "calls.sqlite"), "CXR_AUDIT_SUBSET": "3", "CXR_AUDIT_DEMO_PATIENTS": "4",
                     "CXR_AUDIT_REPS": "50", "CXR_AUDIT_OUT": str(out)}.items():
            monkeypatch.setenv(k, v)
        skip = get_config(path=ROOT).get("tst_flags", "").split()
        ok, _ = run_nb(PAPER_003, skip_flags=skip, showerr=True)
        assert ok, "003_longitudinal.ipynb failed on its LLM path (the traceback is printed above)"
        assert ep.n_requests > 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["params"]["annotator"] == "llm:rule-chat" and manifest["params"]["annotators"]["generations"] == "llm:rule-chat"
    calls = pd.read_parquet(out / "llm_calls.parquet")
    assert set(calls.reports) == {"generations"}   # the references came from the L-MIMIC annotation, made before
    assert (calls.status == "ok").all() and set(calls.step) == {"longitudinal", "keyword", "progression"}
    gen = pd.read_parquet(out / "generated_sentences.parquet")
    assert set(gen.annotator) == {"llm:rule-chat"} and gen.is_longitudinal.any() and gen.progression.notna().any()


def test_paper_003_llm_path_with_the_real_llama_server(llama_server, monkeypatch, tmp_path):
    # the page's LLM path against a real model (SmolLM2-135M on llama.cpp), on one gold report and two synthetic patients.
    # Plumbing and honesty, not quality: such a small model rarely answers in the asked format, so the page may find nothing
    # longitudinal; then each evaluation section must say so (and the run still succeed), never stop or show made-up numbers.
    cache = tmp_path / "calls.sqlite"
    out = tmp_path / "page"
    for k, v in {"CXR_AUDIT_LLM_MODEL": "smollm2", "CXR_AUDIT_LLM_BASE_URL": llama_server.base_url, "CXR_AUDIT_LLM_CACHE": str(cache),
                 "CXR_AUDIT_SUBSET": "1", "CXR_AUDIT_DEMO_PATIENTS": "2", "CXR_AUDIT_REPS": "20", "CXR_AUDIT_OUT": str(out)}.items():
        monkeypatch.setenv(k, v)
    skip = get_config(path=ROOT).get("tst_flags", "").split()
    ok, _ = run_nb(PAPER_003, skip_flags=skip, showerr=True)
    assert ok, "003_longitudinal.ipynb failed with the llama.cpp server as annotator (the traceback is printed above)"
    page = json.loads((out / "page.json").read_text())
    assert page["annotator"] == "llm:smollm2" and page["gold_sentences"] > 0
    with sqlite3.connect(cache) as db:   # the answers came from the real server: the cache holds them under the model's name
        n, models = db.execute("select count(*), group_concat(distinct model) from chat_cache").fetchone()
    assert n > 0 and models == "smollm2"
    assert page["evaluated"] == (page["lmimic_longitudinal_sentences"] > 0)
    assert page["evaluated"] == (out / "manifest.json").is_file()
