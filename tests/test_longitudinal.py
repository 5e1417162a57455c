"""Integration tests of `cxr_audit.longitudinal`: the paper's prompt examples, the gold fixture, hand-computed
evaluation
measures, the LLM annotator against a real llama.cpp server (plumbing, not quality) and with the offline rule back end,
the one-call evaluation on the demo corpus (its result object, the files it saves), and determinism."""
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cxr_audit.core import InputError, sha256_frame
from cxr_audit.llm import LocalEndpoint, OpenAIChat
from cxr_audit.stats import UnderpoweredWarning
from cxr_audit.longitudinal import (LLMAnnotator, PROGRESSION_CLASSES, RuleAnnotator, annotate_reports, keyword_terms,
                                    rule_chat)
from cxr_audit.longitudinal_eval import (annotation_counts, evaluate_annotators, progression_counts,
                                         progression_evaluation, progression_instances, ranking_agreement,
                                         ranking_stability, read_gold, truth_agreement)
from cxr_audit.lmimic import build_lmimic
from cxr_audit.synth import make_demo_corpus

FIX = Path(__file__).parent / "fixtures" / "longitudinal"


@pytest.fixture(scope="module")
def gold():
    return read_gold(FIX / "gold_sentences.csv")


@pytest.fixture(scope="module")
def demo():
    return make_demo_corpus(12, seed=5)


# --- the paper's prompt examples, with the rule annotator ---------------------------------------------------------

def test_paper_prompt_examples():
    r = RuleAnnotator()
    assert r.annotate_sentence("Cardiac and mediastinal silhouettes are stable.")[0] is True
    assert r.annotate_sentence("New small bilateral pleural effusions.") == (True, "pleural effusion", "worsened")
    assert r.annotate_sentence("No larger pleural effusions.")[0] is True
    assert r.annotate_sentence("Increased retrocardiac opacity may reflect atelectasis.")[0] is True
    # the progression prompt's polarity guidance for low lung volumes
    assert r.progression("Lung volumes are lower.", "low lung volumes") == "worsened"
    assert r.progression("Lung volumes have increased.", "low lung volumes") == "improved"


def test_keyword_list_is_the_papers():
    t = keyword_terms()
    assert len(t) == 50 and len(set(t)) == 50 and t[0] == "support devices"
    assert {"copd/emphysema", "mass/nodule (not otherwise specified)", "vascular redistribution",
            "sub-diaphragmatic air"} <= set(t)


# --- the gold fixture ----------------------------------------------------------------------------------------------

def test_gold_fixture_size_and_coverage(gold):
    assert len(gold) >= 150 and gold.report_id.nunique() >= 50
    lon = gold[gold.is_longitudinal]
    assert lon.progression.value_counts().reindex(list(PROGRESSION_CLASSES)).min() >= 14
    assert (lon.keyword == "support devices").sum() >= 10 and (~gold.is_longitudinal).sum() >= 100
    assert set(gold.split) == {"dev", "heldout", "real"} and (gold.split == "heldout").sum() >= 80
    assert lon.keyword.dropna().nunique() >= 25          # many findings, not just the synthetic corpus's thirteen


def test_rule_annotator_on_gold(gold):
    q = {sp: evaluate_annotators(gold[gold.split == sp], [RuleAnnotator()], reps=200) for sp in ("dev", "heldout")}
    dev, held = (q[sp].summary().set_index("metric").estimate for sp in ("dev", "heldout"))
    assert dev["longitudinal_f1"] == 1.0 and dev["progression_micro_f1"] == 1.0
    assert (held["longitudinal_f1"] >= 0.97 and held["progression_micro_f1"] >= 0.95
            and held["progression_macro_f1"] >= 0.95)
    pc = q["heldout"].per_class()
    assert set(pc.gold) == {"not longitudinal", "no change", "improved", "worsened", "support devices"}
    assert (pc.accuracy >= 0.9).all()


REAL = Path(__file__).parent / "fixtures" / "iu_real" / "iu_valid_rexrank_sample.json"


def _annotated(sentences):
    "The sentences table of one-sentence reports (no splitting), so each row is one gold sentence."
    return annotate_reports(pd.DataFrame({"report_id": [str(i) for i in range(len(sentences))],
                                          "text": list(sentences)}),
                            splitter=lambda t: [t])


def test_rules_agree_with_the_real_wording_gold(gold):
    g = gold[gold.split == "real"].reset_index(drop=True)
    assert len(g) >= 40 and g.masked.astype(int).sum() >= 5
    got = _annotated(g.sentence)
    assert got.is_longitudinal.astype(bool).tolist() == g.is_longitudinal.tolist()
    assert got.keyword.tolist() == g.keyword.tolist()
    assert got.progression.tolist() == g.progression.tolist()
    assert got.masked.tolist() == g.masked.astype(int).astype(bool).tolist()


def test_normal_anatomy_stability_names_no_finding():
    r = RuleAnnotator()
    for s in ("Stable normal heart size.", "Unchanged normal mediastinal contours.", "The lungs remain clear.",
              "Cardiomediastinal silhouette is unchanged and within normal limits.", "Heart size and hila are stable."):
        assert r.annotate_sentence(s) == (True, None, "no change"), s
        assert r.progression(s, "enlarged cardiac silhouette") == "unmentioned", s
    for s, kw in (("Stable cardiomegaly.", "enlarged cardiac silhouette"),
                  ("The heart remains mildly enlarged.", "enlarged cardiac silhouette"),
                  ("Mediastinum remains widened.", "mediastinal widening"),
                  ("Unchanged elevation of the right hemidiaphragm.", "elevated hemidiaphragm")):
        assert r.annotate_sentence(s) == (True, kw, "no change"), s


def test_undirected_change_gets_no_class():
    """A change with no stated direction, or a bare reference to the prior, is longitudinal without a progression class
    (issue 39)."""
    r = RuleAnnotator()
    for s in ("Small interval change in the left effusion.", "Slight interval change in the left effusion.",
              "Minimal interval change in the left effusion.", "The left effusion has changed since the prior study."):
        assert r.annotate_sentence(s) == (True, "pleural effusion", None), s
    assert r.annotate_sentence("There has been interval CABG.") == (True, None, None)
    assert r.annotate_sentence("No interval change in the left effusion.")[2] == "no change"
    # a direction wins
    assert r.annotate_sentence("Slight interval change, the left effusion is now smaller.")[2] == "improved"
    assert r.annotate_sentence("New small left effusion.")[2] == "worsened"  # a new lesion: worse


def test_static_wording_and_recommendations_are_not_longitudinal():
    "Sentences of the kind read in real IU reports (our own wording): change words that describe, not compare."
    r = RuleAnnotator()
    for s in ("Bone density is decreased.", "Diffuse osteopenia with decreased bone density.",
              "Suspected cardiomegaly, less XXXX pericardial effusion.",
              "If the patient's symptoms persist, a repeat study is recommended.",
              "Increased lung volumes consistent with COPD.", "There are diminished lung volumes with crowding of the "
                                                              "vessels."):
        assert r.annotate_sentence(s)[0] is False, s
    assert r.annotate_sentence("Stable increased lung volumes.") == (True, "low lung volumes", "no change")
    assert r.annotate_sentence("Lung volumes are decreased compared to the prior study.")[2] == "worsened"
    assert (r.annotate_sentence("Previously identified small right pneumothorax is not visualized.")
            == (True, "pneumothorax", "improved"))
    assert r.annotate_sentence("The left costophrenic angle is not visualized.")[0] is False
    assert r.annotate_sentence("There is a T12-L1 compression fracture, unchanged.")[1] == "spinal fracture"


def test_real_fixture_normal_statements_and_masks():
    data = json.loads(REAL.read_text())
    s = annotate_reports({k: v["report"] for k, v in data.items()})
    # normal or stability statements about normal anatomy, recognised by the test's own patterns, carry no disease
    # keyword
    anatomy = s.sentence.str.contains(r"(?i)\b(?:cardiomediastinal|mediastin\w*|heart|cardiac|hil(?:ar|um|a))\b")
    stable = s.sentence.str.contains(r"(?i)\b(?:stable|unchanged|similar|remains?)\b")
    abnormal = s.sentence.str.contains(r"(?i)enlarg|cardiomegaly|prominen|tortu|widen|large|calcifi|atherosc|ectasia"
                                       r"|shift|mild|moderate")
    normal_stable = s[anatomy & stable & ~abnormal]
    assert len(normal_stable) >= 8 and normal_stable.is_longitudinal.all()
    # a device is no disease
    assert normal_stable.keyword.isna().sum() >= 8 and normal_stable.keyword.dropna().eq("support devices").all()
    # mask-dependent sentences are flagged, never keyed; a flag needs a mask
    m = s[s.masked]
    assert (len(m) >= 2 and m.sentence.str.contains("XXXX").all() and m.keyword.isna().all()
            and m.progression.isna().all())
    assert s[s.sentence.str.contains(r"XXXX XXXX in the interval")].masked.all()
    assert not s.masked[~s.sentence.str.contains("XXXX")].any()


def test_llm_path_with_rule_backend_matches_rules(gold):
    sents = gold.sentence.tolist()
    a = RuleAnnotator().annotate(sents)
    b = LLMAnnotator(rule_chat(), cache=False).annotate(sents)
    # the stand-in back end answers from the rules; it has no answer for a longitudinal sentence that names no finding
    named = a.keyword.notna()
    # the progression question has four answers: a change of no stated direction comes back "unmentioned", where the
    # rules leave it blank
    b = b.assign(progression=b.progression.where(~(named & a.progression.isna() & b.progression.eq("unmentioned")),
                                                 None))
    pd.testing.assert_frame_equal(a[named].reset_index(drop=True), b[named].reset_index(drop=True))
    assert b.keyword[~named & a.is_longitudinal].isna().all()


# --- evaluation measures equal hand computations ---------------------------------------------------------------------

def test_annotation_measures_by_hand():
    g = pd.DataFrame({"report_id": ["r1", "r1", "r2", "r2", "r3"], "sentence": list("abcde"),
                      "is_longitudinal": [1, 1, 1, 0, 1],
                      "keyword": ["pleural effusion", "atelectasis", "pneumothorax", None, "support devices"],
                      "progression": ["worsened", "improved", "no change", None, None]})
    p = pd.DataFrame({"is_longitudinal": [True, True, False, True, True],
                      "keyword": ["pleural effusion", "atelectasis", None, "edema", "support devices"],
                      "progression": ["worsened", "unmentioned", None, "improved", "improved"]})
    s = evaluate_annotators(g, {"p": p}, reps=20, clusters=None).summary().set_index("metric").estimate
    # longitudinal: tp 3 (a, b, e), fp 1 (d), fn 1 (c), tn 0
    assert (s["longitudinal_precision"] == 3 / 4 and s["longitudinal_recall"] == 3 / 4
            and s["longitudinal_accuracy"] == 3 / 5)
    # progression (device sentence e left out): a worsened tp; b improved -> unmentioned: fn; c no change missed: fn;
    # d improved predicted on a non-longitudinal gold: fp of improved
    assert s["progression_micro_precision"] == 1 / 2 and s["progression_micro_recall"] == 1 / 3
    assert s["progression_micro_f1"] == pytest.approx(2 / (2 + 1 + 2))
    assert (s["progression_f1_worsened"] == 1.0 and s["progression_f1_improved"] == 0.0
            and s["progression_f1_no_change"] == 0.0)
    assert s["progression_macro_f1"] == pytest.approx(1 / 3)
    # micro accuracy: tp + tn over 3 classes x 4 evaluated sentences: a 3, b 2, c 2, d 2 -> 9 / 12
    assert s["progression_micro_accuracy"] == pytest.approx(9 / 12)
    c = annotation_counts(g, p)
    assert c.evaluated.tolist() == [True, True, True, True, False]


def test_progression_measures_by_hand():
    ref = pd.DataFrame({"report_id": ["A", "A", "A", "B", "B"], "sent_idx": range(5), "sentence": list("vwxyz"),
                        "is_longitudinal": True,
                        "keyword": ["pleural effusion", "atelectasis", "support devices", "pneumothorax",
                                    "pleural effusion"],
                        "progression": ["worsened", "no change", "improved", "improved", "no change"]})
    gen = pd.DataFrame({"report_id": ["a1", "a1", "b1", "a2", "b2", "b2"], "sent_idx": range(6),
                        "sentence": list("vwyvyz"), "is_longitudinal": True,
                        "keyword": ["pleural effusion", "atelectasis", "pneumothorax", "pleural effusion",
                                    "pneumothorax", "pleural effusion"],
                        "progression": ["worsened", "unmentioned", "improved", "no change", "worsened", "no change"]})
    pairs = pd.DataFrame({"sample_id": ["a1", "b1", "a2", "b2"], "study_id": ["A", "B", "A", "B"],
                          "system": ["x", "x", "y", "y"]})
    inst = progression_instances(ref, gen, pairs)
    x = inst[inst.system == "x"].set_index(["study_id", "keyword"]).predicted.to_dict()
    assert x == {("A", "atelectasis"): "absent", ("A", "pleural effusion"): "worsened",
                 ("B", "pleural effusion"): "absent", ("B", "pneumothorax"): "improved"}
    for system, (tp, fp, fn) in {"x": (2, 0, 2), "y": (1, 2, 3)}.items():
        S = progression_counts(inst, ["A", "B"], system).reshape(2, 3, 3).sum((0, 1))
        assert S.tolist() == [tp, fp, fn]
    # the same through the bootstrap engine: estimates are the formulas on the summed counts
    st = pd.DataFrame({"study_id": ["A", "B"], "findings": ["x", "y"]})
    gens = pd.DataFrame({"sample_id": ["a1", "b1", "a2", "b2"], "study_id": ["A", "B", "A", "B"],
                         "system": ["x", "x", "y", "y"], "hypothesis": ""})
    ev = progression_evaluation(st, gens, metrics=(), reps=50, reference_sentences=ref, generated_sentences=gen)
    f1 = ev.summary().query("metric == 'progression_micro_f1'").set_index("system").estimate
    assert f1["x+default"] == pytest.approx(4 / 6) and f1["y+default"] == pytest.approx(2 / 7)  # to_generations' policy


def test_stability_and_agreement_statistics():
    runs = [pd.DataFrame({"system": list("abcd"), "metric": "m", "estimate": v})
            for v in ([0.1, 0.2, 0.3, 0.4], [0.1, 0.25, 0.2, 0.5], [0.15, 0.2, 0.3, 0.45])]
    st = ranking_stability(runs).iloc[0]
    # ranks: (1,2,3,4), (1,3,2,4), (1,2,3,4): R = (3,7,8,12); S = sum (R - 7.5)^2 = 41; W = 12*41 / (9*60) = 0.9111
    assert st.kendalls_w == pytest.approx(12 * 41 / (9 * 60))
    rho = [1.0, 0.8, 0.8]
    assert st.mean_spearman == pytest.approx(np.mean(rho))
    ag = ranking_agreement(runs[0], runs[1]).iloc[0]
    assert ag.spearman_rho == pytest.approx(0.8) and ag.kendall_tau == pytest.approx(4 / 6)


# --- the LLM annotator against a real llama.cpp server (plumbing, not quality) ----------------------------------------

def test_llm_annotator_against_real_server(llama_server, tmp_path):
    server = llama_server   # the session's real llama.cpp server (tests/conftest.py)
    sents = ["The left pleural effusion has increased since the prior study.", "No pneumothorax."]
    ann = LLMAnnotator(OpenAIChat("smollm2", base_url=server.base_url), cache=tmp_path / "c.sqlite", max_tokens=12,
                       invalid_retries=1, max_concurrency=2)
    out = ann.annotate(sents)
    assert out.sentence.tolist() == sents and list(out.columns) == ["sentence", "is_longitudinal", "keyword",
                                                                    "progression"]
    log = ann.log_
    assert (log.status == "ok").all() and (log.tokens_in > 50).all() and (log.tokens_out > 0).all()
    step1 = log[log.step == "longitudinal"]
    assert set(step1.item) == {0, 1} and step1.attempt.max() <= 1
    # a valid answer is used; an invalid one is asked again once, then recorded as missing
    for i, row in out.iterrows():
        tries = step1[step1["item"] == i].sort_values("attempt")
        if tries.valid.any(): assert row.is_longitudinal == bool(int(tries[tries.valid].answer.iloc[0]))
        else: assert pd.isna(row.is_longitudinal) and len(tries) == 2
    # a second annotator on the same cache sends only what could not be read (an unreadable reply is never cached)
    again = LLMAnnotator(OpenAIChat("smollm2", base_url=server.base_url), cache=tmp_path / "c.sqlite", max_tokens=12,
                         invalid_retries=1)
    pd.testing.assert_frame_equal(again.annotate(sents), out)   # greedy: the server answers as before
    assert again.log_[again.log_.valid].cached.all() and not again.log_[~again.log_.valid].cached.any()
    # step 3 alone, with the paper's sampling settings: answers are recorded (valid or not), nothing raises
    s = LLMAnnotator(OpenAIChat("smollm2", base_url=server.base_url), decoding="sampling", seed=7, cache=False,
                     max_tokens=12, invalid_retries=0)
    res = s.progression_of([("The left pleural effusion has increased.", "pleural effusion")])
    assert len(res) == 1 and res[0] in (None, "no change", "improved", "worsened", "unmentioned")
    assert s.log_.step.tolist() == ["progression"] and s.log_.status.tolist() == ["ok"]


# --- the one-call evaluation on the demo corpus, truth, L-MIMIC, determinism -----------------------------------------

def test_progression_evaluation_on_demo_with_truth(tmp_path):
    d = make_demo_corpus(seed=0)
    ev = progression_evaluation(d.studies, d.generations, d.progression, reps=1000, clusters="patient_id",
                                metrics=("bleu_4", "rouge_l", "meteor"), splitter="regex")
    assert ev.truth.summary()["class"].tolist() == ["no change", "improved", "worsened", "all"]
    assert ev.truth.summary().set_index("class").estimate["all"] >= 0.95
    assert set(ev.systems) == {"sim-verbose+B4", "sim-terse+B4", "sim-omit+B4", "sim-template+B4", "sim-template+K50"}
    assert ("meteor" in ev.results) == bool(shutil.which("java"))
    f1 = ev.summary().query("metric == 'progression_micro_f1'").set_index("system").estimate
    assert f1["sim-verbose+B4"] > f1["sim-omit+B4"] > f1["sim-template+B4"]
    # significant follows Holm everywhere, never the interval alone
    bv, cmp = ev.best_vs_runner_up(), ev.comparisons(["progression_micro_f1"])
    assert (bv.significant == (bv.p_holm < 0.05)).all() and (cmp.significant == (cmp.p_holm < 0.05)).all()
    assert ("not significant" in ev.headline()) != bool(bv.set_index("metric").significant["progression_micro_f1"])
    paths = ev.save(tmp_path / "o", params={"section": "findings"})
    manifest = json.loads(paths["manifest"].read_text())
    assert manifest["params"]["clusters"] == "patient_id" and manifest["params"]["section"] == "findings"
    assert pd.read_csv(paths["summary"]).shape == ev.summary().shape and paths["truth"].exists()


def test_llm_annotator_over_http_records_its_calls(tmp_path):
    d = make_demo_corpus(3, seed=2)
    gens = d.generations[d.generations.system.isin(["sim-verbose", "sim-omit"])]
    with LocalEndpoint(rule_chat()) as ep:
        ann = LLMAnnotator(OpenAIChat("rule-chat", base_url=ep.base_url), cache=tmp_path / "c.sqlite")
        ev = progression_evaluation(d.studies, gens, annotator=ann, metrics=("bleu_4", "rouge_l"), reps=50)
        assert ep.n_requests > 0
    assert ev.annotators == {"references": "llm:rule-chat", "generations": "llm:rule-chat"}
    assert set(ev.llm_calls.reports) == {"references",
                                         "generations"} and set(ev.llm_calls.step) == {"longitudinal", "keyword",
                                                                                       "progression"}
    assert "llm_calls" in ev.save(tmp_path / "o")
    rules = progression_evaluation(d.studies, gens, metrics=("bleu_4", "rouge_l"), reps=50)
    assert rules.llm_calls is None
    # over HTTP the stand-in answers like the rules, except that a longitudinal sentence naming no finding gets no
    # keyword
    a, b = (e.summary().query("metric.str.startswith('bleu')").reset_index(drop=True) for e in (ev, rules))
    assert set(a.annotator) == {"llm:rule-chat"} and set(b.annotator) == {"rules"}     # each table says who annotated
    pd.testing.assert_frame_equal(a.drop(columns="annotator"), b.drop(columns="annotator"))
    with pytest.raises(InputError, match="missing column"):
        progression_evaluation(d.studies, gens, section="impressions")


def test_one_system_has_estimates_but_no_comparisons(tmp_path, demo):
    one = demo.generations[demo.generations.system == "sim-verbose"]
    ev = progression_evaluation(demo.studies, one, metrics=(), reps=50)
    assert ev.systems == ["sim-verbose+B4"] and ev.size == 0.95 and ev.reps == 50
    for call in (ev.compare, ev.comparisons, ev.win_matrix):
        with pytest.raises(InputError, match="at least two systems"):
            call()
    assert len(ev.ranks()) == len(ev.results) and len(ev.best_vs_runner_up()) == 0 and "resamples" in ev.note()
    assert "sim-verbose+B4" in ev.headline() and "win_probability_chart" not in ev.save(tmp_path / "o")


def test_too_few_resamples_warn_when_comparing(demo):
    ev = progression_evaluation(demo.studies, demo.generations, metrics=(), reps=50)
    with pytest.warns(UnderpoweredWarning, match="none can be significant"):
        ev.best_vs_runner_up()


def test_truth_agreement_and_lmimic(demo):
    lm = build_lmimic(demo.studies)
    ta = truth_agreement(lm.sentences, demo.progression)
    assert ta.summary().set_index("class").loc["all", "estimate"] >= 0.95
    assert set(ta.to_frame().annotated) <= {"no change", "improved", "worsened", "unmentioned", "not found"}
    stats = lm.summary().set_index("split")
    assert stats.loc["all", "follow_up_reports"] == len(demo.studies) - demo.studies.patient_id.nunique()
    assert 0 < stats.loc["all", "share_with_longitudinal"] <= 1
    assert set(lm.studies.study_id) == set(lm.reports.study_id[lm.reports.has_longitudinal])


def test_determinism(demo):
    a = progression_evaluation(demo.studies, demo.generations, metrics=("bleu_4",), reps=200, seed=3,
                               clusters="patient_id")
    b = progression_evaluation(demo.studies, demo.generations, metrics=("bleu_4",), reps=200, seed=3,
                               clusters="patient_id")
    assert sha256_frame(a.summary()) == sha256_frame(b.summary())
    assert sha256_frame(a.reference_sentences) == sha256_frame(b.reference_sentences)
    c = progression_evaluation(demo.studies, demo.generations, metrics=("bleu_4",), reps=200, seed=4,
                               clusters="patient_id")
    assert sha256_frame(a.summary()) != sha256_frame(c.summary())


def test_restricted_reports_are_guarded():
    class Remote(type(rule_chat())):
        endpoint = "https://llm.example.org/v1"
    remote = LLMAnnotator(Remote(rule_chat().fn), cache=False)
    reports = pd.DataFrame({"report_id": ["m1", "p1"], "text": ["Stable effusion.", "Stable effusion."],
                            "restricted": [True, False]})
    with pytest.raises(PermissionError, match="restricted data"):
        annotate_reports(reports, remote)
    assert annotate_reports(reports.assign(restricted=False), remote).is_longitudinal.all()


# --- issue 20: prompts as in paper 003, matching, runs_summary, JS distance, categories, Table 5, provenance ----------

def test_prompts_follow_the_papers_final_prompts():
    from cxr_audit.longitudinal import PAPER_SETTINGS, load_prompts, longitudinal_prompt, progression_prompt
    p = longitudinal_prompt("Stable effusion.")
    assert all(w in p for w in ("remain", "compare", "similar", "stable", "increased", "still", "new", "again"))
    assert p.count("gives <1>") == 3 and "gives <0>" not in p                     # 3 positive examples by default
    zero = longitudinal_prompt("Stable effusion.", 0, 0)
    assert "gives <" not in zero and "remain" not in zero
    guidance = load_prompts()["progression"]["guidance"]
    assert guidance in progression_prompt("x",
                                          "atelectasis") and guidance not in progression_prompt("x", "atelectasis", 0)
    assert longitudinal_prompt("x", binary_suffix=True).endswith(load_prompts()["longitudinal"]["binary_suffix"])
    assert PAPER_SETTINGS == {"n_task_examples": (0, 3, 5), "n_change_indicators": (0, 4, 8, 12),
                              "n_progression_examples": (0, 2, 4)}
    from cxr_audit.llm import RuleChat
    assert LLMAnnotator(RuleChat(lambda m, s: "<0>", name="MedGemma-27B"), cache=False).binary_suffix
    assert not LLMAnnotator(RuleChat(lambda m, s: "<0>", name="qwen2.5-32b"), cache=False).binary_suffix


def test_match_is_explicit_and_changes_the_pairing():
    ref = pd.DataFrame({"report_id": ["A"], "sent_idx": [0], "is_longitudinal": [True], "keyword": ["opacity"],
                        "progression": ["worsened"]})
    gen = pd.DataFrame({"report_id": ["g"], "sent_idx": [0], "is_longitudinal": [True], "keyword": ["airspace opacity"],
                        "progression": ["worsened"]})
    pairs = pd.DataFrame({"sample_id": ["g"], "study_id": ["A"], "system": ["m"]})
    assert progression_instances(ref, gen, pairs, match="exact").predicted.tolist() == ["absent"]
    assert progression_instances(ref, gen, pairs, match="families").predicted.tolist() == ["worsened"]
    assert progression_instances(ref, gen, pairs,
                                 match={"opacity": "x", "airspace opacity": "x"}).predicted.tolist() == ["worsened"]
    # the older spelling
    assert progression_instances(ref, gen, pairs, families=True).predicted.tolist() == ["worsened"]
    with pytest.raises(InputError, match="match must be one of"):
        progression_instances(ref, gen, pairs, match="fuzzy")


def test_runs_summary_on_annotation_quality_and_evaluations(gold, demo):
    from cxr_audit.longitudinal_eval import runs_summary
    h = gold[gold.split == "heldout"]
    qs = [evaluate_annotators(h, {"q": LLMAnnotator(rule_chat(noise=0.1), decoding="sampling", seed=s, cache=False)},
                              reps=20) for s in (1, 2)]
    rs = runs_summary(qs, ["longitudinal_f1"])
    f1 = [q.summary().set_index("metric").estimate["longitudinal_f1"] for q in qs]
    assert rs.columns.tolist() == ["metric", "annotator", "mean", "sd", "runs"] and rs.runs.tolist() == [2]
    assert rs["mean"].iloc[0] == pytest.approx(np.mean(f1)) and rs["sd"].iloc[0] == pytest.approx(np.std(f1, ddof=1))
    evs = [progression_evaluation(demo.studies, demo.generations, metrics=(), reps=20, seed=s) for s in (1, 2)]
    re_ = runs_summary(evs, ["progression_micro_f1"])
    assert "system" in re_.columns and (re_.sd == 0).all()      # same annotations: the point estimates agree


def test_keyword_distance_by_hand_and_against_scipy():
    from scipy.spatial.distance import jensenshannon
    from cxr_audit.longitudinal_eval import keyword_distance
    a, b = {"x": 3, "y": 1, "z": 0}, {"x": 1, "y": 1, "w": 2}
    kd = keyword_distance(a, b)
    keys = kd.distributions.keyword.tolist()
    p = np.array([a.get(k, 0) for k in keys], float); q = np.array([b.get(k, 0) for k in keys], float)
    assert kd.distance == pytest.approx(jensenshannon(p / p.sum(), q / q.sum()))
    assert keyword_distance(a, b, base=2).distance == pytest.approx(jensenshannon(p / p.sum(), q / q.sum(), base=2))
    assert keyword_distance({"x": 1, "y": 1}, {"y": 1, "z": 1}).divergence == pytest.approx(0.5 * np.log(2))


def test_category_results_by_hand(demo):
    from cxr_audit.longitudinal_eval import category_results
    inst = pd.DataFrame({"system": "m", "keyword": ["pleural effusion", "pleural effusion", "rib fracture"],
                         "reference": ["worsened", "improved", "no change"],
                         "predicted": ["worsened", "worsened", "absent"]})
    ev = progression_evaluation(demo.studies, demo.generations, metrics=(), reps=20)
    import dataclasses
    cr = category_results(dataclasses.replace(ev, instances=inst)).set_index("category")
    # pleura: worsened P=1/2 R=1 F1=2/3 (support 1), improved P=0 R=0 F1=0 (support 1): weighted F1 = 1/3; micro
    # 2/(2+1+1) = 1/2
    assert cr.loc["pleura", "weighted_f1"] == pytest.approx(1 / 3) and cr.loc["pleura",
                                                                              "micro_f1"] == pytest.approx(0.5)
    assert cr.loc["bone and chest wall", "weighted_f1"] == 0 and cr.loc["all",
                                                                        "n"] == 3 and (cr.annotator == "rules").all()


def test_an_invalid_answer_is_left_out_never_a_negative_in_category_results():
    # an LLM reply that could not be parsed leaves is_longitudinal missing (pd.NA in a nullable column): left out of
    # every measure
    from cxr_audit.longitudinal_eval import category_results
    g = pd.DataFrame({"report_id": ["r1", "r2", "r3"], "sentence": ["a", "b", "c"], "is_longitudinal": [1, 1, 1],
                      "keyword": ["pleural effusion", "pleural effusion", "pleural effusion"],
                      "progression": ["worsened", "worsened", "improved"]})
    p = pd.DataFrame({"is_longitudinal": pd.array([pd.NA, True, True], dtype="boolean"),
                      "keyword": [None, "pleural effusion", "pleural effusion"],
                      "progression": [None, "worsened", "worsened"]})
    q = evaluate_annotators(g, {"llm": p}, reps=20, clusters=None)
    cr = category_results(q).set_index("category")
    # two findings read: worsened found (TP), improved called worsened (FP worsened, FN improved); the unreadable one is
    # not a miss
    assert cr.loc["pleura", "n"] == 2 and cr.loc["all", "micro_f1"] == pytest.approx(0.5)
    # counted beside the rows it is left out of
    assert (cr.n_invalid == 1).all() and cr.invalid_rate.iloc[0] == pytest.approx(1 / 3)
    # improved has no prediction: its precision is undefined and left out of the weighted mean, not counted as 0
    assert cr.loc["all", "weighted_precision"] == pytest.approx(0.5)
    est = q.summary().set_index("metric")
    assert (est.estimate["longitudinal_recall"] == 1.0 and est.n_invalid.iloc[0] == 1
            and est.invalid_rate.iloc[0] == pytest.approx(1 / 3))
    assert q.incomplete == ["llm"]                                   # 1 of 3 unreadable is above the 5% allowed


def test_table5_is_one_evaluation_on_one_set_of_resamples(demo):
    from cxr_audit.longitudinal_eval import TABLE5_METRICS
    ev = progression_evaluation(demo.studies, demo.generations, metrics=("bleu_4",), report_metrics=("bleu_4",),
                                diagnosis=True, reps=50)
    assert {"report_bleu_4", "bleu_4", "diagnosis_micro_f1", "progression_micro_f1"} <= set(ev.results)
    reps = {m: ev.results[m].replicates.shape for m in ev.results}
    assert len(set(reps.values())) == 1                               # every measure on the same resamples
    assert set(ev.table(TABLE5_METRICS).columns) <= set(TABLE5_METRICS)
    # whole-report BLEU-4 equals the corpus score of the full texts on the evaluated studies
    from cxr_audit.metrics import score
    sys0 = ev.systems[0]; P = ev.pairs[ev.pairs.system == sys0].set_index("study_id").loc[list(ev.units)]
    by_id = demo.studies.assign(study_id=demo.studies.study_id.astype(str)).set_index("study_id")
    ref = by_id.loc[list(ev.units), "findings"]
    val = score(list(ref), list(P.hypothesis), ["bleu_4"]).value.iloc[0]
    assert ev.summary().set_index(["system", "metric"]).estimate[(sys0, "report_bleu_4")] == pytest.approx(val)
    assert ("annotation by `rules`" in ev.provenance() and "matched `exact`" in ev.provenance()
            and "split by `pysbd`" in ev.provenance())
    assert (ev.summary().annotator == "rules").all()


def test_default_splitter_falls_back_to_pysbd_without_stanza_models(tmp_path, monkeypatch):
    from cxr_audit.reports import default_splitter_name, split_sentences
    # no English models here, whether stanza is installed or not
    monkeypatch.setenv("STANZA_RESOURCES_DIR", str(tmp_path))
    assert default_splitter_name() == "pysbd"
    t = "Stable effusion. No pneumothorax."
    assert split_sentences(t) == split_sentences(t, splitter="pysbd")


# --- each distinct sentence is read once (issue 23) -------------------------------------------------------------

def test_rule_annotator_reads_each_sentence_once_with_the_same_result():
    a, fresh = RuleAnnotator(), RuleAnnotator()
    s = "The small left pleural effusion has slightly increased since the prior study."
    first = a._read(s)
    assert a._read(s) is first and len(a._readings) == 1                     # the second call is the cached reading
    assert first == fresh._read_now(s)                                        # equal to a reading made from scratch


def test_generations_of_a_restricted_dataset_are_restricted_without_a_restricted_column():
    """A MIMIC-CXR studies table with no `restricted` column: its generations count as restricted (by dataset) and are
    not
    sent to a remote server, even when the references were annotated before (so only the generations would be sent)."""
    from cxr_audit.llm import RestrictedDataError, RuleChat
    from cxr_audit.longitudinal import rule_chat

    class RemoteRule(RuleChat):
        endpoint = "https://llm.example.org/v1"
    st = pd.DataFrame({"study_id": ["a", "b"], "dataset": "mimic-cxr",
                       "findings": ["Stable cardiomegaly.", "The effusion has grown."]})
    gens = pd.DataFrame({"study_id": ["a", "b"], "system": "m",
                         "hypothesis": ["Cardiomegaly is stable.", "Effusion, larger."]})
    refs = annotate_reports(st, RuleAnnotator(), id_col="study_id", text_col="findings")
    remote = LLMAnnotator(RemoteRule(rule_chat().fn), cache=False)
    with pytest.raises(RestrictedDataError, match="restricted data"):
        progression_evaluation(st, gens, annotator=remote, reference_sentences=refs, reps=10)


def test_masks_of_every_dataset_and_the_mask_rule_is_stated():
    """MIMIC's ___ and the older [**...**] are masks too; the mask rule blanks an LLM's answer only when asked, and
    says so."""
    r = RuleAnnotator()
    for s in ("Compared to ___, the effusion is ___.", "Since [**2101-2-3**], the effusion is [**Known**].",
              "XXXX since XXXX."):
        assert r.annotate_sentence(s) == (True, None, None) and r.is_masked(s), s
    reports = {"a": "Compared to ___, the effusion is ___. Heart size is normal."}
    llm = LLMAnnotator(rule_chat(RuleAnnotator()), cache=False, name="llm:stand-in")
    kept = annotate_reports(reports, llm)
    assert kept.masked.tolist() == [True, False] and set(kept.annotator) == {"llm:stand-in"}
    blanked = annotate_reports(reports, llm, mask_rule=True)
    assert set(blanked.annotator) == {"llm:stand-in+mask-rule"} and blanked.keyword.isna().all()


def test_best_vs_runner_up_follows_the_named_rule(demo):
    from cxr_audit.papers import PAPER_003
    ev = progression_evaluation(demo.studies, demo.generations, metrics=(), reps=200, clusters="patient_id")
    ci, holm = ev.best_vs_runner_up(rule="ci"), ev.best_vs_runner_up()
    assert PAPER_003.significance == "ci" and set(ci.rule) == {"ci"} and set(holm.rule) == {"holm"}
    assert (((ci.lead == "significant") == ci.ci_excludes_0).all()
            and ((holm.lead == "significant") == holm.significant).all())
    with pytest.raises(InputError, match="rule must be 'holm' or 'ci'"):
        ev.best_vs_runner_up(rule="bonferroni")


def test_a_generation_restricted_by_its_own_row_is_guarded():
    "The study is public, but the generated report's own row names a restricted dataset: it does not leave the machine."
    from cxr_audit.longitudinal_eval import progression_evaluation

    class Remote(type(rule_chat())):
        endpoint = "https://llm.example.org/v1"
    remote = LLMAnnotator(Remote(rule_chat().fn), cache=False)
    studies = pd.DataFrame({"study_id": ["s1"], "dataset": ["iu-xray"], "findings": ["Stable small effusion."]})
    gens = pd.DataFrame({"sample_id": ["g1", "g2"], "study_id": ["s1", "s1"], "system": ["a", "b"], "policy": "B4",
                         "hypothesis": ["Stable effusion.", "Effusion is stable."],
                         "dataset": ["MIMIC-CXR-JPG", "iu-xray"]})
    with pytest.raises(PermissionError, match="restricted data"):
        progression_evaluation(studies, gens, annotator=remote, reps=50, metrics=())
    ok = progression_evaluation(studies, gens.assign(dataset="iu-xray"), annotator=remote, reps=50, metrics=())
    assert ok.coverage()["studies"] == 1
