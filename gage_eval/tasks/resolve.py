"""Task names to validated specs for a run: ``--tasks`` (groups and tags expanded), each task's
folder read, ``--data`` swapped in for its dataset and the run config's per-task overrides applied."""
from __future__ import annotations

from typing import Any, Mapping

from gage_eval.api.errors import GageError, did_you_mean
from gage_eval.api.schemas import validation_errors
from gage_eval.config.options import RunOptions
from gage_eval.plugins import Registry
from gage_eval.tasks.spec import (TASK_FILE, TaskSpec, dataset_for_path, discover, metric_entries, read_task_file,
                                  read_task_yaml, with_dataset)


def resolve_tasks(options: RunOptions, registry: Registry) -> list[tuple[TaskSpec, str | None]]:
    """Each task's validated spec, or a placeholder and the reason its folder cannot run. Unknown
    names are a usage error; a broken task folder fails that task only."""
    from gage_eval.tasks.groups import discover_groups, expand

    found = discover(registry.task_paths, options.include_paths)
    names, groups = options.tasks, {}
    if any(t not in found for t in names):  # a group or tag: its tasks
        groups = discover_groups(found)
        names = expand(names, found, groups)
    unknown = [t for t in names if t not in found]
    if unknown:
        named = ", ".join(t + did_you_mean(t, [*found, *groups]) for t in unknown)
        raise GageError(f"unknown task(s): {named}; available: {', '.join(sorted(found)) or 'none'} "
                        f"(see `gage-eval tasks`){_unreadable(found)}")
    for flag, named in (("--data", options.data), ("--fewshot-data", options.fewshot_data)):
        extra = set(named) - set(names)
        if extra:
            raise GageError(f"{flag} names task(s) not in --tasks: {', '.join(sorted(extra))}")
    specs = []
    for name in names:
        src = found[name]
        try:
            spec = read_task_file(src.folder, src.origin, src.params)
            if name in options.data:
                split = (spec.dataset.get("args") or {}).get("split")
                spec = with_dataset(spec, dataset_for_path(options.data[name], split, registry))
            if options.task_overrides.get(name):
                spec = _with_overrides(spec, options.task_overrides[name], options.config_file)
        except GageError as exc:
            specs.append((TaskSpec(name=name, folder=src.folder, origin=src.origin, description="", dataset={},
                                   preprocessor={}, request={"kind": "unknown"}, metrics=[]), str(exc)))
            continue
        specs.append((spec, None))
    return specs


def _with_overrides(spec: TaskSpec, overrides: Mapping[str, Any], source: str | None) -> TaskSpec:
    """The run config's per-task ``metrics`` (replace the list) and ``generation`` (merged into the
    task's), checked against the task schema; ``limit`` is applied by :class:`TaskRun`."""
    from dataclasses import replace

    where = f"{source or 'run config'}: task {spec.name!r}"
    raw = dict(spec.raw)
    request = dict(spec.request)
    if overrides.get("generation") is not None:
        if not isinstance(overrides["generation"], Mapping):
            raise GageError(f"{where}: 'generation' must be a mapping of generation settings")
        request["generation"] = {**(request.get("generation") or {}), **overrides["generation"]}
        raw["request"] = request
    if overrides.get("metrics") is not None:
        raw["metrics"] = overrides["metrics"]
    problems = validation_errors(raw, "task")
    if problems:
        raise GageError(f"{where}: overrides make an invalid task: "
                        + "; ".join(f"key '{k or '<top>'}': {m}" for k, m in problems))
    primary = spec.primary_metric
    metrics = metric_entries(where, raw["metrics"])
    if overrides.get("metrics") is not None:
        names = [m if isinstance(m, str) else m.get("as", m["name"]) for m in metrics]
        primary = primary if primary in names else None
    return replace(spec, request=request, metrics=metrics, primary_metric=primary, raw=raw)


def _unreadable(found: Mapping[str, Any]) -> str:
    """The task files that could not be read (their task is known by its folder's name only): the
    name a user asked for may be inside one."""
    bad = []
    for path in dict.fromkeys(src.folder / TASK_FILE for src in found.values()):  # (a folder once, in order)
        try:
            if not isinstance(read_task_yaml(path), dict):
                bad.append(f"{path}: not a mapping of keys")
        except GageError as exc:
            bad.append(str(exc).splitlines()[0])
    return f"; task files that could not be read (a task in one is known by its folder's name): " \
           f"{'; '.join(bad)}" if bad else ""
