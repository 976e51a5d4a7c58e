"""A row on its way through a run: read -> request -> output -> judged -> scored.

Each stage takes a :class:`Row` and hands on a new one (a tuple: no stage changes what an earlier
one handed on): reading gives the sample and building its request the ``request`` and ``rendered``
prompt pieces (:meth:`~gage_eval.engine.taskrun.TaskRun.items`), the infer stage adds the model's
:class:`Answer` (:mod:`gage_eval.engine.infer`, or the stored outputs in a rescore), the judge stage
its :class:`Judgement` (:mod:`gage_eval.engine.judging`), and scoring turns the row into the
record the writers get (:func:`gage_eval.engine.scoring.finish_record`). A stage that fails a row
hands it on with ``error`` set; the later stages pass such a row on as it is.
"""
from __future__ import annotations

from types import MappingProxyType
from typing import Any, Mapping, NamedTuple

from gage_eval.api.backend import ModelOutput, Request

NOTHING: Mapping[str, Any] = MappingProxyType({})


class Answer(NamedTuple):
    """What the model answered for one row."""

    output: ModelOutput | None  # None: a stored row without a model output
    aux_output: ModelOutput | None = None  # the unconditioned scores (Request.unconditioned)
    model_output: Mapping[str, Any] = NOTHING  # output + rendered prompt pieces, as judges and metrics read it
    scrubbed: int = 0  # the model's replies that had a secret masked (gage_eval.engine.replies)
    stored: list | None = None  # a rescore's: the predict_result the run wrote, written again as it was


class Judgement(NamedTuple):
    """What the judge said about one row."""

    verdict: Any  # a Verdict (or a stored one), or None when nothing was judged
    prompts: list = []  # what the judge was asked (text, or chat messages)
    scrubbed: int = 0  # the judge's replies that had a secret masked


class Row(NamedTuple):
    """One row in flight; each stage returns ``row._replace(...)`` with its part."""

    index: int
    locator: str
    sample: dict
    request: Request | None = None
    rendered: Mapping[str, Any] = NOTHING  # the prompt pieces the request was built from
    error: dict | None = None  # {"stage", "message", "locator"}: the row stops being worked on
    answer: Answer | None = None
    judgement: Judgement | None = None
    repeat: int | None = None  # which of the task's repeated answers this row draws (None: not repeated)
    repeats: tuple = ()  # a repeated row once every answer is in: its rows, one per repeat, in order


def stage_error(row: Row, stage: str, message: str) -> dict:
    """The ``error`` a stage sets on ``row``."""
    return {"stage": stage, "message": message, "locator": row.locator}


def finished(record: Mapping[str, Any]) -> bool:
    """On resume, a written row counts as done unless a backend failed it (inference or judge):
    those may succeed now that the cause is fixed, so they run again."""
    err = (record.get("eval_result") or {}).get("error")
    return not err or err.get("stage") not in ("inference", "judge")
