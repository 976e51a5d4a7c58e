"""The report and compare are the builtin plugin's features, plugged in through the core's hooks:
the ``report`` writer on by default (``register(..., default=True)``), its ``--report/--no-report``
run option, the ``report`` and ``compare`` commands; with the builtin plugin disabled none of
their code is imported and the core's commands still answer."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gage_eval.api import GageError, Writer, hookimpl
from gage_eval.plugins import collect_registry, load_plugins, make_plugin_manager
from gage_eval.runfolder.writers import plugin_writers

ROOT = Path(__file__).resolve().parents[2]
FEATURE_MODULES = re.compile(r"\|\s*(gage_plugins_builtin\.(?:report|compare)(?:\.\w+)*|gage_eval\.engine\.reread)\s*$")


def imported(env: dict, *args: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """The CLI run with ``args`` and the report/compare modules it imported (``-X importtime``)."""
    env = {k: v for k, v in env.items() if k != "PYTHONPROFILEIMPORTTIME"}
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "gage_eval.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    found = [m.group(1) for line in proc.stderr.splitlines() if (m := FEATURE_MODULES.search(line))]
    return proc, found


def test_builtin_disabled_imports_no_report_or_compare_code(tmp_path, disable_plugins):
    env = {**os.environ, "GAGE_EVAL_DISABLE_PLUGINS": disable_plugins("builtin")}
    proc, found = imported(env, "--help")
    assert proc.returncode == 0, proc.stderr[-2000:]
    commands = proc.stdout.split("Commands:")[1]
    assert "report" not in commands and "compare" not in commands and "tasks" in commands
    assert "--no-report" not in proc.stdout  # the flag is the plugin's option
    assert found == [], found
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"schema_version": "v1", "id": "a", "messages": [{"role": "user", "content": '
                    '[{"type": "text", "text": "hi"}]}], "references": ["x"]}\n')
    for args in (("tasks",), ("plugins",), ("validate", str(rows), "--schema", "sample")):
        proc, found = imported(env, *args)
        assert proc.returncode == 0, (args, proc.stderr[-2000:])
        assert found == [], (args, found)
    proc, _ = imported(env, "report", str(tmp_path))
    assert proc.returncode == 2 and "No such command 'report'" in proc.stderr


def test_help_lists_the_plugin_commands_without_importing_them():
    proc, found = imported(dict(os.environ), "--help")
    assert proc.returncode == 0, proc.stderr[-2000:]
    commands = proc.stdout.split("Commands:")[1]
    assert re.search(r"^\s+report\s+Write one self-contained HTML report", commands, re.M)
    assert re.search(r"^\s+compare\s+Compare two run folders", commands, re.M)
    assert "--report / --no-report" in proc.stdout
    # only the commands' own (click-only) modules: the page, the statistics and the core's re-reader wait
    assert set(found) <= {"gage_plugins_builtin.report", "gage_plugins_builtin.report.command",
                          "gage_plugins_builtin.compare", "gage_plugins_builtin.compare.command"}, found


def test_report_is_a_builtin_writer_on_by_default():
    _, registry = load_plugins()
    reg = registry.writers["report"]
    assert reg.plugin == "builtin" and reg.default
    built = plugin_writers(registry, [])
    assert [w.name for w in built] == ["instances", "report"]
    # named by the run, it is built once (with the run's arguments), not beside the default one
    assert [w.name for w in plugin_writers(registry, ["report"])] == ["instances", "report"]
    assert registry.by_plugin()["builtin"]["writers"] == ["instances", "report"]
    # a merged run gets the default writers whose factory declares merged (no report)
    assert [w.name for w in plugin_writers(registry, [], merged=True)] == ["instances"]


class Writers:
    """A plugin with one writer on by default and one only when named."""

    @hookimpl
    def gage_register_writers(self, register):
        register("mine/always", Writer, default=True)
        register("mine/named", Writer)


class DefaultMetric:
    @hookimpl
    def gage_register_metrics(self, register):
        register("mine/metric", object, default=True)


def _registry(plugin: object):
    pm = make_plugin_manager()
    pm.register(plugin, name="mine")
    return collect_registry(pm)


def test_a_default_writer_runs_unnamed_and_a_plain_one_only_named(disable_plugins):
    disable_plugins("builtin")
    registry = _registry(Writers())
    assert [w.name for w in plugin_writers(registry, [])] == ["mine/always"]
    assert [w.name for w in plugin_writers(registry, ["mine/named"])] == ["mine/always", "mine/named"]
    assert [w.name for w in plugin_writers(registry, ["mine/always"])] == ["mine/always"]


def test_default_is_for_writers_only(disable_plugins):
    disable_plugins("builtin")
    with pytest.raises(GageError, match="plugin 'mine', metric 'mine/metric': default=True is for writers only"):
        _registry(DefaultMetric())


def test_the_report_writer_takes_no_arguments():
    _, registry = load_plugins()
    with pytest.raises(GageError, match="--writer report"):
        plugin_writers(registry, ["report:title=x"])
