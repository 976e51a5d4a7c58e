"""Strict reading of the data files users hand to gage-eval: their rows, one reader for all.

The jsonl loader and ``gage-eval validate`` both read rows with :func:`iter_json_rows`, so they
agree on every row: UTF-8 only (a BOM is accepted), each value decoded strictly
(:mod:`gage_eval.api.strictjson`). A row's problem is returned as that row's error; a problem
with the whole file (gzip, UTF-16, unreadable, a FIFO) raises :class:`InputError`.
"""
from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any, Iterator

from gage_eval.api.errors import InputError
from gage_eval.api.strictjson import (MAX_DEPTH, JsonProblem, RowProblem, column, decode, json_type, path_at,
                                      row_error, shown, too_deep_at)

__all__ = ["check_data_file", "file_kind", "iter_json_rows", "json_type", "loads", "shown"]  # what the namespace jsonio offers plugins

BOM = b"\xef\xbb\xbf"
# one line of a .jsonl: more than a prompt can hold (a template's output stops at 4,000,000
# characters), and small enough that a row's record, which keeps its text (some of it twice),
# stays within the 64 MiB a run folder's sample line may have; a longer line is its row's error
MAX_ROW_BYTES = 16 << 20


def loads(text: str | bytes) -> Any:
    """``json.loads`` whose every failure is a ValueError: text that is not JSON, and JSON nested
    deeper than Python's decoder can follow (a model's or a server's ``[[[[...``, which would be a
    RecursionError out of the caller). As lenient as ``json.loads`` (NaN, duplicate keys): for
    replies and tool calls; a data file's rows are read strictly (:func:`iter_json_rows`)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply to read") from None


_PACKED = {b"\x1f\x8b": "is gzip-compressed; decompress it first (gunzip)",
           b"\x28\xb5\x2f\xfd": "is zstd-compressed; decompress it first (unzstd)",
           b"\xfd7zX": "is xz-compressed; decompress it first (unxz)",
           b"PK\x03\x04": "is a zip archive; unpack it first (unzip)"}


def file_problem(head: bytes, kind: str) -> str | None:
    """Why a file cannot be read as UTF-8 text at all, judged from its first 4 bytes; None if it can."""
    for magic, problem in _PACKED.items():
        if head.startswith(magic):
            return problem
    # (without a byte-order mark, an ASCII character is one byte of 4 and three NULs)
    utf32 = head in (b"\xff\xfe\0\0", b"\0\0\xfe\xff") or \
        len(head) == 4 and (head[:3] == b"\0\0\0") != (head[1:] == b"\0\0\0")
    if head[:2] == b"\0\0" and not utf32:
        return "starts with NUL bytes, not text (a file zero-filled by a crash, or a binary one)"
    if utf32 or head[:2] in (b"\xff\xfe", b"\xfe\xff") or b"\0" in head[:2]:
        code = "UTF-32" if utf32 else "UTF-16"
        return f"looks like {code} text; gage-eval reads UTF-8 {kind}: convert it with iconv -f {code} -t UTF-8"
    return None


SPECIAL_FILES = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
                 stat.S_IFSOCK: "a socket"}
_KINDS = {**SPECIAL_FILES, stat.S_IFDIR: "a folder", stat.S_IFLNK: "a symlink"}


def file_kind(mode: int) -> str:
    """What a file's mode says it is, for a message (a FIFO, a folder, ...)."""
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def not_regular(path: Path) -> str | None:
    """Why ``path`` (links followed) is no file to read rows from, as ``not a regular file (a
    FIFO)``: opening a FIFO would wait for a writer, a device never ends. None for a regular
    file or a folder, and when it cannot be looked at (opening it says why)."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return f"not a regular file ({SPECIAL_FILES.get(stat.S_IFMT(mode), 'a special file')})"


def check_data_file(path: Path) -> None:
    """Raise :class:`GageError` when ``path`` is not a regular file, cannot be opened or is not
    UTF-8 text at all (gzip, UTF-16)."""
    special = not_regular(path)
    if special:
        raise InputError(path, None, special)
    try:
        with path.open("rb") as fh:
            head = fh.read(4)
    except OSError as exc:
        raise InputError(path, None, f"cannot read: {exc.strerror or exc}") from None
    problem = file_problem(head, "json" if path.suffix == ".json" else "jsonl")
    if problem:
        raise InputError(path, None, problem)


def _not_utf8_row(raw: bytes, exc: UnicodeDecodeError) -> RowProblem:
    head = raw[:exc.start].decode("utf-8", "replace")
    return RowProblem(path_at(head, 0, len(head)), _not_utf8(exc))



def _not_utf8(exc: UnicodeDecodeError) -> str:
    return f"not UTF-8 text: {exc.reason} (byte {exc.start + 1}: 0x{exc.object[exc.start]:02x})"


def decode_file(path: Path, data: bytes) -> str:
    if data.startswith(BOM):
        data = data[3:]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(path, data.count(b"\n", 0, exc.start) + 1, _not_utf8(exc)) from None


def iter_json_rows(path: Path) -> Iterator[tuple[int, Any, str | None]]:
    """Rows of a data file as (line, value, error): one value per line of a ``.jsonl``,
    the elements of a ``.json`` array (or the one value of a ``.json`` object; a ``.json``
    holding JSON lines is read as such). A row that cannot be read has ``value`` None and
    its error; blank lines are skipped; a file that is not UTF-8 text raises GageError.
    """
    check_data_file(path)
    if path.suffix == ".json":
        yield from _json_document_rows(path)
        return
    yield from _json_line_rows(path)


def _json_line_rows(path: Path) -> Iterator[tuple[int, Any, str | None]]:
    try:
        fh = path.open("rb")
    except OSError as exc:
        raise InputError(path, None, f"cannot read: {exc.strerror or exc}") from None
    with fh:
        for lineno, raw in enumerate(iter(lambda: fh.readline(MAX_ROW_BYTES + 1), b""), 1):
            if len(raw) > MAX_ROW_BYTES and not raw.endswith(b"\n"):
                yield lineno, None, _too_long(fh, len(raw))
                continue
            if raw.startswith(BOM):
                if lineno > 1:  # (only a file's first line may start with one)
                    yield lineno, None, "starts with a UTF-8 byte-order mark (files joined with cat?); remove it"
                    continue
                raw = raw[3:]
            if not raw.strip():
                continue
            try:
                text = raw.rstrip(b"\r\n").decode("utf-8")
            except UnicodeDecodeError as exc:
                yield lineno, None, _not_utf8_row(raw, exc)
                continue
            try:  # brackets counted in the bytes: much faster than in a str holding non-ASCII text
                yield lineno, decode(text, maybe_deep=raw.count(b"[") + raw.count(b"{") > MAX_DEPTH)[0], None
            except JsonProblem as exc:
                yield lineno, None, row_error(text, exc)


def _too_long(fh: Any, read: int) -> str:
    """Skip the rest of a line too long for a row (in blocks, never held whole) and say so."""
    while (block := fh.readline(1 << 20)) and not block.endswith(b"\n"):
        read += len(block)
    read += len(block)
    return (f"a line of {read} bytes, over the {MAX_ROW_BYTES >> 20} MiB a row may hold "
            f"(keep big media in files beside the data)")


def _json_document_rows(path: Path) -> Iterator[tuple[int, Any, str | None]]:
    try:
        text = decode_file(path, path.read_bytes())
    except OSError as exc:
        raise InputError(path, None, f"cannot read: {exc.strerror or exc}") from None
    start = len(text) - len(text.lstrip())
    if start == len(text):
        return
    line = text.count("\n", 0, start) + 1
    if text[start] != "[":
        try:
            value, end = decode(text, start, whole=False)
        except JsonProblem as exc:
            yield line, None, _doc_error(text, exc, start)
            return
        if text[end:].strip():  # JSON lines in a .json file (as Hugging Face writes them)
            yield from _json_line_rows(path)
            return
        deep = too_deep_at(text, start) if text.count("[") + text.count("{") > MAX_DEPTH else None
        if deep is not None:
            yield line, None, _doc_error(text, JsonProblem(f"nested deeper than {MAX_DEPTH} levels", deep, True),
                                         start)
            return
        yield line, value, None
        return
    deep = too_deep_at(text, start, MAX_DEPTH + 1) if text.count("[") + text.count("{") > MAX_DEPTH else None
    pos, last = start + 1, start
    while True:
        pos = _skip_space(text, pos)
        if pos < len(text) and text[pos] == "]":
            return
        line += text.count("\n", last, pos)
        last = pos
        try:
            value, end = decode(text, pos, whole=False)
        except JsonProblem as exc:
            yield line, None, _doc_error(text, exc, pos, "; the rest of the file was not read")
            return
        if deep is not None and pos <= deep < end:
            problem = JsonProblem(f"nested deeper than {MAX_DEPTH} levels", deep, field=True)
            yield line, None, _doc_error(text, problem, pos, "; the rest of the file was not read")
            return
        yield line, value, None
        pos = _skip_space(text, end)
        if pos < len(text) and text[pos] == ",":
            pos += 1
        elif pos >= len(text) or text[pos] != "]":
            line += text.count("\n", last, pos)
            last = pos
            yield line, None, ("invalid JSON: expected ',' or ']' after an array element; "
                               "the rest of the file was not read")
            return


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def _doc_error(text: str, exc: JsonProblem, start: int, suffix: str = "") -> RowProblem:
    """A .json document's problem in the element that starts at ``start``: its field, line and column."""
    where = path_at(text, start, exc.pos) if exc.field else "$"
    if exc.pos is None:
        return RowProblem(where, f"invalid JSON: {exc.message}{suffix}")
    line = text.count("\n", 0, exc.pos) + 1
    return RowProblem(where, f"invalid JSON: {exc.message} (line {line}{column(text, exc.pos).replace(' (', ', ')}"
                             f"{suffix}")
