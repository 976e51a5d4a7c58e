"""The response cache and the Ray executor are the builtin plugin's: the core never imports them.
With the builtin disabled nothing of them is loaded and ``--executor`` knows only ``local``; with it
on, a run without ``--cache`` on the local executor loads neither the cache nor Ray (the Ray
executor's own module, which imports Ray only when a run opens it, says what a local run refuses)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FEATURES = ("gage_plugins_builtin.cache", "gage_plugins_builtin.ray_executor", "ray")

SCRIPT = """
import json, sys
from click.testing import CliRunner
from gage_eval.cli import cli
from gage_eval.engine.executor import executor_names
from gage_eval.plugins import load_plugins
runner = CliRunner()
out = {"executors": executor_names(load_plugins()[1])}
for name, args in (("plugins", ["plugins"]), ("tasks", ["tasks"]), ("help", ["--help"]),
                   ("run", sys.argv[2:] and sys.argv[2].split("|")),
                   ("ray", not sys.argv[2:] and ["--tasks", "piqa", "--model", "dummy", "--executor", "ray", "-o",
                                                sys.argv[1]])):
    if args:
        result = runner.invoke(cli, args)
        out[name] = [result.exit_code, result.output[-300:]]
out["loaded"] = sorted(m for m in sys.modules if m in %r)
print(json.dumps(out))
""" % (FEATURES,)


def _run(tmp_path: Path, disabled: str, *run: str) -> dict:
    env = {**os.environ, "GAGE_EVAL_DISABLE_PLUGINS": disabled, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "runs"), *(["|".join(run)] if run else [])],
                          cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_builtin_disabled_loads_no_cache_nor_ray_and_knows_only_local(tmp_path):
    out = _run(tmp_path, "builtin", *())
    assert out["executors"] == ["local"] and out["loaded"] == []
    assert out["plugins"][0] == 0 and out["tasks"][0] == 0 and out["help"][0] == 0
    assert out["ray"][0] == 2 and "--executor: expected one of local, not 'ray'" in out["ray"][1]


def test_a_local_run_without_cache_loads_neither(tmp_path):
    out = _run(tmp_path, "", "--tasks|piqa|--model|dummy|--limit|2|-q|-o|" + str(tmp_path / "runs") + "|--run-id|a")
    assert out["executors"] == ["local", "ray"] and out["run"][0] == 0, out
    assert out["loaded"] == ["gage_plugins_builtin.ray_executor"]
    summary = json.loads((tmp_path / "runs" / "a" / "summary.json").read_text())
    assert "cache" not in summary["run"] and "cache" not in summary["tasks"]["piqa"]
