"""``trajectory_match``: the tool calls of a model's trajectory against the row's
``golden_trajectories`` (Sample v1), each call its function name and its arguments compared as
parsed JSON (``{"a": 1, "b": 2}`` is ``{"b":2,"a":1}``), the results of the calls not compared.

Modes: ``exact``: the same calls in the same order; ``in_order``: the golden calls in their
order, other calls allowed between them; ``set``: the same calls in any order (a multiset: a
call made twice must be golden twice). 1 when the model's calls match any golden trajectory.
"""
from __future__ import annotations

import json
from collections import Counter
from typing import Any, Iterable, Mapping

from gage_eval.api import Metric, MetricContext

from gage_plugins_builtin.tools.calls import call_arguments

MODES = ("exact", "in_order", "set")


def _canonical(arguments: Any) -> str:
    return json.dumps(arguments, sort_keys=True, ensure_ascii=False)


def _canonical_arguments(arguments: Any) -> str:
    try:
        arguments = call_arguments(arguments)
    except ValueError:
        return "\x00" + arguments  # (unparsable: equal only to the same text)
    return _canonical(arguments)


def trajectory_calls(messages: Iterable[Any]) -> list[tuple[str, str]]:
    """Each call of the assistant turns, in order: ``(function name, canonical JSON arguments)``."""
    out = []
    for message in messages or ():
        if not isinstance(message, Mapping) or message.get("role") != "assistant":
            continue
        for call in message.get("tool_calls") or ():
            fn = call.get("function") if isinstance(call, Mapping) else None
            if isinstance(fn, Mapping):
                out.append((str(fn.get("name")), _canonical_arguments(fn.get("arguments", {}))))
    return out


def _in_order(golden: list, model: list) -> bool:
    rest = iter(model)
    return all(any(call == m for m in rest) for call in golden)


def calls_match(golden: list, model: list, mode: str) -> bool:
    if mode == "exact":
        return golden == model
    if mode == "in_order":
        return _in_order(golden, model)
    return Counter(golden) == Counter(model)


def model_trajectory(model_output: Mapping[str, Any]) -> list:
    """The model's trajectory; a single reply (no tool loop) as its one assistant turn."""
    trajectory = model_output.get("trajectory")
    if trajectory is not None:
        return list(trajectory)
    return [{"role": "assistant", "tool_calls": model_output.get("tool_calls") or []}]


def _golden_calls(goldens: list) -> list[list[tuple[str, str]]]:
    """Each golden trajectory's calls as :func:`trajectory_calls` gives them, each call's arguments
    parsed once. A golden call whose arguments are not JSON could never be matched: the row's
    error, naming the field (Sample v1's schema checks the shape, not the JSON inside the
    arguments' text), whichever turn holds it."""
    out = []
    for g, golden in enumerate(goldens):
        calls_of = []
        for t, message in enumerate(golden or ()):
            calls = message.get("tool_calls") if isinstance(message, Mapping) else None
            for c, call in enumerate(calls or ()):
                fn = call.get("function") if isinstance(call, Mapping) else None
                try:
                    arguments = call_arguments(fn.get("arguments", {}) if isinstance(fn, Mapping) else {})
                except ValueError as exc:
                    raise ValueError(f"golden_trajectories[{g}][{t}].tool_calls[{c}].function.arguments: "
                                     f"not valid JSON ({exc})") from None
                if isinstance(fn, Mapping) and message.get("role") == "assistant":
                    calls_of.append((str(fn.get("name")), _canonical(arguments)))
        out.append(calls_of)
    return out


class TrajectoryMatch(Metric):
    """1 when the model's tool calls match one of ``golden_trajectories`` (``mode``: exact,
    in_order or set); a row without golden trajectories is not scored."""

    name = "trajectory_match"

    def __init__(self, mode: str = "exact"):
        if mode not in MODES:
            raise ValueError(f"trajectory_match: mode must be one of {', '.join(MODES)}, not {mode!r}")
        self.mode = mode

    def compute(self, ctx: MetricContext) -> Any:
        goldens = ctx.sample.get("golden_trajectories") or []
        if not goldens:
            return None
        goldens = _golden_calls(goldens)
        model = trajectory_calls(model_trajectory(ctx.model_output))
        for golden in goldens:
            if calls_match(golden, model, self.mode):
                return {"value": 1.0}
        return {"value": 0.0, "calls": len(model), "golden_calls": len(goldens[0])}
