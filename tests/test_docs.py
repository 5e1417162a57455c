"""The docs site: every notebook renders offline, and no rendered link goes to a host that does not exist or to a file
missing from the site. The checks over the whole site (`check_rendered_pages`, `check_no_dead_links`) run at the end of
tests/test_notebooks.py, on the pages rendered from the notebook tests' own executions (the `docs_site` fixture): that
file runs on one pytest-xdist worker (`--dist loadfile`), so each notebook is executed once per run."""
import importlib.util
import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

ROOT = Path(__file__).resolve().parents[1]
# hosts that exist and that pages may link to (libraries' docs, papers); a project host (cxr-audit.*) is never one of
# them
REAL_HOSTS = {"fastcore.fast.ai", "nbdev.fast.ai", "docs.python.org", "github.com", "arxiv.org", "doi.org", "pypi.org",
              "huggingface.co", "physionet.org", "openi.nlm.nih.gov", "stanfordmlgroup.github.io", "www.nltk.org",
              "pandas.pydata.org", "numpy.org", "vega.github.io", "altair-viz.github.io", "pola.rs", "docs.pola.rs",
              "aclanthology.org", "platform.openai.com", "learn.microsoft.com", "stanfordnlp.github.io", "quarto.org",
              "www.cs.cmu.edu", "scikit-learn.org", "docs.scipy.org", "www.statsmodels.org", "pytorch.org",
              "jupyter.org"}
NO_HOSTS = re.compile(r"cxr[-_]audit\.github\.io|github\.com/cxr[-_]audit", re.I)


def load_renderer():
    spec = importlib.util.spec_from_file_location("render_docs", ROOT / ".ci" / "render_docs.py")
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    return mod


def dead_links(site: Path) -> list[tuple[str, str, str]]:
    """(page, link, why) for every href/src of the site's pages that goes to an unknown host, a missing file or a
    missing anchor."""
    site, bad = site.resolve(), []
    pages = {f.resolve(): f.read_text(encoding="utf-8") for f in sorted(site.rglob("*.html"))}
    ids = {f: set(re.findall(r'\bid="([^"]+)"', text)) for f, text in pages.items()}
    for f, text in pages.items():
        for link in re.findall(r'(?:href|src)="([^"]*)"', text):
            why = _why_dead(link, f, site, ids)
            if why: bad.append((f.relative_to(site).as_posix(), link, why))
    return bad


def _why_dead(link, page, site, ids):
    u = urlsplit(link)
    if u.scheme in ("mailto", "data", "javascript"): return None
    if NO_HOSTS.search(link): return "a project host that does not exist"
    if u.scheme or u.netloc: return None if u.hostname in REAL_HOSTS else f"unknown host {u.hostname}"
    target = (page.parent / unquote(u.path)).resolve() if u.path else page
    if not target.is_relative_to(site): return "leaves the site"
    if not target.is_file(): return "missing file"
    if u.fragment and target.suffix == ".html" and unquote(u.fragment) not in ids.get(target, set()):
        return "missing anchor"
    return None


def test_dead_links_finds_what_it_should(tmp_path):
    # the checker itself, on a hand-made site: the dead links of the old builds, and links that are fine
    (tmp_path / "papers").mkdir()
    (tmp_path / "core.html").write_text('<h2 id="x">X</h2><a '
                                        'href="https://cxr-audit.github.io/cxr_audit/core.html#x">x</a><a '
                                        'href="#x">here</a><a href="#y">y</a><a href="papers/reref.html">r</a><a '
                                        'href="https://github.com/cxr-audit/cxr_audit/blob/main/x.py#L1">s</a>')
    (tmp_path / "papers" / "reref.html").write_text('<a href="../core.html#x">x</a><a href="../core.html#X">case</a>'
                                                    '<a href="reref.html">me</a><a href="llm.html">gone</a>'
                                                    '<a href="https://docs.python.org/3/">py</a><a '
                                                    'href="../../outside.html">o</a>')
    got = {(p, link, why) for p, link, why in dead_links(tmp_path)}
    assert {(p, why) for p, _, why in got} == {
        ("core.html", "a project host that does not exist"), ("core.html", "missing anchor"),
        ("papers/reref.html", "missing file"), ("papers/reref.html", "leaves the site"),
        ("papers/reref.html", "missing anchor")}, got
    assert ("core.html", "#y", "missing anchor") in got and ("papers/reref.html", "../core.html#X",
                                                             "missing anchor") in got


def test_broken_fragments_are_mended_to_the_anchor_they_meant(tmp_path):
    rd = load_renderer()
    (tmp_path / "core.html").write_text('<h3 id="InputError">InputError</h3><h3 id="PairedResult">PairedResult</h3>'
                                        '<a href="#inputerror">a</a><a href="#nothing">b</a>')
    (tmp_path / "stats.html").write_text('<a href="core.html#pairedresult.to_frame">c</a><a '
                                         'href="core.html#_path">d</a><a href="core.html#InputError">e</a><a '
                                         'href="https://docs.python.org/3/#x">f</a>')
    assert rd.fix_anchors(tmp_path) == 4
    assert '<a href="#InputError">a</a><a href="#">b</a>' in (tmp_path / "core.html").read_text()
    assert ('href="core.html#PairedResult"' in (s := (tmp_path / "stats.html").read_text())
            and 'href="core.html">d' in s
            and 'href="core.html#InputError">e' in s and 'docs.python.org/3/#x' in s)
    assert not dead_links(tmp_path)


def test_warnings_print_as_category_and_message_without_the_builders_path():
    rd = load_renderer()
    raw = (f"{ROOT}/cxr_audit/stats.py:687: DegenerateIntervalWarning: 3 resamples gave one value\n"
           "  warnings.warn(msg, DegenerateIntervalWarning)\nresult 1\n")
    assert rd.clean_stream(raw) == "DegenerateIntervalWarning: 3 resamples gave one value\nresult 1\n"
    assert rd.clean_stream(f"wrote {ROOT}/_docs/x.svg") == "wrote _docs/x.svg"


def test_search_indexes_the_text_under_each_heading_without_the_pilcrow(tmp_path):
    rd = load_renderer()
    (tmp_path / "stats.html").write_text('<h2 id="Holm">Holm adjustment<a class="anchor-link" '
                                         'href="#Holm">&#182;</a></h2><p>A difference is <strong>significant</strong> '
                                         'after Holm.</p>')
    js = rd.search_js(tmp_path, [("stats.html", "stats", "")])
    assert '"Holm adjustment"' in js and "&#182;" not in js and "significant after holm" in js


def test_links_are_made_local():
    # nbdev's symbol and "source" links (absolute under the old settings, relative under the new) and notebook links
    rd = load_renderer()
    bases = [("https://github.com/cxr-audit/cxr_audit/blob/main/cxr_audit/", "source/"),
             ("blob/main/cxr_audit/", "source/"), ("https://cxr-audit.github.io/cxr_audit/", "")]
    paper = rd.NBS / "papers" / "004_crossdomain.ipynb"
    body = ('<a href="https://cxr-audit.github.io/cxr_audit/core.html#inputerror">a</a><a href="core.html#x">b</a>'
            '<a href="blob/main/cxr_audit/core.py#L89">c</a><a href="../08_llm.ipynb">d</a><a '
            'href="https://docs.python.org/3/">e</a>')
    assert re.findall(r'href="([^"]*)"', rd.localize(body, paper, bases)) == [
        "../core.html#inputerror", "../core.html#x", "../source/core.py.html#L89", "../llm.html",
        "https://docs.python.org/3/"]
    assert rd.page_path(rd.NBS / "00_core.ipynb") == "core.html" and rd.page_path(paper) == "papers/crossdomain.html"


def test_a_page_renders_without_an_optional_package(tmp_path, monkeypatch):
    # `make docs` has no torch (the docs extra): such a page still renders, the cells that need the package say so and
    # the rest run; the tests (strict, as nbdev_test) still fail on it. A package that is really absent stands in for
    # torch.
    import nbformat
    rd = load_renderer()
    monkeypatch.setattr(rd, "OPTIONAL", rd.OPTIONAL + ("no_such_package_here",))
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in
                                         ("import os\nimport no_such_package_here\nx = 1", "no_such_package_here.f()",
                                          "print(x + 1)")])
    path = tmp_path / "x.ipynb"; nbformat.write(nb, path)
    assert rd.missing_optional(path) == ["no_such_package_here"]
    ok, done, _ = rd.execute(path, strict=False)
    assert ok and "import no_such_package_here" in done.cells[0].source        # the page shows the source as written
    assert "not run in this build of the docs" in done.cells[1].outputs[0]["text"]
    assert "".join(done.cells[2].outputs[0]["text"]) == "2\n"
    ok, _, tb = rd.execute(path, strict=True)
    assert not ok and "no_such_package_here" in tb


def test_settings_name_no_host_that_does_not_exist():
    text = (ROOT / "settings.ini").read_text() + (ROOT / "nbs" / "nbdev.yml").read_text()
    assert not NO_HOSTS.search(text)


def test_quarto_sidebar_lists_every_notebook():
    # custom_sidebar = True: nbs/sidebar.yml is written by hand, so it must name every notebook, the papers under
    # "Papers"
    import yaml
    rd = load_renderer()
    side = yaml.safe_load((ROOT / "nbs" / "sidebar.yml").read_text())["website"]["sidebar"]["contents"]
    top = [c for c in side if isinstance(c, str)]
    papers = next(c for c in side if isinstance(c, dict) and c.get("section") == "Papers")["contents"]
    assert top + papers == [p.relative_to(rd.NBS).as_posix() for p in rd.notebooks()]


def check_rendered_pages(docs_site):
    site = docs_site.render_all()                                         # fails if any notebook fails
    rd = docs_site.renderer
    pages = {p: (site / d).read_text(encoding="utf-8") for p, d, _, _ in rd.site_pages()}
    pages = {p.stem: t for p, t in pages.items()}
    for name, page in pages.items():
        assert not re.search(r"<(script|link)[^>]+(src|href)=[\"']https?://", page), name
        assert "#| " not in page and "{target=" not in page, name        # directives and pandoc attributes gone
        assert "show_doc(" not in page, name                              # doc cells show output only
        assert 'href="index.html"' in page or 'href="../index.html"' in page, name
        assert "not run in this build of the docs" not in page, name      # the test environment has every extra
        # no machine path, no raw warning
        assert str(ROOT) not in page and not re.search(r"\.py:\d+: \w*Warning", page), name
    core = pages["00_core"]
    assert "<h1" in core and "sha256_frame" in core and "write_manifest" in core
    assert "from fastcore.test import" not in core  # hidden cells removed
    assert 'href="source/core.py.html#L' in core    # "source" links go to the site's own source pages
    assert "data:image/svg+xml" in pages["14_audit"] or "<svg" in pages["14_audit"]  # figures are inline
    paper = pages["004_crossdomain"]                                      # nbs/papers/ renders under "Papers"
    assert '<div class="section">Papers</div>' in pages["index"] and 'href="papers/crossdomain.html"' in pages["index"]
    assert 'href="../core.html"' in paper and 'src="../search.js"' in paper
    assert "SIMULATED" in paper and ("data:image/svg+xml" in paper or "<svg" in paper)
    reref = pages["000_reref"]  # paper 000: the back end and infeasible variations are stated
    assert 'href="papers/reref.html"' in pages["index"] and "references: <code>rules</code>" in reref
    assert "not applicable with this back end" in reref and ("data:image/svg+xml" in reref or "<svg" in reref)


def check_no_dead_links(docs_site):
    site = docs_site.render_all()
    assert (site / "search.js").is_file() and list((site / "source").glob("*.py.html"))
    bad = dead_links(site)
    assert not bad, f"{len(bad)} dead links, e.g. {bad[:10]}"


def test_readme_is_generated_from_index(tmp_path):
    rd = load_renderer()
    rd.readme(tmp_path / "README.md")
    text = (tmp_path / "README.md").read_text()
    assert "make demo" in text and "make test" in text
    assert "(nbs/00_core.ipynb)" in text
    assert text == (ROOT / "README.md").read_text(), "README.md is stale: run `make readme` and commit it"


def module_table(readme: str) -> dict[str, str]:
    "Module name -> its notebook, from the README's table of pages (`| [name](nbs/NN_name.ipynb) | ... |`)."
    return dict(re.findall(r"^\| \[(\w+)\]\(nbs/([\w.]+\.ipynb)\) \|", readme, re.M))


def test_readme_lists_every_module_with_its_notebook():
    table = module_table((ROOT / "README.md").read_text(encoding="utf-8"))
    modules = {p.stem for p in (ROOT / "cxr_audit").glob("*.py")} - {"__init__", "_modidx"}
    assert set(table) == modules, (sorted(modules - set(table)), sorted(set(table) - modules))
    for name, nb in table.items():
        assert f"#| default_exp {name}" in (ROOT / "nbs" / nb).read_text(encoding="utf-8"), (name, nb)


def test_the_module_table_check_can_fail():
    assert module_table("| [core](nbs/00_core.ipynb) | seeds |\n| page | what |\n") == {"core": "00_core.ipynb"}
