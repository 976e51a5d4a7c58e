"""``gage-eval rescore RUN_DIR -o NEW_DIR``: a task's metrics (and, when asked, its judge)
computed again from the model outputs a run stored, without loading the model.

Each record of ``RUN_DIR/samples/<task>.jsonl`` becomes a :class:`~gage_eval.engine.row.Row`
again: the sample (the record less ``predict_result`` and ``eval_result``), the model's output
(``predict_result``: text, per-choice log-likelihoods, unconditioned ones, usage...) and the
stored judge verdict (:mod:`gage_eval.engine.stored`, the stage that stands in for reading and
inference). The task's components come from its task.yaml, found as the run found it
(config.json: include_paths, data, task_overrides), and the rest is the engine's run
(:class:`Rescore` is an :class:`~gage_eval.engine.loop.Engine`): the judge stage, scoring, the
writers (the plugins' default ones too: report.html), the events and the summary. So, with
nothing changed, the new summary's tasks equal the original's (timings aside).

Rows that errored before scoring (reading, template, inference) are written as they were;
rows that errored at the metric stage are scored again; judge errors are kept unless the
judge runs again (``--judge-model``: each answer of a repeated row is judged on its own, and
the row's mean, pass@k and maj@k come from the new verdicts). ``--metrics`` replaces each
task's metric list.
"""
from __future__ import annotations

import os
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator

import click

from gage_eval.api.errors import GageError, OutputError
from gage_eval.api.runfolder import RunFolder
from gage_eval.api.secrets import redact
from gage_eval.config.options import RunOptions
from gage_eval.engine.executor import make_backend
from gage_eval.engine.judging import Judging, judge_chunk
from gage_eval.engine.loop import Engine
from gage_eval.engine.observers import Observers
from gage_eval.engine.progress import open_backends
from gage_eval.engine.row import Row
from gage_eval.engine.rowlog import RowLog
from gage_eval.engine.stored import StoredBackend, stored_rows
from gage_eval.engine.taskrun import TaskRun, _check_capabilities
from gage_eval.runfolder.records import EventLog
from gage_eval.runfolder.rundir import fingerprint
from gage_eval.tasks.resolve import resolve_tasks

def read_run(run_dir: Path) -> tuple[RunOptions, dict, dict]:
    """The run's options (config.json), its input hashes (inputs.json) and its summary (may be empty)."""
    from gage_eval.config.options import load_options
    from gage_eval.plugins import stored_option_keys

    folder = RunFolder(run_dir)
    if not run_dir.is_dir() or not folder.config_file.exists() or not folder.samples_dir.is_dir():
        raise GageError(f"rescore {run_dir}: not a gage-eval run folder (it needs config.json and samples/)")
    folder.check_idle("rescore")
    options = load_options(run_dir, None, stored_option_keys())
    inputs = folder.inputs(missing_ok=True)
    summary = folder.summary(missing_ok=True)
    return options, inputs, summary


def metric_entries(spec: Any, names: list[str], registry: Any) -> list:
    """``--metrics`` as task-file metric entries: a name the task lists (by its ``as`` name or its
    metric name) keeps the task's entry with its arguments; another registered metric is taken bare."""
    out: list = []
    for name in names:
        own = [m for m, label in zip(spec.metrics, _metric_names(spec.metrics)) if label == name]
        own = own or [m for m in spec.metrics if isinstance(m, dict) and m["name"] == name and "as" not in m]
        if own:
            out.append(own[0])
        elif name in registry.metrics:
            out.append(name)
        else:
            raise GageError(f"--metrics: unknown metric {name!r} for task {spec.name!r}; the task's: "
                            f"{', '.join(_metric_names(spec.metrics))}; registered: "
                            f"{', '.join(sorted(registry.metrics))}")
    return out


def _metric_names(entries: list) -> list[str]:
    return [m if isinstance(m, str) else m.get("as", m["name"]) for m in entries]


class StoredLog(RowLog):
    """A rescore's row errors go to events.jsonl only (its Engine is quiet); a task's end says
    nothing more (the run said it)."""

    def task_end(self, tr: TaskRun) -> None:
        pass


class Unobserved(Observers):
    """A rescore calls no observer hook (the run's observers heard its rows)."""

    def impls(self, hook: str) -> list:
        return []


class Rescore(Engine):
    """One rescore: the engine's run (:class:`~gage_eval.engine.loop.Engine`) of the tasks of
    ``run_dir`` into ``new_dir``, with the stored outputs (:mod:`gage_eval.engine.stored`) in
    place of reading the data and inferring. Its console shows only the results (the command
    prints them), no observer hears it, and every stored row is scored (no --fail-fast)."""

    row_log = StoredLog

    def __init__(self, run_dir: Path, new_dir: Path, metrics: list[str] | None, judge_model: str | None,
                 judge_args: dict, tasks: list[str] | None, command: str, quiet: bool = False):
        self.source_dir, self.source = run_dir, RunFolder(run_dir)
        was, self.source_inputs, self.source_summary = read_run(run_dir)
        if new_dir.resolve().is_relative_to(run_dir.resolve()):  # (its files are the record of the run)
            raise GageError(f"-o {new_dir}: inside the run folder {run_dir}; rescore writes a new folder outside it")
        stopped = (self.source_summary.get("run") or {"interrupted": "no summary.json"}).get("interrupted")
        if stopped:  # (said: the new run would pass for a whole one)
            print(f"gage-eval: warning: {run_dir} did not finish ({stopped}); only its stored rows are rescored "
                  f"(gage-eval --resume {shlex.quote(str(run_dir))} runs the rest)", file=sys.stderr)
        self.metrics, self.rejudge = metrics, judge_model is not None
        if tasks:
            unknown = [t for t in tasks if t not in was.tasks]
            if unknown:
                raise GageError(f"--task: {', '.join(unknown)} not in run {run_dir} (its tasks: "
                                f"{', '.join(was.tasks)})")
        chosen = list(tasks or was.tasks)
        new = replace(was, tasks=chosen, run_id=new_dir.name,
                      output_dir=str(new_dir.parent.resolve()), writers=[], command=command, quiet=quiet,
                      data={k: v for k, v in was.data.items() if k in chosen},
                      task_overrides={k: dict(v) for k, v in was.task_overrides.items() if k in chosen},
                      **({"judge_model": judge_model, "judge_args": judge_args} if self.rejudge else {}))
        super().__init__(new, new_dir)
        self.quiet, self.fail_fast = True, False
        self.started = {"rescored_from": str(run_dir.resolve()), "metrics": metrics,
                        "judge_model": new.judge_model if self.rejudge else None}
        self.observers = Unobserved(self.pm, self._clean)
        self._notify = self.observers.notify
        self.observed = set()
        self._gone: set[str] = set()
        self.now: dict = {}

    def _task_runs(self) -> list[TaskRun]:
        specs = self._specs()
        if self.metrics:
            for spec, failure in specs:
                if failure is None:
                    entries = metric_entries(spec, self.metrics, self.registry)
                    self.options.task_overrides.setdefault(spec.name, {})["metrics"] = entries
            specs = self._specs()
        runs = [TaskRun(spec, self.registry, self.options, failure) for spec, failure in specs]
        for tr in runs:
            samples = self.source.samples_file(tr.name)
            if not tr.failure and not os.path.lexists(samples):
                tr.failure = f"{samples} is missing: the run wrote no row"
            elif not tr.failure:  # a damaged samples file is refused before NEW_DIR is made: nothing is left
                for _ in self.source.records(tr.name):
                    pass
        self.now = self._fingerprints(runs)  # (its warnings said before the judge is built, as before)
        return runs

    def _specs(self) -> list:
        """Each task's spec as the run resolved it. The rows are not read again, so a --data file
        that is gone since leaves the task's own dataset in its place (its metrics are the same)."""
        try:
            specs = resolve_tasks(self.options, self.registry)
        except GageError as exc:  # (its settings are the run's: --include-path, --tasks were not given here)
            raise GageError(f"rescore: {self.source.config_file}: {exc}") from None
        for i, (spec, failure) in enumerate(specs):
            path = self.options.data.get(spec.name)
            if failure is not None and path is not None and not Path(path).exists():
                alone = replace(self.options, tasks=[spec.name], data={})
                specs[i] = resolve_tasks(alone, self.registry)[0]
                if specs[i][1] is None and spec.name not in self._gone:
                    self._gone.add(spec.name)
                    print(f"gage-eval: warning: {spec.name}: its data {path} is gone; the rows are not read "
                          f"again (the run stored them), so the task is rescored without it", file=sys.stderr)
        return specs

    def _fingerprints(self, runs: list[TaskRun]) -> dict:
        """The new run's inputs.json: each task folder as it is now (it builds the metrics) and the
        run's data hashes (the rows scored are the run's). A task folder changed since the run is
        warned about."""
        now = {}
        for tr in runs:
            if tr.failure:
                continue
            folder = tr.spec.folder
            before = self.source_inputs.get(tr.name) or {}
            now[tr.name] = {**fingerprint(folder, ()), "data": dict(before.get("data") or {})}
            was = before.get("task_folder") or {}
            if not was:
                print(f"gage-eval: warning: {tr.name}: {self.source.inputs_file} has no hash of its "
                      f"task folder, so {folder} cannot be checked against the one the run used", file=sys.stderr)
            elif was.get("sha256") != now[tr.name]["task_folder"]["sha256"] or was.get("path") != str(folder):
                where = f"{was.get('path')} is now {folder}" if was.get("path") != str(folder) else str(folder)
                print(f"gage-eval: warning: task folder {where} ({tr.name}) changed since run {self.source_dir}; "
                      f"the metrics are built from it as it is now", file=sys.stderr)
        return now

    def _backends(self, ready: list[TaskRun]) -> tuple[Any, Any]:
        """Stand-ins for the model (and for the judge, unless it runs again) as the run recorded them."""
        recorded = self.source_summary.get("run") or {}
        if not self.rejudge:
            judge = StoredBackend(recorded.get("judge"))
        else:
            judged = [tr for tr in ready if tr.judge is not None]
            if not judged:
                print("gage-eval: warning: --judge-model: no task of this rescore has a judge", file=sys.stderr)
            opts = self.options
            judge = make_backend(self.registry, opts.judge_model, opts.judge_args, opts.batch_size, opts.seed)
            _check_capabilities([tr.spec for tr in judged], judge, opts.judge_model, role="judge model")
        return StoredBackend(recorded.get("model"), judge_chunk(judge) if self.rejudge else 256), judge

    def _wrap(self, backend: Any, judge_backend: Any, ready: list[TaskRun], runs: list[TaskRun]) -> dict:
        return {"model": backend, "judge": judge_backend}  # (no plugin wraps them: nothing is sent to the model)

    def _inputs(self, ready: list[TaskRun]) -> None:
        """NEW_DIR, made now (it must not exist), and its inputs.json; the summary records no task inputs."""
        try:
            self.run_dir.mkdir(parents=True)
        except FileExistsError:
            raise GageError(f"-o {self.run_dir}: it exists; rescore writes a new run folder") from None
        except OSError as exc:
            raise OutputError(f"-o {self.run_dir}: cannot create it: {exc.strerror or exc}") from None
        self.folder.write_inputs(self.now)

    def _open(self, ready: list[TaskRun], backend: Any, judge_backend: Any, events: EventLog) -> float:
        return open_backends((("judge model", judge_backend, self.options.judge_model),), True) if self.rejudge else 0.0

    def _rows(self, tr: TaskRun, seen: Any) -> Iterator[tuple[Row, tuple]]:
        keep_judge = not (self.rejudge and tr.judge is not None)
        tr.order.lost()  # (rows numbered by their line in the stored file: the data's order is not known)
        for row in stored_rows(self.source, tr.name, self.rejudge, keep_judge):
            yield row, ()

    def _stages(self, tr: TaskRun, staged: dict, write: Any) -> tuple[None, Judging | None]:
        """No infer stage (each row carries its stored answer); the judge's when it runs again."""
        judged = self.rejudge and tr.judge is not None
        return None, Judging(staged["judge"], self.stops, write, self.secrets) if judged else None

    def _process(self, tr: TaskRun, window: list[Row], infer: None, judging: Judging | None, write: Any) -> None:
        """A window in its stored order (the samples file comes out in the run's order): the rows
        scored again are judged together first when the judge runs again."""
        if judging is not None:
            _judge_window(tr, window, judging)
        for row in window:
            write(row)

    def _write(self, tr: TaskRun, it: Row, log: Any, progress: Any) -> None:
        if "eval_result" not in it.sample:
            return super()._write(tr, it, log, progress)
        t_w = time.perf_counter()  # a row kept as stored: written as it was, no new event for its error
        self.writers.write(tr.name, it.sample)
        tr.timings["writing_s"] += time.perf_counter() - t_w
        tr.account(it.sample)


def _judge_window(tr: TaskRun, window: list[Row], judging: Judging) -> None:
    """The rows of ``window`` scored again, judged together in place: a repeated row's answers
    each on its own (as the run judged them), the row then carrying them in their order."""
    todo = [(pos, r) for pos, row in enumerate(window) if "eval_result" not in row.sample
            for r in (range(len(row.repeats)) if row.repeats else (None,))]
    judged = judging.judge(tr, [window[pos] if r is None else window[pos].repeats[r] for pos, r in todo])
    answers: dict[int, list[Row]] = {}
    for (pos, r), row in zip(todo, judged):
        if r is None:
            window[pos] = row
        else:
            answers.setdefault(pos, []).append(row)
    for pos, rows in answers.items():
        window[pos] = window[pos]._replace(repeats=tuple(rows))


def _command(run_dir: str, metrics: str | None, judge_model: str | None, judge_args: dict, tasks: tuple,
             output: str) -> str:
    """The command line as config.json records it: RUN_DIR as an absolute path (the run this one
    was rescored from), secret judge arguments masked."""
    parts = ["gage-eval", "rescore", str(Path(run_dir).resolve())]
    if metrics:
        parts += ["--metrics", metrics]
    if judge_model:
        parts += ["--judge-model", judge_model]
    if judge_args:
        parts += ["--judge-args", ",".join(f"{k}={v}" for k, v in redact(judge_args).items())]
    for t in tasks:
        parts += ["--task", t]
    parts += ["-o", output]
    return " ".join(shlex.quote(str(p)) for p in parts)


@click.command("rescore")
@click.argument("run_dir", type=click.Path(file_okay=True, dir_okay=True))
@click.option("--metrics", default=None, metavar="NAME,...",
              help="Score with these metrics instead of each task's (names as in task.yaml, or any registered "
                   "metric).")
@click.option("--judge-model", default=None, help="Run the judge again on this backend (default: keep the verdicts).")
@click.option("--judge-args", default=None, help="The judge backend's arguments: k=v,k2=v2 (with --judge-model).")
@click.option("--task", "tasks", multiple=True, metavar="T",
              help="Rescore only this task of the run (repeatable, or comma-separated).")
@click.option("--output", "-o", "output", required=True, metavar="NEW_DIR",
              help="The new run folder to write (must not exist).")
@click.option("--quiet", "-q", is_flag=True, help="Print no results table.")
def rescore_command(run_dir, metrics, judge_model, judge_args, tasks, output, quiet):
    """Compute the metrics of RUN_DIR again from its stored model outputs (and its judge, with
    --judge-model), without loading the model, into a new run folder NEW_DIR.

    Rows that errored before scoring keep their error; rows whose metric failed are scored
    again. With nothing changed, NEW_DIR/summary.json has the same task results as RUN_DIR's."""
    from gage_eval.config.kv import parse_kv

    try:
        if judge_args and not judge_model:
            raise GageError("--judge-args: give --judge-model too (without it the stored verdicts are kept)")
        names = [m.strip() for m in (metrics or "").split(",") if m.strip()]
        if metrics is not None and not names:
            raise GageError("--metrics: empty; give metric names, NAME[,NAME...]")
        task_names = [t.strip() for arg in tasks for t in arg.split(",") if t.strip()]
        args = parse_kv(judge_args, "--judge-args") if judge_args else {}
        command = _command(run_dir, metrics, judge_model, args, tuple(task_names), output)
        summary = Rescore(Path(run_dir), Path(output), names or None, judge_model, args, task_names or None,
                          command, quiet).run()
    except GageError as exc:
        click.echo(f"gage-eval: error: {exc}", err=True)
        sys.exit(exc.exit_code)
    if not quiet:
        from gage_eval.engine.summary import print_results

        print_results(summary, Path(output))
    status = summary["run"]["exit_status"]
    if status:
        sys.exit(status)
