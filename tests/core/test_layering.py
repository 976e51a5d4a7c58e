"""Layering: the core imports no builtin, plugins reach the core only through gage_eval.api.

Two checks: import-linter's contracts in pyproject.toml (``lint-imports``: the core's parts in
layers, cli over engine over tasks | runfolder over config | plugins over api; the api imports
nothing else of gage_eval; the engine never imports the CLI; core -> builtin forbidden,
builtin -> core internals protected, builtins never import the plugin manager, no import cycle
between the core's parts or their modules; indirect imports counted everywhere), and a plain ``ast`` walk of every builtin and
example-plugin module that fails on any ``gage_eval.<x>`` import other than ``gage_eval.api``.
"""
from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import gage_eval.api as api

ROOT = Path(__file__).resolve().parents[2]
PLUGIN_DIRS = [ROOT / "gage_plugins_builtin", ROOT / "examples" / "gage-eval-plugin-example"]

# Known exceptions, each with the change that removes it; none are left (the commands moved into
# the core CLI and legal_eval_v1's rules into gage_plugins_builtin/legal with the schema hook).
# Also listed as ignore_imports in pyproject's [tool.importlinter]. None: any gage_eval module.
KNOWN: dict[str, set[str] | None] = {}


def core_imports(source: str) -> list[tuple[int, str, list[str]]]:
    """Every import of a ``gage_eval`` module in ``source`` (top level or inside a function):
    (line, module, names imported from it)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "gage_eval" or node.module.startswith("gage_eval."):
                found.append((node.lineno, node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "gage_eval" or alias.name.startswith("gage_eval."):
                    found.append((node.lineno, alias.name, []))
    return sorted(found)


def api_violations(source: str, allowed: set[str] | None = frozenset()) -> list[str]:
    """``line: module`` for each core import other than ``from gage_eval.api import ...``
    (``allowed``: modules excused; None excuses every one)."""
    bad = []
    for line, module, _names in core_imports(source):
        if module == "gage_eval.api":
            continue
        if allowed is None or module in allowed:
            continue
        bad.append(f"{line}: {module}")
    return bad


def plugin_modules() -> list[Path]:
    return sorted(p for d in PLUGIN_DIRS for p in d.rglob("*.py") if "build" not in p.relative_to(d).parts)


def test_checker_flags_internal_imports():
    source = ("from gage_eval.api import Backend\n"
              "from gage_eval import hookimpl\n"
              "import gage_eval.api.sample\n"
              "def f():\n    from gage_eval.plugins import load_plugins\n"
              "import gage_eval.api\n")
    assert api_violations(source) == ["2: gage_eval", "3: gage_eval.api.sample", "5: gage_eval.plugins"]
    assert api_violations(source, {"gage_eval.plugins"}) == ["2: gage_eval", "3: gage_eval.api.sample"]
    assert api_violations("from gage_eval.api import hookimpl\nimport gage_eval_plugin_example\n") == []


def test_builtins_and_example_import_only_the_api():
    modules = plugin_modules()
    assert len(modules) > 20, modules
    problems = []
    for path in modules:
        rel = path.relative_to(ROOT).as_posix()
        found = api_violations(path.read_text(encoding="utf-8"), KNOWN.get(rel, frozenset()))
        problems += [f"{rel}:{where}" for where in found]
    assert not problems, ("import these from gage_eval.api (add the name to its __all__ if it is "
                          "missing):\n" + "\n".join(problems))


def test_api_declares_what_plugins_import():
    assert len(set(api.__all__)) == len(api.__all__), "a name twice in gage_eval.api.__all__"
    assert [n for n in api.__all__ if not hasattr(api, n)] == []
    assert (api.__doc__ or "").startswith("The stable plugin API")
    used = set()
    for path in plugin_modules():
        for _line, module, names in core_imports(path.read_text(encoding="utf-8")):
            if module == "gage_eval.api":
                used.update(names)
    assert used, "no plugin module imports gage_eval.api"
    assert sorted(used - set(api.__all__)) == [], "imported from gage_eval.api but not in its __all__"


def test_import_linter_contracts():
    pytest.importorskip("importlinter", reason="import-linter is not installed (pip install -e '.[test]')")
    exe = Path(sys.executable).with_name("lint-imports")
    command = str(exe) if exe.exists() else shutil.which("lint-imports")
    if command is None:
        pytest.skip("the lint-imports command is not on PATH")
    done = subprocess.run([command, "--no-cache", "--config", str(ROOT / "pyproject.toml")], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def test_no_core_function_is_over_60_lines():
    """Issue 13's bound on the core (gage_eval/): a function that grows past 60 lines is split."""
    long = []
    for path in sorted((ROOT / "gage_eval").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > 60:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "core functions over 60 lines: " + "; ".join(long)


def test_engine_is_under_300_lines():
    lines = (ROOT / "gage_eval" / "engine" / "loop.py").read_text(encoding="utf-8").count("\n")
    assert lines < 300, f"gage_eval/engine/loop.py has {lines} lines; move a stage out (issue 13: under 300)"


def test_core_parts_are_subpackages_with_a_docstring():
    """Issue 24: the core is a few named parts, each saying what it holds; no loose modules but
    the plugin manager and the package's own __init__."""
    parts = sorted(p.parent.name for p in (ROOT / "gage_eval").glob("*/__init__.py"))
    assert parts == ["api", "cli", "config", "engine", "runfolder", "tasks"], parts
    loose = sorted(p.name for p in (ROOT / "gage_eval").glob("*.py"))
    assert loose == ["__init__.py", "plugins.py"], loose
    for part in parts:
        doc = ast.get_docstring(ast.parse((ROOT / "gage_eval" / part / "__init__.py").read_text(encoding="utf-8")))
        assert doc and len(doc) > 80, f"gage_eval/{part}/__init__.py: a paragraph saying what the part holds"
