"""The ``report`` writer, on by default: ``report.html`` in the run folder at the end of a run."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

from gage_eval.api import GageError, RunStart, Writer

from gage_plugins_builtin.report.page import _warn, render_report


class ReportWriter(Writer):
    """``report.html`` in the run folder at the end of the run, unless the run's option ``report``
    is off (``--no-report``, run config ``report: false``). Written after ``summary.json``; a
    report that fails is a warning, the run is kept."""

    name = "report"

    def __init__(self, warn: Callable[[str], None] | None = None):
        self.run_dir: Path | None = None
        self._warn = warn or _warn

    def start(self, run: RunStart) -> None:
        if run.options.get("report", True) is not False:
            self.run_dir = Path(run.run_dir)

    def end(self, summary: Mapping[str, Any]) -> None:
        if self.run_dir is None:
            return
        try:
            render_report([self.run_dir], self.run_dir / "report.html", {self.run_dir: summary}, self._warn)
        except (Exception, KeyboardInterrupt) as exc:  # the summary is written: never lose the run for a page
            why = str(exc) if isinstance(exc, GageError) else f"{type(exc).__name__}: {exc}"
            self._warn(f"report.html was not written ({why}); `gage-eval report {self.run_dir}` writes it later")
