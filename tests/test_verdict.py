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
    assert len(led) and (led.concentration == "fail").all() and (led.verdict != "holds").all()
    assert led.reasons.str.contains("1 distinct text, too few to resample").all()
    assert t[t["first"] != "template+-"].concentration.eq("pass").all()
    assert set(CHECKS) <= set(t.columns) and not t[list(CHECKS)].isna().any().any()
    assert t.references.isin(["pass", "fail"]).all() and t.longitudinal.isin(["pass", "fail"]).all()


def test_a_concentrated_leader_whose_lead_survives_distinct_counting_passes(demo):
    "Concentrated (few distinct texts) but genuinely better: counted once per distinct text, the lead stays."
    g = demo.generations[demo.generations.policy == "B4"]
    good = g[g.system == "sim-terse"]
    ids = good.study_id.tolist()
    # pairs of studies share a text
    shared = good.assign(hypothesis=good.hypothesis.to_numpy()[[i - i % 2 for i in range(len(ids))]])
    bad = g[g.system == "sim-template"]
    t = verdict(demo.studies, pd.concat([shared, bad]), metrics=("chexpert_f1_14",), seed=0,
                min_unique_ratio=0.9, checks=("concentration",), clusters=None).to_frame().iloc[0]
    assert t["first"] == "sim-terse+B4" and t.concentration == "pass" and t.verdict == "holds"


def test_a_faithful_label_lead_holds_and_a_no_finding_lead_fails_the_label_check(demo):
    g = demo.generations[demo.generations.policy == "B4"]
    t = verdict(demo.studies, g[g.system.isin(["sim-terse", "sim-template"])], metrics=("chexpert_f1_14",),
                seed=0).to_frame()
    assert t.iloc[0][["first", "verdict", "labels", "references", "longitudinal"]].tolist() == [
        "sim-terse+B4", "holds", "pass", "pass", "pass"]
    st = demo.studies.drop_duplicates("study_id").reset_index(drop=True)
    normal = [f"Heart size is normal. The lungs are clear. No pleural effusion or pneumothorax. Case {i}."
              for i in range(len(st))]
    nf = pd.concat([st.assign(system="normal", hypothesis=normal),
                    st.assign(system="wrong", hypothesis=np.roll(st.findings.to_numpy(), 5))]).assign(
        policy="-", sample_id=lambda d: d.system + "/" + d.study_id)
    r = verdict(st, nf, metrics=("chexpert_f1_14",), seed=0, checks=("labels", "concentration")).to_frame().iloc[0]
    assert (r["first"], r.verdict, r.concentration, r.labels) == ("normal+-", "fragile", "pass", "fail")
    assert "true positives are No Finding; without No Finding the gap is -" in r.reasons


def test_a_lead_that_needs_one_reference_style_fails_the_references_check(demo):
    from cxr_audit.reref import rewrite_table
    from cxr_audit.reref_rules import rule_reref
    st = demo.studies.drop_duplicates("study_id").reset_index(drop=True)
    refs = rewrite_table(st, "structure:structured", rule_reref(), cache=False).references
    styled = refs[(refs.variant == "structure:structured") & refs.usable].set_index("study_id").findings
    both = st[st.study_id.isin(styled.index)]
    g = pd.concat([both.assign(system="copy", hypothesis=both.findings),
                   both.assign(system="styled", hypothesis=both.study_id.map(styled))]).assign(
        policy="-", sample_id=lambda d: d.system + "/" + d.study_id)
    v = verdict(both, g, metrics=("bleu_4",), seed=0, checks=("references", "section"))
    r = v.to_frame().iloc[0]
    assert (r["first"], r.verdict, r.failed) == ("copy+-", "fragile", "references")
    assert "significantly reversed under" in r.reasons and "structure:structured" in r.reasons
    ev = v.explain("bleu_4", "copy+-", "styled+-").set_index("check")
    assert ev.loc["stability", "status"].startswith("not run") and ev.loc["section", "status"] == "pass"
    # rewrites made before are used as given (e.g. an LLM's): the same verdict without rewriting again
    r2 = verdict(both, g, metrics=("bleu_4",), seed=0, checks=("references",), references=refs).to_frame().iloc[0]
    assert r2.references == "fail"
    # a large audit's check reads a seeded sample of whole patients (`check_studies`): the planted reversal is
    # strong enough to show on a quarter of the studies, and the evidence says which studies were read
    n = both.study_id.nunique()
    v3 = verdict(both, g, metrics=("bleu_4",), seed=0, checks=("references",), check_studies=n // 4)
    r3 = v3.to_frame().iloc[0]
    assert r3.references == "fail" and r3.verdict == "fragile"
    assert "on a sample of" in v3.params["references"] and f"of {n} studies (whole `patient_id` clusters" in r3.reasons
    assert v3.params["check_studies"] == n // 4
    # given rewrites: the sample is drawn among the studies they cover
    r4 = verdict(both, g, metrics=("bleu_4",), seed=0, checks=("references",), references=refs,
                 check_studies=n // 4).to_frame().iloc[0]
    assert r4.references == "fail" and f"of {n} studies" in r4.reasons


def test_a_lead_with_the_changes_turned_round_fails_the_longitudinal_check(demo):
    """One system keeps every sentence but says each change went the other way; the other writes only the change
    sentences."""
    from cxr_audit.longitudinal import RuleAnnotator
    from cxr_audit.reports import split_sentences
    st = demo.studies.drop_duplicates("study_id").reset_index(drop=True)
    ann = RuleAnnotator()
    def parts(text):
        read = [(s, *ann.annotate_sentence(s)) for s in split_sentences(text)]
        return [s for s, is_long, _, _ in read if not is_long], [(s, kw, p) for s, is_long, kw, p in read if is_long]
    def turned(text):
        keep, change = parts(text)
        return " ".join(keep + [f"The {kw} has {'improved' if p == 'worsened' else 'worsened'}." for _, kw,
                                p in change])
    g = pd.concat([st.assign(system="turned", hypothesis=[turned(t) for t in st.findings]),
                   st.assign(system="changes",
                             hypothesis=[" ".join(s for s, _, _ in parts(t)[1]) for t in st.findings])]).assign(
        policy="-", sample_id=lambda d: d.system + "/" + d.study_id)
    v = verdict(st, g, metrics=("bleu_4",), seed=0, checks=("longitudinal", "stability"))
    r = v.to_frame().iloc[0]
    assert (r["first"], r.verdict, r.failed, r.stability) == ("turned+-", "fragile", "longitudinal", "pass")
    assert "progression-F1 gap is -" in r.reasons and "significantly reversed" in r.reasons
    assert "annotated by `rules`" in v.params["longitudinal"]


def test_one_seed_behind_fails_stability(demo):
    g = demo.generations[demo.generations.policy == "B4"]
    def run_of(system, name, seed):
        return g[g.system == system].assign(system=name, seed=seed, sample_id=lambda d: d.sample_id + f"/{name}/{seed}")
    seeded = pd.concat([run_of("sim-terse", "lucky", 0), run_of("sim-template", "lucky", 1),
                        run_of("sim-omit", "steady", 0), run_of("sim-omit", "steady", 1)], ignore_index=True)
    r = verdict(demo.studies, seeded, metrics=("chexpert_f1_14",), seed=0, checks=("stability",)).to_frame().iloc[0]
    assert (r["first"], r.stability, r.verdict) == ("lucky+B4", "fail", "fragile") and "behind with seed 1" in r.reasons
    steady = pd.concat([run_of("sim-terse", "lucky", 0), run_of("sim-terse", "lucky", 1),
                        run_of("sim-omit", "steady", 0), run_of("sim-omit", "steady", 1)], ignore_index=True)
    r = verdict(demo.studies, steady, metrics=("chexpert_f1_14",), seed=0, checks=("stability",)).to_frame().iloc[0]
    assert r.stability == "pass" and "ahead with 2 of 2 seeds" in v_detail(demo, steady)


def v_detail(demo, gens):
    v = verdict(demo.studies, gens, metrics=("chexpert_f1_14",), seed=0, checks=("stability",))
    return v.evidence.set_index("check").loc["stability", "detail"]


def test_reps_default_is_enough_for_holm_and_pairs_narrow_the_family(demo):
    g = demo.generations[demo.generations.policy == "B4"]
    v = verdict(demo.studies, g, metrics=("bleu_4", "rouge_l"), checks=("stability",), seed=0)
    assert v.params["reps"] >= 4 * len(v.to_frame()) / 0.05 and not v.params["warnings"]
    v1 = verdict(demo.studies, g, metrics=("bleu_4",), pairs=[("sim-omit+B4", "sim-terse+B4")], checks=(), seed=0)
    t = v1.to_frame()
    assert len(t) == 1 and {t.iloc[0]["first"], t.iloc[0]["second"]} == {"sim-omit+B4", "sim-terse+B4"}
    assert t[list(CHECKS)].iloc[0].str.startswith("not run: not asked").all()


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
    page = run_audit(demo.studies, g, tmp_path, stages=["verdict", "corpus"],
                     params={"reps": 400}).read_text(encoding="utf-8")
    assert page.index("Verdicts") < page.index("Corpus overview") and "comparisons:" in page and "not shown" in page


def test_the_audit_manifest_keeps_each_stage_time(demo, tmp_path):
    import json
    from cxr_audit.audit import run_audit
    g = demo.generations[demo.generations.policy == "B4"]
    run_audit(demo.studies, g, tmp_path, stages=["corpus", "concentration"], params={"reps": 50})
    m = json.loads((tmp_path / "manifest.json").read_text())
    assert m["command"] == "audit" and set(m["stage_seconds"]) == {"corpus", "concentration"}
    assert all(isinstance(t, float) and t >= 0 for t in m["stage_seconds"].values()) and m["failed_stages"] == []
    assert m["outputs"]["report"]["path"] == "report.html" and m["studies"] == demo.studies.study_id.nunique()
