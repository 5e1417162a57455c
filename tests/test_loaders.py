"""Integration tests of the dataset loaders in `cxr_audit.corpus` on the fixture files (real layouts, made-up text)."""
import json
from pathlib import Path

import pandas as pd
import pytest

from cxr_audit.core import InputError, sha256_frame
from cxr_audit.corpus import (LOAD_FLAGS, STUDIES_COLUMNS, VIEW_STATUS, LoadReport, load_chexpert_plus,
                              load_generations, load_iu_xray, load_mimic_cxr, load_report, load_rexgradient,
                              load_rexrank, load_table,
                              normalize_view)

FIX = Path(__file__).parent / "fixtures"
MIMIC, IU, CHEX, REXG = FIX / "mimic", FIX / "iu_xray", FIX / "chexpert_plus", FIX / "rexgradient"
MESSY, REAL = FIX / "messy", FIX / "iu_real" / "iu_valid_rexrank_sample.json"


def _aligned(df):
    "Every study has one view per image and `view` is the first one."
    assert list(df.columns[:len(STUDIES_COLUMNS)]) == list(STUDIES_COLUMNS)
    # load_table without views
    views_of = df.image_views if "image_views" in df.columns else [[None] * len(p) for p in df.image_paths]
    for paths, views, view in zip(df.image_paths, views_of, df.view):
        assert isinstance(paths, list) and isinstance(views, list) and len(paths) == len(views)
        assert view == (views[0] if views else None) or "image_views" not in df.columns
    assert list(df.columns[-2:]) == ["view_status", "load_flags"]
    assert set(df.view_status) <= set(VIEW_STATUS)
    assert all(isinstance(f, list) and set(f) <= set(LOAD_FLAGS) for f in df.load_flags)


# ---------------------------------------------------------------- MIMIC-CXR
def test_mimic_rows_follow_metadata_order():
    m = load_mimic_cxr(MIMIC)
    _aligned(m)
    assert m.study_id.tolist() == ["s50100002", "s50100001", "s50100003", "s50200001", "s50200002"]
    rows = m.explode(["image_paths", "metadata_rows"]).metadata_rows.tolist()
    assert rows == list(range(9))   # exploding gives the metadata scan order back
    assert m.dataset.unique().tolist() == ["mimic-cxr"] and m.restricted.all()


def test_mimic_ids_paths_times_views():
    m = load_mimic_cxr(MIMIC).set_index("study_id")
    assert m.loc["s50100003", "patient_id"] == "p10000032"
    assert m.loc["s50100003",
                 "image_paths"] == ["files/p10/p10000032/s50100003/3c4d5e6f-7a8b9c0d-1e2f3a4b-5c6d7e8f-9a0b1c2d.jpg"]
    assert m.loc["s50100001", "study_time"] == pd.Timestamp("2180-06-23 08:52:50.343")
    assert m.loc["s50200002", "image_views"] == ["LATERAL", "PA", None]
    assert m.loc["s50200002", "view"] == "LATERAL"
    assert m.loc["s50200001", "indication"].startswith("Intubated patient")   # HISTORY: stands in for INDICATION:
    assert m.loc["s50100002", "technique"] == "Chest PA and lateral"


def test_mimic_report_csv_matches_files_and_splits_filter():
    files = load_mimic_cxr(MIMIC)
    csv = load_mimic_cxr(MIMIC, reports_csv=MIMIC / "mimic_cxr_sectioned.csv")
    pd.testing.assert_frame_equal(files[["findings", "impression", "comparison"]],
                                  csv[["findings", "impression", "comparison"]])
    test = load_mimic_cxr(MIMIC, splits=["test"])
    assert test.study_id.tolist() == ["s50200001", "s50200002"] and set(test.split) == {"test"}


def test_mimic_errors_name_file_column_row(tmp_path):
    with pytest.raises(InputError, match="no metadata file found"):
        load_mimic_cxr(IU)
    meta = pd.read_csv(MIMIC / "mimic-cxr-2.0.0-metadata.csv.gz", dtype=str)
    meta.drop(columns=["study_id"]).to_csv(tmp_path / "m.csv", index=False)
    with pytest.raises(InputError, match=r"m\.csv: missing column\(s\) 'study_id'"):
        load_mimic_cxr(metadata=tmp_path / "m.csv", split=False, reports=MIMIC)
    bad = meta.copy(); bad.loc[4, "study_id"] = "s5x"; bad.to_csv(tmp_path / "m.csv", index=False)
    with pytest.raises(InputError, match=r"m\.csv: row 4: column 'study_id'"):
        load_mimic_cxr(metadata=tmp_path / "m.csv", split=False, reports=MIMIC)
    meta.loc[[0]].assign(study_id="50999999").to_csv(tmp_path / "m.csv", index=False)
    with pytest.raises(InputError, match=r"s50999999\.txt: report file not found"):
        load_mimic_cxr(metadata=tmp_path / "m.csv", split=False, reports=MIMIC)


def test_mimic_is_restricted_whatever_the_flag_says():
    assert load_mimic_cxr(MIMIC).restricted.all()
    # by what the data is: only the LLM opt-in lets it leave
    assert load_mimic_cxr(MIMIC, restricted=False).restricted.all()


# ---------------------------------------------------------------- IU X-ray
@pytest.mark.parametrize("path,fmt", [(IU / "csv", "csv"), (IU / "csv/indiana_reports.csv", "csv"),
                                      (IU / "ecgen-radiology", "openi"), (IU / "ecgen-radiology/2.xml", "openi"),
                                      (IU, "openi"), (IU / "r2gen", "r2gen"), (IU / "r2gen/annotation.json", "r2gen"),
                                      (IU / "rexrank", "rexrank"),
                                      (IU / "rexrank/ReXRank_IUXray_test.json", "rexrank")])
def test_iu_auto_detection_equals_explicit_format(path, fmt):
    auto, explicit = load_iu_xray(path), load_iu_xray(path, format=fmt)
    pd.testing.assert_frame_equal(auto, explicit)
    _aligned(auto)
    assert auto.dataset.unique().tolist() == ["iu-xray"]
    assert auto.patient_id.isna().all() and not auto.restricted.any()
    assert auto.study_id.str.fullmatch(r"CXR\d+").all()


def test_iu_formats_agree_on_ids_and_text():
    csv = load_iu_xray(IU / "csv").set_index("study_id")
    xml = load_iu_xray(IU / "ecgen-radiology").set_index("study_id")
    for sid in ["CXR1", "CXR2", "CXR3"]:
        for col in ["indication", "comparison", "findings", "impression"]:
            assert csv.loc[sid, col] == xml.loc[sid, col], (sid, col)
    r2 = load_iu_xray(IU / "r2gen").set_index("study_id")
    assert r2.loc["CXR2", "findings"] == csv.loc["CXR2", "findings"]
    rx = load_iu_xray(IU / "rexrank").set_index("study_id")
    assert rx.loc["CXR3", "image_views"] == ["LATERAL", "FRONTAL"]
    assert rx.loc["CXR1", "comparison"] == "None."


def test_iu_views_order_and_splits():
    csv = load_iu_xray(IU / "csv")
    assert csv.image_views.tolist() == [["FRONTAL", "LATERAL"], ["FRONTAL", "LATERAL"], ["LATERAL", "FRONTAL"],
                                        ["LATERAL"]]
    assert load_iu_xray(IU / "ecgen-radiology").study_id.tolist() == ["CXR1", "CXR2", "CXR3", "CXR10"]
    assert load_iu_xray(IU / "r2gen").split.tolist() == ["train", "train", "val", "test"]


def test_iu_unknown_layout_lists_what_was_looked_for(tmp_path):
    (tmp_path / "notes.txt").write_text("nothing")
    with pytest.raises(InputError) as e:
        load_iu_xray(tmp_path)
    for what in ["indiana_reports.csv", "Open-i *.xml", "annotation.json", "ReXrank JSON", "format="]:
        assert what in str(e.value)
    with pytest.raises(InputError, match="unknown format"):
        load_iu_xray(IU / "csv", format="png")
    with pytest.raises(InputError, match="file not found"):
        load_iu_xray(tmp_path / "absent")


def test_iu_malformed_inputs_name_file_and_row(tmp_path):
    (tmp_path / "indiana_reports.csv").write_text("uid,findings,impression\n1,a,b\n2x,c,d\n")
    (tmp_path / "indiana_projections.csv").write_text("uid,filename,projection\n1,1.png,Frontal\n")
    with pytest.raises(InputError, match=r"indiana_reports\.csv: row 1: column 'uid'"):
        load_iu_xray(tmp_path)
    (tmp_path / "indiana_reports.csv").write_text("uid,findings\n1,a\n")
    with pytest.raises(InputError, match=r"indiana_reports\.csv: missing column\(s\) 'impression'"):
        load_iu_xray(tmp_path)
    (tmp_path / "indiana_reports.csv").write_text("uid,findings,impression\n1,a,b\n1,c,d\n")
    with pytest.raises(InputError, match=r"rows 0 and 1 \(study_id='CXR1'\): the same study given twice with different "
                                         r"findings"):
        load_iu_xray(tmp_path)


# ---------------------------------------------------------------- ReXrank
def test_rexrank_mimic_ids_match_mimic_loader():
    rx = load_rexrank(MIMIC / "ReXRank_MIMICCXR_test.json", dataset="mimic-cxr")
    m = load_mimic_cxr(MIMIC).set_index("study_id")
    _aligned(rx)
    assert rx.restricted.all()
    for sid, pid in zip(rx.study_id, rx.patient_id):
        assert m.loc[sid, "patient_id"] == pid
    assert rx.image_views.tolist() == [["AP"], ["LATERAL", "PA"]]


def test_rexrank_chexpert_ids_match_chexpert_loader(tmp_path):
    entry = {"image_path": ["train/patient00001/study1/view1_frontal.jpg",
                            "train/patient00001/study1/view2_lateral.jpg"],
             "frontal_lateral": ["Frontal", "Lateral"], "ap_pa": ["PA", float("nan")], "section_findings": float("nan"),
             "section_impression": "No acute disease.", "context": "Age:60.0.Gender:F.Indication:nanComparison: None.",
             "report": "Findings: None. Impression: No acute disease."}
    (tmp_path / "cx.json").write_text(json.dumps({"patient00001_study1": entry}))
    rx = load_rexrank(tmp_path / "cx.json", dataset="chexpert-plus")
    cx = load_chexpert_plus(CHEX / "df_chexpert_plus_240401.csv").set_index("study_id")
    assert rx.study_id[0] in cx.index and rx.patient_id[0] == cx.loc[rx.study_id[0], "patient_id"]
    assert rx.image_views[0] == cx.loc["patient00001_study1", "image_views"] == ["PA", "LATERAL"]
    assert rx.indication[0] == "" and rx.findings[0] == "" and rx.restricted.all()


# ---------------------------------------------------------------- CheXpert Plus
def test_chexpert_plus_groups_images_into_studies():
    cx = load_chexpert_plus(CHEX / "df_chexpert_plus_240401.csv")
    _aligned(cx)
    assert cx.study_id.tolist() == ["patient00001_study2", "patient00001_study1", "patient64541_study1"]
    assert cx.image_paths.map(len).tolist() == [1, 2, 1]
    assert cx.visit_order.tolist() == [2, 1, 1]
    assert cx.restricted.all() and cx.dataset.unique().tolist() == ["chexpert-plus"]
    assert load_chexpert_plus(CHEX / "df_chexpert_plus_240401.csv", restricted=False).restricted.all()


def test_chexpert_plus_errors(tmp_path):
    src = pd.read_csv(CHEX / "df_chexpert_plus_240401.csv", dtype=str)
    src.drop(columns=["path_to_image"]).to_csv(tmp_path / "c.csv", index=False)
    with pytest.raises(InputError, match=r"c\.csv: missing column\(s\) 'path_to_image'"):
        load_chexpert_plus(tmp_path / "c.csv")
    bad = src.copy(); bad.loc[1, "patient_report_date_order"] = "first"; bad.to_csv(tmp_path / "c.csv", index=False)
    with pytest.raises(InputError, match=r"c\.csv: row 1: column 'patient_report_date_order'"):
        load_chexpert_plus(tmp_path / "c.csv")
    with pytest.raises(InputError, match="file not found"):
        load_chexpert_plus(tmp_path / "absent.csv")


# ---------------------------------------------------------------- ReXGradient-160K
def test_rexgradient_json_csv_and_folder_agree():
    root, js, csv = load_rexgradient(REXG), load_rexgradient(REXG / "metadata/test_metadata.json"), \
        load_rexgradient(REXG / "metadata/test_metadata.csv")
    _aligned(root)
    pd.testing.assert_frame_equal(root, js)
    keep = ["study_id", "patient_id", "split", "view", "image_paths", "image_views", "study_time", "findings",
            "impression"]
    pd.testing.assert_frame_equal(js[keep], csv[keep])
    assert root.restricted.all() and root.split.unique().tolist() == ["test"]


def test_rexgradient_column_mapping_and_errors(tmp_path):
    pd.DataFrame({"uid": ["a", "b"], "F": ["x", "y"], "I": ["u", "v"], "When": ["2020-01-02", "20200103"]}) \
        .to_csv(tmp_path / "train_metadata.csv", index=False)
    r = load_rexgradient(tmp_path, columns={"study_id": "uid", "findings": "F", "impression": "I",
                                            "study_time": "When"})
    assert r.study_id.tolist() == ["a", "b"] and r.split.tolist() == ["train", "train"]
    assert r.study_time.tolist() == [pd.Timestamp("2020-01-02"), pd.Timestamp("2020-01-03")]
    with pytest.raises(InputError, match=r"train_metadata\.csv: missing column\(s\) 'id', 'Findings', 'Impression'"):
        load_rexgradient(tmp_path)


# ---------------------------------------------------------------- generic tables
def test_load_table_csv_per_image_parquet_and_restricted(tmp_path):
    t = load_table(FIX / "table/studies.csv",
                   columns={"study_id": "accession", "text": "report_text", "image_paths": "images"}, dataset="inhouse")
    assert t.restricted.tolist() == [False, True, False]
    assert t.image_paths[0] == ["img/A1001_pa.png", "img/A1001_lat.png"]
    assert load_table(FIX / "table/studies.csv", columns={"study_id": "accession"}, dataset="x",
                      restricted=True).restricted.all()
    pd.DataFrame({"study_id": ["a", "a", "b"], "image_path": ["1", "2", "3"], "image_view": ["pa", "lat", None],
                  "text": ["t", "t", "u"]}).to_parquet(tmp_path / "p.parquet")
    p = load_table(tmp_path / "p.parquet", dataset="x")
    _aligned(p)
    assert p.image_views.tolist() == [["PA", "LATERAL"], [None]]
    with pytest.raises(InputError, match=r"studies\.csv: missing column\(s\) 'nope'"):
        load_table(FIX / "table/studies.csv", columns={"study_id": "nope"}, dataset="x")


def test_load_generations_mapping():
    g = load_generations(FIX / "table/generations.csv",
                         columns={"study_id": "accession", "hypothesis": "generated_report",
                                                               "truncated": "hit_limit"}, system="toy")
    assert g.truncated.tolist() == [False, True, False] and g.system.unique().tolist() == ["toy"]


def test_loading_is_deterministic():
    assert sha256_frame(load_mimic_cxr(MIMIC)) == sha256_frame(load_mimic_cxr(MIMIC))
    assert sha256_frame(load_iu_xray(IU / "csv")) == sha256_frame(load_iu_xray(IU / "csv"))


def test_normalize_view_vocabulary():
    assert [normalize_view(v) for v in ["PA", "antero-posterior", "Lateral", "LEFT LATERAL", "POSTERO_ANTERIOR"]] == \
        ["PA", "AP", "LATERAL", "LL", "PA"]


# ---------------------------------------------------------------- every loader flags the same way
@pytest.mark.parametrize("load", [lambda: load_mimic_cxr(MIMIC), lambda: load_iu_xray(IU / "csv"),
                                  lambda: load_iu_xray(IU / "ecgen-radiology"), lambda: load_iu_xray(IU / "r2gen"),
                                  lambda: load_iu_xray(IU / "rexrank"),
                                  lambda: load_chexpert_plus(CHEX / "df_chexpert_plus_240401.csv"),
                                  lambda: load_rexgradient(REXG), lambda: load_table(FIX / "table/studies.csv",
                                                                                     columns={"study_id": "accession"},
                                                                                     dataset="x")])
def test_every_loader_adds_view_status_and_load_flags(load):
    df = load()
    _aligned(df)
    views_of = df.image_views if "image_views" in df.columns else [[None] * len(p) for p in df.image_paths]
    for views, paths, status in zip(views_of, df.image_paths, df.view_status):
        expected = "no_images" if not paths else "no_views" if all(v is None for v in views) else "ok"
        assert status == expected     # the made-up fixtures have no view mismatch
    assert isinstance(load_report(df), LoadReport)


# ---------------------------------------------------------------- real IU X-ray text (50 studies, ReXrank JSON)
def test_real_iu_fixture_loads_every_study_and_flags_view_mismatches():
    raw = json.loads(REAL.read_text())
    df = load_iu_xray(REAL)
    _aligned(df)
    assert len(df) == len(raw) == 50 and df.source_id.tolist() == list(raw)
    n_views = [len(e["frontal_lateral"]) for e in raw.values()]
    n_images = [len(e["image_path"]) for e in raw.values()]
    expected = ["ok" if v == i else "fewer_views" if v < i else "more_views" for v, i in zip(n_views, n_images)]
    assert df.view_status.tolist() == expected
    assert df.load_flags.map(lambda f: "view_mismatch" in f).tolist() == [s != "ok" for s in expected]
    assert (df.view_status == "fewer_views").sum() == 11 and (df.view_status == "more_views").sum() == 11
    for row in df.itertuples():
        assert row.frontal_lateral == raw[row.source_id]["frontal_lateral"]
        if row.view_status == "ok": assert row.image_views == [normalize_view(v) for v in row.frontal_lateral]
        if row.view_status == "fewer_views": assert row.image_views == [None] * len(row.image_paths)
        given = {normalize_view(v) for v in row.frontal_lateral}
        assert all(v is None or v in given for v in row.image_views)
    rep = load_report(df)
    assert rep.headline() == ("50 studies loaded; 22 flagged: 11 with fewer views than images, 11 with more views "
                              "than images")
    assert rep.to_frame().flag.tolist() == ["view_mismatch"] and rep.to_frame().n_studies.tolist() == [22]


def test_real_iu_more_views_rule_by_example():
    df = load_iu_xray(REAL).set_index("study_id")
    assert df.loc["CXR3058", "image_views"] == ["FRONTAL", None]      # Frontal, Frontal, Lateral
    assert df.loc["CXR2930", "image_views"] == [None, "LATERAL"]      # Frontal, Lateral, Lateral
    assert df.loc["CXR2398", "image_views"] == [None, None]           # Frontal, Lateral, Frontal
    assert df.loc["CXR3058", "view"] == "FRONTAL" and df.loc["CXR2930", "view"] is None


# ---------------------------------------------------------------- messy made-up files
def test_messy_rexrank_bom_lists_masks_repeats():
    df = load_iu_xray(MESSY / "rexrank_messy.json")            # starts with a UTF-8 BOM
    _aligned(df)
    got = df.set_index("study_id")
    # the repeat kept once
    assert df.study_id.tolist() == ["CXR9001", "CXR9002", "CXR9003", "CXR9004", "CXR9005", "CXR9006"]
    assert got.loc["CXR9001", "load_flags"] == ["duplicate_id"]
    assert got.loc["CXR9002", "view_status"] == "fewer_views" and got.loc["CXR9002", "image_views"] == [None, None]
    assert got.loc["CXR9003", "view_status"] == "more_views" and got.loc["CXR9003", "image_views"] == ["FRONTAL", None]
    # list literals as text
    assert got.loc["CXR9004", "image_paths"] == ["CXR9004_IM-9004/0.png", "CXR9004_IM-9004/1.png"]
    assert got.loc["CXR9004", "image_views"] == ["FRONTAL", "LATERAL"] and got.loc["CXR9004",
                                                                                   "load_flags"] == ["masked_findings"]
    assert got.loc["CXR9005", "image_paths"] == [] and got.loc["CXR9005",
                                                               "load_flags"] == ["no_images", "empty_impression",
                                                                                 "bad_list"]
    rep = load_report(df)
    assert rep.n_flagged == 6
    assert dict(zip(rep.summary().view_status, rep.summary().n_studies)) == {"ok": 2, "fewer_views": 1, "more_views": 2,
                                                                             "no_images": 1}


def test_messy_json_conflicts_and_broken_files_are_refused_with_names():
    with pytest.raises(InputError, match=r"rexrank_conflict\.json: key 'CXR9002_IM-9002' appears twice with different "
                                         r"content \(items 1 and 2"):
        load_iu_xray(MESSY / "rexrank_conflict.json")
    with pytest.raises(InputError, match=r"broken\.json: not valid JSON \(.*line 4, column 1\)"):
        load_rexrank(MESSY / "broken.json")


def test_messy_table_encoding_bom_lists_and_repeats():
    cols = {"study_id": "accession", "text": "report", "image_paths": "images", "image_views": "views"}
    with pytest.warns(UserWarning, match=r"studies_messy\.csv: 1 line\(s\) are not utf-8-sig text \(first: line 4\)"):
        df = load_table(MESSY / "studies_messy.csv", columns=cols, dataset="inhouse")
    _aligned(df)
    got = df.set_index("study_id")
    assert df.study_id.tolist() == ["A1", "A2", "A3", "A4"]            # the BOM is not in the first column's name
    assert got.loc["A1", "load_flags"] == ["duplicate_id"] and got.loc["A1", "image_views"] == ["PA", "LATERAL"]
    assert got.loc["A2", "text"] == "Mild cardiomegaly \u2013 stable."     # the cp1252 dash
    assert got.loc["A2", "load_flags"] == ["view_mismatch", "encoding_repaired"]
    assert got.loc["A3", "load_flags"] == ["no_images", "bad_list"]
    assert got.loc["A4", "load_flags"] == ["empty_report"]
    with pytest.raises(InputError, match=r"studies_conflict\.csv: rows 0 and 2 \(study_id='B1'\): the same study given "
                                         r"twice with different text"):
        load_table(MESSY / "studies_conflict.csv", columns={"study_id": "accession", "text": "report"}, dataset="x")


def test_messy_iu_csv_pair_r2gen_chexpert_rexgradient():
    with pytest.warns(UserWarning, match="indiana_reports.csv: 1 line"):
        iu = load_iu_xray(MESSY / "indiana_csv").set_index("study_id")
    assert iu.loc["CXR2", "findings"] == "Heart size normal. Caf\u00e9 au lait spot noted on skin."
    assert iu.loc["CXR2", "image_paths"] == ["2_IM-0652-1001.dcm.png"]       # the repeated projection row kept once
    assert iu.loc["CXR2", "load_flags"] == ["masked_impression", "duplicate_id", "encoding_repaired"]
    assert iu.loc["CXR3", "load_flags"] == ["no_images", "empty_findings"] and iu.loc["CXR1", "load_flags"] == []
    r2 = load_iu_xray(MESSY / "r2gen_annotation.json").set_index("study_id")
    assert r2.loc["CXR9102", "load_flags"] == ["no_images", "bad_list"]
    assert r2.loc["CXR9103", "load_flags"] == ["no_images", "empty_report"]
    # no impression in R2Gen: not flagged
    assert r2.loc["CXR9101", "view_status"] == "no_views" and r2.loc["CXR9101", "load_flags"] == []
    cx = load_chexpert_plus(MESSY / "chexpert_plus_messy.csv").set_index("study_id")
    assert cx.loc["patient90001_study1", "image_paths"] == ["train/patient90001/study1/view1_frontal.jpg"]
    assert cx.loc["patient90001_study1", "load_flags"] == ["empty_findings", "duplicate_id"]
    assert cx.loc["patient90002_study1", "load_flags"] == ["empty_findings", "masked_impression"]
    rg = load_rexgradient(MESSY / "test_metadata.json", restricted=False)
    assert rg.study_id.tolist() == ["GRDN9_A", "GRDN9_B"] and rg.load_flags.tolist() == [["duplicate_id"],
                                                                                         ["view_mismatch"]]
    assert rg.view_status.tolist() == ["ok", "fewer_views"]


def test_load_report_needs_the_loader_columns():
    with pytest.raises(InputError, match=r"load_report: missing column\(s\) 'view_status', 'load_flags'"):
        load_report(pd.DataFrame({"study_id": ["a"]}))
