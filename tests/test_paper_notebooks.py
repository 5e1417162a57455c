"""The paper notebooks on real inputs: with CXR_AUDIT_IU pointing at a real IU X-ray file, paper 004's notebook runs end
to end;
with an OpenAI-compatible HTTP server as its annotator (the suite's real llama.cpp server, and an in-process server
answering by rules), paper 003's notebook runs its LLM path end to end."""
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
    # plumbing and labelling, not quality: the page's LLM path (OpenAIChat -> an OpenAI-compatible HTTP server,
    # PAPER_003's
    # prompts, the few-shot grid, the sampling runs) on a few demo reports. The server is the module's in-process
    # endpoint
    # answering by rules (`rule_chat`), so that every evaluation section has longitudinal content to score
    # (SmolLM2-135M, in the test below, marks none: the page then says so instead of showing numbers).
    assert PAPER_003.is_file()
    out = tmp_path / "ev"
    with LocalEndpoint(rule_chat()) as ep:
        for k, v in {"CXR_AUDIT_LLM_MODEL": "rule-chat", "CXR_AUDIT_LLM_BASE_URL": ep.base_url,
                     "CXR_AUDIT_LLM_CACHE": str(tmp_path / "calls.sqlite"), "CXR_AUDIT_SUBSET": "3",
                     "CXR_AUDIT_DEMO_PATIENTS": "4", "CXR_AUDIT_REPS": "50", "CXR_AUDIT_OUT": str(out)}.items():
            monkeypatch.setenv(k, v)
        skip = get_config(path=ROOT).get("tst_flags", "").split()
        ok, _ = run_nb(PAPER_003, skip_flags=skip, showerr=True)
        assert ok, "003_longitudinal.ipynb failed on its LLM path (the traceback is printed above)"
        assert ep.n_requests > 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["params"]["annotator"] == "llm:rule-chat"
            and manifest["params"]["annotators"]["generations"] == "llm:rule-chat")
    calls = pd.read_parquet(out / "llm_calls.parquet")
    assert set(calls.reports) == {"generations"}   # the references came from the L-MIMIC annotation, made before
    assert (calls.status == "ok").all() and set(calls.step) == {"longitudinal", "keyword", "progression"}
    gen = pd.read_parquet(out / "generated_sentences.parquet")
    assert set(gen.annotator) == {"llm:rule-chat"} and gen.is_longitudinal.any() and gen.progression.notna().any()
    # the page's full Table 4 grid (10 settings, 3 panels) and the annotator's default re-asks run here, over HTTP; the
    # llama.cpp test below trims both (CXR_AUDIT_GRID, CXR_AUDIT_INVALID_RETRIES) and relies on this test for them
    page = json.loads((out / "page.json").read_text())
    assert page["table4_settings"] == 10 and page["invalid_retries"] == 2


def test_paper_003_llm_path_with_the_real_llama_server(llama_server, monkeypatch, tmp_path):
    # the page's LLM path against a real model (SmolLM2-135M on llama.cpp), on one gold report and two synthetic
    # patients.
    # Plumbing and honesty, not quality: such a small model rarely answers in the asked format, so the page may find
    # nothing
    # longitudinal; then each evaluation section must say so (and the run still succeed), never stop or show made-up
    # numbers.
    # Trimmed to cut the calls from 210 to about 50: one setting per Table 4 panel (both scopes: A-B end to end, C
    # isolated) and no
    # re-ask of an unparsed answer. The full grid runs in the over-HTTP test above; re-asks against this same server in
    # tests/test_longitudinal.py::test_llm_annotator_against_real_server (and by rules in nbs/10_longitudinal.ipynb).
    cache = tmp_path / "calls.sqlite"
    out = tmp_path / "page"
    for k, v in {"CXR_AUDIT_LLM_MODEL": "smollm2", "CXR_AUDIT_LLM_BASE_URL": llama_server.base_url,
                 "CXR_AUDIT_LLM_CACHE": str(cache), "CXR_AUDIT_SUBSET": "1", "CXR_AUDIT_DEMO_PATIENTS": "2",
                 "CXR_AUDIT_REPS": "20", "CXR_AUDIT_OUT": str(out),
                 "CXR_AUDIT_GRID": "1", "CXR_AUDIT_INVALID_RETRIES": "0"}.items():
        monkeypatch.setenv(k, v)
    skip = get_config(path=ROOT).get("tst_flags", "").split()
    asked = lambda: llama_server.log_path.read_text(errors="replace").count("POST /v1/chat/completions")
    before = asked()
    ok, _ = run_nb(PAPER_003, skip_flags=skip, showerr=True)
    assert ok, "003_longitudinal.ipynb failed with the llama.cpp server as annotator (the traceback is printed above)"
    sent = asked() - before   # the server's own access log
    page = json.loads((out / "page.json").read_text())
    assert page["annotator"] == "llm:smollm2" and page["gold_sentences"] > 0
    assert page["table4_settings"] == 3 and page["invalid_retries"] == 0     # the knobs reached the page
    # the answers came from the real server: the cache holds its readable ones under its name
    with sqlite3.connect(cache) as db:
        n, models = db.execute("select count(*), group_concat(distinct model) from chat_cache").fetchone()
    assert sent > 0 and n <= sent and models in (None, "smollm2")   # an unreadable reply is not cached
    assert page["evaluated"] == (page["lmimic_longitudinal_sentences"] > 0)
    assert page["evaluated"] == (out / "manifest.json").is_file()


PAPER_000 = ROOT / "nbs" / "papers" / "000_reref.ipynb"


def test_paper_000_runs_on_a_real_iu_file(monkeypatch, tmp_path):
    # 50 real IU X-ray studies (ReXrank JSON; its split is 'val', so the page uses the whole file and says so),
    # SIMULATED generators writing one report per study, the rule back end: only the paths change
    out = tmp_path / "page"
    for k, v in {"CXR_AUDIT_IU": str(IU_REAL), "CXR_AUDIT_REPS": "400", "CXR_AUDIT_OUT": str(out),
                 "CXR_AUDIT_COMPOUNDS": "findings_scope:minimal+anatomical_granularity:low"}.items():
        monkeypatch.setenv(k, v)
    skip = get_config(path=ROOT).get("tst_flags", "").split()
    ok, _ = run_nb(PAPER_000, skip_flags=skip, showerr=True)
    assert ok, "000_reref.ipynb failed on the real IU file (the traceback is printed above)"
    page = json.loads((out / "page.json").read_text())
    assert page["backend"] == "rules" and page["studies"] == 50 and page["source"].startswith("your files: IU X-ray")
    assert len(page["variations"]) == 12 and page["any_usable"] and set(page["usable"]) == set(page["variations"])
    assert all(page["usable"][v] == 0 for v in page["not_applicable"])
    shifts = pd.read_csv(out / "shifts.csv")
    assert set(shifts.dataset) == {"IU X-ray"} and set(shifts.backend) == {"rules"}
    na = shifts[shifts.variant.isin(page["not_applicable"])]
    assert na.normalized_shift.isna().all()                       # not applicable: no number, never a zero shift


def test_paper_000_llm_path_with_the_real_llama_server(llama_server, monkeypatch, tmp_path):
    # the page's LLM path against a real model (SmolLM2-135M on llama.cpp as Generator and Verifier) on one synthetic
    # study,
    # two variations and one compound, one round and a short token limit: 4 to 6 calls of about 800 prompt tokens (the
    # compound's first step is the first variation, answered from the cache). Plumbing and labelling, not quality: such
    # a
    # small model rarely writes a rewrite its own Verifier accepts, so a variation may have nothing usable; the page
    # must then say so per variation (and still run), never show a zero shift or stop.
    cache = tmp_path / "calls.sqlite"
    out = tmp_path / "page"
    variations = ["negation:implicit", "findings_scope:minimal"]
    for k, v in {"CXR_AUDIT_LLM_MODEL": "smollm2", "CXR_AUDIT_LLM_BASE_URL": llama_server.base_url,
                 "CXR_AUDIT_LLM_CACHE": str(cache), "CXR_AUDIT_SUBSET": "1", "CXR_AUDIT_DEMO_PATIENTS": "1",
                 "CXR_AUDIT_VARIATIONS": ",".join(variations),
                 "CXR_AUDIT_COMPOUNDS": "negation:implicit+findings_scope:minimal", "CXR_AUDIT_MAX_ROUNDS": "1",
                 "CXR_AUDIT_MAX_TOKENS": "120", "CXR_AUDIT_REPS": "50", "CXR_AUDIT_OUT": str(out)}.items():
        monkeypatch.setenv(k, v)
    skip = get_config(path=ROOT).get("tst_flags", "").split()
    ok, _ = run_nb(PAPER_000, skip_flags=skip, showerr=True)
    assert ok, "000_reref.ipynb failed with the llama.cpp server as ReRef back end (the traceback is printed above)"
    page = json.loads((out / "page.json").read_text())
    assert page["backend"] == "llm:smollm2" and page["studies"] == 1 and page["variations"] == variations
    assert "up to 120 tokens" in page["settings"] and "up to 1 rounds" in page["settings"]
    assert set(page["usable"]) == set(variations) and all(n in (0, 1) for n in page["usable"].values())
    assert page["any_usable"] == (sum(page["usable"].values()) > 0)
    assert set(page["not_applicable"]) == {v for v, n in page["usable"].items() if n == 0}
    # the answers came from the real server, under the model's name and the page's token limit
    with sqlite3.connect(cache) as db:
        n, models, longest = db.execute("select count(*), group_concat(distinct model), max(completion_tokens) from "
                                        "chat_cache").fetchone()
    assert n > 0 and models == "smollm2" and longest <= 120
    refs = pd.read_parquet(out / "references.parquet")
    assert set(refs.backend) == {"llm:smollm2"} and set(refs.variant) == {"original", *variations}
    shifts = pd.read_csv(out / "shifts.csv")
    assert shifts[shifts.variant.isin(page["not_applicable"])].normalized_shift.isna().all()


def test_paper_004_keeps_a_given_split_whole_and_runs_with_one_direction(monkeypatch, tmp_path):
    """The IU file kept whole as the test split (CXR_AUDIT_IU_SPLIT=given), and a generations table with the MIMIC->IU
    direction only: the page skips the other direction with a note instead of stopping ("no rows to audit")."""
    from cxr_audit.corpus import load_rexrank
    from cxr_audit.generate import SimulatedGenerator, generate_table
    from cxr_audit.papers import PAPER_004 as PRESET_004
    table = PRESET_004.cohort("MIMIC->IU", load_rexrank(IU_REAL, "iu-xray"), split="given").studies
    assert len(table) == 50
    run = lambda system, name, pols: generate_table(SimulatedGenerator(system, table), table, pols, system=name,
                                                    progress=False)
    gens = pd.concat([run("sim-template", "ON", ["B4", "G1", "K50"]), run("sim-omit", "OFF", ["B4"]),
                      run("sim-verbose", "second-model", ["G1"])], ignore_index=True).assign(direction="MIMIC->IU")
    gens.to_parquet(tmp_path / "gens.parquet")
    for k, v in {"CXR_AUDIT_IU": str(IU_REAL), "CXR_AUDIT_IU_SPLIT": "given",
                 "CXR_AUDIT_GENERATIONS": str(tmp_path / "gens.parquet"), "CXR_AUDIT_REPS": "100"}.items():
        monkeypatch.setenv(k, v)
    skip = get_config(path=ROOT).get("tst_flags", "").split()
    ok, _ = run_nb(PAPER_004, skip_flags=skip, showerr=True)
    assert ok, "004_crossdomain.ipynb failed with one direction of generations (the traceback is printed above)"
