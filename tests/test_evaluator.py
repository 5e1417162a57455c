"""Integration tests of cxr_audit.evaluator (the worked examples live in nbs/12_evaluator.ipynb).

Here: the bootstrap by weights against re-running each metric on explicit resamples with the same draws (BLEU-4,
ROUGE-L, METEOR via the jar, CheXpert-F1, and the small, explained CIDEr-D difference), clustered resamples, the
evaluator end to end with a tiny random Hugging Face model from `cxr_audit.generate`, threaded dataset reading,
determinism, `score_systems` on impressions with its saved files, and metrics that cannot run (no Java).
"""
import shutil
import time

import numpy as np
import pandas as pd
import pytest

from cxr_audit.core import InputError
from cxr_audit.evaluator import ReportGenerationEvaluator, results_summary, score_pairs, score_systems, study_section
from cxr_audit.generate import SimulatedGenerator
from cxr_audit.metrics import get_metric
from cxr_audit.stats import UnderpoweredWarning, resample_weights
from cxr_audit.synth import make_demo_corpus

FIVE = ["bleu_4", "rouge_l", "meteor", "cider", "chexpert_f1_5"]
HAVE_JAVA = shutil.which("java") is not None


@pytest.fixture(scope="module")
def demo():
    return make_demo_corpus(n_patients=20, seed=3)


@pytest.fixture(scope="module")
def evaluated(demo):
    "sim-omit over the demo studies, all five metrics, 40 resamples (one METEOR JVM for the whole run)."
    metrics = FIVE if HAVE_JAVA else [m for m in FIVE if m != "meteor"]
    ev = ReportGenerationEvaluator(SimulatedGenerator("sim-omit", demo), dataset=demo.studies, metrics=metrics,
                                   n_bootstrap=40, bootstrap_seed=11)
    return ev, ev.evaluate()


def _resample(ev, r, W):
    "The explicit resample of replicate r: pair i repeated W[r, i] times."
    rows = np.repeat(np.arange(len(ev.pairs_)), W[r])
    return ev.pairs_.reference.to_numpy()[rows].tolist(), ev.pairs_.hypothesis.to_numpy()[rows].tolist()


@pytest.mark.parametrize("name", ["bleu_4", "rouge_l", "chexpert_f1_5", "meteor"])
def test_bootstrap_equals_rerunning_the_metric(evaluated, name):
    ev, df = evaluated
    if name == "meteor" and not HAVE_JAVA: pytest.skip("no Java: METEOR cannot run")
    W = resample_weights(len(ev.pairs_), 40, seed=11)
    S, _ = ev.stats_[name]
    m = get_metric(name)
    for r in (range(0, 40, 8) if name != "meteor" else (17,)):             # METEOR: one JVM per re-run
        refs, hyps = _resample(ev, r, W)
        run = m.jar_scores(refs, hyps) if name == "meteor" else None
        S_r, jar = (run.stats, run.corpus_score) if run is not None else (m.stats(refs, hyps), None)
        # the same sufficient statistics, summed in another order ...
        if name == "rouge_l": np.testing.assert_allclose(W[r] @ S, S_r.sum(0), rtol=1e-13)
        else: np.testing.assert_array_equal(W[r] @ S, S_r.sum(0))           # counts: exact
        # ... hence the same value as re-running the metric on the resampled pairs
        np.testing.assert_allclose(df[name].iloc[r + 1], float(m.value(S_r.sum(0))), rtol=1e-12, atol=0)
        # and the jar's own corpus score
        if jar is not None: np.testing.assert_allclose(df[name].iloc[r + 1], jar, rtol=1e-9)


def test_cider_holds_the_idf_fixed(evaluated):
    "Re-running CIDEr-D on a resample recomputes its IDF from the resampled references; ours keeps the full set's IDF."
    ev, df = evaluated
    W = resample_weights(len(ev.pairs_), 40, seed=11)
    S, _ = ev.stats_["cider"]
    diffs = []
    for r in range(40):
        refs, hyps = _resample(ev, r, W)
        rerun = float(get_metric("cider").value(get_metric("cider").stats(refs, hyps).sum(0)))
        np.testing.assert_allclose(df.cider.iloc[r + 1], float(get_metric("cider").value(W[r] @ S)), rtol=1e-12)
        diffs.append(df.cider.iloc[r + 1] - rerun)
    diffs = np.array(diffs)
    spread = df.cider.iloc[1:].std()
    assert np.abs(diffs).max() > 0                          # the two schemes do differ ...
    # ... by much less than the bootstrap spread
    assert np.abs(diffs).mean() < 0.35 * spread, (np.abs(diffs).mean(), spread)
    assert abs(diffs.mean()) < 0.25 * spread


def test_clustered_bootstrap_moves_patients_together(demo):
    ev = ReportGenerationEvaluator(SimulatedGenerator("sim-verbose", demo), dataset=demo.studies,
                                   metrics=["bleu_4", "chexpert_f1_5"], n_bootstrap=100, bootstrap_seed=5,
                                   clusters="patient_id")
    df = ev.evaluate()
    cl = ev.pairs_.cluster.tolist()
    W = resample_weights(len(cl), 100, seed=5, clusters=cl)
    members = {c: [i for i, x in enumerate(cl) if x == c] for c in dict.fromkeys(cl)}
    assert all(len(set(W[:, m].T.tolist()[0])) >= 1 and (W[:, m] == W[:, m[:1]]).all() for m in members.values())
    for r in range(0, 100, 25):
        refs, hyps = _resample(ev, r, W)
        np.testing.assert_allclose(df.bleu_4.iloc[r + 1], score_pairs(refs, hyps, ["bleu_4"]).bleu_4[0], rtol=1e-12)
    assert ev.bootstrap_["bleu_4"].n_clusters == demo.studies.patient_id.nunique()


def test_determinism_and_stage_b(demo, tmp_path):
    "Same seed, same bytes; the two-stage workflow gives the one-stage numbers."
    mk = lambda d: ReportGenerationEvaluator(SimulatedGenerator("sim-terse", demo), dataset=demo.studies,
                                             metrics=["bleu_4", "cider"], n_bootstrap=30, bootstrap_seed=2,
                                             output_dir=d)
    a, b = mk(tmp_path / "a"), mk(tmp_path / "b")
    a.save_results(a.evaluate()); b.save_results(b.evaluate())
    for f in ("results.csv", "results_summary.csv", "generations.csv"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f
    pq = mk(tmp_path / "c").generate_only()
    pairs = pd.read_parquet(pq)
    pd.testing.assert_frame_equal(score_pairs(pairs.reference, pairs.hypothesis, ["bleu_4", "cider"], 30, seed=2),
                                  a.results_)


def test_threaded_reading_keeps_order():
    class Slow:
        def __len__(self): return 12
        def __getitem__(self, i):
            time.sleep(0.01 * ((7 * i) % 5))
            return {"img": f"{i}.png", "id": f"s{i}", "report": f"FINDINGS: finding number {i} ."}
    gen = lambda imgs: [f"finding number {p.split('.')[0]} ." for p in imgs]
    ev = ReportGenerationEvaluator(gen, dataset=Slow(), metrics=["bleu_1"], num_workers=4, batch_size=5)
    ev.generate()
    assert ev.pairs_.sample_id.tolist() == [f"s{i}" for i in range(12)]
    assert (ev.pairs_.reference == ev.pairs_.hypothesis).all()
    assert ev.evaluate().bleu_1[0] == pytest.approx(1.0)


def test_with_a_tiny_hugging_face_generator(tmp_path):
    """The evaluator drives cxr_audit.generate's HFReportGenerator (a tiny random ViT+GPT-2) on PNG files, with
    indications."""
    pytest.importorskip("torch"); pytest.importorskip("transformers")
    from PIL import Image
    from cxr_audit.generate import get_policy, tiny_model
    import dataclasses
    paths = []
    for i in range(5):
        p = tmp_path / f"img{i}.png"
        Image.fromarray(np.random.default_rng(i).integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(p)
        paths.append(str(p))
    reports = ["INDICATION: Cough.\nFINDINGS: the lungs are clear .", "FINDINGS: small left effusion .",
               "IMPRESSION: no acute process .", "INDICATION: Fever.\nFINDINGS: mild edema .",
               "FINDINGS: heart size is normal ."]
    ds = [{"img": p, "study_id": f"s{i}", "report": r} for i, (p, r) in enumerate(zip(paths, reports))]
    policy = dataclasses.replace(get_policy("G1"), max_new_tokens=12)
    gen = tiny_model("encoder-decoder").generator(policy=policy, batch_size=2)
    ev = ReportGenerationEvaluator(gen, dataset=ds, metrics=["bleu_1", "rouge_l"], use_indication=True, batch_size=2,
                                   n_bootstrap=20)
    assert ev.arity == 2
    df = ev.evaluate()
    assert df.shape == (21, 6) and ev.counts_["samples"] == 5
    assert ev.counts_["scored"] + ev.counts_["empty_hypothesis"] == 5
    again = ReportGenerationEvaluator(gen, dataset=ds, metrics=["bleu_1", "rouge_l"], use_indication=True, batch_size=3,
                                      n_bootstrap=20)
    pd.testing.assert_frame_equal(again.evaluate(), df)  # greedy decoding: the same reports whatever the batching


def test_score_systems_on_impressions_and_save(demo, tmp_path):
    with pytest.warns(UnderpoweredWarning, match="score_systems: with 300 resamples and 12 comparisons"):
        res = score_systems(demo.generations, demo.studies, "bleu_4,rouge_l,chexpert_f1_5", reps=300, seed=1,
                            baseline="sim-verbose+B4", ref_section="impression")
    paths = res.save(tmp_path / "out")
    sys_, cmp_ = pd.read_csv(paths["systems"]), pd.read_csv(paths["comparisons"])
    assert set(sys_.config) == {"sim-verbose+B4", "sim-terse+B4", "sim-template+B4", "sim-template+K50", "sim-omit+B4"}
    assert (cmp_["first"] == "sim-verbose+B4").all() and len(cmp_) == 12
    assert (cmp_.p_holm >= cmp_.p - 1e-15).all()
    assert (cmp_.significant == (cmp_.p_holm < 0.05)).all()              # significance follows Holm, in the file too
    assert res.counts["clusters"] == demo.studies.patient_id.nunique()
    # the reference really was the impression
    refs = [study_section(r, "impression") for r in demo.studies.to_dict("records")]
    assert refs != [study_section(r, "findings") for r in demo.studies.to_dict("records")]
    one = demo.generations.query("system == 'sim-omit'")
    ref_of = dict(zip(demo.studies.study_id, refs))
    est = score_pairs([ref_of[s] for s in one.study_id], one.hypothesis, ["bleu_4"]).bleu_4[0]
    omit = sys_.query("config == 'sim-omit+B4' and metric == 'bleu_4'")
    assert omit.estimate.iloc[0] == pytest.approx(est, rel=1e-12)
    scores = pd.read_parquet(paths["scores"])
    assert len(scores) == 5 * 3 * len(demo.studies)
    # bad input names the table, the column or the row
    with pytest.raises(InputError, match=r"bad.csv: missing column\(s\) 'hypothesis'"):
        score_systems(demo.generations.drop(columns="hypothesis"), what=("bad.csv", "studies"))
    bad = demo.generations.assign(study_id=["x"] + demo.generations.study_id.tolist()[1:])
    with pytest.raises(InputError, match=r"bad2.parquet: row 0: study_id 'x' is not in s.parquet"):
        score_systems(bad, demo.studies, what=("bad2.parquet", "s.parquet"))


def test_metrics_that_cannot_run_are_noted(demo, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")                   # no java on PATH
    with pytest.warns(UnderpoweredWarning):
        res = score_systems(demo.generations, demo.studies, ["bleu_4", "rouge_l", "meteor", "cider", "chexpert_f1_5"],
                            reps=100, baseline=0, by="system,policy", first_seed=True, skip_unavailable=True)
    assert len(res.notes) == 1 and "meteor" in res.notes[0] and "Java" in res.notes[0], res.notes
    table = res.summary()
    assert "meteor" not in table.columns and {"bleu_4", "cider", "chexpert_f1_5"} <= set(table.columns)
    assert any("IDF" in c for c in res.caveats()) and res.notes[0] in res.caveats()


def test_multi_leaf_metrics_are_flattened():
    from cxr_audit.stats import micro_precision, micro_recall, micro_f1, micro_stats

    class TokenPRF:
        name, higher_is_better, range, leaves = "tokens", True, (0.0, 1.0), ("precision", "recall", "f1")
        def stats(self, refs, hyps):
            tp = [len(set(r.split()) & set(h.split())) for r, h in zip(refs, hyps)]
            return micro_stats(tp, [len(set(h.split())) - t for h, t in zip(hyps, tp)],
                               [len(set(r.split())) - t for r, t in zip(refs, tp)])
        def value(self, T): return np.stack([micro_precision(T), micro_recall(T), micro_f1(T)], axis=-1)
        def per_sample(self, refs, hyps): return self.value(self.stats(refs, hyps))[:, 2]

    df = score_pairs(["a b c", "d e"], ["a b", "d e f"], [TokenPRF(), "bleu_1"], reps=10)
    assert df.columns.tolist() == ["label", "fold", "seed", "bootstrap", "tokens.precision", "tokens.recall",
                                   "tokens.f1", "bleu_1"]
    assert df.iloc[0, 4:7].tolist() == pytest.approx([4 / 5, 4 / 5, 4 / 5])
    assert results_summary(df).metric.tolist() == ["tokens.precision", "tokens.recall", "tokens.f1", "bleu_1"]


def test_radeval_names_give_flattened_columns():
    "The documented bundles' RadEval names: one column per output, `metric.output` when there are several."
    pytest.importorskip("radeval")
    df = score_pairs(["the lungs are clear .", "small left effusion ."], ["lungs are clear .", "left effusion ."],
                     ["bleu", "rouge"], reps=5)
    assert df.columns.tolist()[4:] == ["bleu", "rouge.rougeL", "rouge.rouge1", "rouge.rouge2"]
    assert ((df.iloc[:, 4:] >= 0) & (df.iloc[:, 4:] <= 1)).all().all()
    with pytest.raises(InputError, match="unknown metric 'no_such_metric'"):
        ReportGenerationEvaluator(lambda imgs: imgs, dataset=[], metrics=["bleu_4", "no_such_metric"])


# --- paper 001: the default metrics, and max_samples counting scored pairs
# ---------------------------------------------

def test_the_default_is_full_metrics_and_fails_early_and_clearly_here():
    "ReportGenerationEvaluator() without metrics follows paper 001 (FULL_METRICS); here it stops before any generation."
    from cxr_audit.metrics import FULL_METRICS, metric_availability
    calls = []
    def gen(imgs): calls.append(imgs); return ["x"] * len(imgs)
    ds = [{"img": "a.png", "study_id": "s1", "report": "FINDINGS: Lungs clear."}]
    av = metric_availability(list(FULL_METRICS), load=True)
    if av.available.all(): pytest.skip("every FULL_METRICS metric loads on this machine (weights and keys present)")
    with pytest.raises(InputError) as e:
        ReportGenerationEvaluator(gen, dataset=ds)
    msg = str(e.value)
    assert calls == []                                                          # nothing generated
    bad = av[~av.available]
    assert msg.startswith(f"ReportGenerationEvaluator: {len(bad)} of the 16 metrics asked for cannot load here "
                          "(metrics defaults to FULL_METRICS")
    for r in bad.itertuples():  # every one, one line each, with its reason
        assert f"\n- {r.metric}: not available here, because " in msg
    for r in av[av.available].itertuples():
        assert f"- {r.metric}:" not in msg
    assert "Offline alternative: metrics=('bleu_4', 'rouge_l', 'chexpert_f1_5')" in msg
    # the alternative it names works, on the same data
    ok = ReportGenerationEvaluator(gen, dataset=ds, metrics=("bleu_4", "rouge_l", "chexpert_f1_5"))
    assert [m.name for m in ok.metrics] == ["bleu_4", "rouge_l", "chexpert_f1_5"]


def test_max_samples_caps_scored_pairs(tmp_path):
    "Samples with an empty reference, an empty or a failed generation do not count towards max_samples (paper 001)."
    reports = {f"s{i}": f"FINDINGS: finding number {i} ." for i in range(12)}
    for i in (1, 2, 5): reports[f"s{i}"] = "INDICATION: Cough."  # empty references (no findings/impression)
    ds = pd.DataFrame({"img": [f"{k}.png" for k in reports], "study_id": list(reports),
                       "report": list(reports.values())})
    asked = []
    def gen(imgs):
        asked.extend(imgs)
        if "s6.png" in imgs and len(imgs) == 1: raise RuntimeError("decoder crashed")   # fails alone (and in its batch)
        if "s6.png" in imgs: raise RuntimeError("batch failed")
        return ["" if p == "s3.png" else f"finding number {p[1:-4]} ." for p in imgs]  # empty generation for s3
    with pytest.warns(UserWarning, match="failed on 1 sample"):
        ev = ReportGenerationEvaluator(gen, dataset=ds, metrics=["bleu_1"], batch_size=3, max_samples=5, num_workers=0)
        g = ev.generate()
    assert ev.counts_["scored"] == 5 and len(ev.pairs_) == 5
    assert ev.pairs_.sample_id.tolist() == ["s0", "s4", "s7", "s8", "s9"]
    assert ev.counts_ == {"samples": 10, "scored": 5, "empty_reference": 3, "masked_reference": 0,
                          "empty_hypothesis": 1, "failed": 1}
    assert g.status.tolist() == ["scored", "empty_reference", "empty_reference", "empty_hypothesis", "scored",
                                 "empty_reference", "failed", "scored", "scored", "scored"]
    assert "s10.png" not in asked and "s11.png" not in asked                          # nothing generated past the cap
    assert ev.evaluate().bleu_1[0] == pytest.approx(1.0)
    paths = ev.save_results(output_dir=tmp_path)
    assert pd.read_csv(paths["generations"]).shape[0] == 5
    assert pd.read_csv(paths["results_summary"]).columns[-1] == "note"


def test_a_missing_reference_section_is_said_and_an_absent_one_refused():
    """Scoring against the impression when no study has one would silently score against the findings: refused; a few:
    said."""
    from cxr_audit.core import InputError
    from cxr_audit.evaluator import score_systems
    studies = pd.DataFrame({"study_id": ["s1", "s2", "s3"],
                            "findings": ["Small left effusion.", "Clear lungs.", "Mild edema."],
                            "impression": ["", "", ""]})
    gens = pd.DataFrame({"study_id": ["s1", "s2", "s3"], "system": "copy", "hypothesis": studies.findings})
    with pytest.raises(InputError, match="none of the 3 studies scored has an impression section"):
        score_systems(gens, studies, ["bleu_4"], reps=0, ref_section="impression")
    some = score_systems(gens, studies.assign(impression=["Effusion.", "", ""]), ["bleu_4"], reps=0,
                         ref_section="impression")
    assert some.counts["reference_fallback"].startswith("2 of 3 studies have no impression: their findings is the "
                                                        "reference")
    assert some.conventions[0] == some.counts["reference_fallback"]
    assert "reference_fallback" not in score_systems(gens, studies, ["bleu_4"], reps=0).counts
