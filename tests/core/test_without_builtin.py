"""The core stands without its builtin plugin (issue 24): with ``GAGE_EVAL_DISABLE_PLUGINS=builtin``,
``gage-eval --help``, ``tasks``, ``plugins`` and ``validate`` work, and none of the features the
builtin plugs in (the report, compare, the response cache, the Ray executor) is imported: no module
of gage_plugins_builtin, no ray, and no core module named after one of them."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IMPORTED = re.compile(r"\|\s*([\w.]+)\s*$")
FEATURE = re.compile(r"^(gage_plugins_builtin|ray)(\.|$)|^gage_eval\..*(report|compare|cache|ray)")
ROW = ('{"schema_version": "v1", "id": "a", "messages": [{"role": "user", "content": '
       '[{"type": "text", "text": "hi"}]}], "references": ["x"]}\n')


def run(env: dict, *args: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """``gage-eval ARGS`` in a fresh interpreter: the result and every module it imported."""
    env = {k: v for k, v in env.items() if k != "PYTHONPROFILEIMPORTTIME"}
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "gage_eval.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    return proc, [m.group(1) for line in proc.stderr.splitlines() if (m := IMPORTED.search(line))]


@pytest.mark.parametrize("args", [("--help",), ("tasks",), ("plugins",), ("validate", "ROWS", "--schema", "sample")])
def test_core_commands_work_and_import_no_feature_without_the_builtin(args, tmp_path, disable_plugins):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(ROW)
    env = {**os.environ, "GAGE_EVAL_DISABLE_PLUGINS": disable_plugins("builtin")}
    proc, modules = run(env, *(str(rows) if a == "ROWS" else a for a in args))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "gage_eval.cli" in modules, modules  # the count is of a real run of the command
    assert [m for m in modules if FEATURE.search(m)] == []


def test_the_check_sees_the_builtin_when_it_is_on(tmp_path):
    """The same command with the builtin plugin loaded imports it: the check above can fail."""
    env = {**os.environ}
    proc, modules = run(env, "plugins")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [m for m in modules if FEATURE.search(m)], modules
    assert "builtin" in proc.stdout


def test_a_name_no_plugin_has_is_said_not_ignored():
    env = {**os.environ, "GAGE_EVAL_DISABLE_PLUGINS": "bultin"}
    proc = subprocess.run([sys.executable, "-m", "gage_eval.cli", "plugins"], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    warning = "gage-eval: warning: GAGE_EVAL_DISABLE_PLUGINS names 'bultin', which is no installed plugin (installed: "
    assert proc.stderr.count(warning) == 1 and proc.stdout.startswith("builtin ")  # nothing was disabled
