"""The run loop: read -> preprocess and validate -> build request -> infer -> judge -> score -> write.

Each stage is a small unit handing a :class:`~gage_eval.engine.row.Row` on, a new one each: reading, checking and
building requests (:meth:`TaskRun.items`), :class:`~gage_eval.engine.infer.Inference`,
:class:`~gage_eval.engine.judging.Judging`, :func:`~gage_eval.engine.scoring.finish_record` and the writers
(:mod:`gage_eval.runfolder.writers`). This module keeps the loop, the windows and the accounting;
:mod:`gage_eval.config.options`, :mod:`gage_eval.engine.summary`, :mod:`gage_eval.engine.rowlog` and
:mod:`gage_eval.engine.interrupts` hold the rest.
"""
from __future__ import annotations

import gc
import platform
import sys
import time
from pathlib import Path
from typing import Any, Mapping

from gage_eval import __version__
from gage_eval.api.backend import Backend
from gage_eval.api.errors import FailFast, GageError, OutputError
from gage_eval.api.events import RunEnd, RunStart, SampleDone, TaskDone
from gage_eval.api.running import BackendUse, Tally
from gage_eval.engine.background import write_stage
from gage_eval.engine.idset import IdSet
from gage_eval.engine.infer import Inference, Stops
from gage_eval.engine.interrupts import Interrupted, held, interrupt_of, stop_reason
from gage_eval.engine.judging import Judging
from gage_eval.engine.observers import Observers
from gage_eval.engine.reread import reread_samples
from gage_eval.config.options import RunOptions, in_shard
from gage_eval.plugins import load_plugins, plugin_versions
from gage_eval.engine.progress import Progress, open_backends, status
from gage_eval.engine.replies import reusable
from gage_eval.api.runfolder import RunFolder, use_reread
from gage_eval.runfolder.records import EventLog, read_jsonl
from gage_eval.runfolder.repro import warn_changed_environment
from gage_eval.api.secrets import mask, redact, strip_credentials
from gage_eval.engine.rowlog import RowLog
from gage_eval.runfolder.rundir import check_inputs, fingerprint
from gage_eval.engine.scoring import written_record
from gage_eval.engine.summary import build_summary
from gage_eval.engine.row import Row
from gage_eval.engine.taskrun import TaskRun, make_backends, resolve_tasks
from gage_eval.runfolder.writers import (InstancesWriter, SamplesWriter, SummaryWriter, WriterSet, plugin_writers,
                               writer_secrets)

__all__ = ["Engine", "RunOptions", "TaskRun"]


class Engine:
    def __init__(self, options: RunOptions, run_dir: Path, resume: bool = False):
        self.options = options
        self.run_dir = run_dir
        self.folder = RunFolder(run_dir)
        self.resume = resume
        self.pm, self.registry = load_plugins()
        self.run_id = run_dir.name
        self.secrets: tuple[str, ...] = ()
        self.tally = Tally()  # what backend wrappers count per task (the response cache's hits)
        self.layers: list[Any] = []  # every wrapper the plugins put around the backends
        self.stops = Stops(self._clean)
        self.observers = Observers(self.pm, self._clean)
        self._notify = self.observers.notify
        self.allowed_dirs = tuple(Path(p).expanduser().resolve() for p in options.allow_paths)
        self.samples = SamplesWriter(run_dir)
        use_reread(reread_samples)  # what a writer (the report) reads a stored run's rows again with
        self.writers = WriterSet([self.samples, InstancesWriter(run_dir), SummaryWriter(run_dir)],
                                 plugin_writers(self.registry, list(options.writers)),
                                 warn=lambda msg: print(f"gage-eval: warning: {self._clean(msg)}", file=sys.stderr))

    def _versions(self) -> dict:
        return {"gage_eval": __version__, "python": platform.python_version(),
                "plugins": {name: version for name, version in plugin_versions().items()
                            if self.pm.get_plugin(name) is not None}}

    def _clean(self, text: str) -> str:
        """A message with every known secret masked (short ones as whole words) and URL user-info removed."""
        return strip_credentials(mask(text, self.secrets))

    # -- the run -------------------------------------------------------------
    def run(self) -> dict:
        wall0 = time.perf_counter()
        opts = self.options
        runs = [TaskRun(spec, self.registry, opts, failure) for spec, failure in resolve_tasks(opts, self.registry)]
        ready = [tr for tr in runs if not tr.failure]
        backend, judge_backend = make_backends(self.registry, opts, ready)
        self.secrets = (tuple(getattr(backend, "secrets", ()) or ()) + tuple(getattr(judge_backend, "secrets", ()) or ())
                        + writer_secrets(list(opts.writers)))  # (getattr: a plugin's backend may be duck-typed)
        staged = self._wrap(backend, judge_backend, ready, runs)  # (a bad --cache file stops here, exit 2)
        inputs = {tr.name: fingerprint(tr.spec.folder, tr.data_files()) for tr in ready}
        check_inputs(self.run_dir, inputs, self.resume)
        if self.resume:
            warn_changed_environment(self.run_dir)
        # (rewritten on resume: writers named then, and a new --fail-fast/--max-error-rate, are kept)
        self.folder.write_config(redact(opts.as_dict(), self.secrets))
        events = EventLog(self.folder.events_file, self.run_id)
        events.emit("run_resume" if self.resume else "run_start", tasks=opts.tasks, model=opts.model)
        for tr in ready:
            if tr.data_note():  # said once: where each task's rows come from
                status(f"task {tr.name}: {self._clean(tr.data_note())}", quiet=opts.quiet)
        for tr in runs:
            if tr.failure:
                events.emit("task_failed", task=tr.name, message=self._clean(tr.failure))
                if ready:  # said now, not after the model loads and the other tasks run
                    status(f"task {tr.name} cannot run: {self._clean(tr.failure)}", quiet=opts.quiet)
        start = RunStart(self.run_id, self.run_dir, tuple(opts.tasks), opts.model, backend.model_id, self.resume,
                         opts.plugin_options)
        self._notify("gage_run_start", start)
        interrupted, stopped, load_s = None, None, 0.0  # stopped: the exit status of a run that did not finish
        try:
            if ready:  # no model for no task
                load_s = open_backends((("model", backend, opts.model), ("judge model", judge_backend,
                                                                         opts.judge_model)), opts.quiet)
                events.emit("backend_open", seconds=round(load_s, 3), model_id=backend.model_id)
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
                                           load_s, interrupted, stopped, self._versions(), inputs,
                                           self.tally.of_run([tr.name for tr in runs])), self.secrets)
            self._finish(summary, events, interrupted, (backend, judge_backend))
        if interrupted:
            raise Interrupted(interrupted, stopped)
        return summary

    def _wrap(self, backend: Backend, judge_backend: Backend, ready: list[TaskRun], runs: list[TaskRun]
              ) -> dict[str, Backend]:
        """The backend each stage sends its requests to (``model``, ``judge``): the role's backend
        as the plugins wrap it (``gage_wrap_backend``, builtins innermost)."""
        opts, settings = self.options, self.options.as_dict()
        roles = {"model": (backend, opts.model)}
        if any(tr.judge for tr in ready):
            roles["judge"] = (judge_backend, opts.judge_model or opts.model)
        staged = {}
        for role, (b, name) in roles.items():
            use = BackendUse(role, name, opts.seed, self.secrets, settings,
                             lambda request, out: reusable(request, out, self.secrets), self.tally)
            for impl in self.pm.hook.gage_wrap_backend.get_hookimpls():  # registration order
                wrapped = impl.function(backend=b, use=use)
                if wrapped is not None:
                    self.layers.append(wrapped)
                    b = wrapped
            staged[role] = b
        for tr in runs:
            tr.sections = self.tally.of_task(tr.name)
        return staged

    def _recount_failed(self, runs: list[TaskRun]) -> None:
        """On resume, a task that cannot run now still counts the rows it wrote before."""
        if self.resume:
            for tr in runs:
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
            gc.unfreeze()
            for layer in reversed(self.layers):
                close = getattr(layer, "close", None)
                if close is not None:
                    close()
            for b in {id(b): b for b in backends}.values():
                b.close()
            self._notify("gage_run_end", RunEnd(self.run_id, self.run_dir, summary))

    def _run_task(self, tr: TaskRun, backend: Backend, staged: dict[str, Backend], events: EventLog) -> None:
        opts = self.options
        self.writers.task_start(tr.name)
        done = self._recover(tr, events)
        events.emit("task_start", task=tr.name)
        window_size = max(1, int(getattr(backend, "max_batch", 64) or 64))
        try:
            expected = tr.expected()
        except (GageError, OSError):  # unreadable data: reading the rows below fails the task with it
            expected = None
        progress = Progress(tr.name, total=None if opts.shard else expected, quiet=opts.quiet, start=len(done))
        log = RowLog(events, self.stops, opts.quiet)
        self.tally.task = tr.name
        infer = Inference(staged["model"], self.stops, opts.strip_reasoning, self.secrets)
        write, finish = write_stage(tr, lambda it: self._write(tr, it, log, progress))
        judging = Judging(staged["judge"], self.stops, write, self.secrets) if tr.judge is not None else None
        seen, window, shown, shard = IdSet(), [], 0, opts.shard
        t_load = time.perf_counter()
        try:
            for item, warnings in tr.items(self.allowed_dirs, opts.allow_urls, seen):
                shown = log.warnings(tr, item.locator, warnings, progress, shown)
                if (done and item.sample["id"] in done) or (shard and not in_shard(item.sample["id"], shard)):
                    continue
                window.append(item)
                if len(window) >= window_size or (opts.fail_fast and _failed(item)):
                    tr.timings["dataset_materialization_s"] += time.perf_counter() - t_load
                    self._process(tr, window, infer, judging, write)
                    window = []
                    t_load = time.perf_counter()
            tr.timings["dataset_materialization_s"] += time.perf_counter() - t_load
            self._process(tr, window, infer, judging, write)
        except (OutputError, FailFast):  # (a response cache unreadable mid-run is an OutputError: exit 2)
            raise
        except GageError as exc:  # the data stopped being readable part way: this task fails, others go on
            tr.failure = self._clean(str(exc))
        except OSError as exc:
            tr.failure = f"reading the data: {exc.filename or ''}: {exc.strerror or exc}"
        finally:
            finish()  # the rows whose metrics still run in the background: written, or dropped when the run stops
            progress.close()
            seen.close()
            done.close()
        log.task_end(tr)
        result = tr.summary()
        events.emit("task_done", task=tr.name, counts=tr.counts, timings=result["timings"])
        event = TaskDone(self.run_id, tr.name, dict(tr.counts), result["metrics"])
        self.writers.task_end(event)
        self._notify("gage_task_done", event)

    def _recover(self, tr: TaskRun, events: EventLog) -> IdSet:
        """On resume, the ids already finished; their records go to every writer again, so each
        rebuilds its output whole. Rows a backend failed are dropped and run again."""
        done = IdSet()
        if self.resume:
            retried = 0
            for record, keep in self.samples.recover(tr.name, keep=_finished):
                if keep:
                    done.add(str(record.get("id")))
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
        if not self.options.fail_fast:
            for it in failed:
                write(it)
            failed = []
        if live:
            infer.run(tr, live, lambda it: judging.add(tr, it) if judging is not None and it.error is None
                      else write(it))
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
            tr.account(record)
        tr.timings["writing_s"] += time.perf_counter() - t_w
        if err:
            log.error(tr, record, err, it.locator, progress)
        if self.observers.impls("gage_sample_done"):  # (most runs have no observer: no event built per row)
            self._notify("gage_sample_done", SampleDone(self.run_id, tr.name, str(record["id"]),
                                                        err.get("message") if err else None,
                                                        (record.get("eval_result") or {}).get("metrics", {}), record))
        progress.update(errored=bool(err))
        if err and self.options.fail_fast:
            raise FailFast(f"stopped at the first error (--fail-fast): {it.locator}: "
                           f"{err.get('stage')}: {err.get('message')}")


def _failed(it: Row) -> bool:
    """A row that needs no model: it failed to read or check, or was scored already (its data
    carried an eval_result)."""
    return it.error is not None or "eval_result" in it.sample


def _finished(record: Mapping[str, Any]) -> bool:
    """On resume, a written row counts as done unless a backend failed it (inference or judge):
    those may succeed now that the cause is fixed, so they run again."""
    err = (record.get("eval_result") or {}).get("error")
    return not err or err.get("stage") not in ("inference", "judge")
