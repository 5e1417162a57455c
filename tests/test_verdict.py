"""The verdict on planted scenarios whose truth is known (synthetic demo corpus; no mock)."""
import numpy as np
import pandas as pd
import pytest

from cxr_audit.core import InputError
from cxr_audit.synth import make_demo_corpus
from cxr_audit.verdict import CHECKS, verdict


@pytest.fixture(scope="module")
def demo():
    return make_demo_corpus(n_patients=40, seed=3)


def _toys(studies, template):
    st = studies.drop_duplicates("study_id").reset_index(drop=True)
    parts = [st.assign(system="copy", hypothesis=st.impression), st.assign(system="template", hypothesis=template),
             st.assign(system="shuffled", hypothesis=np.roll(st.findings.to_numpy(), 1))]
    return pd.concat(parts, ignore_index=True).assign(policy="-", sample_id=lambda d: d.system + "/" + d.study_id)[
        ["sample_id", "study_id", "system", "policy", "hypothesis"]]


def test_equal_systems_are_not_shown(demo):
    g = demo.generations[(demo.generations.system == "sim-terse") & (demo.generations.policy == "B4")]
    twins = pd.concat([g, g.assign(system="twin", sample_id=g.sample_id + "-twin")], ignore_index=True)
    t = verdict(demo.studies, twins, metrics=("bleu_4", "chexpert_f1_14"), reps=200, seed=0).to_frame()
    assert (t.verdict == "not shown").all() and t.reasons.str.startswith("not significant after Holm").all()


def test_a_template_never_holds_and_says_concentration(demo):
    "The most frequent reference written for every study: wherever it leads, the concentration check fails."
    st = demo.studies
    t = verdict(st, _toys(st, st.findings.value_counts().index[0]), metrics=("bleu_4", "rouge_l", "chexpert_f1_14"),
                reps=300, seed=0).to_frame()
    led = t[t["first"] == "template+-"]
    assert (led.concentration == "fail").all() and (led.verdict != "holds").all()
    assert t[t["first"] != "template+-"].concentration.eq("pass").all()
    assert set(CHECKS) <= set(t.columns) and t.references.str.startswith("not run").all()


def test_a_faithful_label_lead_holds_and_a_no_finding_lead_fails_the_label_check(demo):
    g = demo.generations[demo.generations.policy == "B4"]
    t = verdict(demo.studies, g[g.system.isin(["sim-terse", "sim-template"])], metrics=("chexpert_f1_14",), reps=300, seed=0).to_frame()
    assert t.iloc[0][["first", "verdict", "labels"]].tolist() == ["sim-terse+B4", "holds", "pass"]
    normal = "Heart size is normal. The lungs are clear. No pleural effusion or pneumothorax."
    t2 = verdict(demo.studies, _toys(demo.studies, normal), metrics=("chexpert_f1_14",), reps=300, seed=0).to_frame()
    row = t2[(t2["first"] == "template+-") & (t2["second"] == "shuffled+-")]
    if len(row):   # when the normal template leads the wrong reports on labels, it is through No Finding
        assert row.iloc[0].labels == "fail" and "No Finding" in row.iloc[0].reasons


def test_bad_input_is_one_clear_error(demo):
    g = demo.generations[(demo.generations.system == "sim-terse") & (demo.generations.policy == "B4")]
    with pytest.raises(InputError, match="at least two configurations"):
        verdict(demo.studies, g, reps=20)
    with pytest.raises(InputError, match="ref_section must be"):
        verdict(demo.studies, demo.generations, ref_section="technique", reps=20)


def test_the_audit_report_opens_with_the_verdicts(demo, tmp_path):
    from cxr_audit.audit import default_stages, run_audit
    assert default_stages(True)[0] == default_stages(False)[0] == "verdict"
    g = demo.generations[demo.generations.policy == "B4"]
    page = run_audit(demo.studies, g, tmp_path, stages=["verdict", "corpus"], params={"reps": 400}).read_text(encoding="utf-8")
    assert page.index("Verdicts") < page.index("Corpus overview") and "comparisons:" in page and "not shown" in page
