"""Tests of cxr_audit.papers: the paper 004 preset, per-entry end points and the primary family; the paper 003 preset
and its annotator; the paper 000 preset, its ReRef loop, metric plan and analysis.

The notebook (nbs/16_papers.ipynb) holds the worked examples on the SIMULATED demo corpus; these tests use small
hand-made tables whose end points can be counted by hand.
"""
import dataclasses

import numpy as np
import pandas as pd
import pytest
from statsmodels.stats.multitest import multipletests

from cxr_audit.core import InputError
from cxr_audit.labels import CHEXPERT_14
from cxr_audit.papers import (PAPER_000, PAPER_003, PAPER_004, Preset, Preset000, Preset003, Preset004,
                              entry_endpoints, family_from_endpoints, primary_family)
from cxr_audit.stats import comparison_family, micro_stats, proportion_stats
from cxr_audit.synth import make_demo_corpus

CONFIGS = [("ON", "B4"), ("OFF", "B4"), ("ON", "G1"), ("ON", "K50")]


def studies_table(n=12):
    "n studies of n // 2 patients; even studies have cardiomegaly and an effusion, odd ones are normal."
    return pd.DataFrame({"study_id": [f"s{i}" for i in range(n)], "patient_id": [f"p{i // 2}" for i in range(n)],
                         "findings": ["Cardiomegaly. Small left pleural effusion." if i % 2 == 0
                                      else "Heart size is normal."
                                      for i in range(n)],
                         "impression": ["Enlarged heart." if i % 2 == 0 else "No acute cardiopulmonary process."
                                        for i in range(n)]})


def generations_table(texts: dict, studies: pd.DataFrame, entries_per_study: int = 1):
    "One row per configuration and entry; `texts[config]` is a function of the entry index."
    rows = []
    for system, policy in CONFIGS:
        for i, sid in enumerate(studies.study_id):
            for k in range(entries_per_study):
                rows.append({"study_id": sid, "entry_id": f"{sid}/{k}", "system": system, "policy": policy,
                             "sample_id": f"{system}/{policy}/0/{sid}/{k}",
                             "hypothesis": texts[f"{system}+{policy}"](i), "truncated": False})
    return pd.DataFrame(rows)


TEXTS = {"ON+B4": lambda i: "Cardiomegaly." if i % 2 == 0 else "Heart size is within normal limits.",
         "OFF+B4": lambda i: "No acute cardiopulmonary process.",
         "ON+G1": lambda i: "No acute cardiopulmonary process. Cardiomegaly." if i % 3 == 0 else "Lungs are clear.",
         "ON+K50": lambda i: "" if i == 0 else "Small left pleural effusion."}


@pytest.fixture(scope="module")
def data():
    s = studies_table()
    return s, generations_table(TEXTS, s, entries_per_study=2)


def test_preset_fields_and_sources():
    f = PAPER_004.to_frame().set_index("field")
    assert (PAPER_004.reps, PAPER_004.seed, PAPER_004.p_convention) == (5000, 2026, "floored")
    assert PAPER_004.clusters == {"MIMIC->IU": "study_id", "IU->MIMIC": "patient_id"}
    assert PAPER_004.labels == CHEXPERT_14 and PAPER_004.uncertain_positive is False
    assert (PAPER_004.validity_rule, PAPER_004.grouping, PAPER_004.exclude) == ("surface", "exact", ("Cardiomegaly",))
    assert set(f.source) == {"paper", "not given in the paper"}
    assert f.loc["cohort_params.004_iu.fractions", "source"] == "not given in the paper"
    assert f.loc["reps", "source"] == "paper"
    assert all(p.split(".")[0] in {x.name for x in dataclasses.fields(PAPER_004)} for p in PAPER_004.not_in_paper)
    assert "<" not in PAPER_004._repr_markdown_().split("\n")[0]


def test_each_paper_has_one_small_preset():
    "Shared settings on `Preset`; each paper's class adds only its own fields, all set; no list of unused fields."
    shared = {x.name for x in dataclasses.fields(Preset)}
    assert {"name", "title", "reps", "seed", "size", "clusters", "labeler", "reported", "not_in_paper"} <= shared
    papers = {"000": (PAPER_000, Preset000), "003": (PAPER_003, Preset003), "004": (PAPER_004, Preset004)}
    own = {k: {x.name for x in dataclasses.fields(cls)} - shared for k, (_, cls) in papers.items()}
    assert {"comparisons", "endpoints", "policies", "prefixes", "validity_rule", "p_convention"} <= own["004"]
    assert {"decoding", "prompt_settings", "runs", "keywords", "match", "splitter"} <= own["003"]
    assert {"variations", "rewriting", "metric_names", "substitutes", "sensitivity"} <= own["000"]
    assert not own["004"] & (own["003"] | own["000"])
    for k, (p, cls) in papers.items():
        assert type(p) is cls and p.name == k and not hasattr(p, "not_used")
        shown = {x.split(".")[0] for x in p.to_frame().field}
        assert own[k] <= shown and not (set().union(*own.values()) - own[k]) & shown   # its own fields, set
    # a paper's methods are on its class only
    assert not any(hasattr(PAPER_004, m) for m in ("llm_annotator", "reref_loop", "metric_plan",
                                                   "reference_sensitivity"))
    assert not hasattr(PAPER_003, "reref_loop") and not hasattr(PAPER_000, "llm_annotator")


def test_preset_cohort_uses_the_recipe_and_its_params():
    studies = make_demo_corpus(n_patients=20).studies
    c = PAPER_004.cohort("MIMIC->IU", studies)
    base = PAPER_004.cohort("MIMIC->IU", studies, fractions={"train": 0.5, "test": 0.5})
    assert c.studies.split.eq("test").all() and len(base.studies) > len(c.studies)
    with pytest.raises(InputError, match="directions are"):
        PAPER_004.cohort("CheXpert->IU", studies)


def test_entry_endpoints_counted_by_hand(data):
    s, g = data
    ep = entry_endpoints(g, s, labeler="chexpert")  # the official definitions, normal heart-size wording read as normal
    assert len(ep) == len(g) and ep.entry_id.is_unique is False
    on = ep[ep.config == "ON+B4"].set_index("entry_id")
    # even studies: reference Cardiomegaly + Pleural Effusion; ON+B4 says Cardiomegaly: tp 1, fn 1
    assert on.loc["s0/0", ["tp", "fp", "fn"]].tolist() == [1, 0, 1]
    # odd studies: reference No Finding; "heart size within normal limits" is No Finding too: tp 1
    assert on.loc["s1/1", ["tp", "fp", "fn"]].tolist() == [1, 0, 0]
    off = ep[ep.config == "OFF+B4"]
    assert off.prefix_hit.all() and not ep[ep.config == "ON+B4"].prefix_hit.any()
    k50 = ep[ep.config == "ON+K50"].set_index("entry_id")
    assert not k50.loc["s0/0", "valid"] and k50.loc["s1/0", "valid"]
    assert ep.patient_id.tolist() == [f"p{int(e[1:].split('/')[0]) // 2}" for e in ep.entry_id]
    assert set(ep.labeler) == {"cxr_audit:chexpert"} and set(ep.reference_section) == {"both"}
    # the preset's own labels: the official tool's quirks on, so "heart size within normal limits" is a Cardiomegaly FP
    quirks = entry_endpoints(g, s).set_index(["config", "entry_id"])
    assert set(quirks.labeler) == {"cxr_audit:chexpert+quirks"}
    assert quirks.loc[("ON+B4", "s1/1"), ["tp", "fp", "fn"]].tolist() == [0, 1, 1]


def test_surface_rule_keeps_flagged_outputs():
    s = studies_table(2)
    loop = " ".join(["the heart is normal"] * 20)
    g = generations_table({c: (lambda i: loop) for c in TEXTS}, s).assign(truncated=True)
    surface = entry_endpoints(g, s)
    strict = entry_endpoints(g, s, preset=dataclasses.replace(PAPER_004, validity_rule="strict"))
    assert surface.valid.all() and surface.looping.all() and surface.hit_token_limit.all()
    assert not strict.valid.any()


def test_prefix_rule_is_normalized_and_anchored():
    s = studies_table(3)
    texts = ["NO ACUTE CARDIOPULMONARY PROCESS.", "There is no acute cardiopulmonary process.",
             "No acute  cardiopulmonary process, heart normal."]
    g = generations_table({c: (lambda i: texts[i]) for c in TEXTS}, s)
    hit = entry_endpoints(g, s).groupby("entry_id", sort=False).prefix_hit.first().tolist()
    assert hit == [True, False, True]


def test_uncertain_convention_and_exclusion():
    s = studies_table(2).assign(findings="There is possible pneumonia.", impression="")
    g = generations_table({c: (lambda i: "Possible pneumonia.") for c in TEXTS}, s)
    neg = entry_endpoints(g, s)
    pos = entry_endpoints(g, s, preset=dataclasses.replace(PAPER_004, uncertain_positive=True))
    assert neg.tp.sum() == 0 and pos.tp.sum() == len(g)
    s2 = studies_table(2)
    g2 = generations_table({c: (lambda i: "Cardiomegaly.") for c in TEXTS}, s2)
    full = entry_endpoints(g2, s2)
    no_cm = entry_endpoints(g2, s2, preset=dataclasses.replace(PAPER_004,
                                                               labels=tuple(l for l in CHEXPERT_14
                                                                            if l != "Cardiomegaly")))
    assert full.tp.sum() > 0 and no_cm.tp.sum() == 0


def test_custom_labeler_is_named_and_used():
    class HeartWords:
        source = "heart-words"
        def __call__(self, texts, ids):
            return pd.DataFrame([{"text_id": i, "source": self.source, "label": l,
                                  "state": 1.0 if l == "Cardiomegaly" and "heart" in t.lower() else np.nan}
                                 for t, i in zip(texts, ids) for l in CHEXPERT_14])
    s = studies_table(2)
    g = generations_table({c: (lambda i: "Heart is big." if i == 0 else "Lungs clear.") for c in TEXTS}, s)
    ep = entry_endpoints(g, s, labeler=HeartWords())
    assert set(ep.labeler) == {"heart-words"}
    # s0 reference mentions "Enlarged heart." (tp), s1 "Heart size is normal." (fn)
    assert ep.groupby("study_id")[["tp", "fp", "fn"]].first().to_numpy().tolist() == [[1, 0, 0], [0, 0, 1]]


def test_family_matches_direct_comparison_family(data):
    s, g = data
    ep = entry_endpoints(g, s)
    fam = family_from_endpoints(ep, direction="IU->MIMIC", reps=400, seed=7)
    rows = {c: ep[ep.config == c].set_index("entry_id").loc[ep[ep.config == "ON+B4"].entry_id]
            for c in PAPER_004.configs}
    metrics = {"validity_rate": ({c: proportion_stats(r.valid.astype(float)) for c, r in rows.items()}, "proportion"),
               "prefix_rate": ({c: proportion_stats(r.prefix_hit.astype(float)) for c, r in rows.items()},
                               "proportion"),
               "micro_f1": ({c: micro_stats(r.tp, r.fp, r.fn) for c, r in rows.items()}, "micro_f1")}
    clusters = rows["ON+B4"].study_id.map(dict(zip(s.study_id, s.patient_id))).to_numpy()
    ref = comparison_family(metrics, PAPER_004.comparisons, reps=400, seed=7, clusters=clusters, p_convention="floored")
    pd.testing.assert_frame_equal(fam.to_frame(), ref.to_frame())
    t = fam.to_frame()
    assert len(t) == 9 and np.allclose(t.p_holm, multipletests(t.p, method="holm")[1])
    sums = ep.groupby("config")[["tp", "fp", "fn"]].sum()
    f1 = 2 * sums.tp / (2 * sums.tp + sums.fp + sums.fn)
    est = t[t.metric == "micro_f1"].set_index("second").estimate
    assert np.allclose([est[c] for c in ("OFF+B4", "ON+G1", "ON+K50")],
                       [f1["ON+B4"] - f1[c] for c in ("OFF+B4", "ON+G1", "ON+K50")])


def test_clusters_change_the_intervals_not_the_estimates(data):
    s, g = data
    ep = entry_endpoints(g, s)
    by_patient = family_from_endpoints(ep, direction="IU->MIMIC", reps=400).to_frame()
    by_study = family_from_endpoints(ep, direction="MIMIC->IU", reps=400).to_frame()
    assert np.allclose(by_patient.estimate, by_study.estimate)
    assert not np.allclose(by_patient[["ci_low", "ci_high"]].fillna(9), by_study[["ci_low", "ci_high"]].fillna(9))
    shuffled = family_from_endpoints(ep.sample(frac=1, random_state=1), direction="IU->MIMIC", reps=400).to_frame()
    assert np.allclose(shuffled.estimate, by_patient.estimate)


def test_primary_family_defaults_and_direction_column(data):
    s, g = data
    both = pd.concat([g.assign(direction="IU->MIMIC"), g.assign(direction="MIMIC->IU", study_id="other")],
                     ignore_index=True)
    fam = primary_family(both, s, direction="IU→MIMIC", reps=300)
    assert fam.reps == 300 and fam.p_convention == "floored" and len(fam.to_frame()) == 9
    again = primary_family(g, s, direction="IU->MIMIC", reps=300)
    pd.testing.assert_frame_equal(fam.to_frame(), again.to_frame())
    other_seed = primary_family(g, s, direction="IU->MIMIC", reps=300, seed=1)
    assert not other_seed.to_frame()[["ci_low",
                                      "ci_high"]].fillna(9).equals(fam.to_frame()[["ci_low", "ci_high"]].fillna(9))


def test_errors(data):
    s, g = data
    ep = entry_endpoints(g, s)
    with pytest.raises(InputError, match="'ON\\+K50' of the preset's comparisons is missing; configurations present: "
                                         "ON\\+B4, OFF\\+B4, ON\\+G1"):
        family_from_endpoints(ep[ep.config != "ON+K50"], direction="IU->MIMIC")
    with pytest.raises(InputError, match="differ in their entries"):
        family_from_endpoints(ep.drop(index=ep.index[ep.config == "ON+G1"][0]), direction="IU->MIMIC")
    with pytest.raises(InputError, match="cluster column 'patient_id' is missing"):
        family_from_endpoints(ep.assign(patient_id=None), direction="IU->MIMIC")
    with pytest.raises(InputError, match="more than once"):
        entry_endpoints(pd.concat([g, g.head(1)]), s)
    with pytest.raises(InputError, match="study_id 's0' is not in studies"):
        entry_endpoints(g, s.iloc[1:])
    with pytest.raises(InputError, match="unknown direction"):
        primary_family(g, s, direction="IU->CheXpert")


# --- paper 003
# ----------------------------------------------------------------------------------------------------------

def test_paper_003_preset_fields_and_sources():
    from cxr_audit.longitudinal import keyword_terms
    p = PAPER_003
    assert (p.reps, p.size, p.runs, p.annotator_model) == (1000, 0.95, 5, "Qwen2.5-32B")
    assert dict(p.prompt_settings) == {"n_task_examples": 3, "n_change_indicators": 8, "n_progression_examples": 2}
    assert p.decoding["greedy"] == {"temperature": 0.0} and p.decoding["sampling"] == {"temperature": 0.7, "top_p": 0.9,
                                                                                       "top_k": 20}
    assert list(p.decoding)[0] == "greedy"                      # the paper's default decoding comes first
    assert p.keywords == tuple(keyword_terms()) and len(p.keywords) == 50 and "support devices" in p.keywords
    assert p.classes == ("no change", "improved", "worsened") and p.cohorts == {"L-MIMIC": "003_lmimic"}
    assert p.cohort_sizes["L-MIMIC"]["test"] == 1863 and len(p.systems) == 7 and p.splitter == "stanza"
    f = p.to_frame().set_index("field")
    assert f.loc["match", "source"] == "not given in the paper" and f.loc["seed", "source"] == "not given in the paper"
    assert f.loc["reps", "source"] == "paper" and f.loc["decoding.sampling.top_k",
                                                        ["value", "source"]].tolist() == [20, "paper"]
    assert not {"prefixes", "validity_rule", "policies", "variations"} & {x.split(".")[0] for x in f.index}
    fields_ = {x.name for x in dataclasses.fields(p)}
    assert all(x.split(".")[0] in fields_ for x in p.not_in_paper)
    # paper 004's own fields are in its table
    assert {"prefixes", "validity_rule", "policies"} <= {x.split(".")[0] for x in PAPER_004.to_frame().field}


def test_paper_003_llm_annotator_sends_the_papers_prompts(tmp_path):
    from cxr_audit.llm import RuleChat
    from cxr_audit.longitudinal import longitudinal_prompt, progression_prompt
    seen = []
    def answer(messages, schema, temperature=0.0, seed=None, **kw):
        seen.append((messages[-1]["content"],
                     temperature)); return "<1>" if "Sentence" in messages[-1]["content"] and len(seen) == 1 else "<0>"
    a = PAPER_003.llm_annotator(RuleChat(answer, name="probe"), cache=False, invalid_retries=0)
    a.annotate(["The effusion has increased."])
    assert seen[0][0] == longitudinal_prompt("The effusion has increased.", 3, 8) and seen[0][1] == 0.0
    assert a.prompt("progression", "Effusion is larger.",
                    "pleural effusion") == progression_prompt("Effusion is larger.", "pleural effusion", 2)
    s = PAPER_003.llm_annotator(RuleChat(answer, name="probe"), "sampling", seed=3, cache=False, n_task_examples=0)
    assert (s.n_task_examples, s.n_change_indicators, s.seed, s.decoding["temperature"]) == (0, 8, 3, 0.7)
    with pytest.raises(InputError, match="greedy, sampling"):
        PAPER_003.llm_annotator(RuleChat(answer, name="probe"), "beam")


# --- paper 000
# ----------------------------------------------------------------------------------------------------------

def test_paper_000_preset_against_the_paper():
    from cxr_audit.labels import CHEXPERT_5
    from cxr_audit.reref import EXPERIMENT_VARIANTS, VARIANTS
    p = PAPER_000
    # Section 3 / A.1.5: every variation of the taxonomy but Quantitative Granularity (High): 12 of 13
    assert p.variations == EXPERIMENT_VARIANTS and len(p.variations) == 12 and len(VARIANTS) == 13
    assert set(VARIANTS) - set(p.variations) == {"quantitative_granularity:high"}
    # Appendix A.3: o3 as both roles, Generator 0.7 and 16,382 tokens, Verifier 0, up to 5 rounds
    assert dict(p.rewriting) == {"generator_temperature": 0.7, "generator_max_tokens": 16382,
                                 "verifier_temperature": 0.0, "max_rounds": 5}
    assert p.rewriter_model.startswith("o3")
    # Section 3: nine metrics; CheXbert-F1 over atelectasis, cardiomegaly, consolidation, edema, pleural effusion
    assert set(p.metric_names.values()) == {"CRIMSON", "GREEN", "RadGraph-F1", "RaTEScore", "RadCliQ-v1", "CheXbert-F1",
                                            "BLEU-2", "ROUGE-L", "BERTScore"}
    assert tuple(p.metric_names) == p.metrics and len(p.metrics) == 9
    assert p.labels == CHEXPERT_5 == ("Atelectasis", "Cardiomegaly", "Consolidation", "Edema", "Pleural Effusion")
    assert p.reference_section == "findings" and p.size == 0.95 and p.sensitivity["whiskers"] == (5, 95)
    # Section 3: nine models on four test sets of 3,269 / 200 / 590 / 10,000 studies; Figure 4 spreads over 36 pairs
    assert {d: s["studies"] for d, s in p.cohort_sizes.items()} == {"MIMIC-CXR": 3269, "CheXpert Plus": 200,
                                                                    "IU X-ray": 590,
                                                                   "ReXGradient-160K": 10000}
    assert len(p.systems) == 9 and len(p.systems) * len(p.cohorts) == 36 and set(p.cohorts.values()) == {"000_test"}
    assert p.cohort_params["CheXpert Plus"]["split"] == "valid" and p.cohort_params["000_test"]["section"] == "findings"
    f = p.to_frame().set_index("field")
    assert {f.loc[k, "source"] for k in ("reps", "seed", "clusters.MIMIC-CXR", "labeler",
                                         "substitutes.rewriter")} == {"not given in the paper"}
    assert f.loc["rewriting.generator_max_tokens", ["value", "source"]].tolist() == [16382, "paper"]
    assert not {"prefixes", "policies", "decoding", "runs", "match"} & {x.split(".")[0] for x in f.index}
    assert all(x.split(".")[0] in {y.name for y in dataclasses.fields(p)} for x in p.not_in_paper)


def test_paper_000_reported_numbers_recompute():
    r = PAPER_000.reported
    # Section 4.2: CRIMSON is the most stable metric, RadGraph-F1 the least; every mean IQR is below its max
    iqr = r["iqr"]
    assert min(iqr, key=lambda m: iqr[m][0]) == "CRIMSON" and max(iqr, key=lambda m: iqr[m][0]) == "RadGraph-F1"
    assert all(mean < mx for mean, mx in iqr.values()) and max(mx for _,
                                                               mx in iqr.values()) == iqr["RadGraph-F1"][1] == 1.542
    # Figure 7(a): Libra behind CheXOne under 6 variations, tied under 4, ahead under 2: the 12 variations
    f7 = r["figure 7a"]
    assert (f7["second better"], f7["tie"], f7["first better"]) == (6, 4,
                                                                    2) and sum((6, 4, 2)) == len(PAPER_000.variations)
    # Section 2.3 / 4.1: 4 datasets x 12 variations x 10 pairs = 480; the stated percentages follow from the counts
    v = r["validation"]
    assert v["pairs"] == 4 * 12 * v["pairs per dataset and variation"] == 480
    assert round(100 * v["realism not worse"] / v["pairs"],
                 1) == 92.7 and round(100 * v["major discrepancy"] / v["pairs"], 1) == 1.2
    assert (round(v["equivalent share"] * 480) + round(v["minor discrepancy share"] * 480) + v["major discrepancy"]
            == 480)
    assert [round(100 * n / 960, 1) for n in v["realism agreement"]] == [59.1, 35.9, 5.0]
    assert [round(100 * n / 480, 1) for n in v["equivalence agreement"]] == [68.5, 29.2, 2.3]
    # Figure 6: under Anatomical Granularity (Low), two systems gain and two lose
    s6 = r["figure 6"]["shifts"]
    assert {k for k, x in s6.items() if x > 0} == {"MedVersa",
                                                   "Med-CXRGen"} and r["figure 6"]["variation"] in PAPER_000.variations
    assert r["figure 5"]["variation"] in PAPER_000.variations and r["figure 5"]["system"] in PAPER_000.systems


def test_paper_000_cohort_per_dataset_split():
    s = pd.DataFrame({"study_id": ["a", "b", "c", "d"], "split": ["valid", "valid", "test", "test"],
                      "findings": ["Clear lungs.", " ", "Effusion.", "Edema."]})
    assert PAPER_000.cohort("CheXpert Plus", s).studies.study_id.tolist() == ["a"]          # the validation split
    assert PAPER_000.cohort("IU X-ray", s).studies.study_id.tolist() == ["c", "d"]          # the test split
    assert PAPER_000.cohort("IU X-ray", s, split=None).studies.study_id.tolist() == ["a", "c", "d"]
    with pytest.raises(InputError, match="directions are MIMIC-CXR, CheXpert Plus, IU X-ray, ReXGradient-160K"):
        PAPER_000.cohort("PadChest", s)


def test_paper_000_reref_loop_sends_the_papers_settings():
    from cxr_audit.llm import RuleChat
    from cxr_audit.reref import ReRef
    loop = PAPER_000.reref_loop()
    assert {getattr(b, "kind", "") for b in (loop.generator, loop.verifier)} == {"rule"}
    probe = RuleChat(lambda messages, schema, **kw: {}, name="probe")
    llm = PAPER_000.reref_loop(probe)
    assert isinstance(llm, ReRef) and llm.generator is probe and llm.verifier is probe
    task = {"task_id": "t", "study_id": "s", "variant": "terminology:alternative", "findings": "Cardiomegaly.",
            "impression": "Enlarged heart.", "indication": "Dyspnea.", "restricted": False}
    g, v = llm.generator_request(task, 1), llm.verifier_request(task,
                                                                {"findings": "Enlarged cardiac silhouette.",
                                                                 "impression": "Enlarged heart."})
    assert (g["temperature"], g["max_tokens"], g["seed"], v["temperature"]) == (0.7, 16382, PAPER_000.seed, 0.0)
    # the whole reference, indication included
    assert llm.max_rounds == 5 and "Dyspnea." in g["messages"][-1]["content"]
    other = PAPER_000.reref_loop(probe, RuleChat(lambda messages, schema, **kw: {}, name="judge"),
                                 generator_max_tokens=300)
    assert other.verifier.model == "judge" and other.generator_max_tokens == 300
    with pytest.raises(InputError, match="Verifier without a Generator"):
        PAPER_000.reref_loop(None, probe)
    with pytest.raises(InputError, match="no ReRef loop"):
        Preset000(name="empty").reref_loop(probe)


def test_paper_000_metric_plan():
    plan = PAPER_000.metric_plan().set_index("metric")
    assert list(plan.index) == list(PAPER_000.metrics) and list(plan.paper_name) == [PAPER_000.metric_names[m]
                                                                                     for m in PAPER_000.metrics]
    assert plan.loc[["bleu_2", "rouge_l"], "kind"].tolist() == ["native",
                                                                "native"] and plan.loc[["bleu_2", "rouge_l"],
                                                                                       "available"].all()
    assert plan.loc["chexbert_f1_5",
                    "radeval_key"] == "f1chexbert_5_micro_f1" and plan.loc["radgraph_f1",
                                                                           "radeval_key"] == "radgraph_partial"
    for m, r in plan.iterrows():   # what runs: the metric where it can, else its substitute, else nothing
        assert r.runs_as == (m if r.available else PAPER_000.substitutes.get(m, ""))
        assert r.available or r.reason.startswith("not available here, because")
    toy = Preset000(name="toy", metrics=("bleu_2", "no_such_metric"), substitutes={"no_such_metric": "rouge_l"},
                    metric_names={"bleu_2": "BLEU-2"})
    t = toy.metric_plan()
    assert t.paper_name.tolist() == ["BLEU-2", "no_such_metric"] and t.runs_as.tolist() == ["bleu_2", "rouge_l"]
    with pytest.raises(InputError, match="no metrics"):
        Preset000(name="empty").metric_plan()


def test_paper_000_reference_sensitivity_uses_the_preset():
    from cxr_audit.reref import EXPERIMENT_VARIANTS
    s = pd.DataFrame({"study_id": ["s1", "s2", "s3"], "patient_id": ["p1", "p2", "p3"], "dataset": "d",
                      "findings": ["No pleural effusion. No pneumothorax. Heart size is normal.",
                                   "Mild cardiomegaly. No focal consolidation. No pleural effusion.",
                                   "Small left pleural effusion. No pneumothorax."],
                      "impression": ["No acute process.", "Mild cardiomegaly.", "Small left effusion."]})
    hyps = {"A": ["No effusion or pneumothorax.", "Cardiomegaly. No consolidation.", "Left pleural effusion."],
            "B": ["Lungs are clear.", "Heart is enlarged.", "No acute process."]}
    g = pd.DataFrame([{"sample_id": f"{sys_}/{sid}", "study_id": sid, "system": sys_, "policy": "B4", "hypothesis": h}
                      for sys_, hs in hyps.items() for sid, h in zip(s.study_id, hs)])
    res = PAPER_000.reference_sensitivity(s, g, metrics=["bleu_2"], reps=50)
    p = res.params
    assert (p["backend"], p["level"], p["section"], p["seed"], p["size"], p["reps"]) == ("rules", "study", "findings",
                                                                                         PAPER_000.seed, 0.95, 50)
    assert p["variants"] == list(EXPERIMENT_VARIANTS) and p["metrics"] == ["bleu_2"]
    # the shift is the mean over the studies with a usable rewrite of the per-study difference (not a corpus-level
    # difference)
    refs = res.run.references.set_index(["study_id", "variant"])
    sc = res.scores[res.scores.metric == "bleu_2"].set_index(["system", "variant", "study_id"]).value
    assert res.shifts.applicable.sum() >= 10                      # most of the 12 variations apply to these studies
    for row in res.shifts[res.shifts.applicable].itertuples():
        usable = [sid for sid in s.study_id if refs.loc[(sid, row.variant), "usable"]]
        by_hand = np.mean([sc[(row.system, row.variant, sid)] - sc[(row.system, "original", sid)] for sid in usable])
        assert row.n_usable == len(usable) and abs(row.shift - by_hand) < 1e-12
    assert res.shifts[~res.shifts.applicable].normalized_shift.isna().all()
    # a ReRef passed in is used as it is; keyword arguments replace the preset's choices
    two = PAPER_000.reference_sensitivity(s, g, backend=PAPER_000.reref_loop(max_rounds=1), metrics=["bleu_2"], reps=50,
                                          variations=["negation:implicit"])
    assert two.params["variants"] == ["negation:implicit"] and two.run.references.iterations.max() <= 1
    with pytest.raises(InputError, match="no reference variations"):
        Preset000(name="empty").reference_sensitivity(s, g)


def test_a_printed_number_check_fails_when_one_input_is_off():
    "The paper pages' checks recompute printed values from other printed values; one count off by one is caught."
    from cxr_audit.papers import printed_checks
    rows = [("381/575 (%)", 100 * 381 / 575, 66.3, 1), ("0.0056 − 0.0666", 0.0056 - 0.0666, -0.0610, 4)]
    assert printed_checks(rows).matches.all()
    off = [("380/575 (%)", 100 * 380 / 575, 66.3, 1), ("0.0057 − 0.0666", 0.0057 - 0.0666, -0.0610, 4)]
    assert not printed_checks(off).matches.any()


@pytest.mark.parametrize("seed", [3, 11])
def test_paper_004_simulation_points_the_papers_way(seed):
    "The SIMULATED ON/OFF stand-ins give paper 004's effect directions on a small corpus of either seed."
    from cxr_audit.concentration import audit_concentration
    from cxr_audit.labels import get_labeler
    from cxr_audit.label_audit import label_audit
    from cxr_audit.papers import simulated_004_generations
    demo = make_demo_corpus(n_patients=150, seed=seed)
    site = {"MIMIC->IU": "synthetic-site-b", "IU->MIMIC": "synthetic-site-a"}
    out = {}
    for d, name in site.items():
        c = PAPER_004.cohort(d, demo.studies[demo.studies.dataset == name].reset_index(drop=True)).studies
        g = simulated_004_generations(demo, c, direction=d, seed=seed)
        a = audit_concentration(g, grouping="exact", validity_rule="surface", reps=1).summary()
        a.index = a.system + "+" + a.policy
        la = label_audit(c.drop_duplicates("study_id").reset_index(drop=True), g, reps=1,
                         labeler=get_labeler("chexpert+quirks"), pair=("ON+B4", "OFF+B4"))
        out[d] = (a, la.exclusion.difference.tolist(),
                  la.alignment.per_label().query("system == 'ON+B4'").set_index("label").tp)
    a, _, _ = out["MIMIC->IU"]
    assert (a.prefix_rate.idxmin(), a.prefix_rate.idxmax(),
            a.unique_report_ratio.idxmin()) == ("ON+B4", "OFF+B4", "ON+B4")
    a, (with_c, without_c), tp = out["IU->MIMIC"]
    assert a.prefix_rate.max() == 0 and a.unique_report_ratio.idxmax() == "ON+K50"
    assert with_c > 0 > without_c                                  # the lead that rests on Cardiomegaly (Table S28)
    assert tp["Cardiomegaly"] == tp.sum() > 0


def test_paper_004_generator_arguments():
    from cxr_audit.papers import Paper004Generator, decoding_kind
    demo = make_demo_corpus(n_patients=5)
    with pytest.raises(InputError, match="arm must be 'ON' or 'OFF'"): Paper004Generator("on", "MIMIC->IU", demo)
    with pytest.raises(InputError, match="directions are"): Paper004Generator("ON", "IU->CheXpert", demo)
    assert [decoding_kind(p) for p in ("B4", "G1", "K50")] == ["B4", "G1", "K50"]
    gen = Paper004Generator("OFF", "MIMIC→IU", demo)
    texts = gen(demo.studies.study_id.tolist())
    assert all(t.startswith("No acute cardiopulmonary process.") for t in texts)   # OFF+B4 always opens with the prefix
    assert texts == gen(demo.studies.study_id.tolist())                          # B4 is deterministic


def test_paper_003_simulation_keeps_the_papers_pattern():
    "The seven SIMULATED stand-ins give Table 5's pattern of paper 003 on a small corpus (the page checks the rest)."
    from cxr_audit.longitudinal import RuleAnnotator
    from cxr_audit.longitudinal_eval import progression_evaluation
    from cxr_audit.papers import SIM_003_PROFILES, Paper003Generator, simulated_003_generations
    demo = make_demo_corpus(n_patients=40, seed=6)
    follow = demo.studies[demo.studies.groupby("patient_id").cumcount() > 0]
    g = simulated_003_generations(demo, follow)
    ev = progression_evaluation(follow, g, annotator=RuleAnnotator(), reps=5, clusters="patient_id",
                                report_metrics=("bleu_4",), diagnosis=True)
    e = ev.summary().pivot_table(index="system", columns="metric", values="estimate")
    e.index = e.index.str.split("+").str[0]
    assert set(e.index) == set(SIM_003_PROFILES)
    assert e.report_bleu_4.idxmax() == "Libra" and set(e.progression_micro_f1.nlargest(2).index) == {"Libra", "Maira2"}
    assert set(e.bleu_4.nsmallest(2).index) == {"R2Gen", "MedVersa"}  # no priors: the weakest longitudinal sentences
    assert (e.progression_f1_improved.loc[["R2Gen", "MedVersa"]] == 0).all()  # they cannot see a change
    with pytest.raises(InputError, match="model must be one of"): Paper003Generator("GPT", demo)
