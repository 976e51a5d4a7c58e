"""``gage-eval merge RUN_DIR ... -o MERGED``: the shards of one run (``--shard I/N``) joined into
one run folder whose summary is computed again from every record, as the unsharded run's is.

Refused, naming what: a folder that is not a finished run, shards of different settings or
inputs, a missing or repeated shard, a shard whose records are not the ones its own summary
counts, a record in a shard its sample id does not hash to, a sample id written twice, an
output folder that exists or lies inside a shard. The merged run is written into a temporary
folder beside ``-o`` and renamed into place at the end: a refusal leaves nothing behind.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import shutil
import sys
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

import click

from gage_eval.api.errors import EXIT_INTERRUPTED, GageError, OutputError
from gage_eval.api.events import RunStart, TaskDone
from gage_eval.engine.executor import placement_args
from gage_eval.engine.idset import IdSet
from gage_eval.engine.interrupts import sigterm_interrupts
from gage_eval.config.options import RunOptions, in_shard, load_options, parse_shard
from gage_eval.plugins import load_plugins, stored_option_keys
from gage_eval.api.runfolder import RunFolder
from gage_eval.api.secrets import redact
from gage_eval.engine.summary import STAGES, derived_timings, exit_status

# settings shards may differ in: where and how each ran, not what it computed (the plugins' options
# say for themselves: those not resume_checked)
FREE = ("shard", "run_id", "output_dir", "command", "quiet", "writers", "config_file", "fail_fast", "max_error_rate",
        "executor", "plugin_options")


def _shard(run_dir: Path) -> tuple[RunOptions, dict, dict]:
    """A shard's settings, summary and inputs, or a one-line refusal naming the folder."""
    folder = RunFolder(run_dir)
    if not folder.config_file.is_file():
        raise GageError(f"merge: {run_dir} is not a gage-eval run folder (no config.json)")
    folder.check_idle("merge:")
    options = load_options(run_dir, plugin_keys=stored_option_keys())
    try:
        summary = folder.summary(check=False)  # (its own checks below, in merge's words)
        inputs = folder.inputs(missing_ok=False)
    except GageError as exc:
        raise GageError(f"merge: {run_dir}: no readable summary.json/inputs.json ({exc}); finish the run "
                        f"first (gage-eval --resume {shlex.quote(str(run_dir))})") from None
    wrong = _wrong_shape(summary)
    if wrong:
        raise GageError(f"merge: {folder.summary_file}: {wrong}; not a summary gage-eval wrote")
    if summary["run"].get("interrupted"):
        raise GageError(f"merge: {run_dir} did not finish ({summary['run']['interrupted']}); "
                        f"finish it first: gage-eval --resume {shlex.quote(str(run_dir))}")
    if not options.shard:
        raise GageError(f"merge: {run_dir} is not a shard (it was run without --shard I/N)")
    options = replace(options, shard=parse_shard(options.shard, f"merge: {folder.config_file}: key 'shard'"))
    return options, summary, inputs


def _wrong_shape(summary: Any) -> str | None:
    """What of a shard's summary.json merge reads has the wrong type (None when all is right)."""
    if not isinstance(summary, dict) or not isinstance(summary.get("run"), dict) \
            or not isinstance(summary.get("tasks"), dict):
        return "expected an object with objects 'run' and 'tasks'"
    run = summary["run"]
    if not isinstance(run.get("timings") or {}, dict) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in (run.get("timings") or {}).values()):
        return "key 'run.timings' is not an object of numbers"
    if not isinstance(run.get("model") or {}, dict) or not isinstance(run.get("interrupted") or "", str):
        return "key 'run.model' is not an object or 'run.interrupted' not a string"
    for name, task in summary["tasks"].items():
        counts = task.get("counts") if isinstance(task, dict) else None
        if not isinstance(counts, dict) or not all(type(counts.get(k, 0)) is int for k in COUNTS):
            return f"key 'tasks.{name}.counts' is not an object of whole numbers"
        if not isinstance(task.get("failure") or "", str) or not isinstance(task.get("status") or "", str):
            return f"key 'tasks.{name}.failure' or 'tasks.{name}.status' is not a string"
    return None


def _computing(args: dict) -> dict:
    """Model arguments less where the model ran (an executor's: Ray's replicas and their resources)."""
    where = placement_args(load_plugins()[1], placement=True)
    return {k: v for k, v in args.items() if k not in where}


def _computing_options(opts: RunOptions) -> dict:
    """The plugins' options that change what a run computes: all but those declared not
    ``resume_checked`` (an option no loaded plugin declares counts)."""
    free = {key for key, reg in load_plugins()[1].options.items() if not reg.option.resume_checked}
    return {k: v for k, v in opts.plugin_options.items() if k not in free}


def check_shards(run_dirs: list[Path]) -> list[tuple[Path, RunOptions, dict, dict]]:
    """The shards in shard order, after checking they are one run's complete set."""
    shards = [(d, *_shard(d)) for d in run_dirs]
    first_dir, first, _, first_inputs = shards[0]
    count = int(first.shard.partition("/")[2])
    for d, opts, _, inputs in shards[1:]:
        for name in (f.name for f in first.__dataclass_fields__.values()):
            if name in FREE or name in ("model_args", "judge_args"):
                continue
            if getattr(opts, name) != getattr(first, name):
                raise GageError(f"merge: {d} and {first_dir} differ in {name} ({getattr(opts, name)!r} vs "
                                f"{getattr(first, name)!r}); shards of one run share every setting")
        for name in ("model_args", "judge_args"):  # compared as stored (secrets masked)
            if _computing(redact(getattr(opts, name))) != _computing(redact(getattr(first, name))):
                raise GageError(f"merge: {d} and {first_dir} differ in {name}; shards of one run share every setting")
        if int(opts.shard.partition("/")[2]) != count:
            raise GageError(f"merge: {d} is shard {opts.shard} but {first_dir} is shard {first.shard}")
        mine, theirs = _computing_options(opts), _computing_options(first)
        for key in sorted(mine.keys() | theirs.keys()):
            if mine.get(key) != theirs.get(key):
                raise GageError(f"merge: {d} and {first_dir} differ in {key} ({mine.get(key)!r} vs "
                                f"{theirs.get(key)!r}); shards of one run share every setting")
        if inputs != first_inputs:
            raise GageError(f"merge: {d} and {first_dir} read different task folders or data (inputs.json differ)")
    seen: dict[int, Path] = {}
    for d, opts, _, _ in shards:
        index = int(opts.shard.partition("/")[0])
        if index in seen:
            if seen[index].resolve() == d.resolve():
                raise GageError(f"merge: {d} is given twice")
            raise GageError(f"merge: shard {opts.shard} is given twice: {seen[index]} and {d}")
        seen[index] = d
    missing = [f"{i}/{count}" for i in range(count) if i not in seen]
    if missing:
        raise GageError(f"merge: shard(s) {', '.join(missing)} missing (given: "
                        f"{', '.join(sorted(o.shard for _, o, _, _ in shards))})")
    return sorted(shards, key=lambda s: int(s[1].shard.partition("/")[0]))


def merge(run_dirs: list[Path], out: Path, command: str = "") -> dict:
    """Write the merged run folder ``out``; returns its summary."""
    from gage_eval.plugins import load_plugins
    from gage_eval.engine.taskrun import TaskRun
    from gage_eval.tasks.resolve import resolve_tasks
    from gage_eval.runfolder.writers import SamplesWriter, SummaryWriter, WriterSet, plugin_writers

    shards = check_shards(run_dirs)
    _check_output(out, [d for d, *_ in shards])
    _, first, first_summary, inputs = shards[0]
    options = replace(first, shard=None, run_id=out.name, output_dir=str(out.parent), command=command, writers=[])
    _, registry = load_plugins()
    try:
        specs = resolve_tasks(options, registry)
    except GageError as exc:  # (its settings are the shards': --include-path, --tasks were not given here)
        raise GageError(f"merge: {RunFolder(shards[0][0]).config_file}: {exc}") from None
    runs = [TaskRun(spec, registry, options, failure) for spec, failure in specs]
    made, tmp = _temporary(out)
    try:
        RunFolder(tmp).write_config(redact(options.as_dict()))
        RunFolder(tmp).write_inputs(inputs)
        writers = WriterSet([SamplesWriter(tmp)], plugin_writers(registry, [], merged=True))
        model = first_summary["run"].get("model") or {}
        writers.start(RunStart(out.name, tmp, tuple(options.tasks), options.model, model.get("model_id", ""), False,
                                        options.plugin_options))
        for tr in runs:
            _merge_task(tr, shards, writers, out.name)
        summary = _summary(out, options, runs, shards)
        writers.end(summary)
        SummaryWriter(tmp).end(summary)
        _check_output(out, [])  # (made meanwhile: a rename would replace an empty folder)
        os.rename(tmp, out)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        _remove(made)
        if isinstance(exc, OSError):
            raise OutputError(f"merge: cannot write {out}: {exc.strerror or exc}; nothing was kept: fix that "
                              f"and merge again") from None
        if isinstance(exc, OutputError):
            raise OutputError(f"merge: {str(exc).partition('; ')[0]}; nothing of {out} was kept: fix that "
                              f"and merge again") from None
        raise
    return summary


def _check_output(out: Path, shard_dirs: list[Path]) -> None:
    if out.exists() or out.is_symlink():
        raise GageError(f"merge: {out} already exists; give a new folder")
    where = out.resolve()
    for d in shard_dirs:
        if where.is_relative_to(d.resolve()):
            raise GageError(f"merge: -o {out} is inside the shard {d}; give a folder outside the shards")


def _temporary(out: Path) -> tuple[list[Path], Path]:
    """The folders made for ``out``'s parent (removed again on a refusal) and a new temporary
    folder beside ``out``, renamed to it once everything is written."""
    made = [p for p in (out.parent, *out.parent.parents) if not p.exists()]  # the deepest first
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.parent / f".{out.name}.merging-{os.getpid()}-{secrets.token_hex(4)}"
        tmp.mkdir()
    except OSError as exc:
        _remove(made)
        raise OutputError(f"merge: cannot write {out}: {exc.strerror or exc}") from None
    return made, tmp


def _remove(folders: list[Path]) -> None:
    for folder in folders:
        with contextlib.suppress(OSError):
            folder.rmdir()


def _merge_task(tr: Any, shards: list, writers: Any, run_id: str) -> None:
    """Every shard's records of the task, each checked to be in its shard and once; then each
    shard's record counts against its own summary (a short or padded samples file)."""
    writers.task_start(tr.name)
    seen, found = IdSet(), []
    try:
        for d, opts, summary, _ in shards:
            path, before = RunFolder(d).samples_file(tr.name), dict(tr.counts)
            for lineno, record in RunFolder(d).records(tr.name):  # (confined to the shard's folder)
                _check_placed(record, f"{path}:{lineno}", opts.shard, shards, seen)
                writers.write(tr.name, record)
                tr.account(record)
            found.append((d, path, summary, {k: tr.counts.get(k, 0) - before.get(k, 0) for k in COUNTS}))
    finally:
        seen.close()
    for d, path, summary, counted in found:
        task = summary["tasks"].get(tr.name)
        if task is None:
            raise GageError(f"merge: {d / 'summary.json'} has no task {tr.name!r}; the shard did not run it")
        for key, n in counted.items():
            if task["counts"].get(key, 0) != n:
                raise GageError(f"merge: {d}: task {tr.name!r}: samples/{path.name} holds {n} records ({key}) "
                                f"but the shard's summary.json counts {task['counts'].get(key, 0)}; the shard "
                                f"is incomplete or was changed: run it again")
        failure = task.get("failure")
        if task.get("status") == "failed" and failure and not failure.startswith(COUNTED):
            tr.failure = tr.failure or f"shard {d}: {failure}"  # the task could not run there (not a count)
    tr.ended = True
    result = tr.summary()
    writers.task_end(TaskDone(run_id, tr.name, dict(tr.counts), result["metrics"]))


def _check_placed(record: dict, where: str, shard: str, shards: list, seen: IdSet) -> None:
    """A record's sample id hashes to the shard that holds it (as ``--shard`` chose its rows), once."""
    sid = record.get("id")
    if not isinstance(sid, str) or not sid:
        raise GageError(f"merge: {where}: key 'id' is {json.dumps(sid)}, not a sample id; not a record "
                        f"gage-eval wrote")
    if not in_shard(sid, shard):
        owner = next(f"{o.shard} ({d})" for d, o, _, _ in shards if in_shard(sid, o.shard))
        raise GageError(f"merge: {where}: sample {sid!r} belongs to shard {owner}, not to this shard, "
                        f"{shard}; a record was moved or copied between shards")
    if not seen.add(sid):
        raise GageError(f"merge: {where}: sample {sid!r} is written twice in this shard; an id is one row")


# the counts a task's records determine (TaskRun.account); others (cache hits, ...) are not in them
COUNTS = ("total", "scored", "errored", "skipped", "judge_errors", "secrets_scrubbed")

# a shard's task "failed" for these because of its own rows (a shard may hold none): the merged
# counts decide again
COUNTED = ("no rows:", "all ", "no row was scored")


def _summary(out: Path, options: RunOptions, runs: list, shards: list) -> dict:
    """The first shard's run section (model, versions, reproducibility) with this run's id, the
    stage times summed over the shards, and every task's summary computed from all its rows."""
    run = dict(shards[0][2]["run"])
    tasks = {tr.name: tr.summary(options.max_error_rate) for tr in runs}
    stages = {k: sum((s[2]["run"].get("timings") or {}).get(k, 0.0) for s in shards) for k in STAGES}
    wall = max((s[2]["run"].get("timings") or {}).get("wall_runtime_s", 0.0) for s in shards)
    timings = derived_timings(stages, sum(tr.counts["total"] for tr in runs), wall)
    timings["model_load_s"] = max((s[2]["run"].get("timings") or {}).get("model_load_s", 0.0) for s in shards)
    run.update(id=out.name, created=datetime.now().astimezone().isoformat(timespec="seconds"),
               command=options.command, interrupted=None, exit_status=exit_status(tasks),
               settings=redact(options.as_dict()),
               timings={k: (round(v, 6) if isinstance(v, float) else v) for k, v in timings.items()})
    run.pop("cache", None)
    each = [(s[2]["run"].get("model") or {}).get("stats") for s in shards]
    if any(each):  # what each shard's backend counted, in shard order (not the first shard's alone)
        run["model"] = {**(run.get("model") or {}), "stats": {"shards": [e or {} for e in each]}}
    return {"run": run, "tasks": tasks}


@click.command("merge")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(file_okay=False, path_type=Path))
@click.option("-o", "--output", "output", required=True, type=click.Path(path_type=Path),
              help="The merged run folder to write (must not exist).")
def merge_command(run_dirs: tuple[Path, ...], output: Path) -> None:
    """Join the shards of one run (each run with --shard I/N) into one run folder, its summary
    computed again from every record: the same as the unsharded run's."""
    command = " ".join(["gage-eval"] + [shlex.quote(a) for a in sys.argv[1:]])
    try:
        with sigterm_interrupts():  # (so SIGTERM, as Ctrl-C, removes the temporary folder)
            summary = merge(list(run_dirs), output, command)
    except KeyboardInterrupt as exc:
        click.echo(f"gage-eval: merge: {str(exc) or 'interrupted'}; nothing of {output} was kept", err=True)
        raise SystemExit(getattr(exc, "exit_status", EXIT_INTERRUPTED)) from None
    for name, task in summary["tasks"].items():
        c = task["counts"]
        values = ", ".join(f"{m} {v['value']:.4f}" for m, v in task["metrics"].items() if v.get("value") is not None)
        click.echo(f"{name}: {c['total']} rows, {c['scored']} scored, {c['errored']} errored; {values}")
    click.echo(f"merged {len(run_dirs)} shards into {output}")
    if summary["run"]["exit_status"]:
        raise SystemExit(summary["run"]["exit_status"])
