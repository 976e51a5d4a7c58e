"""The run folder's guards: one writer at a time, and a resume that checks what it continues."""
from __future__ import annotations

import errno
import hashlib
import os
import re
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping

from gage_eval.api.errors import GageError, OutputError
from gage_eval.api.runfolder import LOCK_FILE, RunFolder, check_own_files
from gage_eval.api.secrets import REDACTED
from gage_eval.runfolder.repro import warn_changed_environment


class RunLock:
    """An exclusive ``flock`` on ``RUN_DIR/.lock``, held for the whole run.

    The kernel drops the lock when the process dies (kill -9 included), so a stale lock
    file never blocks a resume; a second process on the same folder is refused at once.
    """

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self._fd: int | None = None

    def acquire(self) -> "RunLock":
        import fcntl

        make_run_dir(self.run_dir)
        check_own_files(self.run_dir)  # (nothing written through a link out of it)
        path = self.run_dir / LOCK_FILE
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise OutputError(f"run folder {self.run_dir}: cannot create its lock file: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_pid(fd)
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise GageError(f"run folder {self.run_dir} is in use by another gage-eval process"
                                f"{f' (pid {holder})' if holder else ''}; wait for it to end, or use "
                                f"another --run-id") from None
            raise OutputError(f"run folder {self.run_dir}: cannot lock it: {exc.strerror}") from None
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        except OSError as exc:  # a full disk before the run wrote anything
            os.close(fd)
            raise OutputError(f"run folder {self.run_dir}: cannot write its lock file: {exc.strerror}") from None
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


def _read_pid(fd: int) -> str:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        return os.read(fd, 32).decode(errors="replace").strip()
    except OSError:
        return ""


def make_run_dir(run_dir: Path) -> None:
    """Create the run folder, or say in one line why it cannot be."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise OutputError(f"cannot create run folder {run_dir}: {_first_file(run_dir)} is a file, not a "
                          f"folder; pick another --output-dir") from None
    except OSError as exc:
        raise OutputError(f"cannot create run folder {run_dir}: {exc.strerror}") from None


def remove_unused_run_dir(run_dir: Path) -> None:
    """Remove a run folder that holds nothing but its lock file (a run refused before it began)."""
    try:
        if all(p.name == LOCK_FILE for p in run_dir.iterdir()):
            (run_dir / LOCK_FILE).unlink(missing_ok=True)
            run_dir.rmdir()
    except OSError:
        pass


def _first_file(path: Path) -> Path:
    for parent in [path, *path.parents][::-1]:
        if parent.exists() and not parent.is_dir():
            return parent
    return path


# -- what a run read: task folders and local data files, hashed --------------------------------

def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def folder_digest(folder: Path) -> str:
    """One hash over the files of a folder (relative names and contents), in name order."""
    h = hashlib.sha256()
    for p in sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        h.update(str(p.relative_to(folder)).encode() + b"\0")
        h.update(file_digest(p).encode() + b"\n")
    return h.hexdigest()


def fingerprint(task_folder: Path, data_files: Iterable[Path]) -> dict:
    """What a task read, hashed: its folder (task.yaml, templates, shipped rows) and each local data file."""
    return {
        "task_folder": {"path": str(task_folder), "sha256": folder_digest(task_folder)},
        "data": {str(p): file_digest(p) for p in sorted(set(data_files)) if p.is_file()},
    }


def changed_data(fingerprint: Mapping[str, Any]) -> list[str]:
    """The data files of a task's :func:`fingerprint` whose bytes differ now (or that are gone)."""
    def same(path: str, digest: str) -> bool:
        try:
            return file_digest(Path(path)) == digest
        except OSError:
            return False
    return [p for p, d in (fingerprint.get("data") or {}).items() if not same(p, d)]


def changed_inputs(stored: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """Lines naming each task folder or data file whose content changed since the run began."""
    lines = []
    for task, before in stored.items():
        after = now.get(task)
        if after is None:
            continue
        if before["task_folder"]["sha256"] != after["task_folder"]["sha256"]:
            lines.append(f"task folder {before['task_folder']['path']} ({task}) changed")
        old, new = before.get("data", {}), after.get("data", {})
        gone = {p: d for p, d in old.items() if p not in new}
        added = {p: d for p, d in new.items() if p not in old}
        moved = set(gone.values()) & set(added.values())  # the same bytes found elsewhere (another venv)
        lines += [f"data file {p} ({task}) changed" for p, d in old.items() if p in new and new[p] != d]
        lines += [f"data file {p} ({task}) is gone" for p, d in gone.items() if d not in moved]
        lines += [f"data file {p} ({task}) is new" for p, d in sorted(added.items()) if d not in moved]
    return lines


# -- resume: settings given again must equal the stored ones ------------------------------------

def _mask_pattern(stored: str) -> re.Pattern:
    return re.compile(".+".join(re.escape(part) for part in stored.split(REDACTED)), re.S)


def has_mask(value: Any) -> bool:
    if isinstance(value, str):
        return REDACTED in value
    if isinstance(value, Mapping):
        return any(has_mask(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(has_mask(v) for v in value)
    return False


def matches_stored(stored: Any, given: Any) -> bool:
    """``given`` equals ``stored``, where each ``***`` in a stored string stands for a redacted secret."""
    if isinstance(stored, str) and REDACTED in stored:
        return isinstance(given, str) and bool(_mask_pattern(stored).fullmatch(given))
    if isinstance(stored, Mapping) and isinstance(given, Mapping):
        return set(stored) == set(given) and all(matches_stored(stored[k], given[k]) for k in stored)
    if isinstance(stored, (list, tuple)) and isinstance(given, (list, tuple)):
        return len(stored) == len(given) and all(matches_stored(a, b) for a, b in zip(stored, given))
    return stored == given


def masked_keys(args: Mapping[str, Any]) -> list[str]:
    return [k for k, v in args.items() if has_mask(v)]


def record_inputs(run_dir: Path, tasks: Iterable[Any], resume: bool) -> dict:
    """What each task (a TaskRun) reads, hashed (:func:`fingerprint`) and recorded or, on resume,
    checked (:func:`check_inputs`), with a warning for software changed since the run began."""
    now = {tr.name: fingerprint(tr.spec.folder, tr.data_files()) for tr in tasks}
    check_inputs(run_dir, now, resume)
    if resume:
        warn_changed_environment(run_dir)
        mark_resuming(RunFolder(run_dir))
    return now


def mark_resuming(folder: RunFolder) -> None:
    """The stored summary.json, marked out of date until this resume writes its own, and the old
    report.html removed: the resume drops the rows to run again from samples/ (a kill -9 then
    left a summary and a page of other rows)."""
    folder.report_file.unlink(missing_ok=True)
    try:
        summary = folder.summary(missing_ok=True, check=False)
    except GageError:  # (unreadable: the resume's own summary replaces it)
        return
    if isinstance(summary.get("run"), dict):
        summary["run"]["interrupted"] = ("a --resume began and has not finished: these counts are from before "
                                         "it (samples/ holds the rows since); --resume again to finish the run")
        folder.write_summary(summary)


def check_inputs(run_dir: Path, now: Mapping[str, Any], resume: bool) -> None:
    """Record each task folder's and data file's hashes (``now``); on resume, refuse any that
    changed since the run began."""
    folder = RunFolder(run_dir)
    if resume and not folder.inputs_file.exists():
        print(f"gage-eval: warning: {folder.inputs_file} is missing, so this resume cannot check "
              f"that the task folders and data are unchanged; it records them now", file=sys.stderr)
    elif resume:
        changed = changed_inputs(folder.inputs(missing_ok=True), now)
        if changed:
            raise GageError(f"--resume {run_dir}: the inputs changed since the run began, so its "
                            f"results would mix two versions: " + "; ".join(changed)
                            + ". Start a new run instead.")
        return
    folder.write_inputs(now)
