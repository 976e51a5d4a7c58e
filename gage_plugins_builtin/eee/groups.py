"""The groups of a run in its Every Eval Ever 0.3.0 aggregate: each group of summary.json (lm-eval's
groups table: ``--tasks mmlu`` gives mmlu and its four categories) and metric it aggregates is an
``evaluation_results`` entry of its own, with summary.json's value, stderr and row count as they
are (the core aggregates them, :mod:`gage_eval.tasks.groups`; nothing is computed here).

EEE has no field for a result made of other results, so the entry says what it is in the fields
it has: ``metric_config.additional_details`` holds ``level: group``, the aggregation (weighted by
the tasks' row counts, or each task once), the tasks it counts (``tasks``, JSON), those left out
for want of a value (``missing``) and its direct ``members``; the tasks' own entries name the
groups they count in (``in_groups``), so a reader of the file can tell the overall from its parts
and count no row twice (EEE's advice: mark the level, give every part with its n). Its
``evaluation_result_id`` is ``<group>:<metric>`` (a group never shares a task's name). No instance
record links to it: its rows are its tasks' records, which link to their tasks' entries.
"""
from __future__ import annotations

import json
from typing import Any, Mapping

from gage_plugins_builtin.eee.v030 import MetricNotes, _metric_value, _strings, result_id

AGGREGATION = {True: "mean over all its tasks' rows (tasks weighted by their row counts)",
               False: "mean of its tasks' values (each task once)"}
STDERR_METHOD = {True: "pooled from the tasks' standard errors (lm-eval 0.4.13's pooled sample variance)",
                 False: "sqrt(sum of the tasks' squared standard errors) / number of tasks"}


def groups_of_tasks(summary: Mapping[str, Any]) -> dict[str, list[str]]:
    """Each task's groups in summary.json (those that count it), in the groups' order."""
    out: dict[str, list[str]] = {}
    for name, group in (summary.get("groups") or {}).items():
        for task in group.get("tasks") or ():
            out.setdefault(task, []).append(name)
    return out


def group_results(summary: Mapping[str, Any], notes: MetricNotes, evaluated: str | None) -> list[dict]:
    """The evaluation results of summary.json's groups, each metric of each group in order."""
    results = []
    for name, group in (summary.get("groups") or {}).items():
        for metric, stats in (group.get("metrics") or {}).items():
            res = _group_result(name, group, metric, stats, notes, evaluated)
            if res is not None:
                results.append(res)
    return results


def _group_result(name: str, group: Mapping[str, Any], metric: str, stats: Mapping[str, Any], notes: MetricNotes,
                  evaluated: str | None) -> dict | None:
    value = _metric_value(stats.get("value"))
    if value is None:  # no task had the metric: nothing to report (summary.json says which)
        return None
    by_size = bool(stats.get("weight_by_size", True))
    missing = list(stats.get("missing") or [])
    counted = [t for t in group.get("tasks") or () if t not in missing]
    config: dict[str, Any] = {
        "evaluation_description": f"{group.get('alias') or name}: {AGGREGATION[by_size]}",
        "metric_id": f"{name}.{metric}", "metric_name": metric,
        "lower_is_better": not bool(stats.get("higher_is_better", True)), "score_type": "continuous"}
    if counted and all(notes.proportion(t, metric) for t in counted):  # a mean of proportions is one
        config.update(metric_unit="proportion", min_score=0.0, max_score=1.0)
    else:
        config.update(min_score="-Infinity", max_score="Infinity")
    config["additional_details"] = _strings({
        "level": "group", "weight_by_size": json.dumps(by_size), "aggregation": AGGREGATION[by_size],
        "alias": group.get("alias"), "members": json.dumps(list(group.get("members") or [])),
        "tasks": json.dumps(counted), "missing": json.dumps(missing) if missing else None})
    uncertainty: dict[str, Any] = {}
    stderr = _metric_value(stats.get("stderr"))
    if stderr is not None:
        uncertainty["standard_error"] = {"value": stderr, "method": STDERR_METHOD[by_size]}
    if isinstance(stats.get("n"), int):
        uncertainty["num_samples"] = stats["n"]
    details: dict[str, Any] = {"score": value}
    if uncertainty:
        details["uncertainty"] = uncertainty
    details["details"] = _strings({"tasks_counted": stats.get("tasks")})
    out: dict[str, Any] = {"evaluation_result_id": result_id(name, metric), "evaluation_name": name,
                           "source_data": {"dataset_name": name, "source_type": "other",
                                           "additional_details": _strings({"group_of": json.dumps(counted)})}}
    if evaluated:
        out["evaluation_timestamp"] = evaluated
    out.update(metric_config=config, score_details=details)
    return out
