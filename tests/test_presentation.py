"""The presentation layer: each audit stage renders its entry point's result, and each `cxr-audit` subcommand, called
in-process, writes what the entry point computes (the subprocess tests of the command are in test_cli.py)."""
import json
from pathlib import Path

import pandas as pd
import pytest

from cxr_audit.audit import (AuditContext, cohort_stage, concentration_stage, labels_stage, longitudinal_stage,
                             metrics_stage, reref_stage, review_stage)
from cxr_audit.cli import (_ids_arg, _list_arg, cohort, concentration, generate, labels, llm_cache, longitudinal, reref,
                           review_analyse, review_prepare, score, trace)
from cxr_audit.core import DEFAULT_SEED, InputError



# ---- concentration and cohort ----------------------------------------------------------------------------

def _ctx_concentration(n_patients=30, **params):
    from cxr_audit.synth import make_demo_corpus
    d = make_demo_corpus(n_patients=n_patients, seed=0)
    return AuditContext(studies=d.studies, generations=d.generations, extra={}, params=params)


def test_concentration_section_renders_the_result():
    from cxr_audit.concentration import audit_concentration
    ctx = _ctx_concentration(reps=1000, seed=2026)
    sec = concentration_stage(ctx)
    pid = ctx.studies.set_index("study_id").patient_id
    a = audit_concentration(ctx.generations, clusters=pid, reps=1000, seed=2026)
    assert sec.title == "Concentration" and sec.blocks[0].startswith(a.headline())
    assert sec.blocks[0].startswith("**sim-template+B4** is the most concentrated")
    tables = [b for b in sec.blocks if isinstance(b, pd.DataFrame)]
    cmp = next(t for t in tables if "p_holm" in t.columns)
    want = a.comparison_table()
    assert cmp.estimate.tolist() == want.estimate.tolist() and cmp.significant.tolist() == (want.p_holm < 0.05).tolist()
    assert any(isinstance(b, str) and b.startswith("Two-sided bootstrap p") for b in sec.blocks)   # the p-value note
    assert set(tables[-1].group) == {"sim-template+K50"} and "reasons" in tables[-1]


def test_concentration_section_with_one_configuration():
    ctx = _ctx_concentration(n_patients=10, reps=300)
    ctx.generations = ctx.generations.query("system == 'sim-verbose'")
    sec = concentration_stage(ctx)
    assert not any(isinstance(b, str) and b.startswith("**Paired") for b in sec.blocks)
    assert sec.blocks[-1] == "Every output is surface-valid."


def test_concentration_command_writes_and_reports_holm(tmp_path):
    import json
    import pytest
    from cxr_audit.synth import make_demo_corpus
    d = make_demo_corpus(n_patients=12, seed=1)
    gens = d.generations.merge(d.studies[["study_id", "patient_id"]], on="study_id")
    gens.to_parquet(tmp_path / "g.parquet")
    msg = concentration(str(tmp_path / "g.parquet"), out=str(tmp_path / "out"), reps=400, seed=2026,
                        clusters="patient_id", baseline="sim-verbose+B4")
    assert msg.startswith("concentration: ") and "sim-template+B4 is the most concentrated" in msg
    cmp = pd.read_csv(tmp_path / "out/comparisons.csv")
    assert f"{int(cmp.significant.sum())} of {len(cmp)} paired comparisons significant after Holm" in msg
    assert (cmp.significant == (cmp.p_holm < 0.05)).all() and (cmp["first"] == "sim-verbose+B4").all()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "comparisons.csv", "comparisons.svg", "concentration_profile.svg", "distinct_n.svg", "flags.parquet",
        "intervals.csv", "manifest.json", "profile.csv", "summary.csv", "top_k_share.svg"]
    man = json.loads((tmp_path / "out/manifest.json").read_text())
    assert (man["params"]["seed"] == 2026 and man["params"]["clusters"] == "patient_id"
            and "generations" in man["inputs"])
    iv = pd.read_csv(tmp_path / "out/intervals.csv")
    assert (iv.n_clusters == 12).all() and "metric" in iv
    # a CSV: an empty cell reads as missing; bad input is an InputError with the reason
    g = d.generations.head(20).assign(hypothesis=[""] + ["No acute cardiopulmonary process."] * 19)
    g.to_csv(tmp_path / "g.csv", index=False)
    m2 = concentration(str(tmp_path / "g.csv"), out=str(tmp_path / "o2"), reps=50, by=["system"])
    assert "1 not surface-valid" in m2 and pd.read_parquet(tmp_path / "o2/flags.parquet").reasons[0] == "missing"
    with pytest.raises(InputError, match="nope.csv: file not found"): concentration(str(tmp_path / "nope.csv"))
    with pytest.raises(InputError, match=r"missing column\(s\) 'model'"):
        concentration(str(tmp_path / "g.csv"), by=["model"])
    with pytest.raises(InputError, match="scheme must be"): concentration(str(tmp_path / "g.csv"), scheme="exact")


def test_concentration_command_parses_repeatable_options():
    import argparse
    from cxr_audit.cli import add_arguments
    p = add_arguments(argparse.ArgumentParser(), concentration)
    a = p.parse_args(["g.parquet", "--prefix", "no acute", "--prefix", "normal chest", "--reps", "100", "--clusters",
                      "patient_id"])
    assert a.prefix == ["no acute", "normal chest"] and a.reps == 100 and a.seed == DEFAULT_SEED and a.by is None


def test_cohort_section_and_command(tmp_path):
    import pytest
    from cxr_audit.cohort import recipe_004_iu
    from cxr_audit.core import write_table
    ctx = _ctx_concentration(n_patients=20, cohort_recipe="003_lmimic")
    sec = cohort_stage(ctx)
    assert (sec.title == "Cohort" and "recipe `003_lmimic`" in sec.blocks[0]
            and sec.note.startswith("Recipe `003_lmimic`"))
    full = _ctx_concentration(n_patients=20)
    n_given = len(full.studies)
    assert sec.blocks[1] == (f"**The sections below analyse this cohort**: {len(ctx.studies):,} of the {n_given:,} "
                             f"studies given, and their {len(ctx.generations):,} of {len(full.generations):,} "
                             "generated reports.")
    # later stages see the cohort
    assert len(ctx.studies) < n_given and set(ctx.generations.study_id) <= set(ctx.studies.study_id)
    assert list(sec.blocks[2].columns) == ["step", "rule", "n_in", "n_out", "n_excluded", "note"]
    assert sec.blocks[4] == "No integrity problems found."
    write_table(ctx.studies, tmp_path / "studies.parquet")
    msg = cohort(recipe="004_iu", studies=str(tmp_path / "studies.parquet"), out=str(tmp_path / "b"), param=["seed=7"])
    assert msg.startswith("cohort 004_iu: ") and "problem(s)" in msg, msg
    want = recipe_004_iu(ctx.studies, seed=7).studies.study_id.tolist()
    assert pd.read_parquet(tmp_path / "b/cohort.parquet").study_id.tolist() == want
    with pytest.raises(InputError, match="--param must be KEY=VALUE"):
        cohort(recipe="004_iu", studies=str(tmp_path / "studies.parquet"), param=["seed"])
    with pytest.raises(InputError, match="unknown recipe"):
        cohort(recipe="nope", studies=str(tmp_path / "studies.parquet"))



# ---- labels and review -----------------------------------------------------------------------------------

def _ctx_labels(n_patients=20, corpus_seed=0, **params):
    from cxr_audit.synth import make_demo_corpus
    d = make_demo_corpus(n_patients, seed=corpus_seed)
    return AuditContext(studies=d.studies, generations=d.generations, extra={"findings": d.findings}, params=params)


def test_labels_section_renders_the_audit():
    from cxr_audit.label_audit import label_audit
    ctx = _ctx_labels(reps=50, seed=2026)
    sec = labels_stage(ctx)
    frames = [b for b in sec.blocks if isinstance(b, pd.DataFrame)]
    audit = label_audit(ctx.studies, ctx.generations, ctx.extra["findings"], reps=50, seed=2026, contrast="naive")
    pd.testing.assert_frame_equal(frames[0], audit.summary())  # the section shows the result, nothing else
    assert {"reference-report labels", "ground truth"} <= set(frames[0].reference)
    assert ("Cardiomegaly" in set(frames[1].label)
            and frames[2].labeler.tolist() == ["naive-mention"] * 2 + ["cxr_audit:chexpert"] * 2)
    assert sum(type(b).__module__.startswith("altair") for b in sec.blocks) == 2 and "rule-based" in sec.blocks[0]


def test_labels_section_with_one_run():
    ctx = _ctx_labels(8, corpus_seed=1, reps=20)
    ctx.generations = ctx.generations.query("system == 'sim-omit'")
    blocks = labels_stage(ctx).blocks
    assert "Exclusion sensitivity needs two runs; only one was given." in [b for b in blocks if isinstance(b, str)]
    assert blocks[-1].startswith("The runs keep one order under all 3 labelers")   # one run: the swap cannot reorder it


def test_review_section_is_labelled_simulated():
    sec = review_stage(_ctx_labels(24, corpus_seed=1, reps=100, seed=2026))
    assert sec.blocks[0].startswith("**SIMULATED ratings") and isinstance(sec.blocks[1], pd.DataFrame)
    assert "metric" in sec.blocks[3] and "micro_f1" in sec.blocks[5] and "SIMULATED" in sec.blocks[6].to_dict()["title"]
    ctx = _ctx_labels(8, corpus_seed=1, reps=20)
    g = ctx.generations; first3 = g.study_id.isin(g.study_id.unique()[:3])
    ctx.generations = g[((g.system == "sim-verbose") & first3) | ((g.system == "sim-terse") & ~first3)]
    assert review_stage(ctx).blocks[0].startswith("No review can be simulated")


def _tables(tmp_path, n_patients=12, seed=3):
    from cxr_audit.core import write_table
    from cxr_audit.synth import make_demo_corpus
    d = make_demo_corpus(n_patients, seed=seed)
    write_table(d.studies, tmp_path / "studies.parquet"); write_table(d.generations, tmp_path / "generations.parquet")
    return d


def test_labels_command(tmp_path):
    import pytest
    from cxr_audit.labels import CHEXPERT_5
    from cxr_audit.label_audit import label_audit
    d = _tables(tmp_path)
    msg = labels(references=str(tmp_path / "studies.parquet"), predictions=str(tmp_path / "generations.parquet"),
                 out=str(tmp_path / "o"), labels="5", reps=50)
    assert (msg.startswith("labels (cxr_audit:chexpert): ") and "(5 labels, 50 resamples, seed 0)" in msg
            and "210/210 matched" in msg)
    assert set(pd.read_parquet(tmp_path / "o" / "alignment_counts.parquet").label) == set(CHEXPERT_5)
    assert {"summary.csv", "per_label.svg", "manifest.json", "trace_flags.csv",
            "probes.csv"} <= {p.name for p in (tmp_path / "o").iterdir()}
    # same numbers as the entry point
    ref = label_audit(d.studies, d.generations, reps=50, labels=CHEXPERT_5).to_frame()
    written = pd.read_csv(tmp_path / "o" / "summary.csv")
    assert written.estimate.tolist() == pytest.approx(ref.estimate.tolist(), nan_ok=True)
    assert json.loads((tmp_path / "o" / "manifest.json").read_text())["params"]["seed"] == DEFAULT_SEED
    d.studies[["study_id", "text"]].to_csv(tmp_path / "minimal.csv", index=False)  # a minimal references table
    gens = str(tmp_path / "generations.parquet")
    assert "matched" in labels(references=str(tmp_path / "minimal.csv"), predictions=gens, out=str(tmp_path / "o2"),
                               reps=20)
    assert "matched" in labels(references=str(tmp_path / "studies.parquet"), predictions=gens, out=str(tmp_path / "o3"),
                               reps=20, clusters="patient_id")
    with pytest.raises(InputError):
        labels(references=str(tmp_path / "studies.parquet"), predictions=gens, out=str(tmp_path / "o4"), labels="Heart")


def test_trace_command(tmp_path):
    import pytest
    fix = Path(__file__).resolve().parent / "fixtures" / "labels"
    pd.read_csv(fix / "chexpert_texts.csv", keep_default_na=False).to_parquet(tmp_path / "texts.parquet")
    msg = trace(chexpert_csv=str(fix / "chexpert_labeled.csv"), texts=str(tmp_path / "texts.parquet"),
                out=str(tmp_path / "tr"), min_positives=3)
    assert "7 identical, 1 different" in msg and ("Cardiomegaly: dominated by one sentence, positives from "
                                                  "normal wording") in msg
    assert (tmp_path / "tr" / "trigger_phrases.svg").exists() and msg.endswith(f"wrote {tmp_path / 'tr'}")
    pd.read_csv(fix / "chexpert_texts.csv", keep_default_na=False).head(3).to_parquet(tmp_path / "short.parquet")
    with pytest.raises(InputError, match="pass id_column"):
        trace(chexpert_csv=str(fix / "chexpert_labeled.csv"), texts=str(tmp_path / "short.parquet"))


def test_review_commands(tmp_path):
    import pytest
    from cxr_audit.review import simulate_decisions
    _tables(tmp_path, 30, seed=4)
    (tmp_path / "targeted.txt").write_text("")
    tables = {"studies": str(tmp_path / "studies.parquet"), "generations": str(tmp_path / "generations.parquet")}
    msg = review_prepare(**tables, out=str(tmp_path / "rev"), n_cases=2, strata=["dataset"], simulate=True,
                         reviewers=("A", "B"), targeted=[str(tmp_path / "targeted.txt")])
    assert msg.startswith("review prepare: 4 cases (4 random, 0 targeted) x 5 configurations = 20 reports for "
                          "A, B"), msg
    key = str(tmp_path / "rev/key/review_key.csv")
    sheets = [str(tmp_path / "rev/simulated")]
    first = review_analyse(key=key, ratings=sheets, out=str(tmp_path / "out1"), reps=100, rules='{"count_gap": 2}')
    assert "to discuss in" in first and (tmp_path / "out1/consensus_queue.xlsx").is_file()
    agree = pd.read_csv(tmp_path / "out1/agreement.csv")
    assert "metric" in agree and "measure" not in agree
    q = pd.read_csv(tmp_path / "out1/consensus_queue.csv", encoding="utf-8-sig")
    assert not ((q.kind == "count") & ((q.r1 - q.r2).abs() < 2)).any()
    simulate_decisions(q, seed=3).to_csv(tmp_path / "decided.csv", index=False)
    second = review_analyse(key=key, ratings=sheets, out=str(tmp_path / "out2"),
                            decisions=str(tmp_path / "decided.csv"), rules='{"count_gap": 2}', reps=100, panel="all")
    assert second.startswith("review analyse: 20 reports;")
    assert pd.read_csv(tmp_path / "out2/summary_table.csv").shape[0] == 2 * 5
    with pytest.raises(InputError, match="rules must be JSON"):
        review_analyse(key=key, ratings=sheets, out=str(tmp_path / "o3"), rules="{bad")
    with pytest.raises(InputError, match="targeted case"):
        review_prepare(**tables, out=str(tmp_path / "rev2"), n_cases=2, strata=["dataset"],
                       targeted=[pd.read_csv(key).study_id[0]])
    assert _ids_arg("a, b") == ["a", "b"] and _ids_arg(None) == [] and _list_arg(["x", 1]) == ["x", "1"]
    assert _ids_arg(["a,b", "c"]) == ["a", "b", "c"]


def test_every_command_parses_with_help_for_every_option():
    import argparse
    from cxr_audit.cli import add_arguments
    for f in (labels, trace, review_prepare, review_analyse):
        p = add_arguments(argparse.ArgumentParser(prog=f.__name__), f)
        opts = [a for a in p._actions if a.dest != "help"]
        assert opts and all(a.help for a in opts), f.__name__
    p = add_arguments(argparse.ArgumentParser(), review_analyse)
    a = p.parse_args(["--key", "k.csv", "--ratings", "a.csv", "b.xlsx", "--out", "o"])
    assert a.ratings == ["a.csv", "b.xlsx"] and a.panel == "random" and a.seed == DEFAULT_SEED and a.reps == 2000
    a = add_arguments(argparse.ArgumentParser(),
                      labels).parse_args(["--references", "r", "--predictions", "p", "--out", "o",
                                                                      "--labels", "5", "--uncertain-positive"])
    assert a.labels == "5" and a.uncertain_positive and a.seed == DEFAULT_SEED and a.reps == 1000



# ---- reference sensitivity -------------------------------------------------------------------------------

def _demo(n_patients: int = 20):
    from cxr_audit.synth import make_demo_corpus
    return make_demo_corpus(n_patients=n_patients, seed=0)


def test_reref_section_renders_the_entry_point_result():
    import pandas as pd
    from cxr_audit.reref_sensitivity import reference_sensitivity
    demo = _demo()
    ctx = AuditContext(studies=demo.studies, generations=demo.generations, extra={}, params={"reps": 500, "seed": 3})
    sec = reref_stage(ctx)
    res = reference_sensitivity(demo.studies, demo.generations, reps=500, seed=3, clusters="patient_id", max_studies=80)
    texts = [b for b in sec.blocks if isinstance(b, str)]
    assert sec.title == "Reference sensitivity (ReRef)" and res.headline() in texts and res.note() in texts
    tables = [b for b in sec.blocks if isinstance(b, pd.DataFrame)]
    pd.testing.assert_frame_equal(tables[0], res.run.feasibility().round(3))
    pd.testing.assert_frame_equal(tables[1], res.iqr.round(3))
    pd.testing.assert_frame_equal(tables[2], res.summary()[["metric", "comparisons", "flips", "significant_flips"]])
    top = res.most_reversed()
    assert (tables[3].significant == (tables[3].p_holm < 0.05)).all()
    assert any(isinstance(b, str) and f"`{top['first']}` − `{top['second']}`" in b for b in sec.blocks)


def test_reref_section_with_one_system_or_nothing_to_score():
    demo = _demo(10)
    one = AuditContext(studies=demo.studies, generations=demo.generations[demo.generations.system == "sim-terse"],
                       extra={},
                          params={"reps": 100})
    sec = reref_stage(one)
    assert sec.blocks[-1].endswith("Ranking reversals need at least two systems.")
    empty = AuditContext(studies=demo.studies.head(3).assign(findings="", impression=""), generations=demo.generations,
                            extra={}, params={})
    assert "no study has both" in reref_stage(empty).blocks[0]


def test_reref_command_rules_with_generations(tmp_path):
    import json
    from cxr_audit.core import write_table
    from cxr_audit.reref import EXPERIMENT_VARIANTS
    from cxr_audit.reref_sensitivity import reference_sensitivity
    demo = _demo()
    s = demo.studies.head(20)
    write_table(s, tmp_path / "studies.parquet"); write_table(demo.generations, tmp_path / "gens.csv")
    msg = reref(studies=str(tmp_path / "studies.parquet"), generations=str(tmp_path / "gens.csv"), reps=500,
                out=str(tmp_path / "out"))
    assert msg.startswith("reref: 20 studies x 12 variant(s)") and "flip order" in msg
    ref = pd.read_parquet(tmp_path / "out" / "references.parquet")
    assert len(ref) == 20 * 13 and set(ref.variant) == {"original", *EXPERIMENT_VARIANTS}
    man = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert set(man["outputs"]) >= {"references", "rounds", "scores", "shifts", "reversals",
                                   "gaps"} and man["params"]["backend"] == "rules"
    # the numbers are the entry point's (patient clusters by default, the bootstrap seed)
    res = reference_sensitivity(s, pd.read_csv(tmp_path / "gens.csv"), reps=500, clusters="patient_id")
    written = pd.read_csv(tmp_path / "out" / "reversals.csv")
    # a variation the rules cannot apply has no flips to count (NaN, "not applicable"), never 0
    assert written.flips.fillna(-1).tolist() == res.reversals.flips.fillna(-1).tolist()
    assert written.significant_flips.fillna(-1).tolist() == res.reversals.significant_flips.fillna(-1).tolist()
    assert written.loc[written.flips.isna(), "status"].eq("not applicable with this back end").all()


def test_reref_command_rewrite_only_and_bad_input(tmp_path):
    import pandas as pd
    from cxr_audit.core import write_table
    write_table(_demo(10).studies.head(8), tmp_path / "studies.parquet")
    msg = reref(studies=str(tmp_path / "studies.parquet"), variations=["negation,findings_scope:minimal"],
                out=str(tmp_path / "o"))
    assert msg.startswith("reref: 8 studies x 3 variant(s)")
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["feasibility.csv", "manifest.json",
                                                                  "references.parquet", "rounds.parquet"]
    with pytest.raises(InputError, match="needs --model"):
        reref(studies=str(tmp_path / "studies.parquet"), backend="openai", out=str(tmp_path / "o2"))
    with pytest.raises(InputError, match="wobbly"):
        reref(studies=str(tmp_path / "studies.parquet"), variations=["structure:wobbly"], out=str(tmp_path / "o3"))
    assert pd.read_parquet(tmp_path / "o" / "references.parquet").variant.nunique() == 4



# ---- longitudinal ----------------------------------------------------------------------------------------

def test_longitudinal_section_on_demo_with_truth():
    from cxr_audit.audit import AuditContext
    from cxr_audit.synth import make_demo_corpus
    d = make_demo_corpus(seed=0)
    sec = longitudinal_stage(AuditContext(d.studies, d.generations, extra={"progression": d.progression},
                                          params={"reps": 1000}))
    assert sec.title == "Longitudinal progression" and sec.blocks[0].startswith("Each reference report")
    assert "offline rule-based annotator" in sec.blocks[0] and ("Resampling unit: patients (`patient_id`: 60 patients, "
                                                                "189 studies)") in sec.blocks[0]
    tables = [b for b in sec.blocks if isinstance(b, pd.DataFrame)]
    assert tables[0]["class"].tolist() == ["no change", "improved", "worsened", "all"]          # the truth
    assert set(tables[1].system) == {"sim-verbose+B4", "sim-terse+B4", "sim-omit+B4", "sim-template+B4",
                                     "sim-template+K50"}
    bv = tables[2]
    assert (bv.significant == (bv.p_holm < 0.05)).all()  # Holm, never the interval
    notes = [b for b in sec.blocks if isinstance(b, str) and b.startswith("Two-sided bootstrap p")]
    assert notes and "after Holm over 10 comparisons" in notes[0]  # the p-value convention


def test_longitudinal_section_without_longitudinal_content():
    from cxr_audit.synth import make_demo_corpus
    d = make_demo_corpus(6, seed=1)
    one = d.generations.query("system == 'sim-verbose'")
    sec = longitudinal_stage(AuditContext(d.studies.assign(findings="No effusion."), one, params={"reps": 20}))
    assert sec.blocks == ["No longitudinal evaluation was possible: no study has longitudinal reference content and a "
                          "report from every system."]
    sec = longitudinal_stage(AuditContext(d.studies.drop(columns="patient_id"), one, params={"reps": 20}))
    assert ("Resampling unit: studies (21; no `patient_id` column)" in sec.blocks[0]
            and "Best against runner-up" not in " ".join(b for b in sec.blocks if isinstance(b, str)))


def test_longitudinal_command_rules_end_to_end_with_meteor(tmp_path):
    import json
    import shutil
    import pytest
    from cxr_audit.core import InputError, write_table
    from cxr_audit.synth import make_demo_corpus
    d = make_demo_corpus(8, seed=4)
    write_table(d.studies, tmp_path / "s.parquet"); write_table(d.generations, tmp_path / "g.parquet")
    msg = longitudinal(studies=str(tmp_path / "s.parquet"), generations=str(tmp_path / "g.parquet"),
                       out=str(tmp_path / "o"), reps=1000, clusters="patient_id", match="families")
    summ = pd.read_csv(tmp_path / "o" / "summary.csv")
    assert {"bleu_1", "bleu_2", "bleu_3", "bleu_4", "rouge_l", "progression_micro_f1",
            "progression_f1_no_change"} <= set(summ.metric)
    if shutil.which("java"): assert "meteor" in set(summ.metric) and "Note:" not in msg
    else: assert "METEOR was not computed" in msg
    assert msg.startswith("longitudinal: ") and "after Holm" in msg and "Two-sided bootstrap p" in msg
    bv = pd.read_csv(tmp_path / "o" / "best_vs_runner_up.csv")
    assert (bv.significant == (bv.p_holm < 0.05)).all()
    m = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert (m["params"]["match"] == "families" and m["params"]["clusters"] == "patient_id"
            and "generated_sentences" in m["outputs"])
    with pytest.raises(InputError, match="missing column"):
        longitudinal(studies=str(tmp_path / "s.parquet"), generations=str(tmp_path / "g.parquet"),
                     out=str(tmp_path / "x"), section="impressions", reps=50)
    with pytest.raises(InputError, match="annotator must be 'rules' or 'openai'"):
        longitudinal(studies=str(tmp_path / "s.parquet"), generations=str(tmp_path / "g.parquet"),
                     out=str(tmp_path / "x"), annotator="gpt")
    with pytest.raises(InputError, match="needs --model"):
        longitudinal(studies=str(tmp_path / "s.parquet"), generations=str(tmp_path / "g.parquet"),
                     out=str(tmp_path / "x"), annotator="openai")


def test_longitudinal_command_with_openai_annotator_over_http(tmp_path):
    from cxr_audit.core import write_table
    from cxr_audit.llm import LocalEndpoint
    from cxr_audit.longitudinal import rule_chat
    from cxr_audit.synth import make_demo_corpus
    d = make_demo_corpus(3, seed=2)
    gens = d.generations[d.generations.system.isin(["sim-verbose", "sim-omit"])]
    write_table(d.studies, tmp_path / "studies.parquet"); write_table(gens, tmp_path / "gens.csv")
    common = {"studies": str(tmp_path / "studies.parquet"), "generations": str(tmp_path / "gens.csv"),
              "metrics": ["bleu_4", "rouge_l"], "reps": 50}
    with LocalEndpoint(rule_chat()) as ep:
        msg = longitudinal(**common, out=str(tmp_path / "out"), annotator="openai", model="rule-chat",
                           base_url=ep.base_url, cache=str(tmp_path / "c.sqlite"))
        assert ep.n_requests > 0
    assert msg.startswith("longitudinal: ") and "annotator llm:rule-chat" in msg
    calls = pd.read_parquet(tmp_path / "out" / "llm_calls.parquet")
    assert set(calls.reports) == {"references", "generations"} and set(calls.step) == {"longitudinal", "keyword",
                                                                                       "progression"}
    assert longitudinal(**common, out=str(tmp_path / "rules")).startswith("longitudinal: ")
    a, b = (pd.read_csv(tmp_path / o / "summary.csv") for o in ("out", "rules"))
    assert set(a.annotator) == {"llm:rule-chat"} and set(b.annotator) == {"rules"}    # each table says who annotated
    same = lambda t: t[t.metric.str.startswith("bleu")].drop(columns="annotator").reset_index(drop=True)
    pd.testing.assert_frame_equal(same(a), same(b))


def test_longitudinal_command_options_have_help_and_one_default():
    import argparse
    import inspect
    from cxr_audit.cli import add_arguments
    from cxr_audit.longitudinal_eval import progression_evaluation
    p = add_arguments(argparse.ArgumentParser(), longitudinal)
    a = p.parse_args(["--studies", "s.csv", "--generations", "g.csv", "--out", "o"])
    entry = inspect.signature(progression_evaluation).parameters
    assert a.reps == entry["reps"].default and a.seed == entry["seed"].default
    # the one rule: patients when the table has them, else studies (see `cli._clusters_arg`)
    assert a.clusters == "patient_id"
    assert a.annotator == "rules" and a.n_change_indicators == 8 and a.match == "exact"



# ---- metrics, scoring, generation and the LLM cache ------------------------------------------------------

def test_llm_cache_in_process(tmp_path):
    import json
    from cxr_audit.llm import RuleChat, run_batch
    rule = RuleChat(lambda m, s: m[-1]["content"].upper(), name="upper")
    run_batch([{"request_id": i, "messages": f"m{i}"} for i in range(3)], rule, cache=tmp_path / "c.sqlite",
              progress=False)
    assert json.loads(llm_cache(str(tmp_path / "c.sqlite")))["entries"] == 3
    assert json.loads(llm_cache(str(tmp_path / "c.sqlite"), clear=True))["entries"] == 0


def _demo_files(tmp_path, n_patients=20, seed=3):
    from cxr_audit.core import write_table
    from cxr_audit.synth import make_demo_corpus
    demo = make_demo_corpus(n_patients=n_patients, seed=seed)
    write_table(demo.generations, tmp_path / "g.parquet"); write_table(demo.studies, tmp_path / "s.parquet")
    return demo


def test_score_writes_holm_consistent_files(tmp_path):
    _demo_files(tmp_path)
    msg = score(str(tmp_path / "g.parquet"), str(tmp_path / "out"), ["bleu_4", "rouge_l", "chexpert_f1_5"], reps=2000,
                seed=1, studies=str(tmp_path / "s.parquet"), baseline="sim-verbose+B4", ref_section="impression")
    assert msg.startswith("score: 5 configuration(s) x 3 metric(s)") and "clusters" in msg, msg
    sys_, cmp_ = pd.read_csv(tmp_path / "out/systems.csv"), pd.read_csv(tmp_path / "out/comparisons.csv")
    assert set(sys_.config) == {"sim-verbose+B4", "sim-terse+B4", "sim-template+B4", "sim-template+K50", "sim-omit+B4"}
    assert (cmp_["first"] == "sim-verbose+B4").all() and len(cmp_) == 12
    assert (cmp_.significant == (cmp_.p_holm < 0.05)).all()
    n_sig = int(cmp_.significant.sum())
    assert f"{n_sig} of 12 comparisons significant after Holm" in msg, msg          # the summary and the file agree
    assert "Two-sided bootstrap p" in msg and "after Holm over 12 comparisons" in msg
    assert "Warning" not in msg


def test_score_warns_when_reps_are_too_few(tmp_path):
    _demo_files(tmp_path)
    msg = score(str(tmp_path / "g.parquet"), str(tmp_path / "out"), ["bleu_4", "rouge_l", "meteor", "chexpert_f1_5"],
                reps=1000, studies=str(tmp_path / "s.parquet"))
    cmp_ = pd.read_csv(tmp_path / "out/comparisons.csv")
    assert len(cmp_) == 40 and not cmp_.significant.any()  # was: 23-34 True beside "0 of 40"
    assert "0 of 40 comparisons significant after Holm" in msg
    assert "Warning: score_systems: with 1,000 resamples and 40 comparisons" in msg, msg


def test_score_two_stage_pairs_and_bad_input(tmp_path):
    import pytest
    from cxr_audit.core import write_table
    pairs = pd.DataFrame({"sample_id": ["a", "b", "c"], "reference": ["Lungs clear.", "Small effusion.", "Mild edema."],
                          "hypothesis": ["Lungs are clear.", "Small left effusion.", "Edema."]})
    write_table(pairs, tmp_path / "pairs.parquet")
    msg = score(str(tmp_path / "pairs.parquet"), str(tmp_path / "o1"), ["bleu_4", "rouge_l"], reps=200, seed=7)
    assert "comparisons" not in msg and not (tmp_path / "o1/comparisons.csv").exists(), msg
    with pytest.raises(InputError, match="nope.csv"):
        score(str(tmp_path / "nope.csv"), str(tmp_path / "o2"))
    pd.DataFrame({"hypothesis": ["x"]}).to_csv(tmp_path / "h.csv", index=False)
    with pytest.raises(InputError, match="h.csv: needs a 'reference' column"):
        score(str(tmp_path / "h.csv"), str(tmp_path / "o3"))
    with pytest.raises(InputError, match="unknown metric 'bleu_9'"):
        score(str(tmp_path / "pairs.parquet"), str(tmp_path / "o4"), ["bleu_9"])
    with pytest.raises(InputError, match="clusters: 'site' is not a column"):
        score(str(tmp_path / "pairs.parquet"), str(tmp_path / "o5"), ["bleu_4"], clusters="site")


def test_generate_end_to_end(tmp_path):
    import json
    import numpy as np
    import pytest
    pytest.importorskip("torch"); pytest.importorskip("transformers")
    from PIL import Image
    from cxr_audit.core import read_table, write_table
    from cxr_audit.generate import tiny_model
    for i in range(6):
        Image.fromarray(np.random.default_rng(i).integers(0, 255, (40, 48, 3),
                                                          dtype=np.uint8)).save(tmp_path / f"{i}.png")
    studies = pd.DataFrame({"study_id": [f"s{i}" for i in range(6)],
                            "image_paths": [[str(tmp_path / f"{i}.png")] for i in range(6)],
                            "indication": ["Cough.", "", "Chest pain.", None, "Fever.", "Line placement."]})
    tiny = tiny_model("encoder-decoder")
    tiny.model.save_pretrained(tmp_path / "tiny"); tiny.processor.save_pretrained(tmp_path / "tiny")
    write_table(studies, tmp_path / "studies.parquet")
    (tmp_path / "pol.yaml").write_text("B4-16: {base: B4, max_new_tokens: 16}\nK50-16: {base: K50, "
                                       "max_new_tokens: 16}\n")
    msgs = [generate(str(tmp_path / "tiny"), str(tmp_path / "studies.parquet"), str(tmp_path / f"g{k}.parquet"),
                     policies=str(tmp_path / "pol.yaml"), seeds=[0, 1], use_indication=True, progress=False)
            for k in (1, 2)]
    assert msgs[0].startswith("Wrote 18 generations (0 failed, ")
    assert (tmp_path / "g1.parquet").read_bytes() == (tmp_path / "g2.parquet").read_bytes()
    g = read_table(tmp_path / "g1.parquet")
    assert g.sample_id.iloc[0] == "tiny/B4-16/0/s0"
    man = json.loads((tmp_path / "g1.manifest.json").read_text())
    assert man["command"] == "cxr-audit generate" and man["params"]["use_indication"] is True
    assert len(man["inputs"]["studies"]["sha256"]) == 64 and "config" in man["inputs"]
    with pytest.raises(InputError, match="model folder not found .*never downloads"):
        generate("org/some-hub-model", str(tmp_path / "studies.parquet"), str(tmp_path / "x.parquet"))


def test_metrics_section_renders_the_result():
    from cxr_audit.audit import AuditContext
    from cxr_audit.synth import make_demo_corpus
    demo = make_demo_corpus(n_patients=12, seed=0)
    sec = metrics_stage(AuditContext(demo.studies, demo.generations, params={"reps": 600, "seed": 0}))
    tables = [b for b in sec.blocks if isinstance(b, pd.DataFrame)]
    assert tables[0].config.tolist() == ["sim-verbose+B4", "sim-terse+B4", "sim-template+B4", "sim-template+K50",
                                         "sim-omit+B4"]
    cmp_ = tables[1]
    assert (cmp_["first"] == "sim-verbose+B4").all() and (cmp_.significant == (cmp_.p_holm < 0.05)).all()
    text = " ".join(b for b in sec.blocks if isinstance(b, str))
    assert "Two-sided bootstrap p" in text and "IDF" in text and ("rule-based labeler (`cxr_audit.labels`, labels "
                                                                  "`cxr_audit:chexpert`") in text
    assert "**Warning:** score_systems: with 600 resamples and 20 comparisons" in text     # too few for Holm over 20


# ---- progress bars: on a terminal (or when asked), silent in tests and logs ------------------------------------------

def test_generation_is_silent_off_a_terminal_and_shows_a_bar_when_asked(capsys, monkeypatch):
    from cxr_audit.generate import SimulatedGenerator, generate_table
    from cxr_audit.synth import make_demo_corpus
    corpus = make_demo_corpus(n_patients=4, seed=0)
    monkeypatch.delenv("CXR_AUDIT_PROGRESS", raising=False)
    generate_table(SimulatedGenerator("sim-terse", corpus), corpus.studies, "B4")   # pytest's stderr is not a terminal
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("CXR_AUDIT_PROGRESS", "1")
    generate_table(SimulatedGenerator("sim-terse", corpus), corpus.studies, "B4")
    assert "generate sim-terse" in capsys.readouterr().err


def test_long_resampling_shows_a_bar_only_when_asked(capsys, monkeypatch):
    from cxr_audit.stats import weight_chunks
    monkeypatch.delenv("CXR_AUDIT_PROGRESS", raising=False)
    sum(W.sum() for _, W in weight_chunks(50, 400, 0, None, 50, rows=40))   # 10 chunks, not a terminal: silent
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("CXR_AUDIT_PROGRESS", "1")
    total = sum(W.sum() for _, W in weight_chunks(50, 400, 0, None, 50, rows=40))
    assert "resamples, 40 per step" in capsys.readouterr().err and total == 400 * 50
    sum(W.sum() for _, W in weight_chunks(50, 400, 0, None, 50, rows=200))   # two chunks: quick, no bar even when asked
    assert capsys.readouterr().err == ""


def test_a_table_with_a_named_column_index_has_no_empty_column():
    from cxr_audit.audit import table_html
    # as `ProgressionEvaluation.table()` returns
    df = pd.DataFrame({"system": ["a"], "f1": [0.5]}).rename_axis(columns="metric")
    head = table_html(df).split("</thead>")[0]
    assert head.count("<th>") == 2 and "<th>metric</th>" not in head


# ---- charts drawn while the stages run (issue 23) ------------------------------------------------------------

def test_report_charts_drawn_in_the_background_equal_charts_drawn_at_the_end():
    from concurrent.futures import ThreadPoolExecutor

    import altair as alt

    from cxr_audit.audit import Section, render_report
    from cxr_audit.core import chart_svg, submit_chart
    bars = [alt.Chart(pd.DataFrame({"system": list("ABC"), "n": [i, 2, 3]})).mark_bar().encode(x="system:N", y="n:Q")
            for i in (1, 5, 9)]
    secs = [Section("One", ["text", bars[0]]), Section("Two", [bars[1], pd.DataFrame({"x": [1]}), bars[2]])]
    at_end = render_report(secs, title="t")
    # the third is drawn at the end
    with ThreadPoolExecutor(2) as pool: drawn = {id(b): submit_chart(pool, b) for b in bars[:2]}
    assert render_report(secs, title="t", drawn=drawn) == at_end
    # a string is taken as drawn
    assert render_report(secs, title="t", drawn={id(bars[2]): chart_svg(bars[2])}) == at_end
    assert at_end.count("<svg") == 3
    bars[0].to_dict()     # drawing skips the schema check; the charts still validate


def test_blank_cells_are_marked_and_explained():
    import numpy as np
    from cxr_audit.audit import table_html
    h = table_html(pd.DataFrame({"metric": ["bleu_4", "chexpert_f1_14"], "labeler": [None, "cxr_audit:chexpert"],
                                 "p": [np.nan, 0.01]}))
    assert h.count("<td>–</td>") == 2 and "– : no value for that row" in h
    assert "no value for that row" not in table_html(pd.DataFrame({"a": [1.0]}))


def test_verdict_colours_are_never_a_systems_colour():
    "Charts colour systems by `PALETTE` + `EXTRA_COLORS`; a verdict or outcome colour must not read as one of them."
    from cxr_audit.core import EXTRA_COLORS, PALETTE
    from cxr_audit.reref_sensitivity import _VERDICT_COLORS
    from cxr_audit.verdict import VERDICT_COLORS
    systems = {c.lower() for c in PALETTE + EXTRA_COLORS}
    assert not ({c.lower() for c in VERDICT_COLORS.values()} | {c.lower() for c in _VERDICT_COLORS.values()}) & systems
