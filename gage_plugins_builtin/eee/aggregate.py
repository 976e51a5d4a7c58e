"""The Every Eval Ever 0.3.0 aggregate record of a run (``eee_aggregate.json``): each task's results
(:mod:`gage_plugins_builtin.eee.v030`, which says how a run maps onto the schema), then its groups'
(:mod:`gage_plugins_builtin.eee.groups`)."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Collection, Mapping

from gage_plugins_builtin.eee.groups import group_results, groups_of_tasks
from gage_plugins_builtin.eee.v030 import (EEE_VERSION, LIBRARY, MetricNotes, _epoch, _generation_config,
                                           _llm_scoring, _model_info, _result, _source_data, _strings,
                                           _task_file)


def build_aggregate(summary: Mapping[str, Any], *, notes: MetricNotes | None = None,
                    inputs: Mapping[str, Any] | None = None, retrieved: float | None = None,
                    self_deployed: Collection[str] = ()) -> dict:
    """The EEE 0.3.0 aggregate record of a run from its summary.json (and its inputs.json):
    every number is the summary's. ``self_deployed``: the backends that run the model themselves
    (their factories declare ``self_deployed``); the model and judge of any other are "unknown"."""
    notes = notes or MetricNotes()
    run = summary.get("run") or {}
    versions = run.get("versions") or {}
    evaluated = _epoch(run.get("created"))
    in_groups = groups_of_tasks(summary)
    results = []
    for task, entry in (summary.get("tasks") or {}).items():
        results.extend(_task_results(task, entry, run, notes, inputs or {}, evaluated, self_deployed,
                                     in_groups.get(task, [])))
    results.extend(group_results(summary, notes, evaluated))
    source_details = {"run_id": run.get("id"), "exit_status": run.get("exit_status"),
                      "interrupted": run.get("interrupted")}
    record: dict[str, Any] = {
        "schema_version": EEE_VERSION,
        "evaluation_id": str(run.get("id")),
    }
    if evaluated:
        record["evaluation_timestamp"] = evaluated
    record.update({
        "retrieved_timestamp": str(int(time.time() if retrieved is None else retrieved)),
        "source_metadata": {"source_name": LIBRARY, "source_type": "evaluation_run",
                            "source_organization_name": "unknown", "evaluator_relationship": "other",
                            "additional_details": _strings(source_details)},
        "model_info": _model_info(run.get("model") or {}, self_deployed),
        "eval_library": {"name": LIBRARY, "version": str(versions.get("gage_eval") or "unknown"),
                         "additional_details": _strings({"python": versions.get("python"),
                                                         "plugins": versions.get("plugins") or None})},
        "evaluation_results": results,
    })
    return record


def _task_results(task: str, entry: Mapping[str, Any], run: Mapping[str, Any], notes: MetricNotes,
                  inputs: Mapping[str, Any], evaluated: Any, self_deployed: Collection[str],
                  in_groups: list[str]) -> list[dict]:
    """One task's evaluation results: each metric (primary first), then each data_tag slice;
    ``in_groups``: the groups of summary.json that count the task, which its results name."""
    folder_name = (entry.get("source") or {}).get("folder")
    folder = Path(folder_name) if folder_name else None
    spec = _task_file(folder)
    source = _source_data(task, entry, inputs)
    generation = _generation_config(spec, folder, run.get("settings") or {}, run.get("command"))
    scoring = _llm_scoring(spec, folder, run["judge"], self_deployed) if run.get("judge") else None
    metrics = entry.get("metrics") or {}
    primary = entry.get("primary_metric")
    order = sorted(metrics, key=lambda m: m != primary)
    higher = {m: bool(metrics[m].get("higher_is_better", True)) for m in metrics}
    results: list[dict] = []

    def add(metric: str, stats: Mapping[str, Any], tag: tuple[str, str] | None) -> None:
        extra: dict[str, Any] = {}
        if scoring is not None and (task, metric) in notes.judged:
            extra["llm_scoring"] = scoring
        if in_groups and tag is None:  # the level of a part, beside its groups' results (eee.groups)
            extra["additional_details"] = {"level": "task", "in_groups": json.dumps(in_groups)}
        name = task if tag is None else f"{task}/{tag[0]}={tag[1]}"
        res = _result(task, metric, stats, higher=higher.get(metric, True), proportion=notes.proportion(task, metric),
                      name=name, source=source, tag=tag, evaluated=evaluated, extra=extra)
        if res is not None:
            if generation:
                res["generation_config"] = generation
            results.append(res)

    for metric in order:
        add(metric, metrics[metric], None)
    for key, by_value in (entry.get("slices") or {}).items():
        for value, slice_metrics in by_value.items():
            for metric in sorted(slice_metrics, key=lambda m: order.index(m) if m in order else len(order)):
                add(metric, slice_metrics[metric], (key, value))
    return results
