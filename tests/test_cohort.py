"""Integration tests of cohort construction: determinism, recipes on the demo corpus and the loader fixtures,
integrity checks, splits, bad input, and writing a cohort (what `cxr-audit cohort` writes)."""
import json
from pathlib import Path

import numpy as np
import pandas as pd
import polars as pl
import pytest

from cxr_audit.cohort import (IU_004_FRACTIONS, RECIPES, Cohort, allocate, plot_flow,
                              recipe_004_iu, recipe_004_mimic, run_recipe, write_cohort)
from cxr_audit.core import InputError, chart_svg
from cxr_audit.corpus import load_iu_xray, load_mimic_cxr
from cxr_audit.synth import make_demo_corpus

FIX = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def demo():
    return make_demo_corpus(40, seed=3).studies


@pytest.mark.parametrize("name", list(RECIPES))
def test_every_recipe_runs_on_the_demo_corpus_deterministically(demo, name):
    a, b = run_recipe(name, demo), run_recipe(name, demo.copy())
    assert len(a) > 0
    pd.testing.assert_frame_equal(a.studies, b.studies)
    pd.testing.assert_frame_equal(a.flow, b.flow)
    pd.testing.assert_frame_equal(a.excluded, b.excluded)
    assert a.manifest()["sha256"] == b.manifest()["sha256"]
    # the flow adds up, and every removed row is in .excluded with its step
    f = a.flow
    assert (f.n_in.iloc[1:].to_numpy() == f.n_out.iloc[:-1].to_numpy()).all() and f.n_in.iloc[0] == len(demo)
    assert (f[f.kind != "explode_images"].eval("n_in - n_out == n_excluded")).all()
    assert a.excluded.groupby("excluded_by").size().to_dict() == {s: n for s, n in zip(f.step, f.n_excluded) if n}


def test_seed_changes_the_split_and_the_manifest(demo):
    a, b = recipe_004_iu(demo, seed=42), recipe_004_iu(demo, seed=43)
    assert a.manifest()["sha256"] != b.manifest()["sha256"]
    assert a.studies.study_id.tolist() != b.studies.study_id.tolist()


def test_recipes_on_the_loader_fixtures():
    m = load_mimic_cxr(FIX / "mimic")
    r = recipe_004_mimic(m)
    assert r.studies.metadata_row.tolist() == [5, 7] and r.studies.image_view.tolist() == ["AP", "PA"]
    assert r.flow.n_out.tolist() == [2, 4, 2, 2, 2]
    assert run_recipe("003_lmimic", m).studies.study_id.tolist() == ["s50100001", "s50100003", "s50200002"]
    assert run_recipe("000_test", m).studies.study_id.tolist() == ["s50200001", "s50200002"]
    iu = load_iu_xray(FIX / "iu_xray/csv")
    ri = run_recipe("004_iu", iu)
    assert len(ri) == 1 and ri.check().empty
    assert run_recipe("000_test", load_iu_xray(FIX / "iu_xray/rexrank"),
                      split=None).studies.study_id.tolist() == ["CXR3", "CXR1"]


def test_004_mimic_scans_images_in_metadata_order():
    # two studies whose images interleave in the metadata file; the cap must follow metadata order
    t = pd.DataFrame({"study_id": ["s1", "s2"], "split": "test", "findings": "Lungs are clear without effusion.",
                      "impression": "No acute cardiopulmonary process.",
                      "image_paths": [["a", "b", "c"], ["d", "e"]],
                      "image_views": [["PA", "AP", "LATERAL"], ["AP", "PA"]],
                      "dicom_ids": [["d1", "d2", "d3"], ["d4", "d5"]], "metadata_rows": [[0, 2, 4], [1, 3]]})
    c = recipe_004_mimic(t, n=3)
    assert c.studies.entry_id.tolist() == ["s1/d1", "s2/d4", "s1/d2"]
    assert c.flow.n_out.tolist() == [2, 5, 4, 4, 3] and c.flow.n_studies.tolist() == [2, 2, 2, 2, 2]


def test_check_catches_injected_overlap_and_duplicate(demo):
    c = Cohort(demo).split("patient_id", {"train": 0.6, "validate": 0.2, "test": 0.2}, seed=0)
    assert c.check().empty
    s = c.studies
    dup = pd.concat([s, s.iloc[[0]]], ignore_index=True)
    p = Cohort(dup).check()
    assert ("duplicate_id", s.study_id[0]) in set(zip(p.check, p.id))
    moved = s.copy()
    i = int(np.flatnonzero(moved.split == "train")[0])
    moved.loc[i, "split"] = "test"                          # one study of a train patient moved to test
    p = Cohort(moved).check()
    overlap = p[p.check == "partition_overlap"]
    assert overlap.column.tolist() == ["patient_id"] and overlap.id.tolist() == [moved.patient_id[i]]


def test_check_sees_rows_dropped_after_the_split(demo):
    leaky = Cohort(demo).split("study_id", {"train": 0.5, "test": 0.5}, seed=0)      # patients straddle partitions
    test_only = leaky.filter("test only", pl.col("split") == "test")
    assert ((test_only.check().check == "partition_overlap").sum()
            == (leaky.check().check == "partition_overlap").sum() > 0)


@pytest.mark.parametrize("by", ["study_id", "patient_id"])
def test_split_is_disjoint_and_respects_fractions(demo, by):
    fr = {"train": 0.7, "validate": 0.1, "test": 0.2}
    s = Cohort(demo).split(by, fr, seed=11).studies
    assert s.groupby(by).split.nunique().max() == 1
    counts = s.drop_duplicates(by).split.value_counts().to_dict()
    assert counts == allocate(demo[by].nunique(), fr)
    big = pd.DataFrame({"study_id": [f"x{i}" for i in range(1000)]})
    assert Cohort(big).split("study_id", fr,
                             seed=1).studies.split.value_counts().to_dict() == {"train": 700, "test": 200,
                                                                                "validate": 100}


def test_impossible_split_is_refused_before_anything_runs(demo):
    broken = demo.assign(image_paths="not a list")        # the recipe's first step would fail on this table
    with pytest.raises(InputError, match="fractions must add up to 1"):
        recipe_004_iu(broken, fractions={"train": 0.7, "test": 0.2})
    with pytest.raises(InputError, match="cannot fill 3 partitions"):
        Cohort(demo.head(2)).split("study_id", IU_004_FRACTIONS, seed=0)
    base = Cohort(demo)
    with pytest.raises(InputError, match="the fraction of 'test' must be in"):
        base.split("study_id", {"train": 1.0, "test": 0.0}, seed=0)
    assert len(base.steps) == 0 and "split_source" not in base.studies


def test_bad_input_names_step_row_and_columns(demo):
    with pytest.raises(InputError, match=r"step 'odd': the predicate failed on row 3 \(study_id='synth-s000004'\): "
                                         r"ZeroDivisionError"):
        Cohort(demo).filter("odd", lambda r: 1 / (int(r["study_id"][-1]) - 4) > 0)
    with pytest.raises(InputError, match=r"recipe '004_mimic' needs: missing column\(s\) 'split', 'findings'"):
        run_recipe("004_mimic", demo.drop(columns=["split", "findings"]))
    with pytest.raises(InputError, match="column 'image_paths' must hold lists"):
        run_recipe("004_mimic", demo.assign(image_paths="a.png"))
    with pytest.raises(InputError, match="unknown recipe"):
        run_recipe("nope", demo)


def test_write_cohort_is_reproducible(tmp_path, demo):
    c = recipe_004_mimic(demo)
    write_cohort(c, tmp_path / "a"); recipe_004_mimic(demo.copy()).save(tmp_path / "b")
    for f in ("cohort.parquet", "excluded.parquet", "flow.csv", "problems.csv", "flow.svg"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f
    ma, mb = (json.loads((tmp_path / d / "manifest.json").read_text()) for d in "ab")
    assert ma["cohort"]["sha256"] == mb["cohort"]["sha256"]
    assert ma["outputs"]["cohort"]["sha256"] == mb["outputs"]["cohort"]["sha256"]
    assert pd.read_parquet(tmp_path / "a/cohort.parquet").entry_id.tolist() == c.studies.entry_id.tolist()
    assert len(pd.read_parquet(tmp_path / "a/excluded.parquet")) == len(c.excluded)


def test_the_cohort_renders_itself(demo):
    c = run_recipe("004_iu", demo)
    assert c.headline().startswith("**") and "recipe `004_iu`" in c.headline()
    assert list(c.summary().columns) == ["step", "rule", "n_in", "n_out", "n_excluded", "note"]
    assert c.summary().n_out.tolist() == c.flow.n_out.tolist()
    svg = chart_svg(c.plot())
    assert svg.lstrip().startswith("<svg") and "Excluded" in svg and svg == chart_svg(plot_flow(c))


def test_the_demo_cohort_of_the_audit_report_is_unchanged():
    # recorded before issue 16: recipe 003_lmimic on the demo corpus of `cxr-audit demo` (60 patients, seed 0)
    studies = make_demo_corpus(n_patients=60, seed=0).studies
    c = run_recipe("003_lmimic", studies)
    assert c.flow[["n_in", "n_out", "n_excluded"]].values.tolist() == [[189, 129, 60], [129, 129, 0]]
    assert c.manifest()["sha256"] == "6fa4079a98ee9bd0771a3136437c1117669e84099daa908bfa0519861de43f52"


def test_entry_ids_stay_the_same_when_a_later_step_drops_entries():
    # entry_id is `<study_id>/<image number or dicom_id>` at every size: capping the cohort does not rename an entry
    text = "Heart size is normal. The lungs are clear without effusion or pneumothorax."
    studies = pd.DataFrame({"study_id": ["s1", "s2"], "split": ["test", "test"],
                            "image_paths": [["s1/ap.jpg", "s1/lat.jpg", "s1/pa.jpg"], ["s2/pa.jpg"]],
                            "image_views": [["AP", "LATERAL", "PA"], ["PA"]], "findings": [text, text],
                            "impression": ["", ""]})
    full = recipe_004_mimic(studies).studies
    assert full.entry_id.tolist() == ["s1/0", "s1/2",
                                      "s2/0"] and full.image_path.tolist() == ["s1/ap.jpg", "s1/pa.jpg", "s2/pa.jpg"]
    assert recipe_004_mimic(studies, n=1).studies.entry_id.tolist() == ["s1/0"]
    assert recipe_004_mimic(studies.iloc[::-1]).studies.set_index("entry_id").image_path.sort_index().equals(
        full.set_index("entry_id").image_path.sort_index())


def test_a_rexrank_file_that_is_one_split_is_kept_whole(tmp_path):
    """Paper 004's IU recipe draws a seeded split of a whole collection; a benchmark file that already is the test
    split stays whole."""
    from cxr_audit.corpus import load_rexrank
    from cxr_audit.papers import PAPER_004
    sample = Path(__file__).parent / "fixtures" / "iu_real" / "iu_valid_rexrank_sample.json"
    valid = load_rexrank(sample, "iu-xray")
    assert "test" not in set(valid.split)                      # a validation file (its entries say so)
    drawn = PAPER_004.cohort("MIMIC->IU", valid)               # auto: not the test split, so the paper's split is drawn
    assert "split by IU ID" in drawn.flow.step.tolist() and len(drawn.studies) < len(valid) // 2
    kept = PAPER_004.cohort("MIMIC->IU", valid, split="given")
    assert "test split as given" in kept.flow.step.tolist() and len(kept.studies) == len(valid)
    test_file = tmp_path / "IU_XRay_test.json"    # the same studies as ReXrank's test file writes them
    test_file.write_text(json.dumps({k: {**e, "split": "test"} for k, e in json.loads(sample.read_text()).items()}))
    auto = PAPER_004.cohort("MIMIC->IU", load_rexrank(test_file, "iu-xray"))
    assert len(auto.studies) == len(valid) and auto.recipe["params"]["split"] == "given"
