#!/usr/bin/env python3
"""Offline docs renderer: the fallback for `make docs` on machines without Quarto.

Each notebook in nbs/ is executed in-process (execnb), passed through nbdev's own docs processors
(hidden cells removed, `show_doc` tables added, directives stripped), converted to HTML with
nbconvert's `basic` template and wrapped in a page with a sidebar. Figures are inline SVG/PNG and
the pages load nothing from the network. `--readme` writes README.md from nbs/index.ipynb instead.
"""
import argparse
import functools
import html
import json
import os
import re
import sys
import traceback
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parents[1]
NBS = ROOT / "nbs"

CSS = """
body{margin:0;font-family:system-ui,-apple-system,'Segoe UI',Roboto,Helvetica,Arial,sans-serif;\
color:#1d1d1f;line-height:1.5}
.layout{display:flex;min-height:100vh}\
nav.side{width:230px;flex:none;background:#f5f6f8;padding:20px 16px;border-right:1px solid #e2e2e2}
nav.side a{display:block;color:#0b5cad;text-decoration:none;padding:3px 0}nav.side a.cur{font-weight:700;color:#111}
nav.side .section{margin-top:14px;font-weight:700;color:#555;text-transform:uppercase;font-size:.8em}
nav.side .brand{font-size:1.2em;font-weight:700;margin-bottom:12px;color:#111}
main{flex:1;max-width:980px;padding:24px 40px 80px;overflow-x:auto}
pre{background:#f6f8fa;padding:10px 12px;border-radius:6px;overflow-x:auto;font-size:.88em}
code{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
.jp-OutputArea-output pre{background:#fff;border-left:3px solid #f0b08a}
table{border-collapse:collapse;font-size:.9em;margin:8px 0}\
th,td{border-bottom:1px solid #e5e5e5;padding:3px 8px;text-align:left}
blockquote{color:#555;font-style:italic;font-size:1.15em;margin-left:0;padding-left:12px;border-left:3px solid #ddd}
svg{max-width:100%;height:auto}img{max-width:100%}
#q{width:100%;box-sizing:border-box;margin:0 0 6px;padding:4px 6px}#hits a{font-size:.85em}
pre.src{background:#fff;font-size:.8em;line-height:1.35}pre.src .ln{color:#999;text-decoration:none}\
pre.src span:target{background:#fff3b0}
"""


SECTIONS = {"papers": "Papers"}   # sub-folders of nbs/ rendered as a sidebar section of their own
SKIP_FLAGS = ("notest", "slow")   # settings.ini's tst_flags: cells nbdev_test skips are skipped here too
# the generate extra, left out of the docs extra: its pages render without those outputs
OPTIONAL = ("torch", "transformers", "PIL")


def notebooks():
    "The modules' notebooks (index first), then each section's (nbs/papers/: the paper notebooks)."
    nbs = sorted(p for p in NBS.glob("*.ipynb") if not p.name.startswith("_"))
    subs = [p for d in SECTIONS for p in sorted((NBS / d).glob("*.ipynb")) if not p.name.startswith("_")]
    return sorted(nbs, key=lambda p: (p.stem != "index", p.name)) + subs


def section_of(path):
    "The sidebar section of a notebook (None for the modules)."
    return SECTIONS.get(path.parent.name) if path.parent != NBS else None


def page_path(path):
    "Where a notebook's page goes inside the site, named as nbdev and Quarto name it: nbs/00_core.ipynb -> core.html."
    rel = Path(path).resolve().relative_to(NBS)
    return (rel.parent / re.sub(r"^\d+[a-zA-Z0-9]*_", "", rel.name.lower())).with_suffix(".html").as_posix()


def title_of(nb):
    for c in nb["cells"]:
        if c["cell_type"] == "markdown":
            m = re.search(r"^#\s+(.+)$", "".join(c["source"]), re.M)
            if m: return m.group(1).strip()
    return None


def site_pages():
    "(notebook, page path, title, section) for every page of the site, in sidebar order."
    return [(p, page_path(p), title_of(json.loads(p.read_text())) or p.stem, section_of(p)) for p in notebooks()]


def _directives(src):
    "Quarto-style `#| key: value` lines of a cell as a dict."
    out = {}
    for l in src.splitlines():
        m = re.match(r"\s*#\|\s*([\w-]+)\s*:?\s*(.*)$", l)
        if m: out[m.group(1)] = m.group(2).strip().lower()
    return out


def _frontmatter_md(src):
    "The raw YAML front matter nbdev makes from the title cell, back as `# title` + `> description`."
    import yaml
    fm = yaml.safe_load(src.strip().strip("-")) or {}
    return f"# {fm.get('title', '')}\n\n> {fm.get('description', '')}".strip()


def _skipped(cell, flags):
    "nbdev_test's rule: markdown, `nbdev_export(` calls, `#| eval: false` and flagged cells are not run."
    if cell.cell_type != "code" or "nbdev_export" + "(" in cell.source: return True
    d = _directives(cell.source)
    return d.get("eval") == "false" or bool(set(flags) & set(d))


def missing_optional(path):
    "The optional packages a notebook imports that are not installed here."
    import importlib.util
    src = "\n".join("".join(c["source"]) for c in json.loads(Path(path).read_text())["cells"]
                    if c["cell_type"] == "code")
    return [m for m in OPTIONAL if re.search(rf"^\s*(?:import|from)\s+{m}\b", src, re.M)
            and importlib.util.find_spec(m) is None]


def _guard_imports(src, missing):
    """A cell's source with its top-level imports of missing packages made harmless (the cells that use them then fail
    alone)."""
    pat = re.compile(rf"^(import|from)\s+({'|'.join(missing)})\b.*$", re.M)
    return pat.sub(lambda m: f"try: {m.group(0).strip()}\nexcept ModuleNotFoundError: pass", src) if missing else src


def _not_run_note(missing):
    import nbformat
    extra = ", ".join(f"`{m}`" for m in missing)
    return nbformat.v4.new_output("stream", name="stdout", text="(not run in this build of the docs: it needs "
                                  f"{extra}; `make install-generate` then `make docs` runs it)\n")


def execute(path, strict=True, flags=SKIP_FLAGS):
    """Run a notebook the way nbdev_test does (IN_TEST set, the same skipped cells, stop at the first error).
    Returns (ok, notebook, traceback). With `strict=False` and an optional package missing, the page still renders:
    the cells that need the package show a note instead of their output."""
    from execnb.nbio import read_nb
    from execnb.shell import CaptureShell
    from fastcore.xtras import working_directory
    os.environ["IN_TEST"] = "1"
    nb, missing = read_nb(path), ([] if strict else missing_optional(path))
    shell, orig = CaptureShell(path), {}
    def pre(c):
        if _skipped(c, flags): return True
        if missing: orig[id(c)], c.source = c.source, _guard_imports(c.source, missing)
    def post(c):
        if id(c) in orig: c.source = orig.pop(id(c))
        if missing and any(o.get("output_type") == "error" for o in c.get("outputs", [])):
            c.outputs = [_not_run_note(missing)]
    try:
        with working_directory(Path(path).parent):
            shell.run_all(nb, exc_stop=not missing, preproc=pre, postproc=post)
        return True, nb, ""
    except Exception: return False, nb, shell.prettytb(fname=path)
    finally: _release(shell)


def _release(shell):
    """Let a notebook's shell go when its page is done. IPython keeps every shell for an exit hook that clears its
    namespace
    and runs a full garbage collection: a site build (two shells a page) kept every notebook's objects to the end, then
    spent ~30 s of CPU at exit collecting them (measured on this site, 2 GB of heap)."""
    import atexit
    atexit.unregister(shell.atexit_operations)


@functools.lru_cache(None)
def _parse_each_source_once():
    """execnb's `NbCell.parsed_` means to keep a cell's syntax tree but never does (it stores `_parsed_` as an
    attribute, then
    looks for it as a dict key), so nbdev's docs processors parse each cell again at every look, three times or more a
    page
    (~3% of the notebook test worker's CPU, measured with py-spy). Replaced by one that keeps the tree with the source
    it was parsed from: a processor that changes a cell's source gets a fresh parse; nbdev only reads the trees."""
    import ast
    from execnb.nbio import NbCell

    def parsed_(self):
        if self.cell_type != "code" or self.source.strip()[:1] in ["%", "!"]: return None
        src, body = self.__dict__.get("_parsed_once_", (None, None))
        if src != self.source:
            try: body = ast.parse(self.source).body
            except SyntaxError: return None   # as execnb: `x = !ls` is not Python
            self.__dict__["_parsed_once_"] = (self.source, body)
        return body
    NbCell.parsed_ = parsed_


def to_node(nb, missing=()):
    """nbdev's docs processors (hidden cells out, `show_doc` tables in, directives stripped), then an nbformat node.
    `missing`: optional packages absent here, whose imports are guarded while nbdev runs the import cells again."""
    import nbformat
    from execnb.nbio import nb2str
    from nbdev.processors import FilterDefaults, exec_show_docs
    _parse_each_source_once()
    orig = {id(c): c.source for c in nb.cells if c.cell_type == "code"} if missing else {}
    for c in nb.cells:
        if id(c) in orig: c.source = _guard_imports(c.source, missing)
    proc = FilterDefaults().nb_proc(nb)
    proc.process()
    for p in proc.procs:   # exec_show_docs ran the doc cells in a shell of its own (none for a page without docs)
        if isinstance(p, exec_show_docs) and hasattr(p, "k"): _release(p.k)
    for c in nb.cells:
        if id(c) in orig and c.source == _guard_imports(orig[id(c)], missing): c.source = orig[id(c)]
    node = nbformat.reads(nb2str(nb), as_version=4)
    node.cells = [c for c in map(_doc_cell, node.cells) if c is not None]
    return node


_WARNING_LINE = re.compile(r"^\S*?\.py:\d+: (\w*Warning): (.*)\n(?:[ \t]+\S.*(?:\n|$))?", re.M)


def clean_stream(text):
    """Printed output as a reader should see it: a warning as `Category: message` (without the file, line and source
    line Python adds), and no path of the machine that built the page."""
    text = _WARNING_LINE.sub(r"\1: \2\n", text)
    return text.replace(str(ROOT) + os.sep, "").replace(str(ROOT), ".")


def _doc_cell(c):
    "One processed cell as the page shows it (None: left out)."
    import nbformat
    c.metadata.pop("execution", None)
    if c.cell_type == "raw" and c.source.lstrip().startswith("---"):
        return nbformat.v4.new_markdown_cell(_frontmatter_md(c.source))
    if c.cell_type != "code": return c
    d = _directives(c.source)
    if d.get("include") == "false": return None
    c.source = "\n".join(l for l in c.source.splitlines() if not l.lstrip().startswith("#|")).strip()
    tags = set(c.metadata.get("tags", []))
    if d.get("echo") == "false" or not c.source: tags.add("remove_input")
    if d.get("output") == "false": tags.add("remove_output")
    c.metadata["tags"] = sorted(tags)
    for o in c.get("outputs", []):
        if o.get("output_type") == "stream": o["text"] = clean_stream("".join(o.get("text", "")))
        md = o.get("data", {}).get("text/markdown")
        if md is not None:  # pandoc attributes ({target=...}, {#id}) mean nothing outside Quarto
            o["data"]["text/markdown"] = re.sub(r"\{(?:target|#|\.)[^}\n]*\}", "", "".join(md))
    return c if c.source or c.get("outputs") else None


NO_ALT = "No description has been provided for this image"   # nbconvert's text for an image without one


@functools.lru_cache(None)
def _exporter():
    """One nbconvert exporter for every page (building one compiles its templates: ~0.4 s a page), without two steps
    that took ~70% of its time and change nothing on these pages (measured: 19 s of CPU for the site, ~6 s now):
    - the pass of the whole page through BeautifulSoup (pure-Python parsing of every table and figure), which only adds
      `tabindex` to the `lab` template's cells (not in `basic`) and a default `alt` to images (done here with a
      pattern);
    - `clean_html` (bleach) on each code cell's highlighted source: Pygments' own escaped output of our notebooks. The
      outputs are not sanitized either way (nbconvert's `sanitize_html` is off: the notebooks are ours)."""
    from nbconvert import HTMLExporter
    from nbconvert.exporters.templateexporter import TemplateExporter
    from nbconvert.filters.highlight import Highlight2HTML
    from nbconvert.filters.widgetsdatatypefilter import WidgetsDataTypeFilter
    from traitlets.config import Config

    class PageExporter(HTMLExporter):
        def from_notebook_node(self, nb, resources=None, **kw):
            """`HTMLExporter.from_notebook_node` (its filters for this notebook, then the template) without the
            BeautifulSoup pass."""
            lang = nb.metadata.get("language_info", {})
            self.register_filter("highlight_code",
                                 Highlight2HTML(pygments_lexer=lang.get("pygments_lexer", lang.get("name")),
                                                parent=self))
            resources = self._init_resources(resources)
            self.register_filter("filter_data_type",
                                 WidgetsDataTypeFilter(notebook_metadata=getattr(self, "_nb_metadata", {}),
                                                                           parent=self, resources=resources))
            body, resources = TemplateExporter.from_notebook_node(self, nb, resources, **kw)
            return re.sub(r"<img(?![^>]*\balt=)", f'<img alt="{NO_ALT}"', body), resources

    cfg = Config({"TagRemovePreprocessor": {"enabled": True, "remove_input_tags": ["remove_input"],
                                            "remove_all_outputs_tags": ["remove_output"]}})
    exporter = PageExporter(config=cfg, template_name="basic", exclude_input_prompt=True, exclude_output_prompt=True)
    exporter.register_filter("clean_html", lambda x: x.decode() if isinstance(x, bytes) else str(x))
    return exporter


def body_html(node):
    return _exporter().from_notebook_node(node)[0]


@functools.lru_cache(None)
def _link_bases():
    """The doc and source URL prefixes nbdev writes into links, each with the site folder it maps to (from settings.ini
    and from the module index nbdev_export last wrote, which may predate a settings change)."""
    from urllib.parse import urljoin
    from nbdev.config import get_config
    cfg, modidx = get_config(path=ROOT), {}
    try: exec((ROOT / cfg.lib_name / "_modidx.py").read_text(encoding="utf-8"), modidx)
    except (OSError, SyntaxError): modidx["d"] = {"settings": cfg.d}   # being rewritten by nbdev_export right now
    out = []
    for c in (cfg.d, modidx["d"]["settings"]):
        lib = Path(c["lib_path"]).name
        out += [(urljoin(c["git_url"] + "/", f"blob/{c['branch']}/{lib}/"), "source/"),
                (f"blob/{c['branch']}/{lib}/", "source/"),
                (urljoin(urljoin(c["doc_host"] + "/", c["doc_baseurl"]) + "/", ""), "")]
    return [(b, d) for b, d in dict.fromkeys(out) if b not in ("", "./", "/")]


def localize(body, nb_path, bases=None):
    """Every link of a page's body made relative inside the site: nbdev's symbol links (site-root paths or URLs under
    doc_host) and "source" links (under git_url) point to the site's pages and source pages; links to notebooks point
    to their pages."""
    bases = _link_bases() if bases is None else bases
    here = Path(page_path(nb_path)).parent
    def fix(m):
        href = m.group(2)
        if href.startswith(("#", "mailto:", "data:", "javascript:")) or (
                re.match(r"^[a-z]+://", href) and not any(href.startswith(b) for b, _ in bases)):
            return m.group(0)
        url, frag = (href.split("#", 1) + [""])[:2]
        target = _site_target(url, nb_path, bases)
        if target is None: return m.group(0)
        rel = os.path.relpath(target, here.as_posix()) if target else here.as_posix()
        return f'{m.group(1)}="{rel}{"#" + frag if frag else ""}"'
    return re.sub(r'(href|src)="([^"]*)"', fix, body)


def _site_target(url, nb_path, bases):
    "The site-root path a link goes to (None: leave it as it is)."
    for base, dest in bases:
        if url.startswith(base):
            rest = url[len(base):]
            return dest + (re.sub(r"\.py$", ".py.html", rest) if dest == "source/" else rest)
    if url.endswith(".ipynb"):
        target = (Path(nb_path).parent / url).resolve()
        return page_path(target) if target.is_relative_to(NBS) else None
    if re.match(r"^[\w\-/]+\.html$", url): return url   # nbdev's own links are relative to the site root
    return None


def source_page(py):
    "A module's source as a page with one anchor per line (#L12), the target of the 'source' links."
    lines = Path(py).read_text(encoding="utf-8").splitlines()
    rows = "".join(f'<span id="L{i}"><a class="ln" href="#L{i}">{i:>5}</a>  {html.escape(l)}\n</span>' for i,
                   l in enumerate(lines, 1))
    return f"<h1>{html.escape(py.relative_to(ROOT).as_posix())}</h1><pre class=\"src\">{rows}</pre>"


def page(title, body, pages, current):
    """One HTML page; `pages` holds (page path, title, section), a section heading before its first page; links are
    relative."""
    here, links, seen = Path(current).parent.as_posix(), [], None
    rel = lambda p: os.path.relpath(p, here)
    for dest, t, sec in pages:
        if sec and sec != seen: links.append(f'<div class="section">{html.escape(sec)}</div>')
        seen = sec
        links.append(f'<a href="{rel(dest)}" class="{"cur" if dest == current else ""}">{html.escape(t)}</a>')
    search = (f'<input id="q" type="search" placeholder="Search" aria-label="Search the docs"><div id="hits"></div>'
              f'<script src="{rel("search.js")}"></script>')
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)} - '
            'cxr_audit</title><meta name="viewport" '
            f'content="width=device-width,initial-scale=1"><style>{CSS}</style></head><body><div class="layout"><nav '
            'class="side"><div '
            f'class="brand">cxr_audit</div>{search}{"".join(links)}</nav><main>{body}</main></div></body></html>\n')


def render_page(path, out, strict=True):
    "Execute one notebook and write its page; returns (ok, traceback)."
    pages = [(d, t, s) for _, d, t, s in site_pages()]
    ok, nb, tb = execute(path, strict=strict)
    if not ok: return False, tb
    title = next(t for d, t, _ in pages if d == page_path(path))
    dest = Path(out) / page_path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    try: body = localize(body_html(to_node(nb, [] if strict else missing_optional(path))), path)
    except Exception: return False, traceback.format_exc()
    dest.write_text(page(title, body, pages, page_path(path)), encoding="utf-8")
    return True, ""


def write_site_files(out):
    "What every page links to besides the pages: the modules' source pages and the search script."
    pages = [(d, t, s) for _, d, t, s in site_pages()]
    for py in sorted((ROOT / "cxr_audit").glob("*.py")):
        dest = Path(out) / "source" / f"{py.name}.html"
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(page(py.name, source_page(py), pages, f"source/{py.name}.html"), encoding="utf-8")
    fix_anchors(out)
    (Path(out) / "search.js").write_text(search_js(out, pages), encoding="utf-8")


_ID = re.compile(r'\bid="([^"]+)"')
_FRAGMENT_LINK = re.compile(r'href="([^"#]*)#([^"]*)"')


def _anchor_for(frag, have):
    "The id of `have` a broken fragment meant: the same name in another case, or the class of a `Class.method` name."
    lower = {i.lower(): i for i in have}
    for cand in (frag, frag.split(".")[0]):
        if cand.lower() in lower: return lower[cand.lower()]
    return None


def _fixed_links(text, page, ids):
    "The page's text with its broken #fragments mended (see `fix_anchors`), and how many were."
    changed = 0
    def fix(m):
        nonlocal changed
        path, frag = m.group(1), unquote(m.group(2))
        if re.match(r"^[a-z][a-z0-9+.-]*:", path) or path.startswith("//"): return m.group(0)   # another site
        have = ids.get((page.parent / unquote(path)).resolve() if path else page.resolve())
        if have is None or frag in have: return m.group(0)
        changed += 1
        new = _anchor_for(frag, have)
        return f'href="{path}#{new}"' if new else f'href="{path or "#"}"'
    return _FRAGMENT_LINK.sub(fix, text), changed


def fix_anchors(out):
    """Every internal link's #fragment made to name an id of its target page: nbdev writes symbol links in lower case
    (`core.html#inputerror`) where the page's id keeps the symbol's case, and links methods and private names that have
    no anchor of their own; those go to the class, or to the top of the page. Returns how many links were changed."""
    files = sorted(Path(out).rglob("*.html"))
    ids = {f.resolve(): set(_ID.findall(f.read_text(encoding="utf-8"))) for f in files}
    total = 0
    for f in files:
        text = f.read_text(encoding="utf-8")
        fixed, n = _fixed_links(text, f, ids)
        if n: f.write_text(fixed, encoding="utf-8"); total += n
    return total


def _plain(fragment_html):
    "Text of an HTML fragment: tags, the pilcrow of heading links and white space runs removed."
    text = html.unescape(re.sub(r"<[^>]+>", " ", fragment_html)).replace("\u00b6", "")
    return re.sub(r"\s+", " ", text).strip()


def search_js(out, pages):
    """A search box that works from file:// (the index is inline in the script: no fetch): page titles, headings,
    symbols, and the text under each heading (its first 2,000 characters)."""
    idx = []
    for dest, title, _ in pages:
        f = Path(out) / dest
        page_html = f.read_text(encoding="utf-8") if f.exists() else ""
        parts = re.split(r"(<h[1-4][^>]*id=\"[^\"]+\"[^>]*>.*?</h[1-4]>)", page_html, flags=re.S)
        heads = []
        for k in range(1, len(parts), 2):
            hid = re.search(r'id="([^"]+)"', parts[k]).group(1)
            body = " ".join(_plain(x) for x in re.findall(r"<(?:p|li|td)\b[^>]*>(.*?)</(?:p|li|td)>", parts[k + 1],
                                                          flags=re.S))
            heads.append([hid, _plain(parts[k]), body[:2000].lower()])
        idx.append([dest, title, heads])
    return ("const IDX=" + json.dumps(idx) + ";\n" + SEARCH_JS)


SEARCH_JS = r"""(function(){const q=document.getElementById('q'),out=document.getElementById('hits');if(!q)return;
const root=document.currentScript.src.replace(/search\.js$/,'');
q.addEventListener('input',function(){
const t=q.value.trim().toLowerCase();out.innerHTML='';if(t.length<2)return;let n=0;
for(const [p,title,hs] of IDX){
if(title.toLowerCase().includes(t)){out.insertAdjacentHTML('beforeend','<a href="'+root+p+'">'+title+'</a>');n++;}
for(const [id,h,body] of hs){if(n>=30)return;
if(h.toLowerCase().includes(t)||body.includes(t)){const a=document.createElement('a');a.href=root+p+'#'+id;
a.textContent=h+' ('+title+')';out.appendChild(a);n++;}}}});})();
"""


def render(out, strict=True):
    "Every page, then the source pages and the search index; stops with the list of notebooks that failed."
    out = Path(out); out.mkdir(parents=True, exist_ok=True)
    failed = []
    for p, dest, _, _ in site_pages():
        ok, tb = render_page(p, out, strict=strict)
        if ok: print(f"render_docs: wrote {out.name}/{dest}", flush=True)
        else: failed.append(p.name); print(f"render_docs: {p.name} failed:\n{tb}", file=sys.stderr)
    write_site_files(out)
    if failed: raise SystemExit(f"render_docs: {len(failed)} notebook(s) failed: {', '.join(failed)}")


def readme(dest):
    "README.md from nbs/index.ipynb: markdown cells as they are, code cells as python blocks."
    nb = json.loads((NBS / "index.ipynb").read_text())
    parts = ["<!-- Generated from nbs/index.ipynb by `make readme`; edit the notebook, not this file. -->"]
    for c in nb["cells"]:
        src = "".join(c["source"]).strip()
        if c["cell_type"] == "markdown":
            parts.append(re.sub(r"\]\(((?:[\w\-]+/)*[\w\-]+\.ipynb)\)", r"](nbs/\1)", src))
        elif src and not src.startswith("#| hide"):
            parts.append("```python\n" + "\n".join(l for l in src.splitlines() if not l.startswith("#|")) + "\n```")
    dest.write_text("\n\n".join(parts) + "\n", encoding="utf-8")
    print(f"render_docs: wrote {dest.name}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "_docs"), help="output folder for the HTML pages")
    ap.add_argument("--readme", action="store_true", help="write README.md from nbs/index.ipynb and stop")
    ap.add_argument("--lenient", action="store_true", help="render pages whose optional packages (torch) are missing, "
                    "with a note in place of the cells that need them")
    a = ap.parse_args()
    readme(ROOT / "README.md") if a.readme else render(Path(a.out).resolve(), strict=not a.lenient)
