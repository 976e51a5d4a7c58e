"""docs/tasks.md is the way to write a task, so it is checked like code:

- its table of task.yaml keys lists exactly the property paths of schemas/task.schema.json;
- it documents every builtin loader, preprocessor, metric and judge with exactly the
  arguments its constructor takes;
- its walkthroughs run as written: the ``<!-- run -->`` blocks' commands in order in an empty
  folder, each ``<!-- file: PATH -->`` block compared with the file ``gage-eval new-task``
  wrote there (or written, when nothing wrote it: "write this file"); and once more by hand,
  the files written from the doc without new-task. The ``<!-- run: model -->`` commands load
  the default model (SmolLM2) and run in the slow test.
"""
from __future__ import annotations

import importlib
import inspect
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import gage_plugins_builtin as builtin

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "tasks.md"
SCHEMA = ROOT / "schemas" / "task.schema.json"
KEYS_SECTION = "Every task.yaml key"
COMPONENT_SECTIONS = {"Loaders": builtin.LOADERS, "Preprocessors": builtin.PREPROCESSORS,
                      "Metrics": builtin.METRICS, "Judges": builtin.JUDGES}
INJECTED = {"base_dir"}  # given by the engine (the task folder), never written in task.yaml


def doc_text() -> str:
    return DOC.read_text(encoding="utf-8")


def section(text: str, title: str, level: int) -> str:
    """The body of the heading ``title`` at ``level``, up to the next heading at that level or above."""
    lines = text.splitlines()
    fenced, in_fence = [], False
    for line in lines:  # a '# comment' line inside a code block is not a heading
        if line.startswith("```"):
            in_fence = not in_fence
        fenced.append(in_fence or line.startswith("```"))
    marker = "#" * level + " " + title
    start = next((i for i, line in enumerate(lines) if line.strip() == marker and not fenced[i]), None)
    assert start is not None, f"docs/tasks.md has no heading {marker!r}"
    end = next((i for i in range(start + 1, len(lines))
                if not fenced[i] and re.match(rf"^#{{1,{level}}} ", lines[i])), len(lines))
    return "\n".join(lines[start + 1:end])


def first_cells(body: str) -> list[str]:
    """The backticked first cell of each table row (``| `request.kind` | ...``)."""
    return re.findall(r"^\| `([^`]+)` \|", body, flags=re.M)


# -- the task.yaml keys ------------------------------------------------------------------------

def schema_paths(schema: dict, prefix: str = "") -> set[str]:
    """Every property path of a schema: nested objects dotted, list items as ``key[]``."""
    paths: set[str] = set()
    for branch in [schema] + schema.get("oneOf", []) + schema.get("anyOf", []) + schema.get("allOf", []):
        for name, sub in (branch.get("properties") or {}).items():
            path = f"{prefix}.{name}" if prefix else name
            paths.add(path)
            paths |= schema_paths(sub, path)
        if isinstance(branch.get("items"), dict):
            paths |= schema_paths(branch["items"], f"{prefix}[]")
    return paths


def test_schema_paths_are_read_recursively():
    schema = {"properties": {"a": {"properties": {"b": {"properties": {"c": {}}}}},
                             "m": {"items": {"oneOf": [{"type": "string"}, {"properties": {"n": {}}}]}}}}
    assert schema_paths(schema) == {"a", "a.b", "a.b.c", "m", "m[].n"}


def test_every_task_key_is_documented_and_nothing_else():
    documented = first_cells(section(doc_text(), KEYS_SECTION, 2))
    in_schema = schema_paths(json.loads(SCHEMA.read_text(encoding="utf-8")))
    assert "request.generation.max_new_tokens" in in_schema  # the walk reaches nested keys
    missing = sorted(in_schema - set(documented))
    extra = sorted(set(documented) - in_schema)
    assert not missing, f"keys of schemas/task.schema.json without a row in docs/tasks.md '{KEYS_SECTION}': {missing}"
    assert not extra, f"docs/tasks.md '{KEYS_SECTION}' documents keys the schema does not have: {extra}"
    assert len(documented) == len(set(documented)), "a key is documented twice"


# -- the builtin components ----------------------------------------------------------------------

def constructor_args(target: str) -> list[str]:
    module, _, attr = target.partition(":")
    params = inspect.signature(getattr(importlib.import_module(module), attr)).parameters.values()
    return [p.name for p in params if p.name not in INJECTED
            and p.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)]


def documented_components(kind: str) -> dict[str, list[str]]:
    body = section(section(doc_text(), "Builtin components", 2), kind, 3)
    parts = re.split(r"^#### `([^`]+)`\s*$", body, flags=re.M)
    return {name: first_cells(text) for name, text in zip(parts[1::2], parts[2::2])}


@pytest.mark.parametrize("kind", COMPONENT_SECTIONS)
def test_every_builtin_component_is_documented_with_its_arguments(kind):
    registered = COMPONENT_SECTIONS[kind]
    documented = documented_components(kind)
    assert sorted(documented) == sorted(registered), (
        f"docs/tasks.md '{kind}' lists {sorted(documented)}; gage_plugins_builtin registers {sorted(registered)}")
    for name, target in registered.items():
        assert documented[name] == constructor_args(target), (
            f"docs/tasks.md: {kind.lower()} {name!r}: the arguments table lists {documented[name]}, "
            f"{target} takes {constructor_args(target)} (in that order)")


@pytest.mark.parametrize("kind, registered", [("Tools", builtin.TOOLS), ("Tool-call parsers", builtin.TOOL_PARSERS)])
def test_every_builtin_tool_and_parser_is_documented(kind, registered):
    """Tools and parsers take no task arguments (a tool is built from its row): the names alone."""
    assert sorted(documented_components(kind)) == sorted(registered), (
        f"docs/tasks.md '{kind}' lists {sorted(documented_components(kind))}; "
        f"gage_plugins_builtin registers {sorted(registered)}")


# -- the walkthroughs --------------------------------------------------------------------------

@dataclass
class Step:
    kind: str  # "run", "model" (a run that loads the default model) or "file"
    body: str
    path: str = ""


def walkthroughs() -> dict[str, list[Step]]:
    text = doc_text()
    found = {}
    for title in re.findall(r"^## (Walkthrough: .+)$", text, flags=re.M):
        steps = []
        for marker, body in re.findall(r"^<!-- (run|run: model|file: [^ ]+) -->\n```[a-z]*\n(.*?)^```$",
                                       section(text, title, 2), flags=re.M | re.S):
            if marker.startswith("file: "):
                steps.append(Step("file", body, marker[len("file: "):]))
            else:
                steps.append(Step("model" if marker == "run: model" else "run", body))
        found[title] = steps
    return found


WALKTHROUGHS = walkthroughs()


def test_the_doc_has_both_walkthroughs_with_files_and_commands():
    assert sorted(WALKTHROUGHS) == ["Walkthrough: a generate task", "Walkthrough: a log-likelihood task"]
    for steps in WALKTHROUGHS.values():
        kinds = {s.kind for s in steps}
        assert kinds == {"run", "model", "file"}, kinds
        assert any("new-task" in s.body for s in steps if s.kind == "run")


def gage_eval_command() -> list[str]:
    script = Path(sys.executable).parent / "gage-eval"
    if script.is_file():
        return [str(script)]
    return [sys.executable, "-c", "from gage_eval.cli import main; main()"]


def run_command(line: str, cwd: Path) -> dict | None:
    argv = shlex.split(line, comments=True)
    if not argv:
        return
    assert argv[0] == "gage-eval", f"a walkthrough step the test cannot do: {line!r}"
    before = set((cwd / "runs").glob("*")) if (cwd / "runs").is_dir() else set()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(gage_eval_command() + argv[1:], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{line}\nexit {proc.returncode}\n{output}"
    assert not re.search(r"Traceback|error:|warning:", output), f"{line}\n{output}"
    if "--tasks" in argv and "--dry-run" not in argv:  # a run: every row scored
        new = set((cwd / "runs").glob("*")) - before
        assert len(new) == 1, f"{line}: expected one new run folder in runs/, got {sorted(new)}"
        summary = json.loads((new.pop() / "summary.json").read_text())
        for name, task in summary["tasks"].items():
            counts = task["counts"]
            assert counts["total"] > 0 and counts["scored"] == counts["total"], (line, name, counts)
        return summary


def follow(steps: list[Step], cwd: Path, *, model: bool, by_hand: bool) -> None:
    """Do what the walkthrough says, in order. By hand: no new-task, every file written from the doc."""
    for step in steps:
        if step.kind == "file":
            path = cwd / step.path
            if path.exists():
                assert path.read_text(encoding="utf-8") == step.body, (
                    f"{step.path}: what gage-eval new-task wrote differs from the file docs/tasks.md shows")
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(step.body, encoding="utf-8")
            continue
        if step.kind == "model" and not model:
            continue
        for line in step.body.splitlines():
            if by_hand and "new-task" in line:
                continue
            run_command(line, cwd)


@pytest.mark.parametrize("title", sorted(WALKTHROUGHS))
def test_walkthrough_as_written_on_the_dummy_backend(title, tmp_path):
    follow(WALKTHROUGHS[title], tmp_path, model=False, by_hand=False)
    shown = [s.path for s in WALKTHROUGHS[title] if s.kind == "file" and s.path.startswith("mytasks/")]
    folder = tmp_path / Path(shown[0]).parent
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "prompt.jinja", "sample.jsonl", "task.yaml"]
    assert sorted(str(p.relative_to(tmp_path)) for p in folder.iterdir() if p.name != "README.md") == sorted(shown)


@pytest.mark.parametrize("title", sorted(WALKTHROUGHS))
def test_walkthrough_by_hand_on_the_dummy_backend(title, tmp_path):
    follow(WALKTHROUGHS[title], tmp_path, model=False, by_hand=True)


@pytest.mark.slow
@pytest.mark.parametrize("title", sorted(WALKTHROUGHS))
def test_walkthrough_with_the_default_model(title, tmp_path, smollm2_gguf):
    follow(WALKTHROUGHS[title], tmp_path, model=True, by_hand=False)


@pytest.mark.slow
def test_the_figures_the_generate_walkthrough_gives_for_the_default_model(tmp_path, smollm2_gguf):
    """'`contains` falls from X to Y' without chat: true, on the five rows new-task writes."""
    claimed = re.search(r"`contains` falls from (\d(?:\.\d+)?) to\s+(\d(?:\.\d+)?)", doc_text())
    run_command("gage-eval new-task capitals --dir mytasks", tmp_path)
    task_file, got = tmp_path / "mytasks" / "capitals" / "task.yaml", []
    for chat in ("true", "false"):
        task_file.write_text(re.sub(r"chat: \w+", f"chat: {chat}", task_file.read_text()))
        summary = run_command("gage-eval --tasks capitals --include-path mytasks", tmp_path)
        got.append(summary["tasks"]["capitals"]["metrics"]["contains"]["value"])
    assert got == [float(claimed[1]), float(claimed[2])], f"docs/tasks.md says {claimed[0]!r}; measured {got}"
