"""Append-only JSONL files: one strict JSON value a line (NaN and infinities as null), written
whole and flushed, so a kill loses at most the line being written; a half-written last line is
cut before a file is appended to again. The run folder's samples/, instances/ and events.jsonl
are such files (:meth:`gage_eval.api.runfolder.RunFolder.jsonl_appender` opens one for a plugin)."""
from __future__ import annotations

import errno
import json
import math
import os
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from gage_eval.api.errors import OutputError

try:  # a fast encoder when installed (a core dependency; the standard library otherwise)
    import orjson as _orjson
except ImportError:  # pragma: no cover - exercised by the fallback test
    _orjson = None

# orjson writes only what the standard library writes the same way: datetimes, dataclasses and
# subclasses of str/int/dict/list go to _refuse (then json writes them, str() as before), a
# non-str key, an int past 64 bits or a lone surrogate make it raise, and so the line is
# written by json. NaN and infinities come out as null, as finite() makes them below.
_ORJSON_OPTS = ((_orjson.OPT_PASSTHROUGH_DATETIME | _orjson.OPT_PASSTHROUGH_DATACLASS |
                 _orjson.OPT_PASSTHROUGH_SUBCLASS) if _orjson is not None else 0)


def finite(obj: Any) -> Any:
    """``obj`` with every NaN or infinite float replaced by None (containers copied, others as they are)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def _refuse(obj: Any) -> Any:
    raise TypeError


def dumps(obj: Any, **kwargs: Any) -> str:
    """Strict JSON: a NaN or infinite number (a -inf log-likelihood, a metric's nan) is written as null.

    Without ``kwargs`` orjson writes it when it can (compact, UTF-8 as is, the same parsed
    value as the standard library's); whatever it cannot write exactly goes to ``json``."""
    if _orjson is not None and not kwargs:
        try:
            return _orjson.dumps(obj, default=_refuse, option=_ORJSON_OPTS).decode("utf-8")
        except TypeError:  # orjson.JSONEncodeError is a TypeError
            pass
    opts = {"ensure_ascii": False, "separators": (",", ":"), "default": str, "allow_nan": False, **kwargs}
    try:
        return json.dumps(obj, **opts)
    except ValueError:  # rare: only then walk the value
        return json.dumps(finite(obj), **opts)


def dumps_line(obj: Any) -> bytes:
    """:func:`dumps` as one UTF-8 line, newline included (what the jsonl files hold). Text that
    UTF-8 cannot carry (a lone surrogate a backend returned) is written as a ``\\u`` escape."""
    if _orjson is not None:
        try:
            return _orjson.dumps(obj, default=_refuse, option=_ORJSON_OPTS | _orjson.OPT_APPEND_NEWLINE)
        except TypeError:
            pass
    try:
        return (dumps(obj) + "\n").encode("utf-8")
    except UnicodeEncodeError:
        return (dumps(obj, ensure_ascii=True) + "\n").encode("ascii")


_DIGITS = bytes(48 if 48 <= b <= 57 else 32 for b in range(256))  # each digit as 0, the rest as space
_LONG_DIGITS = b"0" * 19


def loads_line(raw: bytes) -> Any:
    """One line of a jsonl file read back, as ``json.loads(raw)`` reads it (value and error alike).

    orjson reads it when it can (about half the time): it refuses what only ``json`` takes (NaN,
    infinities, a lone surrogate, a byte-order mark, bytes that are not UTF-8), which then goes to
    ``json``, and a line with a run of 19 digits goes there first, as orjson reads an integer past
    64 bits as a float."""
    if _orjson is not None and _LONG_DIGITS not in raw.translate(_DIGITS):
        try:
            return _orjson.loads(raw)
        except ValueError:  # orjson.JSONDecodeError: json gives the value or the error
            pass
    return json.loads(raw)


def truncate_partial_line(path: Path) -> int:
    """Cut a half-written last line (a kill mid-write); return the bytes removed."""
    if not path.exists():
        return 0
    size = path.stat().st_size
    if size == 0:
        return 0
    with path.open("rb+") as fh:
        fh.seek(max(0, size - 1))
        if fh.read(1) == b"\n":
            return 0
        # walk back to the last newline
        pos = size
        chunk = 65536
        while pos > 0:
            start = max(0, pos - chunk)
            fh.seek(start)
            data = fh.read(pos - start)
            idx = data.rfind(b"\n")
            if idx >= 0:
                cut = start + idx + 1
                fh.truncate(cut)
                return size - cut
            pos = start
        fh.truncate(0)
        return size


class JsonlAppender:
    """An append-only jsonl file, flushed after every line so a kill loses at most one line.
    ``error(path, exc)``: the :class:`OutputError` a failed open, write or close raises (the run
    folder's says how to go on)."""

    def __init__(self, path: Path, *, error: Callable[[Path, OSError], OutputError]):
        self.path = path
        self._error = error
        self._failed = False  # a write failed: that error is the one reported, not close()'s
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = path.open("ab")
        except OSError as exc:
            raise error(path, exc) from None

    def write(self, obj: Any) -> None:
        try:
            self._fh.write(dumps_line(obj))
            self._fh.flush()
        except OSError as exc:
            self._failed = True
            raise self._error(self.path, exc) from None

    def close(self) -> None:
        try:  # a file removed while it was written (rm -r of the run folder) held its lines for no one
            removed = not self._fh.closed and os.fstat(self._fh.fileno()).st_nlink == 0
            self._fh.close()
            if removed:
                raise FileNotFoundError(errno.ENOENT, "removed while the run wrote it")
        except OSError as exc:
            if not self._failed:
                raise self._error(self.path, exc) from None


class EventAppender(JsonlAppender):
    """An append-only jsonl file of events (the run folder's events.jsonl): each line the time,
    the run's id, the event's name and its fields."""

    def __init__(self, path: Path, run_id: str, *, error: Callable[[Path, OSError], OutputError]):
        super().__init__(path, error=error)
        self.run_id = run_id

    def emit(self, event: str, **fields: Any) -> None:
        self.write({"ts": round(time.time(), 6), "run_id": self.run_id, "event": event, **fields})


class TaskFiles:
    """One append-only jsonl file per task, ``<task>.jsonl`` in ``folder`` (:meth:`file`), each opened
    at its task's first line (``error`` as :class:`JsonlAppender`'s), so a task that writes none
    leaves no file; ``close(task)`` closes one, ``close()`` every one still open."""

    def __init__(self, folder: Path, *, error: Callable[[Path, OSError], OutputError]):
        self.folder, self._error = folder, error
        self._files: dict[str, JsonlAppender] = {}

    @staticmethod
    def file(folder: Path, task: str) -> Path:
        """Where a task's file lies in ``folder`` (the run folder's samples/ and instances/ name theirs so)."""
        return folder / f"{task}.jsonl"

    def write(self, task: str, obj: Any) -> None:
        out = self._files.get(task)
        if out is None:
            out = self._files[task] = JsonlAppender(self.file(self.folder, task), error=self._error)
        out.write(obj)

    def close(self, task: str | None = None) -> None:
        for name in [task] if task is not None else list(self._files):
            out = self._files.pop(name, None)
            if out is not None:
                out.close()
