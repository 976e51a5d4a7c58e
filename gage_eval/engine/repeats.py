"""Repeats: ``n`` answers per row (task.yaml ``repeats``, ``--repeats N``).

A row is drawn ``n`` times (:meth:`Repeats.expand`): the same prompt, repeat ``r`` with the seed
``seed + r`` (the task's ``request.generation.seed``, else the run's ``--seed``) and the task's
``repeats.generation`` over its generation settings (a task answered greedily once samples when
repeated). Each answer goes through the model, the judge and the background metrics as a row of
its own; :func:`gathered` hands the row on once all its answers are in, so a row is written (and
counts as done on resume) whole. Scoring it (:func:`gage_eval.engine.scoring.repeated_record`)
gives each metric's mean over the answers, which is the row's value: the task's stderr over the
rows is then the stderr clustered by row.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Iterator, Mapping

from gage_eval.engine.row import Row


class Repeats:
    """A task's repeats: ``n`` and the ``k`` of its pass@k and maj@k metrics (those up to ``n``)."""

    def __init__(self, spec: Mapping[str, Any], given: int | None, seed: int):
        self.n = int(given if given is not None else spec.get("n", 1))
        pass_at = spec.get("pass_at") if spec.get("pass_at") is not None else (1, self.n)
        maj_at = spec.get("maj_at") if spec.get("maj_at") is not None else (self.n,)
        self.pass_at = sorted({k for k in pass_at if k <= self.n}) if self.n > 1 else []
        self.maj_at = sorted({k for k in maj_at if k <= self.n}) if self.n > 1 else []
        self.generation = dict(spec.get("generation") or {})
        self.seed = seed

    def expand(self, row: Row, warnings: list) -> Iterator[tuple[Row, list]]:
        """The row as the task draws it: itself, or its ``n`` repeats (the warnings go with the first)."""
        if self.n <= 1 or row.request is None or row.error is not None:
            yield row, warnings
            return
        gen = {**row.request.gen, **self.generation}
        base = int(gen.get("seed", self.seed))
        for r in range(self.n):
            yield row._replace(request=replace(row.request, gen={**gen, "seed": base + r}), repeat=r), \
                warnings if r == 0 else []

    def summary(self) -> dict:
        """summary.json's ``repeats`` of a task (empty when each row is answered once)."""
        if self.n <= 1:
            return {}
        return {"repeats": {"n": self.n, "pass_at": self.pass_at, "maj_at": self.maj_at}}


def gathered(n: int, write: Callable[[Row], None]) -> Callable[[Row], None]:
    """``write`` fed whole rows: a repeat waits until every answer of its row is in, then the row
    goes on carrying them (``repeats``, in order); a row that is not repeated goes on at once."""
    if n <= 1:
        return write
    waiting: dict[int, list] = {}

    def add(row: Row) -> None:
        if row.repeat is None:
            write(row)
            return
        got = waiting.setdefault(row.index, [None] * n)
        got[row.repeat] = row
        if all(r is not None for r in got):
            del waiting[row.index]
            write(got[0]._replace(repeat=None, repeats=tuple(got)))
    return add
