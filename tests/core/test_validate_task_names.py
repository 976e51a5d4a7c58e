"""``gage-eval validate FILE --schema task`` looks up the names a task file gives (its loader,
preprocessor, metrics, judge, tool loop's tools, a sandbox) in the loaded plugins' registry, as a
run's task setup does (issue 24): a task that validates is not refused later with "unknown
metric". Each problem is one line naming the file, the line and the key; with the builtin plugin
disabled the line says which plugins are loaded and which are disabled."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gage_eval.api import hookimpl

from tests.sandbox.local_sandbox import needs_local_sandbox

ROOT = Path(__file__).resolve().parents[2]

GOOD = """\
name: names
dataset:
  loader: jsonl
  args: {path: rows.jsonl}
preprocessor:
  name: identity
request:
  kind: generate
  chat: true
  prompt: prompt.jinja
  tool_loop:
    tools: [python]
    tool_args:
      python: {sandbox: local}
metrics:
  - exact_match
  - name: code_exec
    args: {sandbox: local}
judge:
  name: llm_judge
"""
ROW = {"schema_version": "v1", "id": "a", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
       "references": ["x"]}


# the task files here give the python tool and code_exec the local sandbox, which validate opens as a
# run's setup does: without bubblewrap each would (rightly) say it cannot run here
pytestmark = needs_local_sandbox

def task(tmp_path: Path, text: str = GOOD, folder: str = "names") -> Path:
    where = tmp_path / "tasks" / folder
    where.mkdir(parents=True)
    (where / "task.yaml").write_text(text)
    (where / "prompt.jinja").write_text("{{ sample.messages[0].content[0].text }}")
    (where / "rows.jsonl").write_text(json.dumps(ROW) + "\n")
    return where / "task.yaml"


def lines(result) -> list[str]:
    return result.output.splitlines()


def test_a_good_task_is_one_line_as_before(tmp_path, run_cli):
    path = task(tmp_path)
    result = run_cli("validate", path, "--schema", "task")
    assert result.exit_code == 0, result.output
    assert lines(result) == [f"{path}: 1 rows, 1 valid, 0 invalid, 0 warnings (schema task)"]


@pytest.mark.parametrize("name", ["piqa", "bfcl_multi_turn", "legal_eval_v1", "humaneval", "mmlu"])
def test_the_builtin_tasks_still_validate(name, run_cli):
    path = ROOT / "tasks" / name / "task.yaml"
    result = run_cli("validate", path, "--schema", "task")
    assert result.exit_code == 0, result.output
    assert lines(result) == [f"{path}: 1 rows, 1 valid, 0 invalid, 0 warnings (schema task)"]


@pytest.mark.parametrize("old, new, line, key, problem", [
    ("- exact_match", "- exact_mach", 16, "metrics.0",
     "unknown metric 'exact_mach' (did you mean 'exact_match'?); registered metrics: "),
    ("loader: jsonl", "loader: jsonll", 3, "dataset.loader",
     "unknown loader 'jsonll' (did you mean 'jsonl'?); registered loaders: "),
    ("name: identity", "name: identiti", 6, "preprocessor.name", "unknown preprocessor 'identiti'"),
    ("name: llm_judge", "name: llm_judj", 20, "judge.name", "unknown judge 'llm_judj'"),
    ("tools: [python]", "tools: [python, pythn]", 12, "request.tool_loop.tools.1",
     "unknown tool 'pythn' (did you mean 'python'?); registered tools: "),
    ("args: {sandbox: local}", "args: {sandbox: dockr}", 18, "metrics.1.args.sandbox",
     "unknown sandbox 'dockr'; registered sandboxes: "),
    # a metric's sandbox is opened as the run's setup opens it (toolcheck.check_metric_sandbox)
    ("args: {sandbox: local}", "args: {sandbox: local, sandbox_args: {colour: red}}", 18,
     "metrics.1.args.sandbox_args", "sandbox local (sandbox_args: colour): TypeError: "),
    ("args: {sandbox: local}", "args: {sandbox: [local]}", 18, "metrics.1.args.sandbox",
     "expected a registered sandbox's name"),
    ("args: {sandbox: local}", "args: {sandbox: unsandboxed}", 18, "metrics.1.args.sandbox",
     "sandbox 'unsandboxed' runs generated code on this machine as you; it needs --allow-unsandboxed-code"),
    ("python: {sandbox: local}", "python: {sandbox: dockr}", 14, "request.tool_loop.tool_args.python",
     "tool python (tool_args.python: sandbox): GageError: unknown sandbox 'dockr'; registered sandboxes: "),
    ("python: {sandbox: local}", "python: {sandbox: local, timeout: 3}", 14, "request.tool_loop.tool_args.python",
     "tool python (tool_args.python: sandbox, timeout): TypeError: "),
])
def test_an_unknown_name_is_one_line_with_its_file_line_and_key(tmp_path, run_cli, old, new, line, key, problem):
    assert old in GOOD
    path = task(tmp_path, GOOD.replace(old, new))
    result = run_cli("validate", path, "--schema", "task")
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    *found, report = lines(result)
    assert report == f"{path}: 1 rows, 0 valid, 1 invalid, 0 warnings (schema task)"
    assert len(found) == 1 and found[0].startswith(f"{path}:{line}: {key}: {problem}"), found


def test_every_problem_is_reported_in_the_files_order(tmp_path, run_cli):
    text = GOOD.replace("loader: jsonl", "loader: jsonll").replace("- exact_match", "- acc_x")
    path = task(tmp_path, text.replace("name: llm_judge", "name: llm_judj"))
    result = run_cli("validate", path, "--schema", "task")
    assert result.exit_code == 1
    assert [line.split(": ")[0:2] for line in lines(result)[:-1]] == [
        [f"{path}:3", "dataset.loader"], [f"{path}:16", "metrics.0"], [f"{path}:20", "judge.name"]]


def test_what_validate_refuses_the_run_refuses_too(tmp_path, run_cli):
    """The defect: validate said the file was fine and the run failed the task with this message."""
    path = task(tmp_path, GOOD.replace("- exact_match", "- exact_mach"))
    line = lines(run_cli("validate", path, "--schema", "task"))[0]
    problem = line.split(": metrics.0: ")[1].split(";")[0]
    run = run_cli("--tasks", "names", "--include-path", tmp_path / "tasks", "--model", "dummy", "-o", tmp_path / "out",
                  "--no-report")
    assert run.exit_code != 0
    summary = json.loads(next((tmp_path / "out").rglob("summary.json")).read_text())
    failure = summary["tasks"]["names"]["failure"]
    assert "key 'metrics.0'" in failure and problem in failure, failure


def test_a_task_files_own_checks_come_with_their_key(tmp_path, run_cli):
    path = task(tmp_path, GOOD.replace("prompt: prompt.jinja", "prompt: missing.jinja"))
    result = run_cli("validate", path, "--schema", "task")
    assert result.exit_code == 1
    assert lines(result)[0] == f"{path}:10: request.prompt: template file 'missing.jinja' not found in {path.parent}"


def test_each_variant_is_checked_and_a_shared_problem_said_once(tmp_path, run_cli):
    text = GOOD.replace("name: names\n", "name: names_{n}\nvariants: [{n: a}, {n: b}]\n").replace(
        "- exact_match", "- exact_mach")
    path = task(tmp_path, text)
    result = run_cli("validate", path, "--schema", "task")
    assert result.exit_code == 1
    assert [line for line in lines(result) if "exact_mach" in line] == [
        line for line in lines(result) if line.startswith(f"{path}:17: metrics.0: unknown metric 'exact_mach'")]
    assert len(lines(result)) == 2


def test_with_the_builtin_disabled_its_names_are_unknown_and_the_line_says_why(tmp_path, disable_plugins):
    """A subprocess, as a user runs it: no builtin module is imported either."""
    disabled = disable_plugins("builtin")
    path = ROOT / "tasks" / "piqa" / "task.yaml"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPROFILEIMPORTTIME"}
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "gage_eval.cli", "validate", str(path),
                           "--schema", "task"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    note = f"(plugins loaded: none; disabled by GAGE_EVAL_DISABLE_PLUGINS: {', '.join(sorted(disabled.split(',')))})"
    assert proc.stdout.splitlines() == [
        f"{path}:10: dataset.loader: unknown loader 'hf'; registered loaders: none {note}",
        f"{path}:15: preprocessor.name: unknown preprocessor 'legacy'; registered preprocessors: none {note}",
        f"{path}:37: metrics.0: unknown metric 'acc'; registered metrics: none {note}",
        f"{path}:38: metrics.1: unknown metric 'acc_norm'; registered metrics: none {note}",
        f"{path}: 1 rows, 0 valid, 1 invalid, 0 warnings (schema task)",
    ]
    assert "gage_plugins_builtin" not in proc.stderr


class Mine:
    """A plugin of its own: the names of the task below, with the builtin plugin disabled."""

    @hookimpl
    def gage_register_loaders(self, register):
        register("mine", lambda **args: iter(()))

    @hookimpl
    def gage_register_preprocessors(self, register):
        register("identity", lambda **args: (lambda record, ctx: record))

    @hookimpl
    def gage_register_metrics(self, register):
        register("mine", lambda **args: None)


def test_with_the_builtin_disabled_a_loaded_plugins_names_are_fine(tmp_path, run_cli, disable_plugins, fresh_plugins):
    disable_plugins("builtin")
    path = task(tmp_path, "name: own\ndataset: {loader: mine}\nrequest: {kind: generate}\nmetrics: [mine, acc]\n")
    fresh_plugins.register_plugin(Mine(), "mine")
    result = run_cli("validate", path, "--schema", "task")
    assert result.exit_code == 1  # acc: the builtin's
    assert len(lines(result)) == 2 and lines(result)[0].startswith(f"{path}:4: metrics.1: unknown metric 'acc'; registered metrics: mine "
                                       f"(plugins loaded: mine; disabled by GAGE_EVAL_DISABLE_PLUGINS: ")
    path.write_text(path.read_text().replace(", acc]", "]"))
    result = run_cli("validate", path, "--schema", "task")
    assert result.exit_code == 0, result.output
    assert lines(result) == [f"{path}: 1 rows, 1 valid, 0 invalid, 0 warnings (schema task)"]
