"""An outside checker's attacks on the tool loop and tool calling (issue 27): each test here failed
before its fix. Deeply nested call arguments, a plugin tool that returns too much, malformed agent
rows, ... : each is a scored failure or one clear line, never a crash nor a lost row."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.tools.example_runs import ROOT, ROWS, call, run_pantry, samples_of

sys.path.insert(0, str(ROOT / "tests" / "backends"))
from openai_fake_server import FakeServer  # noqa: E402

from tests.sandbox.local_sandbox import needs_local_sandbox  # noqa: E402

DEEP = "[" * 100_000 + "]" * 100_000  # JSON Python's decoder cannot read without running out of stack


def test_deeply_nested_arguments_go_back_to_the_model(example_plugin, run_cli, tmp_path):
    """Arguments nested past the JSON decoder's depth: the tool turn says they cannot be read and
    the loop goes on (it was the row's RecursionError), and trajectory_match scores the row."""
    script = {"pantry-1": [{"tool_calls": [call("c1", "take", DEEP)]}, {"text": "4"}], "pantry-2": [{"text": "no"}]}
    result = run_pantry(run_cli, tmp_path, script, "deep", report=False)
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


# -- a hostile plugin tool -------------------------------------------------------------------------

class Hostile:
    """A plugin whose tool misbehaves in each of its functions."""

    @staticmethod
    def make():
        from gage_eval.api import hookimpl, tools

        class Trouble(tools.Tool):
            def huge(self) -> str:
                return "x" * 20_000_000  # 20 MB of result text

            def odd(self) -> object:
                return {"when": {1, 2}, "what": object()}  # nothing JSON can write

            def leave(self) -> None:
                raise SystemExit(3)  # a tool that tries to end the run

            def hang(self) -> str:
                import time

                time.sleep(60)  # far past the task's call_timeout_s
                return "late"

            def state(self):
                if self.sample["id"] == "h3":
                    raise RuntimeError("no state today")
                return {"seen": {1, 2}}  # a state JSON cannot write

        class Plugin:
            @hookimpl
            def gage_register_tools(self, register):
                register("hostile/trouble", Trouble)

        return Plugin()


def hostile_task(tmp_path: Path, loop_extra: str = "") -> Path:
    folder = tmp_path / "tasks" / "hostile_agent"
    folder.mkdir(parents=True)
    (folder / "task.yaml").write_text(
        "name: hostile_agent\nversion: 1\ndataset:\n  loader: jsonl\n  args:\n    path: rows.jsonl\n"
        "preprocessor:\n  name: identity\nrequest:\n  kind: generate\n  chat: true\n  tool_loop:\n"
        "    tools: [hostile/trouble]\n    max_steps: 5\n" + loop_extra + "  generation:\n    max_new_tokens: 16\n"
        "requires: [tools]\nmetrics:\n  - exact_match\n")
    rows = [{"schema_version": "v1", "id": f"h{i}", "task_type": "agent",
             "messages": [{"role": "user", "content": [{"type": "text", "text": "go"}]}], "references": ["ok"]}
            for i in range(4)]
    (folder / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def run_hostile(run_cli, fresh_plugins, tmp_path, script, loop_extra: str = ""):
    fresh_plugins.register_plugin(Hostile.make(), "hostile")
    folder = hostile_task(tmp_path, loop_extra)
    path = tmp_path / "script.json"
    path.write_text(json.dumps(script))
    result = run_cli("--tasks", "hostile_agent", "--include-path", folder, "--model", "dummy",
                     "--model-args", f"response=script,script={path}", "-o", tmp_path, "--run-id", "h",
                     "-q", "--no-report")
    return result, samples_of(tmp_path / "h", "hostile_agent")


def tool_texts(sample: dict) -> list[str]:
    return [m["content"][0]["text"] for m in sample["predict_result"][0]["trajectory"] if m["role"] == "tool"]


def test_a_plugin_tools_huge_result_is_cut(fresh_plugins, run_cli, tmp_path):
    script = {"h0": [{"tool_calls": [call("c", "huge", {})]}, {"text": "ok"}]}
    result, samples = run_hostile(run_cli, fresh_plugins, tmp_path, script)
    assert result.exit_code == 0, result.output
    (text,) = tool_texts(samples["h0"])
    assert len(text) < 100_000 and "[result cut:" in text
    assert (tmp_path / "h" / "samples" / "hostile_agent.jsonl").stat().st_size < 1_000_000


def test_max_result_chars_is_a_task_setting(fresh_plugins, run_cli, tmp_path):
    script = {"h0": [{"tool_calls": [call("c", "huge", {})]}, {"text": "ok"}]}
    result, samples = run_hostile(run_cli, fresh_plugins, tmp_path, script, "    max_result_chars: 1000\n")
    assert result.exit_code == 0, result.output
    (text,) = tool_texts(samples["h0"])
    assert text == "x" * 1000 + "\n[result cut: 19999000 more characters]"


def test_a_plugin_tools_odd_result_and_state_are_written(fresh_plugins, run_cli, tmp_path):
    script = {"h0": [{"tool_calls": [call("c", "odd", {})]}, {"text": "ok"}]}
    result, samples = run_hostile(run_cli, fresh_plugins, tmp_path, script)
    assert result.exit_code == 0, result.output
    assert set(samples) == {"h0", "h1", "h2", "h3"}
    assert all("error" not in s["eval_result"] for s in samples.values()), samples["h0"]["eval_result"]
    assert "when" in tool_texts(samples["h0"])[0]


def test_a_tool_that_raises_systemexit_is_the_models_to_read(fresh_plugins, run_cli, tmp_path):
    """sys.exit() in a tool was every row's error; it is that call's result (a KeyboardInterrupt is
    left to stop the run: a real Ctrl-C may arrive while a tool runs)."""
    script = {"h0": [{"tool_calls": [call("c", "leave", {})]}, {"text": "ok"}]}
    result, samples = run_hostile(run_cli, fresh_plugins, tmp_path, script)
    assert result.exit_code == 0, result.output
    assert all("error" not in s["eval_result"] for s in samples.values())
    assert tool_texts(samples["h0"]) == ["Error during execution: SystemExit(3)"]


def test_golden_arguments_that_are_not_json_are_the_rows_error(example_plugin, run_cli, tmp_path):
    """A golden call's arguments that are not JSON could never match: it scored 0 as if the model
    were wrong; it is the row's error naming the field, with the file and line."""
    rows = [json.loads(line) for line in ROWS.read_text().splitlines()]
    rows[1]["golden_trajectories"] = [[{"role": "assistant", "tool_calls": [
        call("g", "count", '{"item": flour}')]}]]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    script = {"pantry-1": [{"text": "4"}], "pantry-2": [{"text": "no"}]}
    result = run_pantry(run_cli, tmp_path, script, "bad", rows=data, report=False)
    assert result.exit_code == 1, result.output  # some rows errored
    samples = samples_of(tmp_path / "bad", "example_pantry")
    error = samples["pantry-2"]["eval_result"]["error"]
    assert "golden_trajectories[0][0].tool_calls[0].function.arguments: not valid JSON" in error["message"]
    assert error["locator"] == f"{data}:2"
    assert "metrics" in samples["pantry-1"]["eval_result"]


def test_the_cache_is_keyed_by_the_tools(example_plugin, run_cli, tmp_path):
    """A tool's description changed between two runs with one cache: no step is answered from the
    first run's replies (they were made seeing other tools); the same tools again: every step is."""
    script = {"pantry-1": [{"tool_calls": [call("x", "take", {"amount": 2, "item": "eggs"})]}, {"text": "4"}],
              "pantry-2": [{"text": "no"}]}
    cache = tmp_path / "cache"
    assert run_pantry(run_cli, tmp_path, script, "one", "--cache", cache, report=False).exit_code == 0
    rows = [json.loads(line) for line in ROWS.read_text().splitlines()]
    for r in rows:
        r["tools"][0]["function"]["description"] = "How many are left (changed)."
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert run_pantry(run_cli, tmp_path, script, "two", "--cache", cache, rows=data, report=False).exit_code == 0
    counts = json.loads((tmp_path / "two" / "summary.json").read_text())["tasks"]["example_pantry"]["cache"]
    assert counts.get("hits", 0) == 0 and counts["misses"] == 3, counts
    assert run_pantry(run_cli, tmp_path, script, "three", "--cache", cache, rows=data, report=False).exit_code == 0
    counts = json.loads((tmp_path / "three" / "summary.json").read_text())["tasks"]["example_pantry"]["cache"]
    assert counts["hits"] == 3, counts


def test_a_hung_tool_call_times_out_and_the_row_goes_on(fresh_plugins, run_cli, tmp_path):
    """A tool call that never returns held the run forever; past call_timeout_s it is the model's
    error, the tool is unavailable for the rest of the row, and the other rows are untouched."""
    import time

    script = {"h0": [{"tool_calls": [call("c", "hang", {})]}, {"tool_calls": [call("d", "odd", {})]}, {"text": "ok"}],
              "h1": [{"tool_calls": [call("c", "odd", {})]}, {"text": "ok"}]}
    start = time.monotonic()
    result, samples = run_hostile(run_cli, fresh_plugins, tmp_path, script, "    call_timeout_s: 0.5\n")
    assert time.monotonic() - start < 30
    assert result.exit_code == 0, result.output
    assert tool_texts(samples["h0"]) == ["Error: hang did not return within 0.5 s",
                                         "Error: odd is unavailable: an earlier call of its tool did not return"]
    assert samples["h0"]["predict_result"][0]["raw"]["tool_loop"]["states"] == [{"Trouble": {"error": "a call did not return"}}]
    assert "when" in tool_texts(samples["h1"])[0]


def test_a_tool_state_that_raises_is_recorded(fresh_plugins, run_cli, tmp_path):
    result, samples = run_hostile(run_cli, fresh_plugins, tmp_path, {})
    assert result.exit_code == 0, result.output
    assert all("error" not in s["eval_result"] for s in samples.values())
    assert samples["h3"]["predict_result"][0]["raw"]["tool_loop"]["states"] == [
        {"Trouble": {"error": "Error during execution: no state today"}}]


def test_bfcl_rows_with_malformed_fields_name_the_field(run_cli, tmp_path):
    """A category that is not a string was "argument of type 'int' is not iterable"; a possible
    answer that is a bare value (not the list of allowed values) was accepted and checked as a
    substring; a question message without a role was a KeyError. Each is the row's error naming
    its field, with the file and line."""
    weather = {"name": "get_weather", "description": "Weather.", "parameters": {
        "type": "dict", "properties": {"city": {"type": "string", "description": "City."}}, "required": ["city"]}}
    good = {"category": "simple_python", "question": [[{"role": "user", "content": "x"}]], "function": [weather],
            "ground_truth": [{"get_weather": {"city": ["Paris"]}}]}
    rows = [dict(good, id="ok"), dict(good, id="cat", category=5),
            dict(good, id="bare", ground_truth=[{"get_weather": {"city": "Paris"}}]),
            dict(good, id="two", ground_truth=[{"get_weather": {"city": ["Paris"]}, "other": {}}]),
            dict(good, id="gt", ground_truth="Paris"), dict(good, id="role", question=[[{"content": "x"}]])]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"text": "none"}]))
    result = run_cli("--tasks", "bfcl_simple", "--data", f"bfcl_simple={data}", "--model", "dummy",
                     "--model-args", f"response=script,script={script}", "-o", tmp_path, "--run-id", "r",
                     "--no-report")
    assert result.exit_code == 1, result.output
    expected = {2: "'category' must be a string, not int",
                3: "'ground_truth'[0].get_weather.city must be a list of allowed values, not str",
                4: "'ground_truth'[0] must be one {function: {parameter: [values]}}",
                5: "'ground_truth' must be a list of {function: {parameter: [values]}}, not str",
                6: "'question'[0][0] must be a message with a 'role'"}
    for line, message in expected.items():
        assert f"{data}:{line}: preprocess error: {message}" in result.output
    assert "Traceback" not in result.output
    errors = [json.loads(x)["eval_result"].get("error") for x in
              (tmp_path / "r" / "samples" / "bfcl_simple.jsonl").read_text().splitlines()]
    assert sum(e is not None for e in errors) == 5 and len(errors) == 6


def test_a_servers_malformed_tool_calls_are_recorded_not_dropped():
    """``tool_calls`` that is an object (not a list) was read as no call at all, and a call that is
    a string lost what the server sent; each is now a call with no name holding what was sent,
    which bfcl_ast scores as a failure with its reason and the loop answers as an unknown function."""
    from gage_plugins_builtin.backends.openai_payload import reply_tool_calls
    from gage_plugins_builtin.tools.bfcl import decoded_calls

    def message(calls):
        return {"message": {"role": "assistant", "content": None, "tool_calls": calls}}

    (one,) = reply_tool_calls(message({"name": "get_weather"}))
    assert one["function"] == {"name": None, "arguments": '{"name": "get_weather"}'}
    junk, good = reply_tool_calls(message(["junk", {"id": "x", "function": {"name": "f", "arguments": {"a": 1}}}]))
    assert junk["function"] == {"name": None, "arguments": '"junk"'}
    assert good == {"id": "x", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    assert reply_tool_calls(message([])) is None and reply_tool_calls(message(None)) is None
    calls, why = decoded_calls([one], [{"type": "function", "function": {"name": "get_weather"}}], "auto")
    assert calls is None and why == "tool call 0 has no function name"


def code_task(tmp_path, *changes: tuple[str, str]) -> Path:
    """tests/tools/data/code_agent as task code_bad with ``changes`` to its task.yaml, and one row."""
    folder = tmp_path / "tasks" / "code_bad"
    folder.mkdir(parents=True)
    text = (ROOT / "tests" / "tools" / "data" / "code_agent" / "task.yaml").read_text()
    for old, new in (("name: code_agent", "name: code_bad"), *changes):
        assert old in text
        text = text.replace(old, new)
    (folder / "task.yaml").write_text(text)
    row = {"schema_version": "v1", "id": "r", "task_type": "agent", "references": ["x"],
           "messages": [{"role": "user", "content": [{"type": "text", "text": "go"}]}]}
    (folder / "rows.jsonl").write_text(json.dumps(row) + "\n")
    return folder


def run_code_task(run_cli, tmp_path, folder: Path, *extra):
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"text": "x"}]))
    return run_cli("--tasks", "code_bad", "--include-path", folder, "--model", "dummy",
                   "--model-args", f"response=script,script={script}", *extra)


def line_of(folder: Path, text: str) -> int:
    return next(i for i, line in enumerate((folder / "task.yaml").read_text().splitlines(), 1) if text in line)


@pytest.mark.parametrize("changes, key, problem", [
    ([("tools: [python, bash]", "tools: [python, nosuch]")], "request.tool_loop.tools.1",
     "unknown tool 'nosuch'; registered tools: bash, bfcl_multi_turn, python"),
    ([("python: {timeout_s: 2,", "python: {timeout_s: fast,")], "request.tool_loop.tool_args.python",
     "tool python (tool_args.python: limits, timeout_s): ValueError: timeout_s: expected a number of seconds above 0"),
    ([("python: {timeout_s: 2,", "python: {timeout: 2,")], "request.tool_loop.tool_args.python",
     "tool python (tool_args.python: limits, timeout): TypeError: "),
    ([("python: {timeout_s: 2, limits: {memory_mb: 256,", "python: {timeout_s: 2, limits: {memory_mb: lots,")],
     "request.tool_loop.tool_args.python",
     "tool python (tool_args.python: limits, timeout_s): ValueError: limits.memory_mb: expected a number above 0"),
    ([("python: {timeout_s: 2, limits: {memory_mb: 256,", "python: {timeout_s: 2, limits: {memory: 256,")],
     "request.tool_loop.tool_args.python", "ValueError: unknown limit memory"),
    ([("tools: [python, bash]", "tools: [python]")], "request.tool_loop.tool_args.bash",
     "tool_args for tool 'bash', which tools does not name (python)"),
])
def test_a_tool_loop_the_tools_would_refuse_is_refused_before_any_work(run_cli, tmp_path, changes, key, problem):
    """tools [nosuch] or tool_args python {timeout_s: fast} were found per row at run time: every
    row errored "tool loop: cannot set up the tools: ...". Now the task is refused when it is set
    up, as an unknown metric is: one line naming the task file's line and the key, no row run;
    --dry-run says the same. A tool_args value is never quoted (it may be a credential)."""
    folder = code_task(tmp_path, *changes)
    result = run_code_task(run_cli, tmp_path, folder, "-o", tmp_path, "--run-id", "r", "--no-report")
    assert result.exit_code == 3, result.output
    part = key.rsplit(".", 1)[-1]
    line = line_of(folder, f"{part}:") if not part.isdigit() else line_of(folder, "tools:")
    head = f"task 'code_bad' ({folder / 'task.yaml'}:{line}): key '{key}': "
    assert f"0 rows, 0 scored, 0 errored; FAILED: {head}" in result.output
    assert problem in result.output
    assert "fast" not in result.output and "lots" not in result.output
    assert not (tmp_path / "r" / "samples" / "code_bad.jsonl").exists() or \
        not (tmp_path / "r" / "samples" / "code_bad.jsonl").read_text().strip()
    dry = run_code_task(run_cli, tmp_path, folder, "--dry-run", "1")
    assert dry.exit_code == 3, dry.output
    assert f"cannot run: {head}" in dry.output and problem in dry.output


@needs_local_sandbox  # (the code tools open their sandbox at task setup)
def test_the_tool_settings_a_run_takes_pass_the_early_check(run_cli, tmp_path):
    """The check refuses nothing the tools accept: code_agent's own settings, numbers as ints."""
    folder = code_task(tmp_path, ("memory_mb: 256, processes: 32", "memory_mb: 256.5, processes: 32"))
    result = run_code_task(run_cli, tmp_path, folder, "--dry-run", "1")
    assert result.exit_code == 0, result.output
    assert "cannot run" not in result.output


@needs_local_sandbox  # (the code tools open their sandbox at task setup)
def test_an_invalid_agent_rows_own_id_is_kept_in_its_error_record(run_cli, tmp_path):
    """A Sample v1 agent row with tools a string was recorded as code_agent-row-0, its own id
    nowhere. The record's id stays TASK-row-N on purpose (an invalid row does not take its id, so
    a later corrected row with it runs: tests/core/test_rows.py; records are keyed by id on resume
    and in compare); the row's id is now its metadata.row_id."""
    base = {"schema_version": "v1", "task_type": "agent", "references": ["x"],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "go"}]}]}
    rows = [{**base, "id": "mine-1", "tools": "python"}, {**base, "id": "mine-1"}, {**base, "id": ""},
            {**base, "id": 7, "tools": "python"}]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"text": "x"}]))
    result = run_cli("--tasks", "code_agent", "--include-path", ROOT / "tests" / "tools" / "data" / "code_agent",
                     "--data", f"code_agent={data}", "--model", "dummy", "--model-args",
                     f"response=script,script={script}", "-o", tmp_path, "--run-id", "r", "-q", "--no-report")
    assert result.exit_code == 1, result.output  # (some rows errored; the corrected one scored)
    records = samples_of(tmp_path / "r", "code_agent")
    assert sorted(records) == ["code_agent-row-0", "code_agent-row-2", "code_agent-row-3", "mine-1"]
    stub = records["code_agent-row-0"]
    assert stub["eval_result"]["error"]["message"] == "tools: 'python' is not of type 'array'"
    assert stub["metadata"] == {"locator": f"{data}:1", "row_id": "mine-1"}
    assert "error" not in records["mine-1"]["eval_result"]  # the corrected row with that id ran
    assert records["code_agent-row-2"]["metadata"] == {"locator": f"{data}:3"}  # (an empty id is none)
    assert records["code_agent-row-3"]["metadata"] == {"locator": f"{data}:4"}  # (nor a number)


@pytest.mark.parametrize("script, entry, what", [
    (["done"], "[0]", "not a string"),
    ({"r": [{"text": "a"}, 5]}, '["r"][1]', "not a number"),
    ({"r": "done"}, '["r"]', "expected a list of replies, not a string"),
])
def test_a_dummy_script_reply_that_is_not_an_object_is_one_line(run_cli, tmp_path, script, entry, what):
    """A script reply "done" (not {"text": "done"}) was "AttributeError: 'str' object has no
    attribute 'get'" on each row; now the backend refuses the script, naming the file and entry."""
    path = tmp_path / "script.json"
    path.write_text(json.dumps(script))
    result = run_cli("--tasks", "code_agent", "--include-path", ROOT / "tests" / "tools" / "data" / "code_agent",
                     "--data", f"code_agent={ROWS}", "--model", "dummy", "--model-args",
                     f"response=script,script={path}", "-o", tmp_path, "--run-id", "r", "-q", "--no-report")
    assert result.exit_code == 2, result.output
    assert f"dummy backend: script {path}: entry {entry}: " in result.output and what in result.output
    assert "AttributeError" not in result.output


def test_bfcl_math_power_cannot_hold_the_run():
    """power(base=3, exponent=10**9), a call a model may write, ran in one C call for hours with
    gigabytes (no thread timeout stops it); it is refused as an error the model reads. A power that
    fits is computed as BFCL computes it."""
    pytest.importorskip("bfcl_eval", reason="needs bfcl-eval: pip install --no-deps bfcl-eval==2026.3.23")
    pytest.importorskip("mpmath", reason="BFCL's MathAPI needs mpmath")
    import time

    from gage_plugins_builtin.tools.bfcl_multi import api_instances, execute, method_owners

    owners = method_owners(api_instances(["MathAPI"], {}))
    start = time.monotonic()
    text = execute(owners["power"], "power", (), {"base": 3, "exponent": 10 ** 9})
    assert time.monotonic() - start < 5
    assert text == "Error during execution: the result of power would have more than 65536 bits"
    assert execute(owners["power"], "power", (), {"base": 2, "exponent": 10}) == '{"result": 1024}'
    assert execute(owners["power"], "power", (), {"base": 2.5, "exponent": 2}) == '{"result": 6.25}'


@pytest.mark.parametrize("name", ["logarithm", "square_root"])
@pytest.mark.parametrize("precision", [10 ** 7, 1e9, "100000000"])
def test_bfcl_math_precision_cannot_hold_the_run(name, precision):
    """logarithm and square_root take the digits to compute as an argument (mpmath's and decimal's
    precision): 10**7 held a core for hours, the call abandoned after 300 s and the run stalled that
    long; past 10,000 digits it is an error the model reads. BFCL's own precisions are computed as it does."""
    pytest.importorskip("bfcl_eval", reason="needs bfcl-eval: pip install --no-deps bfcl-eval==2026.3.23")
    pytest.importorskip("mpmath", reason="BFCL's MathAPI needs mpmath")
    import time

    from gage_plugins_builtin.tools.bfcl_multi import api_instances, execute, method_owners

    owners = method_owners(api_instances(["MathAPI"], {}))
    start = time.monotonic()
    given = {"value": 2, "base": 3} if name == "logarithm" else {"number": 2}
    text = execute(owners[name], name, (), {**given, "precision": precision})
    assert time.monotonic() - start < 5
    assert text == f"Error during execution: {name} to more than 10000 digits would take too long"
    assert execute(owners["logarithm"], "logarithm", (), {"value": 980.0, "base": 20, "precision": 10}) == \
        "{'result': mpf('2.299121531134')}"
    assert execute(owners["square_root"], "square_root", (), {"number": 2, "precision": 5}) == \
        "{'result': Decimal('1.4142')}"


@pytest.mark.parametrize("reply", ['[f(a=9**9**9)]', '[f(a="x"*10**10)]', '[f(a=[0]*10**9)]', '[f(a=10**5000)]',
                                   '[f(a=(10**3000)*(10**3000))]', "[" + "f(a=1)," * 10 ** 6 + "]"])
def test_pythonic_replies_cannot_hold_the_run(reply):
    """The prompting mode reads a reply's arithmetic on constants, as BFCL's decoder does: 9**9**9
    held the interpreter for hours, "x"*10**10 asked for 10 GB, and an integer past 4,300 digits
    raised out of the parser (the row's error); a 7 MB reply of a million calls (under the openai
    backend's 8 MiB) took 23 s and 4.3 GB in ast.parse, on the backend's event loop; each is now a
    reply no call could be read from."""
    import time

    from gage_plugins_builtin.tools.calls import PythonicParser

    start = time.monotonic()
    content, calls, error = PythonicParser().parse(reply)
    assert time.monotonic() - start < 2
    assert calls == [] and content == reply and error.startswith("no function call could be read from the reply")


def test_pythonic_arithmetic_that_fits_is_computed():
    from gage_plugins_builtin.tools.calls import PythonicParser

    _, calls, error = PythonicParser().parse('[f(a=2**10, b="ab"*3, c=[1]*2, d=3*4, e=-2.5)]')
    assert error is None
    assert json.loads(calls[0]["function"]["arguments"]) == {"a": 1024, "b": "ababab", "c": [1, 1], "d": 12, "e": -2.5}


def test_deeply_nested_replies_are_bad_replies_not_crashes(run_cli, tmp_path):
    """A server whose reply (or error reply) nests past the JSON decoder's depth, and a Hermes or
    JSON tool-call block that does: each a reply that cannot be read (the row's error, or no call,
    with why), never a RecursionError."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from gage_plugins_builtin.tools.calls import HermesParser, JsonParser

    assert HermesParser().parse(f"<tool_call>{DEEP}</tool_call>")[2].startswith("tool call 0: not JSON")
    assert JsonParser().parse(DEEP)[2].startswith("the reply is not JSON")

    class Deep(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = DEEP.encode()
            self.send_response(500 if "error" in self.path else 200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Deep)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    weather = {"name": "get_weather", "description": "Weather.", "parameters": {
        "type": "dict", "properties": {"city": {"type": "string", "description": "City."}}, "required": ["city"]}}
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"id": "q1", "category": "simple_python", "function": [weather],
                                "question": [[{"role": "user", "content": "Weather in Paris?"}]],
                                "ground_truth": [{"get_weather": {"city": ["Paris"]}}]}) + "\n")
    try:
        result = run_cli("--tasks", "bfcl_simple", "--data", f"bfcl_simple={data}", "--model", "openai",
                         "--model-args", f"base_url=http://127.0.0.1:{server.server_port}/v1,model=fake,max_retries=0",
                         "-o", tmp_path, "--run-id", "r", "-q", "--no-report")
    finally:
        server.shutdown()
    assert result.exit_code == 3, result.output
    error = samples_of(tmp_path / "r", "bfcl_simple")["q1"]["eval_result"]["error"]["message"]
    assert "not JSON" in error and "RecursionError" not in error, error


@needs_local_sandbox
def test_a_code_tool_is_waited_for_as_long_as_its_sandbox_allows(monkeypatch):
    """A task giving the python tool timeout_s 600 had its calls cut at the loop's 300 s (the job
    left running in the sandbox, the tool marked hung); the loop waits the tool's own bound."""
    from gage_eval.api import tools

    from gage_plugins_builtin.tools.code import PythonTool
    from gage_plugins_builtin.tools.loop import Toolbox

    seen = {}

    class Slow(PythonTool):
        def call(self, name, arguments):
            seen["ok"] = True
            return "done"

    tool = Slow(sample={}, timeout_s=600)
    assert tool.call_timeout_s == 660.0
    box = Toolbox.__new__(Toolbox)
    box.max_result_chars, box.call_timeout_s, box.hung = 1000, 0.5, set()
    box.tools, box.owner = [tool], {"python": tool}
    import gage_plugins_builtin.tools.loop as loop

    waits = []
    real = loop._call_within
    monkeypatch.setattr(loop, "_call_within", lambda t, n, a, w: waits.append(w) or real(t, n, a, w))
    assert box.run({"function": {"name": "python", "arguments": '{"code": "print(1)"}'}}) == "done"
    assert waits == [660.0] and seen["ok"] and isinstance(tool, tools.Tool)


@pytest.mark.parametrize("reply", ["<tool_call>x" + " " * 200_000 + "y", "```" + " " * 200_000 + "x"])
def test_a_reply_of_whitespace_cannot_hold_the_run(reply):
    """The hermes parser's pattern (``<tool_call>\\s*(.*?)\\s*...``) and code_exec's fence pattern
    backtracked over a run of spaces: 60,000 took 22 s and 30,000 0.56 s, growing with its square (a
    model that degenerates into whitespace, or an 8 MiB reply, held the run for hours). Both read
    in one pass now, and read what they read before."""
    import time

    from gage_plugins_builtin.code.metric import extract_code
    from gage_plugins_builtin.tools.calls import HermesParser

    start = time.monotonic()
    content, calls, error = HermesParser().parse(reply)
    assert extract_code(reply, "auto") == reply
    assert time.monotonic() - start < 2
    if reply.startswith("<tool_call>"):
        assert calls == [] and error.startswith("tool call 0: not JSON")
    parsed = HermesParser().parse('Sure. <tool_call>\n {"name": "f", "arguments": {"a": 1}} \n</tool_call>\n'
                                  '<tool_call>{"name": "g"}  ')
    assert parsed == ("Sure.", [{"id": "call_0", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}},
                                {"id": "call_1", "type": "function", "function": {"name": "g", "arguments": "{}"}}], None)
    assert extract_code("Here:\n```python  \nprint(1)\n```\nand ```py\nx\n```", "auto") == "print(1)\n"
    assert extract_code("```  \nprint(2)", "auto") == "print(2)"


def test_reasoning_blocks_are_stripped_in_one_pass_as_the_patterns_strip_them():
    """``<think>.*?</think>`` (choice metrics' strip_thinking) and the judges' ``<think|reasoning|...>``
    blocks were removed with patterns that, at each unclosed opening tag, scanned to the end of the
    reply: 20,000 of them (140 KB) took 7 s, growing with the square (an 8 MiB reply: hours). They are
    removed in one pass now, leaving what the patterns left."""
    import re
    import time

    from gage_plugins_builtin.judges import strip_reasoning
    from gage_plugins_builtin.metrics.fields import strip_blocks

    think = re.compile(r"<think>.*?</think>", re.S | re.I)
    tags = re.compile(r"<(think|thinking|reasoning|reflection)>.*?</\1>\s*", re.S | re.I)
    texts = ["a<think>b</think>c", "<THINK>x</think>\n y<think>z", "<think>a<think>b</think>c</think>d",
             "<thinking>q</think></THINKING>  r", "<reasoning>1</reasoning>\t\n<reflection>2</Reflection>s",
             "<think>open only", "x</think>y<think>", "<think></think><think> </think>  <Thinking>\u00a0</thinking>\u2003z",
             "<think>a</reasoning><reasoning>b</think>c</reasoning>d", ""]
    for text in texts:
        assert strip_blocks(text, ("think",)) == think.sub("", text), text
        assert strip_reasoning(text) == tags.sub("", text).strip(), text
    hostile = "<think>" * 20_000 + "</reasoning>"
    start = time.monotonic()
    assert strip_blocks(hostile, ("think",)) == hostile and strip_reasoning(hostile) == hostile
    assert time.monotonic() - start < 1
