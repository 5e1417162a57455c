("Integration tests of `cxr_audit.metrics`: equality with pycocoevalcap, METEOR's corpus value, resampling, CheXpert "
 "F1, RadEval.")
import importlib
import json
import os
import tempfile
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cxr_audit.core import InputError
from cxr_audit.labels import CHEXPERT_5, CHEXPERT_14, label_reports
from cxr_audit.label_audit import align_labels
from cxr_audit.metrics import (AVAILABILITY_COLUMNS, BRIDGED_METRICS, LIGHT_METRICS, Bleu, CheXbertF1, CheXpertF1,
                               Meteor, Metric, RadEvalError, RadEvalMetric, bundle_metrics, chexbert_counts, coco_bleu,
                               compare_with_pycocoevalcap, get_metric, list_metrics, metric_availability, metric_kind,
                               negated, radeval_metric, radeval_values, sample_stats, score, tokenizer)
from cxr_audit.meteor import meteor_value
from cxr_audit.meteor import _pid_alive  # private: the liveness check the stale-subset clean-up uses
from cxr_audit.stats import bootstrap, resample_indices, resample_weights, systems_from_scores

FIX = Path(__file__).parent / "fixtures" / "metrics"
IU_JSON = Path(__file__).parent / "fixtures" / "iu_real" / "iu_valid_rexrank_sample.json"
HAVE_JAVA = shutil.which("java") is not None
needs_java = pytest.mark.skipif(not HAVE_JAVA, reason="METEOR needs Java on PATH")
COCO = ["bleu_1", "bleu_2", "bleu_3", "bleu_4", "rouge_l", "cider"]


@pytest.fixture(scope="module")
def pairs():
    return pd.read_csv(FIX / "pairs.csv", keep_default_na=False)


def coco_inputs(df, tokenize="r2gen"):
    t = tokenizer(tokenize)
    return {i: [t(r)] for i, r in enumerate(df.reference)}, {i: [t(h)] for i, h in enumerate(df.hypothesis)}


# --- the fixture ---------------------------------------------------------------------------------------------------

def test_fixture(pairs):
    assert len(pairs) >= 200 and pairs.pair_id.is_unique
    assert (pairs.kind == "edge").sum() >= 10 and pairs.system.nunique() >= 5
    assert (pairs.hypothesis == "").any() and pairs.hypothesis.str.contains(r"\|\|\|").any()
    assert pairs.reference.str.contains(r"\d\.\d").any() and pairs.reference.str.contains("\n").any()


# --- equality with pycocoevalcap -----------------------------------------------------------------------------------

@pytest.mark.parametrize("tokenize", ["r2gen", None])
def test_corpus_values_equal_pycocoevalcap(pairs, tokenize):
    cmp = compare_with_pycocoevalcap(pairs.reference, pairs.hypothesis, COCO, tokenize=tokenize)
    assert cmp.metric.tolist() == COCO
    assert (cmp.abs_diff < 1e-9).all(), cmp


def test_per_sample_values_equal_pycocoevalcap(pairs):
    from pycocoevalcap.bleu.bleu import Bleu as CocoBleu
    from pycocoevalcap.cider.cider import Cider as CocoCider
    from pycocoevalcap.rouge.rouge import Rouge as CocoRouge
    gts, res = coco_inputs(pairs)
    _, bleu_lists = CocoBleu(4).compute_score(gts, res, verbose=0)
    for n in range(1, 5):
        np.testing.assert_allclose(get_metric(f"bleu_{n}").per_sample(pairs.reference, pairs.hypothesis),
                                   bleu_lists[n - 1], rtol=0, atol=1e-9)
    np.testing.assert_allclose(get_metric("rouge_l").per_sample(pairs.reference, pairs.hypothesis),
                               CocoRouge().compute_score(gts, res)[1], rtol=0, atol=1e-12)
    np.testing.assert_allclose(get_metric("cider").per_sample(pairs.reference, pairs.hypothesis),
                               CocoCider().compute_score(gts, res)[1], rtol=0, atol=1e-9)


@pytest.fixture(scope="module")
def coco_meteor():
    from pycocoevalcap.meteor.meteor import Meteor as CocoMeteor
    return CocoMeteor()                                           # one JVM of pycocoevalcap's for the module


@pytest.fixture(scope="module")
def our_meteor(pairs):
    return Meteor().jar_scores(pairs.reference, pairs.hypothesis)  # one JVM: statistics and the jar's own EVAL answer


@needs_java
def test_meteor_equals_pycocoevalcap_and_the_jar(pairs, coco_meteor, our_meteor):
    gts, res = coco_inputs(pairs)
    theirs, theirs_seg = coco_meteor.compute_score(gts, res)
    S, seg, corpus = our_meteor.stats, our_meteor.segment_scores, our_meteor.corpus_score
    m = Meteor()
    assert abs(float(m.value(S.sum(0))) - theirs) < 1e-9
    assert abs(corpus - theirs) < 1e-12
    np.testing.assert_allclose(m.value(S), theirs_seg, rtol=0, atol=1e-9)
    np.testing.assert_allclose(seg, theirs_seg, rtol=0, atol=1e-12)
    assert abs(np.mean(theirs_seg) - theirs) > 1e-4                    # the corpus value is not a mean of segments


@needs_java
def test_meteor_stats_and_value_of_weighted_sums_equal_rerunning_the_jar(pairs, coco_meteor, our_meteor):
    """`Meteor.stats` gives the same rows, and a bootstrap replicate `value(w @ S)` is pycocoevalcap on the resampled
    pairs."""
    sub = pairs.iloc[:40]
    S = Meteor().stats(sub.reference, sub.hypothesis)
    np.testing.assert_array_equal(S, our_meteor.stats[:40])
    idx = resample_indices(len(pairs), 1, seed=11)[0]
    w = np.bincount(idx, minlength=len(pairs)).astype(float)
    gts, res = coco_inputs(pairs.iloc[idx].reset_index(drop=True))
    assert abs(float(meteor_value(w @ our_meteor.stats)) - coco_meteor.compute_score(gts, res)[0]) < 1e-9


def test_bleu_value_of_weighted_sums_equals_rerunning_pycocoevalcap(pairs):
    from pycocoevalcap.bleu.bleu import Bleu as CocoBleu
    S = get_metric("bleu_4").stats(pairs.reference, pairs.hypothesis)
    W = resample_weights(len(pairs), 5, seed=3)
    for b, idx in enumerate(resample_indices(len(pairs), 5, seed=3)):
        gts, res = coco_inputs(pairs.iloc[idx].reset_index(drop=True))
        assert abs(float(coco_bleu(W[b] @ S)) - CocoBleu(4).compute_score(gts, res, verbose=0)[0][3]) < 1e-12


# --- scores table and bootstrap -----------------------------------------------------------------------------------

def test_sample_stats_feed_the_bootstrap(pairs):
    syn = pairs[pairs.kind == "synthetic"].copy()
    syn["unit"] = syn.groupby("system").cumcount().astype(str)          # 48 units per system
    long = pd.concat([sample_stats(g.reference, g.hypothesis, ["bleu_4", "rouge_l", "chexpert_f1_5"], sample_ids=g.unit,
                                   system=s, dataset="synthetic") for s, g in syn.groupby("system")], ignore_index=True)
    assert list(long.columns[:5]) == ["sample_id", "system", "dataset", "variant", "metric"]
    assert [c for c in long.columns if c.startswith("stat_")] == [f"stat_{j}" for j in range(10)]
    for metric in ("bleu_4", "rouge_l", "chexpert_f1_5"):
        systems, _ = systems_from_scores(long, metric)
        m = get_metric(metric)
        for s, g in syn.groupby("system"):
            est = bootstrap(systems[s], m.value, reps=50, seed=0).estimate
            assert abs(est - score(g.reference, g.hypothesis, [metric]).value[0]) < 1e-12


# --- CheXpert F1 --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("labels,uncertain", [(CHEXPERT_14, True), (CHEXPERT_5, True), (CHEXPERT_5, False)])
def test_chexpert_counts_match_label_alignment(pairs, labels, uncertain):
    ids = pairs.pair_id.tolist()
    al = align_labels(label_reports(pairs.reference.tolist(), ids), label_reports(pairs.hypothesis.tolist(), ids),
                      labels=labels, uncertain_positive=uncertain)
    expected = al.counts.groupby("text_id", sort=False)[["tp", "fp", "fn"]].sum().loc[ids].to_numpy(float)
    m = CheXpertF1(labels=labels, uncertain_positive=uncertain)
    np.testing.assert_array_equal(m.stats(pairs.reference, pairs.hypothesis), expected)
    tp, fp, fn = expected.sum(0)
    assert m.corpus(pairs.reference, pairs.hypothesis) == 2 * tp / (2 * tp + fp + fn)


# --- registry and errors ------------------------------------------------------------------------------------------

def test_registry_and_errors():
    names = list_metrics()
    assert names == ["bleu_1", "bleu_2", "bleu_3", "bleu_4", "rouge_l", "meteor", "cider", "chexpert_f1_14",
                     "chexpert_f1_5"]
    assert all(isinstance(get_metric(n), Metric) for n in list_metrics(radeval=True))
    with pytest.raises(InputError, match="unknown metric 'bleu'"):
        get_metric("bleu")
    with pytest.raises(InputError, match="hypotheses: row 1 is missing"):
        score(["a", "b"], ["a", None])
    with pytest.raises(InputError, match="2 references but 1 hypotheses"):
        score(["a", "b"], ["a"])
    neg = negated("bleu_1")
    assert neg.value(neg.stats(["a b"], ["a c"]).sum(0)) == -get_metric("bleu_1").corpus(["a b"], ["a c"])


def test_metrics_import_without_radeval():
    code = ("import sys; sys.modules['radeval'] = None\n"
            "import cxr_audit.metrics as m\n"
            "assert m.score(['a b'], ['a b'], ['bleu_1']).value[0] > 0.99\n"
            "try:\n    m.get_metric('radeval_rougeL').stats(['a'], ['a'])\n"
            "except ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "pip install radeval==2.2.1 --no-deps" in out.stdout


# --- RadEval, offline: bleu and rouge really run through radeval ----------------------------------------------------

def test_radeval_is_installed():
    importlib.import_module("radeval")           # the bridge tests below must run, not skip


def test_radeval_bleu_is_coco_bleu4_on_raw_text(pairs):
    from radeval.metrics.bleu.bleu import Bleu as RadEvalBleu
    refs, hyps = pairs.reference.tolist(), pairs.hypothesis.tolist()
    corpus, per_sample = RadEvalBleu(4).compute_score(refs, hyps)
    native = radeval_metric("bleu")                                          # computed here, no RadEval
    assert native.name == "radeval_bleu" and isinstance(native, Bleu) and native.tokenize is None
    assert abs(native.corpus(refs, hyps) - corpus) < 1e-12
    bridged = radeval_metric("bleu", native=False)                           # through RadEval(per_sample=True)
    np.testing.assert_allclose(bridged.per_sample(refs, hyps), per_sample, rtol=0, atol=1e-12)
    np.testing.assert_allclose(native.per_sample(refs, hyps), per_sample, rtol=0, atol=1e-12)
    # the bridge's value is the mean of sentence-level BLEU: not RadEval's corpus BLEU
    assert abs(bridged.corpus(refs, hyps) - np.mean(per_sample)) < 1e-12 and abs(np.mean(per_sample) - corpus) > 1e-3
    # and RadEval's public, rounded aggregate agrees with the native corpus value
    from radeval import RadEval
    assert abs(RadEval(metrics=["bleu"], show_progress=False)(refs=refs,
                                                              hyps=hyps)["bleu"] - native.corpus(refs, hyps)) <= 5e-5


def test_radeval_rouge_through_the_bridge(pairs):
    from radeval import RadEval
    from radeval.metrics.rouge.adapter import RougeMetric
    refs, hyps = pairs.reference.tolist(), pairs.hypothesis.tolist()
    raw = RougeMetric()._compute_raw(refs, hyps)
    df = score(refs, hyps, ["radeval_rougeL", "radeval_rouge1", "radeval_rouge2"])
    for key, v in zip(["rougeL", "rouge1", "rouge2"], df.value):
        assert abs(v - raw[key]["aggregate"]) < 1e-12
    public = RadEval(metrics=["rouge"], show_progress=False)(refs=refs, hyps=hyps)
    assert abs(public["rougeL"] - df.value[0]) <= 5e-5
    long = sample_stats(refs, hyps, ["radeval_rougeL"])
    np.testing.assert_allclose(long.value, raw["rougeL"]["per_sample"], rtol=0, atol=1e-12)
    assert abs(df.value[0] - get_metric("rouge_l").corpus(refs, hyps)) > 1e-3    # not the COCO ROUGE-L


def test_radeval_errors_are_one_line_with_radevals_own_error():
    m = get_metric("radeval_radgraph_partial")
    try:
        S = m.stats(["No effusion."], ["No effusion."])      # runs only where RadGraph and its weights are present
        assert S.shape == (1, 2)
    except RadEvalError as e:
        msg = str(e)
        assert msg.startswith("RadEval metric 'radgraph' not available here, because ") and "\n" not in msg
        assert "[RadEval: " in msg and e.reason.startswith("not available here, because ")
    try:
        bundle_metrics(LIGHT_METRICS)
    except InputError as e:
        listed = [n for n in ("bertscore", "radgraph", "f1chexbert") if f"- {n}: not available here, because" in str(e)]
        assert "cannot run here" in str(e) and listed and str(e).startswith(f"{len(listed)} of 5 metrics")
        assert "- bleu:" not in str(e) and "- rouge:" not in str(e)      # these two run here


def test_uncertain_convention_the_issues_example_both_ways():
    # issue 18: the same two cases score F1 0.5 when uncertain counts as positive and 0.0 under the default (the
    # paper's)
    refs = ["Possible left basilar atelectasis.", "Small right pleural effusion. No edema."]
    hyps = ["Left basilar atelectasis.", "Possible mild edema."]
    assert CheXpertF1().corpus(refs, hyps) == 0.0
    assert CheXpertF1(uncertain_positive=True).corpus(refs, hyps) == 0.5
    assert get_metric("chexpert_f1_14", uncertain_positive=True).corpus(refs, hyps) == 0.5
    assert get_metric("chexpert_f1_14").corpus(refs, hyps) == 0.0
    # the labels module agrees under both conventions (one default, one parameter name)
    for unc, f1 in ((False, 0.0), (True, 0.5)):
        al = align_labels(label_reports(refs), label_reports(hyps), uncertain_positive=unc)
        assert al.summary(reps=20).query("metric == 'micro_f1'").estimate.item() == f1
    sc = score(refs, hyps, ["chexpert_f1_14", get_metric("chexpert_f1_5", uncertain_positive=True), "bleu_4"])
    assert sc.note.tolist() == ["labeler cxr_audit:chexpert; uncertain (-1) counted as negative",
                               "labeler cxr_audit:chexpert; uncertain (-1) counted as positive", ""]


# --- BLEU-2 (paper 000) against pycocoevalcap, on real IU X-ray report pairs ------------------------------------------

@pytest.fixture(scope="module")
def iu_pairs():
    "Real IU X-ray wording: each study's findings against another study's findings, and against its own impression."
    v = list(json.loads(IU_JSON.read_text()).values())
    f, i = [x["section_findings"] for x in v], [x["section_impression"] for x in v]
    return f + f, f[1:] + f[:1] + i


@pytest.mark.parametrize("tokenize", ["r2gen", "r2gen_iu", None])
def test_bleu_2_equals_pycocoevalcap_on_real_iu_reports(iu_pairs, tokenize):
    from pycocoevalcap.bleu.bleu import Bleu as CocoBleu
    refs, hyps = iu_pairs
    assert len(refs) == 100 and any("XXXX" in r for r in refs)
    t = tokenizer(tokenize)
    gts, res = {k: [t(r)] for k, r in enumerate(refs)}, {k: [t(h)] for k, h in enumerate(hyps)}
    corpus, per = CocoBleu(2).compute_score(gts, res, verbose=0)
    m = get_metric("bleu_2", tokenize=tokenize)
    assert m.name == "bleu_2" and m.stats(refs, hyps).shape == (100, 6)              # per-sample sufficient statistics
    assert abs(m.corpus(refs, hyps) - corpus[1]) < 1e-12
    np.testing.assert_allclose(m.per_sample(refs, hyps), per[1], rtol=0, atol=1e-12)
    assert 0.05 < corpus[1] < 0.6                                                     # a real, non-degenerate value
    # a bootstrap replicate from the statistics equals pycocoevalcap re-run on the resampled pairs
    idx = resample_indices(100, 1, seed=5)[0]
    w = np.bincount(idx, minlength=100).astype(float)
    gts_b, res_b = {k: [t(refs[j])] for k, j in enumerate(idx)}, {k: [t(hyps[j])] for k, j in enumerate(idx)}
    assert abs(float(m.value(w @ m.stats(refs, hyps))) - CocoBleu(2).compute_score(gts_b, res_b,
                                                                                   verbose=0)[0][1]) < 1e-12


# --- the RadEval bridge: mapping RadEval's real per-sample output to the papers' quantities ---------------------------

def radeval_with(name, scorer):
    """A real `radeval.RadEval` (per-sample mode) whose `name` adapter is RadEval's real class; only the scorer inside
    it,
    the part that needs model weights (absent here, never downloaded), is a stand-in returning numbers in that scorer's
    own return shape. So RadEval's real adapter code builds the real output dict the bridge reads."""
    from radeval import RadEval
    from radeval.metrics._registry import get_metric_class
    ev, adapter = RadEval(metrics=[], per_sample=True, show_progress=False), object.__new__(get_metric_class(name))
    adapter._scorer = scorer
    ev._active_metrics.append(adapter)
    setattr(ev, f"{name}_scorer", scorer)
    return ev


REFS = ["Small left pleural effusion.", "Heart size is normal.", "No pneumothorax."]
HYPS = ["Left effusion.", "Normal heart size.", "Right pneumothorax."]


def test_radgraph_f1_reads_the_partial_level():
    # F1RadGraph(reward_level="all") returns (means, [simple, partial, complete], annotations...)
    class StandInF1RadGraph:
        def __call__(self, refs, hyps):
            per = [[0.9, 0.6, 0.3], [0.7, 0.4, 0.1], [0.5, 0.2, 0.0]]
            return tuple(float(np.mean(p)) for p in per), per, None, None
    ev = radeval_with("radgraph", StandInF1RadGraph())
    out = ev(refs=REFS, hyps=HYPS)
    assert sorted(out) == ["radgraph_complete", "radgraph_partial", "radgraph_simple"]   # RadEval's per-sample keys
    m = get_metric("radgraph_f1", evaluator=ev)
    assert (m.name, m.key, metric_kind(m)) == ("radgraph_f1", "radgraph_partial", "bridged")
    np.testing.assert_allclose(m.per_sample(REFS, HYPS), [0.7, 0.4, 0.1])
    assert abs(m.corpus(REFS, HYPS) - 0.4) < 1e-12
    assert m.note.startswith("RadEval radgraph -> radgraph_partial")
    sc = score(REFS, HYPS, [m])
    assert sc.note[0] == m.note                                                          # named beside the number


def test_radcliq_reads_the_raw_per_sample_values_and_the_paper_flips_the_sign():
    class StandInComposite:         # CompositeMetric.predict returns (1 / mean, per-sample raw RadCliQ-v1)
        def predict(self, refs, hyps):
            raw = np.array([0.5, 1.5, 1.0])[: len(refs)]
            return 1 / raw.mean(), raw
    ev = radeval_with("radcliq", StandInComposite())
    out = ev(refs=REFS, hyps=HYPS)
    assert list(out) == ["radcliq_v1"] and out["radcliq_v1"] == [0.5, 1.5, 1.0]
    corpus_ev = radeval_with("radcliq", StandInComposite()); corpus_ev.per_sample = False
    assert corpus_ev(refs=REFS, hyps=HYPS)["radcliq_v1"] == 1.0                           # RadEval's aggregate: 1/mean
    raw = get_metric("radcliq_v1", evaluator=ev)
    assert raw.higher_is_better is False and abs(raw.corpus(REFS, HYPS) - 1.0) < 1e-12
    paper = get_metric("radcliq_v1_neg", evaluator=ev)
    assert paper.higher_is_better is True and paper.name == "radcliq_v1_neg"
    assert abs(paper.corpus(REFS, HYPS) + 1.0) < 1e-12                                  # -mean, not 1/mean
    np.testing.assert_allclose(paper.per_sample(REFS, HYPS), [-0.5, -1.5, -1.0])
    assert "1/mean" in paper.note and "sign flipped" in paper.note and "not the reciprocal" in paper.note
    with pytest.raises(InputError, match="without per_sample=True"):
        get_metric("radcliq_v1", evaluator=corpus_ev).stats(REFS, HYPS)


def test_crimson_leaves_out_samples_radeval_could_not_score():
    class StandInCRIMSON:           # CRIMSON returns (mean over valid, std, per-sample with NaN for failures, table)
        def __call__(self, refs, hyps, on_sample_done=None):
            s = [0.5, float("nan"), -0.25]
            return float(np.nanmean(s)), 0.0, s, None
    ev = radeval_with("crimson", StandInCRIMSON())
    m = get_metric("crimson", evaluator=ev)
    S = m.stats(REFS, HYPS)
    np.testing.assert_array_equal(S, [[0.5, 1.0], [0.0, 0.0], [-0.25, 1.0]])
    assert abs(m.corpus(REFS, HYPS) - 0.125) < 1e-12 and m.range == (-1.0, 1.0)


def test_radeval_values_checks_the_shape():
    assert radeval_values({"green": [1, None]}, "green", 2)[0] == 1.0
    with pytest.raises(RadEvalError, match="one corpus number"):
        radeval_values({"f1chexbert_5_micro_f1": 0.41}, "f1chexbert_5_micro_f1", 3)
    with pytest.raises(RadEvalError, match="not 'radgraph_partial'"):
        radeval_values({"radgraph_simple": [1.0]}, "radgraph_partial", 1)


def tiny_chexbert(texts, seed=0):
    """RadEval's real CheXbert evaluator code (BaseCheXbertEvaluator, BaseBertLabeler) around a random tiny BERT: no
    weights."""
    torch = pytest.importorskip("torch")
    from transformers import BertConfig, BertModel, BertTokenizer
    from radeval.metrics._chexbert_base import BaseBertLabeler, BaseCheXbertEvaluator
    torch.manual_seed(seed)
    words = sorted({w for t in texts for w in t.lower().replace(".", " ").replace(",", " ").split()})
    backbone = BertModel(BertConfig(vocab_size=len(words) + 5, hidden_size=16, num_hidden_layers=1,
                                    num_attention_heads=2, intermediate_size=32, initializer_range=0.5))
    state = {f"bert.{k}": v for k, v in backbone.state_dict().items()}
    for i in range(14):
        k = 4 if i < 13 else 2
        state[f"linear_heads.{i}.weight"], state[f"linear_heads.{i}.bias"] = torch.randn(k, 16), torch.randn(k)
    vocab = Path(tempfile.mkdtemp()) / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words))

    class TinyCheXbert(BaseCheXbertEvaluator):
        CONDITION_NAMES = ["Enlarged Cardiomediastinum", "Cardiomegaly", "Lung Opacity", "Lung Lesion", "Edema",
                           "Consolidation", "Pneumonia", "Atelectasis", "Pneumothorax", "Pleural Effusion",
                           "Pleural Other", "Fracture", "Support Devices"]
        NO_FINDING, TOP5 = "No Finding", ["Cardiomegaly", "Edema", "Consolidation", "Atelectasis", "Pleural Effusion"]

        def __init__(self):
            super().__init__()
            model = BaseBertLabeler(device="cpu", backbone=backbone, num_4way_heads=13, state_dict=state).eval()
            self._init_evaluator(model=model, tokenizer=BertTokenizer(str(vocab)), device="cpu", batch_size=8)
    return TinyCheXbert()


def test_chexbert_f1_is_radevals_micro_f1_over_5_labels_per_report(iu_pairs):
    """RadEval's f1chexbert_5_micro_f1 is scikit-learn's micro average over the labels of all reports; the per-report
    counts sum to it."""
    from radeval import RadEval
    from sklearn.metrics import classification_report
    refs, hyps = iu_pairs[0][:40], iu_pairs[1][:40]
    scorer = tiny_chexbert(refs + hyps)
    ev = RadEval(metrics=[], per_sample=True, show_progress=False)
    ev.f1chexbert_scorer = scorer                                   # what RadEval(metrics=["f1chexbert"]) exposes
    m5, m14 = get_metric("chexbert_f1_5", evaluator=ev), get_metric("chexbert_f1_14", evaluator=ev)
    assert isinstance(m5, CheXbertF1) and m5.key == "f1chexbert_5_micro_f1" and m14.key == "f1chexbert_all_micro_f1"
    R, H = np.array(scorer.get_labels(refs)), np.array(scorer.get_labels(hyps))
    S5 = m5.stats(refs, hyps)
    np.testing.assert_array_equal(S5, chexbert_counts(R, H, scorer.top5_idx))
    assert S5[:, 0].sum() > 0 and S5[:, 1].sum() > 0 and S5[:, 2].sum() > 0
    top5 = scorer.top5_idx
    theirs5 = classification_report(R[:, top5], H[:, top5], output_dict=True, zero_division=0)["micro avg"]["f1-score"]
    theirs14 = classification_report(R, H, output_dict=True, zero_division=0)["micro avg"]["f1-score"]
    assert abs(m5.corpus(refs, hyps) - theirs5) < 1e-12 and abs(m14.corpus(refs, hyps) - theirs14) < 1e-12
    accuracy = (R[:, top5] == H[:, top5]).mean(1).mean()  # RadEval's per-sample f1chexbert_sample_acc_5, averaged
    assert abs(accuracy - theirs5) > 1e-3                             # ... is another quantity
    # a bootstrap replicate = scikit-learn on the resampled reports
    idx = resample_indices(40, 1, seed=2)[0]
    w = np.bincount(idx, minlength=40).astype(float)
    rep = classification_report(R[idx][:, top5], H[idx][:, top5], output_dict=True,
                                zero_division=0)["micro avg"]["f1-score"]
    assert abs(float(m5.value(w @ S5)) - rep) < 1e-12


def test_the_paper_names_and_what_they_read():
    assert BRIDGED_METRICS["radgraph_f1"] == ("radgraph", "radgraph_partial")
    assert BRIDGED_METRICS["chexbert_f1_5"] == ("f1chexbert", "f1chexbert_5_micro_f1")
    assert [m.key for m in bundle_metrics(["f1chexbert"], check=False)] == ["f1chexbert_5_micro_f1",
                                                                            "f1chexbert_all_micro_f1"]
    assert "chexbert_f1_5" not in list_metrics() and "chexbert_f1_5" in list_metrics(radeval=True)
    # the accuracy stays readable by name
    assert isinstance(get_metric("radeval_f1chexbert_sample_acc_5"), RadEvalMetric)
    assert "ACCURACY" in get_metric("radeval_f1chexbert_sample_acc_5").note


# --- what can run here: one line each ------------------------------------------------------------------------------

PAPER_000 = ["crimson", "green", "radgraph_f1", "ratescore", "radcliq_v1_neg", "chexbert_f1_5", "bleu_2", "rouge_l",
             "bertscore"]


def test_metric_availability_of_paper_000s_set_here():
    av = metric_availability(PAPER_000)
    assert av.columns.tolist() == list(AVAILABILITY_COLUMNS) and av.metric.tolist() == PAPER_000
    native = av.set_index("metric").loc[["bleu_2", "rouge_l"]]
    assert native.available.all() and (native.kind == "native").all() and (native.radeval_key == "").all()
    bridged = av[av.kind == "bridged"]
    assert bridged.radeval_key.tolist() == ["crimson", "green", "radgraph_partial", "ratescore", "radcliq_v1",
                                            "f1chexbert_5_micro_f1", "bertscore"]
    for r in bridged.itertuples():
        assert r.note.startswith("RadEval ") and r.radeval_key in r.note
        if not r.available:
            assert r.reason.startswith("not available here, because ") and "\n" not in r.reason
            assert any(w in r.reason for w in ("package", "weights", "API key", "radeval")), r.reason


def test_a_metric_whose_weights_are_absent_says_so_in_one_line(monkeypatch, tmp_path):
    "bertscore's code imports here; its weights (distilbert-base-uncased) are not in the (empty) Hugging Face cache."
    monkeypatch.setenv("HF_HOME", str(tmp_path)); monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    import huggingface_hub.constants as c
    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path / "hub"))
    static = metric_availability(["bertscore"]).iloc[0]
    assert static.reason == ("not available here, because its weights (distilbert-base-uncased) are not in the local "
                             "Hugging Face cache, and nothing is downloaded here"), static.reason
    with pytest.raises(RadEvalError) as e:
        get_metric("bertscore").stats(["No effusion."], ["No effusion."])
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("RadEval metric 'bertscore' not available here, because its weights "
                                              "(distilbert-base-uncased)")
    assert "[RadEval: " in msg                                                       # RadEval's own error, kept
    loaded = metric_availability(["bertscore"], load=True).iloc[0]
    assert not loaded.available and loaded.reason == e.value.reason


def test_api_key_metrics_need_a_key(monkeypatch):
    for k in ("OPENAI_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY"): monkeypatch.delenv(k, raising=False)
    r = metric_availability(["radfact_ct"]).iloc[0]
    assert not r.available and "no API key is set" in r.reason
    crimson_api = radeval_metric("crimson", provider="openai")
    assert "no API key is set" in metric_availability([crimson_api]).reason[0]


# --- issue 23: the corpus-at-once BLEU / ROUGE-L / CIDEr-D, and one METEOR JVM per process ---------------------------

@pytest.mark.parametrize("tokenize", ["r2gen", None])
def test_fast_metrics_equal_pycocoevalcap_to_1e12_on_real_iu_pairs(pairs, iu_pairs, tokenize):
    """The numpy/rapidfuzz paths against pycocoevalcap itself, per sample and corpus, on real IU wording and the edge
    fixture."""
    from pycocoevalcap.bleu.bleu import Bleu as CocoBleu
    from pycocoevalcap.cider.cider import Cider as CocoCider
    from pycocoevalcap.rouge.rouge import Rouge as CocoRouge
    from cxr_audit.metrics import bleu_stats, cider_d_scores, rouge_l_scores
    t = tokenizer(tokenize)
    refs = [t(x) for x in iu_pairs[0] + list(pairs.reference)]
    hyps = [t(x) for x in iu_pairs[1] + list(pairs.hypothesis)]
    gts, res = {i: [r] for i, r in enumerate(refs)}, {i: [h] for i, h in enumerate(hyps)}
    corpus, per = CocoBleu(4).compute_score(gts, res, verbose=0)
    S = bleu_stats(refs, hyps, 4)
    for n in range(1, 5):
        m = get_metric(f"bleu_{n}", tokenize=None)
        assert abs(m.value(m.stats(refs, hyps).sum(0)) - corpus[n - 1]) < 1e-12
        np.testing.assert_allclose(m.per_sample(refs, hyps), per[n - 1], rtol=0, atol=1e-12)
    np.testing.assert_array_equal(get_metric("bleu_4", tokenize=None).stats(refs, hyps), S)
    rc, rper = CocoRouge().compute_score(gts, res)
    np.testing.assert_allclose(rouge_l_scores(refs, hyps), rper, rtol=0, atol=1e-12)
    assert abs(get_metric("rouge_l", tokenize=None).corpus(refs, hyps) - rc) < 1e-12
    cc, cper = CocoCider().compute_score(gts, res)
    np.testing.assert_allclose(cider_d_scores(refs, hyps), cper, rtol=0, atol=1e-12)
    assert abs(get_metric("cider", tokenize=None).corpus(refs, hyps) - cc) < 1e-12


def test_fast_bleu_stats_are_the_pairwise_definition(pairs):
    "`bleu_stats` (whole corpus, numpy) gives exactly the integers of `bleu_pair_stats` (one pair, Counters)."
    from cxr_audit.metrics import bleu_pair_stats, bleu_stats
    t = tokenizer("r2gen")
    refs, hyps = [t(x) for x in pairs.reference], [t(x) for x in pairs.hypothesis]
    for n in (1, 2, 4):
        np.testing.assert_array_equal(bleu_stats(refs, hyps, n),
                                      np.array([bleu_pair_stats(r, h, n) for r, h in zip(refs, hyps)], float))


def _jvm_pids():
    from cxr_audit import meteor
    return sorted(j.proc.pid for j in meteor._METEOR_JVMS.values())


def _alive(pid):
    if not _pid_alive(pid): return False
    st = Path(f"/proc/{pid}/stat")              # a child not yet reaped (a zombie) has ended
    return not (st.exists() and st.read_text().split()[2] == "Z")


@needs_java
def test_meteor_uses_one_jvm_per_process_and_close_ends_it():
    from cxr_audit import meteor
    from cxr_audit.meteor import close_meteor, run_meteor
    close_meteor()
    m = Meteor(tokenize=None)
    a = m.jar_scores(["no acute process . the heart is normal ."], ["no acute process ."])
    pids = _jvm_pids()
    assert len(pids) == 1 and _alive(pids[0])
    args = Path(f"/proc/{pids[0]}/cmdline").read_bytes().split(b"\0")
    # the quick compiler and one GC thread (meteor.meteor_jvm_options)
    assert all(o.encode() in args for o in meteor.METEOR_JVM_OPTIONS)
    b = m.jar_scores(["the heart is normal ."], ["heart normal ."])
    c = run_meteor(["the heart is normal ."], ["heart normal ."], evaluate=True)
    assert _jvm_pids() == pids  # three calls with words the jar covers, one JVM
    assert 0 < a.corpus_score < 1
    assert abs(float(meteor_value(b.stats.sum(0))) - b.corpus_score) < 1e-12 and c.corpus_score == b.corpus_score
    # new words: a replacement jar, the old one ended
    d = run_meteor(["mild cardiomegaly ."], ["the heart is enlarged ."])
    (new,) = _jvm_pids()
    assert new != pids[0] and not _alive(pids[0])
    e = run_meteor(["heart normal ."], ["the heart is normal ."])  # old words: the replacement's table is the union
    assert _jvm_pids() == [new] and d.stats.shape == e.stats.shape == (1, 23)
    m.close()
    assert _jvm_pids() == [] and not _alive(new)
    assert close_meteor() == 0


@needs_java
def test_a_long_meteor_batch_shared_over_two_jars_gives_the_same_statistics(monkeypatch):
    """Above METEOR_SPLIT new pairs, two jars score alternate pairs at once; the statistics equal one jar's, pair for
    pair."""
    from cxr_audit import meteor
    from cxr_audit.meteor import close_meteor, run_meteor
    refs = [f"the heart is normal . no effusion in case {i} ." for i in range(40)]
    hyps = [f"heart size normal . small effusion {i % 7} ." for i in range(40)]
    monkeypatch.setattr(meteor, "METEOR_SPLIT", 10)
    monkeypatch.setenv("CXR_AUDIT_METEOR_JARS", "2")
    close_meteor(); meteor._METEOR_ANSWERS.clear()
    two = run_meteor(refs, hyps).stats
    assert len(_jvm_pids()) == 2                                         # both jars ran, and stay for the next call
    tables = {j.table for j in meteor._METEOR_JVMS.values()}
    assert len(tables) == 1                                              # sharing one paraphrase subset file
    monkeypatch.setenv("CXR_AUDIT_METEOR_JARS", "1")
    close_meteor(); meteor._METEOR_ANSWERS.clear()
    one = run_meteor(refs, hyps).stats
    assert len(_jvm_pids()) == 1
    np.testing.assert_array_equal(two, one)
    close_meteor()


@needs_java
def test_two_callers_at_once_ask_the_jar_for_each_pair_once(monkeypatch):
    """A background prefetch and a stage asking overlapping pairs at the same time: the second waits for the first's
    answers and asks only the rest (it used to ask them all again)."""
    from cxr_audit import meteor
    from cxr_audit.meteor import close_meteor, run_meteor
    close_meteor(); meteor._METEOR_ANSWERS.clear()
    asked, real_ask = [], meteor._MeteorJar.ask
    def counting_ask(self, lines, *args, **kwargs):   # a spy: the real jar answers
        asked.extend(line for line in lines if line.startswith("SCORE"))
        return real_ask(self, lines, *args, **kwargs)
    monkeypatch.setattr(meteor._MeteorJar, "ask", counting_ask)
    refs = [f"the heart is normal . no effusion in case {i} ." for i in range(300)]
    hyps = [f"heart size normal . small effusion {i % 7} ." for i in range(300)]
    first = []
    th = threading.Thread(target=lambda: first.append(run_meteor(refs, hyps)))
    th.start()
    later = run_meteor(refs[100:], hyps[100:])   # two thirds of the first caller's pairs
    th.join()
    assert len(asked) == len(set(asked)) == 300
    np.testing.assert_array_equal(later.stats, first[0].stats[100:])
    close_meteor()


@needs_java
def test_meteor_jvm_options_change_no_statistic(monkeypatch):
    "The JVM's default compilers and collector (no options) give the same statistics, bit for bit, on real IU reports."
    from cxr_audit.meteor import close_meteor, meteor_jvm_options, run_meteor
    data = json.loads(IU_JSON.read_text())
    iu = [v.get("section_findings") or v.get("report") or "" for v in data.values()][:60]
    refs, hyps = iu, iu[7:] + iu[:7]
    close_meteor()
    ours = run_meteor(refs, hyps, evaluate=True)
    monkeypatch.setenv("CXR_AUDIT_METEOR_JVM_OPTIONS", "")
    assert meteor_jvm_options() == []
    plain = run_meteor(refs, hyps, evaluate=True)  # another command line: its own jar, no kept answers
    assert _jvm_pids() and len(_jvm_pids()) == 2
    close_meteor()
    np.testing.assert_array_equal(ours.stats, plain.stats)
    assert ours.corpus_score == plain.corpus_score and (ours.stats[:, 0] > 0).all()
    monkeypatch.setenv("CXR_AUDIT_METEOR_JVM_OPTIONS", "-Xss4m -XX:+UseSerialGC")
    assert meteor_jvm_options() == ["-Xss4m", "-XX:+UseSerialGC"]


AWKWARD = ["The patient\u2019s heart size is normal; cardiac silhouette unremarkable.",
           "Café-au-lait naïve ÉTUDE – “quoted” … 5,000 cm³", "AP/PA views (2) & lateral: no acute disease!?",
           "1.5cm nodule at the right-sided base, well-defined_edge",
           "There is &quot;mild&quot; edema &amp; small effusions... don't / don’t", "Heart size within normal limits.",
           "the heart is of normal size , the lungs are clear", "no evidence of pneumothorax or pleural effusion",
           "Tubes: ET tube 5 cm above the carina\tNG tube in the stomach", "LUNGS ARE HYPERINFLATED BUT CLEAR"]


@needs_java
def test_meteor_paraphrase_subset_gives_the_full_tables_statistics():
    """Every pair's 23 statistics with the paraphrase subset equal those with the jar's full table: real IU X-ray
    reports crossed with each other, and awkward text (Unicode, entities, punctuation, numbers), raw and
    R2Gen-tokenized."""
    from cxr_audit import meteor
    from cxr_audit.meteor import close_meteor, paraphrase_index, run_meteor
    data = json.loads(IU_JSON.read_text())
    iu = [v.get("section_findings") or v.get("report") or "" for v in data.values()]
    refs = iu + AWKWARD + AWKWARD[::-1]
    hyps = [iu[(i * 7 + 3) % len(iu)] for i in range(len(iu))] + AWKWARD[::-1] + AWKWARD
    t = tokenizer("r2gen")
    cases = [(refs, hyps), ([t(r) for r in refs], [t(h) for h in hyps])]
    close_meteor()
    subset = [run_meteor(r, h, paraphrase="subset").stats for r, h in cases]
    close_meteor()
    full = [run_meteor(r, h, paraphrase="full").stats for r, h in cases]
    # a full-table jar answered (not answers kept from the subset)
    assert [j.words for j in meteor._METEOR_JVMS.values()] == [None]
    close_meteor()
    for a, b in zip(subset, full): np.testing.assert_array_equal(a, b)
    para = 4 + 4 * 3  # stage 4 (paraphrase) content matches, test side
    assert (full[0][:, para] > 0).sum() >= 3    # the paraphrase stage matched: the subset kept those entries
    assert len(paraphrase_index()) > 5_000_000  # the index is the whole table


def test_paraphrase_index_is_built_once_by_concurrent_processes(tmp_path):
    """Two processes asking for the index of one table at once: one builds it, both load the same arrays; later calls
    load it."""
    import gzip
    jar = tmp_path / "meteor" / "meteor-1.5.jar"
    (jar.parent / "data").mkdir(parents=True); jar.write_bytes(b"")
    with gzip.open(jar.parent / "data" / "paraphrase-en.gz", "wt", encoding="utf-8") as f:
        f.write("".join(f"0.{i + 1}\nword{i} common\nother{i}\n" for i in range(3000)))
    code = ("import sys; from cxr_audit.metrics import paraphrase_index; i = paraphrase_index(sys.argv[1], "
            "sys.argv[2]); print(len(i), i.entries({'word7', 'common', 'other7'}).tolist())")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(jar), str(tmp_path / "idx")], stdout=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300)[0].strip() for p in procs]
    assert outs == ["3000 [7]", "3000 [7]"] and all(p.returncode == 0 for p in procs)
    built = [d for d in (tmp_path / "idx").iterdir() if d.is_dir()]
    assert len(built) == 1 and sorted(f.name for f in built[0].iterdir()) == ["ids.npy", "n_para.npy", "n_phrase.npy",
                                                                              "probs.npy", "source.txt", "words.txt"]


@needs_java
def test_meteor_replaces_a_jvm_that_died():
    from cxr_audit.meteor import close_meteor, run_meteor
    close_meteor()
    first = run_meteor(["no pleural effusion ."], ["no effusion ."], evaluate=True)
    (pid,) = _jvm_pids()
    os.kill(pid, 9)                                                       # our own JVM, started by this test
    again = run_meteor(["no pleural effusion ."], ["no effusion ."], evaluate=True)
    assert _jvm_pids() != [pid] and again.corpus_score == first.corpus_score
    close_meteor()


@needs_java
def test_meteor_jvm_ends_when_python_exits():
    code = ("from cxr_audit.metrics import Meteor; from cxr_audit.meteor import _METEOR_JVMS; "
            "Meteor(tokenize=None).stats(['a b'], ['a b']); print([j.proc.pid for j in _METEOR_JVMS.values()][0])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    pid = int(out.stdout.split()[-1])
    assert not _alive(pid)


@needs_java
def test_meteor_capped_rows_are_noted_in_the_scores_table():
    refs, hyps = ["no acute process .", "the heart is normal .", "lungs clear ."], ["no acute process .",
                                                                                    "one two three four five six seven",
                                                                                    "lungs clear ."]
    m = Meteor(tokenize=None, max_tokens=5)
    with pytest.warns(UserWarning, match=r"rows \[1\]"):
        long = sample_stats(refs, hyps, [m, "bleu_1"])
    notes = long.set_index(["metric", "sample_id"]).note
    assert notes["meteor"].tolist() == ["", "METEOR scored the first 5 tokens only (reference or hypothesis cut)", ""]
    assert (notes["bleu_1"] == "").all()
    with pytest.warns(UserWarning):
        sc = score(refs, hyps, [m])
    assert sc.note.item() == "1 pair(s) cut to their first 5 tokens (rows [1])"
    neg = negated(Meteor(tokenize=None, max_tokens=5))
    with pytest.warns(UserWarning):
        assert sample_stats(refs, hyps, [neg]).note.tolist()[1].startswith("METEOR scored the first 5")
    assert Meteor(tokenize=None).row_notes(3) == ["", "", ""]


def test_radeval_bleu_says_why_it_is_lower_than_bleu_4():
    "Issue 21: the page showed radeval_bleu 0.000084 beside bleu_4 0.742 without a word; the note now explains it."
    refs, hyps = ["The heart is normal in size.", "No pleural effusion."], ["Heart is normal in size, stable.",
                                                                            "No pleural effusion."]
    sc = score(refs, hyps, ["bleu_4", "radeval_bleu"]).set_index("metric")
    assert abs(sc.value["radeval_bleu"] - 8.44e-5) < 1e-7 and abs(sc.value["bleu_4"] - 0.742) < 1e-3
    note = sc.note["radeval_bleu"]
    assert "raw text" in note and "same pycocoevalcap scorer as bleu_4" in note and sc.note["bleu_4"] == ""
    assert get_metric("radeval_bleu").stats(refs, hyps).sum(0)[3] == 0          # no 4-gram match on the raw split
    assert metric_availability(["radeval_bleu"]).note.item() == note
