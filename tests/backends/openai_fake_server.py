"""A small OpenAI-compatible server on 127.0.0.1 that can misbehave on request.

It runs an asyncio HTTP/1.1 server (keep-alive, Content-Length bodies) in a thread.
Endpoints: ``GET /v1/models``, ``POST /v1/chat/completions``, ``POST /v1/completions``
(with ``echo``/``logprobs``, optional ``stream``).

The fake model:
- answers with the text after ``[[say:...]]`` in the prompt, else the prompt's last
  non-empty line (directives removed), cut at ``stop`` and to ``max_tokens`` tokens;
- tokenises with :func:`tokenize` (a token is a run of spaces plus a run of non-spaces),
  gives a token the log-probability :func:`token_logprob` whatever precedes it, and
  names `` the`` (log-probability -0.5) the most likely token at every position.

Faults: a prompt holding ``[[faults:429,reset,garbage]]`` gets those faults on its
first, second and third attempts and a normal reply after; ``500*3`` repeats one.
A chat request with ``tools`` whose prompt holds ``[[call:NAME|ARGUMENTS]]`` (repeatable) is
answered with those tool calls, the arguments sent exactly as written (malformed JSON too).
A prompt holding ``[[delay:2.5]]`` is answered that many seconds late (after ``latency``).
``[[quote:NAME]]`` makes the answer ``ANS-`` and the request's header NAME (a reply quoting a
credential back); ``[[route:NAME]]`` an answer that depends on that header's value (a gateway
choosing the model by a header).
``FakeServer(fault=KIND)`` gives every completion request that fault (a prompt's own
directive still wins; ``fault_models=True`` gives it ``GET /models`` too).
Kinds: 429 (with ``Retry-After``), 401, 403, any other status code (an error reply with
that status: 400, 404, 409, 500, 503, ...), 404model (OpenAI's model_not_found), 400model
(a 400 naming a missing model, as llama.cpp-style servers do), timeout (stalls ``stall_s``), hang (never answers),
drip (a correct reply, one byte every ``drip_s``), reset (TCP RST after reading the
request), midreset (headers and half the body, then RST), truncated (fewer bytes than
Content-Length), garbage (200 with HTML), badjson (200, JSON content type, broken JSON),
empty (200 with no choices), huge (200 announcing and sending ``huge_bytes``), hugechunked
(the same without Content-Length). ``require_headers={name: value}`` answers 401 to a request
without those exact credentials; ``require_query={name: value}`` the same for query parameters
(Azure's ``?api-key=K``). ``echo_headers=True`` quotes the request's headers and its full
URL (its credentials included) in error messages, as a careless server might.

Used by tests/backends/test_openai_*.py (benchmarks/http_concurrency.py uses the leaner
benchmarks/latency_server.py); run it by
hand with ``python tests/backends/openai_fake_server.py --port 8011 --latency 0.1``.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import re
import socket
import struct
import threading
import time
import urllib.parse
from typing import Any

TOKEN = re.compile(r"\s*\S+|\s+$")
DIRECTIVE = re.compile(r"\[\[(say|faults|delay|quote|route):([^\]]*)\]\]")
CALL = re.compile(r"\[\[call:([^|\]]*)\|([^\]]*)\]\]")
HEADER_DIRECTIVE = re.compile(r"\[\[(quote|route):([^\]]*)\]\]")
TOP_TOKEN, TOP_LOGPROB = " the", -0.5
REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
           429: "Too Many Requests", 500: "Internal Server Error", 503: "Service Unavailable"}


def tokenize(text: str) -> list[tuple[str, int]]:
    """Tokens with their character offsets."""
    return [(m.group(), m.start()) for m in TOKEN.finditer(text)]


def token_logprob(token: str) -> float:
    if token == TOP_TOKEN:
        return TOP_LOGPROB
    h = int.from_bytes(hashlib.blake2b(token.encode(), digest_size=4).digest(), "big")
    return -round(1.0 + (h % 4000) / 1000, 3)


def continuation_logprob(context: str, continuation: str) -> float:
    """What a correct client computes from this server's echo (the reference for tests)."""
    total = 0.0
    for tok, off in tokenize(context + continuation):
        if off + len(tok) > len(context):
            total += token_logprob(tok)
    return total


def parse_faults(text: str) -> list[str]:
    out: list[str] = []
    for m in DIRECTIVE.finditer(text):
        if m.group(1) != "faults":
            continue
        for item in m.group(2).split(","):
            kind, _, count = item.strip().partition("*")
            out.extend([kind] * (int(count) if count else 1))
    return out


def answer_for(prompt: str) -> str:
    for m in DIRECTIVE.finditer(prompt):
        if m.group(1) == "say":
            return m.group(2)
    lines = [ln.strip() for ln in DIRECTIVE.sub("", prompt).splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def _from_header(m: re.Match, headers: dict) -> str:
    """``[[quote:NAME]]``: the answer is ``ANS-`` and the request's header NAME (a careless server
    quoting a credential); ``[[route:NAME]]``: an answer chosen by that header's value, without
    quoting it (a gateway routing to a model by a header)."""
    value = headers.get(m.group(2).lower(), "")
    if m.group(1) == "quote":
        return f"[[say:ANS-{value}]]"
    return f"[[say:ROUTED-{hashlib.sha256(value.encode()).hexdigest()[:10]}]]"


def message_text(messages: list) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            return "\n".join(p.get("text", "") for p in content if p.get("type") == "text")
    return ""


class FakeServer:
    """``with FakeServer(latency=0.1) as server: server.url`` -> ``http://127.0.0.1:PORT/v1``."""

    def __init__(self, *, latency: float = 0.0, echo: bool = True, model: str = "fake-model",
                 retry_after: str = "0", stall_s: float = 30.0, chunk_delay: float = 0.0, port: int = 0,
                 fault: str | None = None, fault_models: bool = False, drip_s: float = 1.0,
                 huge_bytes: int = 50 * 2 ** 20, echo_headers: bool = False, require_headers: dict | None = None,
                 require_query: dict | None = None):
        self.latency = latency
        self.echo = echo
        self.model = model
        self.retry_after = retry_after
        self.stall_s = stall_s
        self.chunk_delay = chunk_delay
        self.port = port
        self.fault = fault
        self.fault_models = fault_models
        self.drip_s = drip_s
        self.huge_bytes = huge_bytes
        self.echo_headers = echo_headers  # error replies quote every request header back (a careless server)
        # credentials every request must carry (header name -> exact value), else 401
        self.require_headers = {k.lower(): v for k, v in (require_headers or {}).items()}
        self.require_query = dict(require_query or {})  # the same for query parameters (decoded)
        self.rejected = 0  # requests answered 401 for lacking those credentials
        self.sent_bytes = 0  # of huge replies, what the client took before it hung up
        self.attempts: dict[str, int] = {}
        self.log: list[dict] = []  # one entry a completion request: time, path, fault, headers, body
        self.model_lookups: list[dict] = []  # the headers of each GET /models
        self.inflight = self.max_inflight = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.AbstractServer | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    # -- lifecycle ---------------------------------------------------------------
    def start(self) -> "FakeServer":
        self._thread = threading.Thread(target=self._serve, daemon=True, name="openai-fake-server")
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the fake server did not start")
        return self

    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._server = loop.run_until_complete(
            asyncio.start_server(self._connection, "127.0.0.1", self.port, backlog=512))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            for task in asyncio.all_tasks(loop):
                task.cancel()
            loop.run_until_complete(asyncio.sleep(0))
            loop.close()

    def stop(self) -> None:
        if self._loop is None:
            return
        loop = self._loop

        async def shutdown() -> None:
            self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()
            loop.stop()

        asyncio.run_coroutine_threadsafe(shutdown(), loop)
        self._thread.join(10)
        self._loop = None

    def __enter__(self) -> "FakeServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- HTTP ----------------------------------------------------------------------
    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = (lines[0].split(" ") + ["", ""])[:3]
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        k, _, v = line.partition(":")
                        headers[k.strip().lower()] = v.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0") or 0))
                keep = await self._handle(method, path, headers, body, writer)
                if not keep:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        except asyncio.CancelledError:
            return  # the server is stopping
        finally:
            if not writer.is_closing():
                writer.close()

    async def _respond(self, writer: asyncio.StreamWriter, status: int, body: bytes,
                       content_type: str = "application/json", extra: dict | None = None,
                       length: int | None = None) -> None:
        head = [f"HTTP/1.1 {status} {REASONS.get(status, 'Status')}", f"Content-Type: {content_type}",
                f"Content-Length: {len(body) if length is None else length}", "Connection: keep-alive"]
        head += [f"{k}: {v}" for k, v in (extra or {}).items()]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        await writer.drain()

    async def _json(self, writer: asyncio.StreamWriter, status: int, obj: Any, extra: dict | None = None) -> bool:
        await self._respond(writer, status, json.dumps(obj).encode(), extra=extra)
        return True

    async def _handle(self, method: str, target: str, headers: dict, raw: bytes, writer) -> bool:
        path, _, query = target.partition("?")
        given = dict(urllib.parse.parse_qsl(query, keep_blank_values=True))
        if any(headers.get(k) != v for k, v in self.require_headers.items()) or \
                any(given.get(k) != v for k, v in self.require_query.items()):
            self.rejected += 1
            return await self._fault("401", writer, headers, target)
        if method == "GET" and path.rstrip("/") == "/v1/models":
            self.model_lookups.append(headers)
            if self.fault_models and self.fault:
                return await self._fault(self.fault, writer, headers, target)
            return await self._json(writer, 200, {"object": "list", "data": [{"id": self.model, "object": "model"}]})
        if method != "POST" or path not in ("/v1/chat/completions", "/v1/completions"):
            return await self._json(writer, 404, {"error": {"message": f"no route {method} {target}"}})
        try:
            body = json.loads(raw)
        except ValueError:
            return await self._json(writer, 400, {"error": {"message": "body is not JSON"}})
        chat = path.endswith("chat/completions")
        prompt = message_text(body.get("messages") or []) if chat else str(body.get("prompt", ""))
        key = f"{path}\x1f{prompt}"
        attempt = self.attempts.get(key, 0)  # every handler runs on the server's one loop thread
        self.attempts[key] = attempt + 1
        faults = parse_faults(prompt)
        fault = faults[attempt] if attempt < len(faults) else self.fault
        self.log.append({"t": time.monotonic(), "path": path, "fault": fault, "headers": headers, "body": body,
                         "attempt": attempt + 1})
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        try:
            if self.latency:
                await asyncio.sleep(self.latency)
            delay = [float(m.group(2)) for m in DIRECTIVE.finditer(prompt) if m.group(1) == "delay"]
            if delay:
                await asyncio.sleep(delay[0])
            if fault is not None:
                return await self._fault(fault, writer, headers, target)
            prompt = HEADER_DIRECTIVE.sub(lambda m: _from_header(m, headers), prompt)
            if chat:
                return await self._chat(body, prompt, writer)
            return await self._completion(body, prompt, writer)
        finally:
            self.inflight -= 1

    async def _fault(self, fault: str, writer: asyncio.StreamWriter, headers: dict, target: str = "") -> bool:
        said = f" (you sent {json.dumps(headers)} to {target})" if self.echo_headers else ""
        if fault == "429":
            return await self._json(writer, 429, {"error": {"message": "rate limited", "type": "rate_limit"}},
                                    {"Retry-After": self.retry_after})
        if fault in ("401", "403"):
            message = ("Incorrect API key provided" if fault == "401" else "You may not use this model") + said
            return await self._json(writer, int(fault), {"error": {"message": message, "type": "invalid_request_error",
                                                                   "code": "invalid_api_key"}})
        if fault == "404model":
            return await self._json(writer, 404, {"error": {
                "message": f"The model `{self.model}x` does not exist or you do not have access to it.",
                "type": "invalid_request_error", "code": "model_not_found"}})
        if fault == "400model":
            return await self._json(writer, 400, {"error": {"message": f"model '{self.model}x' not found"}})
        if fault.isdigit():
            message = ("injected bad request" if fault == "400" else f"injected {fault}") + said
            return await self._json(writer, int(fault), {"error": {"message": message}})
        if fault == "timeout":
            await asyncio.sleep(self.stall_s)
            return False
        if fault == "hang":
            await asyncio.Event().wait()  # until the server stops
            return False
        if fault == "drip":
            body = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": "late " * 60},
                                            "finish_reason": "stop"}]}).encode()
            writer.write(f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                         f"\r\n".encode())
            for i in range(len(body)):
                writer.write(body[i:i + 1])
                await writer.drain()
                await asyncio.sleep(self.drip_s)
            return True
        if fault == "midreset":
            body = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": "x" * 2000}}]})
            writer.write(f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                         f"\r\n".encode() + body[:len(body) // 2].encode())
            await writer.drain()
            await asyncio.sleep(0.05)
            sock = writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
            return False
        if fault == "badjson":
            await self._respond(writer, 200, b'{"choices": [{"index": 0, "message": {"content": "cut')
            return True
        if fault in ("huge", "hugechunked"):
            return await self._huge(writer, chunked=fault == "hugechunked")
        if fault == "reset":
            sock = writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
            return False
        if fault == "truncated":
            await self._respond(writer, 200, b'{"choices": [{"te', length=500)
            writer.transport.abort()
            return False
        if fault == "garbage":
            await self._respond(writer, 200, b"<html><body>502 upstream hiccup</body></html>")
            return True
        if fault == "empty":
            return await self._json(writer, 200, {"choices": []})
        raise ValueError(f"unknown fault {fault!r}")

    async def _huge(self, writer: asyncio.StreamWriter, chunked: bool) -> bool:
        """A reply of ``huge_bytes`` (a JSON string that never ends), sent as fast as the client reads."""
        length = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {self.huge_bytes}"
        writer.write(f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n{length}\r\n\r\n".encode())
        piece = b'{"choices": [{"text": "' + b"A" * (64 * 1024 - 23)
        sent = 0
        while sent < self.huge_bytes:
            data = piece[:self.huge_bytes - sent]
            writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n" if chunked else data)
            await writer.drain()
            sent += len(data)
            self.sent_bytes += len(data)
            piece = b"A" * len(piece)
        if chunked:
            writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True

    @staticmethod
    def _generate(body: dict, prompt: str) -> tuple[str, str]:
        text = answer_for(prompt)
        finish = "stop"
        for stop in body.get("stop") or ():
            if stop and stop in text:
                text = text[:text.index(stop)]
        tokens = tokenize(text)
        limit = int(body.get("max_tokens") or 16)
        if len(tokens) > limit:
            text = "".join(t for t, _ in tokens[:limit])
            finish = "length"
        return text, finish

    def _usage(self, prompt: str, text: str) -> dict:
        i, o = len(tokenize(prompt)), len(tokenize(text))
        return {"prompt_tokens": i, "completion_tokens": o, "total_tokens": i + o}

    async def _chat(self, body: dict, prompt: str, writer) -> bool:
        calls = CALL.findall(prompt)
        if calls and body.get("tools"):  # [[call:NAME|ARGUMENTS]]: a tool call, arguments sent as written
            message = {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": args}}
                for i, (name, args) in enumerate(calls)]}
            return await self._json(writer, 200, {
                "id": "chatcmpl-fake", "object": "chat.completion", "model": self.model,
                "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
                "usage": self._usage(prompt, "")})
        text, finish = self._generate(body, prompt)
        if body.get("stream"):
            return await self._stream(writer, text, finish, prompt, chat=True)
        return await self._json(writer, 200, {
            "id": "chatcmpl-fake", "object": "chat.completion", "model": self.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}],
            "usage": self._usage(prompt, text)})

    async def _completion(self, body: dict, prompt: str, writer) -> bool:
        if body.get("echo") and body.get("logprobs") is not None:
            return await self._json(writer, 200, self._echo(body, prompt))
        text, finish = self._generate(body, prompt)
        if body.get("stream"):
            return await self._stream(writer, text, finish, prompt, chat=False)
        return await self._json(writer, 200, {
            "id": "cmpl-fake", "object": "text_completion", "model": self.model,
            "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}],
            "usage": self._usage(prompt, text)})

    def _echo(self, body: dict, prompt: str) -> dict:
        generated = [TOP_TOKEN] if int(body.get("max_tokens") or 0) > 0 else []
        shown = tokenize(prompt) if self.echo else []
        tokens = [t for t, _ in shown] + generated
        offsets = [o for _, o in shown] + [len(prompt)] * len(generated)
        values: list = [token_logprob(t) for t in tokens]
        top: list = [{TOP_TOKEN: TOP_LOGPROB} for _ in tokens]
        if self.echo and shown:
            values[0] = None
            top[0] = None
        text = (prompt if self.echo else "") + "".join(generated)
        return {"id": "cmpl-fake", "object": "text_completion", "model": self.model,
                "choices": [{"index": 0, "text": text, "finish_reason": "length",
                             "logprobs": {"tokens": tokens, "token_logprobs": values, "top_logprobs": top,
                                          "text_offset": offsets}}],
                "usage": self._usage(prompt, "".join(generated))}

    async def _stream(self, writer, text: str, finish: str, prompt: str, chat: bool) -> bool:
        head = ["HTTP/1.1 200 OK", "Content-Type: text/event-stream", "Transfer-Encoding: chunked",
                "Connection: keep-alive"]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode())

        async def event(obj: Any) -> None:
            data = f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode()
            writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            await writer.drain()

        for piece, _ in tokenize(text) or [("", 0)]:
            if self.chunk_delay:
                await asyncio.sleep(self.chunk_delay)
            choice = {"index": 0, "delta": {"content": piece}} if chat else {"index": 0, "text": piece}
            await event({"object": "chat.completion.chunk" if chat else "text_completion", "choices": [choice]})
        last = {"index": 0, "delta": {}, "finish_reason": finish} if chat else \
            {"index": 0, "text": "", "finish_reason": finish}
        await event({"choices": [last], "usage": self._usage(prompt, text)})
        await event("[DONE]")
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=8011)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds before each reply")
    args = parser.parse_args()
    server = FakeServer(latency=args.latency, port=args.port).start()
    print(f"fake OpenAI server at {server.url}", flush=True)
    try:
        server._thread.join()
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":
    main()
