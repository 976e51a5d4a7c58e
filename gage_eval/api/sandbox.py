"""The Jinja2 environment task templates run in: sandboxed, immutable, and bounded.

Templates format data; they cannot run code (Jinja2's ImmutableSandboxedEnvironment),
read other files (include, import and extends are refused when a template is loaded),
or build huge values: a string, list or number a template makes, a number handed to a
call or filter (a width, a count) and the rendered text are capped at :data:`MAX_SIZE`,
and ``range()`` at Jinja2's ``MAX_RANGE``. Going past a cap raises :class:`TemplateLimit`
before the value is built where it can be known in advance (``*``, ``+``, ``**``,
widths and counts, and the filters and methods that multiply text: ``join``, ``replace``,
``indent``, ``wordwrap``, ``translate``, ``expandtabs``), right after it otherwise (``~``,
a filter's or method's result). Lists are cheap (their items are capped); writing one out
is not, so a list, tuple or dict is weighed (:func:`_weight`) before it becomes text.
"""
from __future__ import annotations

import functools
import inspect
import re
from typing import Any

from jinja2 import StrictUndefined, UndefinedError, nodes
from jinja2.compiler import CodeGenerator
from jinja2.runtime import Macro, Undefined
from jinja2.sandbox import MAX_RANGE, ImmutableSandboxedEnvironment, safe_range
from jinja2.utils import missing

MAX_SIZE = 4_000_000  # characters of a string or the output, items of a list, a width or count; ~1M tokens
MAX_INT_BITS = 100_000
# textwrap breaks a long word by re-slicing its rest: about len(word)**2 / width character copies.
MAX_WRAP_WORK = 100_000_000_000  # about 2 s
MAX_WRAP_PIECES = 500_000  # textwrap takes about 2.5 us a piece of a broken word
_WRAP_WORD = r"[^\t\n\x0b\x0c\r ]{%d,}"  # a word to textwrap, longer than the width
_LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"  # str.splitlines splits at each
REFUSED_TAGS = (nodes.Include, nodes.Import, nodes.FromImport, nodes.Extends)

# A format field or %-conversion asking for a width or precision of seven digits or more.
_WIDE_FORMAT = re.compile(r"\{[^{}]*:[^{}]*\d{7}|%[-#0 +]*(?:\d{7}|\d*\.\d{7})")


class TemplateLimit(Exception):
    """A template went past one of the sandbox's resource limits."""


class UndefinedName(UndefinedError):
    """An undefined variable, or a key, item or attribute a value lacks, with what was looked up:
    ``obj`` is the value looked into (``jinja2.utils.missing`` for a variable), ``name`` the name."""

    def __init__(self, message: str, obj: Any = missing, name: Any = None):
        super().__init__(message)
        self.obj = obj
        self.name = name


class NamedUndefined(StrictUndefined):
    """StrictUndefined whose error keeps the value and name looked up, so the message can list
    what is there instead (:class:`gage_eval.api.templates.Template` words it)."""

    __slots__ = ()

    def __init__(self, hint: str | None = None, obj: Any = missing, name: Any = None, exc: Any = UndefinedError):
        if exc is UndefinedError and not hint:
            exc = functools.partial(UndefinedName, obj=obj, name=name)
        super().__init__(hint, obj, name, exc)


def _sized(value: Any, what: str) -> Any:
    if isinstance(value, (str, list, tuple)) and len(value) > MAX_SIZE:
        raise TemplateLimit(f"{what} would be longer than {MAX_SIZE} characters or items")
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > MAX_INT_BITS:
        raise TemplateLimit(f"{what} would be a number of more than {MAX_INT_BITS} bits")
    return value


def _weight(value: Any, budget: int = MAX_SIZE) -> int:
    """About how many characters ``str(value)`` has; counting stops once past ``budget``."""
    total, stack = 0, [value]
    while stack and total <= budget:
        v = stack.pop()
        if isinstance(v, str):
            total += len(v)
        elif isinstance(v, (list, tuple)):
            total += 2 + 2 * len(v)
            if set(map(type, v)) <= {str}:
                total += sum(map(len, v)) + 2 * len(v)
            else:
                stack.extend(v)
        elif isinstance(v, dict):
            total += 2 + 4 * len(v)
            stack.extend(v)
            stack.extend(v.values())
        elif isinstance(v, int):
            total += v.bit_length() // 3 + 1
        else:
            total += 16
    return total


def _check_weight(values: Any, what: str) -> None:
    for value in values:
        if isinstance(value, (list, tuple, dict)) and _weight(value) > MAX_SIZE:
            raise TemplateLimit(f"{what}: a value of more than {MAX_SIZE} characters when written out")


def _too_long(size: int, what: str) -> None:
    if size > MAX_SIZE:
        raise TemplateLimit(f"{what} would be longer than {MAX_SIZE} characters")


def _materialized(items: Any) -> Any:
    return items if isinstance(items, (str, list, tuple, dict, Undefined)) else list(items)


def _join_size(items: Any, sep: Any) -> int:
    if isinstance(items, (list, tuple)):
        sep_len = len(sep) if isinstance(sep, str) else _weight(sep)
        if set(map(type, items)) <= {str}:
            return sum(map(len, items)) + sep_len * max(len(items) - 1, 0)
        return _weight(items) - 2 + (sep_len - 2) * max(len(items) - 1, 0)
    return _weight(items)


def _replace_size(s: Any, old: Any, new: Any, count: Any = -1) -> int:
    if not (isinstance(s, str) and isinstance(old, str) and isinstance(new, str)):
        return 0
    n = s.count(old) if old else len(s) + 1
    if isinstance(count, int) and count >= 0:
        n = min(n, count)
    return len(s) + n * (len(new) - len(old))


def _lines(s: str) -> int:
    return 1 + sum(s.count(c) for c in _LINE_BREAKS)


def _indent_size(a: dict) -> int:
    s, width = a["s"], a["width"]
    indent = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
    return len(s) + _lines(s) * indent if isinstance(s, str) and indent > 0 else 0


def _wordwrap_size(a: dict) -> int:
    s, width, wrap = a["s"], a["width"], a["wrapstring"]
    if not isinstance(s, str) or not isinstance(width, int) or width < 1:
        return 0
    wrap_len = len(wrap) if isinstance(wrap, str) else 1
    pieces = 0
    if a["break_long_words"]:
        words = [m.end() - m.start() for m in re.finditer(_WRAP_WORD % (width + 1), s)]
        pieces = sum(n // width for n in words)
        if pieces > MAX_WRAP_PIECES or sum(n * n for n in words) // width > MAX_WRAP_WORK:
            raise TemplateLimit(f"filter 'wordwrap': breaking words of up to {max(words)} characters at width "
                                f"{width} would take too long; wrap at a larger width")
    return len(s) + pieces * wrap_len + (2 * len(s) // width + _lines(s)) * (wrap_len - 1)


def _join_filter(a: dict) -> int:
    a["value"] = _materialized(a["value"])
    return _join_size(a["value"], a["d"])


# Filters whose result can be far larger than their arguments: the result's size, estimated from them.
_FILTER_SIZES = {
    "join": _join_filter,
    "replace": lambda a: _replace_size(a["s"], a["old"], a["new"], a["count"]),
    "indent": _indent_size,
    "wordwrap": _wordwrap_size,
}
# Filters that write their value (and arguments) out as text.
_WRITERS = frozenset({"string", "pprint", "tojson", "format", "upper", "lower", "capitalize", "title", "trim",
                      "center", "truncate", "striptags", "escape", "e", "forceescape", "urlencode", "urlize",
                      "wordcount", "indent", "wordwrap", "replace", "safe", "xmlattr"})


def _str_method_args(text: str, name: str, args: tuple, kwargs: dict) -> tuple:
    """A str method's arguments, checked (and an iterator joined made a list) before the call."""
    what = f"{name}()"
    if name == "join" and args:
        args = (_materialized(args[0]), *args[1:])
        _too_long(_join_size(args[0], text), f"the result of {what}")
    elif name == "replace" and len(args) >= 2:
        _too_long(_replace_size(text, *args[:3], *kwargs.values()), f"the result of {what}")
    elif name == "expandtabs":
        size = (args or tuple(kwargs.values()) or (8,))[0]
        if isinstance(size, int):
            _too_long(len(text) + text.count("\t") * size, f"the result of {what}")
    elif name == "translate" and args and isinstance(args[0], dict):
        grow = sum(text.count(chr(k)) * (len(v) - 1) for k, v in args[0].items()
                   if isinstance(k, int) and 0 <= k < 0x110000 and isinstance(v, str) and len(v) > 1)
        _too_long(len(text) + grow, f"the result of {what}")
    elif name in ("format", "format_map"):
        _check_weight((*args, *kwargs.values()), what)
    return args


def _check_numbers(args: tuple, kwargs: dict, what: str) -> None:
    for value in (*args, *kwargs.values()):
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_SIZE:
            raise TemplateLimit(f"{what} got the number {value}, larger than the limit {MAX_SIZE}")


def _check_format(fmt: Any, what: str) -> None:
    if isinstance(fmt, str) and _WIDE_FORMAT.search(fmt):
        raise TemplateLimit(f"{what}: a format width or precision larger than {MAX_SIZE}")


def _length(value: Any) -> int | None:
    return len(value) if isinstance(value, (str, list, tuple)) else None


def _check_binop(op: str, left: Any, right: Any) -> None:
    what = f"'{op}'"
    if op == "*":
        for seq, n in ((left, right), (right, left)):
            size = _length(seq)
            if size is not None and isinstance(n, int) and size * n > MAX_SIZE:
                raise TemplateLimit(f"{what} would make a value longer than {MAX_SIZE} characters or items")
            if isinstance(seq, (list, tuple)) and isinstance(n, int) and n > 1 and \
                    (_weight(seq, MAX_SIZE // n + 3) - 2) * n > MAX_SIZE:  # brackets written once
                raise TemplateLimit(f"{what} would make a list of more than {MAX_SIZE} characters")
        if isinstance(left, int) and isinstance(right, int) and left.bit_length() + right.bit_length() > MAX_INT_BITS:
            raise TemplateLimit(f"{what} would make a number of more than {MAX_INT_BITS} bits")
    elif op == "+":
        a, b = _length(left), _length(right)
        if a is not None and b is not None and a + b > MAX_SIZE:
            raise TemplateLimit(f"{what} would make a value longer than {MAX_SIZE} characters or items")
    elif op == "**":
        if isinstance(left, int) and isinstance(right, int) and right > 0 and \
                abs(left) > 1 and right * left.bit_length() > MAX_INT_BITS:
            raise TemplateLimit(f"{what} would make a number of more than {MAX_INT_BITS} bits")
    elif op == "%" and isinstance(left, str):
        _check_format(left, "'%'")
        _check_weight(right if isinstance(right, tuple) else (right,), "'%'")
        if "*" in left:
            _check_numbers(right if isinstance(right, tuple) else (right,), {}, "'%'")


class _SizedConcat(CodeGenerator):
    """``a ~ b``: each operand weighed before it is written out, the result checked against
    MAX_SIZE (Jinja2 compiles it to a join no sandbox hook sees)."""

    def visit_Concat(self, node: nodes.Concat, frame) -> None:
        if frame.eval_ctx.volatile:
            join = "(markup_join if context.eval_ctx.volatile else str_join)"
        else:
            join = "markup_join" if frame.eval_ctx.autoescape else "str_join"
        self.write(f"environment.sized_concat({join}((")
        for arg in node.nodes:
            self.write("environment.weighed(")
            self.visit(arg, frame)
            self.write("), ")
        self.write(")))")


def _bounded_filter(name: str, func: Any) -> Any:
    estimate = _FILTER_SIZES.get(name)
    signature = inspect.signature(func) if estimate else None
    writes = name in _WRITERS

    @functools.wraps(func)  # keeps jinja_pass_arg, so the compiler passes context/environment as before
    def bounded(*args: Any, **kwargs: Any) -> Any:
        first = 1 + (getattr(func, "jinja_pass_arg", None) is not None)  # the value is not a size
        _check_numbers(args[first:], kwargs, f"filter '{name}'")
        if name == "format" and len(args) >= first:
            _check_format(args[first - 1], "filter 'format'")
        if writes:
            _check_weight((*args[first - 1:], *kwargs.values()), f"filter '{name}'")
        if estimate is not None:
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError:
                pass  # the call itself says what is wrong
            else:
                bound.apply_defaults()
                _too_long(estimate(bound.arguments), f"the result of filter '{name}'")
                args, kwargs = bound.args, bound.kwargs
        return _sized(func(*args, **kwargs), f"the result of filter '{name}'")

    return bounded


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    code_generator_class = _SizedConcat
    intercepted_binops = frozenset(["*", "+", "**", "%"])

    def __init__(self, **kwargs: Any):
        super().__init__(undefined=NamedUndefined, autoescape=False, keep_trailing_newline=False,
                         finalize=self.weighed, **kwargs)
        self.filters = {name: _bounded_filter(name, f) for name, f in self.filters.items()}

    def call_binop(self, context, operator_: str, left: Any, right: Any) -> Any:
        _check_binop(operator_, left, right)
        return self.binop_table[operator_](left, right)

    def call(__self, __context, __obj, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 (Jinja2's signature)
        if not isinstance(__obj, Macro):
            name = "range" if __obj is safe_range else getattr(__obj, "__name__", "a function")
            for arg in (*args, *kwargs.values()):
                if isinstance(arg, Undefined):  # say which name is undefined, not "cannot be interpreted as an integer"
                    arg._fail_with_undefined_error()
            _check_numbers(args, kwargs, f"{name}()")
            wrapped = getattr(__obj, "__wrapped__", None)
            if name in ("format", "format_map") and wrapped is not None:
                _check_format(getattr(wrapped, "__self__", None), f"{name}()")
            text = getattr(wrapped or __obj, "__self__", None)
            if isinstance(text, str):
                args = _str_method_args(text, name, args, kwargs)
            elif name == "generate_lorem_ipsum":
                _check_lipsum(*args, **kwargs)
        return _sized(super().call(__context, __obj, *args, **kwargs), "the result of a call")

    @staticmethod
    def sized_concat(value: Any) -> Any:
        return _sized(value, "'~'")

    @staticmethod
    def weighed(value: Any) -> Any:
        """``value`` itself, once known not to write out longer than MAX_SIZE (``{{ }}`` and ``~``)."""
        _check_weight((value,), "writing a list or dict")
        return value


def _check_lipsum(n: Any = 5, html: Any = True, min: Any = 20, max: Any = 100) -> None:  # noqa: A002
    if isinstance(n, int) and isinstance(max, int):
        _too_long(n * max * 12, "lipsum()")


def refused_tag(ast: nodes.Template) -> nodes.Node | None:
    """The first include/import/extends in a parsed template, if any."""
    for node in ast.find_all(REFUSED_TAGS):
        return node
    return None


__all__ = ["BoundedEnvironment", "TemplateLimit", "UndefinedName", "NamedUndefined", "MAX_SIZE", "MAX_RANGE",
           "refused_tag"]
