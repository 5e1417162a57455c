"""The `cxr-audit` command, run as a real subprocess (the installed console script)."""
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from cxr_audit.cli import main as cli_main
from cxr_audit.llm import ChatCache, RuleChat, run_batch
from cxr_audit.llm_batch import BatchCollector

ROOT = Path(__file__).resolve().parents[1]


def cli(*args, cwd=None):
    exe = shutil.which("cxr-audit", path=str(Path(sys.executable).parent)) or shutil.which("cxr-audit")
    assert exe, "the cxr-audit console script is not installed (pip install -e .)"
    return subprocess.run([exe, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=600)


# The tables of `cxr-audit demo` in a second process: the real command (`cli.main`: its options, `run_demo`, the tables
# and
# the manifest) with the audit replaced by a stand-in page. `run_demo` writes the tables before the audit starts, and
# only the tables of this run are compared: the full demo, audit included, is the first run of `demo_runs`.
DEMO_TABLES_ONLY = """
import sys
from pathlib import Path
import cxr_audit.audit as audit
from cxr_audit.cli import main
def stand_in(studies, generations, out, **kw):
    page = Path(out) / "report.html"; page.write_text("stand-in: the audit is not run here"); return page
audit.run_audit = stand_in
sys.exit(main(["demo", *sys.argv[1:]]))
"""


@pytest.fixture(scope="module")
def demo_runs(tmp_path_factory):
    a, b = tmp_path_factory.mktemp("demo_a"), tmp_path_factory.mktemp("demo_b")
    ra = cli("demo", "--out", a, "--n-patients", 20, "--seed", 7)
    rb = subprocess.run([sys.executable, "-c", DEMO_TABLES_ONLY, "--out", str(b), "--n-patients", "20", "--seed", "7"],
                        capture_output=True, text=True, timeout=600)
    return a, b, ra, rb


def test_help_lists_subcommands():
    r = cli("--help")
    assert r.returncode == 0
    for sub in ("demo", "audit", "validate", "load", "cohort", "concentration", "labels", "trace", "review", "score",
                "reref", "longitudinal", "generate", "llm-cache"):
        assert sub in r.stdout


def subparsers(parser):
    "name -> subparser of every (nested) subcommand."
    out = {}
    for action in parser._actions:
        if action.__class__.__name__ == "_SubParsersAction":
            for name, sub in action.choices.items():
                out[name] = sub
                out.update({f"{name} {k}": v for k, v in subparsers(sub).items()})
    return out


def test_every_option_has_help_text_and_one_default():
    from cxr_audit.cli import build_parser
    subs = subparsers(build_parser())
    assert {"demo", "audit", "score", "review prepare", "review analyse"} <= set(subs)
    for name, sub in subs.items():
        actions = [a for a in sub._actions if a.dest != "help" and a.__class__.__name__ != "_SubParsersAction"]
        assert all(a.help for a in actions), (name, [a.dest for a in actions if not a.help])
        assert len({a.dest for a in actions}) == len(actions), name                   # one option per parameter


def test_subcommand_help_runs_as_a_process():
    r = cli("review", "prepare", "--help")
    assert r.returncode == 0 and "--n-cases" in r.stdout and "random cases per stratum" in r.stdout


def test_demo_writes_all_files(demo_runs):
    a, _, ra, _ = demo_runs
    assert ra.returncode == 0, ra.stderr
    assert str(a / "report.html") in ra.stdout
    for name in ("studies.parquet", "generations.parquet", "findings.parquet", "progression.parquet",
                 "manifest.json", "report.html"):
        assert (a / name).is_file(), name
    studies = pd.read_parquet(a / "studies.parquet")
    assert studies["dataset"].str.startswith("synthetic").all()


def test_report_is_self_contained(demo_runs):
    page = (demo_runs[0] / "report.html").read_text(encoding="utf-8")
    assert "<svg" in page and "Corpus overview" in page and "Synthetic data" in page
    assert not re.search(r"<script[^>]*\bsrc\s*=\s*[\"']?https?://", page, re.I)
    assert not re.search(r"<link[^>]*\bhref\s*=\s*[\"']?https?://", page, re.I)
    assert not re.search(r"@import\s+url\(\s*[\"']?https?://", page, re.I)


def test_same_seed_gives_identical_parquet(demo_runs):
    a, b, _, rb = demo_runs
    assert rb.returncode == 0 and "stand-in" in (b / "report.html").read_text(), rb.stderr
    files = sorted(p.name for p in a.glob("*.parquet"))
    assert len(files) == 4
    for name in files:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_other_seed_differs(demo_runs, tmp_path):
    assert cli("demo", "--out", tmp_path, "--n-patients", 20, "--seed", 8).returncode == 0
    assert (tmp_path / "studies.parquet").read_bytes() != (demo_runs[0] / "studies.parquet").read_bytes()


def test_audit_on_csv_inputs(demo_runs, tmp_path):
    a = demo_runs[0]
    studies = pd.read_parquet(a / "studies.parquet")
    studies["image_paths"] = studies["image_paths"].map(";".join)
    studies.to_csv(tmp_path / "studies.csv", index=False)
    pd.read_parquet(a / "generations.parquet").to_csv(tmp_path / "generations.csv", index=False)
    r = cli("audit", "--studies", tmp_path / "studies.csv", "--generations", tmp_path / "generations.csv",
            "--out", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    assert "Corpus overview" in (tmp_path / "out" / "report.html").read_text(encoding="utf-8")


def test_check_studies_samples_the_verdicts_rewriting_checks(demo_runs, tmp_path):
    a = demo_runs[0]
    r = cli("audit", "--studies", a / "studies.parquet", "--generations", a / "generations.parquet", "--out",
            tmp_path / "out", "--stages", "verdict", "--check-studies", 12)
    assert r.returncode == 0, r.stderr
    n = pd.read_parquet(a / "generations.parquet").study_id.nunique()
    assert re.search(rf"a sample of \d+ of {n} studies", (tmp_path / "out" / "report.html").read_text(encoding="utf-8"))
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["params"]["check_studies"] == 12
    bad = cli("audit", "--studies", a / "studies.parquet", "--generations", a / "generations.parquet", "--out",
              tmp_path / "bad", "--stages", "verdict", "--check-studies", -1)
    assert bad.returncode == 2 and "--check-studies must be >= 0" in bad.stderr
    assert not (tmp_path / "bad" / "report.html").exists()


def test_missing_file_is_one_clear_line(tmp_path):
    r = cli("audit", "--studies", tmp_path / "nope.csv", "--generations", tmp_path / "g.csv", "--out", tmp_path)
    assert r.returncode == 2
    assert "nope.csv: file not found" in r.stderr
    assert "Traceback" not in r.stderr and r.stderr.strip().count("\n") == 0


def test_missing_column_is_one_clear_line(demo_runs, tmp_path):
    gens = pd.read_parquet(demo_runs[0] / "generations.parquet")
    gens.drop(columns="hypothesis").to_csv(tmp_path / "g.csv", index=False)
    r = cli("audit", "--studies", demo_runs[0] / "studies.parquet", "--generations", tmp_path / "g.csv", "--out",
            tmp_path)
    assert r.returncode == 2
    assert "g.csv: missing column(s) 'hypothesis'" in r.stderr
    assert "Traceback" not in r.stderr and r.stderr.strip().count("\n") == 0


def test_validate(demo_runs):
    r = cli("validate", "--studies", demo_runs[0] / "studies.parquet", "--generations",
            demo_runs[0] / "generations.parquet")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("ok")


def test_load_real_iu_file_then_validate_and_build_a_cohort(tmp_path):
    """Real IU X-ray reports (ReXrank JSON): every study loads, the 22 view/image mismatches are flagged, the table is
    usable."""
    src = ROOT / "tests" / "fixtures" / "iu_real" / "iu_valid_rexrank_sample.json"
    r = cli("load", src, "--out", tmp_path / "iu.parquet")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("50 studies loaded; 22 flagged"), r.stdout
    assert "view_mismatch" in r.stdout
    v = cli("validate", "--studies", tmp_path / "iu.parquet")
    assert v.returncode == 0 and "22 flagged" in v.stdout, v.stderr
    c = cli("cohort", "--recipe", "004_iu", "--studies", tmp_path / "iu.parquet", "--out", tmp_path / "cohort")
    assert c.returncode == 0, c.stderr


def test_load_refuses_an_unreadable_file_in_one_line(tmp_path):
    (tmp_path / "bad.json").write_text('{"CXR1_IM-0001": {"image_path": ["a.png"], ')
    r = cli("load", tmp_path / "bad.json", "--out", tmp_path / "s.parquet")
    assert r.returncode == 2 and "bad.json" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "s.parquet").exists()


def test_cohort_subcommand(demo_runs, tmp_path):
    r = cli("cohort", "--recipe", "003_lmimic", "--studies", demo_runs[0] / "studies.parquet", "--out", tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("cohort 003_lmimic")
    for name in ("cohort.parquet", "flow.csv", "excluded.parquet", "manifest.json"):
        assert (tmp_path / name).is_file(), name
    flow = pd.read_csv(tmp_path / "flow.csv")
    assert (flow["n_in"] - flow["n_out"] == flow["n_excluded"]).all()
    kept, gone = pd.read_parquet(tmp_path / "cohort.parquet"), pd.read_parquet(tmp_path / "excluded.parquet")
    assert len(kept) + len(gone) == len(pd.read_parquet(demo_runs[0] / "studies.parquet"))


def test_cohort_unknown_recipe_is_refused(demo_runs, tmp_path):
    r = cli("cohort", "--recipe", "nope", "--studies", demo_runs[0] / "studies.parquet", "--out", tmp_path)
    assert r.returncode == 2 and "unknown recipe 'nope'" in r.stderr and "Traceback" not in r.stderr


def test_review_prepare_and_analyse(demo_runs, tmp_path):
    a = demo_runs[0]
    r = cli("review", "prepare", "--studies", a / "studies.parquet", "--generations", a / "generations.parquet",
            "--out", tmp_path / "rev", "--n-cases", 3, "--strata", "dataset", "--simulate")
    assert r.returncode == 0, r.stderr
    key = tmp_path / "rev" / "key" / "review_key.csv"
    assert key.is_file() and not any((tmp_path / "rev" / "phase1").rglob("*key*"))   # the key is kept apart
    sims = sorted((tmp_path / "rev" / "simulated").glob("*.csv"))
    r = cli("review", "analyse", "--key", key, "--ratings", *sims, "--out", tmp_path / "res")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "res" / "agreement.csv").is_file()
    # an unfilled sheet is refused with the sheet, row and column named
    blank = tmp_path / "rev" / "phase1" / "R1" / "R1_phase1.csv"
    r = cli("review", "analyse", "--key", key, "--ratings", blank, "--out", tmp_path / "bad")
    assert (r.returncode == 2 and "R1_phase1.csv row 2, column major_omission" in r.stderr
            and "Traceback" not in r.stderr)


def test_labels_and_trace_subcommands(demo_runs, tmp_path):
    a = demo_runs[0]
    r = cli("labels", "--references", a / "studies.parquet", "--predictions", a / "generations.parquet",
            "--out", tmp_path / "lab", "--reps", 50)
    assert r.returncode == 0, r.stderr
    assert any((tmp_path / "lab").iterdir())
    fx = ROOT / "tests" / "fixtures" / "labels"
    r = cli("trace", "--chexpert-csv", fx / "chexpert_labeled.csv", "--texts", fx / "chexpert_texts.csv", "--out",
            tmp_path / "tr")
    assert r.returncode == 0, r.stderr
    assert "Cardiomegaly" in r.stdout


def test_concentration_subcommand(demo_runs, tmp_path):
    r = cli("concentration", demo_runs[0] / "generations.parquet", "--by", "system", "policy", "--out", tmp_path,
            "--reps", 200)
    assert r.returncode == 0, r.stderr
    assert any(tmp_path.iterdir())
    r = cli("concentration", demo_runs[0] / "generations.parquet", "--by", "nope", "--out", tmp_path / "x", "--reps",
            50)
    assert r.returncode == 2 and "nope" in r.stderr and "Traceback" not in r.stderr


def test_score_subcommand(demo_runs, tmp_path):
    a = demo_runs[0]
    r = cli("score", a / "generations.parquet", "--studies", a / "studies.parquet", "--metrics", "bleu_4", "rouge_l",
            "chexpert_f1_5", "--reps", 100, "--by", "system", "policy", "--baseline", "sim-verbose+B4", "--out",
            tmp_path / "sc")
    assert r.returncode == 0, r.stderr
    systems = pd.read_csv(tmp_path / "sc" / "systems.csv")
    # too few resamples: said, not hidden
    assert "with 100 resamples and" in r.stdout and "none can be significant" in r.stdout
    assert set(systems["metric"]) == {"bleu_4", "rouge_l", "chexpert_f1_5"}
    assert (systems["ci_low"] <= systems["estimate"]).all() and (systems["estimate"] <= systems["ci_high"]).all()
    comps = pd.read_csv(tmp_path / "sc" / "comparisons.csv")
    assert len(comps) and comps["p_holm"].between(0, 1).all()
    assert (comps["significant"] == (comps["p_holm"] < 0.05)).all()
    assert f"{int(comps.significant.sum())} of {len(comps)} comparisons significant after Holm" in r.stdout
    r = cli("score", a / "generations.parquet", "--studies", a / "studies.parquet", "--metrics", "bleu_9", "--out",
            tmp_path / "x")
    assert r.returncode == 2 and "bleu_9" in r.stderr and "Traceback" not in r.stderr


def test_reref_subcommand(demo_runs, tmp_path):
    a = demo_runs[0]
    r = cli("reref", "--studies", a / "studies.parquet", "--variations", "negation:implicit,structure:structured",
            "--generations", a / "generations.parquet", "--metrics", "bleu_4", "--reps", 50, "--out", tmp_path / "rr")
    assert r.returncode == 0, r.stderr
    refs = pd.read_parquet(tmp_path / "rr" / "references.parquet")
    assert {"original", "negation:implicit", "structure:structured"} <= set(refs["variant"])
    assert (tmp_path / "rr" / "shifts.csv").is_file()
    r = cli("reref", "--studies", a / "studies.parquet", "--variations", "structure:wobbly", "--out", tmp_path / "x")
    assert r.returncode == 2 and "wobbly" in r.stderr and "Traceback" not in r.stderr


def test_longitudinal_subcommand(demo_runs, tmp_path):
    a = demo_runs[0]
    r = cli("longitudinal", "--studies", a / "studies.parquet", "--generations", a / "generations.parquet",
            "--metrics", "bleu_4", "rouge_l", "--reps", 50, "--out", tmp_path / "lg")
    assert r.returncode == 0, r.stderr
    assert any(p.suffix in (".csv", ".parquet") for p in (tmp_path / "lg").iterdir())
    r = cli("longitudinal", "--studies", a / "studies.parquet", "--generations", a / "nope.parquet", "--out",
            tmp_path / "x")
    assert r.returncode == 2 and "nope.parquet" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("args", [["--help"], ["score", "--help"],
                                  ["validate", "--studies",
                                   ROOT / "tests/fixtures/iu_real/iu_valid_rexrank_sample.json"]])
def test_output_to_a_closed_pipe_exits_quietly(args, tmp_path):
    # `cxr-audit ... | head -1`: the reader closes before the command writes; a Unix tool stops quietly (141 = 128 +
    # SIGPIPE). Before: "BrokenPipeError: [Errno 32] Broken pipe" and a traceback on stderr, exit 1
    exe = shutil.which("cxr-audit", path=str(Path(sys.executable).parent)) or shutil.which("cxr-audit")
    if args[0] == "validate":    # a real table with several output lines
        studies = tmp_path / "s.csv"
        from cxr_audit.corpus import load_rexrank
        load_rexrank(args[-1], "iu-xray").drop(columns=["image_paths", "image_views", "load_flags"],
                                               errors="ignore").to_csv(studies, index=False)
        args = [*args[:-1], studies]
    p = subprocess.Popen([exe, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()                      # the reader is gone before the command has started writing
    err = p.stderr.read().decode(); p.wait(timeout=300)
    assert "Traceback" not in err and "BrokenPipeError" not in err and "Exception ignored" not in err, err
    assert err == "", err
    # argparse's help already ignores a closed pipe
    assert p.returncode == (0 if "--help" in args else 141), p.returncode



def _recorded(tmp_path, n=3):
    cache = ChatCache(tmp_path / "c.sqlite")
    rule = RuleChat(lambda m, s: "<1>" if "stable" in m[-1]["content"] else "<0>", name="toy")
    reqs = [{"request_id": i, "messages": f"{i}: stable" if i % 2 else f"{i}: new"} for i in range(n)]
    assert run_batch(reqs, BatchCollector(rule, cache), cache=cache, progress=False).n_pending == n
    cache.close()
    return tmp_path / "c.sqlite", reqs


def test_llm_batch_export_import_status(tmp_path, capsys):
    path, reqs = _recorded(tmp_path)
    assert cli_main(["llm-batch", "status", "--cache", str(path)]) == 0
    assert "3 requests recorded: 0 answered, 0 failed, 0 waiting for results, 3 to export" in capsys.readouterr().out
    assert cli_main(["llm-batch", "export", "--cache", str(path), "--out", str(tmp_path / "b"), "--max-lines",
                     "2"]) == 0
    assert "3 requests in 2 file(s)" in capsys.readouterr().out
    lines = [json.loads(x) for f in sorted((tmp_path / "b").glob("*.jsonl")) for x in f.read_text().splitlines()]
    out = tmp_path / "output.jsonl"
    out.write_text("".join(json.dumps({"id": f"r{i}", "custom_id": o["custom_id"], "error": None,
                                       "response": {"status_code": 200, "body": {
        "model": "toy", "choices": [{"index": 0, "message": {"role": "assistant", "content": "<1>" if i else ""},
                                     "finish_reason": "stop"}]}}}) + "\n"
        for i, o in enumerate(lines)))
    assert cli_main(["llm-batch", "import", "--cache", str(path), "--results", str(out)]) == 0
    assert "3 lines: 2 answers, 1 failed, 0 unknown; 3 newly stored" in capsys.readouterr().out
    assert cli_main(["llm-batch", "import", "--cache", str(path), "--results", str(out)]) == 0     # idempotent
    assert "0 newly stored" in capsys.readouterr().out
    assert cli_main(["llm-batch", "status", "--cache", str(path)]) == 0
    assert "3 requests recorded: 2 answered, 1 failed, 0 waiting for results, 0 to export" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["llm-batch", "status", "--cache", "{tmp}/missing.sqlite"], "no cache file"),
    (["llm-batch", "export", "--cache", "{tmp}/not.sqlite", "--out", "{tmp}/o"], "is not an SQLite cache file"),
    (["llm-batch", "import", "--cache", "{tmp}/c.sqlite", "--results", "{tmp}/nothing.jsonl"], "no such file"),
    (["llm-batch", "import", "--cache", "{tmp}/c.sqlite", "--results", "{tmp}/foreign.jsonl"],
     "none of the 1 result lines was recorded"),
    (["llm-batch", "import", "--cache", "{tmp}/c.sqlite", "--results", "{tmp}/broken.jsonl"],
     "broken.jsonl: line 1: not JSON"),
])
def test_llm_batch_user_errors_exit_2(tmp_path, capsys, argv, message):
    _recorded(tmp_path)
    (tmp_path / "not.sqlite").write_text("hello")
    (tmp_path / "foreign.jsonl").write_text(json.dumps({"custom_id": "0" * 64,
                                                        "response": {"status_code": 200, "body": {}}}) + "\n")
    (tmp_path / "broken.jsonl").write_text("{oops\n")
    assert cli_main([a.format(tmp=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cxr-audit llm-batch ") and message in err
    assert (tmp_path / "not.sqlite").read_text() == "hello"


def test_reref_batch_records_requests_and_llm_batch_exports_them(tmp_path, capsys):
    """`reref --batch` makes no call (nothing listens at the URL): it records round 1's requests, which `llm-batch
    export` writes."""
    studies = tmp_path / "s.csv"
    pd.DataFrame({"study_id": ["a", "b"], "findings": ["The lungs are clear. No effusion.", "Heart size is normal."],
                  "impression": ["No acute disease.", "Normal."]}).to_csv(studies, index=False)
    argv = ["reref", "--studies", str(studies), "--out", str(tmp_path / "r"), "--variations", "negation:implicit",
            "--backend", "openai", "--model", "m", "--base-url", "http://127.0.0.1:9/v1", "--cache",
            str(tmp_path / "c.sqlite"), "--batch"]
    assert cli_main(argv) == 0
    assert "2 reference(s) wait for batch results (round 1 generate: 2)" in capsys.readouterr().out
    assert cli_main(argv) == 0                                   # a second pass records nothing new
    capsys.readouterr()
    assert cli_main(["llm-batch", "status", "--cache", str(tmp_path / "c.sqlite")]) == 0
    assert "2 requests recorded: 0 answered, 0 failed, 0 waiting for results, 2 to export" in capsys.readouterr().out
    assert cli_main(["llm-batch", "export", "--cache", str(tmp_path / "c.sqlite"), "--out", str(tmp_path / "b")]) == 0
    lines = [json.loads(x) for f in (tmp_path / "b").glob("*.jsonl") for x in f.read_text().splitlines()]
    assert len(lines) == 2 and {x["body"]["model"] for x in lines} == {"m"}
    no_cache = [a for a in argv if a not in ("--cache", str(tmp_path / "c.sqlite"))]
    assert cli_main(no_cache) == 2                               # no --cache: refused
    assert "--batch needs --backend openai and --cache FILE" in capsys.readouterr().err


def test_longitudinal_batch_records_every_sentence_then_reads_the_imported_answers(tmp_path, capsys):
    """`longitudinal --batch`: nothing is sent (nothing listens at the URL); step 1 is recorded for every distinct
    sentence of the
    references and generations; after the provider's answers are imported the command finds every answer in the
    cache."""
    studies, gens, cache = tmp_path / "s.csv", tmp_path / "g.csv", tmp_path / "c.sqlite"
    pd.DataFrame({"study_id": ["a", "b"], "findings": ["Stable cardiomegaly. No effusion.",
                                                       "The effusion has grown."]}).to_csv(studies, index=False)
    pd.DataFrame({"study_id": ["a", "b"], "system": ["m1", "m1"],
                  "hypothesis": ["No effusion.", "New opacity."]}).to_csv(gens, index=False)
    argv = ["longitudinal", "--studies", str(studies), "--generations", str(gens), "--out", str(tmp_path / "o"),
            "--annotator", "openai", "--model", "m", "--base-url", "http://127.0.0.1:9/v1", "--cache", str(cache),
            "--batch"]
    assert cli_main(argv) == 0
    assert "longitudinal: 4 LLM request(s) for 4 distinct sentences wait for batch results" in capsys.readouterr().out
    assert cli_main(["llm-batch", "export", "--cache", str(cache), "--out", str(tmp_path / "b")]) == 0
    capsys.readouterr()
    sent = [json.loads(x) for f in (tmp_path / "b").glob("*.jsonl") for x in f.read_text().splitlines()]
    assert len(sent) == 4 and all(x["url"] == "/v1/chat/completions" and x["body"]["model"] == "m" for x in sent)
    out = tmp_path / "output.jsonl"    # a test stand-in for the provider: "not longitudinal" for every sentence
    out.write_text("".join(json.dumps({"id": f"r{i}", "custom_id": x["custom_id"], "error": None,
                                       "response": {"status_code": 200, "body": {
        "model": "m", "choices": [{"index": 0, "message": {"role": "assistant", "content": "<0>"},
                                   "finish_reason": "stop"}]}}}) + "\n"
        for i, x in enumerate(sent)))
    assert cli_main(["llm-batch", "import", "--cache", str(cache), "--results", str(out)]) == 0
    assert "4 answers, 0 failed" in capsys.readouterr().out
    assert cli_main(argv) == 0
    assert "every LLM answer is in the cache" in capsys.readouterr().out
    assert cli_main([a for a in argv if a not in ("--cache", str(cache))]) == 2
    assert "--batch needs --annotator openai and --cache FILE" in capsys.readouterr().err


OFFICIAL = ROOT / "tests" / "fixtures" / "labels" / "chexpert_official_sample.csv"


def _micro_f1(ref: pd.DataFrame, hyp: pd.DataFrame) -> float:
    "Micro-F1 over the 14 labels, only raw state 1 positive, computed by hand from two wide state tables."
    r, h = (ref == 1).to_numpy(), (hyp == 1).to_numpy()
    tp, fp, fn = (r & h).sum(), (~r & h).sum(), (r & ~h).sum()
    return 2 * tp / (2 * tp + fp + fn)


def test_official_labels_score_end_to_end(tmp_path):
    """`--labeler PATH`: the official labeler's own output (its shipped sample) scores references and generations by
    text."""
    off = pd.read_csv(OFFICIAL)
    texts, states = off["Reports"].tolist(), off.drop(columns="Reports")
    n = len(texts)
    gens = pd.DataFrame({"sample_id": [f"{s}{i}" for s in "ab" for i in range(n)],
                         "study_id": [f"s{i}" for i in range(n)] * 2, "system": ["own"] * n + ["template"] * n,
                         "policy": "greedy",
                         # `own`: shifted by one study; `template`: one report
                         "hypothesis": texts[1:] + texts[:1] + [texts[0]] * n})
    studies = pd.DataFrame({"study_id": [f"s{i}" for i in range(n)], "patient_id": [f"p{i}" for i in range(n)],
                            "findings": texts, "impression": ""})
    gens.to_csv(tmp_path / "g.csv", index=False); studies.to_csv(tmp_path / "s.csv", index=False)
    r = cli("score", tmp_path / "g.csv", "--studies", tmp_path / "s.csv", "--metrics", "chexpert_f1_14", "--reps", 0,
            "--clusters", "none", "--labeler", OFFICIAL, "--out", tmp_path / "sc")
    assert r.returncode == 0, r.stderr
    assert "CheXpert labels official:chexpert_official_sample.csv" in r.stdout
    systems = pd.read_csv(tmp_path / "sc" / "systems.csv")
    # the table names its labels
    assert systems["note"].str.startswith("labeler official:chexpert_official_sample.csv").all()
    got = systems.set_index("config")["estimate"]
    shifted = states.iloc[list(range(1, n)) + [0]].reset_index(drop=True)
    assert got.filter(like="own").iloc[0] == pytest.approx(_micro_f1(states, shifted))
    assert got.filter(like="template").iloc[0] == pytest.approx(_micro_f1(states,
                                                                          states.iloc[[0] * n].reset_index(drop=True)))
    # the package's labeler reads the stable cardiomegaly as uncertain: the two labelers give different numbers, each
    # named
    r2 = cli("score", tmp_path / "g.csv", "--studies", tmp_path / "s.csv", "--metrics", "chexpert_f1_14", "--reps", 0,
             "--clusters", "none", "--out", tmp_path / "sc2")
    assert r2.returncode == 0 and "CheXpert labels cxr_audit:chexpert" in r2.stdout
    # the labels command with the same file: every label row names it
    r3 = cli("labels", "--references", tmp_path / "s.csv", "--predictions", tmp_path / "g.csv", "--reps", 20,
             "--labeler", OFFICIAL, "--out", tmp_path / "lb")
    assert r3.returncode == 0, r3.stderr
    assert "labels (official:chexpert_official_sample.csv)" in r3.stdout
    # every label-based table it wrote names the labels' source (`source` on label rows, `labeler` on scores); matching
    # is ids only
    written = {p.name: pd.read_parquet(p) if p.suffix == ".parquet" else pd.read_csv(p)
               for p in (tmp_path / "lb").iterdir() if p.suffix in (".csv", ".parquet") and p.name != "matching.csv"}
    assert {"reference_labels.parquet", "prediction_labels.parquet", "summary.csv", "per_label.csv"} <= set(written)
    for name, t in written.items():
        col = "source" if "source" in t.columns else "labeler"
        assert col in t.columns, name
        assert set(t[col]) <= {"official:chexpert_official_sample.csv"}, name


def test_official_labels_missing_text_is_one_clear_error(tmp_path):
    off = pd.read_csv(OFFICIAL)
    gens = pd.DataFrame({"sample_id": ["a", "b"], "study_id": ["s0", "s1"], "system": "x", "policy": "greedy",
                         "hypothesis": [off["Reports"][0], "New right upper lobe consolidation."],
                         "reference": off["Reports"][:2].tolist()})
    gens.to_csv(tmp_path / "g.csv", index=False)
    r = cli("score", tmp_path / "g.csv", "--metrics", "chexpert_f1_14", "--reps", 0, "--clusters", "none",
            "--labeler", OFFICIAL, "--out", tmp_path / "sc")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "1 of" in r.stderr and "are not in" in r.stderr and "New right upper lobe consolidation" in r.stderr
    assert not (tmp_path / "sc" / "systems.csv").exists()
    r = cli("score", tmp_path / "g.csv", "--metrics", "chexpert_f1_14", "--labeler", tmp_path / "nope.csv", "--out",
            tmp_path / "x")
    assert r.returncode == 2 and "no such file" in r.stderr
    r = cli("score", tmp_path / "g.csv", "--metrics", "chexpert_f1_14", "--labeler", "chexbert", "--out",
            tmp_path / "x")
    assert r.returncode == 2 and "not one of chexpert, clinical, chexpert+quirks" in r.stderr


def test_longitudinal_with_unreadable_llm_replies_reports_no_score_and_exits_1(tmp_path, capsys):
    """An OpenAI-compatible server (the in-process LocalEndpoint, over real HTTP) whose model answers in words the
    parser cannot
    read: the sentences are missing (NA), never "not longitudinal"; the rate is stated; no score; exit 1 after
    writing."""
    from cxr_audit.llm import LocalEndpoint, RuleChat
    studies, gens = tmp_path / "s.csv", tmp_path / "g.csv"
    pd.DataFrame({"study_id": ["a", "b"], "findings": ["Stable cardiomegaly. No effusion.",
                                                       "The effusion has grown."]}).to_csv(studies, index=False)
    pd.DataFrame({"study_id": ["a", "b"], "system": ["m1", "m1"],
                  "hypothesis": ["No effusion.", "New opacity."]}).to_csv(gens, index=False)
    rambling = RuleChat(lambda messages, schema, **kw: "Well, that depends on what the radiologist meant.",
                        name="rambler")
    with LocalEndpoint(rambling) as ep:
        code = cli_main(["longitudinal", "--studies", str(studies), "--generations", str(gens), "--out",
                         str(tmp_path / "o"), "--annotator", "openai", "--model", "rambler", "--base-url", ep.base_url])
    err = capsys.readouterr().err
    assert code == 1 and "incomplete" in err and "3 of 3 references sentences unreadable (100.0%)" in err
    ref = pd.read_parquet(tmp_path / "o" / "reference_sentences.parquet")
    assert ref.is_longitudinal.isna().all()                       # missing, not False
    v = pd.read_csv(tmp_path / "o" / "validity.csv").set_index("reports")
    assert v.loc["references", "invalid_rate"] == 1.0 and not v.complete.any()
    assert not (tmp_path / "o" / "summary.csv").exists()           # no score written
    assert json.loads((tmp_path / "o" / "manifest.json").read_text())["params"]["complete"] is False
    calls = pd.read_parquet(tmp_path / "o" / "llm_calls.parquet")
    assert (~calls.valid).all() and calls.text.str.startswith("Well").all()


def test_annotation_quality_leaves_unreadable_replies_out_and_marks_the_run_incomplete():
    from cxr_audit.llm import LocalEndpoint, OpenAIChat, RuleChat
    from cxr_audit.longitudinal import LLMAnnotator, RuleAnnotator
    from cxr_audit.longitudinal_eval import evaluate_annotators
    gold = pd.DataFrame({"report_id": ["r1", "r1", "r2", "r3"], "sentence": ["Stable cardiomegaly.", "No effusion.",
                                                                              "The effusion has grown.",
                                                                             "Lungs are clear."],
                         "is_longitudinal": [True, False, True, False],
                         "keyword": ["enlarged cardiac silhouette", None, "pleural effusion", None],
                         "progression": ["no change", None, "worsened", None]})
    rambling = RuleChat(lambda messages, schema, **kw: "Hard to say.", name="rambler")
    with LocalEndpoint(rambling) as ep:
        llm = LLMAnnotator(OpenAIChat("rambler", base_url=ep.base_url), cache=False, invalid_retries=0)
        q = evaluate_annotators(gold, {"rules": RuleAnnotator(), "llm": llm}, reps=50, clusters=None)
    v = q.validity().set_index("annotator")
    assert (v.loc["llm", "n_invalid"], v.loc["llm", "invalid_rate"], v.loc["rules", "n_invalid"]) == (4, 1.0, 0)
    assert q.incomplete == ["llm"] and q.predictions["llm"].is_longitudinal.isna().all()
    t = q.table()
    assert t["llm"].str.startswith("incomplete: 100.0% of replies unreadable").iloc[:-1].all()
    assert t.loc["unreadable replies", "llm"] == "4 of 4 (100.0%)" and t.loc["unreadable replies",
                                                                             "rules"] == "0 of 4 (0.0%)"
    assert not t["rules"].iloc[:-1].str.startswith("incomplete").any()


def test_verdict_subcommand(demo_runs, tmp_path):
    a = demo_runs[0]
    r = cli("verdict", "--studies", a / "studies.parquet", "--generations", a / "generations.parquet", "--metrics",
            "bleu_4", "chexpert_f1_14", "--reps", 400, "--out", tmp_path / "v")
    assert r.returncode == 0, r.stderr
    t = pd.read_csv(tmp_path / "v" / "verdict.csv")
    assert set(t.verdict) <= {"holds", "fragile", "not shown"} and set(t.metric) == {"bleu_4", "chexpert_f1_14"}
    assert "comparisons:" in r.stdout and f"{len(t)} comparisons" in r.stdout
    # the template generator never "holds" where it leads: concentration fails
    led = t[t["first"].str.startswith("sim-template+B4")]
    assert (led.concentration == "fail").all() and (led.verdict != "holds").all()
    assert ((tmp_path / "v" / "verdict.svg").is_file()
            and json.loads((tmp_path / "v" / "manifest.json").read_text())["command"] == "verdict")
    r = cli("verdict", "--studies", a / "studies.parquet", "--generations", a / "generations.parquet", "--labeler",
            "negbio", "--out", tmp_path / "x")
    assert r.returncode == 2 and "negbio" in r.stderr and "Traceback" not in r.stderr


def test_audit_takes_the_reference_section_and_baseline_and_says_them(demo_runs, tmp_path):
    a = demo_runs[0]
    base = ["audit", "--studies", a / "studies.parquet", "--generations", a / "generations.parquet", "--stages",
            "metrics", "--reps", 200]
    r = cli(*base, "--reference-section", "both", "--baseline", "sim-omit+B4", "--out", tmp_path / "a")
    assert r.returncode == 0, r.stderr[-2000:]
    page = re.sub(r"<[^>]+>", "", (tmp_path / "a" / "report.html").read_text(encoding="utf-8"))
    assert "references from their both (--reference-section)" in page
    assert "compared with sim-omit+B4 (chosen with --baseline)" in page
    r = cli(*base, "--out", tmp_path / "b")
    page = re.sub(r"<[^>]+>", "", (tmp_path / "b" / "report.html").read_text(encoding="utf-8"))
    assert "references from their findings" in page and "as no baseline was named; choose one with --baseline" in page
    r = cli(*base, "--baseline", "nope+B4", "--out", tmp_path / "c")
    assert r.returncode == 2 and "baseline 'nope+B4' is not a configuration" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "c" / "report.html").exists()   # refused before any stage ran


def test_score_says_what_it_left_out_and_refuses_a_missing_section(tmp_path):
    st = pd.DataFrame({"study_id": [f"s{i}" for i in range(6)], "dataset": "x",
                       "findings": [f"Finding {i} here." for i in range(6)], "impression": ""})
    st.to_csv(tmp_path / "st.csv", index=False)
    g = pd.concat([st.assign(system="A"), st.head(2).assign(system="B")])[["study_id", "system", "findings"]].rename(
        columns={"findings": "hypothesis"})
    g.to_csv(tmp_path / "g.csv", index=False)
    r = cli("score", tmp_path / "g.csv", "--studies", tmp_path / "st.csv", "--metrics", "bleu_4", "--reps", 0, "--out",
            tmp_path / "o")
    assert r.returncode == 0, r.stderr
    assert "Left out: 4 studies that not every configuration has a report for" in r.stdout
    r = cli("score", tmp_path / "g.csv", "--studies", tmp_path / "st.csv", "--metrics", "bleu_4", "--reps", 0,
            "--ref-section", "impression", "--out", tmp_path / "o2")
    assert r.returncode == 2 and "has an impression section" in r.stderr and "Traceback" not in r.stderr


def test_a_rerun_into_the_same_folder_leaves_no_stale_outputs(demo_runs, tmp_path):
    """Two systems write comparisons.csv; a rerun with one system into the same --out must not leave the old
    comparisons there."""
    a = demo_runs[0]
    g = pd.read_parquet(a / "generations.parquet")
    two = g[g.policy == "B4"].drop_duplicates(["system", "study_id"]).query("system in ['sim-terse', 'sim-template']")
    two.to_parquet(tmp_path / "two.parquet"); two[two.system == "sim-terse"].to_parquet(tmp_path / "one.parquet")
    assert cli("concentration", tmp_path / "two.parquet", "--out", tmp_path / "c", "--reps", 50).returncode == 0
    assert (tmp_path / "c" / "comparisons.csv").is_file()
    r = cli("concentration", tmp_path / "one.parquet", "--out", tmp_path / "c", "--reps", 50)
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "c" / "comparisons.csv").exists()
    m = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert "comparisons.csv" in m["replaced_outputs"] and "comparisons" not in m["outputs"]


def test_concentration_says_why_it_could_not_compare_and_refuses_an_unknown_unit(demo_runs, tmp_path):
    g = pd.read_parquet(demo_runs[0] / "generations.parquet")
    g = g[g.policy == "B4"]
    # `generate --seeds 0 1`
    pd.concat([g, g.assign(seed=1, sample_id=g.sample_id + "/s1")]).to_parquet(tmp_path / "seeds.parquet")
    r = cli("concentration", tmp_path / "seeds.parquet", "--out", tmp_path / "c", "--reps", 50, "--max-new-tokens", 256)
    assert r.returncode == 1 and "comparisons not made" in r.stderr and "seed" in r.stderr and "Wrote" in r.stdout
    m = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert m["params"]["max_new_tokens"] == 256   # a token cap is not a credential: not redacted
    r = cli("concentration", tmp_path / "seeds.parquet", "--out", tmp_path / "d", "--unit", "nope")
    assert r.returncode == 2 and "--unit 'nope' is not a column" in r.stderr and not (tmp_path / "d").exists()


def test_package_value_errors_are_user_errors_without_a_traceback(demo_runs, tmp_path):
    "Every error the package raises on purpose is an InputError: exit 2 and one line, never a traceback."
    import re as _re
    raises = [m for p in (ROOT / "cxr_audit").glob("*.py") for m in _re.findall(r"raise ValueError\(", p.read_text())]
    assert not raises, f"{len(raises)} `raise ValueError` left in the package: raise InputError (a ValueError) instead"
    r = cli("concentration", demo_runs[0] / "generations.parquet", "--out", tmp_path / "c", "--prefix", "", "--reps",
            20)
    assert r.returncode == 2 and "prefixes must be non-empty strings" in r.stderr and "Traceback" not in r.stderr


def test_unusable_inputs_end_in_one_line_not_a_traceback(demo_runs, tmp_path):
    a = demo_runs[0]
    g = pd.read_parquet(a / "generations.parquet").head(6).assign(study_id="unknown-study")
    g.to_parquet(tmp_path / "g.parquet")
    r = cli("longitudinal", "--studies", a / "studies.parquet", "--generations", tmp_path / "g.parquet", "--out",
            tmp_path / "l")
    assert (r.returncode == 2 and "none of the 6 generated reports is for a study" in r.stderr
            and "Traceback" not in r.stderr)
    (tmp_path / "folder").mkdir()
    r = cli("reref", "--studies", a / "studies.parquet", "--out", tmp_path / "r", "--cache", tmp_path / "folder")
    assert r.returncode == 2 and "is a folder; give a file in it" in r.stderr and "Traceback" not in r.stderr


def test_the_demo_manifest_keeps_the_stage_times(demo_runs):
    m = json.loads((demo_runs[0] / "manifest.json").read_text())
    assert m["command"] == "cxr-audit demo" and {"verdict", "corpus", "metrics", "reref"} <= set(m["stage_seconds"])
    assert all(t >= 0 for t in m["stage_seconds"].values())


@pytest.mark.parametrize("argv", [["--help"], ["score", "--help"], ["review", "prepare", "--help"],
                                  ["audit", "--help"]])
def test_help_loads_neither_numpy_nor_pandas(argv):
    """Help answers without the analysis stack (speed: benchmarks/bench_cli.py); each command imports what it needs
    when it runs."""
    code = ("import sys\nfrom cxr_audit.cli import main\ntry: main(sys.argv[1:])\nexcept SystemExit: pass\n"
            "print(sorted(m for m in ('numpy', 'pandas') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120)
    assert (r.returncode == 0 and "usage: cxr-audit" in r.stdout
            and r.stdout.strip().splitlines()[-1] == "[]"), r.stdout[-500:]
