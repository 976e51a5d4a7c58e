"""A task's ``request.tool_loop`` checked when the task is set up, before any model loads: each tool
it names is registered (``gage_register_tools``), ``tool_args`` names only those tools, and each
tool's arguments (none given: its defaults) are keys its factory takes and values its ``check_args``
accepts (when it has one, as :class:`gage_eval.api.tools.Tool` does). A message names the task file's line and the key, never
a value of ``tool_args`` (a value may be a credential, as a remote sandbox's token).

A metric's ``sandbox`` and ``sandbox_args`` (code_exec's) are checked the same way before the metric
is built (:func:`check_metric_sandbox`): the sandbox is opened as the metric will open it."""
from __future__ import annotations

import inspect
from typing import Any, Mapping

from gage_eval.api import execution
from gage_eval.api.errors import GageError, KeyedError
from gage_eval.api.yamlio import key_line
from gage_eval.tasks.spec import TASK_FILE, TaskSpec

KEY = "request.tool_loop"


def check_tool_loop(spec: TaskSpec, loop: Mapping[str, Any], registry: Any) -> None:
    """Raise GageError for the first tool or tool argument the run would refuse on every row."""
    names = [n for n in loop.get("tools") or () if isinstance(n, str)]
    if registry is None:
        from gage_eval.plugins import load_plugins

        registry = load_plugins()[1]
    factories = {}
    for i, name in enumerate(names):
        try:
            factories[name] = registry.get("tools", name).factory
        except GageError as exc:
            raise _refusal(spec, f"{KEY}.tools.{i}", str(exc)) from None
    given = loop.get("tool_args") or {}
    for name in given:
        if name not in factories:
            raise _refusal(spec, f"{KEY}.tool_args.{name}",
                           f"tool_args for tool {name!r}, which tools does not name ({', '.join(names) or 'none'})")
    for name in factories:  # a tool without tool_args is checked with its defaults (its sandbox opened)
        args = given.get(name, {})
        key = f"{KEY}.tool_args.{name}" if name in given else f"{KEY}.tools.{names.index(name)}"
        if not isinstance(args, Mapping):
            raise _refusal(spec, key, f"tool {name}: expected a mapping of its arguments")
        _check_args(name, factories[name], dict(args), lambda problem: _refusal(spec, key, problem))


def _check_args(name: str, factory: Any, args: dict, refuse: Any) -> None:
    keys = f"tool_args.{name}: {', '.join(sorted(map(str, args)))}" if args else f"no tool_args.{name}"
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # (a factory Python cannot read the parameters of: only its check_args)
        signature = None
    try:
        if signature is not None:
            signature.bind(sample=None, **args)
        check = getattr(factory, "check_args", None)
        if callable(check):
            check(**args)
    except (TypeError, ValueError, GageError) as exc:
        raise refuse(f"tool {name} ({keys}): {type(exc).__name__}: {exc}") from None


def check_metric_sandbox(spec: TaskSpec, index: int, args: Mapping[str, Any]) -> None:
    """Open the sandbox metric ``index`` names in its ``args`` (``sandbox``, ``sandbox_args``: the
    convention of docs/hooks.md, code_exec's), as the metric will; a GageError naming
    ``metrics.INDEX.args.sandbox`` (or ``.sandbox_args``) and its line when that cannot be done."""
    if "sandbox" not in args and "sandbox_args" not in args:
        return
    box, given, key = args.get("sandbox", "local"), args.get("sandbox_args"), f"metrics.{index}.args."
    try:
        execution.check_sandbox(box, given, lambda name, problem: _refusal(spec, key + name, problem))
    except GageError as exc:  # unknown, or it cannot run here (how to install it); a wrong type: keyed
        raise exc if isinstance(exc, KeyedError) else _refusal(spec, key + "sandbox", str(exc)) from None
    except (TypeError, ValueError) as exc:  # (the message names a key, never a value)
        keys = ", ".join(sorted(map(str, given or {})))
        raise _refusal(spec, key + "sandbox_args",
                       f"sandbox {box} (sandbox_args: {keys}): {type(exc).__name__}: {exc}") from None


def _refusal(spec: TaskSpec, key: str, problem: str) -> KeyedError:
    """The task check's one line: the task, its file and the key's line, the key, the problem."""
    path = spec.folder / TASK_FILE
    return KeyedError(f"task {spec.name!r} ({path}:{key_line(path, key) or 1})", key, problem)
