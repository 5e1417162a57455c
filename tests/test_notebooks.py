"""Run every notebook in nbs/ and nbs/papers/ as a test (one pytest test per notebook), with nbdev's own runner."""
from pathlib import Path

import pytest
from nbdev.config import get_config
from nbdev.test import test_nb as run_nb  # renamed so pytest does not collect it

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p for pattern in ("*.ipynb", "papers/*.ipynb") for p in (ROOT / "nbs").glob(pattern) if not p.name.startswith("_"))


def test_every_module_has_a_notebook():
    # guards the parametrization below against silently running nothing
    assert len(NOTEBOOKS) >= 5, NOTEBOOKS
    assert any(p.parent.name == "papers" for p in NOTEBOOKS), "no paper notebook is run"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.relative_to(ROOT / "nbs").with_suffix("").as_posix())
def test_notebook(nb):
    skip = get_config(path=ROOT).get("tst_flags", "").split()
    ok, _ = run_nb(nb, skip_flags=skip, showerr=True)
    assert ok, f"{nb.name} failed (the traceback is printed above)"
