"""The offline docs fallback renders a notebook into a page that needs no network."""
import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_renderer():
    spec = importlib.util.spec_from_file_location("render_docs", ROOT / ".ci" / "render_docs.py")
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    return mod


def test_every_notebook_renders_offline(tmp_path):
    rd = load_renderer()
    rd.render(tmp_path)                                                   # raises if any notebook fails
    pages = {p.stem: p.read_text(encoding="utf-8") for p in tmp_path.glob("*.html")}
    assert set(pages) == {p.stem for p in rd.notebooks()}
    for name, page in pages.items():
        assert not re.search(r"<(script|link)[^>]+(src|href)=[\"']https?://", page), name
        assert "#| " not in page and "{target=" not in page, name        # directives and pandoc attributes gone
        assert "show_doc(" not in page, name                              # doc cells show output only
        assert 'href="index.html"' in page, name
    core = pages["00_core"]
    assert "<h1" in core and "sha256_frame" in core and "write_manifest" in core
    assert "from fastcore.test import" not in core                        # hidden cells removed
    assert "data:image/svg+xml" in pages["14_audit"] or "<svg" in pages["14_audit"]  # figures are inline
    paper = pages["004_crossdomain"]                                      # nbs/papers/ renders under "Papers"
    assert any(p.parent.name == "papers" for p in rd.notebooks())
    assert '<div class="section">Papers</div>' in pages["index"] and 'href="004_crossdomain.html"' in pages["index"]
    assert "SIMULATED" in paper and ("data:image/svg+xml" in paper or "<svg" in paper)
    reref = pages["000_reref"]                                            # paper 000: the back end and infeasible variations are stated
    assert 'href="000_reref.html"' in pages["index"] and "references: <code>rules</code>" in reref
    assert "not applicable with this back end" in reref and ("data:image/svg+xml" in reref or "<svg" in reref)


def test_readme_is_generated_from_index(tmp_path):
    rd = load_renderer()
    rd.readme(tmp_path / "README.md")
    text = (tmp_path / "README.md").read_text()
    assert "make demo" in text and "make test" in text
    assert "(nbs/00_core.ipynb)" in text
    assert text == (ROOT / "README.md").read_text(), "README.md is stale: run `make readme` and commit it"
