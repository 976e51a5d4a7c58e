"""The Jinja2 environment task templates run in: sandboxed, immutable, and bounded.

Templates format data; they cannot run code (Jinja2's ImmutableSandboxedEnvironment),
read other files (include, import and extends are refused when a template is loaded),
or build huge values: a string, list or number a template makes, a number handed to a
call or filter (a width, a count) and the rendered text are capped at :data:`MAX_SIZE`,
and ``range()`` at Jinja2's ``MAX_RANGE``. Going past a cap raises :class:`TemplateLimit`
before the value is built where it can be known in advance (``*``, ``+``, ``**``,
widths and counts), right after it otherwise (``~``, a filter's or method's result).
"""
from __future__ import annotations

import functools
import re
from typing import Any

from jinja2 import StrictUndefined, nodes
from jinja2.compiler import CodeGenerator
from jinja2.runtime import Macro, Undefined
from jinja2.sandbox import MAX_RANGE, ImmutableSandboxedEnvironment, safe_range

MAX_SIZE = 4_000_000  # characters of a string or the output, items of a list, a width or count; ~1M tokens
MAX_INT_BITS = 100_000
REFUSED_TAGS = (nodes.Include, nodes.Import, nodes.FromImport, nodes.Extends)

# A format field or %-conversion asking for a width or precision of seven digits or more.
_WIDE_FORMAT = re.compile(r"\{[^{}]*:[^{}]*\d{7}|%[-#0 +]*(?:\d{7}|\d*\.\d{7})")


class TemplateLimit(Exception):
    """A template went past one of the sandbox's resource limits."""


def _sized(value: Any, what: str) -> Any:
    if isinstance(value, (str, list, tuple)) and len(value) > MAX_SIZE:
        raise TemplateLimit(f"{what} would be longer than {MAX_SIZE} characters or items")
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > MAX_INT_BITS:
        raise TemplateLimit(f"{what} would be a number of more than {MAX_INT_BITS} bits")
    return value


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
        if "*" in left:
            _check_numbers(right if isinstance(right, tuple) else (right,), {}, "'%'")


class _SizedConcat(CodeGenerator):
    """``a ~ b`` is checked against MAX_SIZE (Jinja2 compiles it to a join no sandbox hook sees)."""

    def visit_Concat(self, node: nodes.Concat, frame) -> None:
        self.write("environment.sized_concat(")
        super().visit_Concat(node, frame)
        self.write(")")


def _bounded_filter(name: str, func: Any) -> Any:
    @functools.wraps(func)  # keeps jinja_pass_arg, so the compiler passes context/environment as before
    def bounded(*args: Any, **kwargs: Any) -> Any:
        first = 1 + (getattr(func, "jinja_pass_arg", None) is not None)  # the value is not a size
        _check_numbers(args[first:], kwargs, f"filter '{name}'")
        if name == "format" and len(args) >= first:
            _check_format(args[first - 1], "filter 'format'")
        return _sized(func(*args, **kwargs), f"the result of filter '{name}'")

    return bounded


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    code_generator_class = _SizedConcat
    intercepted_binops = frozenset(["*", "+", "**", "%"])

    def __init__(self, **kwargs: Any):
        super().__init__(undefined=StrictUndefined, autoescape=False, keep_trailing_newline=False, **kwargs)
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
        return _sized(super().call(__context, __obj, *args, **kwargs), "the result of a call")

    @staticmethod
    def sized_concat(value: Any) -> Any:
        return _sized(value, "'~'")


def refused_tag(ast: nodes.Template) -> nodes.Node | None:
    """The first include/import/extends in a parsed template, if any."""
    for node in ast.find_all(REFUSED_TAGS):
        return node
    return None


__all__ = ["BoundedEnvironment", "TemplateLimit", "MAX_SIZE", "MAX_RANGE", "refused_tag"]
