"""Strict reading of the JSON and YAML that users hand to gage-eval.

One reader for data rows (the jsonl loader and ``gage-eval validate`` both use
:func:`iter_json_rows`, so they agree on every row) and one for YAML (task files,
run configs, ``validate --schema task``). Strict means: UTF-8 only (a BOM is
accepted), no NaN or Infinity, no number too large for a float (``1e999``), no lone
surrogate escape (``"\\ud800"``: it could never be written out), no duplicate keys, nesting at most
:data:`MAX_DEPTH` levels, YAML aliases that expand to at most
:data:`MAX_YAML_NODES` nodes. A row's problem is returned as that row's error; a
problem with the whole file (gzip, UTF-16, unreadable) raises :class:`GageError`.
"""
from __future__ import annotations

import json
import re
import stat
from pathlib import Path
from typing import Any, Iterator

from gage_eval.api.errors import GageError

MAX_DEPTH = 200
MAX_YAML_NODES = 100_000
BOM = b"\xef\xbb\xbf"

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


class InputError(GageError):
    """A file that cannot be read: ``WHERE:LINE: problem`` (``WHERE: problem`` without a line)."""

    def __init__(self, where: str | Path, line: int | None, problem: str):
        super().__init__(f"{where}:{line}: {problem}" if line else f"{where}: {problem}")
        self.where = str(where)
        self.line = line
        self.problem = problem


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


def _too_deep_at(text: str, start: int = 0, limit: int = MAX_DEPTH) -> int | None:
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
    checks the depth (:func:`_too_deep_at`). Raises :class:`JsonProblem` whose message reads
    like ``NaN is not allowed`` and whose ``pos`` locates it.
    """
    if maybe_deep is None:
        maybe_deep = text.count("[", start) + text.count("{", start) > MAX_DEPTH
    if whole and maybe_deep:
        deep = _too_deep_at(text, start)
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
        raise JsonProblem(f"nested deeper than {MAX_DEPTH} levels", _too_deep_at(text, start), field=True) from None
    except JsonProblem:
        raise
    except ValueError:  # int() refuses more digits than sys.get_int_max_str_digits()
        long = _LONG_INT.search(text, start)
        raise JsonProblem("number out of range: an integer of more than 4300 digits",
                          long.start() if long else None, field=True) from None
    if whole and text[end:].strip():
        raise JsonProblem("extra data after the JSON value", end + len(text[end:]) - len(text[end:].lstrip()))
    if _SURROGATE_ESCAPE.search(text, start, end):
        char = _lone_surrogate(value)
        if char is not None:
            raise JsonProblem(f"lone surrogate \\u{ord(char):04x}: half of a UTF-16 pair, "
                              f"it cannot be written as UTF-8", _surrogate_escape_at(text, start, end), field=True)
    return value, end


def _column(text: str, pos: int | None) -> str:
    if pos is None:
        return ""
    return f" (column {pos - text.rfind(chr(10), 0, pos)})"


def _path_at(text: str, start: int, pos: int | None) -> str:
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
    return RowProblem(_path_at(text, 0, problem.pos) if problem.field else "$",
                      f"invalid JSON: {problem.message}{_column(text, problem.pos)}")


def _not_utf8_row(raw: bytes, exc: UnicodeDecodeError) -> RowProblem:
    head = raw[:exc.start].decode("utf-8", "replace")
    return RowProblem(_path_at(head, 0, len(head)), _not_utf8(exc))


def file_problem(head: bytes, kind: str) -> str | None:
    """Why a file cannot be read as UTF-8 text at all, judged from its first bytes; None if it can."""
    if head[:2] == b"\x1f\x8b":
        return "is gzip-compressed; decompress it first (gunzip)"
    if head[:2] in (b"\xff\xfe", b"\xfe\xff") or b"\x00" in head[:2]:
        return f"looks like UTF-16 text; gage-eval reads UTF-8 {kind}: convert it with iconv -f UTF-16 -t UTF-8"
    return None


SPECIAL_FILES = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
                 stat.S_IFSOCK: "a socket"}


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


def _not_utf8(exc: UnicodeDecodeError) -> str:
    return f"not UTF-8 text: {exc.reason} (byte {exc.start + 1}: 0x{exc.object[exc.start]:02x})"


def _decode_file(path: Path, data: bytes) -> str:
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
        for lineno, raw in enumerate(fh, 1):
            if lineno == 1 and raw.startswith(BOM):
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


def _json_document_rows(path: Path) -> Iterator[tuple[int, Any, str | None]]:
    try:
        text = _decode_file(path, path.read_bytes())
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
        deep = _too_deep_at(text, start) if text.count("[") + text.count("{") > MAX_DEPTH else None
        if deep is not None:
            yield line, None, _doc_error(text, JsonProblem(f"nested deeper than {MAX_DEPTH} levels", deep, True),
                                         start)
            return
        yield line, value, None
        return
    deep = _too_deep_at(text, start, MAX_DEPTH + 1) if text.count("[") + text.count("{") > MAX_DEPTH else None
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
    where = _path_at(text, start, exc.pos) if exc.field else "$"
    if exc.pos is None:
        return RowProblem(where, f"invalid JSON: {exc.message}{suffix}")
    line = text.count("\n", 0, exc.pos) + 1
    return RowProblem(where, f"invalid JSON: {exc.message} (line {line}{_column(text, exc.pos).replace(' (', ', ')}"
                             f"{suffix}")


# ---------------------------------------------------------------------------
# YAML
# ---------------------------------------------------------------------------

def _strict_loader():
    import yaml
    from yaml.constructor import ConstructorError
    from yaml.nodes import MappingNode, SequenceNode

    class StrictYamlError(ConstructorError):
        pass

    class StrictLoader(yaml.SafeLoader):
        """SafeLoader that refuses duplicate keys and alias bombs."""

        def construct_document(self, node):
            _check_graph(node, StrictYamlError, MappingNode, SequenceNode)
            return super().construct_document(node)

        def construct_mapping(self, node, deep=False):
            if isinstance(node, MappingNode):
                seen: dict = {}
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        continue  # keys brought in by << may be overridden: that is what merging is for
                    key = self.construct_object(key_node, deep=True)
                    try:
                        first = seen.setdefault(key, key_node)
                    except TypeError:  # an unhashable key: the base class says so
                        continue
                    if first is not key_node:
                        raise StrictYamlError(None, None, f"duplicate key {key!r} (first at line "
                                              f"{first.start_mark.line + 1})", key_node.start_mark)
            return super().construct_mapping(node, deep=deep)

    return StrictLoader, StrictYamlError


def _check_graph(root, error, mapping_node, sequence_node) -> None:
    """Refuse a YAML document whose aliases expand past MAX_YAML_NODES nodes, nest deeper than
    MAX_DEPTH, or refer to themselves. Linear in the distinct nodes."""
    def children(node):
        if isinstance(node, mapping_node):
            return [n for pair in node.value for n in pair]
        if isinstance(node, sequence_node):
            return list(node.value)
        return []

    done: dict[int, tuple[int, int]] = {}
    open_: set[int] = set()
    stack = [(root, False)]
    while stack:
        node, closing = stack.pop()
        nid = id(node)
        if closing:
            open_.discard(nid)
            kids = [done[id(c)] for c in children(node)]
            size = 1 + sum(k[0] for k in kids)
            depth = 1 + max((k[1] for k in kids), default=0)
            if size > MAX_YAML_NODES:
                raise error(None, None, f"aliases expand to more than {MAX_YAML_NODES} values", node.start_mark)
            if depth > MAX_DEPTH:
                raise error(None, None, f"values nested more than {MAX_DEPTH} levels deep", node.start_mark)
            done[nid] = (size, depth)
            continue
        if nid in done:
            continue
        if nid in open_:
            raise error(None, None, "an alias refers to the value that contains it", node.start_mark)
        open_.add(nid)
        stack.append((node, True))
        stack.extend((c, False) for c in children(node) if id(c) not in done)


_LOADER = None


def loads_yaml(text: str, where: str) -> Any:
    """Strict YAML from ``text``; a problem raises :class:`InputError` (``WHERE:LINE: problem``)."""
    import yaml

    global _LOADER
    if _LOADER is None:
        _LOADER = _strict_loader()
    loader_cls, strict_error = _LOADER
    try:
        return yaml.load(text, Loader=loader_cls)  # noqa: S506 (a SafeLoader subclass)
    except strict_error as exc:
        raise InputError(where, _line(exc), exc.problem) from None
    except yaml.YAMLError as exc:
        raise InputError(where, _line(exc), f"invalid YAML: {getattr(exc, 'problem', None) or exc}") from None
    except RecursionError:
        raise InputError(where, None, f"invalid YAML: nested deeper than {MAX_DEPTH} levels") from None


def _line(exc) -> int | None:
    mark = getattr(exc, "problem_mark", None)
    return mark.line + 1 if mark is not None else None


def read_yaml(path: Path) -> Any:
    """A YAML file read strictly (see :func:`loads_yaml`); every problem an :class:`InputError`."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(path, None, f"cannot read: {exc.strerror or exc}") from None
    problem = file_problem(data[:4], "YAML")
    if problem:
        raise InputError(path, None, problem)
    return loads_yaml(_decode_file(path, data), str(path))
