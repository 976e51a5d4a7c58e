"""The sender: events in, batches out to the endpoint or, failing that, to the fallback file.

The hooks run on the engine's thread and only serialize an event and append it to the
pending batch; a full batch goes into a bounded queue that one background thread empties,
POSTing each batch (with a timeout and retries) to the endpoint. Every batch ends exactly
one way, under one lock (:meth:`TraceSink._settle`): *sent* (the endpoint answered 2xx) or
*local* (its event lines appended to ``RUN_DIR/trace_fallback.jsonl``). A batch is local when

- every attempt failed (network error, timeout, any non-2xx answer; 5xx, 408 and 429 are
  retried, other answers are not, and redirects are not followed: the token would go along);
- the queue was full when the batch was cut (the engine never waits for the network);
- the endpoint had already failed more than ``max_fail_share`` of at least ``min_tries``
  batches: the sink gives up on it for the rest of the run and says so once on stderr;
- the run ended and the drain time (``drain_s``) ran out before it was sent.

What no sink can tell: a request whose answer was lost (a timeout after the server stored the
batch) is kept locally too, so such a batch is in both places; every batch carries
``session`` and ``batch`` (and every event ``seq``) so a server can drop a repeat.
"""
from __future__ import annotations

import http.client
import json
import math
import queue
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any, Callable, Mapping

from gage_eval.api import secrets

from gage_eval_plugin_tracesink.config import FALLBACK_NAME, Config
from gage_eval_plugin_tracesink.events import dumps

NAME = "gage-eval-plugin-tracesink"
RETRY_STATUSES = {408, 429}
_WAKE = None  # put in the queue at close: not a batch


class Batch:
    __slots__ = ("index", "lines", "settled")

    def __init__(self, index: int, lines: list[str]):
        self.index, self.lines, self.settled = index, lines, False


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):  # a 3xx is an answer that failed, not a new address
        return None


class TraceSink:
    """One run's sink. ``config=None`` writes every event to the fallback file (``note`` says why)."""

    def __init__(self, config: Config | None, run_dir: Path, run_id: str, *, note: str | None = None,
                 stderr: Any = None, post: Callable[[bytes], tuple[int, str | None]] | None = None):
        self.config = config
        self.run_id = run_id
        self.session = uuid.uuid4().hex[:16]
        self.path = Path(run_dir) / FALLBACK_NAME
        self._stderr = stderr
        self._post = post or self._urlopen
        self._batch_size = config.batch_size if config else 50
        self._lock = threading.Lock()         # seq and the pending batch
        self._settle_lock = threading.Lock()  # batch fates, counters, the fallback file
        self._seq = 0
        self._batches = 0
        self._pending: list[str] = []
        self._pending_since = 0.0
        self._queue: queue.Queue = queue.Queue(maxsize=config.queue_batches if config else 1)
        self._closing = False
        self._closed = False
        self._deadline = math.inf
        self._gave_up = config is None
        self._said: set[str] = set()
        self._say_lock = threading.Lock()
        self._inflight: Batch | None = None
        self._fh = None
        self._write_error: str | None = None
        self.stats = {"events": 0, "sent": 0, "local": 0, "spilled": 0, "lost": 0,
                      "batches_tried": 0, "batches_failed": 0}
        if note:
            self._say("note", note)
        self._thread = None
        if config is not None:
            self._opener = urllib.request.build_opener(_NoRedirect)
            self._thread = threading.Thread(target=self._work, name="gage-tracesink", daemon=True)
            self._thread.start()

    # -- the engine's side: never waits on the network -----------------------------------
    def emit(self, kind: str, payload: Mapping[str, Any]) -> None:
        batch = None
        with self._lock:
            line = dumps({"run_id": self.run_id, "session": self.session, "seq": self._seq, "type": kind,
                          "time": round(time.time(), 6), **payload})
            self._seq += 1
            self.stats["events"] += 1
            if not self._pending:
                self._pending_since = time.monotonic()
            self._pending.append(line)
            if len(self._pending) >= self._batch_size:
                batch = self._cut()
        if batch is not None:
            self._submit(batch)

    def flush(self) -> None:
        """Hand the partial batch to the sender now (task end, run end)."""
        with self._lock:
            batch = self._cut() if self._pending else None
        if batch is not None:
            self._submit(batch)

    def close(self) -> dict:
        """Flush, let the sender drain for at most ``drain_s`` (plus one request's timeout), keep
        what is left locally, report on stderr if anything is local. Returns the counts."""
        if self._closed:
            return self.stats
        self.flush()
        self._closed = True
        if self._thread is not None:
            cfg = self.config
            self._deadline = time.monotonic() + cfg.drain_s
            self._closing = True
            try:
                self._queue.put_nowait(_WAKE)  # a sender waiting for the flush interval looks now
            except queue.Full:  # (then it is not waiting)
                pass
            self._thread.join(cfg.drain_s + cfg.timeout_s + 1.0)
            while True:
                try:
                    left = self._queue.get_nowait()
                except queue.Empty:
                    break
                if left is not _WAKE:
                    self._settle(left, False)
            inflight = self._inflight
            if inflight is not None:  # a request that outlived its own timeout (a DNS stall, say)
                self._settle(inflight, False)
        with self._settle_lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None
            s = dict(self.stats)
        if s["local"] or s["lost"]:
            where = f"{s['sent']} of {s['events']} events reached {self.config.endpoint}; " if self.config else ""
            lost = f"; {s['lost']} could not be written ({self._write_error})" if s["lost"] else ""
            self._print(f"{where}{s['local']} are in {self.path}{lost}")
        return s

    # -- the sender thread --------------------------------------------------------------
    def _cut(self) -> Batch:  # (under self._lock)
        batch = Batch(self._batches, self._pending)
        self._batches += 1
        self._pending = []
        return batch

    def _submit(self, batch: Batch) -> None:
        if self._gave_up or self._closed:
            self._settle(batch, False)
            return
        try:
            self._queue.put_nowait(batch)
        except queue.Full:
            with self._settle_lock:
                self.stats["spilled"] += len(batch.lines)
            self._say("spill", f"the sender is behind (a queue of {self.config.queue_batches} batches is full); "
                               f"batches that do not fit go to {self.path}")
            self._settle(batch, False)

    def _work(self) -> None:
        cfg = self.config
        while True:
            if self._closing:
                wait = 0.05
            else:
                since = self._pending_since if self._pending else None
                wait = cfg.flush_s if since is None else max(0.0, since + cfg.flush_s - time.monotonic())
            try:
                batch = self._queue.get(timeout=wait)
            except queue.Empty:
                if self._closing:
                    return
                with self._lock:  # the flush interval: send a partial batch that has waited long enough
                    due = self._pending and time.monotonic() >= self._pending_since + cfg.flush_s
                    batch = self._cut() if due else None
                if batch is None:
                    continue
            if batch is _WAKE:
                continue
            self._deliver(batch)

    def _deliver(self, batch: Batch) -> None:
        self._inflight = batch
        try:
            if self._gave_up or time.monotonic() > self._deadline:
                self._settle(batch, False)
                return
            ok, why = self._send(batch)
            self._settle(batch, ok)
            with self._settle_lock:
                self.stats["batches_tried"] += 1
                self.stats["batches_failed"] += not ok
                tried, failed = self.stats["batches_tried"], self.stats["batches_failed"]
            cfg = self.config
            if not ok and tried >= cfg.min_tries and failed > cfg.max_fail_share * tried:
                self._gave_up = True
                self._say("give-up", f"{cfg.endpoint} failed {failed} of {tried} batches (more than "
                                     f"{cfg.max_fail_share:.0%}; last: {why}); the rest of this run's events "
                                     f"go to {self.path}")
        except Exception as exc:  # never let the thread die holding a batch
            self._settle(batch, False)
            self._say("bug", f"sending a batch failed: {type(exc).__name__}: {self._clean(str(exc))}")
        finally:
            self._inflight = None

    def _send(self, batch: Batch) -> tuple[bool, str | None]:
        cfg = self.config
        body = ('{"run_id":%s,"session":%s,"batch":%d,"events":[%s]}' % (
            json.dumps(self.run_id), json.dumps(self.session), batch.index, ",".join(batch.lines))).encode()
        why = None
        for attempt in range(cfg.retries + 1):
            if attempt:
                delay = cfg.backoff_s * 2 ** (attempt - 1)
                if time.monotonic() + delay > self._deadline:
                    break
                time.sleep(delay)
            status, why = self._post(body)
            if 200 <= status < 300:
                return True, None
            if status and status < 500 and status not in RETRY_STATUSES:
                break
        return False, self._clean(why or "no answer")

    def _urlopen(self, body: bytes) -> tuple[int, str | None]:
        cfg = self.config
        req = urllib.request.Request(cfg.url, data=body, headers=cfg.headers(), method="POST")
        try:
            with self._opener.open(req, timeout=cfg.timeout_s) as resp:
                resp.read()
                return resp.status, None
        except urllib.error.HTTPError as exc:
            exc.close()
            return exc.code, f"HTTP {exc.code}"
        except urllib.error.URLError as exc:
            return 0, str(exc.reason)
        except (OSError, http.client.HTTPException) as exc:  # timeouts, resets, bad answers
            return 0, f"{type(exc).__name__}: {exc}"

    # -- fates and messages ---------------------------------------------------------------
    def _settle(self, batch: Batch, sent: bool) -> None:
        """Decide a batch's fate, once (a batch decided already is left as it is)."""
        with self._settle_lock:
            if batch.settled:
                return
            batch.settled = True
            if sent:
                self.stats["sent"] += len(batch.lines)
                return
            try:
                if self._fh is None:
                    self._fh = open(self.path, "a", encoding="utf-8")
                self._fh.write("".join(line + "\n" for line in batch.lines))
                self._fh.flush()
                self.stats["local"] += len(batch.lines)
            except OSError as exc:
                self.stats["lost"] += len(batch.lines)
                self._write_error = f"{exc.strerror or exc}"

    def _clean(self, text: str) -> str:
        token = self.config.token if self.config else None
        return secrets.strip_credentials(secrets.mask(text, (token,) if token else ()))

    def _say(self, key: str, message: str) -> None:
        with self._say_lock:
            if key in self._said:
                return
            self._said.add(key)
        self._print(message)

    def _print(self, message: str) -> None:
        print(f"{NAME}: {self._clean(message)}", file=self._stderr or sys.stderr, flush=True)
