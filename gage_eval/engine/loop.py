"""The run loop: read -> preprocess and validate -> build request -> infer -> judge -> score -> write.

Each stage is a small unit handing a :class:`~gage_eval.engine.row.Row` on, a new one each: reading, checking and
building requests (:meth:`TaskRun.items`), :class:`~gage_eval.engine.infer.Inference`,
:class:`~gage_eval.engine.judging.Judging`, :func:`~gage_eval.engine.scoring.finish_record` and the writers
(:mod:`gage_eval.runfolder.writers`). This module keeps the loop, the windows and the accounting;
:mod:`gage_eval.config.options`, :mod:`gage_eval.engine.summary`, :mod:`gage_eval.engine.rowlog` and
:mod:`gage_eval.engine.interrupts` hold the rest. ``gage-eval rescore`` is this run with the stored
outputs in place of reading rows and inferring (:class:`gage_eval.engine.rescore.Rescore`).
"""
from __future__ import annotations

import sys
import time
from functools import partial
from pathlib import Path
from typing import Any, Iterator

from gage_eval.api.backend import Backend
from gage_eval.api.errors import FailFast, GageError, OutputError
from gage_eval.api.events import RunEnd, RunStart, SampleDone, TaskDone
from gage_eval.api.running import Tally
from gage_eval.engine.background import write_stage
from gage_eval.engine.executor import wrap_backends
from gage_eval.engine.idset import IdSet
from gage_eval.engine.infer import Inference, Stops
from gage_eval.engine.interrupts import Interrupted, held, interrupt_of, stop_reason
from gage_eval.engine.judging import Judging
from gage_eval.engine.observers import Observers
from gage_eval.engine.reread import reread_samples
from gage_eval.config.options import RunOptions, in_shard
from gage_eval.plugins import load_plugins
from gage_eval.engine.progress import Progress, close_backends, open_backends, status
from gage_eval.api.runfolder import RunFolder, use_reread
from gage_eval.runfolder.records import EventLog, read_jsonl
from gage_eval.api.secrets import mask, redact, strip_credentials
from gage_eval.engine.rowlog import RowLog
from gage_eval.runfolder.rundir import record_inputs
from gage_eval.engine.scoring import written_record
from gage_eval.engine.summary import build_summary, kept_settings, versions
from gage_eval.engine.row import Row, finished
from gage_eval.engine.taskrun import TaskRun, make_backends
from gage_eval.runfolder.writers import SamplesWriter, SummaryWriter, WriterSet, plugin_writers, writer_secrets
from gage_eval.tasks.resolve import resolve_tasks

__all__ = ["Engine", "RunOptions", "TaskRun"]


class Engine:
    row_log = RowLog  # what a task's row errors and warnings go to (events.jsonl, the console)

    def __init__(self, options: RunOptions, run_dir: Path, resume: bool = False):
        self.options, self.run_dir, self.folder, self.resume = options, run_dir, RunFolder(run_dir), resume
        self.quiet, self.fail_fast = options.quiet, options.fail_fast  # (a rescore has neither)
        self.started: dict[str, Any] = {}  # more of run_start's event
        self.pm, self.registry = load_plugins()
        self.run_id = run_dir.name
        self.secrets: tuple[str, ...] = ()
        self.tally = Tally()  # what backend wrappers count per task (the response cache's hits)
        self.layers: list[Any] = []  # every wrapper the plugins put around the backends
        self.stops = Stops(self._clean)
        self.observers = Observers(self.pm, self._clean)
        self._notify = self.observers.notify
        # the row and task hooks some observer implements (most runs: none, and no event is built)
        self.observed = {hook for hook in ("gage_sample_done", "gage_task_done") if self.observers.impls(hook)}
        self.allowed_dirs = tuple(Path(p).expanduser().resolve() for p in options.allow_paths)
        self.samples = SamplesWriter(run_dir)
        use_reread(reread_samples)  # what a writer (the report) reads a stored run's rows again with
        self.writers = WriterSet([self.samples, SummaryWriter(run_dir)],
                                 plugin_writers(self.registry, list(options.writers)),
                                 warn=lambda msg: print(f"gage-eval: warning: {self._clean(msg)}", file=sys.stderr))

    def _clean(self, text: str) -> str:
        """A message with every known secret masked (short ones as whole words) and URL user-info removed."""
        return strip_credentials(mask(text, self.secrets))

    # -- the run -------------------------------------------------------------
    def run(self) -> dict:
        wall0 = time.perf_counter()
        opts = self.options
        runs = self._task_runs()
        ready = [tr for tr in runs if not tr.failure]
        backend, judge_backend = self._backends(ready)
        self.secrets = (tuple(getattr(backend, "secrets", ()) or ()) + tuple(getattr(judge_backend, "secrets", ()) or ())
                        + writer_secrets(list(opts.writers)))  # (getattr: a plugin's backend may be duck-typed)
        staged = self._wrap(backend, judge_backend, ready, runs)  # (a bad --cache file stops here, exit 2)
        inputs = self._inputs(ready)
        # (rewritten on resume: writers named then, and a new --fail-fast/--max-error-rate, are kept)
        self.folder.write_config(redact(opts.as_dict(), self.secrets))
        events = EventLog(self.folder.events_file, self.run_id)
        self.log = self.row_log(events, self.stops, self.quiet)  # what each task's row errors and warnings go to
        self.infer = Inference(staged["model"], self.stops, opts.strip_reasoning, self.secrets)  # (the tasks' infer stage)
        events.emit("run_resume" if self.resume else "run_start", tasks=opts.tasks, model=opts.model, **self.started)
        for tr in ready:
            if not self.quiet and tr.data_note():  # said once: where each task's rows come from
                status(f"task {tr.name}: {self._clean(tr.data_note())}")
        for tr in runs:
            if tr.failure:
                events.emit("task_failed", task=tr.name, message=self._clean(tr.failure))
                if ready:  # said now, not after the model loads and the other tasks run
                    status(f"task {tr.name} cannot run: {self._clean(tr.failure)}", quiet=self.quiet)
        start = RunStart(self.run_id, self.run_dir, tuple(opts.tasks), opts.model, backend.model_id, self.resume,
                         opts.plugin_options)
        self._notify("gage_run_start", start)
        interrupted, stopped, self.load_s, self._loading = None, None, 0.0, False  # stopped: a cut run's exit status
        try:  # (a resume loads the model when a row first needs it: a finished run's, never)
            self._opening = partial(self._open, ready, backend, judge_backend, events)
            if not self.resume:
                self._load()
            self.writers.start(start)
            self._recount_failed(runs)
            for task_run in ready:
                self._run_task(task_run, backend, staged, events)
        except (KeyboardInterrupt, Exception) as exc:
            interrupted, stopped = stop_reason(exc, self._clean)
            if interrupt_of(exc) is None:  # (a library may have turned Ctrl-C into its own error)
                raise
        finally:
            summary = redact(build_summary(self.run_id, opts, runs, (backend, judge_backend), time.perf_counter() - wall0,
                                           self.load_s, interrupted, stopped, versions(self.pm), inputs,
                                           self.tally.of_run([tr.name for tr in runs])), self.secrets)
            summary = kept_settings(summary, self.run_dir, self.quiet) if self.resume and self._opening else summary
            self._finish(summary, events, interrupted, (backend, judge_backend))
        if interrupted:
            raise Interrupted(interrupted, stopped)
        return summary

    # -- what a rescore replaces (gage_eval.engine.rescore) -------------------
    def _task_runs(self) -> list[TaskRun]:
        return [TaskRun(spec, self.registry, self.options, failure)
                for spec, failure in resolve_tasks(self.options, self.registry)]

    def _backends(self, ready: list[TaskRun]) -> tuple[Backend, Backend]:
        return make_backends(self.registry, self.options, ready)

    def _wrap(self, backend: Backend, judge_backend: Backend, ready: list[TaskRun], runs: list[TaskRun]
              ) -> dict[str, Backend]:
        """The backend each stage sends its requests to (``model``, ``judge``), as the plugins wrap it."""
        staged, self.layers = wrap_backends(self.pm, self.options, self.secrets, self.tally,
                                            (backend, judge_backend), ready)
        for tr in runs:
            tr.sections = self.tally.of_task(tr.name)
        return staged

    def _inputs(self, ready: list[TaskRun]) -> dict | None:
        """Record the inputs' hashes (inputs.json; on resume, refuse changed ones); for the summary."""
        return record_inputs(self.run_dir, ready, self.resume)

    def _open(self, ready: list[TaskRun], backend: Backend, judge_backend: Backend, events: EventLog) -> float:
        """Load the model (and the judge's), saying so; the seconds it took. No model for no task."""
        if not ready:
            return 0.0
        load_s = open_backends((("model", backend, self.options.model),
                                ("judge model", judge_backend, self.options.judge_model)), self.quiet)
        events.emit("backend_open", seconds=round(load_s, 3), model_id=backend.model_id)
        return load_s

    def _load(self) -> None:
        """Load the model now, once (a resume's, when a row first needs it: a failure stops the run)."""
        self._loading = bool(self._opening)
        self.load_s, self._opening, self._loading = (self._opening() if self._opening else self.load_s), None, False

    def _rows(self, tr: TaskRun, seen: IdSet) -> Iterator[tuple[Row, list[tuple[str, str]]]]:
        return tr.items(self.allowed_dirs, self.options.allow_urls, seen)

    def _stages(self, tr: TaskRun, staged: dict[str, Backend], write: Any) -> tuple[Any, Judging | None]:
        """The infer stage (the run's) and the task's judge stage (None: the task has no judge)."""
        return self.infer, Judging(staged["judge"], self.stops, write, self.secrets) if tr.judge is not None else None

    def _recount_failed(self, runs: list[TaskRun]) -> None:
        """On resume, a task that cannot run now still counts the rows it wrote before."""
        for tr in runs if self.resume else ():
            if tr.failure:
                for record in read_jsonl(self.samples.path(tr.name)):
                    tr.account(record)

    def _finish(self, summary: dict, events: EventLog, interrupted: str | None, backends: tuple) -> None:
        """Write the summary (every writer's end), tell the observers, close the backends."""
        try:
            self.writers.end(summary)
            events.emit("run_end", interrupted=interrupted, exit_status=summary["run"]["exit_status"])
            events.close()
        except OutputError:
            if interrupted is None:  # an earlier error is the one to report
                raise
        finally:
            close_backends(self.layers, backends)
            self._notify("gage_run_end", RunEnd(self.run_id, self.run_dir, summary))

    def _run_task(self, tr: TaskRun, backend: Backend, staged: dict[str, Backend], events: EventLog) -> None:
        opts = self.options
        self.writers.task_start(tr.name)
        done = self._recover(tr, events) if self.resume else None  # the ids finished before (only on resume)
        events.emit("task_start", task=tr.name)
        window_size = max(1, int(getattr(backend, "max_batch", 64) or 64))
        expected = None if self.quiet or opts.shard else tr.expected()  # (for the progress bar only)
        progress = Progress(tr.name, total=expected, quiet=self.quiet, start=len(done) if done else 0)
        log, self.tally.task = self.log, tr.name
        write = lambda it: self._write(tr, it, log, progress)  # noqa: E731 (the write stage's end)
        write, finish = write_stage(tr, write) if tr.background or tr.repeats.n > 1 else (write, None)
        seen, window, shown, shard = IdSet(), [], 0, opts.shard
        rows, (infer, judging) = self._rows(tr, seen), self._stages(tr, staged, write)  # (rows: read in the loop)
        t_load = time.perf_counter()
        try:
            for item, warnings in rows:
                if warnings:
                    shown = log.warnings(tr, item.locator, warnings, progress, shown)
                if (done is not None and item.sample["id"] in done) or (shard and not in_shard(item.sample["id"], shard)):
                    continue
                window.append(item)
                if len(window) >= window_size or (self.fail_fast and _failed(item)):
                    tr.timings["dataset_materialization_s"] += time.perf_counter() - t_load
                    self._process(tr, window, infer, judging, write)
                    window = []
                    t_load = time.perf_counter()
            tr.timings["dataset_materialization_s"] += time.perf_counter() - t_load
            self._process(tr, window, infer, judging, write)
        except (OutputError, FailFast):  # (a response cache unreadable mid-run is an OutputError: exit 2)
            raise
        except (GageError, OSError) as exc:  # the data stopped being readable part way: this task fails
            if self._loading:  # (others go on; but not the model failing to load, on resume)
                raise
            tr.failure = self._clean(str(exc)) if isinstance(exc, GageError) else \
                f"reading the data: {exc.filename or ''}: {exc.strerror or exc}"
        finally:
            if finish is not None:  # the rows whose metrics still run in the background: written, or dropped
                finish()
            progress.close()
            for ids in (seen, done) if done is not None else (seen,):
                ids.close()
        log.task_end(tr)
        tr.ended = True
        result = tr.summary()
        event = TaskDone(self.run_id, tr.name, dict(tr.counts), result["metrics"], tr.in_data_order())
        events.emit("task_done", task=tr.name, counts=tr.counts, timings=result["timings"])
        self.writers.task_end(event)
        if "gage_task_done" in self.observed:
            self._notify("gage_task_done", event)

    def _recover(self, tr: TaskRun, events: EventLog) -> IdSet:
        """On resume, the ids already finished; their records go to every writer again, so each
        rebuilds its output whole. Rows a backend failed are dropped and run again."""
        done, retried = IdSet(), 0
        for record, keep in self.samples.recover(tr.name, keep=finished):
            if keep:
                done.add_once(str(record.get("id")), self.samples.path(tr.name))
                tr.account(record)
                self.writers.replay(tr.name, record)
            else:
                retried += 1
        events.emit("task_resume", task=tr.name, already_done=len(done), retried=retried)
        return done

    def _process(self, tr: TaskRun, window: list[Row], infer: Inference, judging: Judging | None,
                 write: Any) -> None:
        """One window: rows that already failed are written, the others go through the model (and
        the judge) and are written the moment each is finished, so an interrupt loses only the
        rows in flight. With --fail-fast the window ends at its failed row, written last."""
        live = [it for it in window if not _failed(it)]
        failed = [it for it in window if _failed(it)]
        if not self.fail_fast:
            for it in failed:
                write(it)
            failed = []
        if live:  # each answered row to the judge stage, or without one straight to write
            self._load()
            infer.run(tr, live, write if judging is None else partial(judging.add, tr))
        if judging is not None:
            judging.flush(tr)
        for it in failed:
            write(it)

    def _write(self, tr: TaskRun, it: Row, log: RowLog, progress: Progress) -> None:
        """Score one finished row, write it, count it, tell the observers; --fail-fast stops here."""
        t_eval = time.perf_counter()
        record = written_record(tr, it, self._clean)
        err = (record.get("eval_result") or {}).get("error")
        t_w = time.perf_counter()
        tr.timings["evaluation_s"] += t_w - t_eval
        with held():  # a Ctrl-C between the two would leave a record on disk that the summary does not count
            self.writers.write(tr.name, record)
            tr.account(record, it)
        tr.timings["writing_s"] += time.perf_counter() - t_w
        if err:
            log.error(tr, record, err, it.locator, progress)
        if "gage_sample_done" in self.observed:
            self._notify("gage_sample_done", SampleDone(self.run_id, tr.name, str(record["id"]),
                                                        err.get("message") if err else None,
                                                        (record.get("eval_result") or {}).get("metrics", {}), record))
        progress.update(errored=bool(err))
        if err and self.fail_fast:
            raise FailFast(f"stopped at the first error (--fail-fast): {it.locator}: "
                           f"{err.get('stage')}: {err.get('message')}")


def _failed(it: Row) -> bool:
    """A row that needs no model: it failed to read or check, or was scored already (its data
    carried an eval_result)."""
    return it.error is not None or "eval_result" in it.sample
