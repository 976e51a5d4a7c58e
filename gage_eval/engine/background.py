"""Metrics that run in the background (``Metric.submit``, the code_exec metric): a finished row's
slow scoring starts the moment its output arrives and runs while the model answers the next rows;
the row is written once its results are in. Rows are written in the order they finish."""
from __future__ import annotations

import sys
from concurrent.futures import Future
from typing import Any, Callable

from gage_eval.engine.repeats import gathered
from gage_eval.engine.row import Row
from gage_eval.engine.scoring import metric_context

MAX_PENDING = 256  # rows waiting for their results before the loop waits for the oldest


def write_stage(tr: Any, write: Callable[[Row], None]) -> tuple[Callable[[Row], None], Callable[[], None] | None]:
    """What a task's answered rows go through before ``write``, and what ends it: the rows of a
    repeated task wait for all their answers (:func:`~gage_eval.engine.repeats.gathered`); with a
    metric that submits, each answer's scoring starts in the :class:`Background` first and the end
    writes the rows still running (without one there is no end: None). The order the rows are
    written in is noted as each is counted (``tr.order``, :class:`~gage_eval.engine.taskrun.WriteOrder`)."""
    if tr.repeats.n > 1:
        write = gathered(tr.repeats.n, write)
    submitting = [m for _, m in tr.metrics if callable(getattr(m, "submit", None))]
    if not submitting:
        return write, None
    background = Background(submitting, write)
    return background.add, background.finish


class Background:
    def __init__(self, metrics: list, then: Callable[[Row], None]):
        self.metrics = metrics  # the task's metrics that submit
        self.then = then
        self.pending: list[tuple[Row, list[Future]]] = []

    def add(self, row: Row) -> None:
        futures: list[Future] = []
        if row.error is None and "eval_result" not in row.sample:
            ctx = metric_context(row)
            futures = [m.submit(ctx) for m in self.metrics]
        self.pending.append((row, futures))
        self.drain(wait=len(self.pending) > MAX_PENDING)

    def drain(self, wait: bool = False) -> None:
        """Write the rows whose results are in (with ``wait``: the oldest one, waited for, first)."""
        if wait and self.pending:
            row, futures = self.pending.pop(0)
            for f in futures:
                f.exception()
            self.then(row)
        ready = [(row, fs) for row, fs in self.pending if all(f.done() for f in fs)]
        self.pending = [(row, fs) for row, fs in self.pending if not all(f.done() for f in fs)]
        for row, _ in ready:
            self.then(row)

    def finish(self) -> None:
        """Called as the task's reading ends (its ``finally``): the rows still running are waited
        for and written; when the task stops on an exception (Ctrl-C, --fail-fast, an output that
        failed) they are dropped instead, the jobs not yet started cancelled (resume runs them)."""
        if sys.exc_info()[1] is not None:
            for _, futures in self.pending:
                for f in futures:
                    f.cancel()
            self.pending = []
            return
        while self.pending:
            self.drain(wait=True)
