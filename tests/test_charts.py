"""Charts a reviewer reads at a glance (issue 21): every chart of the demo report, rendered to a Vega scenegraph offline
(vl-convert), has no axis or legend label that reads like another one of the same axis/legend, no label cut with "…",
no empty facet, and one colour per system across all charts. The charts are captured while the real `run_demo` writes
its report (a spy on the renderer the report uses; nothing is mocked)."""
import re
import xml.etree.ElementTree as ET

import pandas as pd
import pytest
import vl_convert as vlc

from cxr_audit import audit
from cxr_audit.core import CONFIG_SEP, PALETTE, chart_svg, system_color, system_colors, use_system_colors

SVG = "{http://www.w3.org/2000/svg}"


# ---- reading a rendered chart --------------------------------------------------------------------------------------

def nodes(n, role=None):
    "Every scenegraph mark (a dict with `marktype`) under `n`, optionally only those with this role."
    if isinstance(n, list):
        for x in n: yield from nodes(x, role)
    elif isinstance(n, dict):
        if n.get("marktype") and (role is None or n.get("role") == role): yield n
        for v in n.values():
            if isinstance(v, (dict, list)): yield from nodes(v, role)


def texts(mark) -> list[str]:
    "The strings a text mark draws (a multi-line label is joined)."
    return [" ".join(t) if isinstance(t, list) else str(t)
            for t in (it.get("text", "") for it in mark.get("items", []))]


def _svg_texts(el) -> list[str]:
    "The label strings under an SVG element, one per <text> (tspans joined)."
    return [" ".join("".join(t.itertext()).split()) for t in el.iter(f"{SVG}text")]


def label_problems(svg: str) -> list[str]:
    "Axis and legend labels, as rendered to SVG, that repeat within one axis/legend, or are cut with an ellipsis."
    root, out = ET.fromstring(svg), []
    groups = [g for g in root.iter(f"{SVG}g") if "role-axis-label" in g.get("class", "")]
    groups += [g for g in root.iter(f"{SVG}g") if g.get("class", "").endswith("role-legend")]
    for g in groups:
        labels = _svg_texts(g) if "axis" in g.get("class") else [t for x in g.iter(f"{SVG}g")
                                                                  if "role-legend-label" in x.get("class", "")
                                                                 for t in _svg_texts(x)]
        out += [f"label cut: {t!r}" for t in labels if "…" in t or t.endswith("...")]
        dup = sorted({t for t in labels if t and labels.count(t) > 1})
        out += [f"labels read the same: {dup}"] if dup else []
    return out


def legend_colors(sg) -> dict[str, str]:
    "Legend label -> the colour of its symbol."
    out = {}
    for entry in nodes(sg, "legend-entry"):
        for scope in nodes(entry, "scope"):
            for row in scope.get("items", []):
                sym = [it for m in nodes(row, "legend-symbol") for it in m.get("items", [])]
                lab = [t for m in nodes(row, "legend-label") for t in texts(m)]
                if sym and lab: out[lab[0]] = sym[0].get("fill") or sym[0].get("stroke")
    return out


def scale_colors(spec) -> dict[str, str]:
    "Name -> colour of every colour encoding in the spec with an explicit domain and range."
    out = {}
    def walk(o):
        if isinstance(o, dict):
            c = o.get("color")
            if isinstance(c, dict) and isinstance(c.get("scale"), dict) and isinstance(c["scale"].get("range"), list) \
                    and isinstance(c["scale"].get("domain"), list):
                out.update(zip(map(str, c["scale"]["domain"]), c["scale"]["range"]))
            for v in o.values(): walk(v)
        elif isinstance(o, list):
            for v in o: walk(v)
    walk(spec)
    return out


def empty_facets(sg) -> list[str]:
    "Facet cells without marks, and axes of a wrapped facet drawn under no cell (an empty grid slot)."
    cells = [it for g in nodes(sg, "scope") if g.get("name") == "cell" for it in g.get("items", [])]
    out = [f"empty cell at x={c.get('x')}, y={c.get('y')}" for c in cells
           if not any(m.get("items") for m in nodes(c, "mark"))]
    for footer in (g for g in nodes(sg, "column-footer")):
        for it in footer.get("items", []):
            below = [c for c in cells if abs(c.get("x", 0) - it.get("x", 0)) < 1 and c.get("y", 0) < it.get("y", 0)
                     and it.get("y", 0) - (c.get("y", 0) + c.get("height", 0)) < 60]
            if not below: out.append(f"an axis under an empty grid slot at x={it.get('x')}")
    return out


def color_clashes(charts: list[tuple]) -> list[str]:
    """Names of systems/configurations shown in two colours across charts (a bare system follows its first
    configuration)."""
    seen: dict[str, set] = {}
    for _, spec, sg, *_ in charts:
        for name, col in {**scale_colors(spec), **legend_colors(sg)}.items():
            seen.setdefault(name, set()).add(str(col).upper())
    configs = sorted(n for n in seen if CONFIG_SEP in n)
    for n in list(seen):
        first = next((c for c in configs if c.split(CONFIG_SEP, 1)[0] == n), None)
        if first: seen[n] = seen[n] | seen[first]
    return [f"{n}: {sorted(c)}" for n, c in seen.items() if len(c) > 1
            and (CONFIG_SEP in n or any(x.startswith(n + CONFIG_SEP) for x in configs))]


# ---- the demo report's charts --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """A small real demo report: its HTML and (title, spec, scenegraph, svg) of every chart in it (drawn during the run
    or at the end)."""
    drawn = []
    real_svg, real_submit = audit.chart_svg, audit.submit_chart
    def spy_svg(chart):
        svg = real_svg(chart); drawn.append((chart.to_dict(), svg)); return svg
    def spy_submit(pool, chart):
        future = real_submit(pool, chart); drawn.append((chart.to_dict(), future)); return future
    mp = pytest.MonkeyPatch(); mp.setattr(audit, "chart_svg", spy_svg); mp.setattr(audit, "submit_chart", spy_submit)
    try: paths = audit.run_demo(tmp_path_factory.mktemp("demo"), n_patients=16, reps=20)
    finally: mp.undo()
    seen = []
    for spec, svg in drawn:
        t = spec.get("title", "")
        seen.append((t.get("text", "") if isinstance(t, dict) else str(t), spec, vlc.vegalite_to_scenegraph(spec),
                     svg if isinstance(svg, str) else svg.result()))
    assert len(seen) >= 15
    return paths["report"].read_text(encoding="utf-8"), seen


@pytest.fixture(scope="module")
def demo_charts(demo_run): return demo_run[1]


def test_every_table_with_an_estimate_says_which_metric(demo_run):
    tables = re.findall(r"<table.*?</table>", demo_run[0], flags=re.S)
    heads = [re.findall(r"<th>(.*?)</th>", t.split("</thead>")[0]) for t in tables]
    assert heads and all("" not in h for h in heads), "a table has a header cell with no name"
    bad = [h for h in heads if "estimate" in h and "metric" not in h]
    assert not bad, bad


def test_no_label_of_a_chart_is_cut_or_repeated(demo_charts):
    bad = {t: p for t, _, _, svg in demo_charts if (p := label_problems(svg))}
    assert not bad, bad


def test_no_chart_has_an_empty_facet(demo_charts):
    bad = {t: p for t, _, sg, _ in demo_charts if (p := empty_facets(sg))}
    assert not bad, bad


def test_every_system_has_one_colour_across_the_report(demo_charts):
    assert not color_clashes(demo_charts), color_clashes(demo_charts)
    names = {n for _, spec, sg, _ in demo_charts for n in {**scale_colors(spec), **legend_colors(sg)}}
    assert {"sim-template+K50", "sim-omit+B4"} <= names   # the check saw the systems' colours


def test_no_two_entries_of_one_legend_share_a_colour(demo_charts):
    bad = {}
    for t, _, sg, _ in demo_charts:
        for entry in nodes(sg, "legend-entry"):
            cols = [str(it.get("fill") or it.get("stroke")).upper() for m in nodes(entry, "legend-symbol")
                    for it in m.get("items", [])]
            if len(set(cols)) < len(cols): bad[t] = cols
    assert not bad, bad   # e.g. the 12 ReRef variations drawn with the 8 theme colours


# ---- the checks catch what they claim to (old behaviour rebuilt on small charts) ----------------------------------

def _sg(chart): return chart.to_dict(), vlc.vegalite_to_scenegraph(chart.to_dict())


def test_the_checks_catch_a_cut_label_an_empty_facet_and_a_second_colour():
    import altair as alt
    d = pd.DataFrame({"system": ["sim-omit+B4 − sim-template+B4", "sim-omit+B4 − sim-template+K50"], "v": [1, 2]})
    cut = alt.Chart(d).mark_bar().encode(y=alt.Y("system:N", axis=alt.Axis(labelLimit=120)), x="v:Q")
    found = label_problems(chart_svg(cut))   # the old forest plot: two comparisons cut to "sim-omit+B4 − sim-temp…"
    assert any("cut" in p for p in found) and any("read the same" in p for p in found)
    assert not label_problems(chart_svg(alt.Chart(d).mark_bar().encode(y=alt.Y("system:N", axis=alt.Axis(labelLimit=0)),
                                                                       x="v:Q")))
    facets = pd.DataFrame({"system": list("abcde"), "v": range(5)})
    wrapped = alt.Chart(facets).mark_bar().encode(x="v:Q").facet(facet="system:N", columns=3)  # the old per-label chart
    assert empty_facets(_sg(wrapped)[1])
    assert not empty_facets(_sg(wrapped.resolve_axis(x="independent"))[1])
    a = pd.DataFrame({"system": ["sim-a+B4", "sim-b+B4"], "v": [1, 2]})
    old = [("", *_sg(alt.Chart(a).mark_bar().encode(x="v:Q", y="system:N", color="system:N"))),
           ("", *_sg(alt.Chart(a.iloc[1:]).mark_bar().encode(x="v:Q", y="system:N", color="system:N")))]
    assert color_clashes(old)   # the default scale gives sim-b+B4 the first colour once it is alone
    with use_system_colors(system_colors(a.system)):
        new = [("", *_sg(alt.Chart(x).mark_bar().encode(x="v:Q", y="system:N", color=system_color("system", x.system))))
               for x in (a, a.iloc[1:])]
    assert not color_clashes(new) and legend_colors(new[1][2]) == {"sim-b+B4": PALETTE[1]}


def test_a_facet_one_row_high_shows_its_name_above_it_unturned():
    """Row labels of faceted charts sit above their facet, horizontal: a one-bar facet cannot squeeze its name into its
    height."""
    from cxr_audit.stats import plot_forest
    df = pd.DataFrame({"metric": ["cider", "chexpert_f1_5", "chexpert_f1_5"], "first": "a", "second": ["b", "b", "c"],
                       "estimate": [0.1, 0.2, -0.1], "ci_low": [0, 0.1, -0.2], "ci_high": [0.2, 0.3, 0.0],
                       "p_holm": [0.01, 0.02, 0.3], "significant": [True, True, False]})
    labels = re.findall(r'<text([^>]*)>(cider|chexpert_f1_5)</text>', chart_svg(plot_forest(df)))
    assert len(labels) == 2 and not any("rotate" in attrs for attrs, _ in labels)
