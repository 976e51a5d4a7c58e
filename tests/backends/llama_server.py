"""llama-cpp-python's OpenAI-compatible server on the bundled SmolLM2 GGUF, for the tests against a
real server (test_openai_llamacpp.py, tests/tools/test_llamacpp_tools.py): pip install
'llama-cpp-python[server]' (see .ci/run)."""
from __future__ import annotations

import contextlib
import importlib.util
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def llama_server(gguf: Path, log_dir: Path, *args: str):
    """``python -m llama_cpp.server`` on 127.0.0.1 serving ``gguf`` as ``smollm2`` (2048 tokens of
    context, 2 threads, then ``args``); yields its base URL once GET /models answers, stops it after."""
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("needs llama-cpp-python: pip install 'llama-cpp-python[server]' (see .ci/run)")
    port = free_port()
    log = log_dir / "server.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1",
             "--port", str(port), "--n_ctx", "2048", "--n_threads", "2", "--model_alias", "smollm2", *args],
            stdout=out, stderr=subprocess.STDOUT)
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
            except OSError:  # refused, reset, timed out, or an HTTP error status
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
