"""The offline docs fallback renders a notebook into a page that needs no network."""
import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_renderer():
    spec = importlib.util.spec_from_file_location("render_docs", ROOT / ".ci" / "render_docs.py")
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    return mod


def test_core_page_renders_offline(tmp_path):
    rd = load_renderer()
    node = rd.execute_and_process(ROOT / "nbs" / "00_core.ipynb")
    body = rd.body_html(node)
    page = rd.page("core", body, [("index", "cxr_audit"), ("00_core", "core")], "00_core")
    assert "sha256_frame" in page and "write_manifest" in page           # show_doc entries made it in
    assert "#| export" not in page and "#| hide" not in page              # directives stripped
    assert "from fastcore.test import" not in page                        # hidden cells removed
    assert not re.search(r"<(script|link)[^>]+(src|href)=[\"']https?://", page)
    assert 'href="index.html"' in page


def test_readme_is_generated_from_index(tmp_path):
    rd = load_renderer()
    rd.readme(tmp_path / "README.md")
    text = (tmp_path / "README.md").read_text()
    assert "make demo" in text and "make test" in text
    assert "(nbs/00_core.ipynb)" in text
    assert text == (ROOT / "README.md").read_text(), "README.md is stale: run `make readme` and commit it"
