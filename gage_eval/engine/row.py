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
from typing import Any, Callable, Mapping, NamedTuple

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


class WriteOrder:
    """Whether a task's rows went to its writers in the data's order: each row written is the
    data's next one, counted from its first, and none is an error stub or a row that came scored
    (so the n-th record of ``samples/<task>.jsonl`` is the n-th row that passed its checks, the
    position the report shows). A row out of turn (a backend, the judge or a background metric
    finished it early, a window wrote its failed rows first, ``--shard`` or ``--resume`` skipped
    rows) ends it for the task; :meth:`TaskRun.in_data_order` also counts kept records."""

    def __init__(self) -> None:
        self.rows = 0  # rows written (noted here)
        self.kept = True  # every one so far the data's next

    def noting(self, write: Callable[[Row], None]) -> Callable[[Row], None]:
        """``write``, each row noted first."""
        def noted(row: Row) -> None:
            self.kept = self.kept and row.index == self.rows and "eval_result" not in row.sample
            self.rows += 1
            write(row)
        return noted

    def lost(self) -> None:
        """The rows are numbered otherwise than by their place in the data (a rescore's stored rows)."""
        self.kept = False
