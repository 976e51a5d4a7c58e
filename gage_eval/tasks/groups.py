"""Groups of tasks: their definitions (a task file's ``groups`` key), ``--tasks GROUP`` expanded to its
tasks, and the group scores of summary.json, aggregated as lm-evaluation-harness 0.4.13 does.

A group names its members: tasks, tags (every task whose ``tags`` has it) and other groups. A group's
score for a metric is over all the tasks under it (its leaves, subgroups' included, each once):

- ``weight_by_size: true`` (the default): the mean of the tasks' values weighted by their row
  counts, which is the mean over all their rows; stderr by pooling the tasks' sample variances,
  ``sqrt(sum((n_i - 1) * se_i^2 * n_i) / (N - k) / N)`` for k tasks of N rows in all.
- ``weight_by_size: false``: the plain mean of the tasks' values; stderr ``sqrt(sum(se_i^2)) / k``.

A task without the metric is left out (and named in ``missing``); the stderr is null when a task
that has the metric has none (fewer than 2 rows).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Mapping, Sequence

from gage_eval.api.errors import GageError
from gage_eval.tasks.spec import TASK_FILE, TaskSource, read_task_data, read_task_yaml


@dataclass(frozen=True)
class Aggregate:
    metric: str
    weight_by_size: bool = True


@dataclass(frozen=True)
class GroupSpec:
    name: str
    members: tuple[str, ...]  # as written: task names, tags, group names
    aggregate: tuple[Aggregate, ...]
    alias: str | None
    where: str  # the task file that defines it, for messages


def discover_groups(found: Mapping[str, TaskSource]) -> dict[str, GroupSpec]:
    """The groups the task files of ``found`` define under ``groups``; a group named like a task, or
    defined twice, is an error naming both files."""
    groups: dict[str, GroupSpec] = {}
    folders = list(dict.fromkeys(src.folder for src in found.values()))
    for folder in folders:
        path = folder / TASK_FILE
        try:
            raw = _raw_groups(folder)
        except GageError:  # the task itself reports a broken file when it is run
            continue
        for name, entry in raw.items():
            where = f"{path}: key 'groups.{name}'"
            if name in found:
                raise GageError(f"{where}: {name!r} is also a task ({found[name].folder}); give the group "
                                f"another name")
            if name in groups:
                raise GageError(f"{where}: group {name!r} is defined again (first in {groups[name].where})")
            aggregate = tuple(Aggregate(a["metric"], bool(a.get("weight_by_size", True)))
                              for a in entry.get("aggregate") or ())
            groups[name] = GroupSpec(name, tuple(entry["tasks"]), aggregate, entry.get("alias"), str(path))
    return groups


def _raw_groups(folder: Path) -> dict:
    data = read_task_yaml(folder / TASK_FILE)
    if not isinstance(data, dict) or not data.get("groups"):
        return {}
    return read_task_data(folder)["groups"]  # checked against the task schema


def members(group: GroupSpec, found: Mapping[str, TaskSource], groups: Mapping[str, GroupSpec]) -> list[str]:
    """The group's direct members, tags read as their tasks (in discovery order)."""
    out: list[str] = []
    for member in group.members:
        if member in groups or member in found:
            out.append(member)
            continue
        tagged = [name for name, src in found.items() if member in src.tags]
        if not tagged:
            raise GageError(f"{group.where}: group {group.name!r} names {member!r}, which is no task, tag or "
                            f"group (see `gage-eval tasks`)")
        out.extend(tagged)
    return list(dict.fromkeys(out))


def leaves(name: str, found: Mapping[str, TaskSource], groups: Mapping[str, GroupSpec],
           _path: tuple[str, ...] = ()) -> list[str]:
    """The tasks under a group, subgroups' included, each once, in order."""
    if name in _path:
        raise GageError(f"{groups[name].where}: group {name!r} contains itself ({' > '.join(_path + (name,))})")
    out: list[str] = []
    for member in members(groups[name], found, groups):
        out.extend(leaves(member, found, groups, _path + (name,)) if member in groups else [member])
    return list(dict.fromkeys(out))


def subgroups(name: str, found: Mapping[str, TaskSource], groups: Mapping[str, GroupSpec]) -> list[tuple[str, int]]:
    """The group and the groups under it, depth first, each with its depth (0 for the group)."""
    out = [(name, 0)]
    for member in members(groups[name], found, groups):
        if member in groups:
            out.extend((g, d + 1) for g, d in subgroups(member, found, groups))
    return out


def expand(names: Sequence[str], found: Mapping[str, TaskSource],
           groups: Mapping[str, GroupSpec]) -> list[str]:
    """``--tasks`` names with each group, tag or glob pattern (``'mmlu_*'``, as lm-eval's) replaced by
    its tasks; the names that are none of these are kept (the caller says they are unknown)."""
    out: list[str] = []
    for name in names:
        if name in found:
            out.append(name)
        elif name in groups:
            out.extend(leaves(name, found, groups))
        else:
            out.extend([t for t, src in found.items() if name in src.tags]
                       or sorted(t for t in found if fnmatchcase(t, name)) or [name])
    return list(dict.fromkeys(out))


def pooled_stderr(stderrs: Sequence[float], sizes: Sequence[int]) -> float:
    """The stderr of a size-weighted mean over tasks from their stderrs (pooled sample variance)."""
    total, k = sum(sizes), len(sizes)
    if total - k <= 0:
        return math.nan
    pooled = sum((n - 1) * se * se * n for n, se in zip(sizes, stderrs)) / (total - k)
    return math.sqrt(pooled / total)


def unweighted_stderr(stderrs: Sequence[float]) -> float:
    """The stderr of the plain mean of k independent task means."""
    return math.sqrt(sum(se * se for se in stderrs)) / len(stderrs)


def aggregate_values(values: Sequence[float], sizes: Sequence[int], stderrs: Sequence[float | None],
                     weight_by_size: bool = True) -> tuple[float, float | None]:
    """A group's (value, stderr) from its tasks' values, row counts and stderrs."""
    weights = list(sizes) if weight_by_size else [1] * len(values)
    value = sum(v * w for v, w in zip(values, weights)) / sum(weights)
    if any(se is None for se in stderrs):
        return value, None
    stderr = pooled_stderr(stderrs, sizes) if weight_by_size else unweighted_stderr(stderrs)
    return value, (None if math.isnan(stderr) else stderr)


def group_entry(name: str, tasks: Mapping[str, Mapping[str, Any]], found: Mapping[str, TaskSource],
                groups: Mapping[str, GroupSpec]) -> dict:
    """One group's summary.json entry from the tasks' summaries."""
    group = groups[name]
    under = leaves(name, found, groups)
    metrics: dict[str, dict] = {}
    for agg in group.aggregate:
        values, sizes, stderrs, missing, better = [], [], [], [], None
        for task in under:
            entry = ((tasks.get(task) or {}).get("metrics") or {}).get(agg.metric)
            if not entry or entry.get("value") is None or not entry.get("n"):
                missing.append(task)
                continue
            values.append(entry["value"])
            sizes.append(entry["n"])
            stderrs.append(entry.get("stderr"))
            better = entry.get("higher_is_better", better)
        if not values:
            metrics[agg.metric] = {"value": None, "stderr": None, "n": 0, "tasks": 0,
                                   "weight_by_size": agg.weight_by_size, "missing": missing}
            continue
        value, stderr = aggregate_values(values, sizes, stderrs, agg.weight_by_size)
        metrics[agg.metric] = {"value": value, "stderr": stderr, "n": sum(sizes), "tasks": len(values),
                               "weight_by_size": agg.weight_by_size, "missing": missing,
                               **({"higher_is_better": better} if better is not None else {})}
    return {"group": name, "alias": group.alias or name, "members": members(group, found, groups), "tasks": under, "metrics": metrics}


def group_summaries(asked: Sequence[str], tasks: Mapping[str, Mapping[str, Any]],
                    found: Mapping[str, TaskSource], groups: Mapping[str, GroupSpec]) -> dict[str, dict]:
    """summary.json's ``groups``: each group asked for and the groups under it, depth first, each
    with its ``depth`` below the group asked for."""
    out: dict[str, dict] = {}
    for name in asked:
        if name in groups and name not in found:
            for sub, depth in subgroups(name, found, groups):
                if sub not in out:
                    out[sub] = {**group_entry(sub, tasks, found, groups), "depth": depth}
    return out


def run_groups(options: Any, tasks: Mapping[str, Mapping[str, Any]]) -> dict[str, dict]:
    """The groups among the run's ``--tasks`` aggregated over the tasks' summaries; {} when it
    named none."""
    from gage_eval.plugins import load_plugins
    from gage_eval.tasks.spec import discover

    registry = load_plugins()[1]
    found = discover(registry.task_paths, list(options.include_paths), warn=lambda msg: None)
    if all(name in found for name in options.tasks):
        return {}
    return group_summaries(options.tasks, tasks, found, discover_groups(found))
