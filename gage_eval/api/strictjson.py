"""Strict JSON values: one value decoded strictly, and its problem located by field.

Strict means: no NaN or Infinity, no number too large for a float (``1e999``), no lone
surrogate escape (``"\\ud800"``: it could never be written out), no duplicate keys, nesting at
most :data:`MAX_DEPTH` levels. :func:`decode` raises :class:`JsonProblem` with the offset of
what it refused; :func:`row_error` turns that into a row's error naming the field
(:class:`RowProblem`, ``label: NaN is not allowed``). Files are read by
:mod:`gage_eval.api.jsonio`, YAML by :mod:`gage_eval.api.yamlio`.
"""
from __future__ import annotations

import json
import re
from typing import Any, Mapping

from gage_eval.api.errors import GageError

MAX_DEPTH = 200

# A JSON string (escapes included) or one bracket: enough to measure nesting outside strings.
_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')
# ... and the punctuation that says which field comes next; a string cut short at the end counts
_PATH_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*(?:"|$)|[\[\]{},:]')
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_CONSTANT = re.compile(r"-?Infinity|NaN")
_LONG_INT = re.compile(r"(?<![\d.])-?\d{4301,}")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?[eE][-+]?\d+|-?\d+\.\d+")
# A \uD800-\uDFFF escape; only a line holding one can decode to a lone surrogate.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_SURROGATE = re.compile("[\ud800-\udfff]")


class JsonProblem(ValueError):
    """A value that strict JSON refuses; ``pos`` is its offset in the text when known, and with
    ``field`` it is a value's (a NaN, a number out of range, a bracket too deep) whose field a
    message names, rather than the syntax's."""

    def __init__(self, message: str, pos: int | None = None, field: bool = False):
        super().__init__(message)
        self.message = message
        self.pos = pos
        self.field = field


class RowProblem(str):
    """A row's error as a run shows it (``label: NaN is not allowed``), keeping its field
    (``where``: ``$.label``, or ``$`` for the row as a whole) and the message without it
    (``problem``), for ``validate``'s ``file:line: $.label: message``."""

    where: str
    problem: str

    def __new__(cls, where: str, problem: str) -> "RowProblem":
        field = where[2:] if where.startswith("$.") else where[1:]
        self = super().__new__(cls, f"{field}: {problem}" if field else problem)
        self.where, self.problem = where, problem
        return self


class _ConstantProblem(JsonProblem):
    def __init__(self, message: str):
        super().__init__(message, field=True)


def _refuse_constant(name: str) -> Any:
    raise _ConstantProblem(f"{name} is not allowed")


class _RangeProblem(JsonProblem):
    def __init__(self, message: str):
        super().__init__(message, field=True)


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (_INF, -_INF):
        raise _RangeProblem(f"number out of range: {text[:40]}")
    return value


_INF = float("inf")


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise JsonProblem(f"duplicate key {key!r} in an object")
            seen.add(key)
    return out


_DECODER = json.JSONDecoder(object_pairs_hook=_unique_pairs, parse_constant=_refuse_constant,
                            parse_float=_finite_float)
_SCAN = _DECODER.scan_once


def too_deep_at(text: str, start: int = 0, limit: int = MAX_DEPTH) -> int | None:
    """Offset of the first bracket that opens level ``limit + 1``, or None. Strings are skipped."""
    depth = 0
    for m in _TOKEN.finditer(text, start):
        c = m.group()
        if c in "[{":
            depth += 1
            if depth > limit:
                return m.start()
        elif c in "]}":
            depth -= 1
    return None


def _constant_at(text: str, start: int, pattern: re.Pattern = _CONSTANT) -> int | None:
    blanked = _STRING.sub(lambda m: " " * len(m.group()), text[start:])
    for m in pattern.finditer(blanked):
        if pattern is not _NUMBER or abs(float(m.group())) == _INF:
            return start + m.start()
    return None


def json_type(value: Any) -> str:
    """A JSON value's type as every message names it: ``a string``, ``a list``, ``null`` ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def shown(value: Any, limit: int = 60) -> str:
    """A value as JSON for a message (``null``, ``true``, ``{"a": 1}``), cut to ``limit`` characters."""
    try:
        text = json.dumps(value[:limit] if isinstance(value, str) else value, ensure_ascii=False, default=repr)
    except (ValueError, RecursionError):
        text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def expect_type(where: str, key: str, value: Any, types: tuple, what: str) -> None:
    """A GageError naming ``where`` and ``key`` unless ``value`` is one of ``types`` (a boolean only
    where ``bool`` is listed); ``what`` says what was expected (``an object or null``)."""
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        raise GageError(f"{where}: key {key!r}: expected {what}, got {json_type(value)}")


def expect_fields(where: str, prefix: str, obj: Mapping[str, Any], spec: Mapping[str, tuple[tuple, str]]) -> None:
    """:func:`expect_type` for each key of ``spec`` that ``obj`` holds: ``{key: (types, what)}``."""
    for key, (types, what) in spec.items():  # (the key's name is spelled only for a message)
        if key in obj:
            value = obj[key]
            if not isinstance(value, types) or (value.__class__ is bool and bool not in types):
                expect_type(where, prefix + key, value, types, what)


def _lone_surrogate(value: Any) -> str | None:
    """The first lone surrogate in a decoded value's strings (keys included), or None."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            m = _SURROGATE.search(v)
            if m:
                return m.group()
        elif isinstance(v, dict):
            stack.extend(v)
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return None


def _surrogate_escape_at(text: str, start: int, end: int) -> int | None:
    """Offset of the first surrogate escape that is not half of a pair (escaped backslashes skipped)."""
    skip = -1
    for m in _SURROGATE_ESCAPE.finditer(text, start, end):
        slashes, i = 0, m.start() - 1
        while i >= start and text[i] == "\\":
            slashes, i = slashes + 1, i - 1
        if slashes % 2 or m.start() == skip:
            continue
        if m.group()[3].lower() in "89ab" and text[m.end():m.end() + 3].lower() == "\\ud" and \
                text[m.end() + 3:m.end() + 4].lower() in ("c", "d", "e", "f"):
            skip = m.end()
            continue
        return m.start()
    return None


def decode(text: str, start: int = 0, *, whole: bool = True, maybe_deep: bool | None = None) -> tuple[Any, int]:
    """One strict JSON value from ``text[start:]``: (value, end offset).

    With ``whole`` only whitespace may follow and the depth is checked here (``maybe_deep``
    False: the caller counted too few brackets for it to matter); without it the caller
    checks the depth (:func:`too_deep_at`). Raises :class:`JsonProblem` whose message reads
    like ``NaN is not allowed`` and whose ``pos`` locates it.
    """
    if maybe_deep is None:
        maybe_deep = text.count("[", start) + text.count("{", start) > MAX_DEPTH
    if whole and maybe_deep:
        deep = too_deep_at(text, start)
        if deep is not None:
            raise JsonProblem(f"nested deeper than {MAX_DEPTH} levels", deep, field=True)
    try:
        value, end = _SCAN(text, start)  # JSONDecoder.raw_decode without its Python frame (a per-row path)
    except StopIteration as err:  # what raw_decode reports as JSONDecodeError("Expecting value")
        raise JsonProblem("Expecting value", err.value) from None
    except json.JSONDecodeError as exc:
        raise JsonProblem(exc.msg, exc.pos) from None
    except _ConstantProblem as exc:
        exc.pos = _constant_at(text, start)
        raise
    except _RangeProblem as exc:
        exc.pos = _constant_at(text, start, _NUMBER)
        raise
    except RecursionError:
        raise JsonProblem(f"nested deeper than {MAX_DEPTH} levels", too_deep_at(text, start), field=True) from None
    except JsonProblem:
        raise
    except ValueError:  # int() refuses more digits than sys.get_int_max_str_digits()
        long = _LONG_INT.search(text, start)
        raise JsonProblem("number out of range: an integer of more than 4300 digits",
                          long.start() if long else None, field=True) from None
    if whole and text[end:].strip():
        pos = end + len(text[end:]) - len(text[end:].lstrip())
        old_mac = "\r" in text[end:pos] and "\n" not in text[end:pos]  # lines ending in a carriage return alone
        raise JsonProblem("extra data after the JSON value" + (" past a carriage return: the file's lines end in "
                          "CR alone (old Mac style); convert them to LF (tr '\\r' '\\n')" if old_mac else ""), pos)
    if _SURROGATE_ESCAPE.search(text, start, end):
        char = _lone_surrogate(value)
        if char is not None:
            raise JsonProblem(f"lone surrogate \\u{ord(char):04x}: half of a UTF-16 pair, "
                              f"it cannot be written as UTF-8", _surrogate_escape_at(text, start, end), field=True)
    return value, end


def column(text: str, pos: int | None) -> str:
    if pos is None:
        return ""
    return f" (column {pos - text.rfind(chr(10), 0, pos)})"


def path_at(text: str, start: int, pos: int | None) -> str:
    """The JSON path (``$.a[2].b``) of the value at offset ``pos`` of the value that starts at
    ``start``, read only as far as ``pos`` (the text may be broken there); ``$`` when ``pos`` is
    None or in no field. Past four steps the path ends in ``...`` (a bracket 200 levels deep)."""
    if pos is None:
        return "$"
    steps: list[list] = []  # per open container: ["{", key or None] or ["[", index]
    last = ""
    for m in _PATH_TOKEN.finditer(text, start, pos):
        c = m.group()
        if c[0] == '"':
            last = c
        elif c in "[{":
            steps.append([c, 0 if c == "[" else None])
        elif c in "]}":
            steps = steps[:-1]
        elif steps and c == ":" and steps[-1][0] == "{":
            try:
                steps[-1][1] = json.loads(last)
            except ValueError:
                steps[-1][1] = last.strip('"')
        elif steps and c == ",":
            steps[-1][1] = steps[-1][1] + 1 if steps[-1][0] == "[" else None
    path = "$"
    for i, (kind, at) in enumerate(steps):
        if at is None:
            break
        if i == 4:
            return path + "..."
        path += f"[{at}]" if kind == "[" else f".{at}" if _NAME.fullmatch(at) else f"[{json.dumps(at)}]"
    return path


def row_error(text: str, problem: JsonProblem) -> RowProblem:
    """A line's JSON problem, naming the field of a refused value (``$.label``) and its column."""
    return RowProblem(path_at(text, 0, problem.pos) if problem.field else "$",
                      f"invalid JSON: {problem.message}{column(text, problem.pos)}")
