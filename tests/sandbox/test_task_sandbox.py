"""The code_exec metric's ``sandbox`` and ``sandbox_args`` in a task.yaml are checked when the task is
set up, before any model loads or row runs: an unknown sandbox, arguments its factory refuses, the
unsandboxed one without --allow-unsandboxed-code, or values of the wrong kind stop the task with one
line naming task.yaml's line and the key (before: the task file without a line or key, or a Python
error). Through the CLI, the code_exec task copied with its metric's arguments changed."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.sandbox.local_sandbox import needs_local_sandbox

ROOT = Path(__file__).resolve().parents[2]

pytestmark = needs_local_sandbox


@pytest.mark.parametrize("given, key, problem", [
    ("sandbox: nowhere", "metrics.0.args.sandbox", "unknown sandbox 'nowhere'; registered sandboxes: "),
    ("sandbox_args: {colour: SECRET-crimson}", "metrics.0.args.sandbox_args",
     "sandbox local (sandbox_args: colour): TypeError: "),
    ("sandbox: unsandboxed", "metrics.0.args.sandbox",
     "sandbox 'unsandboxed' runs generated code on this machine as you; it needs --allow-unsandboxed-code"),
    ("sandbox: [local]", "metrics.0.args.sandbox", "expected a registered sandbox's name"),
    ("sandbox_args: 5", "metrics.0.args.sandbox_args", "expected a mapping of the sandbox's arguments"),
])
def test_a_code_exec_sandbox_that_cannot_be_opened_stops_the_task_at_setup(run_cli, tmp_path, given, key, problem):
    folder = tmp_path / "tasks" / "code_exec"
    folder.mkdir(parents=True)
    for name in ("prompt.jinja", "sample.jsonl"):
        (folder / name).write_bytes((ROOT / "tasks" / "code_exec" / name).read_bytes())
    text = (ROOT / "tasks" / "code_exec" / "task.yaml").read_text()
    text = re.sub(r"metrics:\n  - code_exec\n", f"metrics:\n  - name: code_exec\n    args:\n      {given}\n", text)
    (folder / "task.yaml").write_text(text)
    line = text.splitlines().index(f"      {given}") + 1
    script = tmp_path / "script.json"
    script.write_text(json.dumps({}))
    result = run_cli("--tasks", "code_exec", "--include-path", tmp_path / "tasks", "--model", "dummy",
                     "--model-args", f"response=script,script={script}", "-o", tmp_path, "--run-id", "r",
                     "--no-report")
    assert result.exit_code == 3, result.output  # as any task that cannot run
    shown = [t for t in result.output.splitlines() if "FAILED" in t]
    assert len(shown) == 1 and f"task.yaml:{line}): key '{key}': {problem}" in shown[0], result.output
    assert "SECRET-crimson" not in shown[0]  # a key is named, never a value (one may be a credential)
    assert "loading model" not in result.output
    assert not (tmp_path / "r" / "samples" / "code_exec.jsonl").exists()
