"""Integration tests of the blinded review kit: the round trip on files (prepare -> simulated filling -> read ->
agreement -> consensus -> summary), blinding, byte-for-byte reproducible packets, formula neutralisation in CSV and
XLSX, every validation error of the returned sheets, the one-call entry points, and cross-checks of the agreement
numbers."""
import csv
import json
import re
import zipfile

import numpy as np
import openpyxl
import pandas as pd
import pytest

from cxr_audit.core import InputError
from cxr_audit.sheets import FORMULA_PREFIXES, write_sheets
from cxr_audit.review import (SIMULATED_COMMENT, ReviewAnalysis, agreement_report, apply_consensus, consensus_queue,
                              load_codebook, make_review_packets, prepare_review, rating_problems, read_ratings,
                              review_analysis, review_summary, sample_cases, simulate_decisions, simulate_ratings,
                              simulate_review, split_reviewers, targeted_panel)
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
    from cxr_audit.review import report_ids
    n = len(packets.key)
    # with the seed alone, an observer regenerates neither the IDs nor the orders
    g = rng(2026)
    assert set(report_ids(n, g)).isdisjoint(packets.key.report_id)
    guess = [packets.key.report_id.tolist()[i] for i in g.permutation(n)]
    assert guess != packets.sheets["R1_phase1"].report_id.tolist()
    # the private content (here: system names) enters the generator: renaming changes every ID
    renamed = demo.generations.assign(system=demo.generations.system.str.replace("sim-", "xx-"))
    again = make_review_packets(cases, renamed, demo.studies, seed=2026,
                                configs=[c.replace("sim-", "xx-") for c in CONFIGS])
    assert set(again.key.report_id).isdisjoint(packets.key.report_id)
    # position in a sheet says nothing systematic about the configuration: each config is spread over the sheet
    pos = packets.sheets["R1_phase1"].reset_index().merge(packets.key, on="report_id").groupby("system")["index"].mean()
    assert pos.between(0.2 * n, 0.8 * n).all()
    orders = {n: s.report_id.tolist() for n, s in packets.sheets.items()}
    assert len({tuple(o) for o in orders.values()}) == 4              # every reviewer and phase: its own order
    assert all(sorted(o) == sorted(packets.key.report_id) for o in orders.values())
    # phase 1 hides the reference; phase 2 shows it
    assert ("reference_report" not in packets.sheets["R2_phase1"]
            and packets.sheets["R2_phase2"].reference_report.str.len().gt(0).all())


def test_same_seed_same_bytes_other_seed_other_packets(tmp_path, demo, cases):
    runs = [make_review_packets(cases, demo.generations, demo.studies, seed=s, configs=CONFIGS, out_dir=tmp_path / d)
            for s, d in ((2026, "a"), (2026, "b"), (7, "c"))]
    sheets = [k for k in runs[0].paths if not k.startswith("key/")]
    assert any(k.endswith(".xlsx") for k in sheets) and any(k.endswith(".csv") for k in sheets)
    for k in sheets: assert runs[0].paths[k].read_bytes() == runs[1].paths[k].read_bytes(), k
    assert runs[0].paths["key/review_key.csv"].read_bytes() == runs[1].paths["key/review_key.csv"].read_bytes()
    sheet = "phase1/R1/R1_phase1.csv"
    assert runs[0].paths[sheet].read_bytes() != runs[2].paths[sheet].read_bytes()
    assert set(runs[0].key.report_id).isdisjoint(runs[2].key.report_id)
    with pytest.raises(InputError, match="already holds a different review key"):
        make_review_packets(cases, demo.generations, demo.studies, seed=7, configs=CONFIGS, out_dir=tmp_path / "a")


# --- formula neutralisation -----------------------------------------------------------------------------------------

def test_formula_looking_text_is_neutralised_in_csv_and_xlsx(tmp_path, demo, cases):
    hostile = [p + "cmd|' /C calc'!A0" for p in FORMULA_PREFIXES]
    safe = {("'" + h).replace("\r", "\n") for h in hostile}     # quoted; a carriage return is written as a line feed
    gen = demo.generations.copy()
    gen["hypothesis"] = [hostile[i % len(hostile)] for i in range(len(gen))]
    # no sections: the full text is the reference
    studies = demo.studies.assign(findings="", impression="", text="=1+1",
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
                                      "1 report(s) of the key are not rated, first "
                                      f"{filled['R2_phase1'].report_id.iloc[0]!r}"]
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
    table = pd.crosstab(a.informativeness.to_numpy(),
                        b.informativeness.to_numpy()).reindex(index=range(4), columns=range(4), fill_value=0)
    qk = rep.query("phase == 1 and endpoint == 'informativeness' and metric == 'quadratic_kappa'").estimate.iloc[0]
    assert np.isclose(qk, smir.cohens_kappa(table.to_numpy(), wt="quadratic").kappa)
    pg = pytest.importorskip("pingouin")
    long = pd.DataFrame({"target": np.tile(np.arange(len(a)), 2), "rater": np.repeat(["a", "b"], len(a)),
                         "score": np.concatenate([a.fn.to_numpy(dtype=float), b.fn.to_numpy(dtype=float)])})
    icc = pg.intraclass_corr(long, targets="target", raters="rater",
                             ratings="score").set_index("Type").loc["ICC(A,1)", "ICC"]
    ours = rep.query("phase == 1 and endpoint == 'fn' and metric == 'icc2_1'").estimate.iloc[0]
    assert np.isclose(ours, icc)


# --- the one-call entry points --------------------------------------------------------------------------------------

def test_prepare_then_analyse_on_files(tmp_path, demo):
    P = prepare_review(demo.studies, demo.generations, 2, strata="dataset", reviewers=("A", "B"),
                       out_dir=tmp_path / "rev")
    assert P.key.study_id.nunique() == 4 and len(P.key) == 4 * 5 and P.reviewers == ("A", "B")
    simulate_ratings(P, demo.generations, out_dir=tmp_path / "rev/simulated")
    key = tmp_path / "rev/key/review_key.csv"
    first = review_analysis(tmp_path / "rev/simulated", key, rules={"count_gap": 2}, reps=100)
    assert isinstance(first, ReviewAnalysis) and first.consensus is None and first.rules["count_gap"] == 2
    files = first.save(tmp_path / "out1")
    assert files["consensus_queue_xlsx"].is_file()
    q = pd.read_csv(files["consensus_queue"], encoding="utf-8-sig")
    assert not ((q.kind == "count") & ((q.r1 - q.r2).abs() < 2)).any()
    second = review_analysis(tmp_path / "rev/simulated", key, simulate_decisions(q, seed=3), rules={"count_gap": 2},
                             reps=100, panel=None)
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
    pd.testing.assert_frame_equal(a.results.table(1),
                                  review_summary(apply_consensus(r1, r2, decided), packets.key).table(1))
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


# --- ReRef validation kit (paper 000, Figure 3 kind) ----------------------------------------------------------------

from cxr_audit.reref import rewrite_table  # noqa: E402
from cxr_audit.reref_rules import RuleRewriter, RuleVerifier  # noqa: E402
from cxr_audit.reref_validation import (REREF_SIMULATED_COMMENT, RerefValidation, load_reref_codebook,  # noqa: E402
                                        prepare_reref_validation, read_reref_validation, simulate_reref_ratings)

RULES = "rules (RuleRewriter + RuleVerifier)"


@pytest.fixture(scope="module")
def reref_refs(demo):
    return rewrite_table(demo.studies.head(40), "experiment", RuleRewriter(), RuleVerifier())


@pytest.fixture(scope="module")
def reref_packets(demo, reref_refs):
    return prepare_reref_validation(demo.studies, reref_refs, n_cases=3, seed=2026, rewriter=RULES)


def _xlsx_text(path) -> bytes:
    z = zipfile.ZipFile(path)
    return b"".join(z.read(n) for n in z.namelist())


def test_reref_sheets_do_not_reveal_the_original_and_the_key_does(tmp_path, demo, reref_refs):
    P = prepare_reref_validation(demo.studies, reref_refs, n_cases=3, seed=2026, out_dir=tmp_path, rewriter=RULES)
    assert all(re.fullmatch(r"RR-[A-HJ-NP-Z2-9]{8}", r) for r in P.key.report_id)
    secrets = [s.encode() for s in set(P.key.study_id) | set(P.key.variant) | {RULES}]
    sheet_files = [p for rel, p in P.paths.items() if rel.startswith("sheets/") and p.suffix in (".csv", ".xlsx")]
    assert len(sheet_files) == 2 * 3  # per reviewer: the sheet and the codebook as CSV, one workbook
    for path in sheet_files:
        data = _xlsx_text(path) if path.suffix == ".xlsx" else path.read_bytes()
        assert not any(s in data for s in secrets), path
    for name, sheet in P.sheets.items():
        assert not {"study_id", "variant", "stratum", "original", "rewriter", "original_report",
                    "rewritten_report"} & set(sheet.columns)
    # the key, and only the key, says where the original is; it matches the texts the reviewers see
    with open(tmp_path / "key" / "reref_key.csv", newline="", encoding="utf-8-sig") as f:
        key = {r["report_id"]: r for r in csv.DictReader(f)}
    with open(tmp_path / "sheets" / "R2" / "R2_reref.csv", newline="", encoding="utf-8-sig") as f:
        rows = list(csv.DictReader(f))
    assert {r["report_id"] for r in rows} == set(key)
    for r in rows:
        k = key[r["report_id"]]
        assert r["report_" + k["original"].lower()] == k["original_report"]
        assert r["report_" + ("b" if k["original"] == "A" else "a")] == k["rewritten_report"]
    # a reviewer who always answers "A" names the original in half the pairs of every stratum (within one)
    a_share = P.key.groupby("stratum").original.agg(lambda s: (s == "A").sum() - len(s) / 2)
    assert a_share.abs().le(0.5).all()
    # no study appears twice, so no original text repeats on a sheet
    assert not P.key.study_id.duplicated().any()
    texts = pd.concat([P.sheets["R1_reref"].report_a, P.sheets["R1_reref"].report_b])
    assert not texts.duplicated().any()


def test_reref_packets_are_byte_identical_per_seed_and_differ_across_seeds(tmp_path, demo, reref_refs):
    runs = [prepare_reref_validation(demo.studies, reref_refs, 3, seed=s, out_dir=tmp_path / d, rewriter=RULES)
            for s, d in ((2026, "a"), (2026, "b"), (7, "c"))]
    files = [k for k in runs[0].paths if k != "key/manifest.json"]
    assert "key/reref_key.xlsx" in files and "sheets/R1/R1_reref.xlsx" in files
    for k in files: assert runs[0].paths[k].read_bytes() == runs[1].paths[k].read_bytes(), k
    assert set(runs[0].key.report_id).isdisjoint(runs[2].key.report_id)
    assert runs[0].sheets["R1_reref"].report_a.tolist() != runs[2].sheets["R1_reref"].report_a.tolist()
    # the public seed alone regenerates neither the IDs nor the A/B order
    from cxr_audit.core import rng
    from cxr_audit.review import report_ids
    assert set(report_ids(len(runs[0].key), rng(2026), "RR-")).isdisjoint(runs[0].key.report_id)
    # the order of the input rows does not matter
    shuffled = prepare_reref_validation(demo.studies.iloc[::-1], reref_refs.references.iloc[::-1], 3, seed=2026,
                                        rewriter=RULES)
    pd.testing.assert_frame_equal(shuffled.key, runs[0].key)
    with pytest.raises(InputError, match="already holds a different ReRef validation key"):
        prepare_reref_validation(demo.studies, reref_refs, 3, seed=7, out_dir=tmp_path / "a")


def test_reref_key_sheet_is_formula_neutralised(tmp_path, demo, reref_refs):
    hostile = [p + "cmd|' /C calc'!A0" for p in FORMULA_PREFIXES]
    studies = demo.studies.assign(study_id=[hostile[i % len(hostile)] + s for i, s in enumerate(demo.studies.study_id)])
    ids = dict(zip(demo.studies.study_id, studies.study_id))
    refs = reref_refs.references.assign(study_id=reref_refs.references.study_id.map(ids))
    P = prepare_reref_validation(studies, refs, 2, seed=1, out_dir=tmp_path, rewriter="=HYPERLINK(\"http://evil\")")
    with open(tmp_path / "key" / "reref_key.csv", newline="", encoding="utf-8-sig") as f:
        rows = list(csv.DictReader(f))
    assert rows and all(r["study_id"].startswith("'") and r["rewriter"].startswith("'=") for r in rows)
    ws = openpyxl.load_workbook(tmp_path / "key" / "reref_key.xlsx")["reref_key"]
    cells = [c for row in ws.iter_rows() for c in row if c.value is not None]
    assert not any(c.data_type == "f" for c in cells)
    assert not any(isinstance(c.value, str) and c.value.startswith(FORMULA_PREFIXES) for c in cells)
    # the key still reads back, and the analysis names the (neutralised) rewriter
    res = read_reref_validation(simulate_reref_ratings(P, seed=3), tmp_path / "key" / "reref_key.xlsx", reps=50)
    assert res.rewriter == "'=HYPERLINK(\"http://evil\")" and len(res.key) == len(P.key)


def test_both_kits_write_through_one_packet_writer(tmp_path, demo, cases, reref_refs, monkeypatch):
    import cxr_audit.review as review
    import cxr_audit.reref_validation as reref_validation
    write_packets = review.write_packets
    assert reref_validation.write_packets is write_packets
    calls = []

    def spy(packets, out_dir, places, *args, **kwargs):
        calls.append((packets, places, args, kwargs))
        return write_packets(packets, out_dir, places, *args, **kwargs)

    monkeypatch.setattr(review, "write_packets", spy)
    monkeypatch.setattr(reref_validation, "write_packets", spy)
    rp = make_review_packets(cases, demo.generations, demo.studies, seed=2026, configs=CONFIGS, out_dir=tmp_path / "r")
    vp = prepare_reref_validation(demo.studies, reref_refs, 3, seed=2026, out_dir=tmp_path / "v", rewriter=RULES)
    assert [(type(c[0]).__name__, list(c[1])) for c in calls] == [("ReviewPackets", list(rp.sheets)),
                                                                  ("RerefPackets", list(vp.sheets))]
    for P, folder, (unwritten, places, args, kwargs) in zip((rp, vp), (tmp_path / "r", tmp_path / "v"), calls):
        assert isinstance(P, review.Packets) and unwritten.paths == {}
        assert {str(f.relative_to(folder)) for f in folder.rglob("*") if f.is_file()} == set(P.paths)
        manifest = json.loads(P.paths["key/manifest.json"].read_text("utf-8"))
        assert set(manifest["outputs"]) == set(P.paths) - {"key/manifest.json"}
        for name in P.sheets:  # each sheet in its folder, with the codebook and a README saying how to return it
            sheet = next(f for k, f in P.paths.items() if k.endswith(f"/{name}.csv"))
            readme = (sheet.parent / "README.txt").read_text("utf-8").splitlines()
            assert readme[1] == f"Fill the rating columns of {name}.xlsx (or {name}.csv) and return that one file."
            assert (sheet.parent / "codebook.csv").is_file()
        # the writer called by hand with the kit's arguments writes the kit's files, byte for byte
        again = write_packets(unwritten, tmp_path / "again" / folder.name, places, *args, **kwargs)
        assert set(again.paths) == set(P.paths)
        for k in set(P.paths) - {"key/manifest.json"}: assert again.paths[k].read_bytes() == P.paths[k].read_bytes(), k
        key = P.to_frame()
        key.iloc[0, 0] = "changed"
        assert P.key.iloc[0, 0] != "changed"  # to_frame returns a copy
    # the shared writer refuses a different key, in each kit's words
    with pytest.raises(InputError, match="already holds a different review key; write new packets"):
        make_review_packets(cases, demo.generations, demo.studies, seed=7, configs=CONFIGS, out_dir=tmp_path / "r")
    with pytest.raises(InputError, match="already holds a different ReRef validation key; write new sheets"):
        prepare_reref_validation(demo.studies, reref_refs, 3, seed=7, out_dir=tmp_path / "v")
    assert len(calls) == 4

def _hand_sheets():
    "Three reviewers, five pairs; the original is A in P1, P3, P5 and B in P2, P4."
    key = pd.DataFrame({"report_id": [f"P{i}" for i in range(1, 6)], "study_id": [f"s{i}" for i in range(1, 6)],
                        "variant": ["v1", "v1", "v1", "v2", "v2"], "original": ["A", "B", "A", "B", "A"]})
    def sheet(who, guess, ra, rb, eq):
        return pd.DataFrame({"reviewer": who, "phase": 1, "report_id": key.report_id, "report_a": "x", "report_b": "y",
                             "original_guess": guess, "realism_a": ra, "realism_b": rb, "equivalence": eq,
                             "comment": ""})
    sheets = {"X_reref": sheet("X", [1, 2, 2, 0, 1], [3, 3, 3, 2, 3], [3, 2, 3, 3, 1], [3, 3, 2, 3, 1]),
              "Y_reref": sheet("Y", [1, 1, 0, 2, 0], [3, 3, 3, 3, 3], [2, 3, 3, 3, 3], [3, 2, 2, 3, 2]),
              "Z_reref": sheet("Z", [0, 2, 1, 1, 1], [2, 3, 3, 3, 3], [3, 3, 3, 3, 3], [3, 3, 1, 2, 1])}
    return key, sheets


def test_reref_statistics_by_hand():
    from scipy.stats import binomtest
    from statsmodels.stats.inter_rater import aggregate_raters, fleiss_kappa
    key, sheets = _hand_sheets()
    res = read_reref_validation(sheets, key, reps=300, seed=1)
    assert isinstance(res, RerefValidation) and not res.simulated and res.rewriter == "not stated"
    s = res.proportions.set_index(["variant", "reviewer", "metric"])
    # X: A,B,B,?,A vs originals A,B,A,B,A -> identified P1 P2 P5, missed P3: 3/4, cannot tell 1/5
    # Y: A,A,?,B,? -> P1 identified, P2 missed, P4 identified: 2/3; cannot tell 2/5
    # Z: ?,B,A,A,A -> P2 P3 P5 identified, P4 missed: 3/4; cannot tell 1/5
    assert s.loc[("all", "X", "identified"), ["k", "n"]].tolist() == [3, 4]
    assert s.loc[("all", "Y", "identified"), ["k", "n"]].tolist() == [2, 3]
    assert s.loc[("all", "Z", "identified"), ["k", "n"]].tolist() == [3, 4]
    assert s.loc[("all", "pooled", "identified"), ["k", "n"]].tolist() == [8, 11]
    assert s.loc[("all", "pooled", "cannot_tell"), ["k", "n"]].tolist() == [4, 15]
    assert s.loc[("v2", "Y", "identified"), ["k", "n"]].tolist() == [1, 1]
    ci = binomtest(3, 4).proportion_ci(0.95, method="exact")
    assert np.allclose(s.loc[("all", "X", "identified"), ["ci_low", "ci_high"]].to_numpy(float), [ci.low, ci.high])
    # realism (original, rewrite): X (3,3) (2,3) (3,3) (3,2) (3,1): differences 0 +1 0 -1 -2 -> 3 of 5 not less
    # realistic, mean -0.4
    assert s.loc[("all", "X", "not_less_realistic"), ["k", "n"]].tolist() == [3, 5]
    assert np.isclose(s.loc[("all", "X", "realism_difference"), "estimate"], -0.4)
    # Y (3,2) (2,3)... originals: P1 A=3 rew B=2 -> -1; P2 orig B=3 rew A=3 -> 0; then 0, 0, 0 -> 4 of 5
    assert s.loc[("all", "Y", "not_less_realistic"), ["k", "n"]].tolist() == [4, 5]
    # equivalence: 3 is equivalent, 1 major discrepancy
    assert s.loc[("all", "pooled", "equivalent"), ["k", "n"]].tolist() == [7, 15]
    assert s.loc[("all", "pooled", "major_discrepancy"), ["k", "n"]].tolist() == [3, 15]
    assert s.loc[("v1", "Z", "major_discrepancy"), ["k", "n"]].tolist() == [1, 3]
    # agreement: Cohen's kappa of X and Y on the guess outcome, by hand; Fleiss' kappa against statsmodels
    a = res.agreement.set_index(["endpoint", "raters", "metric"]).estimate
    x = ["identified", "identified", "missed", "cannot tell", "identified"]
    y = ["identified", "missed", "cannot tell", "identified", "cannot tell"]
    po = np.mean([u == v for u, v in zip(x, y)])
    pe = sum(x.count(c) * y.count(c) for c in set(x) | set(y)) / 25
    assert np.isclose(a[("outcome", "X vs Y", "percent_agreement")], po)
    assert np.isclose(a[("outcome", "X vs Y", "cohen_kappa")], (po - pe) / (1 - pe))
    eq = np.array([[3, 3, 3], [3, 2, 3], [2, 2, 1], [3, 3, 2], [1, 2, 1]])
    assert np.isclose(a[("equivalence", "all", "fleiss_kappa")], fleiss_kappa(aggregate_raters(eq)[0]))
    W = res.ratings.pivot(index="report_id", columns="reviewer", values="outcome").to_numpy()
    assert np.isclose(a[("outcome", "all", "fleiss_kappa")], fleiss_kappa(aggregate_raters(W)[0]))
    # patterns: equivalence P1 unanimous, the others two against one; the guess outcome splits three ways on P3 and P4
    pat = res.patterns().set_index(["endpoint", "pattern"])["count"]
    assert [pat[("equivalence", p)] for p in ("unanimous", "majority", "no majority")] == [1, 4, 0]
    assert [pat[("outcome", p)] for p in ("unanimous", "majority", "no majority")] == [0, 3, 2]
    assert res.disagreements().query("endpoint == 'equivalence'").report_id.tolist() == ["P2", "P3", "P4", "P5"]


def test_reref_round_trip_on_files(tmp_path, demo, reref_refs):
    P = prepare_reref_validation(demo.studies, reref_refs, 3, seed=11, out_dir=tmp_path / "v", rewriter=RULES)
    back = simulate_reref_ratings(P, seed=4, out_dir=tmp_path / "back", formats=("csv", "xlsx"))
    assert all((s.comment == REREF_SIMULATED_COMMENT).all() for s in back.values())
    from_csv = read_reref_validation(sorted((tmp_path / "back").glob("*.csv")), tmp_path / "v/key/reref_key.csv",
                                     reps=200, seed=3)
    from_xlsx = read_reref_validation(sorted((tmp_path / "back").glob("*.xlsx")), tmp_path / "v/key/reref_key.xlsx",
                                      reps=200, seed=3)
    from_memory = read_reref_validation(back, P, reps=200, seed=3)
    pd.testing.assert_frame_equal(from_csv.proportions, from_xlsx.proportions)
    pd.testing.assert_frame_equal(from_csv.proportions, from_memory.proportions)
    pd.testing.assert_frame_equal(from_csv.agreement, from_memory.agreement)
    # the decoded outcome agrees with the sheets and the key, rating by rating
    sheet = back["R1_reref"].set_index("report_id")
    k = P.key.set_index("report_id")
    mine = from_csv.ratings[from_csv.ratings.reviewer == "R1"].set_index("report_id")
    for rid, r in mine.iterrows():
        g = int(sheet.loc[rid, "original_guess"])
        want = "cannot tell" if g == 0 else ("identified" if "AB"[g - 1] == k.loc[rid, "original"] else "missed")
        assert r.outcome == want, rid
    summ = from_csv.summary()
    assert summ.variant.tolist() == [*dict.fromkeys(P.key.variant), "all"] and summ.pairs.iloc[-1] == len(P.key)
    assert (summ.ratings.str.startswith("SIMULATED")).all() and (summ.rewriter == RULES).all()
    assert (from_csv.headline().startswith("**SIMULATED ratings")
            and "SIMULATED" in json.dumps(from_csv.plot().to_dict()))
    out = from_csv.save(tmp_path / "out")
    assert (pd.read_csv(out["summary"]).shape[0] == len(summ)
            and json.loads(out["manifest"].read_text())["params"]["simulated"])
    # same seed, same numbers; a rewrite that always gives itself away is always identified
    again = read_reref_validation(back, P, reps=200, seed=3)
    pd.testing.assert_frame_equal(again.summary(), from_memory.summary())
    sure = read_reref_validation(simulate_reref_ratings(P, tell=1.0, noise=0.0), P, reps=50)
    row = sure.proportions.query("variant == 'all' and reviewer == 'pooled' and metric == 'identified'").iloc[0]
    assert row.k == row.n == 2 * len(P.key)
    # a reviewer who always answers "A" is right about half the time (the A/B order is balanced)
    always_a = {n: s.assign(original_guess=1) for n, s in back.items()}
    half = read_reref_validation(always_a, P, reps=50).proportions.query("variant == 'all' and reviewer == 'R1' and "
                                                                         "metric == 'identified'").iloc[0]
    assert abs(half.k - half.n / 2) <= P.key.stratum.nunique() / 2


SPOILS = {  # how -> (column, letter, problem text)
    "guess out of range": ("original_guess", "F", "'3' is out of range; allowed: 0 = cannot tell"),
    "realism not a number": ("realism_b", "H", "'fine' is not a number"),
    "equivalence missing": ("equivalence", "I", "missing value (required)"),
}


@pytest.mark.parametrize("how", list(SPOILS))
@pytest.mark.parametrize("fmt", ["csv", "xlsx"])
def test_reref_bad_cell_is_named_by_file_row_and_column(tmp_path, reref_packets, how, fmt):
    sheets = simulate_reref_ratings(reref_packets, seed=2)
    bad = sheets["R2_reref"].astype(object)
    column, letter, text = SPOILS[how]
    bad.loc[4, column] = {"guess out of range": 3, "realism not a number": "fine", "equivalence missing": None}[how]
    write_sheets({"R2_reref": bad}, tmp_path, "R2_reref", [fmt])
    write_sheets({"R1_reref": sheets["R1_reref"]}, tmp_path, "R1_reref", [fmt])
    label = "R2_reref.csv" if fmt == "csv" else "R2_reref.xlsx[R2_reref]"
    with pytest.raises(InputError, match=re.escape(f"{label} row 6, column {column} ({letter}): {text}")):
        read_reref_validation(tmp_path, reref_packets.key, reps=50)
    # a pair missing from a sheet, and a key cell that is not A or B
    with pytest.raises(InputError, match=r"R1_reref row -, column report_id: 1 report\(s\) of the key are not rated"):
        read_reref_validation({"R1_reref": sheets["R1_reref"].iloc[1:], "R2_reref": sheets["R2_reref"]},
                              reref_packets.key)
    with pytest.raises(InputError, match="row 2, column original: 'a' is not A or B"):
        read_reref_validation(sheets,
                              reref_packets.key.assign(original=["a"] + reref_packets.key.original.tolist()[1:]))


def test_reref_codebook_and_simulation_are_checked(demo, reref_refs, reref_packets):
    cb = load_reref_codebook()
    assert cb.columns(1) == ["original_guess", "realism_a", "realism_b",
                             "equivalence"] and cb.get(1, "original_guess")["kind"] == "nominal"
    with pytest.raises(InputError, match="phase 1 only"):
        load_reref_codebook(load_codebook())
    # a variation the back end could not apply anywhere: named in the plan, never silently dropped; alone, an error
    refs = reref_refs.references.assign(feasible=lambda d: d.feasible & (d.variant != "negation:implicit"))
    with pytest.raises(InputError, match="nothing to validate"):
        prepare_reref_validation(demo.studies, refs, 3, variants="negation:implicit")
    plan = prepare_reref_validation(demo.studies, refs, 3, variants="negation").plan.set_index("variant")
    assert plan.loc["negation:implicit", "drawn"] == 0 and plan.loc["negation:implicit",
                                                                    "note"].startswith("not applicable with this "
                                                                                       "back end")
    assert plan.loc["negation:explicit", "drawn"] == 3 and plan.loc["negation:explicit", "note"] == ""
    # what wrote the rewrites: given, else the references' `backend` column, else said to be unknown
    named = reref_refs.references.assign(backend="llm:test-model")
    assert prepare_reref_validation(demo.studies, named, 2).rewriter == "llm:test-model"
    assert prepare_reref_validation(demo.studies, named, 2, rewriter="mine").key.rewriter.eq("mine").all()
    assert prepare_reref_validation(demo.studies, named.drop(columns="backend"), 2).rewriter == "not stated"
    sims = [simulate_reref_ratings(reref_packets, seed=s)["R1_reref"] for s in (1, 1, 2)]
    pd.testing.assert_frame_equal(sims[0], sims[1])
    assert not sims[0].equals(sims[2])


# --- end points looked up once (issue 23) -------------------------------------------------------------------------

def test_codebook_get_returns_a_fresh_copy_of_the_same_definition():
    from cxr_audit.review import load_codebook
    cb = load_codebook()
    phase, column = int(cb.endpoints.phase.iloc[0]), str(cb.endpoints.column.iloc[0])
    ref = cb.endpoints[(cb.endpoints.phase == phase) & (cb.endpoints.column == column)].iloc[0].to_dict()
    same = lambda d: pd.Series(d, dtype=object).equals(pd.Series(ref, dtype=object))   # NaN thresholds compare equal
    got = cb.get(phase, column); assert same(got)
    got["required"] = "changed"
    assert same(cb.get(phase, column)) and not same(got)                     # the caller's copy is its own
    with pytest.raises(KeyError, match="no end point"): cb.get(phase, "no_such_column")
