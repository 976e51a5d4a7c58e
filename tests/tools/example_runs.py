"""Helpers of the tool-loop tests: the example plugin's folders, a tool call in Sample v1's shape,
a run of its ``example_pantry`` task with the dummy backend playing a script, and a run's samples."""
from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "gage-eval-plugin-example"
TASKS = EXAMPLE / "gage_eval_plugin_example" / "tasks"
ROWS = TASKS / "example_pantry" / "rows.jsonl"


def call(cid: str, name: str, arguments) -> dict:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": text}}


def samples_of(folder: Path, task: str) -> dict:
    """A run folder's records of ``task`` by row id."""
    return {json.loads(line)["id"]: json.loads(line)
            for line in (folder / "samples" / f"{task}.jsonl").read_text().splitlines()}


def run_pantry(run_cli, tmp_path, script, run_id, *extra, rows=ROWS, report: bool = True):
    """``example_pantry`` over ``rows``, the dummy backend replying as ``script`` says (row id ->
    replies), into ``tmp_path / run_id``; the CLI's result."""
    path = tmp_path / f"{run_id}.script.json"
    path.write_text(json.dumps(script))
    return run_cli("--tasks", "example_pantry", "--include-path", TASKS, "--data", f"example_pantry={rows}",
                   "--model", "dummy", "--model-args", f"response=script,script={path}",
                   "-o", tmp_path, "--run-id", run_id, "-q", *(() if report else ("--no-report",)), *extra)
