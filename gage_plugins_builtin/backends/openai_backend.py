"""Any OpenAI-compatible HTTP server (OpenAI, vLLM serve, llama.cpp, TGI, LM Studio, ...).

    gage-eval --tasks T --model openai \\
        --model-args base_url=http://127.0.0.1:8000/v1,model=NAME,concurrency=64

- generate with ``chat: true``: ``POST {base_url}/chat/completions`` with the messages
  (images as ``image_url`` parts: http(s) URLs as they are, local files as data URLs;
  only with ``vision=true``).
- generate without chat: ``POST {base_url}/completions`` with the rendered prompt
  (``endpoint=chat`` sends it as one user message instead, for chat-only servers).
- loglikelihood: ``POST {base_url}/completions`` with ``echo: true, logprobs: 1,
  max_tokens: 1`` for context + continuation; the continuation's log-probability is
  the sum of the echoed token log-probabilities from its first character on
  (located with ``text_offset``). A server without echoed logprobs gives every such
  row a clear error; ``loglikelihood=false`` refuses those tasks before any request.

Arguments (``--model-args k=v,...``): ``base_url``, ``model`` (default: the only model
``GET {base_url}/models`` lists), ``api_key_env`` (the variable holding the key, default
OPENAI_API_KEY; unset is fine for local servers), ``concurrency`` (requests in flight,
default 32), ``timeout`` (seconds per attempt, default 120), ``max_retries`` (default 5),
``backoff`` / ``backoff_max`` (seconds, default 1 / 30), ``retry_after_max`` (longest
Retry-After honoured, default 120), ``max_tokens`` (when the task sets no
max_new_tokens, default 256), ``stream`` (true: stream replies and record time to first
token), ``vision``, ``endpoint`` (auto or chat), ``loglikelihood``, ``batch_size`` (rows the
engine hands over at once, default 16 x concurrency: requests stay in flight for 16 rounds
before the window drains and is written; a crash loses at most this many answers in flight),
and extra HTTP headers as
``header_NAME=VALUE`` (e.g. ``header_X-Team=eval``) or a ``headers`` mapping in a run config.
The key is sent as ``Authorization: Bearer``; it is never written anywhere. Requests go
through aiohttp (about 0.3 ms of client CPU a request; see benchmarks/README.md), honouring
``HTTP_PROXY``/``HTTPS_PROXY``/``NO_PROXY``.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import time
import urllib.parse
import urllib.request
from typing import Any, Mapping, Sequence

from gage_eval.backend import GENERATE, LOGLIKELIHOOD, Backend, ModelOutput, Request
from gage_eval.errors import GageError
from gage_plugins_builtin.backends.args import as_bool, as_number
from gage_eval.redact import SECRET_KEY
from gage_plugins_builtin.backends import openai_payload as payload
from gage_plugins_builtin.backends.openai_http import Poster, RequestFailed, ServerUnsupported, eager_body_writes


def env_proxy(url: str) -> str | None:
    """The proxy ``HTTP_PROXY``/``HTTPS_PROXY`` name for ``url`` unless ``NO_PROXY`` exempts it.

    Looked up once per backend: aiohttp's ``trust_env`` looks it up on every request, which
    cost a sixth of the throughput at 64 requests in flight (benchmarks/README.md).
    """
    parts = urllib.parse.urlsplit(url)
    if urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    return urllib.request.getproxies().get(parts.scheme) or None


class Slots:
    """The concurrency limit: at most ``concurrency`` requests of this call hold the session at once."""

    def __init__(self, session: Any, concurrency: int):
        self.session = session
        self.semaphore = asyncio.Semaphore(concurrency)

    async def __aenter__(self) -> Any:
        await self.semaphore.acquire()
        return self.session

    async def __aexit__(self, *exc: Any) -> None:
        self.semaphore.release()

INSTALL = "pip install 'gage-eval[openai]'"
ENDPOINTS = ("auto", "chat")


def _import_aiohttp():
    try:
        import aiohttp
    except ImportError:
        raise GageError(f"the openai backend needs aiohttp: {INSTALL}") from None
    return aiohttp


def _flag(name: str, value: Any) -> bool:
    return as_bool(value, name, "openai backend")


def _number(name: str, value: Any, cast: type, minimum: float) -> Any:
    return as_number(value, name, "openai backend", cast, minimum)


def normalize_base_url(url: str) -> str:
    """``http://host:8000`` and ``http://host:8000/v1/`` both mean ``http://host:8000/v1``."""
    url = str(url).strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise GageError(f"openai backend: base_url must start with http:// or https://, not {url!r}")
    rest = url.partition("://")[2]
    if "/" not in rest:
        url += "/v1"
    return url


class OpenAIBackend(Backend):
    name = "openai"

    def __init__(self, base_url: str = "https://api.openai.com/v1", model: str | None = None,
                 api_key_env: str | None = None, concurrency: int = 32, timeout: float = 120.0,
                 max_retries: int = 5, backoff: float = 1.0, backoff_max: float = 30.0,
                 retry_after_max: float = 120.0, max_tokens: int = 256, stream: Any = False, vision: Any = False,
                 endpoint: str = "auto", loglikelihood: Any = True, batch_size: Any = None,
                 headers: Mapping[str, Any] | None = None, seed: int | None = None, **extra: Any):
        self.aiohttp = _import_aiohttp()
        if "api_key" in extra:
            raise GageError("openai backend: do not put the key in --model-args (it would sit in your shell "
                            "history); export it and name the variable with api_key_env=VAR "
                            "(default OPENAI_API_KEY)")
        self.headers = {str(k): str(v) for k, v in (headers or {}).items()}
        unknown = []
        for key, value in extra.items():
            if key.startswith("header_") and len(key) > len("header_"):
                self.headers[key[len("header_"):]] = str(value)
            else:
                unknown.append(key)
        if unknown:
            raise GageError(f"openai backend: unknown argument(s) {', '.join(sorted(unknown))} (extra HTTP "
                            f"headers are written header_NAME=VALUE)")
        self.base_url = normalize_base_url(base_url)
        self.model = None if model in (None, "") else str(model)
        env_given = api_key_env is not None
        self.api_key_env = str(api_key_env or "OPENAI_API_KEY")
        self.api_key = os.environ.get(self.api_key_env) or None
        if env_given and self.api_key is None:
            raise GageError(f"openai backend: api_key_env={self.api_key_env} names an environment variable that "
                            f"is not set (leave api_key_env out for a server that needs no key)")
        self.secrets: tuple[str, ...] = tuple(
            s for s in [self.api_key] + [v for k, v in self.headers.items() if SECRET_KEY.search(k)] if s)
        self.concurrency = _number("concurrency", concurrency, int, 1)
        self.timeout = _number("timeout", timeout, float, 0.001)
        self.max_tokens = _number("max_tokens", max_tokens, int, 1)
        self.stream = _flag("stream", stream)
        self.vision = _flag("vision", vision)
        self.endpoint = str(endpoint)
        if self.endpoint not in ENDPOINTS:
            raise GageError(f"openai backend: endpoint must be one of {', '.join(ENDPOINTS)}, not {endpoint!r}")
        self.loglikelihood = _flag("loglikelihood", loglikelihood)
        caps = {GENERATE, "chat"} | ({LOGLIKELIHOOD} if self.loglikelihood else set()) | \
            ({"vision"} if self.vision else set())
        self.capabilities = frozenset(caps)
        if batch_size in (None, "", "auto"):
            # each window ends in a drain (the last round's slots go idle) and a pause while its
            # records are written: 4 x concurrency reached 89% of c / latency over 5000 rows at
            # 64, 16 x 94% (benchmarks/README.md)
            self.max_batch = max(64, 16 * self.concurrency)
        else:
            self.max_batch = _number("batch_size", batch_size, int, 1)
        self.seed = None if seed is None else int(seed)
        proxy = env_proxy(self.base_url)
        proxy_password = urllib.parse.urlsplit(proxy).password if proxy else None
        if proxy_password:  # never echo a proxy's password in an error message
            self.secrets += (proxy_password,)
        self.poster = Poster(timeout=self.timeout, max_retries=_number("max_retries", max_retries, int, 0),
                             backoff=_number("backoff", backoff, float, 0), backoff_max=_number(
                                 "backoff_max", backoff_max, float, 0),
                             retry_after_max=_number("retry_after_max", retry_after_max, float, 0),
                             secrets=self.secrets, proxy=proxy)
        self.chat_url = f"{self.base_url}/chat/completions"
        self.completions_url = f"{self.base_url}/completions"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._session: Any = None  # the aiohttp session of self._loop, kept across run() calls
        self._no_echo: str | None = None

    # -- lifecycle ---------------------------------------------------------------
    def open(self) -> None:
        if self.model is None:
            self.model = self._run_coro(self._find_model())

    async def _find_model(self) -> str:
        """The one model ``GET {base_url}/models`` lists."""
        aiohttp = self.aiohttp
        url = f"{self.base_url}/models"
        try:
            async with aiohttp.ClientSession(headers=self._headers()) as session:
                async with session.get(url, timeout=aiohttp.ClientTimeout(total=min(self.timeout, 30.0)),
                                       proxy=self.poster.proxy) as r:
                    status, content = r.status, await r.read()
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            raise GageError(self.poster.scrub(f"openai backend: cannot reach {url} to find the model "
                                              f"({type(exc).__name__}: {exc}); is the server running? "
                                              f"(or give model=NAME)")) from None
        try:
            names = [m["id"] for m in json.loads(content)["data"]]
        except (ValueError, KeyError, TypeError):
            names = []
        if status != 200 or len(names) != 1:
            listed = f"it lists {', '.join(names[:10])}" if names else f"HTTP {status}"
            raise GageError(f"openai backend: give model=NAME in --model-args ({url}: {listed})")
        return str(names[0])

    @property
    def model_id(self) -> str:  # type: ignore[override]
        return self.model or "openai"

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", **self.headers}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def settings(self) -> dict[str, Any]:
        # no key here may look secret (api_key, token, ...): redaction would mask its value
        return {"base_url": self.base_url, "model": self.model, "api_key_env": self.api_key_env,
                "authenticated": self.api_key is not None, "concurrency": self.concurrency,
                "timeout_s": self.timeout, "max_retries": self.poster.max_retries, "backoff_s": self.poster.backoff,
                "backoff_max_s": self.poster.backoff_max, "default_generation_length": self.max_tokens,
                "stream": self.stream, "vision": self.vision, "endpoint": self.endpoint,
                "batch_size": self.max_batch, "seed": self.seed, "header_names": sorted(self.headers),
                "proxy": self.poster.proxy is not None}

    def close(self) -> None:
        loop, self._loop = self._loop, None
        session, self._session = self._session, None
        if loop is not None and not loop.is_closed():
            if session is not None:
                loop.run_until_complete(session.close())
            loop.close()

    # -- running -------------------------------------------------------------------
    def run(self, requests: Sequence[Request]) -> list[ModelOutput]:
        """One event loop for the whole run, so connections are reused between batches."""
        return self._run_coro(self.arun(requests))

    def _run_coro(self, coro: Any) -> Any:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            if self._loop is None or self._loop.is_closed():
                self._loop = asyncio.new_event_loop()
                eager_body_writes(self._loop)
            return self._loop.run_until_complete(coro)

        async def in_thread() -> Any:  # called inside someone's event loop: run ours in a thread
            eager_body_writes(asyncio.get_running_loop())
            return await coro

        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, in_thread()).result()  # its exception is raised here

    def _new_session(self) -> Any:
        aiohttp = self.aiohttp
        # the concurrency limit is ours (a semaphore); the connector keeps that many connections alive
        connector = aiohttp.TCPConnector(limit=self.concurrency, limit_per_host=0, keepalive_timeout=60,
                                         ttl_dns_cache=300)
        return aiohttp.ClientSession(
            connector=connector, headers=self._headers(),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=min(self.timeout, 30.0)))

    async def arun(self, requests: Sequence[Request]) -> list[ModelOutput]:
        if self.model is None:
            self.model = await self._find_model()
        own = asyncio.get_running_loop() is self._loop
        session = self._session if own else None
        if session is None or session.closed:
            session = self._new_session()
            if own:  # a caller's own loop gets a session that closes with the call
                self._session = session
        slots = Slots(session, self.concurrency)
        try:
            return list(await asyncio.gather(*(self._one(slots, r) for r in requests)))
        finally:
            if session is not self._session:
                await session.close()

    async def _one(self, slots: Slots, req: Request) -> ModelOutput:
        try:
            if req.kind == LOGLIKELIHOOD:
                return await self._loglikelihood(slots, req)
            if req.kind == GENERATE:
                return await self._generate(slots, req)
            return ModelOutput(error=f"openai backend: unknown request kind {req.kind!r}")
        except RequestFailed as exc:
            return ModelOutput(error=str(exc))
        except ValueError as exc:  # a request that cannot be built (unreadable image, ...)
            return ModelOutput(error=self.poster.scrub(f"openai backend: {exc}"))
        except Exception as exc:  # never lose a row to a surprise
            return ModelOutput(error=self.poster.scrub(f"openai backend: {type(exc).__name__}: {exc}"))

    async def _generate(self, slots: Slots, req: Request) -> ModelOutput:
        params = payload.sampling_params(req.gen, self.max_tokens, self.seed)
        chat = req.chat or self.endpoint == "chat"
        if chat:
            messages = payload.chat_messages(req.messages, self.vision) if req.chat and req.messages \
                else payload.prompt_messages(req.prompt or "")
            body: dict[str, Any] = {"model": self.model, "messages": messages, **params}
            url = self.chat_url
        else:
            body = {"model": self.model, "prompt": req.prompt or "", **params}
            url = self.completions_url
        if self.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}  # OpenAI and vLLM then send usage last
        async with slots as session:
            t0 = time.perf_counter()
            reply = await self.poster.post(session, url, body, lambda data: (data, payload.reply_text(data, chat)),
                                           stream=self.stream)
            latency = (time.perf_counter() - t0) * 1000
        data, text = reply.value
        i, o = payload.usage(data)
        choice = data["choices"][0]
        return ModelOutput(text=payload.cut_at_stop(text, params.get("stop")), input_tokens=i, output_tokens=o,
                           latency_ms=latency, time_to_first_token_ms=reply.ttft_ms,
                           finish_reason=choice.get("finish_reason"),
                           raw={"attempts": reply.attempts} if reply.attempts > 1 else None)

    async def _loglikelihood(self, slots: Slots, req: Request) -> ModelOutput:
        if self._no_echo:
            return ModelOutput(error=self._no_echo)
        context = req.prompt or ""
        t0 = time.perf_counter()
        parts = await asyncio.gather(*(self._score(slots, context, c) for c in req.continuations),
                                     return_exceptions=True)
        latency = (time.perf_counter() - t0) * 1000
        for part in parts:
            if isinstance(part, BaseException):
                raise part
        lls = [p[0] for p in parts]
        greedy = [p[1] for p in parts]
        tokens = [p[2] for p in parts]
        attempts = sum(p[3] for p in parts)
        return ModelOutput(loglikelihoods=lls, is_greedy=None if None in greedy else greedy,
                           input_tokens=sum(tokens) if None not in tokens else None, latency_ms=latency,
                           raw={"attempts": attempts} if attempts > len(parts) else None)

    async def _score(self, slots: Slots, context: str,
                     continuation: str) -> tuple[float, bool | None, int | None, int]:
        body = {"model": self.model, "prompt": context + continuation, "echo": True, "logprobs": 1,
                "max_tokens": 1, "temperature": 0.0}
        if self.seed is not None:
            body["seed"] = self.seed
        url = self.completions_url

        def parse(data: Any) -> tuple[float, bool | None, int | None]:
            value, greedy = payload.continuation_logprob(data, context, continuation)
            return value, greedy, payload.usage(data)[0]

        async with slots as session:
            if self._no_echo:  # learnt while this request waited for its turn
                raise RequestFailed(self._no_echo)
            try:
                reply = await self.poster.post(session, url, body, parse)
            except ServerUnsupported as exc:
                self._no_echo = f"{exc} (this server cannot score log-likelihood tasks; run generate tasks " \
                                f"on it, or set loglikelihood=false to refuse them up front)"
                raise RequestFailed(self._no_echo) from None
        return (*reply.value, reply.attempts)


def openai_backend(**kwargs: Any) -> OpenAIBackend:
    """The registered factory (``--model openai``)."""
    return OpenAIBackend(**kwargs)
