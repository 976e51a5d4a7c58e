"""``--allow-unsandboxed-code`` is the builtin plugin's run option (gage_register_options), read by
the sandbox lookup while the code task is built: without it a sandbox that cannot run here stops
the task before any model work; with it (flag or run config key) the code runs on this machine and
the run says so."""
from __future__ import annotations

import json
import shutil

import pytest

from gage_eval.api import GageError, execution, hookimpl

pytestmark = pytest.mark.skipif(shutil.which("prlimit") is None,
                                reason="prlimit (util-linux) is not installed: apt-get install util-linux")


class Broken(execution.Sandbox):
    name = "test/broken"

    def check(self):
        raise GageError("test/broken cannot run here: apt-get install nothing")


class Sandboxes:
    @hookimpl
    def gage_register_sandboxes(self, register):
        register("test/broken", Broken)


def test_unsandboxed_needs_the_plugin_option(fresh_plugins, run_cli, tmp_path):
    fresh_plugins.register_plugin(Sandboxes(), "test-sandboxes")
    config = tmp_path / "run.yaml"
    config.write_text("tasks:\n  - name: code_exec\n    metrics:\n      - name: code_exec\n"
                      "        args: {sandbox: test/broken}\n")
    base = ("--config", config, "--model", "dummy", "--model-args", "response=fixed,text=print(1)", "--limit", "2",
            "-o", tmp_path, "-q")
    refused = run_cli(*base, "--run-id", "a")
    assert refused.exit_code != 0
    assert "test/broken cannot run here: apt-get install nothing; or, at your own risk" in refused.output
    assert "--allow-unsandboxed-code" in refused.output
    events = (tmp_path / "a" / "events.jsonl").read_text()
    assert "backend_open" not in events  # stopped before any model work

    allowed = run_cli(*base, "--run-id", "b", "--allow-unsandboxed-code")
    assert allowed.exit_code == 0, allowed.output
    assert "generated code runs UNSANDBOXED on this machine" in allowed.output
    records = [json.loads(line) for line in (tmp_path / "b/samples/code_exec.jsonl").read_text().splitlines()]
    assert [r["eval_result"]["metrics"]["code_exec"]["sandbox"] for r in records] == ["unsandboxed"] * 2
    assert json.loads((tmp_path / "b" / "config.json").read_text())["allow_unsandboxed_code"] is True

    config.write_text(config.read_text() + "allow_unsandboxed_code: true\n")
    from_config = run_cli(*base, "--run-id", "c")
    assert from_config.exit_code == 0, from_config.output
    assert json.loads((tmp_path / "c" / "config.json").read_text())["allow_unsandboxed_code"] is True
