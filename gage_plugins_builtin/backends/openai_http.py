"""POSTs to an OpenAI-compatible server with retries, backoff and a per-attempt deadline.

Retried: 408, 409, 429 and 5xx replies (waiting at least ``Retry-After``), timeouts,
refused or dropped connections, and replies that are not the JSON the endpoint
promises. Not retried: other 4xx replies (a bad request stays bad) and a server
that lacks a feature (:class:`Unsupported`).
"""
from __future__ import annotations

import asyncio
import contextvars
import email.utils
import json
import random
import sys
import time
import types
from dataclasses import dataclass
from typing import Any, Callable

from gage_eval.redact import scrub
from gage_plugins_builtin.backends.openai_payload import BadReply, Unscorable, Unsupported

RETRY_STATUS = frozenset({408, 409, 429})


class Retryable(Exception):
    def __init__(self, reason: str, retry_after: float | None = None):
        super().__init__(reason)
        self.retry_after = retry_after


class RequestFailed(Exception):
    """The request failed for good; the message is the row's error (secrets removed)."""


class ServerUnsupported(RequestFailed):
    """The server lacks what the request needs; every like request will fail the same way."""


@dataclass
class Reply:
    value: Any
    attempts: int
    ttft_ms: float | None = None


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """``Retry-After`` as seconds: a number, or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


class Poster:
    """One backend's retry policy; the aiohttp session is passed in (it belongs to an event loop)."""

    def __init__(self, *, timeout: float, max_retries: int, backoff: float, backoff_max: float,
                 retry_after_max: float, secrets: tuple[str, ...] = (), proxy: str | None = None):
        self.timeout = timeout
        self.proxy = proxy
        self.max_retries = max_retries
        self.backoff = backoff
        self.backoff_max = backoff_max
        self.retry_after_max = retry_after_max
        self.secrets = tuple(s for s in secrets if s)
        self.rng = random.Random()

    def scrub(self, text: str) -> str:
        return scrub(text, self.secrets, min_len=1)  # every secret we know of, however short

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """Exponential backoff with jitter (half fixed, half random); at least the server's Retry-After."""
        cap = min(self.backoff_max, self.backoff * 2 ** (attempt - 1))
        wait = cap / 2 + self.rng.uniform(0, cap / 2)
        if retry_after is not None:
            wait = max(wait, min(retry_after, self.retry_after_max))
        return wait

    async def post(self, session: Any, url: str, body: dict, parse: Callable[[Any], Any],
                   stream: bool = False) -> Reply:
        """POST ``body``, parse the reply with ``parse`` (a :class:`BadReply` there is retried)."""
        import aiohttp

        data = json.dumps(body).encode()
        reasons: list[str] = []
        attempt = 0
        while True:
            attempt += 1
            retry_after = None
            try:
                coro = self._stream(session, url, data, parse) if stream else self._once(session, url, data, parse)
                if hasattr(asyncio, "timeout"):  # 3.11+: no extra task per attempt
                    async with asyncio.timeout(self.timeout):
                        value, ttft = await coro
                else:
                    value, ttft = await asyncio.wait_for(coro, self.timeout)
                return Reply(value, attempt, ttft)
            except Retryable as exc:
                reason, retry_after = str(exc), exc.retry_after
            except BadReply as exc:
                reason = f"bad reply: {exc}"
            except asyncio.TimeoutError:  # aiohttp's own timeouts are asyncio.TimeoutError too
                reason = f"timed out after {self.timeout:g} s"
            except aiohttp.ClientPayloadError:
                reason = "connection error: the reply ended before the length it announced"
            except (aiohttp.ClientError, OSError) as exc:
                reason = f"connection error: {type(exc).__name__}: {_first_line(exc)}" if str(exc) else \
                    f"connection error: {type(exc).__name__}"
            except RequestFailed as exc:
                raise type(exc)(self.scrub(f"{url}: {exc}")) from None
            except Unsupported as exc:
                raise ServerUnsupported(self.scrub(f"{url}: {exc}")) from None
            except Unscorable as exc:
                raise RequestFailed(self.scrub(f"{url}: {exc}")) from None
            reasons.append(reason)
            if attempt > self.max_retries:
                history = "; ".join(_squash(reasons[:-1])) if len(reasons) > 1 else "none"
                raise RequestFailed(self.scrub(
                    f"{url}: gave up after {attempt} attempt(s): {reason} (earlier: {history})"))
            await asyncio.sleep(self.delay(attempt, retry_after))

    async def _once(self, session: Any, url: str, data: bytes, parse: Callable[[Any], Any]) -> tuple[Any, None]:
        async with session.post(url, data=data, proxy=self.proxy) as response:
            content = await response.read()
            status = response.status
            if status >= 400:
                self._check_status(status, response.headers, content.decode("utf-8", "replace"))
        try:
            reply = json.loads(content)
        except ValueError:
            raise BadReply(f"not JSON: {content[:80].decode('utf-8', 'replace')!r}") from None
        return parse(reply), None

    async def _stream(self, session: Any, url: str, data: bytes,
                      parse: Callable[[Any], Any]) -> tuple[Any, float | None]:
        t0 = time.perf_counter()
        ttft = None
        chunks: list[dict] = []
        async with session.post(url, data=data, proxy=self.proxy) as response:
            if response.status >= 400:
                text = (await response.read()).decode("utf-8", "replace")
                self._check_status(response.status, response.headers, text)
            done = False
            async for raw in _lines(response.content):
                line = raw.strip()
                if done or not line.startswith("data:"):
                    continue  # read to the end, so the connection can be reused
                payload = line[5:].strip()
                if payload == "[DONE]":
                    done = True
                    continue
                try:
                    chunk = json.loads(payload)
                except ValueError:
                    raise BadReply(f"a stream event is not JSON: {payload[:80]!r}") from None
                if not isinstance(chunk, dict):
                    raise BadReply("a stream event is not a JSON object")
                if "error" in chunk and not chunk.get("choices"):
                    raise Retryable(f"error event in the stream: {str(chunk['error'])[:200]}")
                if ttft is None and _chunk_text(chunk):
                    ttft = (time.perf_counter() - t0) * 1000
                chunks.append(chunk)
        return parse(merge_stream(chunks)), ttft

    def _check_status(self, status: int, headers: Any, text: str) -> None:
        detail = _error_detail(text)
        if status in RETRY_STATUS or status >= 500:
            raise Retryable(f"HTTP {status}{detail}", retry_after_seconds(headers.get("retry-after")))
        raise RequestFailed(self.scrub(f"HTTP {status}{detail}"))


async def _lines(content: Any):
    """The decoded lines of a streamed body, however the server cuts its chunks (no line-length limit)."""
    pending = b""
    async for piece in content.iter_any():
        pending += piece
        if b"\n" not in piece:
            continue
        *complete, pending = pending.split(b"\n")
        for line in complete:
            yield line.decode("utf-8", "replace")
    if pending:
        yield pending.decode("utf-8", "replace")


def eager_body_writes(loop: asyncio.AbstractEventLoop) -> None:
    """On Python 3.11, start aiohttp's request-body writer at once, as aiohttp itself does on 3.12+.

    aiohttp sends a POST's body from a task of its own. From Python 3.12 on it starts that task
    eagerly, so the request leaves in the same loop turn; on 3.11 the task waits a turn, and when
    64 replies arrive together every next request waits behind all the others' work before a byte
    of it is sent. At concurrency 64 against a 100 ms server that is 88% of c / latency against
    92% (benchmarks/README.md). This task factory runs the body writer's first step on the spot
    and leaves every other task alone. Installed only on event loops the backend creates, and
    only on 3.11 (3.10 tasks take no context; 3.12+ needs nothing).
    """
    if sys.version_info[:2] != (3, 11) or loop.get_task_factory() is not None:
        return
    try:
        from aiohttp.client_reqrep import ClientRequest
        code = ClientRequest.write_bytes.__code__
    except (ImportError, AttributeError):  # another aiohttp layout: keep its default
        return
    loop.set_task_factory(eager_factory(code))


def eager_factory(code: types.CodeType) -> Callable[..., Any]:
    """A 3.11 task factory that runs coroutines of ``code`` up to their first wait when created.

    What ``asyncio.Task(..., eager_start=True)`` does on 3.12: the first step runs in the task's
    own context; a coroutine done in that step gives a finished future; one still waiting goes
    on in a task, where cancelling it reaches the coroutine. Any other coroutine, or any created
    while the loop is not running, becomes an ordinary task.
    """
    def factory(loop: asyncio.AbstractEventLoop, coro: Any, context: contextvars.Context | None = None) -> Any:
        if getattr(coro, "cr_code", None) is not code or not loop.is_running():
            return asyncio.Task(coro, loop=loop, context=context)
        context = context if context is not None else contextvars.copy_context()
        done = loop.create_future()
        try:
            first = context.run(coro.send, None)
        except StopIteration as stop:
            done.set_result(stop.value)
            return done
        except BaseException as exc:  # noqa: B036 - the task's outcome, as an eager task keeps it
            done.set_exception(exc)
            return done
        return asyncio.Task(_resumed(coro, first), loop=loop, context=context)

    return factory


async def _resumed(coro: Any, first: Any) -> Any:
    return await _continue(coro, first)


@types.coroutine
def _continue(coro: Any, first: Any):
    """Go on with a coroutine already stepped once (it yielded ``first``), passing sends and throws on."""
    to_yield = first
    while True:
        try:
            sent = yield to_yield
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as exc:  # cancellation and the like go to the coroutine
            try:
                to_yield = coro.throw(exc)
            except StopIteration as stop:
                return stop.value
            continue
        try:
            to_yield = coro.send(sent)
        except StopIteration as stop:
            return stop.value


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().split("\n")[0][:200]


def _error_detail(text: str) -> str:
    try:
        data = json.loads(text)
        err = data.get("error", data) if isinstance(data, dict) else data
        message = err.get("message", err) if isinstance(err, dict) else err
        text = str(message)
    except ValueError:
        pass
    text = " ".join(text.split())
    return f": {text[:300]}" if text else ""


def _squash(reasons: list[str]) -> list[str]:
    out: list[str] = []
    for r in reasons:
        short = r[:120]
        if out and out[-1].split(" x")[0] == short:
            head, _, n = out[-1].rpartition(" x")
            out[-1] = f"{head} x{int(n) + 1}" if n.isdigit() else f"{short} x2"
        else:
            out.append(short)
    return out


def _chunk_text(chunk: dict) -> str:
    for choice in chunk.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        if isinstance(delta, dict) and delta.get("content"):
            return str(delta["content"])
        if choice.get("text"):
            return str(choice["text"])
    return ""


def merge_stream(chunks: list[dict]) -> dict:
    """Server-sent chunks as the one reply a non-streaming call would have given."""
    if not chunks:
        raise BadReply("the stream ended without any event")
    text: list[str] = []
    finish = None
    chat = False
    usage = None
    for chunk in chunks:
        if isinstance(chunk.get("usage"), dict):
            usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            if isinstance(delta, dict):
                chat = True
                text.append(str(delta.get("content") or ""))
            elif choice.get("text") is not None:
                text.append(str(choice["text"]))
            finish = choice.get("finish_reason") or finish
    joined = "".join(text)
    choice = {"message": {"role": "assistant", "content": joined}} if chat else {"text": joined}
    choice["finish_reason"] = finish
    reply: dict = {"choices": [choice]}
    if usage is not None:
        reply["usage"] = usage
    return reply
