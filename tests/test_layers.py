"""The architecture as tests: layering by notebook number, no private names across modules, presentation code only in
the presentation layer, short functions, and ruff over the code."""
import ast
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIB = ROOT / "cxr_audit"
PRESENTATION = {"audit", "cli"}          # the HTML report and the `cxr-audit` command
MAX_FUNCTION_LINES = 60


def module_ranks() -> dict[str, float]:
    "Module name -> notebook number (a letter suffix adds hundredths: 09a -> 9.01)."
    ranks = {}
    for nb in sorted((ROOT / "nbs").glob("*.ipynb")):
        m = re.match(r"(\d+)([a-z]?)_", nb.name)
        if not m: continue
        cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
        exp = next((d.group(1) for c in cells
                    if (d := re.search(r"^#\|\s*default_exp\s+([\w.]+)", "".join(c["source"]), re.M))), None)
        if exp: ranks[exp] = int(m.group(1)) + (ord(m.group(2)) - 96) / 100 if m.group(2) else int(m.group(1))
    return ranks


RANKS = module_ranks()


def imports(module: str) -> list[tuple[str, list[str]]]:
    "(imported cxr_audit module, imported names) for every import of `module`."
    tree = ast.parse((LIB / f"{module}.py").read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and (node.level or node.module.startswith("cxr_audit")):
            out.append((node.module.removeprefix("cxr_audit."), [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out += [(a.name.removeprefix("cxr_audit."), []) for a in node.names if a.name.startswith("cxr_audit.")]
    return out


def test_every_module_has_a_rank():
    assert {"core", "stats", "audit", "cli"} <= set(RANKS), RANKS
    assert {p.stem for p in LIB.glob("*.py")} - {"__init__", "_modidx"} == set(RANKS)


@pytest.mark.parametrize("module", sorted(RANKS))
def test_imports_only_lower_layers_and_public_names(module):
    for other, names in imports(module):
        if other not in RANKS: continue
        assert RANKS[other] < RANKS[module], f"{module} (nb {RANKS[module]}) imports {other} (nb {RANKS[other]})"
        private = [n for n in names if n.startswith("_")]
        assert not private, f"{module} imports private names {private} from {other}"


@pytest.mark.parametrize("module", sorted(set(RANKS) - PRESENTATION))
def test_analysis_modules_hold_no_presentation_code(module):
    src = (LIB / f"{module}.py").read_text(encoding="utf-8")
    tree = ast.parse(src)
    defs = [n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    assert not [d for d in defs if d.startswith("cli_") or d.endswith("_report_blocks")], (module, defs)
    assert not any(m == "argparse" for m, _ in imports(module)) and "import argparse" not in src, module
    assert not re.search(r"<(html|section|table|div)\b", src), f"{module} writes HTML"


def long_functions(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [f"{path.name}:{n.lineno} {n.name} ({n.end_lineno - n.lineno + 1} lines)" for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES]


def test_no_function_is_longer_than_60_lines():
    long = [f for p in sorted(LIB.glob("*.py")) if p.name != "_modidx.py" for f in long_functions(p)]
    assert not long, long


def test_the_length_check_can_fail(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "m.py").write_text(f"def f():\n{body}\n")
    assert long_functions(tmp_path / "m.py") == [f"m.py:1 f ({MAX_FUNCTION_LINES + 1} lines)"]


def test_ruff():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert ruff, "ruff is part of the dev extra (settings.ini dev_requirements)"
    res = subprocess.run([ruff, "check", "cxr_audit", "tests", "benchmarks", ".ci"], cwd=ROOT, capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_heavy_modules_are_imported_only_when_used():
    """Every `cxr-audit` command, side process and chart process imports the package: scipy.stats (~0.5 s) waits for
    its first use."""
    code = ("import sys, cxr_audit.audit, cxr_audit.cli; print('scipy.stats' in sys.modules); "
            "from cxr_audit.stats import spearman; spearman([1, 2, 3, 4], [1, 3, 2, 4]); print('scipy.stats' in "
            "sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True"]


# --- shape (issue 45): narrow lines, `patch` without shadowing, no module name left None -----------------------------

MAX_LINE = 120


def long_lines(path: Path) -> list[str]:
    """Lines over `MAX_LINE` characters, except nbdev's generated `__all__` statement (nbdev wraps its list at 120 and
    then puts `__all__ = ` in front, so its first line can reach 130)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    tree = ast.parse("\n".join(lines))
    generated = {i for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "__all__"
                 for i in range(n.lineno, n.end_lineno + 1)}
    return [f"{path.name}:{i}" for i, line in enumerate(lines, 1) if len(line) > MAX_LINE and i not in generated]


def test_no_module_line_is_over_120_characters():
    # ruff's E501 checks tests/, benchmarks/ and .ci/ (pyproject.toml); here the modules, where nbdev writes `__all__`
    wide = [w for p in sorted(LIB.glob("*.py")) if p.name != "_modidx.py" for w in long_lines(p)]
    assert not wide, wide


def test_the_line_check_can_fail(tmp_path):
    (tmp_path / "m.py").write_text("__all__ = ['" + "a" * 130 + "']\nx = '" + "b" * 120 + "'\n")
    assert long_lines(tmp_path / "m.py") == ["m.py:2"]


def patch_names(tree: ast.Module) -> tuple[set, set]:
    "(names of module-level functions decorated with `patch`, every other name the module binds at top level)."
    def is_patch(d): return (getattr(d, "id", None) or getattr(getattr(d, "func", None), "id", None)) == "patch"
    patched, other = set(), set()
    for n in tree.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            (patched if any(map(is_patch, n.decorator_list)) else other).add(n.name)
        elif isinstance(n, ast.ClassDef): other.add(n.name)
        elif isinstance(n, (ast.Import, ast.ImportFrom)): other |= {(a.asname or a.name).split(".")[0] for a in n.names}
        elif isinstance(n, (ast.Assign, ast.AnnAssign)):
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                other |= {x.id for x in ast.walk(t) if isinstance(x, ast.Name)}
    return patched, other


@pytest.mark.parametrize("module", sorted(RANKS))
def test_patched_methods_shadow_nothing_and_leave_no_none(module):
    import importlib
    patched, other = patch_names(ast.parse((LIB / f"{module}.py").read_text(encoding="utf-8")))
    assert not patched & other, f"{module}: methods added with @patch shadow module names {sorted(patched & other)}"
    mod = importlib.import_module(f"cxr_audit.{module}")
    none = sorted(n for n in patched if getattr(mod, n, None) is None)
    assert not none, f"{module}: names left None at module level: {none}"


def test_the_shadow_check_can_fail():
    tree = ast.parse("from x import plot\n@patch\ndef plot(self: A): pass\n@patch\ndef save(self: A): pass")
    patched, other = patch_names(tree)
    assert patched & other == {"plot"} and "save" not in other


def test_no_redefinition_is_silenced():
    silenced = [f"{p.name}:{i}" for p in sorted(LIB.glob("*.py"))
                for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if "noqa: F811" in line]
    assert not silenced, silenced


# --- wide signatures (issue 45): 10+ parameters only where they are the user's options -------------------------------

MAX_PARAMETERS = 9
CLI = "one parameter per command-line option"
RESAMPLING = "the data, then arch-style resampling options (reps, seed, clusters, size, method)"
#: every function taking 10 or more parameters (`self` not counted), and why its parameters are the user's options
WIDE_SIGNATURES = {
    "audit.run_audit": "the audit's entry point: tables, stages and report options",
    "cli.audit": f"cxr-audit audit: {CLI}",
    "cli.concentration": f"cxr-audit concentration: {CLI}",
    "cli.generate": f"cxr-audit generate: {CLI}",
    "cli.longitudinal": f"cxr-audit longitudinal: {CLI}",
    "cli.reref": f"cxr-audit reref: {CLI}",
    "cli.review_prepare": f"cxr-audit review prepare: {CLI}",
    "cli.score": f"cxr-audit score: {CLI}",
    "cli.verdict": f"cxr-audit verdict: {CLI}",
    "concentration.audit_concentration": "paper 004's audit in one call: each setting the user may change",
    "corpus.load_mimic_cxr": "MIMIC-CXR loader: the dataset's files and the user's choice of splits and reports",
    "evaluator.ReportGenerationEvaluator.__init__": "the evaluator's settings, stored as given (scikit-learn style)",
    "evaluator.score_systems": "scoring in one call: metrics, baseline, grouping and resamples the user picks",
    "generate.HFReportGenerator.__init__": "a Hugging Face model and its generation settings, stored as given",
    "generate.generate_table": "generation in one call: policies, seeds, batching and images the user picks",
    "label_audit.label_audit": "the labeler audit in one call: labels, pairs, probes and resamples the user picks",
    "llm.ChatBackend.chat": "one chat request: the decoding parameters servers accept, and the restricted-data guard",
    "llm.OpenAIChat.__init__": "the user's server: URL, key, Azure and structured-output settings",
    "llm.run_batch": "the batch runner: concurrency, retries, decoding defaults and data guards the user sets",
    "longitudinal.LLMAnnotator.__init__": "paper 003's annotator: prompt, decoding, LLM-call settings",
    "longitudinal_eval.progression_evaluation": "paper 003's evaluation in one call: each setting the user may change",
    "reref.ReRef.__init__": "the ReRef rewriter: rounds, temperatures, prompts and taxonomy, stored as given",
    "reref.rewrite_table": "ReRef over a table: the rewriter's settings and the LLM-call options",
    "reref_sensitivity.all_pairwise_gaps": f"paper 000's gaps for every dataset and metric: {RESAMPLING}",
    "reref_sensitivity.pairwise_gaps": f"paper 000's paired gaps: {RESAMPLING}",
    "reref_sensitivity.reference_sensitivity": "paper 000's analysis in one call: each setting the user may change",
    "reref_validation.prepare_reref_validation": "ReRef validation kit: sample, reviewers, strata, formats",
    "review.prepare_review": "paper 004's review kit: sample, panel, reviewers and formats the user picks",
    "review.review_analysis": "the review analysis: sheets, key, decisions, rules and resamples the user gives",
    "stats.bootstrap_distinct": f"a public bootstrap: {RESAMPLING}",
    "stats.bootstrap_metrics": f"a public bootstrap: {RESAMPLING}",
    "stats.comparison_family": f"a public bootstrap: {RESAMPLING}",
    "stats.paired_bootstrap": f"a public bootstrap: {RESAMPLING}",
    "verdict.verdict": "the verdict in one call: the checks and their thresholds are the user's options",
}


def wide_functions(path: Path) -> dict[str, int]:
    "`module.[Class.]function` -> number of parameters (`self` not counted), for those with over `MAX_PARAMETERS`."
    def walk(node, prefix):
        for n in ast.iter_child_nodes(node):
            if isinstance(n, ast.ClassDef): yield from walk(n, f"{prefix}{n.name}.")
            elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = n.args
                names = [p.arg for p in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg] if p]
                yield f"{prefix}{n.name}", len([p for p in names if p != "self"])
                yield from walk(n, f"{prefix}{n.name}.")
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {name: k for name, k in walk(tree, f"{path.stem}.") if k > MAX_PARAMETERS}


def signature_check(wide: dict, allowed: dict) -> tuple[list, list]:
    "(wide functions missing from `allowed`, listed ones that no longer take 10+ parameters)."
    return sorted(set(wide) - set(allowed)), sorted(set(allowed) - set(wide))


def test_only_entry_points_take_10_or_more_parameters():
    modules = [p for p in sorted(LIB.glob("*.py")) if p.name != "_modidx.py"]
    wide = {name: k for p in modules for name, k in wide_functions(p).items()}
    unlisted, stale = signature_check(wide, WIDE_SIGNATURES)
    assert not unlisted, (f"10+ parameters: {[f'{n} ({wide[n]})' for n in unlisted]}; group what belongs together "
                          "(a small named object), or add it to WIDE_SIGNATURES with a reason")
    assert not stale, f"in WIDE_SIGNATURES but no longer taking 10+ parameters: {stale}; remove them"
    assert all(len(reason.split()) >= 3 for reason in WIDE_SIGNATURES.values()), "each entry needs a reason"


def test_the_parameter_check_can_fail(tmp_path):
    (tmp_path / "m.py").write_text("class A:\n"
                                   "    def f(self, a, b, c, d, e, f, g, h, i): pass\n"
                                   "def g(a, b, c, d, e, f, g, h, *i, j, **k):\n"
                                   "    def h(self, *, a, b, c, d, e, f, g, h, i, j): pass\n")
    wide = wide_functions(tmp_path / "m.py")
    assert wide == {"m.g": 11, "m.g.h": 10}                          # `self` not counted; *args, **kwargs counted
    assert signature_check(wide, {"m.g": "reason", "m.A.f": "reason"}) == (["m.g.h"], ["m.A.f"])
