"""bfcl_ast's verdicts on replies written with known verdicts (tests/tools/data/bfcl_known.jsonl:
correct, wrong type, missing required, extra parameter, wrong value, parallel calls in any order,
irrelevance ...), checked without BFCL; benchmarks/bfcl_vs_checker.py shows BFCL's own checker
gives the same verdicts on them. Also the parsers and the prompt-based mode's request."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gage_eval.api import ModelOutput, Request, RowContext
from gage_plugins_builtin.tools import prompting
from gage_plugins_builtin.tools.bfcl import BFCLAst, BFCLRow, schema_of
from gage_plugins_builtin.tools.calls import HermesParser, JsonParser, PythonicParser, decode_pythonic

KNOWN = [json.loads(line) for line in (Path(__file__).parent / "data" / "bfcl_known.jsonl").read_text().splitlines()]


def verdict(row: dict, text: str) -> dict:
    from gage_eval.api import MetricContext

    sample = BFCLRow()(row, RowContext(task="t", locator="t:1", index=0))
    out = prompting.read_calls(ModelOutput(text=text), PythonicParser())
    return BFCLAst().compute(MetricContext(sample=sample, model_output=out.to_dict()))


@pytest.mark.parametrize("row", KNOWN, ids=[r["id"] for r in KNOWN])
def test_known_verdicts(row):
    result = verdict(row, row["reply"])
    assert result["value"] == float(row["expected"]), result
    if not row["expected"]:
        assert result["reason"]


def test_pythonic_decoding_follows_bfcl_rules():
    assert decode_pythonic("[a.b.c(x=1, y=[1, 'two'], z={'k': (1, 2)})]") == [
        {"a.b.c": {"x": 1, "y": [1, "two"], "z": {"k": (1, 2)}}}]
    assert decode_pythonic("f(5, x=-2)") == [{"f": {"x": -2}}]  # positional arguments are left out
    assert decode_pythonic("[f(x=g(1)), f(x=g(y=2))]") == [{"f": {"x": "g(1)"}}, {"f": {"x": {"g": {"y": 2}}}}]
    with pytest.raises((ValueError, SyntaxError)):
        decode_pythonic("[1, f(x=1)]")
    with pytest.raises((ValueError, SyntaxError)):
        decode_pythonic("[f(x=lambda: 1)]")


def test_native_parsers():
    content, calls, error = HermesParser().parse('Sure.<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
                                                 '<tool_call>{"name": "g", "arguments": {bad}</tool_call>')
    assert content == "Sure." and calls[0]["function"] == {"name": "f", "arguments": '{"a": 1}'}
    assert len(calls) == 1 and "tool call 1: not JSON" in error
    _, calls, error = JsonParser().parse('<|python_tag|>{"name": "f", "parameters": {"a": "x"}}')
    assert error is None and calls[0]["function"] == {"name": "f", "arguments": '{"a": "x"}'}
    assert JsonParser().parse("plain words") == ("plain words", [], None)


def test_prompt_mode_request_and_tool_choice_none():
    tools = ({"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}},)
    req = Request(kind="generate", sample_id="1", chat=True, tools=tools, tool_choice="required",
                  messages=({"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
                            {"role": "user", "content": [{"type": "text", "text": "go"}]}))
    out = prompting.prompted(req)
    assert out.tools is None and len(out.messages) == 2
    system = "".join(s["text"] for s in out.messages[0]["content"])
    assert '"name": "f"' in system and "must call at least one" in system and system.endswith("Be brief.")
    off = prompting.prompted(Request(kind="generate", sample_id="1", chat=True, tools=tools, tool_choice="none",
                                     messages=req.messages[1:]))
    assert off.messages == req.messages[1:] and off.tools is None


def test_bfcl_types_become_json_schema_types():
    assert schema_of({"type": "dict", "properties": {"a": {"type": "float"}, "b": {"type": "tuple", "items": {
        "type": "any"}}}}) == {"type": "object", "properties": {"a": {"type": "number"}, "b": {
            "type": "array", "items": {"type": "string"}}}}


def test_bad_row_is_one_clear_error():
    with pytest.raises(ValueError, match="no 'ground_truth'"):
        BFCLRow()({"id": "x", "category": "simple", "question": [[]], "function": []},
                  RowContext(task="t", locator="t:1", index=0))
