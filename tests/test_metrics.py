"Integration tests of `cxr_audit.metrics`: equality with pycocoevalcap, METEOR's corpus value, resampling, CheXpert F1, RadEval."
import importlib
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cxr_audit.core import InputError
from cxr_audit.labels import CHEXPERT_5, CHEXPERT_14, align_labels, label_reports
from cxr_audit.metrics import (LIGHT_METRICS, Bleu, CheXpertF1, Meteor, Metric, RadEvalError, bundle_metrics, coco_bleu,
                               compare_with_pycocoevalcap, get_metric, list_metrics, meteor_value, negated,
                               radeval_metric, sample_stats, score, tokenizer)
from cxr_audit.stats import bootstrap, resample_indices, resample_weights, systems_from_scores

FIX = Path(__file__).parent / "fixtures" / "metrics"
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
    "`Meteor.stats` gives the same rows, and a bootstrap replicate `value(w @ S)` is pycocoevalcap on the resampled pairs."
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
    assert names == ["bleu_1", "bleu_2", "bleu_3", "bleu_4", "rouge_l", "meteor", "cider", "chexpert_f1_14", "chexpert_f1_5"]
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
    assert abs(RadEval(metrics=["bleu"], show_progress=False)(refs=refs, hyps=hyps)["bleu"] - native.corpus(refs, hyps)) <= 5e-5


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


def test_radeval_errors_are_surfaced_with_a_hint():
    m = get_metric("radeval_radgraph_partial")
    try:
        S = m.stats(["No effusion."], ["No effusion."])      # runs only where RadGraph and its weights are present
        assert S.shape == (1, 2)
    except RadEvalError as e:
        msg = str(e)
        assert msg.startswith("RadEval metric 'radgraph' failed: ") and "\nhint: " in msg
    try:
        bundle_metrics(LIGHT_METRICS)
    except InputError as e:
        listed = [n for n in ("bertscore", "radgraph", "f1chexbert") if f"- {n}:" in str(e)]
        assert "cannot run here" in str(e) and listed and str(e).startswith(f"{len(listed)} of 5 metrics")
        assert "- bleu:" not in str(e) and "- rouge:" not in str(e)      # these two run here


def test_uncertain_convention_the_issues_example_both_ways():
    # issue 18: the same two cases score F1 0.5 when uncertain counts as positive and 0.0 under the default (the paper's)
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
    assert sc.note.tolist() == ["uncertain (-1) counted as negative", "uncertain (-1) counted as positive", ""]
