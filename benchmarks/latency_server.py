"""An OpenAI-compatible server on 127.0.0.1 that answers every request after a fixed latency.

    python benchmarks/latency_server.py --port 8011 --latency 0.1

For benchmarks/http_concurrency.py: it should cost the machine as little as possible per
request, so that the client's throughput is what gets measured (the fault-injecting
tests/backends/openai_fake_server.py spends about 0.15 ms of CPU a request; this one a
fraction of that). One asyncio Protocol, keep-alive HTTP/1.1 with Content-Length bodies,
no task per request: each reply is written by a timer ``--latency`` seconds after its
request has been read. Uses uvloop's event loop where installed.

Endpoints: ``GET /v1/models``; ``POST /v1/completions`` and ``POST /v1/chat/completions``
answer with the prompt's (or the last user message's) last line, cut to ``max_tokens``
words, with token usage counted in words.
"""
from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

MODEL = "fake-model"


def reply_for(path: str, body: Any) -> tuple[int, bytes]:
    if not isinstance(body, dict):
        return 400, json.dumps({"error": {"message": "body is not a JSON object"}}).encode()
    chat = path.endswith("/chat/completions")
    if chat:
        messages = [m for m in body.get("messages") or () if isinstance(m, dict) and m.get("role") == "user"]
        content = messages[-1].get("content", "") if messages else ""
        if isinstance(content, list):
            content = "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
        prompt = str(content)
    else:
        prompt = str(body.get("prompt", ""))
    lines = [line for line in prompt.split("\n") if line.strip()]
    words = (lines[-1] if lines else "").split()
    limit = int(body.get("max_tokens") or 16)
    text = " ".join(words[:limit])
    finish = "length" if len(words) > limit else "stop"
    usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": len(text.split())}
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    choice: dict = {"index": 0, "finish_reason": finish}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    return 200, json.dumps({"id": "bench", "object": "chat.completion" if chat else "text_completion",
                            "model": MODEL, "choices": [choice], "usage": usage}).encode()


def http_response(status: int, payload: bytes) -> bytes:
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found"}.get(status, "Status")
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: keep-alive\r\n\r\n").encode() + payload


class Connection(asyncio.Protocol):
    def __init__(self, latency: float):
        self.latency = latency
        self.buffer = b""
        self.transport: Any = None
        self.loop = asyncio.get_running_loop()

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].decode("latin-1").split("\r\n")
            length = 0
            for line in head[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip() or 0)
            if len(self.buffer) < end + 4 + length:
                return
            raw, self.buffer = self.buffer[end + 4:end + 4 + length], self.buffer[end + 4 + length:]
            method, path = (head[0].split(" ") + ["", ""])[:2]
            self.loop.call_later(self.latency, self.reply, self.answer(method, path, raw))

    @staticmethod
    def answer(method: str, path: str, raw: bytes) -> bytes:
        if method == "GET" and path.rstrip("/") == "/v1/models":
            return http_response(200, json.dumps({"object": "list", "data": [{"id": MODEL}]}).encode())
        if method != "POST" or path not in ("/v1/completions", "/v1/chat/completions"):
            return http_response(404, json.dumps({"error": {"message": f"no route {method} {path}"}}).encode())
        try:
            body = json.loads(raw)
        except ValueError:
            return http_response(400, json.dumps({"error": {"message": "body is not JSON"}}).encode())
        return http_response(*reply_for(path, body))

    def reply(self, data: bytes) -> None:
        if not self.transport.is_closing():
            self.transport.write(data)


async def serve(port: int, latency: float) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Connection(latency), "127.0.0.1", port, backlog=1024)
    print(f"latency server at http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=8011)
    parser.add_argument("--latency", type=float, default=0.1, help="seconds before each reply (default 0.1)")
    args = parser.parse_args()
    try:
        import uvloop
        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    try:
        runner(serve(args.port, args.latency))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
