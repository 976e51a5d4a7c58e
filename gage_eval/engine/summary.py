"""Summary arithmetic: stage timings with their totals and rates, and the exit status of a run
from its tasks' statuses."""
from __future__ import annotations

import platform
import sys
from datetime import datetime
from pathlib import Path
from typing import Any, Mapping

from gage_eval.api.errors import EXIT_OK, EXIT_ROW_ERRORS, EXIT_TASK_FAILED, PLUGIN_FAULTS, GageError, fault_text
from gage_eval.engine.interrupts import held, stop_reason
from gage_eval.runfolder.repro import reproducibility
from gage_eval.runfolder.rundir import changed_data

STAGES = ("dataset_materialization_s", "inference_s", "judge_s", "evaluation_s", "writing_s")


def derived_timings(stages: Mapping[str, float], n: int, wall: float | None = None) -> dict[str, float]:
    """Stage times plus the totals, throughputs and per-sample latencies of spec 004 section 9."""
    t = {k: float(stages.get(k, 0.0)) for k in STAGES}
    t["execution_runtime_s"] = t["inference_s"] + t["evaluation_s"]
    t["total_runtime_s"] = t["dataset_materialization_s"] + t["execution_runtime_s"] + t["writing_s"]
    if wall is not None:
        t["wall_runtime_s"] = wall
    if n:
        if wall:
            t["throughput_total_samples_per_s"] = n / wall
            t["latency_total_ms_per_sample"] = 1000 * wall / n
        if t["inference_s"] > 0:
            t["throughput_inference_samples_per_s"] = n / t["inference_s"]
            t["latency_inference_ms_per_sample"] = 1000 * t["inference_s"] / n
        if t["evaluation_s"] > 0:
            t["throughput_auto_eval_samples_per_s"] = n / t["evaluation_s"]
    return t



def exit_status(tasks: Mapping[str, Mapping[str, Any]]) -> int:
    """The run's exit status from its tasks' statuses: a failed task outranks errored rows."""
    statuses = {t["status"] for t in tasks.values()}
    if "failed" in statuses or not tasks:
        return EXIT_TASK_FAILED
    return EXIT_ROW_ERRORS if "errors" in statuses else EXIT_OK



def run_summary(*, run_id: str, options: Any, tasks: Mapping[str, Any], timings: Mapping[str, Any],
                model: Mapping[str, Any], judge: Mapping[str, Any] | None, interrupted: str | None,
                stopped: int | None, versions: Mapping[str, Any], created: str) -> dict:
    """summary.json (schemas/summary.schema.json): the run's settings, versions, timings and
    outcome, then each task's counts and metrics."""
    return {
        "run": {
            "id": run_id,
            "created": created,  # RFC 3339
            "command": options.command,
            "interrupted": interrupted,
            "exit_status": stopped if stopped is not None else exit_status(tasks),
            "versions": dict(versions),
            "model": dict(model),
            "judge": dict(judge) if judge is not None else None,
            "settings": options.as_dict(),
            "timings": {k: (round(v, 6) if isinstance(v, float) else v) for k, v in timings.items()},
        },
        "tasks": dict(tasks),
    }


def _stats(backend: Any) -> dict:
    """``{"stats": ...}`` when the backend counted something (Backend.stats); a plugin's backend
    without the method, or failing in it, adds nothing (a warning for the failure)."""
    stats = getattr(backend, "stats", None)
    if stats is None:
        return {}
    try:
        got = stats()
    except Exception as exc:
        print(f"gage-eval: warning: the model backend's stats() failed ({type(exc).__name__}: {exc}); "
              "summary.json has none", file=sys.stderr)
        return {}
    return {"stats": got} if isinstance(got, dict) and got else {}


def _settings(backend: Any, role: str) -> dict:
    """``{"settings": ...}``; a backend failing in settings() (or returning no mapping) still
    leaves a summary: its settings empty, ``settings_error`` saying why, a warning. The rows
    were scored, so the exit status is the tasks' as always."""
    try:
        got = backend.settings()
        if got is None:
            got = {}
        if not isinstance(got, Mapping):
            raise TypeError(f"it returned {type(got).__name__}, not a mapping")
        return {"settings": dict(got)}
    except PLUGIN_FAULTS as exc:
        why = f"settings() failed: {fault_text(exc)}"
        print(f"gage-eval: warning: the {role} backend's {why}; summary.json records none", file=sys.stderr)
        return {"settings": {}, "settings_error": why}


def versions(pm: Any) -> dict:
    """``run.versions``: gage-eval's, Python's and those of the plugins ``pm`` holds; the plugins
    that failed to load, with why (the run went on without them)."""
    from gage_eval import __version__
    from gage_eval.plugins import failed_plugins, plugin_versions

    return {"gage_eval": __version__, "python": platform.python_version(),
            "plugins": {name: version for name, version in plugin_versions().items() if pm.get_plugin(name) is not None},
            **({"plugins_failed": dict(failed_plugins)} if failed_plugins else {})}


def build_summary(*args: Any, **kwargs: Any) -> dict:
    """:func:`_build_summary` with Ctrl-C and SIGTERM held: one that comes while the summary is
    built (the data files hashed again, the bootstrap) is recorded in it, not left with none."""
    summary = None
    try:
        with held():
            summary = _build_summary(*args, **kwargs)
    except KeyboardInterrupt as stop:
        if summary is None:
            raise
        if summary["run"]["interrupted"] is None:
            summary["run"]["interrupted"], summary["run"]["exit_status"] = stop_reason(stop, str)
    return summary


def _build_summary(run_id: str, options: Any, runs: list, backends: tuple, wall: float, load_s: float,
                  interrupted: str | None, stopped: int | None, versions: Mapping[str, Any],
                  inputs: Mapping[str, Any] | None = None, sections: Mapping[str, Any] | None = None) -> dict:
    """The summary of a run from its task runs (``TaskRun``) and its (model, judge) backends;
    ``inputs``: the tasks' fingerprints (inputs.json) for ``run.reproducibility``; ``sections``:
    what backend wrappers counted, for ``run`` (the response cache's ``cache``)."""
    backend, judge_backend = backends
    for tr in runs:  # rows read from a file changed since inputs.json hashed it: refused as a resume would be
        changed = changed_data((inputs or {}).get(tr.name) or {})
        if changed:
            tr.failure = "; ".join(filter(None, (tr.failure, f"data file {', '.join(changed)} changed during the "
                                                 "run, so its rows may mix two versions; start a new run")))
    tasks = {tr.name: tr.summary(options.max_error_rate) for tr in runs}
    timings = derived_timings({k: sum(tr.timings[k] for tr in runs) for k in STAGES},
                              sum(tr.counts["total"] for tr in runs), wall)
    timings["model_load_s"] = load_s
    model = {"name": options.model, "model_id": backend.model_id, "args": options.model_args,
             **_settings(backend, "model"), **_stats(backend)}
    judge = ({"name": options.judge_model or options.model, "model_id": judge_backend.model_id,
              "args": options.judge_args, **_settings(judge_backend, "judge model")} if any(tr.judge for tr in runs)
             else None)
    summary = run_summary(run_id=run_id, options=options, tasks=tasks, timings=timings, model=model, judge=judge,
                          interrupted=interrupted, stopped=stopped, versions=versions,
                          created=datetime.now().astimezone().isoformat(timespec="seconds"))
    summary["run"]["reproducibility"] = reproducibility(options, runs, inputs)
    from gage_eval.tasks.groups import run_groups

    groups = run_groups(options, tasks)
    if groups:  # --tasks named a group: its score beside its tasks' (gage_eval.tasks.groups)
        summary["groups"] = groups
    summary["run"].update(sections or {})
    return summary


def _counted(task: Mapping[str, Any]) -> dict[str, dict[str, int]]:
    """The sections backend wrappers counted for a task (api.running.Tally: the response cache's
    hits and misses), which follow ``timings`` in its summary; those that counted nothing left out."""
    keys = list(task)
    after = keys[keys.index("timings") + 1:] if "timings" in keys else []
    return {k: task[k] for k in after if isinstance(task[k], Mapping) and task[k]
            and all(type(n) is int for n in task[k].values()) and any(task[k].values())}


def _fmt(x: Any) -> str:
    return "-" if x is None else (f"{x:.4f}" if isinstance(x, float) else str(x))


def _print_table(rows: list[tuple[str, ...]]) -> None:
    import click

    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


def print_results(summary: dict, run_dir: Path) -> None:
    """The results table and the counts a finished run (or rescore) prints."""
    import click

    from gage_eval.api.errors import EXIT_MEANING

    shots = str((summary["run"].get("settings") or {}).get("num_fewshot") or 0)  # lm-eval's n-shot (none given: 0)
    rows = [("task", "metric", "value", "stderr", "n", "n-shot")]
    for name, task in summary["tasks"].items():
        for metric, entry in task["metrics"].items():
            rows.append((name, metric, _fmt(entry["value"]), _fmt(entry["stderr"]), str(entry["n"]), shots))
    _print_table(rows)
    if summary.get("groups"):  # lm-eval's "Groups" table: each group over all the tasks under it
        rows = [("group", "metric", "value", "stderr", "n")]
        for name, group in summary["groups"].items():
            label = "  " * group.get("depth", 0) + ("- " if group.get("depth") else "") + group.get("alias", name)
            for metric, entry in group["metrics"].items():
                rows.append((label, metric, _fmt(entry["value"]), _fmt(entry["stderr"]), str(entry["n"])))
        _print_table(rows)
    for name, task in summary["tasks"].items():
        c = task["counts"]
        line = (f"{name}: {c['total']} rows, {c['scored']} scored, {c['errored']} errored"
                + (f" ({c['judge_errors']} judge errors)" if c.get("judge_errors") else ""))
        line += "".join(f"; {section} " + ", ".join(f"{n} {key.replace('_', ' ')}" for key, n in part.items())
                        for section, part in _counted(task).items())
        if task.get("status") == "failed":
            line += f"; FAILED: {task['failure']}"
        elif task.get("status") == "errors":
            line += "; rows errored (see samples/ or events.jsonl)"
        click.echo(line)
    t = summary["run"]["timings"]
    status = summary["run"].get("exit_status", 0)
    click.echo(f"wall time {t['wall_runtime_s']:.1f}s; outputs in {run_dir}"
               + (f"; exit status {status} ({EXIT_MEANING.get(status, '')})" if status else ""))


def kept_settings(summary: dict, run_dir: Path, quiet: bool) -> dict:
    """A resume that loaded no model (no row was left to run) says so, and keeps the settings the
    model resolved when it loaded (dtype, device, versions) as the stored summary.json has them."""
    from gage_eval.api.runfolder import RunFolder
    from gage_eval.engine.progress import status

    if not summary["run"]["interrupted"] and all(t.get("status") != "failed" for t in summary["tasks"].values()):
        status("every row was written before: nothing left to run, the model not loaded", quiet=quiet)
    try:
        old = RunFolder(run_dir).summary(missing_ok=True).get("run") or {}
    except GageError:  # (a stored summary.json the run folder's reader refuses: nothing kept from it)
        return summary
    for role in ("model", "judge"):
        new, was = summary["run"].get(role), old.get(role)
        if isinstance(new, dict) and isinstance(was, dict) and isinstance(was.get("settings"), dict):
            new["settings"] = {**was["settings"], **new.get("settings", {})}
    return summary
