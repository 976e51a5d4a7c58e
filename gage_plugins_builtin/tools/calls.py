"""Tool calls in Sample v1's message shape, and the parsers that read them out of a model's text.

A call is ``{"id": "call_0", "type": "function", "function": {"name": ..., "arguments": "<JSON>"}}``
(OpenAI's shape, which Sample v1's ``golden_trajectories`` use). Parsers are registered through
``gage_register_tool_parsers``; each has ``markers`` (strings in a chat template that pick it) and
``parse(text) -> (content, calls, error)``.
"""
from __future__ import annotations

import ast
import json
import operator
import re
from typing import Any, Mapping, Sequence

from gage_eval.api import jsonio

Calls = list[dict]


def tool_call(name: str, arguments: Any, index: int = 0, call_id: str | None = None) -> dict:
    """One call in Sample v1's shape; ``arguments`` a mapping (written as JSON) or JSON text as is."""
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return {"id": call_id or f"call_{index}", "type": "function", "function": {"name": name, "arguments": text}}


def call_arguments(arguments: Any) -> Any:
    """A call's arguments as a value: JSON text parsed (blank text is ``{}``), anything else as it is;
    ValueError when the text is not JSON, or nests deeper than the decoder can follow (a model's or a
    server's ``[[[[...`` is the call's failure, not a RecursionError out of the loop or the metric)."""
    if isinstance(arguments, str):
        return jsonio.loads(arguments) if arguments.strip() else {}
    return arguments


def tool_functions(tools: Sequence[Mapping[str, Any]] | None) -> list[dict]:
    """The function definitions of OpenAI-style tools (a bare function definition passes as it is)."""
    return [dict(t["function"]) if isinstance(t.get("function"), Mapping) else dict(t) for t in tools or ()]


# -- the pythonic form: [f(a=1), g(b="x")] (BFCL's prompting format) ---------------------------------

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}


def _value(node: ast.AST) -> Any:
    """A call argument's value, read as BFCL's AST decoder reads it (its rules, not its code):
    a negative sign on a constant, lists, dicts, tuples, names as their text, a call without
    keywords as its source text and one with keywords as a nested call, arithmetic on constants
    computed (nothing is evaluated beyond it)."""
    if isinstance(node, ast.Constant):
        return "..." if node.value is Ellipsis else node.value
    if isinstance(node, ast.UnaryOp):
        if not isinstance(node.operand, ast.Constant):
            raise ValueError(f"unsupported expression {ast.unparse(node)!r}")
        return -node.operand.value  # (BFCL reads any unary operator as a minus sign)
    if isinstance(node, ast.List):
        return [_value(v) for v in node.elts]
    if isinstance(node, ast.Tuple):
        return tuple(_value(v) for v in node.elts)
    if isinstance(node, ast.Dict):
        return {_value(k): _value(v) for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Call):
        return ast.unparse(node) if not node.keywords else _call(node)
    if isinstance(node, ast.BinOp):
        op = _BINOPS.get(type(node.op))
        if op is None:
            raise ValueError(f"unsupported expression {ast.unparse(node)!r}")
        left, right = _value(node.left), _value(node.right)
        if _too_big(op, left, right):
            raise ValueError(f"{ast.unparse(node)[:80]!r} would be too large to compute")
        return op(left, right)
    if isinstance(node, ast.Subscript):
        return ast.unparse(node.value) + "[" + ast.unparse(node.slice) + "]"
    raise ValueError(f"unsupported expression {type(node).__name__}: {ast.unparse(node)!r}")


MAX_BITS = 1 << 16  # an integer a reply's arithmetic may make (a JSON number past 4,300 digits cannot be written)
MAX_ITEMS = 1 << 20  # a text or list a reply's `"x" * n` may make
MAX_REPLY_CHARS = 100_000  # a reply read in the pythonic form (ast.parse took 4.3 GB and 23 s for 7 MB of calls;
# BFCL's tasks ask for 256 tokens, about 1,000 characters)


def power_too_big(base: Any, exponent: Any) -> bool:
    """Whether ``base ** exponent`` on integers would pass ``MAX_BITS`` (``3 ** 10**9`` holds the
    interpreter and gigabytes for hours in one C call no timeout stops): bounded, never computed."""
    if type(base) is not int or type(exponent) is not int or exponent <= 0 or abs(base) <= 1:
        return False
    return exponent * abs(base).bit_length() > MAX_BITS


def _too_big(op: Any, left: Any, right: Any) -> bool:
    """Whether arithmetic a model wrote would hold the interpreter or its memory (``9**9**9``,
    ``"x" * 10**10``): what it computes is bounded, not evaluated to find out."""
    if op is operator.pow:
        return power_too_big(left, right)
    if op is operator.mul:
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, (str, list, tuple)) and type(n) is int:
                return len(seq) * n > MAX_ITEMS
        if type(left) is int and type(right) is int:
            return left.bit_length() + right.bit_length() > MAX_BITS
    return False


def _call(node: ast.Call) -> dict:
    parts, func = [], node.func
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if isinstance(func, ast.Name):
        parts.append(func.id)
    # positional arguments have no parameter name to check against: left out, as BFCL does
    return {".".join(reversed(parts)): {kw.arg: _value(kw.value) for kw in node.keywords}}


def decode_pythonic(text: str) -> list[dict]:
    """``[name: {param: value}]`` from a reply in the pythonic form; ValueError (or SyntaxError)
    when it is not one. The text is cleaned as BFCL's prompting decoder cleans it: backticks,
    newlines and spaces trimmed, brackets added where missing, wrapping single quotes dropped."""
    if len(text) > MAX_REPLY_CHARS:
        raise ValueError(f"the reply is {len(text)} characters long; calls are read from at most {MAX_REPLY_CHARS}")
    text = text.strip("`\n ")
    if not text.startswith("["):
        text = "[" + text
    if not text.endswith("]"):
        text = text + "]"
    tree = ast.parse(text.strip().strip("'"), mode="eval")
    if isinstance(tree.body, ast.Call):
        return [_call(tree.body)]
    elts = getattr(tree.body, "elts", None)
    if elts is None:
        raise ValueError("the reply is not a list of function calls")
    out = []
    for elem in elts:
        if not isinstance(elem, ast.Call):
            raise ValueError(f"{ast.unparse(elem)!r} is not a function call")
        out.append(_call(elem))
    return out


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k if isinstance(k, str) else json.dumps(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, complex):
        return str(value)
    return value


class PythonicParser:
    """Calls written as a Python list of calls, ``[get_weather(city="Paris")]``: BFCL's prompting
    format, and what the prompt-based mode asks for."""

    markers: tuple[str, ...] = ()

    def parse(self, text: str) -> tuple[str, Calls, str | None]:
        try:
            decoded = decode_pythonic(text)
            calls = [tool_call(name, _jsonable(args), i) for i, item in enumerate(decoded)
                     for name, args in item.items()]
        except (ValueError, SyntaxError, TypeError, ArithmeticError, RecursionError, MemoryError) as exc:
            return text, [], f"no function call could be read from the reply: {type(exc).__name__}: {exc}"
        return "", calls, None


class HermesParser:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (Hermes, Qwen2.5, SmolLM3)."""

    markers = ("<tool_call>",)
    _BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)  # (stripped after: \s* on both
    # sides of a lazy group backtracked over a run of spaces, 22 s for 60,000)

    def parse(self, text: str) -> tuple[str, Calls, str | None]:
        blocks = [b.strip() for b in self._BLOCK.findall(text)]
        if not blocks:
            return text, [], None
        content = text[:text.find("<tool_call>")].strip()
        calls, errors = [], []
        for i, block in enumerate(blocks):
            try:
                obj = jsonio.loads(block)
            except ValueError as exc:
                errors.append(f"tool call {i}: not JSON: {exc}")
                continue
            if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
                errors.append(f"tool call {i}: no function name")
                continue
            calls.append(tool_call(obj["name"], obj.get("arguments", obj.get("parameters", {})), i))
        return content, calls, "; ".join(errors) or None


class JsonParser:
    """A JSON object or list of objects ``{"name": ..., "parameters"|"arguments": {...}}`` (Llama 3.x)."""

    markers = ("<|python_tag|>", "\"parameters\"")

    def parse(self, text: str) -> tuple[str, Calls, str | None]:
        body = text.replace("<|python_tag|>", "").strip()
        if not body.startswith(("{", "[")):
            return text, [], None
        try:
            obj = jsonio.loads(body)
        except ValueError as exc:
            return text, [], f"the reply is not JSON: {exc}"
        items = obj if isinstance(obj, list) else [obj]
        if not all(isinstance(o, dict) and isinstance(o.get("name"), str) for o in items):
            return text, [], "the reply's JSON is not a list of {name, parameters} objects"
        return "", [tool_call(o["name"], o.get("parameters", o.get("arguments", {})), i)
                    for i, o in enumerate(items)], None


PARSERS = {"pythonic": PythonicParser, "hermes": HermesParser, "json": JsonParser}


def parser_for_template(template: str | None, registered: Mapping[str, Any]) -> Any:
    """The registered parser whose marker the chat template holds (the pythonic one when none does)."""
    for name, factory in registered.items():
        parser = factory()
        if template and any(m in template for m in getattr(parser, "markers", ())):
            return parser
    return PythonicParser()
