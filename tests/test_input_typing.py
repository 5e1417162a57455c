"""Input typing and the error boundary: ids stay text, out-of-range numbers are refused with one clear line (no mock)."""
import math

import pandas as pd
import pytest

from cxr_audit.core import InputError, read_table, rng
from cxr_audit.evaluator import score_systems
from cxr_audit.llm import decoding_params
from cxr_audit.stats import holm


def test_csv_ids_keep_their_leading_zeros(tmp_path):
    (tmp_path / "g.csv").write_text("study_id,patient_id,system,hypothesis,n\n001,007,a,Clear lungs.,3\n010,070,a,Effusion.,4\n")
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
    (lambda: score_systems(pd.DataFrame({"reference": ["a b"], "hypothesis": ["a"], "system": ["x"]}), method="bogus", reps=0),
     "method must be one of"),
])
def test_out_of_range_values_are_one_clear_input_error(call, message):
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")):
        call()
    assert holm([0.01, math.nan, 0.04]).tolist()[0] == pytest.approx(0.02)   # nan stays out of the family
