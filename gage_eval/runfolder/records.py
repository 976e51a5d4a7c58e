"""Records on disk: reading the run's jsonl files back, the event log, and recovery of a run
folder for --resume (the append-only files themselves: :mod:`gage_eval.api.jsonlines`; the
writers that use them: gage_eval.runfolder.writers)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from gage_eval.api.errors import GageError
from gage_eval.api.jsonlines import EventAppender, dumps, loads_line, truncate_partial_line
from gage_eval.api.runfolder import check_record, output_error


def read_jsonl(path: Path) -> Iterator[dict]:
    """The sample records of a jsonl file the run wrote; a line that is not one (or a record whose
    keys do not have the types a run writes) means the folder was damaged."""
    if not path.exists():
        return
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            if raw.strip():
                try:
                    record = loads_line(raw)
                except ValueError as exc:
                    record = exc
                if not isinstance(record, dict):
                    raise GageError(f"{path}:{lineno}: not a record written by gage-eval ({record}); the run "
                                    f"folder was changed by hand: remove that line to run its row again")
                check_record(f"{path}:{lineno}", record)  # (as report, compare and rescore read it)
                yield record


class EventLog(EventAppender):
    """The run folder's events.jsonl, a half-written last line cut first (``emit(event, **fields)``)."""

    def __init__(self, path: Path, run_id: str):
        truncate_partial_line(path)
        super().__init__(path, run_id, error=output_error)


def recover_jsonl(path: Path, keep: Callable[[Mapping[str, Any]], bool]) -> Iterator[tuple[dict, bool]]:
    """The records of a jsonl file an interrupted run wrote, each with ``keep(record)``. A
    half-written last line is cut first; records not kept are removed from the file (replaced
    whole, never half-written). The folder is made when missing (a run stopped before its
    first row has none)."""
    truncate_partial_line(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise output_error(path, exc) from None
    tmp = path.with_suffix(".jsonl.tmp")
    dropped = 0
    try:
        with tmp.open("w", encoding="utf-8") as kept:
            for record in read_jsonl(path):
                ok = keep(record)
                if ok:
                    kept.write(dumps(record) + "\n")
                else:
                    dropped += 1
                yield record, ok
        if dropped:
            os.replace(tmp, path)
    except OSError as exc:
        raise output_error(path, exc) from None
    finally:
        tmp.unlink(missing_ok=True)
