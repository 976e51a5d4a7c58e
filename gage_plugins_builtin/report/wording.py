"""What the report says in words: row errors grouped by their message with the parts that change
from row to row masked (ids, UUIDs, numbers, paths, URLs), and summary.json's counters
(``counts.by_counter``, ``"mmmu_acc.fallback": 7``) as sentences.

A counter's sentence is the metric's own when its class declares one (``counter_descriptions``,
a mapping from the counter's name to the words that follow the count, e.g. ``{"fallback":
"answers could not be parsed; a random choice was scored"}``); else a generic one that names
the metric and the counter."""
from __future__ import annotations

import importlib
import re
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Mapping

from gage_eval.api import GageError, read_yaml

MAX_IDS = 20  # example sample ids listed per error group
MAX_GROUPS = 200  # groups shown per task (the rest counted in one line)

# in this order: a URL or a path may hold a UUID or a number, a UUID holds hex
_MASKS = (
    (re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s'\"<>)\]]*[^\s'\"<>)\].,:;]", re.I), "‹url›"),
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.I), "‹uuid›"),
    (re.compile(r"(?<![\w/.-])(?:[A-Za-z]:)?(?:[/\\][\w.@+~-]+){2,}[/\\]?"), "‹path›"),
    (re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{8,}\b", re.I), "‹hex›"),
    (re.compile(r"\b\d+(?:[.,:]\d+)*\b"), "‹n›"),
)

# counters the core itself counts (no metric class declares them)
_CORE_COUNTERS = {
    "missing_field": "rows lacked a field the metric reads; each was scored 0",
}


def mask(message: str) -> str:
    """The message with what changes from row to row replaced by a placeholder."""
    for pattern, placeholder in _MASKS:
        message = pattern.sub(placeholder, message)
    return message


class ErrorGroups:
    """Row errors grouped by (stage, masked message): a count, example ids, one message in full."""

    def __init__(self) -> None:
        self.groups: dict[tuple, dict] = OrderedDict()

    def add(self, stage: Any, message: Any, sample_id: str) -> None:
        text = message if isinstance(message, str) else str(message)
        key = (str(stage), mask(text))
        group = self.groups.get(key)
        if group is None:
            if len(self.groups) >= MAX_GROUPS:
                key = (str(stage), "‹other messages›")
                group = self.groups.get(key)
            if group is None:
                group = self.groups[key] = {"stage": key[0], "pattern": key[1], "example": text, "count": 0,
                                            "ids": []}
        group["count"] += 1
        group["ids"].append(sample_id)  # all of them until sorted(): the first in data order are shown

    def sorted(self, position: Callable[[str], float] = lambda sid: 0.0) -> list[dict]:
        """The groups, most rows first, each with its first MAX_IDS ids by ``position`` (in the data)."""
        out = []
        for g in sorted(self.groups.values(), key=lambda g: -g["count"]):
            ids = sorted(g["ids"], key=position)[:MAX_IDS]
            out.append({**g, "ids": ids})
        return out


# -- counters ---------------------------------------------------------------
def _metric_names(task_folder: Any) -> dict[str, str]:
    """The task file's metric names by the name they are counted under (``as:``)."""
    out: dict[str, str] = {}
    if not isinstance(task_folder, str) or not (Path(task_folder) / "task.yaml").is_file():
        return out
    try:
        spec = read_yaml(Path(task_folder) / "task.yaml")
    except GageError:
        return out
    for entry in (spec.get("metrics") if isinstance(spec, dict) else None) or []:
        if isinstance(entry, dict) and isinstance(entry.get("name"), str):
            out[str(entry.get("as") or entry["name"])] = entry["name"]
    return out


def _declared(metric: str) -> Mapping[str, str]:
    """The counter descriptions a builtin metric class declares (empty for others)."""
    from gage_plugins_builtin import METRICS

    target = METRICS.get(metric)
    if not target:
        return {}
    module, _, attr = target.partition(":")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError):  # a metric whose module needs what is not installed
        return {}
    declared = getattr(cls, "counter_descriptions", None)
    return declared if isinstance(declared, Mapping) else {}


def describe_counters(by_counter: Mapping[str, Any], task_folder: Any = None) -> list[dict]:
    """Each counter as {"key", "count", "text"}: the count followed by what it means."""
    names = _metric_names(task_folder) if by_counter else {}
    out = []
    for key, count in by_counter.items():
        metric, _, counter = str(key).rpartition(".")
        words = None
        if metric:
            words = _declared(names.get(metric, metric)).get(counter)
        words = words or _CORE_COUNTERS.get(counter)
        if words:
            text = f"{count} {words}"
        else:
            rows = "row" if count == 1 else "rows"
            text = (f"{count} {rows} counted as “{counter}” by the metric {metric}" if metric
                    else f"{count} {rows} counted as “{key}”")
        out.append({"key": str(key), "count": count, "text": text})
    return out

