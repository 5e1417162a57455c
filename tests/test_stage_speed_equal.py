"Issue 23: the faster paths of the reref and labels stages give exactly what the slower paths gave."
import threading

import numpy as np
import pandas as pd
import pytest

from cxr_audit.label_audit import align_labels, label_generations, reference_texts
from cxr_audit.labels import label_reports
from cxr_audit.llm import BatchAbortedError, RuleChat, run_batch
from cxr_audit.reref_rules import parse_section
from cxr_audit.synth import make_demo_corpus


@pytest.fixture(scope="module")
def demo():
    return make_demo_corpus(n_patients=12, seed=3)


def _answer(messages, schema):
    return f"{threading.current_thread().name.startswith('cxr-audit-llm')}|{messages[-1]['content'].upper()}"


def test_rule_backend_one_at_a_time_runs_inline_with_the_pool_rows():
    reqs = [{"request_id": i, "messages": f"item {i % 7}"} for i in range(40)]   # repeated keys are answered once
    inline = run_batch(reqs, RuleChat(_answer, name="upper"), cache=False, max_concurrency=1, progress=False).to_frame()
    pooled = run_batch(reqs, RuleChat(_answer, name="upper"), cache=False, max_concurrency=4, progress=False).to_frame()
    assert inline.text.str.startswith("False|").all() and pooled.text.str.startswith("True|").all()   # where each ran
    strip = lambda df: df.assign(text=df.text.str.split("|").str[1]).drop(columns="latency_s")
    pd.testing.assert_frame_equal(strip(inline), strip(pooled))


def test_inline_batch_stops_after_fail_fast_failures():
    calls = []
    def broken(messages, schema):
        calls.append(1); raise ValueError("no rule for this")
    with pytest.raises(BatchAbortedError, match="first 3 requests all failed"):
        run_batch([{"request_id": i, "messages": f"q{i}"} for i in range(30)], RuleChat(broken), cache=False,
                  max_concurrency=1, fail_fast=3, progress=False)
    assert len(calls) == 3   # nothing sent after the stop
    out = run_batch([{"request_id": i, "messages": f"q{i}"} for i in range(4)], RuleChat(broken), cache=False,
                    max_concurrency=1, fail_fast=0, progress=False)
    assert out.n_failed == 4 and out.to_frame().error.str.contains("ValueError").all()


def test_parse_section_cache_returns_fresh_items():
    text = "LUNGS:\nClear. No effusion.\nHEART: Normal size."
    first = parse_section(text)
    first[0].sentences.append("changed")
    second = parse_section(text)
    assert [i.sentences for i in second] == [["Clear.", "No effusion."], ["Normal size."]]
    assert second[0] is not first[0]


def _cases_by_pandas(al, systems):
    "The case order as computed before the per-system index (pandas filtering)."
    ok, key = al.matching[al.matching.status == "matched"], al._key
    common = set.intersection(*[set(ok[key][ok.system == s]) for s in systems]) if len(systems) else set()
    rows = ok[ok[key].isin(common)].drop_duplicates(key)
    pos = rows.reference_id.map({r: i for i, r in enumerate(al.reference_ids)}).to_numpy()
    return rows[key].to_numpy()[np.argsort(pos, kind="stable")].tolist()


def test_cases_and_case_stats_match_the_pandas_path(demo):
    refs = reference_texts(demo.studies)
    gens = demo.generations
    gen_lab = label_generations(gens)
    partial = gen_lab[~gen_lab.text_id.isin(gens.sample_id.iloc[::5])]   # some cases missing for some systems
    al = align_labels(label_reports(refs.iloc[::-1]), partial, case_map=gens[["sample_id", "study_id"]])
    systems = list(al.systems)
    for chosen in ([systems[0]], systems[:2], systems, []):
        assert al._cases(chosen) == _cases_by_pandas(al, chosen)
    for s in systems:
        cases = al._cases([s])
        assert cases
        c = al.counts[al.counts.label.isin(al.labels)]
        c = c[c.system == str(s)]
        assert al._counts(None, s).equals(c)
        assert al.case_stats(s, ["Cardiomegaly", "Edema"], cases, "macro").shape == (len(cases), 6)
    assert al._counts(None, "no such system").empty


def test_labeler_reads_each_distinct_text_once_and_copies_its_rows(demo, monkeypatch):
    "Issue 44: a long list of repeated reports is labeled per distinct text; every copy gets the rows it got alone."
    from cxr_audit.labels import Labeler
    texts = list(demo.generations.hypothesis[:60]) * 3 + ["", None, float("nan"), 3, "No acute process.", "   "]
    ids = [f"t{i}" for i in range(len(texts))]
    lab = Labeler()
    read, real = [], lab.label_text
    monkeypatch.setattr(lab, "label_text", lambda text: read.append(text) or real(text))   # a spy on the real labeler
    together = lab(texts, ids)
    distinct = len({t for t in texts if isinstance(t, str)}) + sum(not isinstance(t, str) for t in texts)
    assert len(read) == distinct < len(texts)
    alone = pd.concat([Labeler()([t], [i]) for t, i in zip(texts, ids)], ignore_index=True)
    assert len(together) == 14 * len(texts)
    same = lambda df: df.astype(object).where(df.notna(), None)   # a text alone may give an all-missing object column
    pd.testing.assert_frame_equal(same(together), same(alone))
    assert together["text_id"].tolist() == alone["text_id"].tolist()


@pytest.mark.skipif(__import__("shutil").which("java") is None, reason="METEOR needs Java on PATH")
def test_the_audits_meteor_pairs_ahead_are_the_pairs_the_metrics_and_the_verdict_ask(demo, monkeypatch):
    """Once the tables are final the audit scores, in the background, every METEOR pair of the report's reference
    section and then of the verdict's other section: the scorers that follow find them all and ask the jar for none
    (a spy on the real jar's input)."""
    from cxr_audit import meteor
    from cxr_audit.audit import AuditContext, _meteor_pairs_ahead, check_pair
    from cxr_audit.evaluator import score_systems
    s, g = check_pair(demo.studies, demo.generations, ("studies", "generations"), notes=[])
    ctx = AuditContext(s, g, {}, {"seed": 0})
    meteor.close_meteor(); meteor._METEOR_ANSWERS.clear()
    _meteor_pairs_ahead(ctx, ["metrics", "verdict"]).join()
    kept = sum(len(m) for m in meteor._METEOR_ANSWERS.values())
    asked, real_ask = [], meteor._MeteorJar.ask
    def counting_ask(self, lines, *args, **kwargs):
        asked.extend(line for line in lines if line.startswith("SCORE"))
        return real_ask(self, lines, *args, **kwargs)
    monkeypatch.setattr(meteor._MeteorJar, "ask", counting_ask)
    for section in ("findings", "both"):   # the metrics stage's section, then the verdict's section check
        res = score_systems(g, s, ["meteor"], reps=0, ref_section=section, by=("system", "policy"), clusters=None)
        assert res.estimates["estimate"].notna().all()
    assert asked == [] and kept > len(g)   # two sections' pairs, none asked again
    meteor.close_meteor()
