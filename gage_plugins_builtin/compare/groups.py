"""The groups of two runs compared: for each group in both runs' summary.json (``groups``, as
:mod:`gage_eval.tasks.groups` aggregates them) and each metric it aggregates in both, the two
group values as summary.json has them and their difference, then a paired comparison over the
paired rows of the group's tasks, aggregated as the group is (docs/compare.md, "Groups"):

* the means of A and B over those rows and their difference: with ``weight_by_size`` (lm-eval's
  default) every paired row counts once, so the mean is over all of them; without it, each task's
  paired mean counts once;
* a paired bootstrap 95% interval of that difference, stratified by task: each resample draws,
  task after task, as many of a task's paired rows as it has (index ``int(rng.random() * n)``),
  from one ``random.Random(seed)`` for all the groups, the tasks in the order the groups list them;
  every group (and metric) of a resample reads the same draws, so a category and its parent agree;
* for a binary metric of a size-weighted group, McNemar's exact test on the discordant pairs of
  all its tasks together.

The paired part needs the group's tasks compared in both runs with the same tasks counted on each
side (none left out by ``--task``, none without the metric on one side only); otherwise it is
null and ``unpaired`` says why: the difference of the two summary values is then all there is.
"""
from __future__ import annotations

import random
from typing import Any, Mapping

from gage_eval.api import stats

from gage_plugins_builtin.compare import CONFIDENCE, mcnemar_exact_p

Pairs = Mapping[str, Mapping[str, tuple[list[str], list[float], list[float]]]]  # task -> metric -> (ids, a, b)


def compare_groups(groups_a: Mapping[str, Any], groups_b: Mapping[str, Any], pairs: Pairs, *,
                   resamples: int, seed: int) -> dict[str, dict]:
    """Each group in both runs (in A's order) with its metrics compared; ``pairs``: each compared
    task's paired values per metric (ids, A's values, B's values, in the same order)."""
    out: dict[str, dict] = {}
    wanted: dict[str, dict[str, list[str]]] = {}  # group -> metric -> the tasks its paired part pools
    for name, ga in groups_a.items():
        gb = groups_b.get(name)
        if not isinstance(gb, Mapping):
            continue
        metrics: dict[str, dict] = {}
        for metric, sa in (ga.get("metrics") or {}).items():
            sb = (gb.get("metrics") or {}).get(metric)
            if not isinstance(sb, Mapping):
                continue
            row, tasks = _summary_row(ga, gb, sa, sb, metric, pairs)
            if tasks is not None:
                row["paired"] = _paired(tasks, metric, pairs, row["weight_by_size"])
                wanted.setdefault(name, {})[metric] = tasks
            metrics[metric] = row
        out[name] = {"alias": ga.get("alias", name), "depth": ga.get("depth", 0), "members": ga.get("members", []),
                     "tasks": ga.get("tasks", []), "metrics_only_in_a": [m for m in ga.get("metrics") or {}
                                                                          if m not in (gb.get("metrics") or {})],
                     "metrics_only_in_b": [m for m in gb.get("metrics") or {} if m not in (ga.get("metrics") or {})],
                     "metrics": metrics}
    _add_intervals(out, wanted, pairs, resamples, seed)
    return out


def _summary_row(ga: Mapping[str, Any], gb: Mapping[str, Any], sa: Mapping[str, Any], sb: Mapping[str, Any],
                 metric: str, pairs: Pairs) -> tuple[dict, list[str] | None]:
    """A group metric's summary values and difference, and the tasks its paired part pools (None,
    with ``unpaired`` saying why, when the samples do not allow one)."""
    va, vb = sa.get("value"), sb.get("value")
    row: dict[str, Any] = {"weight_by_size": bool(sa.get("weight_by_size", True)),
                           "n_a": sa.get("n"), "n_b": sb.get("n"),
                           "tasks_a": sa.get("tasks"), "tasks_b": sb.get("tasks"),
                           "mean_a": va, "mean_b": vb, "diff": (vb - va) if va is not None and vb is not None else None,
                           "paired": None, "unpaired": None}
    missing_a, missing_b = set(sa.get("missing") or ()), set(sb.get("missing") or ())
    counted = [t for t in ga.get("tasks") or () if t not in missing_a]
    if bool(sb.get("weight_by_size", True)) != row["weight_by_size"]:
        row["unpaired"] = "A and B weight the tasks differently"
    elif list(ga.get("tasks") or ()) != list(gb.get("tasks") or ()) or missing_a != missing_b:
        row["unpaired"] = "A and B count other tasks in the group"
    elif not counted:
        row["unpaired"] = "no task has the metric"
    else:
        absent = [t for t in counted if metric not in (pairs.get(t) or {})]
        if absent:
            row["unpaired"] = (f"{len(absent)} of its {len(counted)} tasks not compared ({', '.join(absent[:3])}"
                               f"{', ...' if len(absent) > 3 else ''})")
        elif not row["weight_by_size"] and any(not pairs[t][metric][0] for t in counted):
            row["unpaired"] = "a task has no paired row (its mean counts whole in the group)"
        elif not any(pairs[t][metric][0] for t in counted):
            row["unpaired"] = "no paired row"
    return row, (None if row["unpaired"] else counted)


def _weights(tasks: list[str], metric: str, pairs: Pairs, by_size: bool) -> list[int]:
    return [len(pairs[t][metric][0]) if by_size else 1 for t in tasks]


def _paired(tasks: list[str], metric: str, pairs: Pairs, by_size: bool) -> dict[str, Any]:
    weights = _weights(tasks, metric, pairs, by_size)
    total = sum(weights)
    means = {side: sum(w * sum(pairs[t][metric][side]) / len(pairs[t][metric][0])
                       for t, w in zip(tasks, weights) if w) / total for side in (1, 2)}
    a_all = [v for t in tasks for v in pairs[t][metric][1]]
    b_all = [v for t in tasks for v in pairs[t][metric][2]]
    binary = all(v in (0.0, 1.0) for v in a_all + b_all)
    out: dict[str, Any] = {"n": len(a_all), "tasks": len(tasks), "mean_a": means[1], "mean_b": means[2],
                           "diff": means[2] - means[1], "ci": None, "binary": binary, "mcnemar": None}
    if binary and by_size:
        down = sum(1 for x, y in zip(a_all, b_all) if x == 1.0 and y == 0.0)
        up = sum(1 for x, y in zip(a_all, b_all) if x == 0.0 and y == 1.0)
        out["mcnemar"] = {"b": down, "c": up, "p": mcnemar_exact_p(down, up)}
    return out


def _add_intervals(out: dict[str, dict], wanted: Mapping[str, Mapping[str, list[str]]], pairs: Pairs,
                   resamples: int, seed: int) -> None:
    """The stratified bootstrap of every paired group difference, all from one seeded stream."""
    if resamples <= 0 or not wanted:
        return
    needed: dict[str, dict[tuple[str, ...], list[str]]] = {}  # task -> its metrics' id lists -> metrics
    for by_metric in wanted.values():
        for metric, tasks in by_metric.items():
            for t in tasks:
                ids = tuple(pairs[t][metric][0])
                names = needed.setdefault(t, {}).setdefault(ids, [])
                if ids and metric not in names:
                    names.append(metric)
    diffs = {(t, m): [y - x for x, y in zip(pairs[t][m][1], pairs[t][m][2])]
             for t, sets in needed.items() for names in sets.values() for m in names}
    means: dict[tuple[str, str], list[float]] = {key: [] for key in diffs}
    rand = random.Random(seed).random
    for _ in range(resamples):
        for t, sets in needed.items():
            for ids, names in sets.items():
                n = len(ids)
                idx = [int(rand() * n) for _ in range(n)]
                for m in names:
                    get = diffs[(t, m)].__getitem__
                    means[(t, m)].append(sum(map(get, idx)) / n)
    alpha = (1.0 - CONFIDENCE) / 2
    for name, by_metric in wanted.items():
        for metric, tasks in by_metric.items():
            row = out[name]["metrics"][metric]
            weights = _weights(tasks, metric, pairs, row["weight_by_size"])
            total = sum(weights)
            values = sorted(sum(w * means[(t, metric)][i] for t, w in zip(tasks, weights) if w) / total
                            for i in range(resamples))
            row["paired"]["ci"] = [stats.quantile(values, alpha), stats.quantile(values, 1.0 - alpha)]
