"""Strict YAML: task files, run configs, ``validate --schema task``.

A SafeLoader that refuses duplicate keys, aliases that expand past :data:`MAX_YAML_NODES`
values or refer to themselves, nesting deeper than :data:`MAX_DEPTH` and files over
:data:`MAX_YAML_BYTES` (``/dev/zero`` never ends); a file that is not UTF-8 text (gzip, UTF-16)
is refused as a data file is. Every problem is an :class:`~gage_eval.api.errors.InputError`
(``WHERE:LINE: problem``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from gage_eval.api.errors import InputError
from gage_eval.api.jsonio import decode_file, file_problem
from gage_eval.api.strictjson import MAX_DEPTH

MAX_YAML_NODES = 100_000
MAX_YAML_BYTES = 16 << 20  # a task file or run config is a few kB


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
    except yaml.reader.ReaderError as exc:  # a str's character YAML refuses: its index and code point, no line
        raise InputError(where, text.count("\n", 0, exc.position) + 1, _not_allowed(exc.character)) from None
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
        with path.open("rb") as fh:
            data = fh.read(MAX_YAML_BYTES + 1)
    except OSError as exc:
        raise InputError(path, None, f"cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_YAML_BYTES:
        raise InputError(path, None, f"larger than {MAX_YAML_BYTES >> 20} MiB: not a task file or run config")
    problem = file_problem(data[:4], "YAML")
    if problem:
        raise InputError(path, None, problem)
    return loads_yaml(decode_file(path, data), str(path))


def key_line(path: Path, key: str) -> int | None:
    """The line of ``key`` (a dotted path, ``request.kind``, ``metrics.1``) in the YAML file
    ``path``, or of the deepest part of it that is there; None when the file cannot be read."""
    import yaml

    try:
        node = yaml.compose(decode_file(Path(path), Path(path).read_bytes()), Loader=yaml.SafeLoader)
    except (OSError, InputError, yaml.YAMLError, RecursionError):
        return None
    line = node.start_mark.line + 1 if node is not None else None
    for part in key.split(".") if key else ():
        if isinstance(node, yaml.MappingNode):
            found = [(k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == part]
            if not found:
                break
            line, node = found[0][0].start_mark.line + 1, found[0][1]
        elif isinstance(node, yaml.SequenceNode) and part.isdigit() and int(part) < len(node.value):
            node = node.value[int(part)]
            line = node.start_mark.line + 1
        else:
            break
    return line


def _not_allowed(code: int) -> str:
    """A character YAML does not allow (NUL, a control character), named by its code point."""
    import unicodedata

    kind = "a control character" if unicodedata.category(chr(code)) == "Cc" else "not printable"
    return f"invalid YAML: character U+{code:04X} ({kind}) is not allowed"
