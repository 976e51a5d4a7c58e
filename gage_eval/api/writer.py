"""The contract of an output writer, a format a plugin adds with ``gage_register_writers``."""
from __future__ import annotations

from typing import Any, Mapping

from gage_eval.api.events import RunStart, TaskDone


class Writer:
    """The contract of an output writer. Every method has a do-nothing default.

    Order of calls for one run: :meth:`start` once; per task :meth:`task_start`, then
    :meth:`write` per record (on ``--resume`` the kept records first), then
    :meth:`task_end`; finally :meth:`end` once with the summary, whatever stopped the run
    (also after an interrupt or an error, when the summary holds ``run.interrupted``).
    A plugin's writer is handed its own copy of each record, event and summary: what it
    changes reaches nothing else; unless it declares :attr:`read_only`. One that raises (or
    calls ``sys.exit``) is reported and left out for the rest of the run.
    """

    name: str = ""  #: set by the core to the name the writer was registered under
    #: True: the writer promises never to change what it is handed (a record, an event, the summary,
    #: nor anything inside them, then or later), so it gets the core's own objects, not copies (a copy
    #: of each record is a good part of the writing at 100,000 rows). Leave it False when unsure.
    read_only: bool = False

    def start(self, run: RunStart) -> None:
        """Before the first task: the run's id, folder, tasks, model and whether it resumes."""

    def task_start(self, task: str) -> None:
        """Before a task's first record. Open a task's output here, truncating what was there."""

    def write(self, task: str, record: Mapping[str, Any]) -> None:
        """One finished sample record (the line written to ``samples/<task>.jsonl``)."""

    def task_end(self, event: TaskDone) -> None:
        """After a task's last record (its counts and metrics). Not called for the task in
        progress when the run is interrupted."""

    def end(self, summary: Mapping[str, Any]) -> None:
        """Once, with the summary that ``summary.json`` holds. Close whatever is still open."""
