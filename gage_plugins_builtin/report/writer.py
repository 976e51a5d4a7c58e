"""The ``report`` writer, on by default: ``report.html`` in the run folder at the end of a run."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from gage_eval.api import GageError, OutputError, Writer, events

from gage_plugins_builtin.report.page import print_warning, render_report


class ReportWriter(Writer):
    """``report.html`` in the run folder at the end of the run, unless the run's option ``report``
    is off (``--no-report``, run config ``report: false``). Written after ``summary.json``; a
    report that fails is a warning, the run is kept. A task whose samples file the engine wrote
    in the data's order (``TaskDone.in_data_order``) is listed from it without reading its rows again."""

    name = "report"
    read_only = True  # it keeps a task's name and reads the summary for the page (uncopied: tests/core/test_writer_copies.py)

    def __init__(self) -> None:
        self.run_dir: Path | None = None  # known at start(); None: the run's option is off
        self.ordered: set[str] = set()  # the tasks written in the data's order

    def start(self, run: events.RunStart) -> None:
        if run.options.get("report", True) is not False:
            self.run_dir = Path(run.run_dir)

    def task_end(self, event: events.TaskDone) -> None:
        if event.in_data_order:
            self.ordered.add(event.task)

    def end(self, summary: Mapping[str, Any]) -> None:
        if self.run_dir is None or not self.run_dir.is_dir():  # (a run folder removed mid-run is not made again)
            return
        if summary.get("run", {}).get("exit_status") == OutputError.exit_code:  # records cut short: its resume makes it
            return
        try:
            render_report([self.run_dir], self.run_dir / "report.html", {self.run_dir: summary}, print_warning,
                          ordered={self.run_dir: self.ordered})
        except (Exception, KeyboardInterrupt) as exc:  # the summary is written: never lose the run for a page
            why = str(exc) if isinstance(exc, GageError) else f"{type(exc).__name__}: {exc}"
            print_warning(f"report.html was not written ({why}); `gage-eval report {self.run_dir}` writes it later")
