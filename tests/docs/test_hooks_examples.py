"""docs/hooks.md's examples run (issue 24): they import gage-eval only through ``gage_eval.api``,
and registered as plugins into the real plugin manager they register what they say and evaluate.

The page is read as one plugin package, ``mypkg``: every ```python block runs in page order in one
namespace (a registrar may name a class a later section defines, as ``YesNoJudge``), then each
block that implements hooks is its own plugin (two blocks may both implement a hook) whose other
names are the page's. A new block must run the same way: import what it uses, define what it
names, use only names of ``gage_eval.api.__all__``.
"""
from __future__ import annotations

import ast
import json
import re
import sys
import types
from pathlib import Path

import click
import pytest

import gage_eval.api as api

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "hooks.md").read_text(encoding="utf-8")
BLOCKS = [(DOC.count("\n", 0, m.start()) + 2, m.group(1))
          for m in re.finditer(r"^```python\n(.*?)^```", DOC, re.MULTILINE | re.DOTALL)]
IMPL_MARK = "gage_eval_impl"  # the attribute pluggy's HookimplMarker("gage_eval") sets

TASK = """\
name: mypkg_qa
dataset: {loader: mypkg/csv, args: {path: rows.csv}}
preprocessor: {name: mypkg/qa}
request: {kind: generate, prompt: prompt.jinja}
judge: {name: mypkg/yes_no}
metrics: [mypkg/word_count, exact_match]
"""
ROWS = "id,question,answer\nq1,What is two and two?,four\nq2,Name a colour.,red\n"


def test_the_page_has_its_examples():
    assert len(BLOCKS) >= 15, [line for line, _ in BLOCKS]
    hooks = {m for _, code in BLOCKS for m in re.findall(r"^def (gage_\w+)\(", code, re.MULTILINE)}
    assert {"gage_register_loaders", "gage_register_backends", "gage_register_writers", "gage_run_end"} <= hooks


@pytest.mark.parametrize("line", [line for line, _ in BLOCKS])
def test_block_imports_gage_eval_only_through_the_api(line):
    code = dict(BLOCKS)[line]
    tree = ast.parse(code, filename=f"docs/hooks.md:{line}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bad = [a.name for a in node.names if a.name.split(".")[0] == "gage_eval"]
            assert not bad, f"docs/hooks.md:{line + node.lineno - 1}: import {bad[0]}: use from gage_eval.api import ..."
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "gage_eval":
            assert node.module == "gage_eval.api", (f"docs/hooks.md:{line + node.lineno - 1}: from {node.module} "
                                                    f"import ...: the examples import gage_eval.api alone")
            unknown = [a.name for a in node.names if a.name not in api.__all__]
            assert not unknown, f"docs/hooks.md:{line + node.lineno - 1}: {unknown} are not names of gage_eval.api"


def _page(folder: Path, monkeypatch) -> types.ModuleType:
    """Every block run in page order in one module, ``mypkg`` (also ``mypkg.backend``), whose file
    lies in ``folder`` (the examples find their tasks and schemas beside it)."""
    page = types.ModuleType("mypkg")
    page.__file__ = str(folder / "__init__.py")
    monkeypatch.setitem(sys.modules, "mypkg", page)
    monkeypatch.setitem(sys.modules, "mypkg.backend", page)
    for line, code in BLOCKS:
        exec(compile(code, f"docs/hooks.md:{line}", "exec"), page.__dict__)  # noqa: S102 (the page's own examples)
    return page


def _block_plugins(page: types.ModuleType) -> dict[str, types.ModuleType]:
    """One plugin per block that implements hooks: the page's other names, the block's own hooks."""
    shared = {k: v for k, v in vars(page).items() if not hasattr(v, IMPL_MARK)}
    out = {}
    for line, code in BLOCKS:
        module = types.ModuleType(f"mypkg_l{line}")
        vars(module).update(shared)
        exec(compile(code, f"docs/hooks.md:{line}", "exec"), vars(module))  # noqa: S102
        if any(hasattr(v, IMPL_MARK) for v in vars(module).values()):
            out[f"hooksdoc:{line}"] = module
    return out


def _registered_by(registry, kind: str, plugin: str) -> list | None:
    """What ``plugin`` registered of ``kind`` (None: a kind the registry keeps no table of)."""
    table = getattr(registry, kind, None)
    if table is None:
        return None
    entries = table.values() if isinstance(table, dict) else table
    return [e for e in entries if (e[0] if isinstance(e, tuple) else getattr(e, "plugin", None)) == plugin]


@pytest.fixture
def doc_plugins(tmp_path, monkeypatch, fresh_plugins):
    folder = tmp_path / "mypkg"
    task = folder / "tasks" / "mypkg_qa"
    task.mkdir(parents=True)
    (task / "task.yaml").write_text(TASK)
    (task / "prompt.jinja").write_text("Answer briefly: {{ question }}")
    (task / "rows.csv").write_text(ROWS)
    plugins = _block_plugins(_page(folder, monkeypatch))
    registry = None
    for name, module in plugins.items():
        registry = fresh_plugins.register_plugin(module, name)
    pm, _ = fresh_plugins.load_plugins()
    pm.check_pending()  # every hook an example implements is a hookspec
    return plugins, registry


def test_each_registrar_example_registers_what_it_says(doc_plugins):
    plugins, registry = doc_plugins
    checked = []
    for name, module in plugins.items():
        for hook in (n for n in vars(module) if n.startswith("gage_register_") and hasattr(vars(module)[n], IMPL_MARK)):
            kind = hook.removeprefix("gage_register_")
            if kind == "commands":
                group = click.Group("gage-eval")
                vars(module)[hook](cli=group)
                assert group.commands, f"{name}: gage_register_commands added no command"
                continue
            found = _registered_by(registry, kind, name)
            if found is not None:
                assert found, f"{name}: {hook} registered nothing"
                checked.append(kind)
    assert {"loaders", "preprocessors", "backends", "judges", "metrics", "writers", "schemas",
            "task_paths"} <= set(checked), checked


def test_the_examples_evaluate_a_task_together(doc_plugins, run_cli, tmp_path):
    out = tmp_path / "runs"
    result = run_cli("--tasks", "mypkg_qa", "--model", "mypkg/echo", "--judge-model", "dummy",
                     "--judge-args", "response=fixed,text=yes", "--writer", "mypkg/csv", "-o", out,
                     "--run-id", "r1", "-q")
    assert result.exit_code == 0, result.output
    assert "warning" not in result.output, result.output  # no example writer or observer failed
    run_dir = out / "r1"
    assert f"run r1: mypkg/echo on mypkg_qa -> {run_dir}" in result.output  # gage_run_start
    assert "mypkg_qa mypkg/word_count = " in result.output  # gage_task_done
    assert "run r1 ended with exit status 0" in result.output  # gage_run_end
    records = [json.loads(line) for line in (run_dir / "samples" / "mypkg_qa.jsonl").read_text().splitlines()]
    assert [r["id"] for r in records] == ["q1", "q2"]  # CsvLoader -> qa_rows
    assert all(r["eval_result"]["judge"]["score"] == 1.0 for r in records)  # YesNoJudge read "yes"
    assert all(r["eval_result"]["metrics"]["mypkg/word_count"]["method"] == "whitespace" for r in records)
    prompts = ("Answer briefly: What is two and two?", "Answer briefly: Name a colour.")
    assert [r["predict_result"][0]["message"]["content"][0]["text"] for r in records] == [p[-20:] for p in prompts]
    scores = (run_dir / "mypkg_qa.scores.csv").read_text().splitlines()  # ScoresCsv
    assert [row.split(",")[0] for row in scores] == ["q1", "q2"]
