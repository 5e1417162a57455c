"""Bad inputs to the `cxr-audit` command and the canonical tables (issue 22): each ends in one clear line and exit 2,
or in a value read as written, never a traceback or a silent change. The command runs as a real subprocess."""
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from cxr_audit.core import InputError
from cxr_audit.corpus import to_generations, to_studies


def cli(*args, cwd=None, env=None):
    exe = shutil.which("cxr-audit", path=str(Path(sys.executable).parent)) or shutil.which("cxr-audit")
    assert exe, "the cxr-audit console script is not installed (pip install -e .)"
    return subprocess.run([exe, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=600, env=env)


def one_clear_line(r, *needles):
    "Exit 2, a single line on stderr naming the problem, no traceback."
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr[-2000:]
    for n in needles: assert n in r.stderr, (n, r.stderr)


@pytest.fixture
def files(tmp_path):
    "A tiny studies table (three patients) and generations of two systems, as CSV files."
    s = pd.DataFrame({"study_id": ["s1", "s2", "s3", "s4"], "patient_id": ["p1", "p1", "p2", "p3"],
                      "dataset": "iu-xray",
                      "findings": ["The heart is normal. No effusion.", "Mild cardiomegaly. Small left effusion.",
                                   "Lungs are clear.", "Pneumothorax on the right."], "impression": "Normal."})
    g = pd.DataFrame({"study_id": ["s1", "s2", "s3", "s4"] * 2, "system": ["A"] * 4 + ["B"] * 4, "policy": "B4",
                      "hypothesis": ["The heart is normal.", "Small effusion.", "Lungs clear.",
                                     "No pneumothorax."] * 2})
    s.to_csv(tmp_path / "studies.csv", index=False); g.to_csv(tmp_path / "gens.csv", index=False)
    return tmp_path, s, g


def test_header_only_score_input_is_refused(files):
    d, _, g = files
    g.head(0).to_csv(d / "empty.csv", index=False)
    one_clear_line(cli("score", d / "empty.csv", "--studies", d / "studies.csv", "--out", d / "o", "--reps", 10),
                   "empty.csv: the table has no rows")


def test_labels_with_no_matching_generations(files):
    d, _, g = files
    g.assign(study_id=g.study_id + "x").to_csv(d / "nomatch.csv", index=False)
    one_clear_line(cli("labels", "--references", d / "studies.csv", "--predictions", d / "nomatch.csv", "--out",
                       d / "o", "--reps", 10),
                   "no study_id of", "nothing to align")
    assert not (d / "o").exists()       # refused before anything is written


@pytest.mark.parametrize("args, flag", [(["concentration", "{d}/gens.csv", "--reps", "-5"], "--reps"),
                                        (["score", "{d}/gens.csv", "--studies", "{d}/studies.csv", "--reps", "-1"],
                                         "--reps"),
                                        (["review", "prepare", "--studies", "{d}/studies.csv", "--generations",
                                          "{d}/gens.csv", "--n-cases", "-1"], "--n-cases"),
                                        (["demo", "--n-patients", "-3"], "--n-patients")])
def test_negative_counts_are_refused(files, args, flag):
    d = files[0]
    one_clear_line(cli(*[a.format(d=d) for a in args], "--out", d / "o"), f"{flag} must be >= 0")


@pytest.mark.parametrize("opt, msg", [("--reps", "reps must be a positive integer, got 0"),
                                      ("--top-k", "top_k must be a positive integer, got 0")])
def test_zero_is_refused_not_the_default(files, opt, msg):
    d = files[0]       # 0 used to become 5000 resamples / the top 5
    one_clear_line(cli("concentration", d / "gens.csv", opt, 0, "--out", d / "o"), msg)


def test_audit_reps_zero_is_refused(files):
    d = files[0]
    one_clear_line(cli("audit", "--studies", d / "studies.csv", "--generations", d / "gens.csv", "--out", d / "o",
                       "--reps", 0),
                   "--reps must be >= 1")


def test_score_reps_zero_means_estimates_only(files):
    d = files[0]
    r = cli("score", d / "gens.csv", "--studies", d / "studies.csv", "--metrics", "bleu_4", "--reps", 0, "--out",
            d / "o")
    assert r.returncode == 0, r.stderr
    assert "0 resamples" in r.stdout


def test_concentration_out_is_an_existing_file(files):
    d = files[0]
    (d / "taken.txt").write_text("mine")
    one_clear_line(cli("concentration", d / "gens.csv", "--reps", 10, "--out", d / "taken.txt"),
                   "is a file; give a folder")
    assert (d / "taken.txt").read_text() == "mine"


def test_llm_cache_on_a_file_that_is_not_sqlite(tmp_path):
    f = tmp_path / "notes.db"
    f.write_text("not a database " * 100)
    one_clear_line(cli("llm-cache", "--path", f), "is not an SQLite cache file")
    short = tmp_path / "short.db"
    short.write_text("x")                # SQLite used to turn a short non-database file into a fresh cache, silently
    one_clear_line(cli("llm-cache", "--path", short), "is not an SQLite cache file")
    assert short.read_text() == "x"
    ok = tmp_path / "real.sqlite"
    sqlite3.connect(ok).close()          # a real (empty) SQLite file is a cache with no entries
    assert cli("llm-cache", "--path", ok).returncode == 0


def test_unknown_audit_stage(files):
    d = files[0]
    one_clear_line(cli("audit", "--studies", d / "studies.csv", "--generations", d / "gens.csv", "--out", d / "o",
                       "--stages", "nosuch"), "unknown audit stage(s) ['nosuch']")


def test_guard_refusal_is_one_line(files):
    d, s, g = files   # restricted studies, a non-loopback URL: refused before any request (nothing listens there)
    s.assign(dataset="mimic-cxr", restricted=True).to_csv(d / "restricted.csv", index=False)
    env = {**__import__("os").environ, "OPENAI_API_KEY": "sk-test-not-real"}
    pytest.importorskip("openai", reason="the llm extra is not installed")
    r = cli("longitudinal", "--studies", d / "restricted.csv", "--generations", d / "gens.csv", "--out", d / "o",
            "--annotator", "openai", "--model", "m", "--base-url", "http://10.255.255.1:9/v1", env=env)
    one_clear_line(r, "restricted", "Nothing was sent")


def test_generations_flags_and_seeds_are_read_as_written(files):
    d, _, g = files
    g.assign(truncated=["no", "false", "0", "", "yes", "true", "1", "No"]).to_csv(d / "t.csv", index=False)
    t = to_generations(pd.read_csv(d / "t.csv"), "t.csv")
    assert t.truncated.tolist() == [False] * 4 + [True] * 3 + [False]     # "no" used to be True
    with pytest.raises(InputError, match=r"t.csv: row 2: column 'truncated': not a true/false value: 'maybe'"):
        to_generations(g.assign(truncated=["no", "no", "maybe"] + ["no"] * 5), "t.csv")
    with pytest.raises(InputError, match=r"row 0: column 'seed': not an integer: 'x'"):   # "x" used to become 0
        to_generations(g.assign(seed="x"), "g.csv")


def test_truncated_no_keeps_reports_valid_on_the_command_line(files):
    d, _, g = files
    g.assign(truncated="no").to_csv(d / "t.csv", index=False)
    r, plain = (cli("concentration", d / f, "--reps", 10, "--out", d / f"o_{f}") for f in ("t.csv", "gens.csv"))
    assert r.returncode == 0, r.stderr
    n_invalid = lambda out: out.split(" not surface-valid")[0].rsplit(" ", 1)[-1]
    assert n_invalid(r.stdout) == n_invalid(plain.stdout) == "6", (r.stdout, plain.stdout)   # "no" used to flag all 8
    g.assign(seed="x").to_csv(d / "x.csv", index=False)
    for cmd in (["validate", "--generations", d / "x.csv"],
                ["score", d / "x.csv", "--studies", d / "studies.csv", "--out", d / "o"],
                ["concentration", d / "x.csv", "--out", d / "o"]):
        one_clear_line(cli(*cmd), "x.csv: row 0: column 'seed': not an integer: 'x'")


def test_duplicate_keys_name_both_rows(files):
    _, s, g = files
    with pytest.raises(InputError, match=r"rows 1 and 4: duplicate study_id 's2'"):
        to_studies(pd.concat([s, s.iloc[[1]]], ignore_index=True))
    with pytest.raises(InputError, match=r"rows 0 and 8: duplicate sample_id 'A/B4/0/s1'"):
        to_generations(pd.concat([g, g.iloc[[0]]], ignore_index=True))


def test_score_refuses_duplicate_reference_studies(files):
    d, s, _ = files    # the second copy of s1's reference used to replace the first, silently changing BLEU
    pd.concat([s, s.iloc[[0]].assign(findings="Something else entirely.")]).to_csv(d / "dup_studies.csv", index=False)
    one_clear_line(cli("score", d / "gens.csv", "--studies", d / "dup_studies.csv", "--metrics", "bleu_4", "--reps", 0,
                       "--out", d / "o"), "duplicate study_id 's1'")


def test_mask_only_texts_are_flagged_by_score(files):
    # all-XXXX texts used to score BLEU/ROUGE-L 1.0 without a word, then were flagged but still averaged
    d, s, g = files
    g.assign(hypothesis=["XXXX XXXX."] + g.hypothesis.tolist()[1:]).to_csv(d / "m.csv", index=False)
    s.assign(findings=["XXXX."] + s.findings.tolist()[1:]).to_csv(d / "ms.csv", index=False)
    r = cli("score", d / "m.csv", "--studies", d / "ms.csv", "--metrics", "bleu_4", "--reps", 0, "--out", d / "o")
    assert r.returncode == 0, r.stderr
    assert ("Left out of every average: 1 study whose reference is empty or only de-identification masks "
            "(1 masked; s1)") in r.stdout
    # s1 is out
    assert ("Flagged, scored as written: 1 generated report(s) empty or only de-identification masks "
            "(A+B4 1)") not in r.stdout
    plain = cli("score", d / "gens.csv", "--studies", d / "studies.csv", "--metrics", "bleu_4", "--reps", 0, "--out",
                d / "o2")
    assert "Flagged" not in plain.stdout and "Left out" not in plain.stdout


def estimates(out: Path) -> dict:
    return {(r.metric, r.config): r.estimate for r in pd.read_csv(out / "systems.csv").itertuples()}


def test_mask_only_references_are_left_out_of_every_average(files):
    # study s1's reference and both systems' reports are only XXXX: ROUGE-L 1.0 and a No Finding true positive that used
    # to lift every average; now s1 is left out (named in flagged.csv), and --keep-flagged gives the old numbers back
    d, s, g = files
    g.assign(hypothesis=g.hypothesis.where(g.study_id != "s1", "XXXX XXXX.")).to_csv(d / "m.csv", index=False)
    s.assign(findings=s.findings.where(s.study_id != "s1", "XXXX XXXX.")).to_csv(d / "ms.csv", index=False)
    g[g.study_id != "s1"].to_csv(d / "without_s1.csv", index=False)
    run = lambda gens, out, *extra: cli("score", gens, "--studies", d / "ms.csv", "--metrics", "rouge_l",
                                        "chexpert_f1_14", "--reps", 0, "--out", d / out, *extra)
    r, kept, ref = run(d / "m.csv", "o"), run(d / "m.csv", "k", "--keep-flagged"), run(d / "without_s1.csv", "w")
    assert r.returncode == kept.returncode == ref.returncode == 0, (r.stderr, kept.stderr, ref.stderr)
    assert ("on 3 studies" in r.stdout and "Left out of every average: 1 study" in r.stdout
            and "see flagged.csv" in r.stdout)
    assert estimates(d / "o") == pytest.approx(estimates(d / "w"))          # as if s1 were not there
    flagged = pd.read_csv(d / "o" / "flagged.csv")
    assert flagged[["sample_id", "text", "reason", "excluded"]].values.tolist() == [
        ["s1", "reference", "masked", True], ["s1", "hypothesis", "masked", True], ["s1", "hypothesis", "masked", True]]
    # --keep-flagged: the old behaviour, s1 scored as written with a perfect ROUGE-L
    assert ("on 4 studies" in kept.stdout
            and "Flagged, scored as written (--keep-flagged): 1 reference(s) only masks." in kept.stdout)
    sc = pd.read_parquet(d / "k" / "scores.parquet").query("sample_id == 's1' and metric == 'rouge_l'")
    assert sc.value.tolist() == [1.0, 1.0]
    old, new = estimates(d / "k"), estimates(d / "o")
    assert old[("rouge_l", "A+B4")] == pytest.approx((3 * new[("rouge_l", "A+B4")] + 1.0) / 4)
    assert old[("chexpert_f1_14", "A+B4")] > new[("chexpert_f1_14", "A+B4")]


def test_only_masked_references_is_one_clear_line(files):
    d, s, g = files
    s.assign(findings="XXXX XXXX.").to_csv(d / "all_masked.csv", index=False)
    one_clear_line(cli("score", d / "gens.csv", "--studies", d / "all_masked.csv", "--metrics", "rouge_l", "--reps", 0,
                       "--out", d / "o"),
                   "only de-identification masks", "keep_flagged=True")


@pytest.mark.parametrize("command", [["score", "--studies", "{d}/studies.csv", "--metrics", "bleu_4", "--reps", "0"],
                                     ["concentration", "--reps", "10"]])
def test_duplicate_sample_ids_are_refused_by_every_command(files, command):
    # `validate`, `labels` and `audit` refused a sample_id given twice; `score` and `concentration` read the table as it
    # was
    d, _, g = files
    g.assign(sample_id=["x0", "x1", "x2", "x3", "x4", "x5", "x6", "x0"]).to_csv(d / "dup.csv", index=False)
    args = [command[0], d / "dup.csv", *[a.format(d=d) for a in command[1:]], "--out", d / "o"]
    one_clear_line(cli(*args), "dup.csv: rows 0 and 7: duplicate sample_id 'x0'")
    assert not (d / "o").exists()


@pytest.mark.parametrize("command", [["reref", "--variations", "negation:implicit"],
                                     ["review", "prepare", "--generations", "{d}/gens.csv", "--n-cases", "2"]])
def test_blank_study_id_is_refused_by_reref_and_review(files, command):
    # these read the studies table as written: a blank study_id silently merged or dropped a study ("3 studies" of 4
    # rows)
    d, s, _ = files
    s.assign(study_id=[None, "s2", "s3", "s4"]).to_csv(d / "blank_id.csv", index=False)
    n = 2 if command[0] == "review" else 1
    args = [*command[:n], "--studies", d / "blank_id.csv", *[a.format(d=d) for a in command[n:]], "--out", d / "o"]
    one_clear_line(cli(*args), "blank_id.csv: row 0 (study_id=None): empty study_id")
    assert not (d / "o").exists()
