"""Integration tests of the blinded review kit: the round trip on files (prepare -> simulated filling -> read ->
agreement -> consensus -> summary), blinding, byte-for-byte reproducible packets, formula neutralisation in CSV and
XLSX, every validation error of the returned sheets, the one-call entry points, and cross-checks of the agreement numbers."""
import csv
import re
import zipfile

import numpy as np
import openpyxl
import pandas as pd
import pytest

from cxr_audit.core import InputError
from cxr_audit.review import (FORMULA_PREFIXES, SIMULATED_COMMENT, ReviewAnalysis, agreement_report, apply_consensus,
                              consensus_queue, load_codebook, make_review_packets, prepare_review, rating_problems, read_ratings,
                              review_analysis, review_summary, sample_cases, simulate_decisions, simulate_ratings, simulate_review,
                              split_reviewers, targeted_panel, write_sheets)
from cxr_audit.synth import make_demo_corpus

CONFIGS = ["sim-template+B4", "sim-template+K50", "sim-omit+B4"]


@pytest.fixture(scope="module")
def demo():
    return make_demo_corpus(30, seed=4)


@pytest.fixture(scope="module")
def cases(demo):
    ids = demo.studies[["study_id", "dataset"]]
    sample = sample_cases(ids, 4, seed=2026, strata="dataset")
    rest = sorted(set(ids.study_id) - set(sample.study_id))
    return pd.concat([sample, targeted_panel(ids, rest[:2], sample)], ignore_index=True)


@pytest.fixture(scope="module")
def packets(demo, cases):
    return make_review_packets(cases, demo.generations, demo.studies, seed=2026, configs=CONFIGS)


@pytest.fixture(scope="module")
def filled(packets, demo):
    return simulate_ratings(packets, demo.generations, seed=5)


# --- round trip -------------------------------------------------------------------------------------------------

def test_round_trip_on_files_csv_and_xlsx_agree(tmp_path, demo, cases):
    P = make_review_packets(cases, demo.generations, demo.studies, seed=2026, configs=CONFIGS, out_dir=tmp_path / "rev")
    sims = simulate_ratings(P, demo.generations, seed=5, out_dir=tmp_path / "back", formats=("csv", "xlsx"))
    assert all((s.comment == SIMULATED_COMMENT).all() for s in sims.values())
    key = tmp_path / "rev" / "key" / "review_key.csv"
    from_csv = read_ratings(sorted((tmp_path / "back").glob("*.csv")), key=key)
    from_xlsx = read_ratings(sorted((tmp_path / "back").glob("*.xlsx")), key=key)
    cols = [c for c in from_csv.columns if c not in ("sheet", "row")]
    pd.testing.assert_frame_equal(from_csv[cols], from_xlsx[cols])
    assert len(from_csv) == 2 * 2 * len(P.key) and from_xlsx.sheet.iloc[0].endswith(".xlsx[R1_phase1]")

    r1, r2 = split_reviewers(from_xlsx)
    agree = agreement_report(r1, r2, reps=200, seed=1)
    primary = agree[(agree.phase == 1) & (agree.role == "primary")]
    assert set(primary.metric) == {"percent_agreement", "cohen_kappa", "gwet_ac1", "exact_agreement", "within_one",
                                    "quadratic_kappa", "icc2_1", "mean_abs_diff"}
    assert primary.n.eq(len(P.key)).all()

    queue = consensus_queue(r1, r2)
    write_sheets({"queue": simulate_decisions(queue, seed=2)}, tmp_path / "q", "queue", ["xlsx"])
    res = apply_consensus(r1, r2, tmp_path / "q" / "queue.xlsx")
    s = res.summary().iloc[0]
    assert s["items"] == len(P.key) and s.triggered == queue.report_id.nunique() and s.unresolved_primary == 0
    summ = review_summary(res, key)
    # only the random panel: 4 cases per stratum, 3 configurations
    om = summ.proportions.query("phase == 1 and endpoint == 'major_omission'")
    assert len(om) == 2 * 3 and om.n.eq(4).all()
    assert ((om.ci_low <= om.estimate) & (om.estimate <= om.ci_high)).all()
    f = summ.findings.query("phase == 1")
    assert np.allclose(f.micro_precision, f.tp / (f.tp + f.fp), equal_nan=True)
    assert summ.table(1).shape[0] == 6


# --- blinding -----------------------------------------------------------------------------------------------------

def test_sheets_and_files_reveal_no_configuration(tmp_path, demo, cases):
    P = make_review_packets(cases, demo.generations, demo.studies, seed=2026, configs=CONFIGS, out_dir=tmp_path)
    secrets = set(P.key.system) | set(P.key.sample_id)
    assert all(re.fullmatch(r"RV-[A-HJ-NP-Z2-9]{8}", r) for r in P.key.report_id)
    for name, sheet in P.sheets.items():
        assert not {"system", "policy", "sample_id", "study_id", "panel", "stratum"} & set(sheet.columns), name
    for rel, path in P.paths.items():
        if rel.startswith("key/"): continue
        data = path.read_bytes()
        if path.suffix == ".xlsx":
            data = b"".join(zipfile.ZipFile(path).read(n) for n in zipfile.ZipFile(path).namelist())
        assert not any(s.encode() in data for s in secrets), rel
    assert (tmp_path / "key" / "review_key.csv").is_file()
    assert not list((tmp_path / "phase1").rglob("*key*"))


def test_the_public_seed_alone_does_not_recover_ids_or_orders(demo, cases, packets):
    from cxr_audit.core import rng
    from cxr_audit.review import _tokens
    n = len(packets.key)
    # with the seed alone, an observer regenerates neither the IDs nor the orders
    g = rng(2026)
    assert set(_tokens(n, g)).isdisjoint(packets.key.report_id)
    guess = [packets.key.report_id.tolist()[i] for i in g.permutation(n)]
    assert guess != packets.sheets["R1_phase1"].report_id.tolist()
    # the private content (here: system names) enters the generator: renaming changes every ID
    renamed = demo.generations.assign(system=demo.generations.system.str.replace("sim-", "xx-"))
    again = make_review_packets(cases, renamed, demo.studies, seed=2026, configs=[c.replace("sim-", "xx-") for c in CONFIGS])
    assert set(again.key.report_id).isdisjoint(packets.key.report_id)
    # position in a sheet says nothing systematic about the configuration: each config is spread over the sheet
    pos = packets.sheets["R1_phase1"].reset_index().merge(packets.key, on="report_id").groupby("system")["index"].mean()
    assert pos.between(0.2 * n, 0.8 * n).all()
    orders = {n: s.report_id.tolist() for n, s in packets.sheets.items()}
    assert len({tuple(o) for o in orders.values()}) == 4              # every reviewer and phase: its own order
    assert all(sorted(o) == sorted(packets.key.report_id) for o in orders.values())
    # phase 1 hides the reference; phase 2 shows it
    assert "reference_report" not in packets.sheets["R2_phase1"] and packets.sheets["R2_phase2"].reference_report.str.len().gt(0).all()


def test_same_seed_same_bytes_other_seed_other_packets(tmp_path, demo, cases):
    runs = [make_review_packets(cases, demo.generations, demo.studies, seed=s, configs=CONFIGS, out_dir=tmp_path / d)
            for s, d in ((2026, "a"), (2026, "b"), (7, "c"))]
    sheets = [k for k in runs[0].paths if not k.startswith("key/")]
    assert any(k.endswith(".xlsx") for k in sheets) and any(k.endswith(".csv") for k in sheets)
    for k in sheets: assert runs[0].paths[k].read_bytes() == runs[1].paths[k].read_bytes(), k
    assert runs[0].paths["key/review_key.csv"].read_bytes() == runs[1].paths["key/review_key.csv"].read_bytes()
    assert runs[0].paths["phase1/R1/R1_phase1.csv"].read_bytes() != runs[2].paths["phase1/R1/R1_phase1.csv"].read_bytes()
    assert set(runs[0].key.report_id).isdisjoint(runs[2].key.report_id)
    with pytest.raises(InputError, match="already holds a different review key"):
        make_review_packets(cases, demo.generations, demo.studies, seed=7, configs=CONFIGS, out_dir=tmp_path / "a")


# --- formula neutralisation -----------------------------------------------------------------------------------------

def test_formula_looking_text_is_neutralised_in_csv_and_xlsx(tmp_path, demo, cases):
    hostile = [p + "cmd|' /C calc'!A0" for p in FORMULA_PREFIXES]
    safe = {("'" + h).replace("\r", "\n") for h in hostile}     # quoted; a carriage return is written as a line feed
    gen = demo.generations.copy()
    gen["hypothesis"] = [hostile[i % len(hostile)] for i in range(len(gen))]
    studies = demo.studies.assign(findings="", impression="", text="=1+1",   # no sections: the full text is the reference
                                  image_paths=[["@evil.png"]] * len(demo.studies))
    P = make_review_packets(cases, gen, studies, seed=1, configs=CONFIGS, out_dir=tmp_path)
    with open(tmp_path / "phase2" / "R1" / "R1_phase2.csv", newline="", encoding="utf-8-sig") as f:
        rows = list(csv.DictReader(f))
    assert {r["generated_report"] for r in rows} == safe
    assert all(r["image_reference"] == "'@evil.png" and r["reference_report"] == "'=1+1" for r in rows)
    for path in (tmp_path / "phase1").rglob("*.xlsx"):
        for ws in openpyxl.load_workbook(path).worksheets:
            cells = [c for row in ws.iter_rows() for c in row if c.value is not None]
            assert not any(c.data_type == "f" for c in cells), path
            assert not any(isinstance(c.value, str) and c.value.startswith(FORMULA_PREFIXES) for c in cells), path
    ws = openpyxl.load_workbook(tmp_path / "phase1" / "R1" / "R1_phase1.xlsx")["R1_phase1"]
    header = [c.value for c in ws[1]]
    col = header.index("generated_report")
    assert {ws.cell(r, col + 1).value for r in range(2, ws.max_row + 1)} == safe
    assert len(P.key) == len(cases) * 3


# --- validation errors --------------------------------------------------------------------------------------------

def _spoil(sheet: pd.DataFrame, how: str) -> pd.DataFrame:
    s = sheet.copy().astype({"adequacy": object, "tp": object})
    if how == "out of range": s.loc[2, "adequacy"] = 4
    elif how == "not a number": s.loc[2, "adequacy"] = "good"
    elif how == "not whole": s.loc[2, "tp"] = "1.5"
    elif how == "count too large": s.loc[2, "tp"] = 99
    elif how == "missing value": s.loc[2, "adequacy"] = None
    elif how == "unknown ID": s.loc[2, "report_id"] = "RV-UNKNOWN1"
    elif how == "blank ID": s.loc[2, "report_id"] = ""
    elif how == "duplicate row": s = pd.concat([s, s.iloc[[2]]], ignore_index=True)
    elif how == "missing column": s = s.drop(columns="informativeness")
    elif how == "bad phase": s["phase"] = 5
    elif how == "reviewer changes": s.loc[2, "reviewer"] = "R7"
    return s


CASES = {  # how -> (row, column, problem text)
    "out of range": (4, "adequacy (I)", "'4' is out of range; allowed: 0 = wrong or unusable"),
    "not a number": (4, "adequacy (I)", "'good' is not a number"),
    "not whole": (4, "tp (K)", "'1.5' is not a whole number"),
    "count too large": (4, "tp (K)", "'99' is out of range; allowed: whole number from 0 to 30"),
    "missing value": (4, "adequacy (I)", "missing value (required)"),
    "unknown ID": (4, "report_id (C)", "unknown report ID 'RV-UNKNOWN1' (not in the key)"),
    "blank ID": (4, "report_id (C)", "missing value"),
    "duplicate row": (None, "report_id (C)", "duplicate row: "),
    "missing column": (1, "informativeness", "missing column (a phase-1 rating)"),
    "bad phase": (2, "phase (B)", "'5' is not a phase of the codebook ([1, 2])"),
    "reviewer changes": (4, "reviewer (A)", "'R7' differs from 'R1' above; one sheet holds one reviewer"),
}


@pytest.mark.parametrize("how", list(CASES))
@pytest.mark.parametrize("fmt", ["csv", "xlsx"])
def test_every_validation_error_names_sheet_row_and_column(tmp_path, filled, packets, how, fmt):
    write_sheets({"R1_phase1": _spoil(filled["R1_phase1"], how)}, tmp_path, "R1_phase1", [fmt])
    probs = rating_problems(tmp_path, key=packets.key)
    row, column, text = CASES[how]
    label = "R1_phase1.csv" if fmt == "csv" else "R1_phase1.xlsx[R1_phase1]"
    hit = probs[probs.problem.str.startswith(text)]
    assert len(hit) == 1, probs
    assert hit.sheet.iloc[0] == label and hit.column.iloc[0] == column
    if row is not None: assert hit.row.iloc[0] == row
    with pytest.raises(InputError, match=re.escape(f"{label} row")):
        read_ratings(tmp_path, key=packets.key)


def test_errors_across_sheets_and_against_the_key(tmp_path, filled, packets):
    short = filled["R2_phase1"].iloc[1:]
    probs = rating_problems({"a": filled["R1_phase1"], "b": filled["R1_phase1"], "c": short}, key=packets.key)
    assert probs.problem.tolist() == ["reviewer 'R1' phase 1 was already read from a",
                                      f"1 report(s) of the key are not rated, first {filled['R2_phase1'].report_id.iloc[0]!r}"]
    assert probs.sheet.tolist() == ["b", "c"]
    # the packets' own, unfilled sheets: every required cell is reported, the optional ones are not
    empty = rating_problems({"R1_phase1": packets.sheets["R1_phase1"]})
    n_required = int(load_codebook().endpoints.query("phase == 1").required.sum())
    assert len(empty) == n_required * len(packets.key) and set(empty.problem) == {"missing value (required)"}
    assert rating_problems(filled, key=packets.key).empty


# --- sampling -----------------------------------------------------------------------------------------------------

def test_sampling_refuses_outputs_and_is_seeded(demo):
    with pytest.raises(InputError, match="not ID or stratum columns"):
        sample_cases(demo.generations, 3, seed=1)
    scores = demo.studies[["study_id"]].assign(micro_f1=0.5)
    with pytest.raises(InputError, match="'micro_f1' are not ID or stratum columns"):
        sample_cases(scores, 3, seed=1)
    ids = demo.studies[["study_id", "patient_id", "dataset"]]
    a = sample_cases(ids, {"synthetic-site-a": 2, "synthetic-site-b": 5}, seed=2026, strata="dataset")
    b = sample_cases(ids.iloc[::-1], {"synthetic-site-a": 2, "synthetic-site-b": 5}, seed=2026, strata="dataset")
    pd.testing.assert_frame_equal(a, b)
    assert a.groupby("stratum").size().tolist() == [2, 5]
    with pytest.raises(InputError, match="must not overlap"):
        targeted_panel(ids, a.study_id[:1].tolist(), a)


# --- consensus rules ----------------------------------------------------------------------------------------------

def test_consensus_triggers_and_resolution(filled, packets):
    r1, r2 = split_reviewers(read_ratings(filled, key=packets.key))
    q = consensus_queue(r1, r2)
    paired = r1.merge(r2, on=["phase", "report_id"])
    for c in ("adequacy", "tp", "major_omission"):
        p1 = paired[paired.phase == 1]
        differ = set(p1.report_id[p1[f"{c}_x"] != p1[f"{c}_y"]])
        assert differ == set(q.report_id[(q.phase == 1) & (q.endpoint == c)]), c
    strict = consensus_queue(r1, r2, rules={"ordinal_gap": 2, "count_gap": 2, "ordinal_threshold": False})
    assert not len(strict[(strict.kind != "binary")].query("r1 - r2 in (-1, 1)"))
    d = simulate_decisions(q, seed=0, discuss=1.0)
    res = apply_consensus(r1, r2, d)
    assert set(res.trail.source[res.trail.trigger != ""]) == {"consensus"}
    assert res.summary().resolved_by_adjudication[0] == 0
    with pytest.raises(InputError, match="neither a consensus nor an adjudication"):
        apply_consensus(r1, r2, d.assign(consensus=pd.NA))


# --- agreement numbers against other implementations -------------------------------------------------------------

def test_agreement_matches_statsmodels_and_pingouin(filled, packets):
    smir = pytest.importorskip("statsmodels.stats.inter_rater")
    r1, r2 = split_reviewers(read_ratings(filled, key=packets.key))
    rep = agreement_report(r1, r2, reps=100)
    a, b = r1[r1.phase == 1], r2[r2.phase == 1]
    table = pd.crosstab(a.informativeness.to_numpy(), b.informativeness.to_numpy()).reindex(index=range(4), columns=range(4), fill_value=0)
    qk = rep.query("phase == 1 and endpoint == 'informativeness' and metric == 'quadratic_kappa'").estimate.iloc[0]
    assert np.isclose(qk, smir.cohens_kappa(table.to_numpy(), wt="quadratic").kappa)
    pg = pytest.importorskip("pingouin")
    long = pd.DataFrame({"target": np.tile(np.arange(len(a)), 2), "rater": np.repeat(["a", "b"], len(a)),
                         "score": np.concatenate([a.fn.to_numpy(dtype=float), b.fn.to_numpy(dtype=float)])})
    icc = pg.intraclass_corr(long, targets="target", raters="rater", ratings="score").set_index("Type").loc["ICC(A,1)", "ICC"]
    ours = rep.query("phase == 1 and endpoint == 'fn' and metric == 'icc2_1'").estimate.iloc[0]
    assert np.isclose(ours, icc)


# --- the one-call entry points --------------------------------------------------------------------------------------

def test_prepare_then_analyse_on_files(tmp_path, demo):
    P = prepare_review(demo.studies, demo.generations, 2, strata="dataset", reviewers=("A", "B"), out_dir=tmp_path / "rev")
    assert P.key.study_id.nunique() == 4 and len(P.key) == 4 * 5 and P.reviewers == ("A", "B")
    simulate_ratings(P, demo.generations, out_dir=tmp_path / "rev/simulated")
    key = tmp_path / "rev/key/review_key.csv"
    first = review_analysis(tmp_path / "rev/simulated", key, rules={"count_gap": 2}, reps=100)
    assert isinstance(first, ReviewAnalysis) and first.consensus is None and first.rules["count_gap"] == 2
    files = first.save(tmp_path / "out1")
    assert files["consensus_queue_xlsx"].is_file()
    q = pd.read_csv(files["consensus_queue"], encoding="utf-8-sig")
    assert not ((q.kind == "count") & ((q.r1 - q.r2).abs() < 2)).any()
    second = review_analysis(tmp_path / "rev/simulated", key, simulate_decisions(q, seed=3), rules={"count_gap": 2}, reps=100, panel=None)
    assert second.headline().startswith("4 cases, 20 reports, rated by A and B;")
    second.save(tmp_path / "out2")
    assert pd.read_csv(tmp_path / "out2/summary_table.csv").shape[0] == 2 * 5
    long = second.to_frame()
    assert set(long.part) == {"agreement", "summary"} and "metric" in long and "measure" not in long
    with pytest.raises(InputError, match="targeted case"):
        prepare_review(demo.studies, demo.generations, 2, strata="dataset", targeted=[P.key.study_id[0]])


def test_review_analysis_equals_its_steps(filled, packets):
    r1, r2 = split_reviewers(read_ratings(filled, key=packets.key))
    decided = simulate_decisions(consensus_queue(r1, r2), seed=2)
    a = review_analysis(filled, packets.key, decided, reps=150, seed=9)
    pd.testing.assert_frame_equal(a.agreement, agreement_report(r1, r2, reps=150, seed=9))
    pd.testing.assert_frame_equal(a.results.table(1), review_summary(apply_consensus(r1, r2, decided), packets.key).table(1))
    assert a.summary().equals(a.results.table(1))
    # a ratings table works as well as the sheets
    b = review_analysis(read_ratings(filled, key=packets.key), packets.key, decided, reps=150, seed=9)
    pd.testing.assert_frame_equal(a.to_frame(), b.to_frame())
    for kind in ("summary", "agreement"):
        assert "SIMULATED" not in a.headline() and type(a.plot(kind)).__module__.startswith("altair")


def test_simulated_review_is_labelled_and_seeded(demo):
    sim = simulate_review(demo.studies, demo.generations, reps=100, seed=2026)
    assert sim.simulated and sim.headline().startswith("**SIMULATED ratings")
    assert (sim.ratings.comment == SIMULATED_COMMENT).all()
    assert "micro_f1" in sim.summary()
    again = simulate_review(demo.studies, demo.generations, reps=100, seed=2026)
    pd.testing.assert_frame_equal(sim.summary(), again.summary())
    other = simulate_review(demo.studies, demo.generations, reps=100)          # DEFAULT_SEED: another sample
    assert set(other.key.study_id) != set(sim.key.study_id)
