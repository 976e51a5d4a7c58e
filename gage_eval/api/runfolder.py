"""The run folder ``runs/<run_id>/``: its layout, and every read and write of its JSON files.

This module is the one place that spells the folder's file names and reads them back; the
engine, resume, rescore, merge, the report and compare all go through :class:`RunFolder`::

    config.json     the run's options (secrets masked)          RunFolder.config()
    inputs.json     hashes of what each task read               RunFolder.inputs()
    summary.json    the run's and each task's results           RunFolder.summary()
    samples/<task>.jsonl    one record per row                  RunFolder.records(task)
    instances/<task>.jsonl  the Every Eval Ever instance records
    events.jsonl    the run's events; .lock: one writer at a time

A run folder is read strictly: its own files (a symlink must resolve inside the folder; a run or
resume refuses one that does not before it writes, :func:`check_own_files`), regular files only
(never a FIFO or a device), JSON files of at most :data:`MAX_JSON_BYTES` and sample lines of at
most :data:`MAX_LINE_BYTES`; task names from summary.json are folder names as run ids are; every
value a command uses has the type the run wrote. Each problem is one GageError line (exit 2)
naming the file, the line and the key.
"""
from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import stat
from pathlib import Path
from typing import IO, Any, Callable, Iterable, Iterator, Mapping

from gage_eval.api.errors import GageError, OutputError
from gage_eval.api.jsonio import file_kind
from gage_eval.api.jsonlines import JsonlAppender, TaskFiles, dumps, loads_line
from gage_eval.api.strictjson import expect_fields as _fields, expect_type as _expect, json_type

CONFIG_FILE = "config.json"
INPUTS_FILE = "inputs.json"
SUMMARY_FILE = "summary.json"
EVENTS_FILE = "events.jsonl"
LOCK_FILE = ".lock"
SAMPLES_DIR = "samples"
INSTANCES_DIR = "instances"
REPORT_FILE = "report.html"

MAX_JSON_BYTES = 64 << 20  # summary.json, config.json, inputs.json: a real one is a few kB
MAX_LINE_BYTES = 64 << 20  # one record of samples/<task>.jsonl (media are elided, text clipped by no one)
RUN_ID = re.compile(r"[A-Za-z0-9._-]{1,200}")  # a run id: one folder name


class MissingRunFile(GageError):
    """A run folder's required file is not there (a resume reports it in its own words)."""


def folder_name_ok(name: Any) -> bool:
    return isinstance(name, str) and bool(RUN_ID.fullmatch(name)) and name not in (".", "..")


def check_task_name(name: Any, where: str) -> None:
    """A task name from a run folder: folder names joined by ``/`` (groups), so ``samples/<task>.jsonl`` stays in it."""
    if not isinstance(name, str) or not all(folder_name_ok(part) for part in name.split("/")):
        raise GageError(f"{where}: task name {name!r} is not a folder name (letters, digits, . _ - and / "
                        f"between them, no '.' or '..' part); the run folder was changed by hand")


# -- opening: the folder's own regular files, bounded -------------------------------------------

def open_run_file(run_dir: Path, path: Path) -> tuple[IO[bytes], int] | None:
    """``path`` (inside ``run_dir``) opened for reading with its size; None when it does not exist."""
    try:
        real = path.resolve(strict=True)
        root = run_dir.resolve(strict=True)
    except FileNotFoundError:
        return None
    except (OSError, RuntimeError) as exc:  # a symlink loop, a name too long
        raise GageError(f"{path}: cannot be read ({exc})") from None
    if not real.is_relative_to(root):
        raise GageError(f"{path}: resolves to {real}, outside the run folder {run_dir}; gage-eval reads only "
                        f"the run folder's own files")
    try:  # O_NONBLOCK: opening a FIFO must not wait for a writer
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise GageError(f"{path}: cannot read: {exc.strerror or exc}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise GageError(f"{path}: {file_kind(st.st_mode)}, not a regular file; a run folder holds the files "
                        f"gage-eval wrote")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb"), st.st_size


def check_own_files(run_dir: Path) -> None:
    """Refuse a run folder (copied or unpacked) holding a symlink that leads out of it, or a FIFO or device: a
    run appends to, cuts and replaces its files, never through a link to a file elsewhere nor waiting on a FIFO."""
    root = run_dir.resolve()  # (its own entries, and what samples/ and instances/ hold: not a whole tree -o names)
    inner = (Path(top, name) for sub in (SAMPLES_DIR, INSTANCES_DIR) for top, dirs, files in os.walk(run_dir / sub)
             for name in dirs + files)
    for path in itertools.chain((run_dir / name for name in os.listdir(run_dir)), inner):
        try:  # (a link to a file not made yet: judged by where it leads)
            real = path.resolve()
            mode = os.stat(real).st_mode if real.exists() else stat.S_IFREG
        except (OSError, RuntimeError) as exc:  # a symlink loop
            raise GageError(f"{path}: cannot be followed ({exc}); remove it") from None
        if not real.is_relative_to(root):
            raise GageError(f"{path}: a symlink to {real}, outside the run folder {run_dir}; a run writes only the "
                            f"run folder's own files: remove the link")
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise GageError(f"{path}: {file_kind(mode)}, not a regular file; a run folder holds only the files "
                            f"gage-eval wrote: remove it")


def _too_big(path: Path, size: int, cap: int, what: str) -> GageError:
    return GageError(f"{path}: {what} over {cap >> 20} MiB ({size} bytes or more); a run writes far less, "
                     f"so the run folder was changed by hand")


def read_run_json(run_dir: Path, name: str, *, required: bool = True) -> dict | None:
    """``run_dir/name`` as a JSON object; None when it is missing and not ``required``."""
    path = run_dir / name
    opened = open_run_file(run_dir, path)
    if opened is None:
        if required:
            raise MissingRunFile(f"{run_dir}: no {name} there; is it a gage-eval run folder?")
        return None
    fh, size = opened
    with fh:
        data = fh.read(MAX_JSON_BYTES + 1) if size <= MAX_JSON_BYTES else b""
    if max(size, len(data)) > MAX_JSON_BYTES:
        raise _too_big(path, max(size, len(data)), MAX_JSON_BYTES, "a file")
    try:
        value = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise GageError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start + 1})") from None
    except ValueError as exc:
        raise GageError(f"{path}: not valid JSON ({exc}); the file is torn or was changed by hand") from None
    if not isinstance(value, dict):
        raise GageError(f"{path}: expected a JSON object, got {json_type(value)}")
    return value


def iter_run_records(run_dir: Path, path: Path) -> Iterator[tuple[int, dict]]:
    """(line number, record) of a samples file; nothing when it does not exist. Any line that is
    not a whole record (torn, over :data:`MAX_LINE_BYTES`, not an object, a wrong-typed key) is
    a GageError naming ``path:line``: the commands never skip a row silently."""
    opened = open_run_file(run_dir, path)
    if opened is None:
        return
    fh, _ = opened
    with fh:
        for lineno, raw in enumerate(iter(lambda: fh.readline(MAX_LINE_BYTES + 1), b""), 1):
            if len(raw) > MAX_LINE_BYTES:
                raise _too_big(Path(f"{path}:{lineno}"), len(raw), MAX_LINE_BYTES, "a line")
            if not raw.strip():
                continue
            try:
                record = loads_line(raw)
            except ValueError as exc:
                if not raw.endswith(b"\n"):  # a kill or a full disk mid-write: a resume cuts it
                    raise GageError(f"{path}:{lineno}: torn (no end of line: the run was stopped mid-write); gage-eval "
                                    f"--resume {shlex.quote(str(run_dir))} removes it and runs its row again") from None
                raise GageError(f"{path}:{lineno}: not a whole JSON record ({getattr(exc, 'msg', exc)}); the run "
                                f"folder was damaged or changed by hand: remove that line (a resume writes its row "
                                f"again)") from None
            if not isinstance(record, dict):
                raise GageError(f"{path}:{lineno}: expected a JSON object (a record), got {json_type(record)}")
            check_record(f"{path}:{lineno}", record)
            yield lineno, record


# -- the types the commands use ----------------------------------------------------------------

_OBJ, _LIST, _STR, _NONE = dict, list, str, type(None)


_OBJ_OR_NULL = ((_OBJ, _NONE), "an object or null")
_LIST_OR_NULL = ((_LIST, _NONE), "a list or null")
_STR_OR_NULL = ((_STR, _NONE), "a string or null")
_NUM_OR_NULL = ((int, float, bool, _NONE), "a number or null")
_RECORD = {"id": ((_STR, int), "a string or an integer"), "messages": _LIST_OR_NULL, "options": _LIST_OR_NULL,
           "references": _LIST_OR_NULL, "data_tag": _OBJ_OR_NULL, "predict_result": _LIST_OR_NULL,
           "eval_result": _OBJ_OR_NULL}
_PREDICTED = {"message": _OBJ_OR_NULL, "usage": _OBJ_OR_NULL, "prompt": _STR_OR_NULL, "raw_text": _STR_OR_NULL,
              "choices": _LIST_OR_NULL, "loglikelihoods": _LIST_OR_NULL}
_RESULT = {"metrics": _OBJ_OR_NULL, "overall": _OBJ_OR_NULL, "error": _OBJ_OR_NULL, "judge": _OBJ_OR_NULL}
_MESSAGE = {"content": ((_STR, _LIST, _NONE), "a string, a list or null")}
_METRIC_VALUE = {"value": _NUM_OR_NULL}
_ERROR = {"stage": _STR_OR_NULL, "locator": _STR_OR_NULL}
_METRIC = {"value": _NUM_OR_NULL, "stderr": ((int, float, _NONE), "a number or null"),
           "n": ((int, _NONE), "an integer or null"), "higher_is_better": ((bool, _NONE), "true, false or null")}


def check_record(where: str, record: Mapping[str, Any]) -> None:
    """The keys of a sample record that report, compare and rescore use have the types a run writes."""
    _fields(where, "", record, _RECORD)
    for i, item in enumerate(record.get("options") or []):
        if not isinstance(item, dict):
            _expect(where, f"options[{i}]", item, (_OBJ,), "an object")
    for i, item in enumerate(record.get("predict_result") or []):
        if not isinstance(item, dict):
            _expect(where, f"predict_result[{i}]", item, (_OBJ,), "an object")
        _fields(where, f"predict_result[{i}].", item, _PREDICTED)
        _fields(where, f"predict_result[{i}].message.", item.get("message") or {}, _MESSAGE)
        for key, value in (item.get("usage") or {}).items():
            if not isinstance(value, (int, float, _NONE)) or value.__class__ is bool:
                _expect(where, f"predict_result[{i}].usage.{key}", value, (int, float, _NONE), "a number or null")
    result = record.get("eval_result") or {}
    _fields(where, "eval_result.", result, _RESULT)
    for name, value in (result.get("metrics") or {}).items():
        if isinstance(value, dict):
            _fields(where, f"eval_result.metrics.{name}.", value, _METRIC_VALUE)
        elif not isinstance(value, (int, float, bool, _NONE)):
            _expect(where, f"eval_result.metrics.{name}", value, (int, float, bool, _OBJ, _NONE),
                    "a number, an object or null")
    error = result.get("error")
    if isinstance(error, dict):
        _fields(where, "eval_result.error.", error, _ERROR)


_BACKEND = {"name": _STR_OR_NULL, "model_id": _STR_OR_NULL, "args": _OBJ_OR_NULL, "settings": _OBJ_OR_NULL,
            "stats": _OBJ_OR_NULL}
_RUN = {"id": ((_STR,), "a string"), "model": _OBJ_OR_NULL, "judge": _OBJ_OR_NULL, "settings": _OBJ_OR_NULL,
        "versions": _OBJ_OR_NULL, "timings": _OBJ_OR_NULL}
_TASK = {"status": _STR_OR_NULL, "failure": _STR_OR_NULL, "primary_metric": _STR_OR_NULL,
         "metrics": _OBJ_OR_NULL, "slices": _OBJ_OR_NULL, "counts": _OBJ_OR_NULL, "errors_by_stage": _OBJ_OR_NULL,
         "timings": _OBJ_OR_NULL, "source": _OBJ_OR_NULL}


def check_summary(path: Path, summary: Mapping[str, Any], *, required: bool = True) -> None:
    """summary.json's ``run`` and ``tasks`` (required unless not ``required``), task names, the types of keys read."""
    where = str(path)
    for key in ("run", "tasks"):
        if required or key in summary:
            _expect(where, key, summary.get(key), (_OBJ,), "an object")
    run = summary.get("run") or {}
    _fields(where, "run.", run, _RUN)
    for role in ("model", "judge"):
        _fields(where, f"run.{role}.", run.get(role) or {}, _BACKEND)
    for name, task in (summary.get("tasks") or {}).items():
        check_task_name(name, f"{where}: key 'tasks'")
        _expect(where, f"tasks.{name}", task, (_OBJ,), "an object")
        _fields(where, f"tasks.{name}.", task, _TASK)
        _fields(where, f"tasks.{name}.source.", task.get("source") or {},
                {"folder": _STR_OR_NULL, "origin": _STR_OR_NULL})
        for metric, entry in (task.get("metrics") or {}).items():
            _expect(where, f"tasks.{name}.metrics.{metric}", entry, (_OBJ,), "an object")
            _fields(where, f"tasks.{name}.metrics.{metric}.", entry, _METRIC)
        for key, values in (task.get("slices") or {}).items():
            _expect(where, f"tasks.{name}.slices.{key}", values, (_OBJ,), "an object")
            for tag, metrics in values.items():
                _expect(where, f"tasks.{name}.slices.{key}.{tag}", metrics, (_OBJ,), "an object")
                for metric, entry in metrics.items():
                    _expect(where, f"tasks.{name}.slices.{key}.{tag}.{metric}", entry, (_OBJ,), "an object")
                    _fields(where, f"tasks.{name}.slices.{key}.{tag}.{metric}.", entry, _METRIC)


def check_inputs(path: Path, inputs: Mapping[str, Any]) -> None:
    """inputs.json: per task an object with a ``task_folder`` object and a ``data`` object."""
    for task, entry in inputs.items():
        _expect(str(path), task, entry, (_OBJ,), "an object")
        _fields(str(path), f"{task}.", entry, {"task_folder": _OBJ_OR_NULL, "data": _OBJ_OR_NULL})


# -- writing -------------------------------------------------------------------------------------

def output_error(path: Path, exc: OSError) -> OutputError:
    """A failed write as a one-line error that says what is kept and how to go on."""
    run_dir = next((p.parent for p in path.parents if p.name in (SAMPLES_DIR, INSTANCES_DIR) and  # (a task pkg/name)
                    (p.parent / CONFIG_FILE).is_file()), path.parent)
    resume = f"gage-eval --resume {shlex.quote(str(run_dir))}"
    if isinstance(exc, FileNotFoundError):  # (each folder was made before its first file: one was removed)
        again = f"{resume} runs their rows again" if (run_dir / CONFIG_FILE).is_file() else "run again"
        return OutputError(f"cannot write {path}: it or its folder was removed while the run wrote it, and the records "
                           f"in it with it; {again}")
    return OutputError(f"cannot write {path}: {exc.strerror or exc}; the records written so far are kept: "
                       f"free space or fix the folder, then continue with {resume}")


def write_json_atomic(path: Path, obj: Any) -> None:
    """``obj`` as indented strict JSON (NaN and infinities as null), replacing ``path`` whole or
    not at all; a failed write is an :class:`OutputError`."""
    text = dumps(obj, indent=2, separators=(",", ": "))
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        tmp.write_text(text + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        raise output_error(path, exc) from None


class RunFolder:
    """One run folder: where each of its files lies, and each read and write of them."""

    def __init__(self, path: Path | str):
        self.path = path = Path(path)
        self.config_file, self.inputs_file = path / CONFIG_FILE, path / INPUTS_FILE
        self.summary_file, self.events_file = path / SUMMARY_FILE, path / EVENTS_FILE
        self.lock_file, self.report_file, self.samples_dir = path / LOCK_FILE, path / REPORT_FILE, path / SAMPLES_DIR
        self.instances_dir = path / INSTANCES_DIR

    def __repr__(self) -> str:
        return f"RunFolder({str(self.path)!r})"

    def samples_file(self, task: str) -> Path:
        return TaskFiles.file(self.samples_dir, task)

    def instances_file(self, task: str) -> Path:
        return TaskFiles.file(self.instances_dir, task)

    def is_run(self) -> bool:
        """Whether this looks like a run folder: its summary.json, or config.json beside samples/ or events.jsonl."""
        try:
            return self.summary_file.is_file() or self.config_file.is_file() and \
                (self.samples_dir.is_dir() or self.events_file.is_file())
        except OSError:
            return False

    def check_idle(self, command: str) -> None:
        """Refuse a run folder that a gage-eval process is writing now (it holds the lock)."""
        import fcntl

        try:
            fd = os.open(self.lock_file, os.O_RDONLY | os.O_NONBLOCK)  # (a FIFO: no wait)
        except OSError:
            return  # (no run has held it)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # (released as fd closes)
        except OSError:
            raise GageError(f"{command} {self.path}: the run is still going (gage-eval process "
                            f"{os.read(fd, 32).decode(errors='replace').strip() or '?'} is writing it); "
                            f"wait for it to end") from None
        finally:
            os.close(fd)

    # reading: strict, each problem one GageError naming the file
    def config(self, *, missing_ok: bool = False) -> dict | None:
        """config.json as a JSON object (the core turns it into its options); None when missing
        and ``missing_ok``, else a :class:`MissingRunFile`."""
        return read_run_json(self.path, CONFIG_FILE, required=not missing_ok)

    def inputs(self, *, missing_ok: bool = True) -> dict:
        """inputs.json, each task's entry checked; ``{}`` when missing and ``missing_ok`` (else as config)."""
        inputs = read_run_json(self.path, INPUTS_FILE, required=not missing_ok) or {}
        check_inputs(self.inputs_file, inputs)
        return inputs

    def summary(self, *, missing_ok: bool = False, check: bool = True) -> dict:
        """summary.json, ``run`` and ``tasks`` checked (unless not ``check``); with ``missing_ok`` a
        missing file is ``{}`` and both keys are optional (a run stopped before its end)."""
        summary = read_run_json(self.path, SUMMARY_FILE, required=not missing_ok) or {}
        if check:
            check_summary(self.summary_file, summary, required=not missing_ok)
        return summary

    def records(self, task: str) -> Iterator[tuple[int, dict]]:
        """(line number, record) of ``samples/<task>.jsonl``, each checked; nothing when it is missing."""
        return iter_run_records(self.path, self.samples_file(task))

    def reread_samples(self, task: str) -> Iterator[dict]:
        """The Sample records of ``task`` read again from its data as the run read them (config.json,
        task folder, loader, preprocessor), rows failing their checks left out; what samples keep only
        as a hash (a long ``data:`` image) is whole here. A GageError when the data cannot be read."""
        if _reread is None:
            raise GageError(f"{self.path}: the rows of task {task!r} can be read again only inside gage-eval's "
                            f"engine or command line")
        yield from _reread(self.path, task)

    # writing: whole files, replaced atomically
    def write_config(self, options: Mapping[str, Any]) -> None:
        write_json_atomic(self.config_file, options)

    def write_inputs(self, inputs: Mapping[str, Any]) -> None:
        write_json_atomic(self.inputs_file, inputs)

    def write_summary(self, summary: Mapping[str, Any]) -> None:
        write_json_atomic(self.summary_file, summary)

    def write_json(self, name: str, obj: Any) -> None:
        """A JSON file of a writer's own in this folder (``eee_aggregate.json``), replaced whole."""
        write_json_atomic(self.path / name, obj)

    def jsonl_appender(self, path: Path) -> JsonlAppender:
        """An append-only JSONL file of this folder's (:meth:`instances_file`), made with its folder:
        ``write(obj)`` adds one strict JSON line, flushed; ``close()``; a failed write: :class:`OutputError`."""
        return JsonlAppender(path, error=output_error)

    def task_files(self, folder: Path) -> TaskFiles:
        """One :meth:`jsonl_appender` per task, ``<task>.jsonl`` in ``folder`` (:attr:`samples_dir`,
        :attr:`instances_dir`), opened at its first line (``write(task, obj)``, ``close(task)``, ``close()``)."""
        return TaskFiles(folder, error=output_error)


# -- a stored run's rows read again from its data: the core (engine.reread) hands its reader here --
_reread: Callable[[Path, str], Iterable[dict]] | None = None


def use_reread(source: Callable[[Path, str], Iterable[dict]]) -> None:
    """Where :meth:`RunFolder.reread_samples` reads rows from: the core's row pipeline (the engine's)."""
    global _reread
    _reread = source

