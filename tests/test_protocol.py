"""The results protocol (`core.Result`): every result class, built from tiny data, offers `to_frame()` (a new table
each time), `summary()`, a markdown view, and where it has them a one-line `headline()`, a `conf_int()` table with
`ci_low, ci_high` and one row per estimate, and an Altair `plot()`. A new result class must be added to `REGISTRY`."""
import functools
import importlib
import inspect
from pathlib import Path

import altair as alt
import numpy as np
import pandas as pd
import pytest

import cxr_audit
from cxr_audit.core import Result
from cxr_audit.synth import make_demo_corpus

PKG = Path(cxr_audit.__file__).parent
FIX = Path(__file__).parent / "fixtures" / "longitudinal"
# the factories use a few resamples on purpose: no comparison can be significant, and that is not what is tested
pytestmark = pytest.mark.filterwarnings("ignore::cxr_audit.stats.UnderpoweredWarning")


@functools.cache
def demo():
    return make_demo_corpus(8, seed=0)


# --- one factory per result class: the package's own functions on tiny inputs ---------------------------------------

def _bootstrap():
    from cxr_audit.stats import bootstrap, mean_stats
    return bootstrap(mean_stats([0.1, 0.4, 0.5, 0.9]), reps=50, seed=0)


def _paired():
    from cxr_audit.stats import mean_stats, paired_bootstrap
    return paired_bootstrap({"a": mean_stats([0.1, 0.4, 0.5]), "b": mean_stats([0.2, 0.2, 0.7]),
                             "c": mean_stats([0.3, 0.1, 0.2])}, reps=50, seed=0)


def _family():
    from cxr_audit.stats import comparison_family, mean_stats
    scores = {"a": mean_stats([0.1, 0.4, 0.5]), "b": mean_stats([0.2, 0.2, 0.7])}
    return comparison_family({"mean": (scores, "mean")}, [("a", "b")], reps=50, seed=0)


def _estimate():
    from cxr_audit.stats import exact_binomial_ci
    return exact_binomial_ci(3, 10, metric="share")


def _cohort():
    from cxr_audit.cohort import Cohort
    return Cohort(demo().studies).split("patient_id", {"train": 0.5, "test": 0.5}, seed=0)


def _concentration():
    from cxr_audit.concentration import audit_concentration
    return audit_concentration(demo().generations, reps=20, seed=0)


def _configurations():
    from cxr_audit.concentration import compare_configurations
    return compare_configurations(demo().generations, demo().studies, reps=20, seed=0)


def _load_report():
    from cxr_audit.corpus import load_report
    st = demo().studies
    return load_report(st.assign(view_status=["fewer_views"] + ["ok"] * (len(st) - 1), load_flags=[[]] * len(st)))


def _system_scores():
    from cxr_audit.evaluator import score_systems
    return score_systems(demo().generations, demo().studies, "bleu_4", reps=20, seed=0)


def _labeled():
    from cxr_audit.labels import label_reports
    return label_reports(demo().studies.findings.tolist())


def _label_alignment():
    from cxr_audit.label_audit import align_labels
    from cxr_audit.labels import label_reports
    ref = label_reports(demo().studies.findings.tolist(), ids=demo().studies.study_id.tolist())
    return align_labels(ref, {"copy": ref})


def _label_trace():
    from cxr_audit.labels import trace_label_triggers
    return trace_label_triggers(_labeled(), min_positives=1)


def _trace_audit():
    from cxr_audit.label_audit import trace_audit
    texts = dict(enumerate(demo().studies.findings))
    return trace_audit(_labeled(), texts, min_positives=1)


def _label_audit():
    from cxr_audit.label_audit import label_audit
    return label_audit(demo().studies, demo().generations, reps=10, seed=0)


def _batch_run():
    from cxr_audit.llm import RuleChat, run_batch
    reqs = [{"request_id": "a", "messages": [{"role": "user", "content": "hi"}]}]
    return run_batch(reqs, RuleChat(lambda m, s: "ok"), cache=False, progress=False)


def _lmimic():
    from cxr_audit.lmimic import build_lmimic
    return build_lmimic(demo().studies)


def _annotation_quality():
    from cxr_audit.longitudinal import RuleAnnotator
    from cxr_audit.longitudinal_eval import evaluate_annotators, read_gold
    return evaluate_annotators(read_gold(FIX / "gold_sentences.csv"), {"rules": RuleAnnotator()}, reps=20,
                               clusters=None)


def _truth_agreement():
    from cxr_audit.longitudinal_eval import truth_agreement
    return truth_agreement(_lmimic().sentences, demo().progression)


def _progression():
    from cxr_audit.longitudinal_eval import progression_evaluation
    return progression_evaluation(demo().studies, demo().generations, reps=20, seed=0)


def _keyword_distance():
    from cxr_audit.longitudinal_eval import keyword_distance
    return keyword_distance({"effusion": 3, "edema": 1}, {"effusion": 1, "edema": 2})


def _preset(name):
    import cxr_audit.papers as P
    return lambda: getattr(P, name)


def _reference_corpus():
    from cxr_audit.reference_corpus import audit_reference_corpus
    return audit_reference_corpus(demo().studies, "findings", labeler=None)


def _taxonomy():
    from cxr_audit.reref import load_taxonomy
    return load_taxonomy()


@functools.cache
def _loop_run():
    from cxr_audit.reref_rules import rule_reref
    s = demo().studies.head(2)
    tasks = [{"task_id": f"t{i}", "study_id": r.study_id, "variant": "negation:implicit", "findings": r.findings,
              "impression": r.impression} for i, r in enumerate(s.itertuples())]
    return rule_reref().run(tasks, cache=False)


def _round():
    from cxr_audit.reref import Round
    log = {"a": {"task_id": "a", "accepted": True}, "b": {"task_id": "b", "accepted": False}}
    return Round(1, log, {}, {}, ())


@functools.cache
def _rewrite_run():
    from cxr_audit.reref import rewrite_table
    from cxr_audit.reref_rules import rule_reref
    return rewrite_table(demo().studies.head(3), "negation:implicit", rule_reref())


@functools.cache
def _sensitivity():
    from cxr_audit.reref_sensitivity import reference_sensitivity
    return reference_sensitivity(demo().studies, demo().generations, variations="negation:implicit",
                                 metrics=["bleu_2"], reps=20, seed=0)


def _gaps():
    return next(iter(_sensitivity().gaps.values()))


def _example():
    return _sensitivity().example()


@functools.cache
def _review_packets():
    from cxr_audit.review import make_review_packets, sample_cases
    cases = sample_cases(demo().studies[["study_id", "dataset"]], 2, seed=0, strata="dataset")
    return make_review_packets(cases, demo().generations, demo().studies, seed=0)


@functools.cache
def _ratings():
    from cxr_audit.review import read_ratings, simulate_ratings, split_reviewers
    P = _review_packets()
    return split_reviewers(read_ratings(simulate_ratings(P, demo().generations, seed=0), key=P.key))


@functools.cache
def _consensus():
    from cxr_audit.review import apply_consensus, consensus_queue, simulate_decisions
    r1, r2 = _ratings()
    return apply_consensus(r1, r2, simulate_decisions(consensus_queue(r1, r2), seed=0))


def _review_summary():
    from cxr_audit.review import review_summary
    return review_summary(_consensus(), _review_packets().key)


def _review_analysis():
    from cxr_audit.review import review_analysis, simulate_ratings
    P = _review_packets()
    from cxr_audit.review import consensus_queue, simulate_decisions
    r1, r2 = _ratings()
    decisions = simulate_decisions(consensus_queue(r1, r2), seed=0)
    return review_analysis(simulate_ratings(P, demo().generations, seed=0), P.key, decisions, reps=20)


def _codebook():
    from cxr_audit.review import load_codebook
    return load_codebook()


@functools.cache
def _reref_packets():
    from cxr_audit.reref_validation import prepare_reref_validation
    return prepare_reref_validation(demo().studies, _rewrite_run().references, 2, seed=0)


def _reref_validation():
    from cxr_audit.reref_validation import read_reref_validation, simulate_reref_ratings
    P = _reref_packets()
    return read_reref_validation(simulate_reref_ratings(P, seed=0), P, reps=20)


def _verdict():
    from cxr_audit.verdict import verdict
    return verdict(demo().studies, demo().generations, metrics=("bleu_4",), reps=20, seed=0, checks=())


REGISTRY = {
    "cohort.Cohort": _cohort,
    "concentration.ConcentrationAudit": _concentration,
    "concentration.ConfigurationComparison": _configurations,
    "corpus.LoadReport": _load_report,
    "evaluator.SystemScores": _system_scores,
    "label_audit.LabelAlignment": _label_alignment,
    "label_audit.TraceAudit": _trace_audit,
    "label_audit.LabelAudit": _label_audit,
    "labels.LabelTrace": _label_trace,
    "llm.BatchRun": _batch_run,
    "lmimic.LMimic": _lmimic,
    "longitudinal_eval.AnnotationQuality": _annotation_quality,
    "longitudinal_eval.TruthAgreement": _truth_agreement,
    "longitudinal_eval.ProgressionEvaluation": _progression,
    "longitudinal_eval.KeywordDistance": _keyword_distance,
    "papers.Preset004": _preset("PAPER_004"),
    "papers.Preset003": _preset("PAPER_003"),
    "papers.Preset000": _preset("PAPER_000"),
    "reference_corpus.ReferenceCorpusAudit": _reference_corpus,
    "reref.Taxonomy": _taxonomy,
    "reref.Round": _round,
    "reref.LoopRun": _loop_run,
    "reref.RewriteRun": _rewrite_run,
    "reref_sensitivity.PairwiseGaps": _gaps,
    "reref_sensitivity.StudyExample": _example,
    "reref_sensitivity.ReferenceSensitivity": _sensitivity,
    "reref_validation.RerefPackets": _reref_packets,
    "reref_validation.RerefValidation": _reref_validation,
    "review.Codebook": _codebook,
    "review.ReviewPackets": _review_packets,
    "review.ConsensusResult": _consensus,
    "review.ReviewSummary": _review_summary,
    "review.ReviewAnalysis": _review_analysis,
    "stats.BootstrapResult": _bootstrap,
    "stats.PairedResult": _paired,
    "stats.ComparisonFamily": _family,
    "stats.Estimate": _estimate,
    "verdict.Verdict": _verdict,
}
# bases that hold shared methods and are never returned themselves: each has registered subclasses
BASES = {"longitudinal_eval._PairedMeasures": "AnnotationQuality and ProgressionEvaluation",
         "papers.Preset": "one subclass per paper", "reref.FrameResult": "LoopRun, RewriteRun and others",
         "review.Packets": "ReviewPackets and RerefPackets"}


def check_result(r):
    "Assert the protocol on one result object."
    assert isinstance(r, Result), type(r)
    first = r.to_frame()
    assert isinstance(first, pd.DataFrame)
    before = first.copy()
    first.columns = [f"{c}_changed" for c in first.columns]   # the caller renames the columns in place
    first["added_by_caller"] = 1                              # and adds one
    pd.testing.assert_frame_equal(r.to_frame(), before)
    assert isinstance(r.summary(), pd.DataFrame)
    assert isinstance(r._repr_markdown_(), str)
    if hasattr(r, "headline"):
        line = r.headline()
        assert isinstance(line, str) and line and "\n" not in line.strip(), line
    if hasattr(r, "conf_int"):
        ci = r.conf_int()
        assert isinstance(ci, pd.DataFrame) and {"ci_low", "ci_high"} <= set(ci.columns)
        assert len(ci.columns) > 2 and len(ci) == _estimates(r), (len(ci), _estimates(r))
    if hasattr(r, "plot"):
        assert isinstance(r.plot(), alt.TopLevelMixin)


def _estimates(r) -> int:
    "How many estimates a result with intervals holds."
    return len(r.pairs) if hasattr(r, "pairs") else 1


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_result_class_follows_the_protocol(name):
    r = REGISTRY[name]()
    assert f"{type(r).__module__.split('.')[-1]}.{type(r).__name__}" == name
    check_result(r)


def _classes_with_to_frame() -> set[str]:
    "Every class defined in cxr_audit/*.py that has a `to_frame` method (its own, a base's or a patched one)."
    found = set()
    for path in sorted(PKG.glob("*.py")):
        if path.stem.startswith("_"): continue
        module = importlib.import_module(f"cxr_audit.{path.stem}")
        found |= {f"{path.stem}.{name}" for name, c in vars(module).items()
                  if inspect.isclass(c) and c.__module__ == module.__name__ and hasattr(c, "to_frame")
                  and not getattr(c, "_is_protocol", False)}
    return found


def test_every_result_class_is_registered():
    missing = _classes_with_to_frame() - set(REGISTRY) - set(BASES)
    assert not missing, f"add a factory to tests/test_protocol.py REGISTRY for {sorted(missing)}"
    assert not (set(REGISTRY) | set(BASES)) - _classes_with_to_frame()      # no stale names either


def test_the_check_fails_on_a_result_that_hands_out_its_own_table():
    class Leaky:
        def __init__(self): self.table = pd.DataFrame({"metric": ["m"], "estimate": [0.5]})
        def to_frame(self): return self.table
        def summary(self): return self.table.copy()
        def _repr_markdown_(self): return "leaky"
    with pytest.raises(AssertionError):
        check_result(Leaky())
    leaky = Leaky(); leaky.to_frame = lambda: leaky.table.copy()
    check_result(leaky)


def test_the_check_fails_on_an_array_interval():
    from cxr_audit.stats import Estimate
    class Old(Estimate):
        def conf_int(self): return np.array([self.ci_low, self.ci_high])
    with pytest.raises(AssertionError):
        check_result(Old("m", 0.5, 0.4, 0.6))
    check_result(Estimate("m", 0.5, 0.4, 0.6))
