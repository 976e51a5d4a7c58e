"""The openai backend's native tool calling against a real server: llama-cpp-python's
OpenAI-compatible server with the bundled SmolLM2 GGUF and its chatml-function-calling format
(which serves tools; a named tool_choice makes it answer with a grammar-constrained call)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "backends"))
from llama_server import llama_server  # noqa: E402

ROW = {"id": "weather", "category": "simple_python",
       "question": [[{"role": "user", "content": "What is the weather in Paris?"}]],
       "function": [{"name": "get_weather", "description": "Current weather of a city.",
                     "parameters": {"type": "dict", "properties": {"city": {"type": "string", "description": "City"}},
                                    "required": ["city"]}}],
       "ground_truth": [{"get_weather": {"city": ["Paris"]}}],
       "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}


@pytest.fixture(scope="module")
def tools_server(smollm2_gguf, tmp_path_factory):
    with llama_server(smollm2_gguf, tmp_path_factory.mktemp("llama"), "--chat_format",
                      "chatml-function-calling") as url:
        yield url


@pytest.mark.slow  # (llama.cpp's server with SmolLM2: left out of the README's quick subset)
def test_real_server_answers_with_a_recorded_tool_call(tools_server, run_cli, tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps(ROW) + "\n", encoding="utf-8")
    result = run_cli("--tasks", "bfcl_simple", "--data", f"bfcl_simple={data}", "--model", "openai",
                     "--model-args", f"base_url={tools_server},model=smollm2,max_tokens=64", "-o", tmp_path,
                     "--run-id", "r", "-q", "--no-report")
    record = json.loads((tmp_path / "r" / "samples" / "bfcl_simple.jsonl").read_text().splitlines()[0])
    assert "error" not in record["eval_result"], (result.output, record["eval_result"])
    calls = record["predict_result"][0]["message"]["tool_calls"]
    assert calls[0]["type"] == "function" and calls[0]["function"]["name"] == "get_weather"
    assert isinstance(json.loads(calls[0]["function"]["arguments"]), dict)  # grammar-constrained: JSON
    assert record["eval_result"]["metrics"]["bfcl_ast"]["value"] in (0.0, 1.0)
