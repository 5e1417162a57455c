"""The paper notebooks on real files: with CXR_AUDIT_IU pointing at a real IU X-ray file, paper 004's notebook runs end to end."""
from pathlib import Path

from nbdev.config import get_config
from nbdev.test import test_nb as run_nb  # renamed so pytest does not collect it

ROOT = Path(__file__).resolve().parents[1]
PAPER_004 = ROOT / "nbs" / "papers" / "004_crossdomain.ipynb"
IU_REAL = ROOT / "tests" / "fixtures" / "iu_real" / "iu_valid_rexrank_sample.json"


def test_paper_004_runs_on_a_real_iu_file(monkeypatch):
    # the IU cohort, concentration, labels and the bootstrap family run on 50 real IU X-ray studies (ReXrank JSON),
    # with only the path changed; MIMIC-CXR stays simulated (restricted data is not in the repository)
    assert IU_REAL.is_file() and PAPER_004.is_file()
    monkeypatch.setenv("CXR_AUDIT_IU", str(IU_REAL))
    monkeypatch.setenv("CXR_AUDIT_REPS", "200")
    skip = get_config(path=ROOT).get("tst_flags", "").split()
    ok, _ = run_nb(PAPER_004, skip_flags=skip, showerr=True)
    assert ok, "004_crossdomain.ipynb failed on the real IU file (the traceback is printed above)"


def test_a_failing_step_fails_the_run(monkeypatch):
    # the runner must report a failure, not swallow it: a path that does not exist stops the notebook
    monkeypatch.setenv("CXR_AUDIT_IU", str(ROOT / "tests" / "fixtures" / "iu_real" / "no_such_file.json"))
    ok, _ = run_nb(PAPER_004, skip_flags=[], showerr=False)
    assert not ok
