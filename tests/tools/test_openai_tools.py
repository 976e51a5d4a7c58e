"""The openai backend's tool calling against the fake OpenAI-compatible server: the row's tools and
tool_choice are sent, the reply's tool_calls recorded in Sample v1's shape, and each malformed call
(bad JSON arguments, an unknown function, a call when tool_choice is none) a scored failure with
its reason, never a crash nor a lost row."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "backends"))
from openai_fake_server import FakeServer  # noqa: E402

WEATHER = {"name": "get_weather", "description": "Current weather of a city.",
           "parameters": {"type": "dict", "properties": {
               "city": {"type": "string", "description": "City."},
               "unit": {"type": "string", "description": "celsius or fahrenheit"}}, "required": ["city"]}}
TRUTH = [{"get_weather": {"city": ["Paris"], "unit": ["celsius", ""]}}]


def row(rid: str, say: str, category: str = "simple_python", truth=TRUTH, **extra) -> dict:
    return {"id": rid, "category": category, "question": [[{"role": "user", "content": f"Weather? {say}"}]],
            "function": [WEATHER], "ground_truth": truth, **extra}


ROWS = [
    row("ok", '[[call:get_weather|{"city": "Paris", "unit": "celsius"}]]'),
    row("bad_json", '[[call:get_weather|{"city": "Paris",]]'),
    row("unknown", '[[call:get_time|{"city": "Paris"}]]'),
    row("choice_none", '[[call:get_weather|{"city": "Paris"}]]', tool_choice="none"),
    row("wrong_value", '[[call:get_weather|{"city": "Rome"}]]'),
    row("not_object", '[[call:get_weather|"Paris"]]'),
    row("parallel", '[[call:get_weather|{"city": "Rome"}]] [[call:get_weather|{"city": "Paris"}]]',
        category="parallel", truth=[{"get_weather": {"city": ["Paris"]}}, {"get_weather": {"city": ["Rome"]}}]),
    row("irrelevant_text", "[[say:I have no tool for that.]]", category="irrelevance", truth=None),
    row("irrelevant_call", '[[call:get_weather|{"city": "Paris"}]]', category="irrelevance", truth=None),
]
EXPECTED = {  # row -> (score, a piece of the reason)
    "ok": (1.0, None), "bad_json": (0.0, "not valid JSON"), "unknown": (0.0, "unknown function 'get_time'"),
    "choice_none": (0.0, "tool_choice is none"), "wrong_value": (0.0, "'Rome' is not one of"),
    "not_object": (0.0, "not a JSON object"), "parallel": (1.0, None), "irrelevant_text": (1.0, None),
    "irrelevant_call": (0.0, "1 call(s) where none was expected"),
}


@pytest.fixture
def server():
    with FakeServer() as s:
        yield s


def run(run_cli, tmp_path: Path, server, args: str = "") -> tuple[object, dict]:
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    result = run_cli("--tasks", "bfcl_simple", "--data", f"bfcl_simple={data}", "--model", "openai",
                     "--model-args", f"base_url={server.url},model=fake{args}", "-o", tmp_path, "--run-id", "r",
                     "-q", "--no-report")
    records = [json.loads(line) for line in (tmp_path / "r" / "samples" / "bfcl_simple.jsonl").read_text().splitlines()]
    return result, {r["id"]: r for r in records}


def test_native_tool_calls_scored_with_reasons(run_cli, tmp_path, server):
    result, records = run(run_cli, tmp_path, server)
    assert set(records) == set(EXPECTED), result.output
    for rid, (score, why) in EXPECTED.items():
        metric = records[rid]["eval_result"]["metrics"]["bfcl_ast"]
        assert metric["value"] == score, (rid, metric)
        if why:
            assert why in metric["reason"], (rid, metric)
    sent = [e["body"] for e in server.log if e["path"] == "/v1/chat/completions"]
    assert all(b["tools"][0]["function"]["name"] == "get_weather" for b in sent)
    # BFCL's types become JSON Schema's in the tools sent
    assert all(b["tools"][0]["function"]["parameters"]["type"] == "object" for b in sent)
    assert sorted(b["tool_choice"] for b in sent) == ["auto"] * 8 + ["none"]
    message = records["ok"]["predict_result"][0]["message"]
    assert message["tool_calls"] == [{"id": "call_0", "type": "function", "function": {
        "name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]
    assert records["bad_json"]["predict_result"][0]["message"]["tool_calls"][0]["function"]["arguments"] == \
        '{"city": "Paris",'


def test_prompt_mode_describes_tools_and_reads_calls_from_text(run_cli, tmp_path, server):
    global ROWS
    saved = ROWS
    ROWS = [row("ok", '[[say:get_weather(city="Paris")]]'), row("prose", "[[say:Sorry, no.]]")]
    try:
        _, records = run(run_cli, tmp_path, server, ",tool_mode=prompt")
    finally:
        ROWS = saved
    sent = [e["body"] for e in server.log if e["path"] == "/v1/chat/completions"]
    assert all("tools" not in b and "get_weather" in b["messages"][0]["content"] for b in sent)
    assert records["ok"]["eval_result"]["metrics"]["bfcl_ast"]["value"] == 1.0
    assert records["ok"]["predict_result"][0]["message"]["tool_calls"][0]["function"] == {
        "name": "get_weather", "arguments": '{"city": "Paris"}'}
    prose = records["prose"]["eval_result"]["metrics"]["bfcl_ast"]
    assert prose["value"] == 0.0 and "no function call could be read" in prose["reason"]


def test_backend_without_tools_is_refused_before_any_work(run_cli, tmp_path):
    result = run_cli("--tasks", "bfcl_simple", "--model", "dummy", "-o", tmp_path, "--run-id", "r", "-q")
    assert result.exit_code != 0
    assert "task 'bfcl_simple' needs tools" in result.output and "'dummy'" in result.output
    assert not (tmp_path / "r" / "samples").exists()
