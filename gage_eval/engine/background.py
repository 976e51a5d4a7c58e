"""Metrics that run in the background (``Metric.submit``, the code_exec metric): a finished row's
slow scoring starts the moment its output arrives and runs while the model answers the next rows;
the row is written once its results are in. Rows are written in the order they finish."""
from __future__ import annotations

from typing import Any, Callable

from gage_eval.api.metric import MetricContext

MAX_PENDING = 256  # rows waiting for their results before the loop waits for the oldest


class Background:
    def __init__(self, metrics: list, then: Callable[[Any], None]):
        self.metrics = [m for _, m in metrics if callable(getattr(m, "submit", None))]
        self.then = then
        self.pending: list[tuple[Any, list]] = []

    def add(self, it: Any) -> None:
        futures: list = []
        if it.error is None and "eval_result" not in it.sample:
            ctx = MetricContext(sample=it.sample, model_output=it.model_output,
                                judge_output=it.verdict.to_dict() if it.verdict is not None else None)
            futures = [m.submit(ctx) for m in self.metrics]
        self.pending.append((it, futures))
        self.drain(wait=len(self.pending) > MAX_PENDING)

    def drain(self, wait: bool = False) -> None:
        """Write the rows whose results are in (with ``wait``: the oldest one, waited for, first)."""
        if wait and self.pending:
            it, futures = self.pending.pop(0)
            for f in futures:
                f.exception()
            self.then(it)
        ready = [(it, fs) for it, fs in self.pending if all(f.done() for f in fs)]
        self.pending = [(it, fs) for it, fs in self.pending if not all(f.done() for f in fs)]
        for it, _ in ready:
            self.then(it)

    def flush(self) -> None:
        while self.pending:
            self.drain(wait=True)
