"""The openai backend's native tool calling against a real server: llama-cpp-python's
OpenAI-compatible server with the bundled SmolLM2 GGUF and its chatml-function-calling format
(which serves tools; a named tool_choice makes it answer with a grammar-constrained call)."""
from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

ROW = {"id": "weather", "category": "simple_python",
       "question": [[{"role": "user", "content": "What is the weather in Paris?"}]],
       "function": [{"name": "get_weather", "description": "Current weather of a city.",
                     "parameters": {"type": "dict", "properties": {"city": {"type": "string", "description": "City"}},
                                    "required": ["city"]}}],
       "ground_truth": [{"get_weather": {"city": ["Paris"]}}],
       "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}


@pytest.fixture(scope="module")
def tools_server(smollm2_gguf, tmp_path_factory):
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("needs llama-cpp-python: pip install 'llama-cpp-python[server]' (see .ci/run)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path_factory.mktemp("llama") / "server.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "llama_cpp.server", "--model", str(smollm2_gguf), "--host", "127.0.0.1",
             "--port", str(port), "--n_ctx", "2048", "--n_threads", "2", "--model_alias", "smollm2",
             "--chat_format", "chatml-function-calling"], stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 180
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"llama_cpp.server exited with {proc.returncode}: {log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{url}/models", timeout=2) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"llama_cpp.server did not answer within 180 s: {log.read_text()[-2000:]}")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()


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
