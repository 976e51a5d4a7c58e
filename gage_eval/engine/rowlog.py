"""What a run says about its rows: each row error and warning goes to events.jsonl; the console
shows a distinct error once, a backend that stopped once, and the first few warnings."""
from __future__ import annotations

import sys
from typing import Any, Mapping

from gage_eval.engine.infer import Stops
from gage_eval.engine.progress import Progress
from gage_eval.runfolder.records import EventLog
from gage_eval.engine.taskrun import MAX_WARNINGS_SHOWN, TaskRun


class RowLog:
    def __init__(self, events: EventLog, stops: Stops, quiet: bool):
        self.events = events
        self.stops = stops
        self.quiet = quiet

    def warnings(self, tr: TaskRun, locator: str, warnings: list[tuple[str, str]], progress: Progress,
                 shown: int) -> int:
        """Log a row's warnings (unknown top-level keys); returns how many this task has shown."""
        for where, message in warnings:
            self.events.emit("sample_warning", task=tr.name, locator=locator, path=where, message=message)
            shown += 1
            if not self.quiet and shown <= MAX_WARNINGS_SHOWN:
                progress.message(f"warning: {locator}: {message}"
                                 + (" (further warnings only in events.jsonl)" if shown == MAX_WARNINGS_SHOWN
                                    else ""))
        return shown

    def error(self, tr: TaskRun, record: Mapping[str, Any], err: Mapping[str, Any], locator: str,
              progress: Progress) -> None:
        self.events.emit("sample_error", task=tr.name, sample_id=record["id"], locator=locator,
                         stage=err.get("stage"), message=err.get("message"))
        if self.quiet:
            return
        stop = next((f for f in self.stops.values() if f in err["message"]), None)
        if stop is None:
            key = (err.get("stage"), err.get("message"))
            if key not in tr.repeated:  # an error every row gets alike (a template's) is shown once
                tr.repeated[key] = 0
                progress.message(f"{locator}: {err.get('stage')} error: {err.get('message')}")
            else:
                tr.repeated[key] += 1
        elif stop not in self.stops.announced:  # one line for a backend that stopped, not one a row
            self.stops.announced.add(stop)
            progress.message(f"{locator}: {err.get('stage')} error: {stop}; every row still "
                             f"to come is written as errored without being run")

    def task_end(self, tr: TaskRun) -> None:
        again = sum(tr.repeated.values())
        if again and not self.quiet:
            print(f"gage-eval: {tr.name}: {again} more row(s) failed with an error shown above; every row's "
                  f"error is in samples/{tr.name}.jsonl and events.jsonl", file=sys.stderr)
        missing = {k: n for k, n in (tr.extra_counts or {}).items() if k.endswith(".missing_field")}
        if missing and not self.quiet:  # on_missing_field: warn
            print(f"gage-eval: warning: {tr.name}: rows scored 0 for a missing field (on_missing_field: warn): "
                  + ", ".join(f"{k.rpartition('.')[0]} {n}" for k, n in sorted(missing.items())), file=sys.stderr)
        scrubbed = tr.counts.get("secrets_scrubbed", 0)
        if scrubbed:  # (shown with --quiet too: the files do not hold what the model said there)
            print(f"gage-eval: warning: {tr.name}: {scrubbed} model or judge replies quoted a secret (a key, a header "
                  f"value, URL user-info or its Basic token): masked as *** in every file written and never cached "
                  f"(summary.json: counts.secrets_scrubbed)", file=sys.stderr)
        if tr.failure:
            self.events.emit("task_failed", task=tr.name, message=tr.failure)
            if not self.quiet:
                print(f"gage-eval: task {tr.name} failed: {tr.failure}", file=sys.stderr)
