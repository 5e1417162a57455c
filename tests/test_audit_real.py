"""The whole audit on a real public benchmark (issue: "The whole audit on a real public benchmark, with no patient
IDs").

Real IU X-ray studies (the 50 of tests/fixtures/iu_real, from ReXrank's JSON; IU X-ray gives no patient IDs), two
systems
made from the real text (a random-report system: each study gets another study's findings; a template system: one fixed
normal report for every study), run through the three commands of the README: `cxr-audit load`, `cxr-audit validate`,
`cxr-audit audit`. Then the one resampling-unit rule on tables with no, some and all patient IDs, and a failing stage.
"""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cxr_audit.audit import STAGES, run_audit
from cxr_audit.cli import main
from cxr_audit.concentration import audit_concentration
from cxr_audit.core import IncompleteRunError, InputError
from cxr_audit.corpus import load_rexrank
from cxr_audit.labels import label_reports
from cxr_audit.stats import resampling_unit

ROOT = Path(__file__).resolve().parents[1]
IU_JSON = ROOT / "tests" / "fixtures" / "iu_real" / "iu_valid_rexrank_sample.json"
TEMPLATE = ("No acute cardiopulmonary process. The heart is normal in size. The mediastinum is unremarkable. "
            "The lungs are clear. No pneumothorax or pleural effusion.")


def cli(*args, cwd=None):
    exe = shutil.which("cxr-audit", path=str(Path(sys.executable).parent)) or shutil.which("cxr-audit")
    assert exe, "the cxr-audit console script is not installed (pip install -e .)"
    return subprocess.run([exe, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=900)


def two_systems(studies: pd.DataFrame) -> pd.DataFrame:
    """A random-report system (another study's findings, a fixed derangement) and a one-template system, as a user's
    CSV has them."""
    ids, findings = studies.study_id.tolist(), studies.findings.fillna("").tolist()
    shift = np.roll(np.arange(len(ids)), 7)
    rows = [{"study_id": s, "system": "random-report", "hypothesis": findings[shift[i]]} for i, s in enumerate(ids)]
    rows += [{"study_id": s, "system": "template", "hypothesis": TEMPLATE} for s in ids]
    return pd.DataFrame(rows)


def page_text(path: Path) -> str:
    s = re.sub(r"<svg.*?</svg>", " ", path.read_text(encoding="utf-8"), flags=re.S)
    s = re.sub(r"</?(code|strong|em|a)\b[^>]*>", "", s)          # inline marks: no space in their place
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", s)).replace("&#x27;", "'")


@pytest.fixture(scope="module")
def iu_run(tmp_path_factory):
    "The README's three commands on the real IU file, every stage (resamples reduced to keep the suite fast)."
    d = tmp_path_factory.mktemp("iu_audit")
    load = cli("load", IU_JSON, "--rexrank", "--out", d / "studies.parquet")
    studies = pd.read_parquet(d / "studies.parquet")
    # the outputs name their studies by the JSON's own keys, as the README says (`load` keeps them as `source_id`)
    two_systems(studies.assign(study_id=studies.source_id)).to_csv(d / "outputs.csv", index=False)
    check = cli("validate", "--studies", d / "studies.parquet", "--generations", d / "outputs.csv")
    audit = cli("audit", "--studies", d / "studies.parquet", "--generations", d / "outputs.csv", "--out", d / "audit",
                "--reps", 200)
    return d, load, check, audit, studies


def test_the_three_commands_write_a_complete_report(iu_run):
    d, load, check, audit, studies = iu_run
    for r in (load, check, audit): assert r.returncode == 0, r.stderr[-3000:]
    assert "Key your outputs' `study_id`" in load.stdout and "source_id" in load.stdout
    assert "100 of 100 rows name their study by the benchmark's own key" in check.stdout
    assert "benchmark's own key" in audit.stderr and "Study keys:" in page_text(d / "audit" / "report.html")
    # a validation file is not passed off as the paper's test set
    assert "These tables have no test partition (splits: val)" in page_text(d / "audit" / "report.html")
    assert len(studies) == 50 and studies.patient_id.isna().all()        # IU X-ray: no patient identifiers
    text = page_text(d / "audit" / "report.html")
    for title in ("Corpus overview", "Cohort", "Decoding policies", "Concentration", "Uncertainty",
                  "Reference-based metrics", "Reference sensitivity (ReRef)", "Longitudinal progression",
                  "Labels and traceability"):
        assert title in text, title
    assert "has no results here" not in text and "Incomplete run" not in text
    assert "could not run" not in text and "No longitudinal evaluation was possible" not in text
    # the resampling unit is said once for the whole report, and again where intervals are made
    assert "Resampling unit of every section's intervals and tests: studies (50; the table gives no patient_id)" in text
    assert text.count("the table gives no patient_id") >= 4


def test_the_template_system_is_maximally_concentrated(iu_run):
    _, _, _, _, studies = iu_run
    gens = two_systems(studies)
    a = audit_concentration(gens, by=("system",), reps=50)
    s = a.summary().set_index("system")
    # one unique report of 50; the prefix rule counts it (it opens with a listed normal prefix); the random system does
    # not collapse
    assert s.loc["template", "unique_report_ratio"] == 1 / 50 and s.loc["template", "top_5_share"] == 1.0
    assert s.loc["template", "prefix_rate"] == 1.0 and s.loc["template", "duplicate_rate"] == 1.0
    assert s.loc["random-report", "unique_report_ratio"] > 0.9 and s.loc["random-report", "prefix_rate"] < 0.5


def test_normal_wording_gives_no_positive_label(iu_run):
    # the template is all normal wording: the labeler finds no pathology in it, only No Finding (as documented in
    # `labels`)
    lab = label_reports([TEMPLATE])
    positive = lab.loc[lab.state == 1, "label"].tolist()
    negated = set(lab.loc[lab.state == 0, "label"])
    assert positive == ["No Finding"], positive
    # normal statements read as negations, not triggers
    assert {"Cardiomegaly", "Pneumothorax", "Pleural Effusion"} <= negated


@pytest.mark.parametrize("patients", ["none", "some", "all"])
def test_one_resampling_unit_rule(patients, tmp_path):
    studies = load_rexrank(IU_JSON).head(24).copy()
    if patients == "some": studies.loc[studies.index[:12], "patient_id"] = [f"p{i // 2}" for i in range(12)]
    if patients == "all": studies["patient_id"] = [f"p{i // 2}" for i in range(24)]
    unit = resampling_unit(studies)
    expected = {"none": "studies (24; the table gives no `patient_id`)",
                "some": "patients where known (`patient_id`: 6 patients), otherwise the study itself (12 of 24 studies "
                        "have no `patient_id`)",
                "all": "patients (`patient_id`: 12 patients, 24 studies)"}[patients]
    assert unit == expected
    path = run_audit(studies, two_systems(studies), tmp_path, params={"reps": 50},
                     stages=["concentration", "uncertainty", "metrics", "reref", "longitudinal"])
    text = page_text(path)
    assert "has no results here" not in text and "Incomplete run" not in text
    assert text.count(unit.replace("`", "")) >= 4, unit            # every resampling stage says which unit it used
    if patients != "none":                                        # clusters: studies of one patient resampled together
        n_clusters = {"some": 6 + 12, "all": 12}[patients]
        assert f"24 studies in {n_clusters} resampling clusters" in text


def test_a_failing_stage_keeps_the_others_and_fails_the_command(tmp_path, monkeypatch, capsys):
    # a stage that raises is a stand-in registered for the test (no real stage fails on this input); the CLI runs
    # in-process
    studies = load_rexrank(IU_JSON).head(12)
    two_systems(studies).to_csv(tmp_path / "outputs.csv", index=False)
    studies.to_parquet(tmp_path / "studies.parquet")

    def broken(ctx): raise InputError("studies: the stand-in stage cannot run")
    monkeypatch.setitem(STAGES, "broken", broken)
    with pytest.raises(IncompleteRunError) as e:
        run_audit(studies, two_systems(studies), tmp_path / "lib", stages=["corpus", "broken", "policies"])
    assert e.value.failed == ("broken",) and Path(e.value.output).is_file()
    text = page_text(Path(e.value.output))
    assert ("Corpus overview" in text and "Decoding policies" in text and "the stand-in stage cannot run" in text
            and "Incomplete run" in text)
    rc = main(["audit", "--studies", str(tmp_path / "studies.parquet"), "--generations", str(tmp_path / "outputs.csv"),
               "--out", str(tmp_path / "cli"), "--stages", "corpus", "broken"])
    err = capsys.readouterr().err
    assert rc == 1 and "incomplete" in err and "broken" in err and (tmp_path / "cli" / "report.html").is_file()


def test_an_unknown_cohort_recipe_stops_before_any_stage(tmp_path):
    studies = load_rexrank(IU_JSON).head(5)
    with pytest.raises(InputError, match="unknown cohort recipe 'nope'"):
        run_audit(studies, two_systems(studies), tmp_path, params={"cohort_recipe": "nope"})
    assert not (tmp_path / "report.html").exists()


def _without_svg(path: Path) -> str:
    """The page with its inline SVG charts removed (chart ids are numbered in drawing order, which differs between the
    two runs)."""
    return re.sub(r"<svg.*?</svg>", "<svg/>", path.read_text(encoding="utf-8"), flags=re.S)


def test_a_second_process_gives_the_same_report_and_sees_the_cohort(tmp_path, monkeypatch):
    # labels and review run in a second process with workers=2; they must analyse the cohort the cohort stage kept (the
    # stage narrows the tables), and a stage replaced in STAGES must run in this process, where the replacement exists
    studies = load_rexrank(IU_JSON).head(30)
    studies["split"] = ["test"] * 20 + ["train"] * 10  # the 000_test cohort keeps the 20 test studies
    gens = two_systems(studies)
    params = {"reps": 50, "cohort_recipe": "000_test"}
    stages = ["corpus", "cohort", "labels", "review", "policies"]
    one = run_audit(studies, gens, tmp_path / "one", stages=stages, params=params, workers=1)
    two = run_audit(studies, gens, tmp_path / "two", stages=stages, params=params, workers=2)
    assert _without_svg(one) == _without_svg(two)
    assert "20 of the 30 studies" in page_text(two)
    calls = []
    def labels_here(ctx):
        calls.append(len(ctx.studies)); return STAGES_BEFORE["labels"](ctx)
    STAGES_BEFORE = dict(STAGES)
    monkeypatch.setitem(STAGES, "labels", labels_here)
    three = run_audit(studies, gens, tmp_path / "three", stages=stages, params=params, workers=2)
    assert calls == [20] and _without_svg(three) == _without_svg(one)


def test_the_report_opens_with_verdicts_that_never_crown_the_template(iu_run, tmp_path):
    "The README's commands, then `cxr-audit verdict` on the same files: the template's n-gram leads are not 'holds'."
    d, _, _, audit, _ = iu_run
    text = page_text(d / "audit" / "report.html")
    assert text.index("Verdicts") < text.index("Corpus overview") and "Verdicts on the leaders" in text
    r = cli("verdict", "--studies", d / "studies.parquet", "--generations", d / "outputs.csv", "--out", tmp_path / "v",
            "--clusters", "none")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "verdict [" in r.stderr and "references rewritten by the rules" in r.stderr   # progress, step by step
    t = pd.read_csv(tmp_path / "v" / "verdict.csv")
    led = t[t["first"].str.startswith("template") & t.metric.isin(["bleu_4", "rouge_l"])]
    assert len(led) and (led.verdict != "holds").all() and led.failed.fillna("").str.contains("concentration").all()
    assert set(pd.read_csv(tmp_path / "v" / "evidence.csv").check) == {"stability", "concentration", "labels",
                                                                       "section",
                                                                         "references", "longitudinal"}
