"""The judge stage: finished rows whose task has a judge wait in small chunks, then their
judge requests run together on the judge backend (a plugin's wrapper of it, such as the builtin
response cache, included) and each row gets its verdict. Every reply has the run's secrets masked
before a verdict is read from it (:mod:`gage_eval.engine.replies`)."""
from __future__ import annotations

import time
from typing import Callable

from gage_eval.api.backend import Backend, ModelOutput, checked_output, safe_run
from gage_eval.api.errors import PLUGIN_FAULTS, FatalBackendError, fault_text
from gage_eval.engine.infer import Stops
from gage_eval.engine.replies import scrub_output
from gage_eval.engine.row import Judgement, Row, stage_error
from gage_eval.engine.taskrun import TaskRun


class Judging:
    """Collects finished rows of a judged task and passes them on judged, ``chunk`` at a time."""

    def __init__(self, judge_backend: Backend, stops: Stops, then: Callable[[Row], None],
                 secrets: tuple[str, ...] = ()):
        self.backend = judge_backend
        self.secrets = tuple(s for s in secrets if s)  # masked in every reply before a verdict reads it
        self.stops = stops
        self.then = then
        self.pending: list[Row] = []
        self.chunk = judge_chunk(judge_backend)

    def add(self, tr: TaskRun, row: Row) -> None:
        """An answered row: judged with the next chunk, or passed on at once when it failed already."""
        if row.error is not None:
            self.then(row)
            return
        self.pending.append(row)
        if len(self.pending) >= self.chunk:
            self.flush(tr)

    def flush(self, tr: TaskRun) -> None:
        rows, self.pending = self.pending, []
        if rows:
            for row in self.judge(tr, rows):
                self.then(row)

    def judge(self, tr: TaskRun, rows: list[Row]) -> list[Row]:
        """Each row with the judge's :class:`Judgement`; a row whose prompt cannot be built or
        whose verdict is an error carries a judge-stage error."""
        judged = list(rows)
        requests, owners = [], []
        for pos, row in enumerate(rows):
            model_output = row.answer.model_output if row.answer is not None else {}
            try:
                reqs = tr.judge.requests(row.sample, model_output)
            except (ValueError, KeyError) as exc:
                judged[pos] = row._replace(error=stage_error(row, "judge", f"building the judge prompt: {exc}"))
                continue
            if not reqs:  # nothing to judge (an mcq row of a mixed task): no verdict, not an error
                continue
            requests.extend(reqs)
            owners.append((pos, len(reqs), [r.messages if r.chat and r.messages is not None else r.prompt for r in reqs],
                           model_output))
        if not requests:
            return judged
        t0 = time.perf_counter()
        replies = self._replies(requests)
        if self.stops.get("judge"):
            tr.failure = tr.failure or f"the judge backend stopped the run: {self.stops.get('judge')}"
        tr.timings["judge_s"] += time.perf_counter() - t0
        at = 0
        for pos, k, prompts, model_output in owners:
            row = rows[pos]
            mine, scrubbed = replies[at:at + k], 0
            if self.secrets:  # (a run without secrets has nothing to mask)
                masked = [scrub_output(out, self.secrets) for out in mine]
                mine, scrubbed = [out for out, _ in masked], sum(n for _, n in masked)
            at += k
            try:
                verdict = tr.judge.verdict(row.sample, model_output, mine)
            except PLUGIN_FAULTS as exc:  # a judge plugin's bug errors its row, never loses it
                judged[pos] = row._replace(judgement=Judgement(None, prompts, scrubbed),
                                           error=stage_error(row, "judge", f"the judge failed: {fault_text(exc)}"))
                continue
            judged[pos] = row._replace(judgement=Judgement(verdict, prompts, scrubbed),
                                       error=stage_error(row, "judge", verdict.error) if verdict.error else row.error)
        return judged

    def _replies(self, requests: list) -> list[ModelOutput]:
        if not self.stops.get("judge"):
            try:
                outs = safe_run(self.backend, requests)
            except FatalBackendError as exc:
                self.stops.stop("judge", str(exc))
                answered = getattr(exc, "outputs", None)  # a wrapper's replies before the stop (cached ones)
                if not isinstance(answered, list) or len(answered) != len(requests):
                    answered = [None] * len(requests)
                return [out if out is not None else ModelOutput(error=self.stops.get("judge")) for out in answered]
            return [checked_output(r, o) for r, o in zip(requests, outs)]  # malformed: a judge row error
        return [ModelOutput(error=f"not run: {self.stops.get('judge')}") for _ in requests]


def judge_chunk(judge_backend: Backend) -> int:
    """How many finished rows wait for their judge together: enough to keep the judge busy
    (its concurrency, for an HTTP judge), few enough that an interrupt loses little."""
    size = getattr(judge_backend, "concurrency", None) or 16
    return max(1, min(int(size), int(getattr(judge_backend, "max_batch", 64) or 64)))
