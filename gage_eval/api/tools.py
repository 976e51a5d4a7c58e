"""Tools a model calls in a multi-turn tool loop, registered with ``gage_register_tools``, and the
parsers that read a model's calls from its text, registered with ``gage_register_tool_parsers``
(a plugin reaches them as the namespace ``from gage_eval.api import tools``).

A task opts into the loop (``request.tool_loop: {tools: [NAME, ...], max_steps: N}``); for each
row the loop builds a fresh instance of each named tool (``factory(sample=row)``: state never leaks
from one row into another), sends the model the row's ``tools``, runs each call the model makes
through the instance that serves its function and returns the result as a ``tool`` turn.
The task's tool names and ``tool_args`` are checked when the task is set up (an unknown tool, a key
the factory does not take, what the tool's :meth:`Tool.check_args` refuses), before any model loads.
"""
from __future__ import annotations

import inspect
import json
from typing import Any, Callable, Mapping

from gage_eval.api import registered
from gage_eval.api.errors import GageError


class RowFailed(Exception):
    """Raised by a tool's call when the row's setting, not the model, failed (the code sandbox could
    not prepare the row: an image it does not run, a setup that failed): the row stops there as its
    recorded error (its trajectory so far kept), not scored; the model is not answered with it."""


class Tool:
    """Base class of a tool implementation (one instance per row).

    Subclasses define the functions the model may call as public methods taking keyword
    arguments (or override :meth:`functions` and :meth:`call`); ``__init__(sample)`` gets the
    row (Sample v1) to set its starting state from. A method's exception, arguments that do not
    fit it or a function no tool serves are returned to the model as the tool turn's text, never
    raised out of the loop; only :class:`RowFailed` ends the row, as its error. A tool that runs
    code must run it through the code sandbox, never in this process.
    """

    call_timeout_s: float | None = None
    """Seconds the loop waits for one call of this tool when that is longer than the task's
    ``tool_loop.call_timeout_s`` (300 by default): for a tool that bounds its own calls (the code
    tools: the sandbox's wall time, plus a margin). None: the task's limit. It never shortens it."""

    def __init__(self, sample: Mapping[str, Any] | None = None) -> None:
        self.sample = sample

    @classmethod
    def check_args(cls, **args: Any) -> None:
        """Refuse a task's ``tool_args`` for this tool before any work: called once at task setup,
        with no row. Raise TypeError or ValueError naming the key, never quoting its value (a value
        may be a credential). By default: only that ``__init__`` takes each key."""
        inspect.signature(cls).bind(sample=None, **args)

    def functions(self) -> list[str]:
        """The names of the functions this tool serves (default: its public methods, those of
        :class:`Tool` itself left out)."""
        own = set(dir(Tool))
        return [n for n, _ in inspect.getmembers(self, inspect.ismethod) if not n.startswith("_") and n not in own]

    def call(self, name: str, arguments: Mapping[str, Any]) -> Any:
        """Run ``name`` with ``arguments``; its return value becomes the tool turn's text
        (:meth:`result_text`)."""
        return getattr(self, name)(**arguments)

    def definitions(self) -> list[dict]:
        """OpenAI tool definitions of its functions, sent to the model when the row has no ``tools``."""
        return []

    def state(self) -> Any:
        """What a metric may check after each user turn (JSON; recorded with the trajectory), or None."""
        return None

    @staticmethod
    def result_text(value: Any) -> str:
        """A tool's return value as the text of its ``tool`` turn: a string as it is, a dict as JSON
        (its ``str`` when it holds what JSON cannot write), anything else as its ``str``."""
        if isinstance(value, str):
            return value
        if isinstance(value, dict):
            try:
                return json.dumps(value)
            except (TypeError, ValueError):
                return str(value)
        return str(value)


def factory(name: str) -> Callable[[Mapping[str, Any]], Any]:
    """The factory a plugin registered as tool ``name`` (``factory(sample=row)`` builds one row's instance)."""
    table = registered.table("tools")
    if name not in table:
        raise GageError(f"unknown tool {name!r}; registered: {', '.join(sorted(table)) or 'none'}")
    return table[name].factory


def parser(name: str | None = None) -> Any:
    """The tool-call parser a plugin registered as ``name`` (built by its factory), or, with no
    name, the registered names and factories (to pick one by a chat template's markers)."""
    table = registered.table("tool_parsers")
    if name is None:
        return {k: reg.factory for k, reg in table.items()}
    if name not in table:
        raise GageError(f"unknown tool parser {name!r}; registered: {', '.join(sorted(table)) or 'none'}")
    return table[name].factory()
