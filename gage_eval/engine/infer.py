"""The infer stage: a window of rows through the model backend's stream, each row handed on
the moment its outputs arrived (its unconditioned scores too, when it has a second request).

Every output has the run's secrets masked the moment it arrives (:mod:`gage_eval.engine.replies`),
before anything reads it. With a response cache (``--cache``, :mod:`gage_eval.engine.cache`) each request
of the window is looked up first: hits are handed on at once, as if the backend had answered,
only misses go to the backend, and the misses' outputs without an error or a secret are stored
when the window's stream ends."""
from __future__ import annotations

import time
from typing import Callable

from gage_eval.api.backend import LOGLIKELIHOOD, Backend, ModelOutput, Request, checked_output, stream_outputs
from gage_eval.engine.cache import ModelCache
from gage_eval.api.errors import PLUGIN_FAULTS, FatalBackendError, GageError, fault_text
from gage_eval.engine.replies import scrub_output
from gage_eval.engine.scoring import model_output
from gage_eval.engine.taskrun import Item, TaskRun


class Stops:
    """Why a role's backend can take no more requests (``model``, ``judge``), and which of those
    messages the console already showed."""

    def __init__(self, clean: Callable[[str], str]):
        self.by_role: dict[str, str] = {}
        self.announced: set[str] = set()
        self.clean = clean  # a message with every known secret masked

    def get(self, role: str) -> str | None:
        return self.by_role.get(role)

    def stop(self, role: str, message: str) -> str:
        self.by_role[role] = self.clean(message)
        return self.by_role[role]


class Inference:
    """Runs rows through the model backend; ``done(item)`` gets each row once, finished."""

    def __init__(self, backend: Backend, stops: Stops, strip_reasoning: bool = False,
                 cache: ModelCache | None = None, secrets: tuple[str, ...] = ()):
        self.backend = backend
        self.stops = stops
        self.strip_reasoning = strip_reasoning
        self.cache = cache
        self.secrets = tuple(s for s in secrets if s)  # masked in every output as it arrives

    def run(self, tr: TaskRun, live: list[Item], done: Callable[[Item], None]) -> None:
        if self.stops.get("model"):
            for it in live:
                it.error = {"stage": "inference", "message": f"not run: {self.stops.get('model')}",
                            "locator": it.locator}
                done(it)
            return
        requests, owners = _requests(live)
        waiting: dict[int, int] = {}
        for it, _ in owners:
            waiting[id(it)] = waiting.get(id(it), 0) + 1

        parts: dict[int, list] = {}  # a row whose request has per-choice contexts: its parts' outputs

        def arrived(j: int, out: ModelOutput) -> None:
            it, aux = owners[j]
            out, scrubbed = scrub_output(out, self.secrets)
            it.scrubbed += scrubbed
            if aux is True:
                it.aux_output = out
            elif aux is False:
                it.output = out
            else:  # part ``aux`` of a request with per-choice contexts
                got_parts = parts.setdefault(id(it), [None] * len(it.request.contexts))
                got_parts[aux] = out
                if all(p is not None for p in got_parts):
                    it.output = merged_parts(got_parts)
            waiting[id(it)] -= 1
            if not waiting[id(it)]:
                self._finish(it)
                done(it)

        if self.cache is None:
            got, stopped, busy, t0 = self._stream(requests, arrived)
        else:
            got, stopped, busy, t0 = self._cached(tr, requests, arrived)
        tr.timings["inference_s"] += time.perf_counter() - t0 - busy
        if self.stops.get("model"):
            tr.failure = tr.failure or f"the model backend stopped the run: {self.stops.get('model')}"
        for j in range(len(requests)):
            if j not in got:
                arrived(j, ModelOutput(error=stopped or f"backend returned no output for request {j} of the batch"))

    def _cached(self, tr: TaskRun, requests: list[Request], arrived: Callable[[int, ModelOutput], None]
                ) -> tuple[set[int], str | None, float, float]:
        """:meth:`_stream` for the cache's misses only; the hits are handed on first."""
        cache = self.cache
        assert cache is not None
        t0 = time.perf_counter()
        keys = [cache.key(r) for r in requests]
        stored = cache.lookup(keys)
        got, misses, busy = set(), [], 0.0
        for j, key in enumerate(keys):
            out = stored.get(key)
            if out is None:
                misses.append(j)
                continue
            got.add(j)
            t_in = time.perf_counter()
            arrived(j, out)
            busy += time.perf_counter() - t_in
        tr.cache_counts["hits"] += len(got)
        tr.cache_counts["misses"] += len(misses)
        answered: list[tuple[str, str]] = []  # (key, stored text) of the outputs to keep

        def miss_arrived(m: int, out: ModelOutput) -> None:
            row = cache.row(keys[misses[m]], out)  # serialized before a later stage can touch it
            if row is not None:
                answered.append(row)
            arrived(misses[m], out)

        stopped = None
        if misses:
            try:
                got_m, stopped, busy_m, _ = self._stream([requests[j] for j in misses], miss_arrived)
            except BaseException:  # an interrupted window keeps what had arrived; the interrupt wins
                try:
                    cache.put(answered)
                except GageError:
                    pass
                raise
            cache.put(answered)
            got.update(misses[m] for m in got_m)
            busy += busy_m
        return got, stopped, busy, t0

    def _stream(self, requests: list[Request], arrived: Callable[[int, ModelOutput], None]
                ) -> tuple[set[int], str | None, float, float]:
        """Feed each output to ``arrived`` as it comes; returns the requests answered, why the
        stream stopped early (if it did), the time spent in ``arrived`` and the start time."""
        got: set[int] = set()
        stopped: str | None = None
        t0 = time.perf_counter()
        busy = 0.0  # time spent writing and judging, not waiting for the model
        stream = stream_outputs(self.backend, requests)
        downstream = False  # in arrived (scoring, writing, judging): what fails there is not the backend's
        try:
            for j, out in stream:
                t_in = time.perf_counter()
                if isinstance(j, int) and 0 <= j < len(requests) and j not in got:
                    got.add(j)
                    downstream = True
                    arrived(j, checked_output(requests[j], out))  # malformed: the row errors, never lost
                    downstream = False
                busy += time.perf_counter() - t_in
        except FatalBackendError as exc:
            if downstream:
                raise
            stopped = self.stops.stop("model", str(exc))
        except GageError:
            raise
        except PLUGIN_FAULTS as exc:  # a backend bug (or sys.exit) part way: the rows not yet answered carry it
            if downstream:  # a row taken from the stream must be written or stop the run, never vanish
                raise
            stopped = self.stops.clean(fault_text(exc) if isinstance(exc, SystemExit)
                                       else f"{type(exc).__name__}: {exc}")
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()
        return got, stopped, busy, t0

    def _finish(self, it: Item) -> None:
        it.model_output = model_output(it, self.strip_reasoning)
        if it.output is not None and it.output.error:
            it.error = {"stage": "inference", "message": it.output.error, "locator": it.locator}
        elif it.aux_output is not None and it.aux_output.error:
            it.error = {"stage": "inference", "message": f"unconditioned scores: {it.aux_output.error}",
                        "locator": it.locator}


def _requests(live: list[Item]) -> tuple[list[Request], list[tuple[Item, bool | int]]]:
    """The window's requests; ``owners[j]`` is request j's row and whether it is that row's
    unconditioned request (acc_mutual_info's second pass), or, for a request with per-choice
    ``contexts``, which of its one-pair requests it is (an int)."""
    requests: list[Request] = []
    owners: list[tuple[Item, bool | int]] = []
    for it in live:
        if it.request.kind == LOGLIKELIHOOD and it.request.contexts:
            for i, (context, cont) in enumerate(zip(it.request.contexts, it.request.continuations)):
                requests.append(Request(kind=LOGLIKELIHOOD, sample_id=it.request.sample_id, prompt=context,
                                        continuations=(cont,), modalities=it.request.modalities))
                owners.append((it, i))
            continue
        requests.append(it.request)
        owners.append((it, False))
        if it.request.kind == LOGLIKELIHOOD and it.request.unconditioned is not None:
            requests.append(Request(kind=LOGLIKELIHOOD, sample_id=it.request.sample_id,
                                    prompt=it.request.unconditioned, continuations=it.request.continuations))
            owners.append((it, True))
    return requests, owners


def merged_parts(outputs: list[ModelOutput]) -> ModelOutput:
    """One output for a request with per-choice contexts, from its one-pair outputs in order: the
    first error, else each part's log-likelihood (and greedy flag) in the choices' order."""
    for out in outputs:
        if out.error:
            return out
    greedy = [out.is_greedy[0] for out in outputs if out.is_greedy]
    tokens = [out.input_tokens for out in outputs if out.input_tokens is not None]
    return ModelOutput(loglikelihoods=[out.loglikelihoods[0] for out in outputs],
                       is_greedy=greedy if len(greedy) == len(outputs) else None,
                       input_tokens=sum(tokens) if tokens else None)
