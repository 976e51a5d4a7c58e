"""Any OpenAI-compatible HTTP server (OpenAI, vLLM serve, llama.cpp, TGI, LM Studio, ...).

    gage-eval --tasks T --model openai \\
        --model-args base_url=http://127.0.0.1:8000/v1,model=NAME,concurrency=64

- generate with ``chat: true``: ``POST {base_url}/chat/completions`` with the messages
  (images as ``image_url`` parts: http(s) URLs as they are, local files as data URLs;
  only with ``vision=true``).
- generate without chat: ``POST {base_url}/completions`` with the rendered prompt
  (``endpoint=chat`` sends it as one user message instead, for chat-only servers).
- loglikelihood: ``POST {base_url}/completions`` with ``echo: true, logprobs: 1,
  max_tokens: 1``. With ``tokenizer=`` (a folder or hub id) the pair is split into tokens by
  the shared rule (:mod:`gage_eval.api.loglikelihood`), sent as token ids, and the echoed
  log-probabilities at the continuation's positions are summed, as lm-eval's
  ``local-completions``. Without it, context + continuation go as text and the sum runs
  from the token holding the first character after the stripped context (trailing
  whitespace belongs to the continuation; located with ``text_offset``). A server without
  echoed logprobs gives every such row a clear error; ``loglikelihood=false`` refuses
  those tasks before any request.
- loglikelihood_rolling (perplexity; only with ``tokenizer=``): the text's tokens in lm-eval's
  rolling windows of ``max_length - 2`` (``max_length``, the model's context length, default
  2048 as lm-eval's API models), each window sent as token ids as above and the sums added.

Arguments (``--model-args k=v,...``): ``base_url`` (one, or several: below), ``model`` (default: the only model
``GET {base_url}/models`` lists), ``tokenizer`` (the model's tokenizer, a folder or hub id:
log-likelihood pairs go as token ids split by the shared rule), ``api_key_env`` (the variable holding the key, default
OPENAI_API_KEY; unset is fine for local servers), ``concurrency`` (requests in flight,
default $GAGE_EVAL_CONCURRENCY, else 32), ``max_tokens`` (when the task sets no max_new_tokens, default 256), ``max_length``
(the model's context length for perplexity windows, default 2048), ``stream``
(true: stream replies and record time to first token), ``vision`` (with ``min_pixels``, ``max_pixels``,
``image_factor``: local and data images resized by Qwen2.5-VL's rule; ``default_prompt``: the text an
image-only user turn gets), ``endpoint`` (auto or
chat), ``loglikelihood``, ``batch_size`` (rows the engine hands over at once, default 16 x
concurrency: each window ends in a drain; ``stream()`` hands every answer over as it
arrives, so an interrupt loses only the requests in flight), and extra HTTP headers as
``header_NAME=VALUE`` (e.g. ``header_X-Team=eval``) or a ``headers`` mapping in a run config.

Failure bounds (openai_http.py; benchmarks/README.md "HTTP failure bounds"):
``connect_timeout`` (default 10 s), ``read_timeout`` (the longest silence from the server,
default 60 s: for a reply that is not streamed, the time to the whole answer), ``timeout``
(one attempt in all, default 120 s: bounds a server that drips), ``max_retries`` (default 5)
with ``backoff`` / ``backoff_max`` (seconds, default 1 / 30) and ``retry_after_max``
(longest Retry-After honoured, default 120); ``max_response_bytes`` (default 8 MiB: a bigger
reply fails its row, unkept); ``max_consecutive_failures`` (default 5, 0 turns it off) and
``breaker_seconds`` (default 10): that many failures in a row (connection errors, timeouts,
5xx, broken replies; one prompt's own failures count once), over at least that long, stop
the run (a request that runs out of retries sooner fails its own row). A 401, 403, 404 or model-not-found answer stops it
at once. Stopping is :class:`~gage_eval.api.errors.FatalBackendError` from ``run`` and ``stream``.

Several endpoints (:mod:`~gage_plugins_builtin.backends.openai_endpoints`): servers of one
model as ``base_url=http://a:8000/v1|http://b:8000/v1`` (``|`` between URLs; a list in a run
config). Each attempt goes to the healthy endpoint with the fewest requests in flight (ties in
turn). A connection error, timeout, 5xx or broken reply takes that endpoint out of the
rotation for ``endpoint_backoff`` seconds (default 2, doubled while it keeps failing, up to
``endpoint_backoff_max``, default 60) and the retry goes to another endpoint at once, outside
the retry budget; after its back-off an endpoint gets one request, and all its share again
once that is answered. The retries and the breaker bound a request and the run only while
every endpoint is out; a fatal answer from any endpoint stops the run, naming it. ``model``
is found on the first endpoint that answers ``GET /models``. ``settings()`` lists every URL
(user-info removed; each may carry its own, sent only there); :meth:`OpenAIBackend.endpoint_counts`
gives the attempts and failures per endpoint, printed on stderr at ``close()``. One URL
behaves as it always did.

Credentials: the key (sent as ``Authorization: Bearer``), user-info in ``base_url``
(``http://user:PASS@host/v1``, sent as ``Authorization: Basic``), every header value, the
value of each query parameter of ``base_url`` whose name looks secret
(``?api-key=K``, :func:`~gage_eval.api.secrets.is_secret_query_name`; the query follows each
request's path and is shown as ``?api-key=***``) and a proxy's password are the backend's ``secrets``: none is in ``settings()``, ``model_id``
or any error message, and a value that is the redacted placeholder ``***`` (a stored run's
settings) is refused, never sent. Requests go through aiohttp (about 0.3 ms of client CPU a
request; see benchmarks/README.md), honouring ``HTTP_PROXY``/``HTTPS_PROXY``/``NO_PROXY``.
"""
from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import json
import os
import queue
import signal
import sys
import threading
import time
import urllib.parse
import urllib.request
from typing import Any, Callable, Iterator, Mapping, Sequence

from gage_eval.api import (GENERATE, LOGLIKELIHOOD, LOGLIKELIHOOD_ROLLING, Backend, FatalBackendError, GageError,
                           ModelOutput, Request, loglikelihood, secrets)
from gage_plugins_builtin.backends import openai_payload as payload
from gage_plugins_builtin.backends.args import NO_MINIMUM, as_bool, as_number, image_args
from gage_plugins_builtin.backends.openai_endpoints import SEPARATOR, Endpoint, Router, sent_url, split_urls
from gage_plugins_builtin.tools import prompting
from gage_plugins_builtin.backends.openai_http import (
    Fatal, Poster, RequestFailed, ServerUnsupported, TooLarge, classify, eager_body_writes, error_detail, error_text,
    read_body)


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
    """The concurrency limit: at most ``concurrency`` attempts of this call hold the session at once."""

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
TOOL_MODES = ("native", "prompt")


def _import_aiohttp():
    try:
        import aiohttp
    except ImportError:
        raise GageError(f"the openai backend needs aiohttp: {INSTALL}") from None
    return aiohttp


def _flag(name: str, value: Any) -> bool:
    return as_bool(value, name, "openai backend")


ENV_CONCURRENCY = ("GAGE_EVAL_CONCURRENCY", "GAGE_EVAL_THREADS")


def _number(name: str, value: Any, cast: type, minimum: float) -> Any:
    return as_number(value, name, "openai backend", cast, minimum)


def normalize_base_url(url: str) -> str:
    """``http://host:8000`` and ``http://host:8000/v1/`` both mean ``http://host:8000/v1``
    (a query string stays at the end: ``http://host:8000?api-key=K`` is ``http://host:8000/v1?api-key=K``)."""
    url, mark, query = str(url).strip().partition("?")
    url = url.partition("#")[0].rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise GageError(f"openai backend: base_url must start with http:// or https://, not "
                        f"{secrets.strip_credentials(url + mark + query)!r}")
    rest = url.partition("://")[2]
    if "/" not in rest.rpartition("@")[2]:
        url += "/v1"
    return url + mark + query.partition("#")[0]


def _placeholder(what: str) -> GageError:
    return GageError(f"openai backend: {what} is the redacted placeholder {secrets.REDACTED!r}, not a credential (a "
                     f"stored run keeps no secrets): give the real value again")


class Credentials:
    """Who the backend says it is: the headers it sends and the secrets they hold.

    One ``Authorization`` header carries one credential: the URL's user-info (Basic), a
    ``header_Authorization`` given, or the key (Bearer). Two of them given explicitly are
    refused rather than guessed at; the default OPENAI_API_KEY yields to the other two.
    """

    def __init__(self, base_url: str, api_key_env: str | None, headers: Mapping[str, str]):
        url, user, password = secrets.url_credentials(base_url)
        if secrets.REDACTED in (user, password):
            raise _placeholder("the user-info in base_url")
        parts = urllib.parse.urlsplit(url)
        self.base = urllib.parse.urlunsplit(parts._replace(query="", fragment=""))  # a request: base + path
        self.query = parts.query  # sent after the path of every request (Azure's ?api-key=K)
        self.url = secrets.masked_url(url)  # user-info removed, secret query values masked: shown anywhere
        query_keys: list[str] = []
        for name, value in secrets.query_secrets(url):
            if urllib.parse.unquote_plus(value) == secrets.REDACTED:
                raise _placeholder(f"the {name} query parameter of base_url")
            query_keys += secrets.secret_forms(value)
        if query_keys:  # and as aiohttp sends them (yarl requotes: %2F -> /), which a server may quote back
            import yarl

            sent = f"?{yarl.URL(f'http://h/?{self.query}').raw_query_string}"
            query_keys += [f for _, v in secrets.query_secrets(sent) for f in secrets.secret_forms(v)]
        self.api_key_env = str(api_key_env or "OPENAI_API_KEY")
        self.api_key = os.environ.get(self.api_key_env) or None
        if api_key_env is not None and self.api_key is None:
            raise GageError(f"openai backend: api_key_env={self.api_key_env} names an environment variable that "
                            f"is not set (leave api_key_env out for a server that needs no key)")
        self.headers = {"Content-Type": "application/json", **headers}
        held: list[str] = [*headers.values(), *query_keys]
        for name, value in headers.items():
            if value == secrets.REDACTED:
                raise _placeholder(f"header_{name}")
        given_auth = next((n for n in headers if n.lower() == "authorization"), None)
        self.scheme: str | None = None
        if user is not None or password is not None:
            if api_key_env is not None or given_auth:
                raise GageError(f"openai backend: base_url carries a user and password, and "
                                f"{'header_' + given_auth if given_auth else 'api_key_env=' + self.api_key_env} "
                                f"another credential; one Authorization header carries one: drop one")
            pair = f"{user or ''}:{password or ''}"
            token = base64.b64encode(pair.encode()).decode()
            self.headers["Authorization"] = f"Basic {token}"
            self.scheme = "basic"
            held += [password or "", pair, token]
        elif given_auth:
            if api_key_env is not None:
                raise GageError(f"openai backend: header_{given_auth} and api_key_env={self.api_key_env} are two "
                                f"credentials; one Authorization header carries one: drop one")
            self.scheme = "header"
        elif self.api_key is not None:
            if self.api_key == secrets.REDACTED:
                raise _placeholder(f"the environment variable {self.api_key_env}")
            self.headers["Authorization"] = f"Bearer {self.api_key}"
            self.scheme = "bearer"
        if self.api_key:
            held.append(self.api_key)
        self.secrets = tuple(dict.fromkeys(s for s in held if s))

    def hints(self) -> dict[str, str]:
        """What to check after a 401 or a 403 (names, never values)."""
        what = {"basic": "the user and password in base_url", "header": "the header_Authorization value",
                "bearer": f"the API key (api_key_env={self.api_key_env})"}.get(self.scheme or "")
        if what is None:
            return {"auth": "the server wants a key: export it and name it with api_key_env=VAR (OPENAI_API_KEY "
                            "is not set)", "forbidden": "the server refuses requests without credentials"}
        return {"auth": f"check {what}", "forbidden": f"check that {what} may use this model and endpoint"}


def _given_headers(headers: Mapping[str, Any] | None, extra: Mapping[str, Any]) -> dict[str, str]:
    """``headers`` and each ``header_NAME=VALUE`` of the other arguments (any other is refused)."""
    given = {str(k): str(v) for k, v in (headers or {}).items()}
    unknown = []
    for key, value in extra.items():
        if key.startswith("header_") and len(key) > len("header_"):
            given[key[len("header_"):]] = str(value)
        else:
            unknown.append(key)
    if unknown:
        raise GageError(f"openai backend: unknown argument(s) {', '.join(sorted(unknown))} (extra HTTP "
                        f"headers are written header_NAME=VALUE)")
    return given


def _default_concurrency() -> Any:
    """The machine's default: GAGE_EVAL_CONCURRENCY (spec 004: GAGE_EVAL_THREADS), else 32."""
    env = next((n for n in ENV_CONCURRENCY if os.environ.get(n, "").strip()), None)
    return _number(f"concurrency (environment variable {env})", os.environ[env], int, 1) if env else 32


def _proxy_secrets(proxies: Sequence[str | None]) -> tuple[str, ...]:
    """The proxies' passwords, never echoed in an error message (with the user:password pair and
    its Basic token, which a proxy may quote back)."""
    out: tuple[str, ...] = ()
    for proxy in dict.fromkeys(p for p in proxies if p):
        _, proxy_user, proxy_password = secrets.url_credentials(proxy)
        if proxy_password:
            pair = f"{proxy_user or ''}:{proxy_password}"
            out += (proxy_password, pair, base64.b64encode(pair.encode()).decode())
    return out


class OpenAIBackend(Backend):
    name = "openai"
    # how requests travel (batching, concurrency, timeouts, retries, the circuit breaker, streaming,
    # proxies, credentials' names), not what the model answers: no part of a cached reply's key
    transport_args = ("batch_size", "concurrency", "timeout_s", "connect_timeout_s", "read_timeout_s", "max_retries",
                      "backoff_s", "backoff_max_s", "max_response_bytes", "max_consecutive_failures",
                      "breaker_seconds", "stream", "proxy", "api_key_env", "authenticated", "auth_scheme",
                      "extra_headers", "endpoint_backoff_s", "endpoint_backoff_max_s")

    def __init__(self, base_url: Any = "https://api.openai.com/v1", model: str | None = None,
                 api_key_env: str | None = None, concurrency: Any = None, timeout: float = 120.0,
                 connect_timeout: float = 10.0, read_timeout: float = 60.0,
                 max_retries: int = 5, backoff: float = 1.0, backoff_max: float = 30.0,
                 retry_after_max: float = 120.0, max_response_bytes: int = 8 * 2 ** 20,
                 max_consecutive_failures: int = 5, breaker_seconds: float = 10.0,
                 max_tokens: int = 256, stream: Any = False, vision: Any = False,
                 endpoint: str = "auto", loglikelihood: Any = True, batch_size: Any = None,
                 headers: Mapping[str, Any] | None = None, seed: int | None = None,
                 tokenizer: str | None = None, endpoint_backoff: float = 2.0, endpoint_backoff_max: float = 60.0,
                 default_prompt: str | None = None, max_length: Any = 2048, tool_mode: str = "native",
                 **extra: Any):
        self.aiohttp = _import_aiohttp()
        if "api_key" in extra:
            raise GageError("openai backend: do not put the key in --model-args (it would sit in your shell "
                            "history); export it and name the variable with api_key_env=VAR "
                            "(default OPENAI_API_KEY)")
        # images: resized by Qwen2.5-VL's rule when min_pixels/max_pixels/image_factor is given (media.ImageResize)
        self.resize, self.default_prompt, self.image_settings = image_args(extra, default_prompt, "openai backend")
        given_headers = _given_headers(headers, extra)
        self.header_names = sorted(given_headers)
        # several base URLs (A|B, or a list): one Credentials each (user-info may differ), one router
        self.endpoint_credentials = [Credentials(normalize_base_url(u), api_key_env, given_headers)
                                     for u in split_urls(base_url)]
        self.base_urls = [c.url for c in self.endpoint_credentials]  # no user-info, query keys masked: shown anywhere
        seen = set()
        for c in self.endpoint_credentials:
            if (c.base, c.query) in seen:
                raise GageError(f"openai backend: base_url lists {c.url} twice")
            seen.add((c.base, c.query))
        self.credentials = self.endpoint_credentials[0]
        self.base_url = self.base_urls[0] if len(self.base_urls) == 1 else SEPARATOR.join(self.base_urls)
        self.model = None if model in (None, "") else str(model)
        self.api_key_env = self.credentials.api_key_env
        self.secrets: tuple[str, ...] = tuple(dict.fromkeys(s for c in self.endpoint_credentials
                                                            for s in c.secrets))
        self.concurrency = _number("concurrency", _default_concurrency() if concurrency is None else concurrency, int, 1)
        self.max_tokens = _number("max_tokens", max_tokens, int, 1)
        self.stream_replies = _flag("stream", stream)  # not self.stream: that is Backend.stream
        self.vision = _flag("vision", vision)
        self.endpoint = str(endpoint)
        if self.endpoint not in ENDPOINTS:
            raise GageError(f"openai backend: endpoint must be one of {', '.join(ENDPOINTS)}, not {endpoint!r}")
        self.loglikelihood = _flag("loglikelihood", loglikelihood)
        # the model's context length: a text scored whole goes in windows of max_length - 2 tokens (lm-eval's API models)
        self.max_length = _number("max_length", max_length, int, 3)
        # native: tools and tool_choice go in the request and the reply's tool_calls are read;
        # prompt: the tools are described in the prompt and the calls read from the text
        self.tool_mode = str(tool_mode)
        if self.tool_mode not in TOOL_MODES:
            raise GageError(f"openai backend: tool_mode must be one of {', '.join(TOOL_MODES)}, not {tool_mode!r}")
        caps = {GENERATE, "chat", "tools"} | ({LOGLIKELIHOOD} if self.loglikelihood else set()) | \
            ({LOGLIKELIHOOD_ROLLING} if self.loglikelihood and tokenizer else set()) | \
            ({"vision"} if self.vision else set())
        self.capabilities = frozenset(caps)
        if batch_size in (None, "", "auto"):
            # each window ends in a drain (the last round's slots go idle): 4 x concurrency
            # reached 89% of c / latency over 5000 rows at 64, 16 x 94% (benchmarks/README.md,
            # measured when a window's records were written after it)
            self.max_batch = max(64, 16 * self.concurrency)
        else:
            self.max_batch = _number("batch_size", batch_size, int, 1)
        self.seed = None if seed is None else _number("seed", seed, int, NO_MINIMUM)
        proxies = [env_proxy(c.base) for c in self.endpoint_credentials]
        self.secrets += _proxy_secrets(proxies)
        proxy = proxies[0]
        not_found = "no such endpoint there: check base_url (it usually ends in /v1) and endpoint"
        several = len(self.base_urls) > 1
        self.router = Router(
            [Endpoint(i, c.base, c.headers if several else None, proxies[i], {**c.hints(), "not_found": not_found},
                      query=c.query, shown=c.url)
             for i, c in enumerate(self.endpoint_credentials)],
            backoff=_number("endpoint_backoff", endpoint_backoff, float, 0),
            backoff_max=_number("endpoint_backoff_max", endpoint_backoff_max, float, 0))
        self.poster = Poster(
            timeout=_number("timeout", timeout, float, 0.001),
            connect_timeout=_number("connect_timeout", connect_timeout, float, 0.001),
            read_timeout=_number("read_timeout", read_timeout, float, 0.001),
            max_retries=_number("max_retries", max_retries, int, 0),
            backoff=_number("backoff", backoff, float, 0), backoff_max=_number("backoff_max", backoff_max, float, 0),
            retry_after_max=_number("retry_after_max", retry_after_max, float, 0),
            max_response_bytes=_number("max_response_bytes", max_response_bytes, int, 1),
            max_consecutive_failures=_number("max_consecutive_failures", max_consecutive_failures, int, 0),
            breaker_seconds=_number("breaker_seconds", breaker_seconds, float, 0),
            secrets=self.secrets, proxy=proxy, endpoint=", ".join(self.base_urls),
            hints={**self.credentials.hints(), "not_found": not_found}, router=self.router)
        self.chat_url = "/chat/completions"  # paths: each attempt goes to the endpoint the router picks
        self.completions_url = "/completions"
        # requests run on an event loop of the backend's own, in a thread of its own (see _ensure_loop)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._session: Any = None  # the aiohttp session of self._loop, kept across calls
        self._no_echo: str | None = None
        self._counted = False  # the endpoints' counts were printed (close)
        self.tokenizer = None if tokenizer in (None, "") else str(tokenizer)
        self._encoder: tuple[Any, int | None] | None = None
        self._model_hint()

    def _model_hint(self) -> None:
        models = f"{self.credentials.base}/models" if len(self.base_urls) == 1 else "BASE_URL/models"
        self.poster.hints["model"] = (f"check model={self.model} (GET {models} lists what the "
                                      f"server has)")

    # -- lifecycle ---------------------------------------------------------------
    def open(self) -> None:
        if self.tokenizer:
            self._pair_encoder()
        if self.model is None:
            self.model = self._run_coro(self._find_model())
            self._model_hint()

    def _pair_encoder(self) -> tuple[Any, int | None]:
        """(encode, prefix token id) of ``tokenizer=``, loaded once."""
        if self._encoder is None:
            try:
                from transformers import AutoTokenizer
            except ImportError:
                raise GageError("openai backend: tokenizer= needs transformers: "
                                "pip install 'gage-eval[transformers]'") from None
            try:
                tok = AutoTokenizer.from_pretrained(self.tokenizer)
            except (OSError, ValueError) as exc:
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                raise GageError(f"openai backend: cannot load tokenizer={self.tokenizer}: {first}") from None
            self._encoder = (loglikelihood.tokenizer_encoder(tok), loglikelihood.prefix_token_id(tok))
            self._chat_tokenizer = tok  # its chat template formats a chat log-likelihood request's context
        return self._encoder

    async def _find_model(self) -> str:
        """The one model ``GET {base_url}/models`` lists: of the first endpoint that answers."""
        last: GageError | None = None
        for ep, creds in zip(self.router.endpoints, self.endpoint_credentials):
            try:
                return await self._find_model_at(ep, dict(creds.headers))
            except _Unreachable as exc:
                last = exc
        # a dead server, as the breaker says mid-run: the backend stopped the run (exit 3), not a usage error
        if len(self.base_urls) > 1:
            raise FatalBackendError(self.poster.scrub(f"openai backend: no endpoint answers GET /models (last: "
                                                      f"{last}); are the servers running? (or give model=NAME)"))
        raise FatalBackendError(str(last))

    async def _find_model_at(self, ep: Endpoint, headers: dict) -> str:
        aiohttp = self.aiohttp
        poster = self.poster
        proxy, hints = ep.proxy, ep.hints
        url = f"{ep.url}/models"  # in messages; the request carries the query too
        try:
            timeout = aiohttp.ClientTimeout(total=min(poster.timeout, 30.0), sock_connect=poster.connect_timeout,
                                            sock_read=poster.read_timeout)
            async with aiohttp.ClientSession(headers=headers, timeout=timeout) as s:
                async with s.get(sent_url(url, ep), proxy=proxy) as r:
                    status = r.status
                    if status >= 400:
                        text = await error_text(r)
                        kind = classify(status, text)
                        if kind in ("auth", "forbidden"):
                            raise Fatal(status, error_detail(text, poster.scrub), kind)
                        content = text.encode()
                    else:
                        content = await read_body(r, poster.max_response_bytes)
        except Fatal as exc:
            raise poster.stop(poster.fatal_message(url, exc, hints)) from None
        except TooLarge as exc:
            raise GageError(f"openai backend: {url}: {exc}") from None
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            raise _Unreachable(poster.scrub(f"openai backend: cannot reach {url} to find the model "
                                         f"({type(exc).__name__}: {exc}); is the server running? "
                                         f"(or give model=NAME)")) from None
        try:
            names = [m["id"] for m in json.loads(content)["data"]]
        except (ValueError, KeyError, TypeError):
            names = []
        if status != 200 or len(names) != 1:
            listed = f"it lists {', '.join(map(str, names[:10]))}" if names else f"HTTP {status}"
            raise GageError(poster.scrub(f"openai backend: give model=NAME in --model-args ({url}: {listed})"))
        return str(names[0])

    @property
    def model_id(self) -> str:  # type: ignore[override]
        return self.model or "openai"

    def _headers(self) -> dict[str, str] | None:
        """The session's headers: with several endpoints each request carries its endpoint's own."""
        return dict(self.credentials.headers) if len(self.base_urls) == 1 else None

    def endpoint_counts(self) -> list[dict[str, Any]]:
        """Per endpoint: its URL, the attempts sent there and the failures that took it out."""
        return self.router.counts()

    def stats(self) -> dict[str, Any]:
        """Per endpoint, the attempts sent and the failures that took it out of the rotation."""
        return {"endpoints": self.endpoint_counts()} if any(e.sent for e in self.router.endpoints) else {}

    def settings(self) -> dict[str, Any]:
        # no key here may look secret (api_key, token, header_*, ...): redaction would mask its value
        p = self.poster
        several = {} if len(self.base_urls) == 1 else {
            "endpoint_backoff_s": self.router.backoff, "endpoint_backoff_max_s": self.router.backoff_max}
        return {"base_url": self.base_url if not several else list(self.base_urls), "model": self.model, "api_key_env": self.api_key_env,
                "authenticated": self.credentials.scheme is not None, "auth_scheme": self.credentials.scheme,
                "concurrency": self.concurrency, "timeout_s": p.timeout, "connect_timeout_s": p.connect_timeout,
                "read_timeout_s": p.read_timeout, "max_retries": p.max_retries, "backoff_s": p.backoff,
                "backoff_max_s": p.backoff_max, "max_response_bytes": p.max_response_bytes,
                "max_consecutive_failures": p.breaker.limit, "breaker_seconds": p.breaker.min_seconds,
                "default_generation_length": self.max_tokens, "stream": self.stream_replies, "vision": self.vision,
                "endpoint": self.endpoint, "batch_size": self.max_batch, "seed": self.seed,
                "tokenizer": self.tokenizer, "max_length": self.max_length,
                "extra_headers": self.header_names, "proxy": any(e.proxy for e in self.router.endpoints),
                **several, **self.image_settings}

    def close(self) -> None:
        """Cancel whatever is still in flight, close the connections and stop the loop's thread.
        With several endpoints, one line on stderr says how many attempts each took and failed."""
        if len(self.base_urls) > 1 and any(e.sent for e in self.router.endpoints) and not self._counted:
            self._counted = True
            print("openai backend: " + "; ".join(f"{c['url']}: {c['requests']} requests, {c['failures']} failed"
                                                 for c in self.endpoint_counts()), file=sys.stderr)
        loop, thread, session = self._loop, self._thread, self._session
        self._loop = self._thread = self._session = None
        if loop is None or loop.is_closed():
            return

        async def shutdown() -> None:
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)
            if session is not None:
                await session.close()

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), loop).result(timeout=30)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            if thread is not None:
                thread.join(timeout=10)
            if thread is None or not thread.is_alive():
                loop.close()

    # -- running -------------------------------------------------------------------
    def run(self, requests: Sequence[Request]) -> list[ModelOutput]:
        """:meth:`stream`'s outputs in the requests' order.

        Raises :class:`FatalBackendError` once no further request can succeed (then and on
        every later call): a 401/403/404 or model-not-found answer, or the circuit breaker.
        """
        outputs: list = [None] * len(requests)
        for i, out in self.stream(requests):
            outputs[i] = out
        return outputs

    def stream(self, requests: Sequence[Request]) -> Iterator[tuple[int, ModelOutput]]:
        """Each request's output the moment its reply is in (completion order), at most
        ``concurrency`` requests in flight. The requests go on while the caller holds an
        output (they run on the backend's own thread), and another call on this backend, a
        judge's ``run`` say, may run meanwhile.

        :class:`FatalBackendError` is raised once no request can succeed (the outputs given
        before it stand); the requests still out are then cancelled, as they are when the
        caller closes the generator early or is interrupted (Ctrl-C, SIGTERM): it ends only
        when none of its requests is left running.
        """
        if self.poster.fatal is not None:
            raise self.poster.fatal
        if self.model is None:
            self.model = self._run_coro(self._find_model())
            self._model_hint()
        if not requests:
            return

        def start() -> list:
            if self._session is None or self._session.closed:
                self._session = self._new_session()
            slots = Slots(self._session, self.concurrency)
            return [self._one(slots, r) for r in requests]

        tasks, arrived = self._submit(start)
        try:
            for _ in range(len(tasks)):
                i = _take(arrived)
                task = tasks[i]
                if task.cancelled():  # close() from elsewhere
                    raise FatalBackendError("openai backend: closed while requests were in flight")
                if task.exception() is not None:
                    raise task.exception()  # FatalBackendError: _one turns every other failure into an output
                yield i, task.result()
        finally:
            self._cancel(tasks)

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        """The backend's event loop, running in a daemon thread, started on first use.

        The loop runs on while the caller works between two outputs of :meth:`stream` (writing
        rows, asking a judge), so replies are read as they come and no deadline runs out
        unattended. Connections are kept across calls. Ctrl-C and SIGTERM go to the main
        thread, which cancels its requests (:meth:`_cancel`).
        """
        if self._loop is None or self._loop.is_closed():
            loop = asyncio.new_event_loop()
            eager_body_writes(loop)
            started = threading.Event()

            def serve() -> None:
                if hasattr(signal, "pthread_sigmask"):
                    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
                asyncio.set_event_loop(loop)
                loop.call_soon(started.set)
                loop.run_forever()

            thread = threading.Thread(target=serve, name="gage-openai-loop", daemon=True)
            thread.start()
            started.wait()
            self._loop, self._thread = loop, thread
        return self._loop

    def _submit(self, make: Callable[[], list]) -> tuple[list[asyncio.Task], queue.SimpleQueue]:
        """Start the coroutines ``make()`` returns (called on the loop) as tasks of the backend's
        loop; each task's position goes into the returned queue when it ends."""
        arrived: queue.SimpleQueue = queue.SimpleQueue()

        async def start() -> list[asyncio.Task]:
            tasks = [asyncio.ensure_future(c) for c in make()]
            for k, task in enumerate(tasks):
                task.add_done_callback(lambda _, k=k: arrived.put(k))
            return tasks

        return _result(asyncio.run_coroutine_threadsafe(start(), self._ensure_loop())), arrived

    def _cancel(self, tasks: Sequence[asyncio.Task]) -> None:
        """Cancel the tasks not yet done and wait until each has ended (its connection released)."""
        loop = self._loop
        if loop is not None and not loop.is_closed() and not all(t.done() for t in tasks):
            async def stop() -> None:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

            _result(asyncio.run_coroutine_threadsafe(stop(), loop))
        for task in tasks:  # a fatal error is raised once; the others that carry it count as seen
            if task.done() and not task.cancelled():
                task.exception()

    def _run_coro(self, coro: Any) -> Any:
        """Run one coroutine on the backend's loop and wait for it; interrupted, it is cancelled."""
        (task,), arrived = self._submit(lambda: [coro])
        try:
            _take(arrived)
        finally:
            self._cancel([task])
        return task.result()

    def _new_session(self) -> Any:
        aiohttp = self.aiohttp
        # the concurrency limit is ours (a semaphore); the connector keeps that many connections alive
        connector = aiohttp.TCPConnector(limit=self.concurrency, limit_per_host=0, keepalive_timeout=60,
                                         ttl_dns_cache=300)
        return aiohttp.ClientSession(connector=connector, headers=self._headers(),
                                     timeout=self.poster.client_timeout(aiohttp))

    async def arun(self, requests: Sequence[Request]) -> list[ModelOutput]:
        """For callers with an event loop of their own: the requests run on it, with a session that
        closes with the call (the engine uses :meth:`stream`, on the backend's own loop)."""
        if self.poster.fatal is not None:
            raise self.poster.fatal
        if self.model is None:
            self.model = await self._find_model()
            self._model_hint()
        session = self._new_session()
        slots = Slots(session, self.concurrency)
        tasks = [asyncio.ensure_future(self._one(slots, r)) for r in requests]
        try:
            if tasks:
                await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            if self.poster.fatal is not None:
                raise self.poster.fatal
            return [t.result() for t in tasks]
        finally:
            for t in tasks:  # after a fatal answer, the requests still out are dropped
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await session.close()

    async def _one(self, slots: Slots, req: Request) -> ModelOutput:
        try:
            if req.kind == LOGLIKELIHOOD:
                return await self._loglikelihood(slots, req)
            if req.kind == LOGLIKELIHOOD_ROLLING:
                return await self._rolling(slots, req)
            if req.kind == GENERATE:
                return await self._generate(slots, req)
            return ModelOutput(error=f"openai backend: unknown request kind {req.kind!r}")
        except FatalBackendError:
            raise
        except RequestFailed as exc:
            return ModelOutput(error=str(exc))
        except ValueError as exc:  # a request that cannot be built (unreadable image, ...)
            return ModelOutput(error=self.poster.scrub(f"openai backend: {exc}"))
        except Exception as exc:  # never lose a row to a surprise
            return ModelOutput(error=self.poster.scrub(f"openai backend: {type(exc).__name__}: {exc}"))

    async def _generate(self, slots: Slots, req: Request) -> ModelOutput:
        params = payload.sampling_params(req.gen, self.max_tokens, self.seed)
        chat = req.chat or self.endpoint == "chat"
        prompted = bool(req.tools) and (self.tool_mode == "prompt" or not chat)
        if prompted:
            req = prompting.prompted(req)
        elif req.tools and self.stream_replies:
            return ModelOutput(error="openai backend: stream=true does not read tool calls; leave stream off for "
                                     "a task with tools")
        if chat:
            if req.chat and req.messages:
                # resizing decodes and encodes images: off the event loop, so other requests keep flowing
                args = (req.messages, self.vision, self.resize, self.default_prompt)
                messages = (await asyncio.to_thread(payload.chat_messages, *args) if self.resize is not None
                            else payload.chat_messages(*args))
            else:
                messages = payload.prompt_messages(req.prompt or "")
            body: dict[str, Any] = {"model": self.model, "messages": messages, **params}
            if req.tools:
                body["tools"] = list(req.tools)
                if req.tool_choice is not None:
                    body["tool_choice"] = req.tool_choice
            url = self.chat_url
        else:
            body = {"model": self.model, "prompt": req.prompt or "", **params}
            url = self.completions_url
        if self.stream_replies:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}  # OpenAI and vLLM then send usage last
        reply = await self.poster.post(slots, url, body, lambda data: (data, payload.reply_text(data, chat)),
                                       stream=self.stream_replies)
        data, text = reply.value
        i, o = payload.usage(data)
        choice = data["choices"][0]
        out = ModelOutput(text=payload.cut_at_stop(text, params.get("stop")), input_tokens=i, output_tokens=o,
                          latency_ms=reply.latency_ms, time_to_first_token_ms=reply.ttft_ms,
                          finish_reason=choice.get("finish_reason"),
                          raw={"attempts": reply.attempts} if reply.attempts > 1 else None,
                          tool_calls=payload.reply_tool_calls(choice) if chat else None)
        return prompting.read_calls(out) if prompted else out

    async def _loglikelihood(self, slots: Slots, req: Request) -> ModelOutput:
        if self._no_echo:
            return ModelOutput(error=self._no_echo)
        if req.chat and not self.tokenizer:
            return ModelOutput(error="openai backend: this log-likelihood request goes through the chat template "
                                     "(--apply-chat-template or request.chat), which a server does not apply "
                                     "for scoring: give tokenizer= (the model's tokenizer, whose template formats "
                                     "the context)")
        if req.chat:
            self._pair_encoder()
        context = loglikelihood.request_context(req, getattr(self, "_chat_tokenizer", None))
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

    async def _rolling(self, slots: Slots, req: Request) -> ModelOutput:
        """A whole text in lm-eval's rolling windows of ``max_length - 2`` scored tokens (one token of
        context, one the server generates), each sent as token ids; its log-likelihood is their sum."""
        if self._no_echo:
            return ModelOutput(error=self._no_echo)
        encode, prefix = self._pair_encoder()
        try:
            windows = loglikelihood.rolling_windows(encode(req.continuations[0], None), prefix, self.max_length - 2)
        except ValueError as exc:
            return ModelOutput(error=f"openai backend: cannot score: {exc}")
        if not windows:
            return ModelOutput(error="openai backend: the text encodes to no tokens")
        t0 = time.perf_counter()
        parts = await asyncio.gather(*(self._score_tokens(slots, w) for w in windows), return_exceptions=True)
        for part in parts:
            if isinstance(part, BaseException):
                raise part
        greedy = [p[1] for p in parts]
        attempts = sum(p[3] for p in parts)
        return ModelOutput(loglikelihoods=[sum(p[0] for p in parts)],
                           is_greedy=None if None in greedy else [all(greedy)],
                           input_tokens=sum(len(w.tokens) for w in windows),
                           latency_ms=(time.perf_counter() - t0) * 1000,
                           raw={"windows": len(windows), **({"attempts": attempts} if attempts > len(parts) else {})})

    async def _score_tokens(self, slots: Slots, pair: Any) -> tuple[float, bool | None, int | None, int]:
        """One window (a TokenPair) sent as token ids: its continuation's echoed log-probabilities summed."""
        body = {"model": self.model, "prompt": pair.tokens, "echo": True, "logprobs": 1, "max_tokens": 1,
                "temperature": 0.0}
        if self.seed is not None:
            body["seed"] = self.seed

        def parse(data: Any) -> tuple[float, bool | None, int | None]:
            return (*payload.token_logprob(data, len(pair.tokens), pair.scored), payload.usage(data)[0])

        try:
            reply = await self.poster.post(slots, self.completions_url, body, parse, gate=lambda: self._no_echo)
        except ServerUnsupported as exc:
            self._no_echo = f"{exc} (this server cannot score log-likelihood tasks; run generate tasks " \
                            f"on it, or set loglikelihood=false to refuse them up front)"
            raise RequestFailed(self._no_echo) from None
        return (*reply.value, reply.attempts)

    async def _score(self, slots: Slots, context: str,
                     continuation: str) -> tuple[float, bool | None, int | None, int]:
        if self.tokenizer:
            encode, prefix = self._pair_encoder()
            try:
                pair = loglikelihood.encode_pair(context, continuation, encode, prefix)
            except ValueError as exc:
                raise RequestFailed(f"openai backend: cannot score: {exc}") from None
            prompt: Any = pair.tokens
        else:
            prompt = context + continuation
        body = {"model": self.model, "prompt": prompt, "echo": True, "logprobs": 1,
                "max_tokens": 1, "temperature": 0.0}
        if self.seed is not None:
            body["seed"] = self.seed
        url = self.completions_url

        def parse(data: Any) -> tuple[float, bool | None, int | None]:
            if self.tokenizer:
                value, greedy = payload.token_logprob(data, len(pair.tokens), pair.scored)
            else:
                value, greedy = payload.continuation_logprob(data, context, continuation)
            return value, greedy, payload.usage(data)[0]

        try:
            reply = await self.poster.post(slots, url, body, parse, gate=lambda: self._no_echo)
        except ServerUnsupported as exc:
            self._no_echo = f"{exc} (this server cannot score log-likelihood tasks; run generate tasks " \
                            f"on it, or set loglikelihood=false to refuse them up front)"
            raise RequestFailed(self._no_echo) from None
        return (*reply.value, reply.attempts)


class _Unreachable(GageError):
    """An endpoint that did not answer ``GET /models`` (the next one may)."""


def _take(arrived: queue.SimpleQueue) -> Any:
    """The next item, waiting in short slices so Ctrl-C is seen on every platform."""
    while True:
        try:
            return arrived.get(timeout=0.5)
        except queue.Empty:
            continue


def _result(future: Any) -> Any:
    """A concurrent future's result, waiting in short slices so Ctrl-C is seen on every platform."""
    while True:
        try:
            return future.result(timeout=0.5)
        except concurrent.futures.TimeoutError:
            continue


def openai_backend(**kwargs: Any) -> OpenAIBackend:
    """The registered factory (``--model openai``)."""
    return OpenAIBackend(**kwargs)
