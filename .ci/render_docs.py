#!/usr/bin/env python3
"""Offline docs renderer: the fallback for `make docs` on machines without Quarto.

Each notebook in nbs/ is executed in-process (execnb), passed through nbdev's own docs processors
(hidden cells removed, `show_doc` tables added, directives stripped), converted to HTML with
nbconvert's `basic` template and wrapped in a page with a sidebar. Figures are inline SVG/PNG and
the pages load nothing from the network. `--readme` writes README.md from nbs/index.ipynb instead.
"""
import argparse
import html
import json
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NBS = ROOT / "nbs"

CSS = """
body{margin:0;font-family:system-ui,-apple-system,'Segoe UI',Roboto,Helvetica,Arial,sans-serif;color:#1d1d1f;line-height:1.5}
.layout{display:flex;min-height:100vh}nav.side{width:230px;flex:none;background:#f5f6f8;padding:20px 16px;border-right:1px solid #e2e2e2}
nav.side a{display:block;color:#0b5cad;text-decoration:none;padding:3px 0}nav.side a.cur{font-weight:700;color:#111}
nav.side .section{margin-top:14px;font-weight:700;color:#555;text-transform:uppercase;font-size:.8em}
nav.side .brand{font-size:1.2em;font-weight:700;margin-bottom:12px;color:#111}
main{flex:1;max-width:980px;padding:24px 40px 80px;overflow-x:auto}
pre{background:#f6f8fa;padding:10px 12px;border-radius:6px;overflow-x:auto;font-size:.88em}
code{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
.jp-OutputArea-output pre{background:#fff;border-left:3px solid #f0b08a}
table{border-collapse:collapse;font-size:.9em;margin:8px 0}th,td{border-bottom:1px solid #e5e5e5;padding:3px 8px;text-align:left}
blockquote{color:#555;font-style:italic;font-size:1.15em;margin-left:0;padding-left:12px;border-left:3px solid #ddd}
svg{max-width:100%;height:auto}img{max-width:100%}
"""


SECTIONS = {"papers": "Papers"}   # sub-folders of nbs/ rendered as a sidebar section of their own


def notebooks():
    "The modules' notebooks (index first), then each section's (nbs/papers/: the paper notebooks)."
    nbs = sorted(p for p in NBS.glob("*.ipynb") if not p.name.startswith("_"))
    subs = [p for d in SECTIONS for p in sorted((NBS / d).glob("*.ipynb")) if not p.name.startswith("_")]
    return sorted(nbs, key=lambda p: (p.stem != "index", p.name)) + subs


def section_of(path):
    "The sidebar section of a notebook (None for the modules)."
    return SECTIONS.get(path.parent.name) if path.parent != NBS else None


def title_of(nb):
    for c in nb["cells"]:
        if c["cell_type"] == "markdown":
            m = re.search(r"^#\s+(.+)$", "".join(c["source"]), re.M)
            if m: return m.group(1).strip()
    return None


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


def execute_and_process(path):
    "Run the notebook, then apply nbdev's docs processors; return an nbformat node ready for nbconvert."
    import nbformat
    from execnb.nbio import nb2str, read_nb
    from execnb.shell import CaptureShell
    from fastcore.xtras import working_directory
    from nbdev.processors import FilterDefaults
    nb = read_nb(path)
    shell = CaptureShell(path)
    with working_directory(path.parent):
        shell.run_all(nb, exc_stop=True)
    FilterDefaults()(nb)
    node = nbformat.reads(nb2str(nb), as_version=4)
    cells = []
    for c in node.cells:
        c.metadata.pop("execution", None)
        if c.cell_type == "raw" and c.source.lstrip().startswith("---"):
            cells.append(nbformat.v4.new_markdown_cell(_frontmatter_md(c.source))); continue
        if c.cell_type != "code": cells.append(c); continue
        d = _directives(c.source)
        if d.get("include") == "false": continue
        c.source = "\n".join(l for l in c.source.splitlines() if not l.lstrip().startswith("#|")).strip()
        tags = set(c.metadata.get("tags", []))
        if d.get("echo") == "false" or not c.source: tags.add("remove_input")
        if d.get("output") == "false": tags.add("remove_output")
        c.metadata["tags"] = sorted(tags)
        for o in c.get("outputs", []):
            md = o.get("data", {}).get("text/markdown")
            if md is not None:  # pandoc attributes ({target=...}, {#id}) mean nothing outside Quarto
                o["data"]["text/markdown"] = re.sub(r"\{(?:target|#|\.)[^}\n]*\}", "", "".join(md))
        if c.source or c.get("outputs"): cells.append(c)
    node.cells = cells
    return node


def body_html(node):
    from nbconvert import HTMLExporter
    from traitlets.config import Config
    cfg = Config({"TagRemovePreprocessor": {"enabled": True, "remove_input_tags": ["remove_input"],
                                            "remove_all_outputs_tags": ["remove_output"]}})
    exp = HTMLExporter(config=cfg, template_name="basic", exclude_input_prompt=True, exclude_output_prompt=True)
    body, _ = exp.from_notebook_node(node)
    # pages are written flat, so a link into or out of a section folder (papers/x.ipynb, ../x.ipynb) goes to x.html
    return re.sub(r'href="(?:\.\./|[\w\-]+/)*([\w\-]+)\.ipynb(#[^"]*)?"', lambda m: f'href="{m.group(1)}.html{m.group(2) or ""}"', body)


def page(title, body, pages, current):
    "One HTML page; `pages` holds (stem, title) or (stem, title, section), a section heading before its first page."
    links, seen = [], None
    for stem, t, *sec in pages:
        sec = sec[0] if sec else None
        if sec and sec != seen: links.append(f'<div class="section">{html.escape(sec)}</div>')
        seen = sec
        links.append(f'<a href="{stem}.html" class="{"cur" if stem == current else ""}">{html.escape(t)}</a>')
    links = "".join(links)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)} - cxr_audit</title>'
            f'<meta name="viewport" content="width=device-width,initial-scale=1"><style>{CSS}</style></head><body>'
            f'<div class="layout"><nav class="side"><div class="brand">cxr_audit</div>{links}</nav>'
            f'<main>{body}</main></div></body></html>\n')


def render(out):
    out.mkdir(parents=True, exist_ok=True)
    nbs = notebooks()
    pages = [(p.stem, title_of(json.loads(p.read_text())) or p.stem, section_of(p)) for p in nbs]
    failed = []
    for p, (stem, title, _) in zip(nbs, pages):
        try: body = body_html(execute_and_process(p))
        except Exception as e:
            failed.append(p.name); print(f"render_docs: {p.name} failed: {type(e).__name__}: {e}", file=sys.stderr); continue
        (out / f"{stem}.html").write_text(page(title, body, pages, stem), encoding="utf-8")
        print(f"render_docs: wrote {out.name}/{stem}.html")
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
    a = ap.parse_args()
    os.environ.setdefault("IN_TEST", "")
    readme(ROOT / "README.md") if a.readme else render(Path(a.out).resolve())
