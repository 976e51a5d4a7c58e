"""A YAML document read with the line of every key and item, for messages that name them.

``load(path)`` returns ``(data, lines)``: ``data`` is what ``yaml.safe_load`` gives, ``lines``
maps a key path (a tuple of keys and list indexes, ``("datasets", 0, "params", "path")``) to
its 1-based line. A syntax error, a duplicate key or a file that cannot be read is a
:class:`GageError` of one line, ``FILE:LINE: ...``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gage_eval.api import GageError

Lines = dict[tuple, int]
# as gage-eval's own YAML reading (gage_eval.api.yamlio): aliases that expand past this many values, or
# values nested deeper, are refused (a few lines of aliases otherwise expand to millions of paths)
MAX_VALUES = 100_000
MAX_DEPTH = 200


def load(path: Path) -> tuple[Any, Lines]:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise GageError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise GageError(f"{path}:{line}: not UTF-8 text (byte {raw[exc.start]:#04x})") from None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, {}
        lines: Lines = {}
        _walk(path, node, (), lines)
        data = loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 1
        what = " ".join(x for x in (exc.context, exc.problem) if x)
        raise GageError(f"{path}:{line}: YAML syntax error: {what}") from None
    except yaml.YAMLError as exc:
        raise GageError(f"{path}: YAML error: {str(exc).splitlines()[0]}") from None
    finally:
        loader.dispose()
    return data, lines


def _walk(path: Path, node: yaml.Node, where: tuple, lines: Lines) -> None:
    if len(lines) >= MAX_VALUES or len(where) > MAX_DEPTH:
        what = f"aliases expand to more than {MAX_VALUES} values" if len(lines) >= MAX_VALUES else \
            f"values nested more than {MAX_DEPTH} levels deep"
        raise GageError(f"{path}:{node.start_mark.line + 1}: {what}")
    lines[where] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else str(key_node.start_mark)
            line = key_node.start_mark.line + 1
            if key in seen:
                dotted = ".".join(str(p) for p in (*where, key))
                raise GageError(f"{path}:{line}: {dotted}: duplicate key (first at line {seen[key]})")
            seen[key] = line
            _walk(path, value_node, (*where, key), lines)
            lines[(*where, key)] = line  # a key's line, not its value's (a block value starts below)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _walk(path, item, (*where, i), lines)
