"""An outside checker's attacks on the tool loop and tool calling (issue 27): each test here failed
before its fix. Deeply nested call arguments, a plugin tool that returns too much, malformed agent
rows, ... : each is a scored failure or one clear line, never a crash nor a lost row."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "gage-eval-plugin-example"
TASKS = EXAMPLE / "gage_eval_plugin_example" / "tasks"
ROWS = TASKS / "example_pantry" / "rows.jsonl"
sys.path.insert(0, str(ROOT / "tests" / "backends"))
from openai_fake_server import FakeServer  # noqa: E402

DEEP = "[" * 100_000 + "]" * 100_000  # JSON Python's decoder cannot read without running out of stack


def call(cid: str, name: str, arguments) -> dict:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": text}}


@pytest.fixture
def example_plugin(monkeypatch, fresh_plugins):
    monkeypatch.syspath_prepend(str(EXAMPLE))
    import gage_eval_plugin_example

    fresh_plugins.register_plugin(gage_eval_plugin_example, "example")
    return gage_eval_plugin_example


def samples_of(folder: Path, task: str) -> dict:
    return {json.loads(line)["id"]: json.loads(line)
            for line in (folder / "samples" / f"{task}.jsonl").read_text().splitlines()}


def pantry(run_cli, tmp_path, script, run_id, *extra, rows=ROWS):
    path = tmp_path / f"{run_id}.script.json"
    path.write_text(json.dumps(script))
    result = run_cli("--tasks", "example_pantry", "--include-path", TASKS, "--data", f"example_pantry={rows}",
                     "--model", "dummy", "--model-args", f"response=script,script={path}",
                     "-o", tmp_path, "--run-id", run_id, "-q", "--no-report", *extra)
    return result


def test_deeply_nested_arguments_go_back_to_the_model(example_plugin, run_cli, tmp_path):
    """Arguments nested past the JSON decoder's depth: the tool turn says they cannot be read and
    the loop goes on (it was the row's RecursionError), and trajectory_match scores the row."""
    script = {"pantry-1": [{"tool_calls": [call("c1", "take", DEEP)]}, {"text": "4"}], "pantry-2": [{"text": "no"}]}
    result = pantry(run_cli, tmp_path, script, "deep")
    assert result.exit_code == 0, result.output
    first = samples_of(tmp_path / "deep", "example_pantry")["pantry-1"]
    assert "error" not in first["eval_result"], first["eval_result"]
    tool = [m for m in first["predict_result"][0]["trajectory"] if m["role"] == "tool"]
    assert tool[0]["content"][0]["text"].startswith("Error: the arguments of take are not valid JSON")
    assert first["eval_result"]["metrics"]["trajectory_match"]["value"] == 0.0


def test_bfcl_deeply_nested_arguments_are_a_scored_failure(run_cli, tmp_path):
    weather = {"name": "get_weather", "description": "Weather.", "parameters": {
        "type": "dict", "properties": {"city": {"type": "string", "description": "City."}}, "required": ["city"]}}
    row = {"id": "deep", "category": "simple_python", "function": [weather],
           "question": [[{"role": "user", "content": f"[[call:get_weather|{DEEP}]]"}]],
           "ground_truth": [{"get_weather": {"city": ["Paris"]}}]}
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps(row) + "\n")
    with FakeServer() as server:
        result = run_cli("--tasks", "bfcl_simple", "--data", f"bfcl_simple={data}", "--model", "openai",
                         "--model-args", f"base_url={server.url},model=fake", "-o", tmp_path, "--run-id", "r",
                         "-q", "--no-report")
    assert result.exit_code == 0, result.output
    verdict = samples_of(tmp_path / "r", "bfcl_simple")["deep"]["eval_result"]
    assert "error" not in verdict, verdict
    assert verdict["metrics"]["bfcl_ast"]["value"] == 0.0
    assert "not valid JSON" in json.dumps(verdict["metrics"]["bfcl_ast"])
