"""``gage-eval rescore RUN_DIR -o NEW_DIR``: a task's metrics (and, when asked, its judge)
computed again from the model outputs a run stored, without loading the model.

Each record of ``RUN_DIR/samples/<task>.jsonl`` becomes a :class:`~gage_eval.engine.row.Row`
again: the sample (the record less ``predict_result`` and ``eval_result``), the model's output
(``predict_result``: text, per-choice log-likelihoods, unconditioned ones, usage...) and the
stored judge verdict. The task's components come from its task.yaml, found as the run found
it (config.json: include_paths, data, task_overrides), and each row goes through
:func:`~gage_eval.engine.scoring.finish_record` and the core's writers, as in a run. So, with
nothing changed, the new summary's tasks equal the original's (timings aside).

Rows that errored before scoring (reading, template, inference) are written as they were;
rows that errored at the metric stage are scored again; judge errors are kept unless the
judge runs again (``--judge-model``). ``--metrics`` replaces each task's metric list.
"""
from __future__ import annotations

import os
import platform
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator, Mapping

import click

from gage_eval import __version__
from gage_eval.api.backend import ModelOutput
from gage_eval.api.errors import GageError, OutputError
from gage_eval.api.events import RunStart, TaskDone
from gage_eval.config.options import RunOptions
from gage_eval.api.runfolder import RunFolder
from gage_eval.engine.row import Answer, Judgement, Row
from gage_eval.runfolder.records import EventLog
from gage_eval.api.secrets import mask, redact, strip_credentials

STORED = ("predict_result", "eval_result")  # the parts of a record that are not the sample


class StoredVerdict:
    """A judge verdict read back from a record (``eval_result.judge``), written as it was."""

    def __init__(self, data: Mapping[str, Any]):
        self.data = dict(data)
        self.error = self.data.get("error")
        self.score = self.data.get("score")

    def to_dict(self) -> dict:
        return dict(self.data)


class StoredBackend:
    """Stands in for a backend that is not loaded: its id and settings as the run's summary recorded them."""

    def __init__(self, recorded: Mapping[str, Any] | None):
        recorded = recorded or {}
        self.model_id = recorded.get("model_id") or "unknown"
        self._settings = recorded.get("settings") or {}
        self._recorded_stats = recorded.get("stats") or {}
        self.secrets: tuple[str, ...] = ()

    def settings(self) -> dict:
        return dict(self._settings)

    def stats(self) -> dict:  # what the run's backend counted (rescoring sends no request)
        return dict(self._recorded_stats)

    def close(self) -> None:
        pass


def read_run(run_dir: Path) -> tuple[RunOptions, dict, dict]:
    """The run's options (config.json), its input hashes (inputs.json) and its summary (may be empty)."""
    from gage_eval.config.options import load_options
    from gage_eval.plugins import stored_option_keys

    folder = RunFolder(run_dir)
    if not run_dir.is_dir() or not folder.config_file.exists() or not folder.samples_dir.is_dir():
        raise GageError(f"rescore {run_dir}: not a gage-eval run folder (it needs config.json and samples/)")
    options = load_options(run_dir, None, stored_option_keys())
    inputs = folder.inputs(missing_ok=True)
    summary = folder.summary(missing_ok=True)
    return options, inputs, summary


def metric_entries(spec: Any, names: list[str], registry: Any) -> list:
    """``--metrics`` as task-file metric entries: a name the task lists (by its ``as`` name or its
    metric name) keeps the task's entry with its arguments; another registered metric is taken bare."""
    out: list = []
    for name in names:
        own = [m for m in spec.metrics
               if (m if isinstance(m, str) else m.get("as", m["name"])) == name]
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


def model_output_of(entry: Mapping[str, Any]) -> dict:
    """The model output a metric saw, from a stored ``predict_result`` entry (the inverse of
    :func:`gage_eval.engine.scoring.predict_entry`)."""
    out = {k: v for k, v in entry.items() if k not in ("index", "message", "usage")}
    content = ((entry.get("message") or {}).get("content") or [])
    if (entry.get("message") or {}).get("tool_calls"):
        out["tool_calls"] = entry["message"]["tool_calls"]
    out["text"] = "".join(seg.get("text") or "" for seg in content
                          if isinstance(seg, Mapping) and seg.get("type") == "text")
    usage = entry.get("usage")
    if isinstance(usage, Mapping):
        out["input_tokens"] = usage.get("input_tokens")
        out["output_tokens"] = usage.get("output_tokens")
    return out


def row_of(record: dict, index: int, locator: str, keep_judge: bool) -> Row:
    """The row a stored record came from, with its stored answer (and verdict), ready to be
    scored (and judged) again: the infer stage of a rescore."""
    from gage_eval.engine.taskrun import scrubbed_count

    sample = {k: v for k, v in record.items() if k not in STORED}
    result = record.get("eval_result") or {}
    err = result.get("error") or {}
    pred = record.get("predict_result") or []
    # (finish_record writes predict_result from the output; the stored one replaces it)
    answer = Answer(ModelOutput() if pred else None, None, model_output_of(pred[0]) if pred else {},
                    scrubbed_count(result))  # the model's replies masked then (the judge's go with its verdict)
    judgement = (Judgement(StoredVerdict(result["judge"]))
                 if keep_judge and result.get("judge") is not None else None)
    return Row(index, err.get("locator") or locator, sample, answer=answer, judgement=judgement)


def kept_as_is(record: Mapping[str, Any], rejudge: bool) -> bool:
    """A row that errored where no score can be made from what is stored (reading, template,
    inference; the judge, unless it runs again)."""
    err = (record.get("eval_result") or {}).get("error")
    if not err:
        return False
    stage = err.get("stage")
    return not (stage == "metric" or (stage == "judge" and rejudge and record.get("predict_result")))


class Rescore:
    """One rescore: the source run, the new folder, the tasks and what changes."""

    def __init__(self, run_dir: Path, new_dir: Path, metrics: list[str] | None, judge_model: str | None,
                 judge_args: dict, tasks: list[str] | None, command: str, quiet: bool = False):
        from gage_eval.plugins import load_plugins

        self.run_dir, self.new_dir = run_dir, new_dir
        self.pm, self.registry = load_plugins()
        self.options, self.inputs, self.summary = read_run(run_dir)
        self.metrics, self.rejudge = metrics, judge_model is not None
        self.quiet = quiet
        opts = self.options
        if tasks:
            unknown = [t for t in tasks if t not in opts.tasks]
            if unknown:
                raise GageError(f"--task: {', '.join(unknown)} not in run {run_dir} (its tasks: "
                                f"{', '.join(opts.tasks)})")
        chosen = list(tasks or opts.tasks)
        self.new = replace(opts, tasks=chosen, run_id=new_dir.name,
                           output_dir=str(new_dir.parent.resolve()), writers=[], command=command, quiet=quiet,
                           data={k: v for k, v in opts.data.items() if k in chosen},
                           task_overrides={k: dict(v) for k, v in opts.task_overrides.items() if k in chosen},
                           **({"judge_model": judge_model, "judge_args": judge_args} if self.rejudge else {}))
        self.secrets: tuple[str, ...] = ()
        self._gone: set[str] = set()

    def _clean(self, text: str) -> str:
        return strip_credentials(mask(text, self.secrets))

    def _task_runs(self) -> list:
        from gage_eval.engine.taskrun import TaskRun

        specs = self._specs()
        if self.metrics:
            for spec, failure in specs:
                if failure is None:
                    entries = metric_entries(spec, self.metrics, self.registry)
                    self.new.task_overrides.setdefault(spec.name, {})["metrics"] = entries
            specs = self._specs()
        runs = [TaskRun(spec, self.registry, self.new, failure) for spec, failure in specs]
        for tr in runs:
            samples = RunFolder(self.run_dir).samples_file(tr.name)
            if not tr.failure and not os.path.lexists(samples):
                tr.failure = f"{samples} is missing: the run wrote no row"
            elif not tr.failure:  # a damaged samples file is refused before NEW_DIR is made: nothing is left
                for _ in self.records(tr.name):
                    pass
        return runs

    def _specs(self) -> list:
        """Each task's spec as the run resolved it. The rows are not read again, so a --data file
        that is gone since leaves the task's own dataset in its place (its metrics are the same)."""
        from gage_eval.engine.taskrun import resolve_tasks

        specs = resolve_tasks(self.new, self.registry)
        for i, (spec, failure) in enumerate(specs):
            path = self.new.data.get(spec.name)
            if failure is not None and path is not None and not Path(path).exists():
                alone = replace(self.new, tasks=[spec.name], data={})
                specs[i] = resolve_tasks(alone, self.registry)[0]
                if specs[i][1] is None and spec.name not in self._gone:
                    self._gone.add(spec.name)
                    print(f"gage-eval: warning: {spec.name}: its data {path} is gone; the rows are not read "
                          f"again (the run stored them), so the task is rescored without it", file=sys.stderr)
        return specs

    def _inputs(self, runs: list) -> dict:
        """The new run's inputs.json: each task folder as it is now (it builds the metrics) and the
        run's data hashes (the rows scored are the run's). A task folder changed since the run is
        warned about."""
        from gage_eval.runfolder.rundir import folder_digest

        now = {}
        for tr in runs:
            if tr.failure:
                continue
            folder = tr.spec.folder
            before = self.inputs.get(tr.name) or {}
            now[tr.name] = {"task_folder": {"path": str(folder), "sha256": folder_digest(folder)},
                            "data": dict(before.get("data") or {})}
            was = before.get("task_folder") or {}
            if not was:
                print(f"gage-eval: warning: {tr.name}: {RunFolder(self.run_dir).inputs_file} has no hash of its task "
                      f"folder, so {folder} cannot be checked against the one the run used", file=sys.stderr)
            elif was.get("sha256") != now[tr.name]["task_folder"]["sha256"] or was.get("path") != str(folder):
                where = f"{was.get('path')} is now {folder}" if was.get("path") != str(folder) else str(folder)
                print(f"gage-eval: warning: task folder {where} ({tr.name}) changed since run {self.run_dir}; "
                      f"the metrics are built from it as it is now", file=sys.stderr)
        return now

    def _judge_backend(self, runs: list) -> Any:
        from gage_eval.engine.taskrun import _check_capabilities, make_backend

        judged = [tr for tr in runs if not tr.failure and tr.judge is not None]
        if not self.rejudge:
            return StoredBackend((self.summary.get("run") or {}).get("judge"))
        if not judged:
            print("gage-eval: warning: --judge-model: no task of this rescore has a judge", file=sys.stderr)
        opts = self.new
        backend = make_backend(self.registry, opts.judge_model, opts.judge_args, opts.batch_size, opts.seed)
        _check_capabilities([tr.spec for tr in judged], backend, opts.judge_model, role="judge model")
        self.secrets = tuple(getattr(backend, "secrets", ()) or ())
        return backend

    def run(self) -> dict:
        from gage_eval.plugins import plugin_versions
        from gage_eval.engine.summary import build_summary
        from gage_eval.runfolder.writers import InstancesWriter, SamplesWriter, SummaryWriter, WriterSet, plugin_writers

        wall0 = time.perf_counter()
        runs = self._task_runs()
        now = self._inputs(runs)
        judge_backend = self._judge_backend(runs)
        model = StoredBackend((self.summary.get("run") or {}).get("model"))
        try:
            self.new_dir.mkdir(parents=True)
        except FileExistsError:
            raise GageError(f"-o {self.new_dir}: it exists; rescore writes a new run folder") from None
        except OSError as exc:
            raise OutputError(f"-o {self.new_dir}: cannot create it: {exc.strerror or exc}") from None
        run_id = self.new_dir.name
        new_folder = RunFolder(self.new_dir)
        new_folder.write_config(redact(self.new.as_dict(), self.secrets))
        new_folder.write_inputs(now)
        events = EventLog(new_folder.events_file, run_id)
        events.emit("run_start", tasks=self.new.tasks, model=self.new.model, rescored_from=str(self.run_dir.resolve()),
                    metrics=self.metrics, judge_model=self.new.judge_model if self.rejudge else None)
        for tr in runs:
            if tr.failure:
                events.emit("task_failed", task=tr.name, message=self._clean(tr.failure))
        writers = WriterSet([SamplesWriter(self.new_dir), InstancesWriter(self.new_dir), SummaryWriter(self.new_dir)],
                            plugin_writers(self.registry, []))  # the default ones (report.html) as a run has them
        start = RunStart(run_id, self.new_dir, tuple(self.new.tasks), self.new.model, model.model_id, False,
                         self.new.plugin_options)
        load_s = 0.0
        try:
            if self.rejudge:
                t0 = time.perf_counter()
                judge_backend.open()
                load_s = time.perf_counter() - t0
            writers.start(start)
            for tr in runs:
                if not tr.failure:
                    self._task(tr, judge_backend, writers, events)
        finally:
            versions = {"gage_eval": __version__, "python": platform.python_version(),
                        "plugins": {n: v for n, v in plugin_versions().items() if self.pm.get_plugin(n) is not None}}
            summary = redact(build_summary(run_id, self.new, runs, (model, judge_backend), time.perf_counter() - wall0,
                                           load_s, None, None, versions), self.secrets)
            try:
                writers.end(summary)
                events.emit("run_end", interrupted=None, exit_status=summary["run"]["exit_status"])
                events.close()
            finally:
                judge_backend.close()
        return summary

    def records(self, task: str) -> Iterator[tuple[int, dict]]:
        for index, (_, record) in enumerate(RunFolder(self.run_dir).records(task)):
            yield index, record

    def _task(self, tr: Any, judge_backend: Any, writers: Any, events: EventLog) -> None:
        from gage_eval.engine.infer import Stops
        from gage_eval.engine.judging import Judging, judge_chunk
        from gage_eval.engine.scoring import written_record

        writers.task_start(tr.name)
        events.emit("task_start", task=tr.name)
        judging = (Judging(judge_backend, Stops(self._clean), then=lambda row: None)
                   if self.rejudge and tr.judge is not None else None)
        size = judge_chunk(judge_backend) if judging is not None else 256
        source = str(RunFolder(self.run_dir).samples_file(tr.name))

        def write(record: dict, it: Any) -> None:
            t_w = time.perf_counter()
            writers.write(tr.name, record)
            tr.timings["writing_s"] += time.perf_counter() - t_w
            tr.account(record)
            err = (record.get("eval_result") or {}).get("error")
            if err and it is not None:
                events.emit("sample_error", task=tr.name, sample_id=record.get("id"), locator=err.get("locator"),
                            stage=err.get("stage"), message=err.get("message"))

        def flush(window: list[tuple[dict, Any]]) -> None:
            if judging is not None:
                todo = [pos for pos, (_, row) in enumerate(window) if row is not None and row.error is None]
                for pos, row in zip(todo, judging.judge(tr, [window[pos][1] for pos in todo])):
                    window[pos] = (window[pos][0], row)
            for record, it in window:
                if it is None:
                    write(record, None)
                    continue
                t_eval = time.perf_counter()
                new = written_record(tr, it, self._clean)
                if record.get("predict_result") is not None:
                    new["predict_result"] = record["predict_result"]
                tr.timings["evaluation_s"] += time.perf_counter() - t_eval
                write(new, it)

        window: list[tuple[dict, Any]] = []
        t_load = time.perf_counter()
        for index, record in self.records(tr.name):
            if kept_as_is(record, self.rejudge):
                window.append((record, None))
            else:
                window.append((record, row_of(record, index, f"{source}:{index + 1}", keep_judge=judging is None)))
            if len(window) >= size:
                tr.timings["dataset_materialization_s"] += time.perf_counter() - t_load
                flush(window)
                window = []
                t_load = time.perf_counter()
        tr.timings["dataset_materialization_s"] += time.perf_counter() - t_load
        flush(window)
        result = tr.summary()
        events.emit("task_done", task=tr.name, counts=tr.counts, timings=result["timings"])
        writers.task_end(TaskDone(self.new_dir.name, tr.name, dict(tr.counts), result["metrics"]))


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
