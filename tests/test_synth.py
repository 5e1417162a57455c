"Integration tests of the synthetic demo corpus (`cxr_audit.synth`)."
import re

import pandas as pd
import pytest

from cxr_audit.core import sha256_frame, write_table
from cxr_audit.corpus import GENERATIONS_COLUMNS, STUDIES_COLUMNS, validate_studies
from cxr_audit.synth import (CHANGES, FINDINGS_COLUMNS, MAX_TOKENS, OBSERVATIONS, PATHOLOGIES, PROGRESSION_COLUMNS,
                             PROGRESSION_OF_CHANGE, RUNS, load_phrases, make_demo_corpus)

PHRASES = load_phrases()
# words a report uses for each change category (checked on the sentence that names the finding)
CHANGE_WORDS = {"new": r"\bnew|development|placement|placed|not present on the prior",
                "worsened": r"increas|worsen|grow|grown|enlarg|progress",
                "improved": r"decreas|improv|smaller|diminish",
                "no change": r"unchanged|stable|no change|again seen",
                "resolved": r"resol|no residual|no longer|removed|removal|normal"}


@pytest.fixture(scope="module")
def demo():
    return make_demo_corpus()


@pytest.fixture(scope="module", params=[1, 2, 3])
def other(request):
    return make_demo_corpus(n_patients=25, seed=request.param)


def test_same_seed_gives_identical_bytes(demo, tmp_path):
    again = make_demo_corpus(seed=0)
    for name, table in demo.tables().items():
        assert sha256_frame(table) == sha256_frame(again.tables()[name]), name
        a = write_table(table, tmp_path / f"a_{name}.parquet")
        b = write_table(again.tables()[name], tmp_path / f"b_{name}.parquet")
        assert a.read_bytes() == b.read_bytes(), name
    paths = demo.write(tmp_path / "w1")
    assert {k: p.read_bytes() for k, p in paths.items()} == {k: p.read_bytes() for k,
                                                             p in again.write(tmp_path / "w2").items()}


def test_other_seed_differs(demo):
    other = make_demo_corpus(seed=1)
    for name in ("studies", "findings", "generations"):
        assert sha256_frame(demo.tables()[name]) != sha256_frame(other.tables()[name])


def test_schemas(demo):
    s = validate_studies(demo.studies, "synthetic studies")
    assert list(s.columns) == list(STUDIES_COLUMNS) + ["style"]
    assert list(demo.generations.columns[:len(GENERATIONS_COLUMNS)]) == list(GENERATIONS_COLUMNS)
    assert list(demo.findings.columns) == list(FINDINGS_COLUMNS)
    assert list(demo.progression.columns) == list(PROGRESSION_COLUMNS)
    assert demo.generations.sample_id.is_unique
    assert set(demo.findings.observation) <= set(OBSERVATIONS)
    assert set(demo.findings.status) == {"present", "absent", "uncertain"}
    assert set(demo.progression.change) == set(CHANGES)
    assert (demo.progression.progression == demo.progression.change.map(PROGRESSION_OF_CHANGE)).all()
    for col in ("indication", "comparison", "technique", "findings", "impression", "text"):
        assert s[col].str.len().gt(0).all(), col


def test_dataset_prefix_and_labels(demo):
    s = demo.studies
    assert s.dataset.str.startswith("synthetic").all()
    assert dict(zip(s.dataset, s["style"])) == {"synthetic-site-a": "prose", "synthetic-site-b": "terse"}
    assert "synthetic" in demo._repr_markdown_().lower()
    assert s.text[s["style"] == "prose"].str.contains("___").any()
    assert s.text[s["style"] == "terse"].str.contains("XXXX").any()
    assert s.image_paths.map(lambda p: all(x.startswith("synthetic/images/") for x in p) and len(p) >= 1).all()


def _check_consistency(c):
    s, f, p = c.studies, c.findings, c.progression
    visits = s.groupby("patient_id").size()
    assert visits.between(2, 5).all()
    assert s.groupby("patient_id").study_time.apply(lambda t: t.is_monotonic_increasing and t.is_unique).all()
    # progression rows pair consecutive studies of one patient
    order = s.assign(k=s.groupby("patient_id").cumcount())[["study_id", "patient_id", "k"]]
    m = p.merge(order, on=["study_id", "patient_id"]).merge(
        order.rename(columns={"study_id": "prior_study_id", "k": "kp"}), on=["prior_study_id", "patient_id"])
    assert len(m) == len(p) and (m.k == m.kp + 1).all()
    # statuses at the two visits agree with the change
    held = set(zip(f.study_id[f.status != "absent"], f.observation[f.status != "absent"]))
    for r in p.itertuples():
        got = ((r.study_id, r.observation) in held, (r.prior_study_id, r.observation) in held)
        assert got == {"new": (True, False), "resolved": (False, True)}.get(r.change, (True, True)), r
    # every finding held at either of two consecutive visits has a progression row
    prev = dict(zip(order.study_id, order.groupby("patient_id").study_id.shift()))
    rows = set(zip(p.study_id, p.observation))
    for sid, obs in held:
        if obs == "No Finding": continue
        nxt = [k for k, v in prev.items() if v == sid]
        if prev[sid] is not None and isinstance(prev[sid], str): assert (sid, obs) in rows
        for n in nxt: assert (n, obs) in rows
    # No Finding exactly when no pathology is held
    nf = set(f.study_id[f.observation == "No Finding"])
    path = {sid for sid, o in held if o in PATHOLOGIES}
    assert not nf & path and nf | path == set(s.study_id)
    # every held finding is described in its findings section, and each change in change words
    text = dict(zip(s.study_id, s.findings))
    for r in f[f.status.isin(["present", "uncertain"]) & (f.observation != "No Finding")].itertuples():
        assert re.search(PHRASES["observations"][r.observation]["cue"], text[r.study_id], re.I), r
    for r in p.itertuples():
        sents = re.split(r"(?<=\.)\s+", text[r.study_id])
        cue = PHRASES["observations"][r.observation]["cue"]
        hits = [x for x in sents if re.search(cue, x, re.I) and re.search(CHANGE_WORDS[r.change], x, re.I)]
        assert hits, (r.study_id, r.observation, r.change, text[r.study_id])


def test_progression_and_findings_consistency(demo):
    _check_consistency(demo)


def test_consistency_other_seeds(other):
    _check_consistency(other)
    assert other.studies.patient_id.nunique() == 25


def test_effusion_word_in_both_styles(demo):
    f, s = demo.findings, demo.studies
    eff = f[(f.observation == "Pleural Effusion") & (f.status == "present")].merge(s, on="study_id")
    assert set(eff["style"]) == {"prose", "terse"}
    assert eff.findings.str.contains("effusion").all()


def test_generator_profiles(demo):
    g = demo.generations
    assert set(map(tuple, g[["system", "policy"]].drop_duplicates().values)) == set(RUNS)
    uniq = g[g.policy == "B4"].groupby("system").hypothesis.agg(lambda h: h.nunique() / len(h))
    assert uniq["sim-template"] < 0.3 and uniq["sim-verbose"] > 0.8
    k50 = g[g.policy == "K50"]
    assert (k50.hypothesis == "").any() and (k50.hypothesis == "<unk>").any()
    assert k50.truncated.any() and (k50.n_tokens[k50.truncated] == MAX_TOKENS).all()
    om = g[g.system == "sim-omit"]
    assert om.omitted.map(len).mean() > g[g.system == "sim-verbose"].omitted.map(len).mean()
    assert om.hallucinated.map(len).gt(0).mean() > 0.2
    assert (g.seed == 0).all()


def test_prefix_stability():
    small, big = make_demo_corpus(4, seed=9), make_demo_corpus(12, seed=9)
    n = len(small.studies)
    pd.testing.assert_frame_equal(small.studies, big.studies.iloc[:n])


@pytest.mark.parametrize("kw,msg", [({"n_patients": 0}, "n_patients must be a positive integer"),
                                    ({"n_patients": 1.5}, "n_patients must be a positive integer"),
                                    ({"seed": -1}, "seed must be a non-negative integer"),
                                    ({"seed": None}, "seed must be a non-negative integer")])
def test_bad_arguments(kw, msg):
    with pytest.raises(ValueError, match=msg):
        make_demo_corpus(**kw)
