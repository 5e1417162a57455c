"""Run every notebook in nbs/ and nbs/papers/ as a test (one pytest test per notebook), as nbdev_test runs them (the
same
skipped cells, IN_TEST set, stop at the first error). Each notebook is executed once per session: the `docs_site`
fixture
renders its page from that same execution, and the last two tests check the whole site with tests/test_docs.py's checks.
This file must stay on one pytest-xdist worker (`make test` uses `--dist loadfile`)."""
from pathlib import Path

import pytest
from test_docs import check_no_dead_links, check_rendered_pages

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p for pattern in ("*.ipynb", "papers/*.ipynb") for p in (ROOT / "nbs").glob(pattern)
                   if not p.name.startswith("_"))


def test_every_module_has_a_notebook():
    # guards the parametrization below against silently running nothing
    assert len(NOTEBOOKS) >= 5, NOTEBOOKS
    assert any(p.parent.name == "papers" for p in NOTEBOOKS), "no paper notebook is run"


def test_skip_flags_are_nbdev_tests():
    # the renderer skips the cells nbdev_test skips: settings.ini's tst_flags
    from nbdev.config import get_config
    import importlib.util
    spec = importlib.util.spec_from_file_location("render_docs", ROOT / ".ci" / "render_docs.py")
    rd = importlib.util.module_from_spec(spec); spec.loader.exec_module(rd)
    assert tuple(get_config(path=ROOT).get("tst_flags", "").split()) == rd.SKIP_FLAGS


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.relative_to(ROOT / "nbs").with_suffix("").as_posix())
def test_notebook(nb, docs_site):
    ok, tb = docs_site.render(nb)
    assert ok, f"{nb.name} failed:\n{tb}"


# after every notebook test (pytest runs a file's tests in order): the site built from those executions
def test_every_notebook_renders_offline(docs_site):
    check_rendered_pages(docs_site)


def test_rendered_site_has_no_dead_links(docs_site):
    check_no_dead_links(docs_site)
