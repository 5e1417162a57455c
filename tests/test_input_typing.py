"""Input typing and the error boundary: ids stay text, out-of-range numbers are refused with one clear line (no
mock)."""
import math

import pandas as pd
import pytest

from cxr_audit.core import InputError, read_table, rng
from cxr_audit.evaluator import score_systems
from cxr_audit.llm import decoding_params
from cxr_audit.stats import holm


def test_csv_ids_keep_their_leading_zeros(tmp_path):
    (tmp_path / "g.csv").write_text("study_id,patient_id,system,hypothesis,n\n001,007,a,Clear "
                                    "lungs.,3\n010,070,a,Effusion.,4\n")
    t = read_table(tmp_path / "g.csv")
    assert t.study_id.tolist() == ["001", "010"] and t.patient_id.tolist() == ["007", "070"]
    assert t.n.tolist() == [3, 4]   # other columns are still typed


@pytest.mark.parametrize("call, message", [
    (lambda: holm([1.5, 0.2]), "p-values must lie in [0, 1]"),
    (lambda: holm([-0.1]), "p-values must lie in [0, 1]"),
    (lambda: decoding_params(temperature=math.nan), "temperature must be a finite number"),
    (lambda: decoding_params(top_p=1.5), "top_p must be in (0, 1]"),
    (lambda: decoding_params(top_k=0), "top_k must be >= 1"),
    (lambda: rng(1e30), "seed must be a whole number"),
    (lambda: rng("abc"), "seed must be a whole number"),
    (lambda: rng(-1), "seed must be >= 0"),
    (lambda: score_systems(pd.DataFrame({"reference": ["a b"], "hypothesis": ["a"], "system": ["x"]}), method="bogus",
                           reps=0),
     "method must be one of"),
])
def test_out_of_range_values_are_one_clear_input_error(call, message):
    pattern = message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")
    with pytest.raises(InputError, match=pattern):
        call()
    assert holm([0.01, math.nan, 0.04]).tolist()[0] == pytest.approx(0.02)   # nan stays out of the family


def test_csv_outputs_quote_formulas_and_read_back_unchanged(tmp_path):
    from cxr_audit.core import write_table
    t = pd.DataFrame({"system": ["=cmd|' /C calc'!A0", "@SUM(A1)"], "hypothesis": ["+1 cm nodule.", "- small effusion"],
                      "n": [-1, 2]})
    raw = write_table(t, tmp_path / "t.csv").read_text()
    assert all(not cell.startswith(("=", "+", "@", "-")) for line in raw.splitlines()[1:]
               for cell in line.split(",")[:2])
    pd.testing.assert_frame_equal(read_table(tmp_path / "t.csv"), t)


def test_repeated_column_names_list_cells_and_spaced_ids_are_refused(tmp_path):
    from cxr_audit.corpus import to_generations, to_studies
    (tmp_path / "dup.csv").write_text("study_id,dataset,findings,findings\na,iu-xray,Lungs clear.,Heart big.\n")
    with pytest.raises(InputError, match="'findings' appear more than once"):
        read_table(tmp_path / "dup.csv")
    pd.DataFrame({"study_id": ["a"], "dataset": "iu-xray",
                  "findings": [["Lungs clear.", "No effusion."]]}).to_parquet(tmp_path / "l.parquet")
    with pytest.raises(InputError, match="column 'findings' holds a list of texts"):
        to_studies(read_table(tmp_path / "l.parquet"), "l.parquet")
    with pytest.raises(InputError, match="differ only in the spaces"):
        to_generations(pd.DataFrame({"study_id": ["s1", "s1 "], "system": "m", "hypothesis": "x"}))


def test_audit_sets_aside_a_configuration_that_covers_too_few_studies(tmp_path):
    """One system with a single report would cut every comparison to that study: it is set aside, said in a banner,
    exit 1."""
    from cxr_audit.audit import run_audit
    from cxr_audit.core import IncompleteRunError
    from cxr_audit.synth import make_demo_corpus
    d = make_demo_corpus(n_patients=8, seed=1)
    lonely = d.generations.iloc[:1].assign(system="lonely", sample_id="lonely/1")
    g = pd.concat([d.generations, lonely], ignore_index=True)
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="cannot write the report to"):   # checked before any stage runs
        run_audit(d.studies, g, tmp_path / "file" / "out", stages=["corpus"], progress=False, workers=1)
    with pytest.raises(IncompleteRunError, match="1 configuration\\(s\\) set aside") as e:
        run_audit(d.studies, g, tmp_path / "a", stages=["corpus"], progress=False, workers=1)
    page = (tmp_path / "a" / "report.html").read_text()
    assert ("Incomplete run." in page and "lonely+B4" in page and "set aside" in page
            and list(e.value.failed) == ["coverage"])
    mixed = d.studies.assign(dataset=["iu-xray"] + ["synthetic-site-a"] * (len(d.studies) - 1))
    run_audit(mixed, d.generations, tmp_path / "m", stages=["corpus"], progress=False, workers=1)
    page = (tmp_path / "m" / "report.html").read_text()
    assert "Mixed data." in page and "no patient data is shown" not in page


def test_requests_that_cannot_be_honoured_are_refused_not_answered_with_zeros():
    from cxr_audit.label_audit import label_audit
    from cxr_audit.longitudinal_eval import progression_evaluation
    from cxr_audit.verdict import verdict
    st = pd.DataFrame({"study_id": ["a", "b", "c"], "findings": ["", " ", ""], "impression": ""})
    g = pd.DataFrame({"study_id": ["a", "b", "c"] * 2, "system": ["m1"] * 3 + ["m2"] * 3,
                      "hypothesis": ["Effusion.", "Clear.", "Edema."] * 2})
    with pytest.raises(InputError, match="every reference report is empty"):
        label_audit(st, g, reps=10)
    full = st.assign(findings=["Stable effusion.", "Lungs clear.", "Edema has improved."])
    with pytest.raises(InputError, match="reps must be >= 1"):
        verdict(full, g, reps=0, clusters=None)
    with pytest.raises(InputError, match=r"max_invalid is a share of replies in \[0, 1\]"):
        progression_evaluation(full, g, max_invalid=2)


def test_help_says_what_a_rerun_into_the_same_folder_does():
    import subprocess
    import sys
    from pathlib import Path
    exe = str(Path(sys.executable).parent / "cxr-audit")
    for command in ("score", "audit", "concentration", "verdict"):
        r = subprocess.run([exe, command, "--help"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and "replaced_outputs" in r.stdout, command
