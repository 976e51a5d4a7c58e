"""The background stage (metrics with submit()): rows are written once their results are in; the
task's end waits for the rest, or drops them when the task stops on an exception."""
from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from types import SimpleNamespace

from gage_eval.engine.background import write_stage
from gage_eval.engine.repeats import Repeats
from gage_eval.engine.row import Answer, Row
from gage_eval.engine.taskrun import WriteOrder


class Slow:
    def __init__(self):
        self.gate = threading.Event()
        self.pool = ThreadPoolExecutor(max_workers=1)
        self.submitted = []

    def submit(self, ctx) -> Future:
        self.submitted.append(ctx.sample["id"])
        return self.pool.submit(self.gate.wait)


def task(metrics, n=None):
    return SimpleNamespace(metrics=metrics, repeats=Repeats({}, n, 1234), order=WriteOrder())


def rows(n):
    return [Row(i, f"f:{i}", {"id": str(i)}, answer=Answer(None, model_output={"text": "x"})) for i in range(n)]


def writer(tr, written):
    """The engine's write as far as the order goes: each row noted as its record is counted (TaskRun.account)."""
    def write(row):
        tr.order.note(row)
        written.append(row.sample["id"])
    return write


def test_no_submitting_metric_leaves_the_write_stage_alone():
    tr, written = task([("m", object())]), []
    write, finish = write_stage(tr, writer(tr, written))
    for row in rows(3):
        write(row)
    assert written == ["0", "1", "2"]  # written at once, in the data's order (noted)
    assert finish is None  # nothing left to write at the task's end
    assert written == ["0", "1", "2"] and (tr.order.rows, tr.order.kept) == (3, True)


def test_rows_wait_for_their_results_and_the_end_writes_the_rest():
    metric, written = Slow(), []
    tr = task([("m", metric)])
    write, finish = write_stage(tr, writer(tr, written))
    for row in rows(3):
        write(row)
    write(Row(3, "f:3", {"id": "3"}, error={"stage": "inference", "message": "x", "locator": "f:3"}))
    assert metric.submitted == ["0", "1", "2"] and written == ["3"]  # a failed row needs no metric
    metric.gate.set()
    finish()
    assert sorted(written) == ["0", "1", "2", "3"]
    assert (tr.order.rows, tr.order.kept) == (4, False)  # row 3 came out first: the data's order is lost


def test_a_task_stopped_by_an_exception_drops_the_rows_still_running():
    metric, written = Slow(), []
    write, finish = write_stage(task([("m", metric)]), lambda row: written.append(row.sample["id"]))
    for row in rows(2):
        write(row)
    with pytest.raises(KeyboardInterrupt):
        try:
            raise KeyboardInterrupt
        finally:
            finish()
    metric.gate.set()
    assert written == []
