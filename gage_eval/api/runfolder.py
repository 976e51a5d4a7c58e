"""Reading a run folder back (``report``, ``compare``, ``rescore``) and writing pages beside runs.

A run folder is read only through here: its own files (a symlink must resolve inside the
folder), regular files only (never a FIFO or a device), JSON files of at most
:data:`MAX_JSON_BYTES` and sample lines of at most :data:`MAX_LINE_BYTES`; task names from
summary.json are folder names as run ids are; every value a command uses has the type the run
wrote. Each problem is one :class:`~gage_eval.api.errors.GageError` line (exit 2) naming the file,
the line and the key. A page (report.html, compare --html) is never written inside a run folder
other than as that run's own report.html, nor over a file that is not a page gage-eval wrote.
"""
from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import IO, Any, Iterable, Iterator, Mapping

from gage_eval.api.errors import GageError
from gage_eval.api.jsonio import SPECIAL_FILES, json_type

MAX_JSON_BYTES = 64 << 20  # summary.json, config.json, inputs.json: a real one is a few kB
MAX_LINE_BYTES = 64 << 20  # one record of samples/<task>.jsonl (media are elided, text clipped by no one)
RUN_ID = re.compile(r"[A-Za-z0-9._-]{1,200}")  # a run id: one folder name
# The page's mark: a file that has it in its head is a page gage-eval wrote, and may be replaced.
GENERATOR = '<meta name="generator" content="gage-eval">'
_HEAD_BYTES = 4096

_KINDS = {**SPECIAL_FILES, stat.S_IFDIR: "a folder", stat.S_IFLNK: "a symlink"}


def folder_name_ok(name: Any) -> bool:
    return isinstance(name, str) and bool(RUN_ID.fullmatch(name)) and name not in (".", "..")


def check_task_name(name: Any, where: str) -> None:
    """A task name read from a run folder: folder names (as a run id) joined by ``/`` (the task
    schema allows groups), so ``samples/<task>.jsonl`` stays inside the run folder."""
    if not isinstance(name, str) or not all(folder_name_ok(part) for part in name.split("/")):
        raise GageError(f"{where}: task name {name!r} is not a folder name (letters, digits, . _ - and / "
                        f"between them, no '.' or '..' part); the run folder was changed by hand")


# -- opening: the folder's own regular files, bounded -------------------------------------------

def _kind(mode: int) -> str:
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


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
        raise GageError(f"{path}: {_kind(st.st_mode)}, not a regular file; a run folder holds the files "
                        f"gage-eval wrote")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb"), st.st_size


def _too_big(path: Path, size: int, cap: int, what: str) -> GageError:
    return GageError(f"{path}: {what} over {cap >> 20} MiB ({size} bytes or more); a run writes far less, "
                     f"so the run folder was changed by hand")


def read_run_json(run_dir: Path, name: str, *, required: bool = True) -> dict | None:
    """``run_dir/name`` as a JSON object; None when it is missing and not ``required``."""
    path = run_dir / name
    opened = open_run_file(run_dir, path)
    if opened is None:
        if required:
            raise GageError(f"{run_dir}: no {name} there; is it a gage-eval run folder?")
        return None
    fh, size = opened
    with fh:
        if size > MAX_JSON_BYTES:
            raise _too_big(path, size, MAX_JSON_BYTES, "a file")
        data = fh.read(MAX_JSON_BYTES + 1)
    if len(data) > MAX_JSON_BYTES:
        raise _too_big(path, len(data), MAX_JSON_BYTES, "a file")
    try:
        import json

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
    import json

    opened = open_run_file(run_dir, path)
    if opened is None:
        return
    fh, _ = opened
    with fh:
        lineno = 0
        while True:
            raw = fh.readline(MAX_LINE_BYTES + 1)
            if not raw:
                return
            lineno += 1
            if len(raw) > MAX_LINE_BYTES:
                raise _too_big(Path(f"{path}:{lineno}"), len(raw), MAX_LINE_BYTES, "a line")
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)
            except ValueError as exc:
                why = "torn (no end of line: the run was stopped mid-write; resume it)" \
                    if not raw.endswith(b"\n") else f"not a whole JSON record ({getattr(exc, 'msg', exc)})"
                raise GageError(f"{path}:{lineno}: {why}; the run folder was damaged or changed by hand: "
                                f"remove that line (a resume writes its row again)") from None
            if not isinstance(record, dict):
                raise GageError(f"{path}:{lineno}: expected a JSON object (a record), got {json_type(record)}")
            check_record(f"{path}:{lineno}", record)
            yield lineno, record


# -- the types the commands use ----------------------------------------------------------------

_OBJ, _LIST, _STR, _NONE = dict, list, str, type(None)


def _expect(where: str, key: str, value: Any, types: tuple, what: str) -> None:
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        raise GageError(f"{where}: key {key!r}: expected {what}, got {json_type(value)}")


def _fields(where: str, prefix: str, obj: Mapping[str, Any], spec: Mapping[str, tuple[tuple, str]]) -> None:
    for key, (types, what) in spec.items():
        if key in obj:
            _expect(where, prefix + key, obj[key], types, what)


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
_METRIC = {"value": _NUM_OR_NULL, "stderr": ((int, float, _NONE), "a number or null"),
           "n": ((int, _NONE), "an integer or null"), "higher_is_better": ((bool, _NONE), "true, false or null")}


def check_record(where: str, record: Mapping[str, Any]) -> None:
    """The keys of a sample record that report, compare and rescore use have the types a run writes."""
    _fields(where, "", record, _RECORD)
    for i, item in enumerate(record.get("options") or []):
        _expect(where, f"options[{i}]", item, (_OBJ,), "an object")
    for i, item in enumerate(record.get("predict_result") or []):
        _expect(where, f"predict_result[{i}]", item, (_OBJ,), "an object")
        _fields(where, f"predict_result[{i}].", item, _PREDICTED)
        _fields(where, f"predict_result[{i}].message.", item.get("message") or {},
                {"content": ((_STR, _LIST, _NONE), "a string, a list or null")})
        for key, value in (item.get("usage") or {}).items():
            _expect(where, f"predict_result[{i}].usage.{key}", value, (int, float, _NONE), "a number or null")
    result = record.get("eval_result") or {}
    _fields(where, "eval_result.", result, _RESULT)
    for name, value in (result.get("metrics") or {}).items():
        _expect(where, f"eval_result.metrics.{name}", value, (int, float, bool, _OBJ, _NONE),
                "a number, an object or null")
        if isinstance(value, dict):
            _fields(where, f"eval_result.metrics.{name}.", value, {"value": _NUM_OR_NULL})
    error = result.get("error")
    if isinstance(error, dict):
        _fields(where, "eval_result.error.", error, {"stage": _STR_OR_NULL, "locator": _STR_OR_NULL})


_BACKEND = {"name": _STR_OR_NULL, "model_id": _STR_OR_NULL, "args": _OBJ_OR_NULL, "settings": _OBJ_OR_NULL,
            "stats": _OBJ_OR_NULL}
_RUN = {"id": ((_STR,), "a string"), "model": _OBJ_OR_NULL, "judge": _OBJ_OR_NULL, "settings": _OBJ_OR_NULL,
        "versions": _OBJ_OR_NULL, "timings": _OBJ_OR_NULL}
_TASK = {"status": _STR_OR_NULL, "failure": _STR_OR_NULL, "primary_metric": _STR_OR_NULL,
         "metrics": _OBJ_OR_NULL, "slices": _OBJ_OR_NULL, "counts": _OBJ_OR_NULL, "errors_by_stage": _OBJ_OR_NULL,
         "timings": _OBJ_OR_NULL, "source": _OBJ_OR_NULL}


def check_summary(path: Path, summary: Mapping[str, Any], *, required: bool = True) -> None:
    """summary.json's ``run`` and ``tasks`` (required unless not ``required``), each task's name
    and the types of the keys the commands read."""
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


_ANNOTATION_TYPES = {"list": (_LIST, "a list"), "dict": (_OBJ, "an object"), "str": (_STR, "a string"),
                     "int": (int, "an integer"), "float": ((int, float), "a number"), "bool": (bool, "true or false"),
                     "None": (_NONE, "null")}


def run_options(run_dir: Path) -> Any:
    """The run's options from its config.json, each key of the type RunOptions declares."""
    from dataclasses import fields

    from gage_eval.config.options import RunOptions

    path = run_dir / "config.json"
    data = read_run_json(run_dir, "config.json")
    known = {f.name: f for f in fields(RunOptions)}
    extra = sorted(set(data) - set(known))
    if "tasks" not in data or extra:
        raise GageError(f"{path}: not a gage-eval run config" + (f" (unknown keys: {', '.join(extra)})" if extra
                                                                   else " (no 'tasks')"))
    for key, value in data.items():
        names = [part.strip().split("[")[0] for part in str(known[key].type).split("|")]
        kinds = [_ANNOTATION_TYPES[n] for n in names if n in _ANNOTATION_TYPES]
        if kinds and not any(isinstance(value, t) and not (isinstance(value, bool) and t in (int, (int, float)))
                             for t, _ in kinds):
            raise GageError(f"{path}: key {key!r}: expected {' or '.join(w for _, w in kinds)}, "
                            f"got {json_type(value)}")
    for i, task in enumerate(data["tasks"]):
        if not isinstance(task, str):
            raise GageError(f"{path}: key 'tasks[{i}]': expected a string, got {json_type(task)}")
    return RunOptions(**data)


# -- writing a page beside runs ----------------------------------------------------------------

def is_run_folder(folder: Path) -> bool:
    """A folder holding a run's summary.json, or its config.json beside samples/ or events.jsonl."""
    try:
        return (folder / "summary.json").is_file() or (folder / "config.json").is_file() and \
            ((folder / "samples").is_dir() or (folder / "events.jsonl").is_file())
    except OSError:
        return False


def check_page_output(out: Path, run_dirs: list[Path], option: str, own_report: Path | None = None) -> None:
    """Refuse to write a page at ``out`` inside a run folder (a given one, or any folder above
    ``out`` holding a summary.json or config.json) unless ``out`` is ``own_report`` (the one
    run's report.html), or over a file that is not a page gage-eval wrote (its generator mark)."""
    target = out.parent.resolve() / out.name
    if own_report is None or target != own_report.parent.resolve() / own_report.name:
        roots = {d.resolve() for d in run_dirs}
        for folder in target.parents:
            if folder in roots or is_run_folder(folder):
                raise GageError(f"{option} {out}: inside the run folder {folder}; gage-eval never writes into "
                                f"a run folder (its files are the record of the run): write the page elsewhere")
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise GageError(f"{option} {out}: cannot check it ({exc.strerror or exc})") from None
    if stat.S_ISREG(st.st_mode) and _is_page(target):
        return
    what = _kind(st.st_mode) if not stat.S_ISREG(st.st_mode) else "a file gage-eval did not write as a page"
    raise GageError(f"{option} {out}: it exists and is {what}; gage-eval replaces only a report or compare "
                    f"page it wrote: choose a new file name")


def _is_page(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            head = fh.read(_HEAD_BYTES)
    except OSError:
        return False
    return GENERATOR.encode() in head or bool(_OLD_PAGE.search(head))


# the pages of gage-eval versions before the generator mark: their title
_OLD_PAGE = re.compile(rb"<head>\s*<meta charset=\"utf-8\">[^<]*(?:<meta [^>]*>\s*)*<title>gage-eval (?:report|compare): ")


def write_page(out: Path, chunks: Iterable[str], make_folder: bool = True) -> None:
    """The page written whole or not at all: a new temporary file beside ``out``, renamed over it
    (its folder made first when ``make_folder``)."""
    import secrets

    from gage_eval.api.errors import OutputError

    tmp = out.with_name(f".{out.name}.{secrets.token_hex(6)}.tmp")
    try:
        if make_folder:
            out.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    except OSError as exc:
        raise OutputError(f"{out}: cannot write the page ({exc.strerror or exc})") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            for chunk in chunks:
                fh.write(chunk)
        os.replace(tmp, out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OutputError(f"{out}: cannot write the page ({exc.strerror or exc})") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
