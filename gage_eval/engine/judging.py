"""The judge stage: finished rows whose task has a judge wait in small chunks, then their
judge requests run together on the judge backend and each row gets its verdict. With a response
cache (``--cache``) the judge's requests are looked up first, as the model's are (:mod:`gage_eval.engine.infer`);
every reply has the run's secrets masked before a verdict is read from it (:mod:`gage_eval.engine.replies`)."""
from __future__ import annotations

import time
from typing import Callable

from gage_eval.api.backend import Backend, ModelOutput, checked_output, safe_run
from gage_eval.engine.cache import ModelCache
from gage_eval.api.errors import PLUGIN_FAULTS, FatalBackendError, fault_text
from gage_eval.engine.infer import Stops
from gage_eval.engine.replies import scrub_output
from gage_eval.engine.taskrun import Item, TaskRun


class Judging:
    """Collects finished rows of a judged task and passes them on judged, ``chunk`` at a time."""

    def __init__(self, judge_backend: Backend, stops: Stops, then: Callable[[Item], None],
                 cache: ModelCache | None = None, secrets: tuple[str, ...] = ()):
        self.backend = judge_backend
        self.cache = cache
        self.secrets = tuple(s for s in secrets if s)  # masked in every reply before a verdict reads it
        self.stops = stops
        self.then = then
        self.pending: list[Item] = []
        self.chunk = judge_chunk(judge_backend)

    def add(self, tr: TaskRun, it: Item) -> None:
        self.pending.append(it)
        if len(self.pending) >= self.chunk:
            self.flush(tr)

    def flush(self, tr: TaskRun) -> None:
        items, self.pending = self.pending, []
        if items:
            self.judge(tr, items)
            for it in items:
                self.then(it)

    def judge(self, tr: TaskRun, items: list[Item]) -> None:
        """Ask the judge about each row; a row whose prompt cannot be built or whose verdict is an
        error carries a judge-stage error."""
        requests, owners = [], []
        for it in items:
            try:
                reqs = tr.judge.requests(it.sample, it.model_output)
            except (ValueError, KeyError) as exc:
                it.error = {"stage": "judge", "message": f"building the judge prompt: {exc}", "locator": it.locator}
                continue
            if not reqs:  # nothing to judge (an mcq row of a mixed task): no verdict, not an error
                continue
            requests.extend(reqs)
            owners.append((it, len(reqs)))
            it.judge_prompts = [r.messages if r.chat and r.messages is not None else r.prompt for r in reqs]
        if not requests:
            return
        t0 = time.perf_counter()
        replies = self._replies(requests) if self.cache is None else self._cached(tr, requests)
        if self.stops.get("judge"):
            tr.failure = tr.failure or f"the judge backend stopped the run: {self.stops.get('judge')}"
        tr.timings["judge_s"] += time.perf_counter() - t0
        pos = 0
        for it, k in owners:
            mine = [scrub_output(out, self.secrets) for out in replies[pos:pos + k]]
            it.judge_scrubbed += sum(scrubbed for _, scrubbed in mine)
            pos += k
            try:
                verdict = tr.judge.verdict(it.sample, it.model_output, [out for out, _ in mine])
            except PLUGIN_FAULTS as exc:  # a judge plugin's bug errors its row, never loses it
                it.error = {"stage": "judge", "message": f"the judge failed: {fault_text(exc)}", "locator": it.locator}
                continue
            it.verdict = verdict
            if verdict.error:
                it.error = {"stage": "judge", "message": verdict.error, "locator": it.locator}

    def _cached(self, tr: TaskRun, requests: list) -> list[ModelOutput]:
        """:meth:`_replies` for the cache's misses only; their answers without an error are kept."""
        cache = self.cache
        assert cache is not None
        keys = [cache.key(r) for r in requests]
        stored = cache.lookup(keys)
        misses = [j for j, key in enumerate(keys) if key not in stored]
        counts = tr.cache_counts
        counts["judge_hits"] = counts.get("judge_hits", 0) + len(requests) - len(misses)
        counts["judge_misses"] = counts.get("judge_misses", 0) + len(misses)
        replies = [stored.get(key) for key in keys]
        if misses:
            answered = self._replies([requests[j] for j in misses])
            rows = []
            for j, out in zip(misses, answered):
                replies[j] = out
                row = cache.row(keys[j], out)
                if row is not None:
                    rows.append(row)
            cache.put(rows)
        return replies

    def _replies(self, requests: list) -> list[ModelOutput]:
        if not self.stops.get("judge"):
            try:
                outs = safe_run(self.backend, requests)
            except FatalBackendError as exc:
                self.stops.stop("judge", str(exc))
                return [ModelOutput(error=self.stops.get("judge")) for _ in requests]
            return [checked_output(r, o) for r, o in zip(requests, outs)]  # malformed: a judge row error
        return [ModelOutput(error=f"not run: {self.stops.get('judge')}") for _ in requests]


def judge_chunk(judge_backend: Backend) -> int:
    """How many finished rows wait for their judge together: enough to keep the judge busy
    (its concurrency, for an HTTP judge), few enough that an interrupt loses little."""
    size = getattr(judge_backend, "concurrency", None) or 16
    return max(1, min(int(size), int(getattr(judge_backend, "max_batch", 64) or 64)))
