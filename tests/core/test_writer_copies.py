"""What a plugin writer is handed (issue 23, issue 24's overhead): its own copy of each record,
event and summary, so a writer that changes one changes nothing another writer gets; a writer
that declares ``read_only = True`` gets the core's objects uncopied, and the builtin instances
writer, which declares it, changes no record or summary it reads."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from gage_eval.api import Writer, events
from gage_eval.runfolder.writers import WriterSet
from gage_plugins_builtin.eee.writer import InstancesWriter
from gage_plugins_builtin.report.writer import ReportWriter

RECORD = {"id": "t-0", "messages": [{"role": "user", "content": [{"type": "text", "text": "q"}]}],
          "references": [{"answer": [{"type": "text", "text": "A"}]}], "label": "A",
          "eval_result": {"metrics": {"acc": {"value": 1.0}}, "overall": {"score": 1.0}}}


class Keeps(Writer):
    """Keeps what it is handed, as handed."""

    def __init__(self, name: str, read_only: bool = False):
        self.name, self.read_only, self.got = name, read_only, []

    def write(self, task, record):
        self.got.append(record)

    def end(self, summary):
        self.got.append(summary)


class Mutates(Writer):
    """A third-party writer that changes everything it gets (it declares nothing)."""

    name = "mutates"

    def write(self, task, record):
        record["id"] = "changed"
        record["eval_result"]["metrics"]["acc"]["value"] = 0.0
        record["messages"].clear()

    def end(self, summary):
        summary["run"]["exit_status"] = 99
        summary.clear()


def test_a_writer_that_changes_its_record_changes_nothing_the_others_get():
    core, reader, after = Keeps("core"), Keeps("reader", read_only=True), Keeps("after")
    writers = WriterSet([core], [Mutates(), reader, after])
    record, summary = copy.deepcopy(RECORD), {"run": {"exit_status": 0}}
    writers.started = True
    writers.write("t", record)
    writers.end(summary)
    assert record == RECORD and summary == {"run": {"exit_status": 0}}  # the core's own, unchanged
    assert core.got[0] is record and reader.got[0] is record and reader.got[1] is summary  # uncopied
    assert after.got == [RECORD, {"run": {"exit_status": 0}}] and after.got[0] is not record  # its copy
    assert not writers.failed


def test_read_only_must_be_true_itself_to_skip_the_copy():
    """Only ``read_only is True`` is the promise: a truthy stand-in (a string, a method) still copies."""
    odd = Keeps("odd")
    odd.read_only = "yes"
    record = copy.deepcopy(RECORD)
    WriterSet([], [odd]).write("t", record)
    assert odd.got[0] == record and odd.got[0] is not record


@pytest.mark.parametrize("version", ["0.2.0", "0.3.0"])
def test_the_instances_writer_changes_no_record_or_summary(tmp_path, run_cli, version):
    """The builtin instances writer declares read_only: a real run's records and summary are
    the same after it wrote them (both EEE versions)."""
    result = run_cli("--tasks", "piqa", "--model", "dummy", "--limit", 3, "-o", tmp_path, "--run-id", "r", "-q",
                     "--no-report")
    assert result.exit_code == 0, result.output
    run_dir = Path(tmp_path / "r")
    records = [json.loads(line) for line in (run_dir / "samples" / "piqa.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert InstancesWriter.read_only is True
    writer = InstancesWriter()
    out = tmp_path / "again"
    out.mkdir()
    writer.start(events.RunStart(run_id="r", run_dir=out, tasks=("piqa",), model="dummy", model_id="m",
                                 options={"eee_version": version}))
    writer.task_start("piqa")
    kept = copy.deepcopy((records, summary))
    for record in records:
        writer.write("piqa", record)
    writer.task_end(events.TaskDone(run_id="r", task="piqa", counts=summary["tasks"]["piqa"]["counts"],
                                    metrics=summary["tasks"]["piqa"]["metrics"]))
    writer.end(summary)
    assert (records, summary) == kept
    assert len((out / "instances" / "piqa.jsonl").read_text().splitlines()) >= 3


def test_the_report_writer_changes_no_event_or_summary(tmp_path, run_cli):
    """The builtin report writer declares read_only: the task-end events and the summary of a real
    run (piqa, and a judged legal_eval_v1 with its slices, counters and errored rows) are the same after it wrote
    the page from them."""
    for args in (("--tasks", "piqa", "--limit", 3), ("--tasks", "legal_eval_v1", "--judge-model", "dummy", "--limit", 4)):
        result = run_cli(*args, "--model", "dummy", "-o", tmp_path, "--run-id", args[1], "-q", "--no-report")
        assert result.exit_code in (0, 1), result.output  # (1: the dummy judge's malformed verdicts, rows errored)
        run_dir = Path(tmp_path / args[1])
        summary = json.loads((run_dir / "summary.json").read_text())
        assert ReportWriter.read_only is True
        writer = ReportWriter()
        writer.start(events.RunStart(run_id=args[1], run_dir=run_dir, tasks=(args[1],), model="dummy", model_id="m",
                                     options={}))
        done = events.TaskDone(run_id=args[1], task=args[1], counts=summary["tasks"][args[1]]["counts"],
                               metrics=summary["tasks"][args[1]]["metrics"], in_data_order=True)
        kept = copy.deepcopy((done, summary))
        writer.task_end(done)
        writer.end(summary)
        assert (done, summary) == kept
        assert "<html" in (run_dir / "report.html").read_text()
