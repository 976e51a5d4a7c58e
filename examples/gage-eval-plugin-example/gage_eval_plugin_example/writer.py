"""A writer: one CSV of per-sample scores per task, written as each sample finishes.

``--writer example/scores_csv`` writes ``RUN_DIR/scores/<task>.csv``;
``--writer example/scores_csv:folder=DIR`` writes into DIR instead. Columns: ``id``, ``error``
(empty when the row was scored), then one column per metric with the number it counts as.
"""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, Mapping

from gage_eval.api import GageError, Writer, metric_value


class ScoresCsv(Writer):
    def __init__(self, folder: str | None = None):
        if folder is not None and not str(folder).strip():
            raise GageError("folder=: expected a folder path")
        self.folder = Path(folder).expanduser() if folder else None
        self._fh: Any = None
        self._out: Any = None
        self._columns: list[str] | None = None
        self._pending: list[Mapping[str, Any]] = []  # errored rows seen before the first scored one

    def start(self, run) -> None:
        if self.folder is None:
            self.folder = Path(run.run_dir) / "scores"
        self.folder.mkdir(parents=True, exist_ok=True)

    def task_start(self, task: str) -> None:
        # "w": on --resume the kept records are written again first, so the file is rebuilt whole
        self._fh = (self.folder / f"{task}.csv").open("w", newline="", encoding="utf-8")
        self._out = csv.writer(self._fh)
        self._columns, self._pending = None, []

    def write(self, task: str, record: Mapping[str, Any]) -> None:
        result = record.get("eval_result") or {}
        metrics = result.get("metrics") or {}
        if self._columns is None:
            if not metrics:  # the first row with metrics names the columns: hold the ones before it
                self._pending.append(record)
                return
            self._header(sorted(metrics))
        self._row(record)

    def _header(self, columns: list[str]) -> None:
        self._columns = columns
        self._out.writerow(["id", "error", *columns])
        for held in self._pending:
            self._row(held)
        self._pending = []

    def _row(self, record: Mapping[str, Any]) -> None:
        result = record.get("eval_result") or {}
        metrics = result.get("metrics") or {}
        error = result.get("error") or {}
        values = [metric_value(metrics[name]) if name in metrics else "" for name in self._columns or []]
        self._out.writerow([record.get("id"), error.get("message", ""), *["" if v is None else v for v in values]])
        self._fh.flush()

    def task_end(self, event) -> None:
        if self._columns is None:  # no row had metrics (all errored): still a header and every row
            self._header([])
        self._fh.close()

    def end(self, summary) -> None:
        if self._fh is not None and not self._fh.closed:  # a run interrupted mid-task: no task_end
            self._fh.close()
