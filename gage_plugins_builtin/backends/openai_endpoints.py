"""Several base URLs serving one model: each attempt goes to the least busy healthy endpoint.

``base_url=http://a:8000/v1|http://b:8000/v1`` on the command line (``,`` splits the
arguments, so ``|`` splits the URLs), or a list in a run config. :class:`Router` keeps,
per endpoint, the attempts in flight and a failure streak:

- :meth:`Router.pick` (O(endpoints), no clock read with one endpoint): the healthy endpoint
  with the fewest attempts in flight, ties taken in turn. Healthy: no failure since its last
  success, or its back-off is over and nothing is in flight there (one probe at a time: an
  endpoint coming back gets one attempt until that answers).
- :meth:`Router.failed` (a refused or dropped connection, a timeout, a 5xx, a broken reply)
  takes the endpoint out for ``endpoint_backoff`` seconds, doubled with each further
  failure up to ``endpoint_backoff_max``; :meth:`Router.succeeded` brings it fully back.
- When every endpoint is out, ``pick`` still answers (the one back soonest): the caller's
  own retries and circuit breaker then bound the run, as they do for one endpoint.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Sequence

from gage_eval.api import GageError, secrets

SEPARATOR = "|"


def split_urls(value: Any) -> list[str]:
    """``base_url`` as a list of URLs: ``A|B`` text, or a list (a run config's YAML list)."""
    if isinstance(value, (list, tuple)):
        items = [str(v) for v in value]
    else:
        items = str(value).split(SEPARATOR)
    urls = [u.strip() for u in items]
    if not urls or any(not u for u in urls):
        raise GageError(f"openai backend: base_url has an empty entry ({secrets.strip_credentials(str(value))!r}); give "
                        f"one URL, or several separated by {SEPARATOR!r} (a list in a run config)")
    return urls


def sent_url(url: str, ep: "Endpoint | None") -> str:
    """``url`` (an endpoint's URL and a path) as it is requested: with the endpoint's query string."""
    return f"{url}?{ep.query}" if ep is not None and ep.query else url


class Endpoint:
    """One base URL: what is sent there (headers, proxy) and how it is doing."""

    __slots__ = ("index", "url", "query", "shown", "headers", "proxy", "hints", "inflight", "sent", "failed",
                 "failures", "until")

    def __init__(self, index: int, url: str, headers: dict | None = None, proxy: str | None = None,
                 hints: dict | None = None, query: str = "", shown: str | None = None):
        self.index = index
        self.url = url  # user-info and query removed: a request goes to url + path (+ ?query)
        self.query = query  # may hold a key (?api-key=K): sent, never shown
        self.shown = shown or url  # the URL as settings and counts show it (query keys masked)
        self.headers = headers  # None: the session's own headers (one endpoint)
        self.proxy = proxy
        self.hints = hints or {}
        self.inflight = 0
        self.sent = 0  # attempts sent here
        self.failed = 0  # of those, failures that took it out
        self.failures = 0  # the current streak (0: healthy)
        self.until = 0.0  # end of its back-off (clock time)

    def counts(self) -> dict[str, Any]:
        return {"url": self.shown, "requests": self.sent, "failures": self.failed}


class Router:
    """Picks an endpoint per attempt; see the module docstring."""

    def __init__(self, endpoints: Sequence[Endpoint], backoff: float = 2.0, backoff_max: float = 60.0,
                 clock: Callable[[], float] = time.monotonic):
        if not endpoints:
            raise ValueError("no endpoints")
        self.endpoints = list(endpoints)
        self.backoff = backoff
        self.backoff_max = backoff_max
        self.clock = clock
        self._turn = 0

    def __len__(self) -> int:
        return len(self.endpoints)

    def available(self, ep: Endpoint, now: float) -> bool:
        return not ep.failures or (now >= ep.until and not ep.inflight)

    def pick(self) -> Endpoint:
        eps = self.endpoints
        n = len(eps)
        if n == 1:
            return eps[0]
        now = self.clock()
        start = self._turn
        self._turn = (start + 1) % n
        best = None
        for k in range(n):
            ep = eps[(start + k) % n]
            if self.available(ep, now) and (best is None or ep.inflight < best.inflight):
                best = ep
        if best is None:  # every endpoint is out: the one back soonest
            best = min(eps, key=lambda e: (e.until, e.inflight))
        return best

    def begin(self, ep: Endpoint) -> None:
        ep.inflight += 1
        ep.sent += 1

    def end(self, ep: Endpoint) -> None:
        ep.inflight -= 1

    def succeeded(self, ep: Endpoint) -> None:
        if ep.failures:
            ep.failures, ep.until = 0, 0.0

    def failed(self, ep: Endpoint) -> None:
        """``ep`` failed as a server: out of the rotation for its back-off (doubling while it fails)."""
        ep.failed += 1
        ep.failures += 1
        if len(self.endpoints) > 1:
            wait = min(self.backoff_max, self.backoff * 2 ** min(ep.failures - 1, 60))
            ep.until = max(ep.until, self.clock() + wait)

    def all_out(self) -> bool:
        """No endpoint is known good (each failed since its last success): the failure bounds apply."""
        return all(ep.failures for ep in self.endpoints)

    def other_available(self, ep: Endpoint) -> bool:
        """Another endpoint could take a retry now."""
        if len(self.endpoints) == 1:
            return False
        now = self.clock()
        return any(o is not ep and self.available(o, now) for o in self.endpoints)

    def counts(self) -> list[dict[str, Any]]:
        return [ep.counts() for ep in self.endpoints]
