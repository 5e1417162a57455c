("Integration tests of `cxr_audit.labels`: fixture accuracy, heart-size wording, trigger detection, alignment, "
 "readers, the entry points.")
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cxr_audit.core import InputError, config_label, sha256_frame
from cxr_audit.corpus import to_generations
from cxr_audit.labels import (CHEXPERT_5, CHEXPERT_13, CHEXPERT_14, FileLabeler, Labeler, default_labeler,
                              check_text_provenance, from_wide, label_reports, parse_expected, read_chexbert_csv,
                              read_chexpert_csv, state_accuracy, to_binary, to_wide, trace_label_triggers, get_labeler)
from cxr_audit.label_audit import (SCORES, LabelAudit, TraceAudit, align_labels, exclusion_sensitivity,
                                   findings_to_labels, label_audit, label_generations, naive_cardiac_labeler,
                                   probe_labeler, probe_summary, reference_texts, run_names, trace_audit,
                                   reference_profile)
from cxr_audit.stats import UnderpoweredWarning
from cxr_audit.synth import make_demo_corpus

FIX = Path(__file__).parent / "fixtures" / "labels"


@pytest.fixture(scope="module")
def sentences():
    return pd.read_csv(FIX / "sentences.csv", keep_default_na=False)


@pytest.fixture(scope="module")
def reports():
    return pd.read_csv(FIX / "reports.csv", keep_default_na=False)


@pytest.fixture(scope="module")
def demo():
    return make_demo_corpus(40, seed=3)


# --- the fixture: size, coverage and accuracy --------------------------------------------------------------------

def test_fixture_size_and_coverage(sentences, reports):
    assert len(sentences) >= 200 and len(reports) >= 50
    assert reports.text.str.count(r"\.").ge(2).mean() > 0.9          # multi-sentence reports
    exp = parse_expected(sentences.expected, ids=sentences.sentence_id)
    for lab in CHEXPERT_13:  # every observation positive, negative and uncertain
        assert {1.0, 0.0, -1.0} <= set(exp[lab].dropna()), lab


# The fixture's expected states are what the sentences mean: the clinical profile reads them (the chexpert profile
# departs from them where the official labeler's definitions do; see the profile tests below).
CLINICAL = Labeler(profile="clinical")


def test_sentence_accuracy(sentences):
    acc = state_accuracy(CLINICAL(sentences.text, ids=sentences.sentence_id),
                         parse_expected(sentences.expected, ids=sentences.sentence_id), labels_order=CHEXPERT_13)
    assert (acc.accuracy >= 0.9).all(), acc
    assert acc.correct.sum() / acc.n.sum() >= 0.95


def test_report_accuracy(reports):
    acc = state_accuracy(CLINICAL(reports.text, ids=reports.report_id),
                         parse_expected(reports.expected, ids=reports.report_id))
    assert (acc.accuracy >= 0.9).all(), acc
    assert acc.set_index("label").loc["No Finding", "n"] >= 10


def test_accuracy_threshold_can_fail(sentences):
    # a labeler that negates nothing must fall below the thresholds the tests above use
    blind = Labeler(triggers={"negation": {"forward": [], "backward": [], "bidirectional": []}})
    acc = state_accuracy(blind(sentences.text, ids=sentences.sentence_id),
                         parse_expected(sentences.expected, ids=sentences.sentence_id), labels_order=CHEXPERT_13)
    assert (acc.accuracy < 0.9).any()


# --- normal heart-size wording -------------------------------------------------------------------------------------

NORMAL_HEART = ["The heart size is within normal limits.", "Heart size is within normal limits.",
                "The heart is normal in size.", "Normal cardiac silhouette.", "Heart size is normal.",
                "Heart size normal.", "Normal heart size.",
                "The cardiac silhouette is normal in size.", "The heart is not enlarged.", "Heart size normal XXXX.",
                "The cardiomediastinal silhouette is within normal limits.",
                "Normal heart size and mediastinal contours.",
                "FINDINGS: The heart size is within normal limits. The lungs are clear.\nIMPRESSION: No acute process."]


@pytest.mark.parametrize("text", NORMAL_HEART)
def test_normal_heart_wording_is_never_cardiomegaly(text):
    w = to_wide(label_reports([text]))
    assert w.loc[0, "Cardiomegaly"] == 0.0


def test_heart_wording_with_real_findings():
    w = to_wide(label_reports(["Heart size is within normal limits, but there is a small right effusion.",
                               "The heart size is within normal limits. Moderate cardiomegaly on the lateral view.",
                               "Borderline heart size."]))
    assert w.loc[0, ["Cardiomegaly", "Pleural Effusion"]].tolist() == [0.0, 1.0]
    assert w.loc[1, "Cardiomegaly"] == 1.0  # a positive mention wins over normal wording (documented precedence)
    assert w.loc[2, "Cardiomegaly"] == -1.0


def test_sim_template_never_cardiomegaly(demo):
    g = demo.generations
    tmpl = g[g.system == "sim-template"]
    lab = label_generations(tmpl)
    pos = lab[(lab.label == "Cardiomegaly") & (lab.state == 1.0)]
    # every positive comes from a real cardiac phrase, never from the template's normal wording
    assert not pos.evidence.str.contains("normal", case=False).any()
    assert pos.evidence.str.contains("cardiomegaly|enlarge", case=False).all()


# --- the naive labeler's trigger -----------------------------------------------------------------------------------

def test_probe_finds_the_naive_trigger():
    ps = probe_summary(probe_labeler(naive_cardiac_labeler())).set_index("label")
    assert ps.loc["Cardiomegaly", "triggers"] >= 5
    assert ps.drop("Cardiomegaly").triggers.sum() == 0
    assert probe_summary(probe_labeler(CLINICAL)).triggers.sum() == 0


def test_trace_detects_the_naive_trigger(demo):
    naive_lab = label_generations(demo.generations, labeler=naive_cardiac_labeler())
    texts = dict(zip(demo.generations.sample_id, demo.generations.hypothesis))
    tr = trace_label_triggers(naive_lab, texts=texts)
    f = tr.flags.set_index(["system", "label"])
    row = f.loc[("sim-template+B4", "Cardiomegaly")]
    assert row.dominated and row.top_evidence == "the heart size is within normal limits"
    assert row.normal_wording_positives >= 0.8 * row.positives and row.with_term <= 0.2 * row.positives
    # a system that really describes cardiomegaly has positives with the term
    assert f.loc[("sim-verbose+B4", "Cardiomegaly"), "with_term"] > 0
    ours = label_generations(demo.generations)
    assert trace_label_triggers(ours).flags.normal_wording_positives.sum() == 0


def test_trace_provenance_hashes(demo):
    lab = label_generations(demo.generations.head(30))
    tr = trace_label_triggers(lab)
    assert tr.rows.row_sha256.is_unique and tr.rows.row_sha256.str.len().eq(64).all()
    again = trace_label_triggers(label_generations(demo.generations.head(30)))
    assert tr.rows.row_sha256.tolist() == again.rows.row_sha256.tolist()


# --- alignment -----------------------------------------------------------------------------------------------------

def test_alignment_counts_by_hand():
    ref = pd.DataFrame({"Cardiomegaly": [1, 1, 0, np.nan], "Edema": [0, 1, -1, 1]}, index=["a", "b", "c", "d"])
    pred = pd.DataFrame({"Cardiomegaly": [1, 0, 1, np.nan], "Edema": [np.nan, 1, 1, -1]}, index=["a", "b", "c", "d"])
    al = align_labels(ref, {"s": pred}, labels=["Cardiomegaly", "Edema"])
    pl = al.per_label().set_index("label")
    assert pl.loc["Cardiomegaly", ["tp", "fp", "fn", "tn"]].tolist() == [1, 1, 1, 1]
    assert pl.loc["Edema", ["tp", "fp", "fn", "tn"]].tolist() == [1, 1, 1, 1]  # ref -1 is negative; pred -1 is negative
    sm = al.summary(reps=50).set_index("metric")
    assert sm.loc["micro_f1", "estimate"] == pytest.approx(2 * 2 / (2 * 2 + 2 + 2))
    alu = align_labels(ref, {"s": pred}, labels=["Edema"], uncertain_positive=True).per_label().iloc[0]
    assert [alu.tp, alu.fp, alu.fn, alu.tn] == [3, 0, 0, 1]
    # per-case sufficient statistics sum to the per-label totals
    S = al.case_stats("s", kind="micro")
    assert S.sum(0).tolist() == [2, 2, 2]


def test_alignment_matching_is_reported_not_guessed():
    ref = from_wide(pd.DataFrame({"Edema": [1.0, 0.0]}, index=["s1", "s2"]))
    pred = pd.DataFrame({"Edema": [1.0, 0.0, 1.0]}, index=["g1", "g2", "g3"])
    al = align_labels(ref, {"x": pred}, case_map={"g1": "s1", "g2": "S2", "g3": "s1"})
    assert al.matching.status.tolist() == ["matched", "no reference", "duplicate prediction"]
    assert al.counts.reference_id.unique().tolist() == ["s1"]
    with pytest.raises(InputError, match="case 'g2': no reference"):
        align_labels(ref, {"x": pred}, case_map={"g1": "s1", "g2": "S2", "g3": "s1"}, strict=True)


def test_chexpert5_and_binary_mapping():
    assert to_binary([1, 0, -1, np.nan]).tolist() == [1, 0, 0, 0]
    ref = pd.DataFrame({c: [1.0] for c in CHEXPERT_14}, index=["a"])
    al = align_labels(ref, ref, labels=CHEXPERT_5)
    assert set(al.counts.label) == set(CHEXPERT_5) and al.counts.tp.sum() == 5


def test_exclusion_sensitivity_sign_flip():
    idx = [f"s{i}" for i in range(40)]
    ref = pd.DataFrame(0.0, index=idx, columns=list(CHEXPERT_5)); ref.iloc[:30,
                                                                           ref.columns.get_loc("Cardiomegaly")] = 1.0
    ref.iloc[5:25, ref.columns.get_loc("Pleural Effusion")] = 1.0
    a = pd.DataFrame(0.0, index=idx, columns=ref.columns); a["Cardiomegaly"] = 1.0
    b = pd.DataFrame(0.0, index=idx, columns=ref.columns); b.iloc[5:25:3, b.columns.get_loc("Pleural Effusion")] = 1.0
    es = exclusion_sensitivity(align_labels(ref, {"a": a, "b": b}, labels=CHEXPERT_5), compare=("a", "b"), reps=200,
                               seed=1)
    assert es.difference[0] > 0 > es.difference[1]
    assert es.sign_flip.tolist() == [False, True]
    # no flip when the excluded label does not drive the difference
    es2 = exclusion_sensitivity(align_labels(ref, {"a": b, "b": a * 0}, labels=CHEXPERT_5), reps=0)
    assert not es2.sign_flip.any()


# --- readers -------------------------------------------------------------------------------------------------------

def test_read_chexpert_csv():
    lab = read_chexpert_csv(FIX / "chexpert_labeled.csv")
    w = to_wide(lab)
    assert list(w.columns) == list(CHEXPERT_14) and len(w) == 8
    assert w.loc[0, "Cardiomegaly"] == 1.0 and w.loc[4, "No Finding"] == 1.0 and w.loc[5, "Atelectasis"] == -1.0
    assert w.loc[7].isna().all() and lab.text[lab.text_id == 7].isna().all()


def test_read_chexbert_csv_both_encodings(tmp_path):
    cb = to_wide(read_chexbert_csv(FIX / "chexbert_labeled.csv"))
    assert cb.loc[0, ["Cardiomegaly", "No Finding", "Edema"]].tolist()[:2] == [0.0,
                                                                               1.0] and np.isnan(cb.loc[0, "Edema"])
    assert cb.loc[1, ["Cardiomegaly", "Edema", "Pleural Effusion"]].tolist() == [1.0, -1.0, 0.0]
    # the same labels in the CheXpert encoding read the same
    raw = pd.read_csv(FIX / "chexbert_labeled.csv")
    enc = raw.copy()
    for c in CHEXPERT_14: enc[c] = raw[c].map({0: np.nan, 1: 1.0, 2: 0.0, 3: -1.0})
    enc.to_csv(tmp_path / "cb.csv", index=False)
    assert to_wide(read_chexbert_csv(tmp_path / "cb.csv")).equals(cb)
    raw.loc[0, "Edema"] = 7
    raw.to_csv(tmp_path / "bad.csv", index=False)
    with pytest.raises(InputError, match="column 'Edema'"):
        read_chexbert_csv(tmp_path / "bad.csv", encoding="classes")


def test_provenance_check():
    given = pd.read_csv(FIX / "chexpert_texts.csv", keep_default_na=False)
    prov = check_text_provenance(read_chexpert_csv(FIX / "chexpert_labeled.csv", ids=given.text_id), given)
    assert prov.status.tolist().count("different") == 1
    ws = check_text_provenance({"a": "No  effusion.", "b": "x"},
                               {"a": "No effusion.", "c": "y"}).set_index("text_id").status
    assert ws.to_dict() == {"a": "whitespace only", "b": "missing", "c": "missing"}


# --- bad inputs ----------------------------------------------------------------------------------------------------

def test_bad_inputs_are_flagged_not_raised():
    texts = [None, float("nan"), "", "   \n", 42, ["a list"], b"bytes", "<unk>", "[PAD] <pad>", "No effusion."]
    lab = label_reports(texts)
    flags = [None if pd.isna(f) else f for f in lab.drop_duplicates("text_id").flag]
    assert flags == ["missing", "missing", "empty", "empty", "not text", "not text", "not text", "no words", "no words",
                     None]
    bad = lab[lab.text_id < 9]
    assert bad.state.isna().all() and bad.flag.notna().all()
    good = to_wide(lab).loc[9]
    assert good["Pleural Effusion"] == 0.0 and good["No Finding"] == 1.0


def test_determinism_and_cache():
    texts = ["Mild cardiomegaly. No effusion.", "Possible small left pneumothorax.", None] * 3
    a, b = label_reports(texts), Labeler(cache_size=0)(texts)
    assert sha256_frame(a) == sha256_frame(b)


def test_cues_do_not_hide_phrases(sentences, reports, demo):
    # the cue pre-filter is only a speed-up: without it every sentence gets the same mentions
    no_cues = Labeler(phrases={"observations": {o: {"cues": []} for o in CHEXPERT_13}})
    with_cues = Labeler()
    texts = (list(sentences.text) + list(reports.text) + list(reference_texts(demo.studies))
             + list(demo.generations.hypothesis.head(200)))
    assert sha256_frame(with_cues(texts).drop(columns="source")) == sha256_frame(no_cues(texts).drop(columns="source"))


# --- ground truth and the entry points -----------------------------------------------------------------------------

def test_findings_to_labels_and_reference_texts(demo):
    truth = to_wide(findings_to_labels(demo.findings))
    f = demo.findings
    r = f.iloc[0]
    assert truth.loc[r.study_id, r.observation] == {"present": 1.0, "uncertain": -1.0, "absent": 0.0}[r.status]
    refs = reference_texts(demo.studies)
    assert not refs.str.contains("INDICATION").any()


@pytest.fixture(scope="module")
def audit(demo):
    return label_audit(demo.studies, demo.generations, demo.findings, reps=100, seed=3, contrast="naive")


def test_label_audit_equals_its_steps(demo, audit):
    # the entry point gives exactly what the lower-level functions give with the same reps and seed
    assert isinstance(audit, LabelAudit)
    ref_lab = label_reports(reference_texts(demo.studies))
    al = align_labels(ref_lab, label_generations(demo.generations),
                      case_map=demo.generations[["sample_id", "study_id"]])
    by_hand = al.summary(reps=100, seed=3)
    mine = audit.to_frame().query("reference == 'reference-report labels' and labels == '14'")
    assert mine[["system", "metric", "estimate", "ci_low", "ci_high"]].values.tolist() == \
        by_hand[["system", "metric", "estimate", "ci_low", "ci_high"]].values.tolist()
    truth = align_labels(findings_to_labels(demo.findings, study_ids=reference_texts(demo.studies).index),
                         label_generations(demo.generations), case_map=demo.generations[["sample_id", "study_id"]])
    five = audit.summary().query("reference == 'ground truth' and labels == '5'")
    by_hand5 = truth.summary(reps=100, seed=3, labels=CHEXPERT_5).query("metric == 'micro_f1'")
    assert five[["estimate", "ci_low", "ci_high"]].values.tolist() == by_hand5[["estimate", "ci_low",
                                                                                "ci_high"]].values.tolist()
    assert set(audit.to_frame().metric) == set(SCORES) and set(audit.summary().metric) == {"micro_f1"}
    # the contrast labeler finds the trigger, ours does not; the exclusion flips only under the contrast labeler
    assert (audit.contrast.trace.flagged().label.eq("Cardiomegaly").any()
            and audit.trace.flags.normal_wording_positives.sum() == 0)
    ex = audit.exclusion
    assert ex.labeler.tolist() == ["naive-mention"] * 2 + ["cxr_audit:chexpert"] * 2
    assert bool(ex.sign_flip.iloc[1]) and not bool(ex.sign_flip.iloc[3])


def test_label_audit_compare_is_holm_consistent(audit):
    with pytest.warns(UnderpoweredWarning):
        res = audit.compare()  # 10 pairs, 100 resamples: nothing can be significant
    t = res.to_frame()
    assert (t.significant == (t.p_holm < 0.05)).all() and not t.significant.any()
    with pytest.warns(UnderpoweredWarning):
        assert audit.compare(baseline="sim-verbose+B4", against="truth").to_frame()["first"].eq("sim-verbose+B4").all()


def test_label_audit_save_and_plots(tmp_path, audit):
    files = audit.save(tmp_path / "out", inputs={"note": pd.DataFrame({"a": [1]})})
    assert {"summary", "exclusion", "probes", "chart", "manifest"} <= set(files)
    assert pd.read_csv(files["summary"]).shape[0] == len(audit.to_frame())
    for kind in ("counts", "triggers"):
        assert type(audit.plot(kind)).__module__.startswith("altair")
    assert "sim-" in audit.headline() and audit._repr_markdown_().startswith("With `cxr_audit:chexpert` labels")


def test_label_audit_is_deterministic_and_seeded(demo):
    small = demo.generations[demo.generations.study_id.isin(demo.studies.study_id.head(10))]
    a = label_audit(demo.studies, small, reps=50, seed=7).to_frame()
    b = label_audit(demo.studies, small, reps=50, seed=7).to_frame()
    c = label_audit(demo.studies, small, reps=50).to_frame()            # DEFAULT_SEED
    pd.testing.assert_frame_equal(a, b)
    assert np.array_equal(a.estimate, c.estimate, equal_nan=True) and not np.array_equal(a.ci_low, c.ci_low,
                                                                                         equal_nan=True)


def test_trace_audit_of_the_official_csv(tmp_path):
    given = pd.read_csv(FIX / "chexpert_texts.csv", keep_default_na=False)
    ta = trace_audit(FIX / "chexpert_labeled.csv", given, min_positives=3)
    assert isinstance(ta, TraceAudit) and "1 different" in ta.headline() and "Cardiomegaly" in ta.headline()
    assert ta.summary().label.tolist() == ["Cardiomegaly"]
    files = ta.save(tmp_path)
    assert (files["chart"].name == "trigger_phrases.svg"
            and pd.read_csv(files["provenance"]).status.eq("different").sum() == 1)
    with pytest.raises(InputError, match="pass id_column"):
        trace_audit(FIX / "chexpert_labeled.csv", given.head(3))
    # trace_label_triggers' defaults
    assert ta.trace.min_positives == 3 and (ta.trace.dominance, ta.trace.by) == (0.5, "sentence")
    with pytest.raises(TypeError):
        trace_audit(FIX / "chexpert_labeled.csv", given, None, 0.5)       # its options are keyword-only


def test_runs_are_named_by_config_label_everywhere(demo):
    "Every run is `system+policy`, as in the concentration, uncertainty and metrics sections, even with one policy."
    g = to_generations(demo.generations)
    assert run_names(g).tolist() == config_label(g.system, g.policy).tolist()
    assert set(label_generations(g).system) == set(config_label(g.system, g.policy))
    assert run_names(g.drop(columns="policy")).tolist() == g.system.tolist()      # no policy column: the bare system


# --- real wording (issue 17): stability statements, No Finding, probes, the official sample ---------------------

IU = Path(__file__).parent / "fixtures" / "iu_real" / "iu_valid_rexrank_sample.json"
OFFICIAL = FIX / "chexpert_official_sample.csv"
PATHOLOGY = [lab for lab in CHEXPERT_13 if lab != "Support Devices"]


@pytest.fixture(scope="module")
def iu_texts():
    raw = json.loads(IU.read_text())
    return reference_texts(pd.DataFrame({"study_id": list(raw),
                                         "findings": [v["section_findings"] for v in raw.values()],
                                         "impression": [v["section_impression"] for v in raw.values()]}))


# normal or stability statements about normal anatomy, written after real wording: never positive or uncertain
STABLE_NORMAL = ["Stable cardiomediastinal silhouette.", "Stable cardiomediastinal silhouette with normal heart size.",
                 "The cardiomediastinal silhouette is unchanged.", "Heart size and mediastinal contours are stable.",
                 "The mediastinum is stable.", "Unchanged mediastinal contours.",
                 "Mediastinal contours appear similar to the prior.", "No interval change in the cardiac silhouette.",
                 "No interval change.", "Stable appearance of the chest.",
                 "Heart size normal.", "Heart size and pulmonary vascular markings appear within limits of normal."]
# stability of an abnormality is still the abnormality
STABLE_ABNORMAL = [("Stable cardiomegaly.", "Cardiomegaly"), ("Stable enlarged heart.", "Cardiomegaly"),
                   ("Unchanged small left effusion.", "Pleural Effusion"),
                   ("Stable prominent mediastinal contours.", "Enlarged Cardiomediastinum"),
                   ("Mild cardiomegaly, unchanged from prior.", "Cardiomegaly"),
                   # a stability word first, the abnormality after it in the same clause
                   ("Cardiac silhouette is unchanged and enlarged.", "Cardiomegaly"),
                   ("The heart remains stable in size, mildly enlarged.", "Cardiomegaly"),
                   ("Stable and widened mediastinal contours.", "Enlarged Cardiomediastinum")]


@pytest.mark.parametrize("text", STABLE_NORMAL)
def test_normal_and_stability_wording_claims_no_finding(text):
    w = to_wide(CLINICAL([text])).iloc[0]
    assert not w[PATHOLOGY].isin([1.0, -1.0]).any(), w.dropna()
    assert w["No Finding"] == 1.0


@pytest.mark.parametrize("text,label", STABLE_ABNORMAL)
def test_stable_abnormality_stays_positive(text, label):
    w = to_wide(label_reports([text])).iloc[0]
    assert w[label] == 1.0 and np.isnan(w["No Finding"])


def test_probes_cover_every_label_and_all_pass():
    pb = probe_labeler(CLINICAL)
    assert set(pb.label) == set(CHEXPERT_14)
    for lab in CHEXPERT_13:
        e = pb[pb.label == lab]
        assert {1.0, 0.0, -1.0} <= set(e.expected.dropna()) and (e.kind == "stable").any(), lab
    assert pb.ok.all(), pb[~pb.ok]
    assert not pb.trigger.any()


def test_probes_catch_stability_read_as_doubt():
    # the rule the labeler had before issue 17: stability wording as uncertain cardiomegaly
    doubt_cm = {"stable": [], "uncertain": ["<STABLE> (?:the )?<CM>"]}
    doubt = Labeler(profile="clinical", phrases={"observations": {"Cardiomegaly": doubt_cm}})
    ps = probe_summary(probe_labeler(doubt)).set_index("label")
    assert ps.loc["Cardiomegaly", "triggers"] >= 2 and ps.drop("Cardiomegaly").triggers.sum() == 0


def test_real_reports_trace_shows_no_normal_or_stability_trigger(iu_texts):
    assert len(iu_texts) == 50
    tr = trace_label_triggers(CLINICAL(iu_texts), texts=iu_texts, min_positives=5)
    assert len(tr.flagged()) == 0
    assert tr.flags.normal_wording_positives.sum() == 0 and tr.flags.normal_wording_uncertain.sum() == 0
    assert tr.flags.set_index("label").loc["Cardiomegaly", "positives"] > 0      # real findings are still found


def test_trace_catches_stability_read_as_doubt_on_real_reports(iu_texts):
    back = ["<STABLE>(?: appearance of)?(?: the)? <CM>", "<CM>(?: <BE>)? <STABLE>"]
    doubt = Labeler(profile="clinical",
                    phrases={"observations": {"Enlarged Cardiomediastinum": {"stable": [], "uncertain": back}}})
    tr = trace_label_triggers(doubt(iu_texts), texts=iu_texts, min_positives=5)
    row = tr.flagged().set_index("label").loc["Enlarged Cardiomediastinum"]
    assert row.normal_wording_uncertain >= 5 and "stability wording" in row.verdict


def test_real_reports_no_finding_consistent_with_the_labels(iu_texts):
    w = to_wide(CLINICAL(iu_texts))
    pathology = w[PATHOLOGY].isin([1.0, -1.0]).any(axis=1)
    assert ((w["No Finding"] == 1.0) == ~pathology).all()
    assert w["No Finding"].isin([1.0]).sum() >= 10 and pathology.sum() >= 10       # both kinds of report are there
    assert not w["No Finding"].isin([0.0, -1.0]).any()                           # never 0 or -1: blank otherwise


def test_other_findings_block_no_finding_only_when_asked():
    text = ["Degenerative changes of the thoracic spine. Lungs are clear."]
    assert to_wide(CLINICAL(text)).iloc[0]["No Finding"] == 1.0
    strict = Labeler(profile="clinical", phrases={"no_finding_ignores": ["Support Devices"]})
    assert np.isnan(to_wide(strict(text)).iloc[0]["No Finding"])
    assert np.isnan(to_wide(label_reports(text)).iloc[0]["No Finding"])            # the chexpert profile: they block it
    assert to_wide(label_reports(["Pacemaker in place. Lungs are clear."])).iloc[0]["No Finding"] == 1.0


def test_agreement_with_the_official_labelers_sample():
    official = read_chexpert_csv(OFFICIAL)
    assert official.text_id.nunique() == 4
    ours = label_reports(official.groupby("text_id", sort=False).text.first())
    pl = align_labels(official, ours).per_label().set_index("label")
    assert pl[["fp", "fn"]].sum().sum() == 0 and pl.tp.sum() == 6
    wo, wu = to_wide(official), to_wide(ours)
    differ = ~((wo == wu) | (wo.isna() & wu.isna()))
    cells = sorted((i, lab) for i, lab in zip(*np.nonzero(differ.to_numpy())))
    assert [(int(i), wo.columns[j]) for i, j in cells] == [(0, "Lung Opacity"), (0, "Consolidation"),
                                                           (3, "Lung Opacity"), (3, "Consolidation")]
    d = differ.to_numpy()
    assert np.isnan(wo.to_numpy()[d]).all() and (wu.to_numpy()[d] == 0.0).all()      # blank there, 0 here


# --- profiles: the official definitions (chexpert, the default), the clinical reading, and the official quirks -------

OFFICIAL_NO_FINDING = ["Calcified granuloma.", "Degenerative changes of the spine.", "Emphysema.", "Mild scoliosis.",
                       "Small hiatal hernia.", "Atherosclerotic calcification of the aorta.", "Mild thoracic kyphosis."]


@pytest.mark.parametrize("text", OFFICIAL_NO_FINDING)
def test_chexpert_profile_other_findings_block_no_finding(text):
    assert np.isnan(to_wide(label_reports([text + " Lungs are clear."])).iloc[0]["No Finding"])
    assert to_wide(CLINICAL([text + " Lungs are clear."])).iloc[0]["No Finding"] == 1.0


def test_chexpert_profile_follows_the_official_definitions():
    w = to_wide(label_reports(["Stable cardiomediastinal silhouette.", "Findings of CHF.",
                               "Heart size at the upper limits of normal.", "Bibasilar scarring.",
                               "Increased interstitial markings.", "Sternotomy wires.", "Right PICC line."])).to_numpy()
    col = {l: i for i, l in enumerate(CHEXPERT_14)}
    assert w[0, col["Enlarged Cardiomediastinum"]] == -1.0 and np.isnan(w[0, col["No Finding"]])   # stability is doubt
    assert w[1, col["Edema"]] == 1.0 and w[1, col["Cardiomegaly"]] == -1.0                      # the chf rule
    assert w[2, col["Cardiomegaly"]] == 0.0  # upper limits of normal
    assert w[3, col["Lung Opacity"]] == 1.0 and w[4, col["Lung Opacity"]] == 1.0                # its opacity vocabulary
    assert np.isnan(w[5, col["Support Devices"]]) and w[6, col["Support Devices"]] == 1.0      # its device vocabulary


NORMAL_HEART = ["The heart size is within normal limits.", "Heart size within normal limits.",
                "The heart size and pulmonary vascularity appear within normal limits.", "Normal heart size.",
                "The heart is normal in size.", "Heart size and mediastinal contours are within normal limits."]


@pytest.mark.parametrize("text", NORMAL_HEART)
def test_normal_heart_wording_is_cardiomegaly_only_with_the_official_quirks(text):
    for lab in (default_labeler(), CLINICAL):
        assert to_wide(lab([text])).iloc[0]["Cardiomegaly"] != 1.0, (lab.name, text)
    quirks = to_wide(default_labeler(official_quirks=True)([text])).iloc[0]["Cardiomegaly"]
    assert quirks == (1.0 if "within normal limits" in text and "heart size" in text.lower() else 0.0)


def test_profiles_name_every_label_table(demo):
    for lab in (default_labeler(), CLINICAL, default_labeler(official_quirks=True)):
        assert set(lab(["Mild cardiomegaly."]).source) == {lab.name}
        assert set(label_generations(demo.generations.head(5), lab).source) == {lab.name}
    assert {default_labeler().name, CLINICAL.name, default_labeler(official_quirks=True).name} == \
        {"cxr_audit:chexpert", "cxr_audit:clinical", "cxr_audit:chexpert+quirks"}
    with pytest.raises(InputError, match="labeler profile 'official' is not one of"):
        Labeler(profile="official")
    with pytest.raises(InputError, match="needs the 'chexpert' profile"):
        default_labeler("clinical", official_quirks=True)


def test_real_reports_no_finding_follows_the_official_rule(iu_texts):
    """chexpert: No Finding exactly when no observation but Support Devices, and no other finding, is positive or
    uncertain."""
    lab = default_labeler()
    w = to_wide(lab(iu_texts))
    other = [any(m.label == "Other Finding" and m.state != 0.0 for m, _, _ in lab._report_mentions(t))
             for t in iu_texts]
    blocked = w[PATHOLOGY].isin([1.0, -1.0]).any(axis=1).to_numpy() | np.array(other)
    assert ((w["No Finding"] == 1.0).to_numpy() == ~blocked).all()
    assert sum(other) >= 5 and (w["No Finding"] == 1.0).sum() < (to_wide(CLINICAL(iu_texts))["No Finding"] == 1.0).sum()


# --- per-entry alignment and one "uncertain" convention (issue 18) ------------------------------------------------

def _entry_generations(studies, texts):
    "Two runs over every image entry of `studies` (one row per entry, `entry_id` as the cohort gives it)."
    from cxr_audit.cohort import Cohort
    e = Cohort(studies).explode_images().studies
    rows = [{"sample_id": f"m/{p}/0/{r.entry_id}", "study_id": r.study_id, "entry_id": r.entry_id, "system": "m",
             "policy": p, "hypothesis": texts(p, r)} for p in ("B4", "K50") for r in e.itertuples()]
    return to_generations(pd.DataFrame(rows)), e


def test_two_entries_of_one_study_are_both_scored():
    refs = pd.Series({"s1": "Mild cardiomegaly. No effusion.", "s2": "Small left pleural effusion."})
    g = to_generations(pd.DataFrame({"sample_id": ["a", "b", "c"], "study_id": ["s1", "s1", "s2"],
                                     "entry_id": ["s1/0", "s1/1", "s2/0"], "system": "m", "policy": "B4",
                                     "hypothesis": ["The heart is enlarged.", "No acute disease.",
                                                    "Small left pleural effusion."]}))
    ref_lab, gen_lab = label_reports(refs), label_generations(g)
    cmap = g[["sample_id", "study_id"]]
    al = align_labels(ref_lab, gen_lab, case_map=cmap)
    assert al.by_entry and al.matching.status.tolist() == ["matched"] * 3
    assert al.matching.entry_id.tolist() == ["s1/0", "s1/1",
                                             "s2/0"] and al.matching.reference_id.tolist() == ["s1", "s1", "s2"]
    ec = al.entry_counts(by_label=False).set_index("entry_id")
    # the second entry of s1 misses the cardiomegaly; the first finds it; s2 finds its effusion
    assert ec.loc["s1/0", ["tp", "fn"]].tolist() == [1, 0] and ec.loc["s1/1", "fn"] == 1 and ec.loc["s2/0", "tp"] == 1
    assert al.summary(reps=50).n_cases.iloc[0] == 3
    # without entry_id: today's behaviour, the second entry of s1 is a duplicate prediction and is not scored
    old = align_labels(ref_lab, gen_lab.drop(columns="entry_id"), case_map=cmap)
    assert not old.by_entry and old.matching.status.tolist() == ["matched", "duplicate prediction", "matched"]
    assert old.summary(reps=50).n_cases.iloc[0] == 2
    # the same entry twice is still a duplicate
    twice = pd.concat([gen_lab, gen_lab[gen_lab.text_id == "a"].assign(text_id="a2")])
    st = align_labels(ref_lab, twice, case_map={**dict(zip(cmap.sample_id, cmap.study_id)),
                                                "a2": "s1"}).matching.status.tolist()
    assert st == ["matched", "matched", "matched", "duplicate prediction"]


def test_entry_counts_sum_to_the_micro_f1_and_resample_by_study():
    raw = json.loads(IU.read_text())
    from cxr_audit.corpus import load_iu_xray
    studies = load_iu_xray(IU)
    refs = reference_texts(studies)
    ids = list(refs.index); other = dict(zip(ids, ids[1:] + ids[:1]))
    g, e = _entry_generations(studies, lambda p, r: refs[other[r.study_id]] if p == "K50" else refs[r.study_id])
    assert len(raw) == 50 and len(e) > len(studies)                 # the real fixture has several images per study
    audit = label_audit(studies, g, reps=200, seed=2026, clusters="study_id")
    al = audit.alignment
    assert (al.matching.status == "matched").all() and len(al.matching) == len(g)
    for system, part in al.entry_counts(by_label=False).groupby("system"):
        assert len(part) == len(e)
        tp, fp, fn = part[["tp", "fp", "fn"]].sum()
        row = "system == @system and labels == '14' and reference == 'reference-report labels'"
        est = audit.summary().query(row).estimate.item()
        assert abs(2 * tp / (2 * tp + fp + fn) - est) < 1e-12
    # per label, the counts are those of per_label()
    pl = al.per_label().set_index(["system", "label"])[["tp", "fp", "fn"]]
    by_entry = al.entry_counts().groupby(["system", "label"])[["tp", "fp", "fn"]].sum()
    assert by_entry.loc[pl.index].equals(pl)
    # the references as hypotheses score 1 on every entry; clustering by study widens nothing away from 1
    assert audit.summary().query("system == 'm+B4'").estimate.eq(1.0).all()
    # clustered by study: one cluster per study, so the interval differs from resampling entries one by one
    k50 = "system == 'm+K50' and metric == 'micro_f1'"
    by_entry_ci = al.summary(reps=200, seed=2026).query(k50)[["ci_low", "ci_high"]].values
    by_study_ci = al.summary(reps=200, seed=2026, clusters="reference_id").query(k50)[["ci_low", "ci_high"]].values
    assert not np.allclose(by_entry_ci, by_study_ci)


def test_one_uncertain_convention_stated_on_every_f1_table(demo, audit):
    import inspect
    from cxr_audit.labels import UNCERTAIN_POSITIVE, uncertain_note
    from cxr_audit.metrics import CheXpertF1
    assert UNCERTAIN_POSITIVE is False
    for f in (to_binary, align_labels, label_audit, CheXpertF1):
        assert inspect.signature(f).parameters["uncertain_positive"].default is UNCERTAIN_POSITIVE, f
    note = uncertain_note(False)
    assert note == "uncertain (-1) counted as negative" and uncertain_note(True) == "uncertain (-1) counted as positive"
    for table in (audit.to_frame(), audit.summary(), audit.exclusion, audit.alignment.per_label(),
                  audit.alignment.summary(reps=20)):
        assert set(table.convention) == {note}
    assert note in audit.headline() and note in audit.alignment._repr_markdown_()
    flipped = align_labels(from_wide(pd.DataFrame({"Edema": [-1.0]}, index=["s1"])),
                           from_wide(pd.DataFrame({"Edema": [1.0]}, index=["s1"])), labels=["Edema"],
                           uncertain_positive=True)
    assert flipped.per_label()[["tp", "fp", "convention"]].values.tolist() == [[1, 0, uncertain_note(True)]]


# --- speed-ups that must not change a number (issue 23) ----------------------------------------------------------

def _pivot_case_stats(al, system, labels, cases):
    "The former `case_stats` matrices: one pivot table per count, reindexed on the cases and labels."
    c = al.counts[(al.counts.system == system) & al.counts.label.isin(labels)]
    return {k: c.pivot_table(index=al._key, columns="label", values=k,
                             aggfunc="sum").reindex(index=cases, columns=labels).to_numpy(float)
            for k in ("tp", "fp", "fn")}


def test_case_stats_equal_the_pivot_tables(demo):
    from cxr_audit.label_audit import _case_label_sums
    a = label_audit(demo.studies, demo.generations, reps=50)
    al = a.alignment
    for s in al.systems:
        cases = al._cases([s])
        for labs in (list(al.labels), list(CHEXPERT_5)):
            ref = _pivot_case_stats(al, s, labs, cases)
            c = al.counts[al.counts.system == s]
            got = _case_label_sums(c[c.label.isin(labs)], al._key, cases, labs, ("tp", "fp", "fn"))
            for k in ref: np.testing.assert_array_equal(got[k], ref[k])
    s, cases = al.systems[0], al._cases([al.systems[0]])
    few = cases[:3] + cases[:2] + ["no such case"]  # repeated and unknown cases, as reindex gave them
    ref = _pivot_case_stats(al, s, ["Edema", "Cardiomegaly"], few)
    got = _case_label_sums(al.counts[al.counts.system == s], al._key, few, ["Edema", "Cardiomegaly"],
                           ("tp", "fp", "fn"))
    for k in ref: np.testing.assert_array_equal(got[k], ref[k])
    with pytest.raises(InputError, match="lacks some of the requested cases"): al.case_stats(s, cases=few)


def test_flag_table_equals_the_per_key_filter(demo):
    "The top evidence of each label is looked up once per key; the flags equal the former row-by-row filter's."
    from cxr_audit.labels import _flag_row
    t = trace_label_triggers(label_generations(to_generations(demo.generations)),
                             texts=dict(zip(demo.generations.sample_id, demo.generations.hypothesis)))
    rows, phrases, group = t.rows, t.phrases, t._group
    ref = []
    for key, g in rows[rows["state"] != 0.0].groupby(group + ["label"], sort=False):
        top = phrases[(phrases["state"] == 1.0) & np.logical_and.reduce([phrases[c] == v for c,
                                                                         v in zip(group + ["label"], key)])]
        ref.append({**dict(zip(group + ["label"], key)), **_flag_row(g, top.iloc[0] if len(top) else None)})
    ref = pd.DataFrame(ref)
    pd.testing.assert_frame_equal(t.flags[ref.columns].reset_index(drop=True), ref, check_dtype=False)
    assert len(ref) > 10 and ref["top_evidence"].notna().any()


def test_label_text_is_cached_per_text_and_equal_uncached(demo):
    texts = list(demo.generations.hypothesis[:60])
    cached, plain = Labeler(), Labeler(cache_size=0)
    first = [cached.label_text(t) for t in texts]
    assert 0 < len(cached._text_cache) <= len(set(texts))
    assert [cached.label_text(t) for t in texts] == first == [plain.label_text(t) for t in texts]
    assert len(plain._text_cache) == 0
    ev, _ = cached.label_text(texts[0]); ev.clear()                      # the caller's dict is its own
    assert cached.label_text(texts[0]) == first[0]


# --- labels from the official labeler's file, used like a labeler; every label-based table names its labels
# -----------------

def test_file_labeler_reads_the_official_states_by_text(tmp_path):
    off = pd.read_csv(FIX / "chexpert_official_sample.csv")
    lab = FileLabeler(FIX / "chexpert_official_sample.csv")
    # the same texts with other line breaks and spacing, in another order
    texts = {f"t{i}": "  ".join(t.split()) for i, t in reversed(list(enumerate(off["Reports"])))}
    w = to_wide(lab(texts))
    for i in range(len(off)):
        want = off.loc[i, list(CHEXPERT_14)].to_numpy(dtype=float)
        assert np.array_equal(w.loc[f"t{i}"].to_numpy(dtype=float), want, equal_nan=True)
    # one text twice with different states: an error naming both rows
    bad = pd.concat([off, off.iloc[[0]].assign(Edema=1.0)], ignore_index=True)
    bad.to_csv(tmp_path / "bad.csv", index=False)
    with pytest.raises(InputError, match=r"rows 0 and 4 hold the same text with different labels"):
        FileLabeler(tmp_path / "bad.csv")


def test_get_labeler_names_and_errors(tmp_path):
    assert get_labeler(None) is default_labeler()
    assert (get_labeler("clinical").name == "cxr_audit:clinical"
            and get_labeler("cxr_audit:chexpert+quirks").official_quirks)
    custom = Labeler(profile="clinical")
    assert get_labeler(custom) is custom
    with pytest.raises(InputError, match="is not one of chexpert, clinical, chexpert\\+quirks"):
        get_labeler("negbio")
    with pytest.raises(InputError, match="no official labels file"):
        get_labeler(tmp_path / "absent.csv")


def test_every_label_table_names_its_labeler(tmp_path):
    c = make_demo_corpus(n_patients=8, seed=3)
    for name in ("chexpert", "clinical", "chexpert+quirks"):
        lab = get_labeler(name)
        a = label_audit(c.studies, c.generations, reps=20, seed=0, labeler=lab)
        assert set(a.reference_labels.source) == set(a.generated_labels.source) == {lab.name}
        assert set(a.summary().labeler) == set(a.to_frame().labeler) == {lab.name}
        assert set(a.trace.flags.source) <= {lab.name} and set(a.exclusion.labeler) <= {lab.name}
        assert set(reference_profile(c.studies, labeler=lab).labeler) == {lab.name}
        paths = a.save(tmp_path / name)
        for key, p in paths.items():
            if p.suffix not in (".csv", ".parquet") or key == "matching": continue
            t = pd.read_parquet(p) if p.suffix == ".parquet" else pd.read_csv(p)
            col = "source" if "source" in t.columns else "labeler"
            assert col in t.columns and set(t[col]) <= {lab.name}, p.name


def test_label_audit_on_official_labels_has_no_probes_it_cannot_answer():
    off = pd.read_csv(FIX / "chexpert_official_sample.csv")
    studies = pd.DataFrame({"study_id": ["a", "b"], "findings": off["Reports"][:2], "impression": ""})
    gens = pd.DataFrame({"sample_id": ["x", "y"], "study_id": ["a", "b"], "system": "s", "policy": "p",
                         "hypothesis": [off["Reports"][1], off["Reports"][1]]})
    a = label_audit(studies, gens, reps=10, labeler=FIX / "chexpert_official_sample.csv")
    assert a.labeler == "official:chexpert_official_sample.csv" and len(a.probes) == 0
    gens.loc[0, "hypothesis"] = "A new finding the official file never saw."
    with pytest.raises(InputError, match="1 of 2 texts are not in"):
        label_audit(studies, gens, reps=10, labeler=FIX / "chexpert_official_sample.csv")


def test_normal_wording_is_flagged_by_its_share_with_the_counts_stated():
    "One stray normal sentence among 24 positives is not a flag; five of 24 are, and the verdict says how many."
    from cxr_audit.labels import trace_label_triggers
    real = ["Mild cardiomegaly.", "Moderate cardiomegaly.", "The heart is enlarged.", "Enlarged cardiac silhouette."]
    def labels(n_normal):
        texts = [real[i % 4] for i in range(24 - n_normal)] + ["Heart size is within normal limits."] * n_normal
        return pd.DataFrame({"text_id": [f"t{i}" for i in range(24)], "label": "Cardiomegaly", "state": 1.0,
                             "text": texts})
    one = trace_label_triggers(labels(1)).flags.set_index("label").loc["Cardiomegaly"]
    assert one.normal_wording_positives == 1 and one.verdict == "-" and not one.normal_flag
    five = trace_label_triggers(labels(5)).flags.set_index("label").loc["Cardiomegaly"]
    assert five.verdict == "positives from normal wording (5 of 24)" and five.normal_flag
    assert trace_label_triggers(labels(1), normal_share=0.01).flags.verdict.iloc[0] == ("positives from normal wording "
                                                                                        "(1 of 24)")
