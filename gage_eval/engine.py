"""The streaming run loop: read lazily, batch, infer, judge, score, write each sample at once.

The pieces it drives live beside it: :mod:`gage_eval.options` (the settings), :mod:`gage_eval.taskrun`
(a task's components, rows and counts), :mod:`gage_eval.scoring` (a finished row's record),
:mod:`gage_eval.summary` (timings and the exit status), :mod:`gage_eval.interrupts`.
"""
from __future__ import annotations

import gc
import platform
import sys
import time
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from gage_eval import __version__
from gage_eval.backend import LOGLIKELIHOOD, Backend, ModelOutput, Request
from gage_eval.errors import (EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_OUTPUT, FailFast, FatalBackendError, GageError,
                              OutputError)
from gage_eval.events import RunEnd, RunStart, SampleDone, TaskDone
from gage_eval.idset import IdSet
from gage_eval.interrupts import Interrupted
from gage_eval.options import RunOptions
from gage_eval.plugins import load_plugins, plugin_versions
from gage_eval.progress import Progress, status
from gage_eval.records import EventLog, TaskWriter, read_jsonl, write_json_atomic
from gage_eval.redact import mask, redact, strip_credentials
from gage_eval.rundir import INPUTS_FILE, changed_inputs, fingerprint, read_inputs
from gage_eval.sample import elide_inline_media
from gage_eval.scoring import finish_record, model_output
from gage_eval.summary import STAGES, derived_timings, exit_status
from gage_eval.taskrun import MAX_WARNINGS_SHOWN, Item, TaskRun, _check_capabilities, make_backend, resolve_tasks

__all__ = ["Engine", "RunOptions", "TaskRun"]


class Engine:
    def __init__(self, options: RunOptions, run_dir: Path, resume: bool = False):
        self.options = options
        self.run_dir = run_dir
        self.resume = resume
        self.pm, self.registry = load_plugins()
        self.run_id = run_dir.name
        self.secrets: tuple[str, ...] = ()
        self.fatal: dict[str, str] = {}  # role -> why its backend can take no more requests
        self._announced: set[str] = set()  # fatal messages already shown on the console
        self.allowed_dirs = tuple(Path(p).expanduser().resolve() for p in options.allow_paths)

    # -- hooks -------------------------------------------------------------
    def _notify(self, hook: str, event: Any) -> None:
        try:
            getattr(self.pm.hook, hook)(event=event)
        except Exception as exc:  # an observer must not break a run
            print(f"gage-eval: warning: observer hook {hook} failed: {exc}", file=sys.stderr)

    def _clean(self, text: str) -> str:
        """A message with every known secret masked (short ones as whole words) and URL user-info removed."""
        return strip_credentials(mask(text, self.secrets))

    # -- the run -------------------------------------------------------------
    def run(self) -> dict:
        wall0 = time.perf_counter()
        opts = self.options
        runs = [TaskRun(spec, self.registry, opts, failure) for spec, failure in resolve_tasks(opts, self.registry)]
        ready = [tr for tr in runs if not tr.failure]
        backend = make_backend(self.registry, opts.model, opts.model_args, opts.batch_size, opts.seed)
        judge_backend = backend
        if any(tr.judge for tr in ready):
            if opts.judge_model and (opts.judge_model, opts.judge_args) != (opts.model, opts.model_args):
                judge_backend = make_backend(self.registry, opts.judge_model, opts.judge_args, opts.batch_size,
                                             opts.seed)
            _check_capabilities([tr.spec for tr in ready if tr.judge], judge_backend,
                                opts.judge_model or opts.model, role="judge model")
        _check_capabilities([tr.spec for tr in ready], backend, opts.model, chat=opts.apply_chat_template)
        self.secrets = tuple(getattr(backend, "secrets", ()) or ()) + tuple(getattr(judge_backend, "secrets", ()) or ())
        self._check_inputs(ready)
        if not self.resume:
            write_json_atomic(self.run_dir / "config.json", redact(asdict(opts), self.secrets))
        events = EventLog(self.run_dir / "events.jsonl", self.run_id)
        events.emit("run_resume" if self.resume else "run_start", tasks=opts.tasks, model=opts.model)
        for tr in runs:
            if tr.failure:
                events.emit("task_failed", task=tr.name, message=self._clean(tr.failure))
        self._notify("gage_run_start", RunStart(self.run_id, self.run_dir, tuple(opts.tasks), opts.model))
        summary: dict = {}
        interrupted = None
        stopped: int | None = None  # the exit status of a run that did not finish
        load_s = 0.0
        try:
            t_open = time.perf_counter()
            for role, b, name in (("model", backend, opts.model), ("judge model", judge_backend, opts.judge_model)):
                if role == "judge model" and b is backend:
                    continue
                status(f"loading {role} {name} ({b.model_id})...", quiet=opts.quiet)
                t_one = time.perf_counter()
                b.open()
                took = time.perf_counter() - t_one
                note = getattr(b, "open_note", None)
                if took >= 1.0 or note:
                    status(f"{role} ready in {took:.1f}s" + (f" ({note})" if note else ""), quiet=opts.quiet)
            # the model's many long-lived objects need no more garbage-collector scans (about 1% of a run)
            gc.freeze()
            load_s = time.perf_counter() - t_open
            events.emit("backend_open", seconds=round(load_s, 3), model_id=backend.model_id)
            if self.resume:  # a task that cannot run now still counts the rows it wrote before
                for tr in runs:
                    if tr.failure:
                        for record in read_jsonl(self.run_dir / "samples" / f"{tr.name}.jsonl"):
                            tr.account(record)
            for task_run in ready:
                self._run_task(task_run, backend, judge_backend, events)
        except KeyboardInterrupt as exc:
            interrupted = str(exc) or "interrupted by the user (Ctrl-C)"
            stopped = getattr(exc, "exit_status", EXIT_INTERRUPTED)
        except GageError as exc:
            interrupted, stopped = self._clean(str(exc)), exc.exit_code
            raise
        except OSError as exc:
            interrupted, stopped = self._clean(f"{exc.filename or ''}: {exc.strerror or exc}"), EXIT_OUTPUT
            raise
        except Exception as exc:
            interrupted, stopped = self._clean(f"internal error: {type(exc).__name__}: {exc}"), EXIT_INTERNAL
            raise
        finally:
            summary = self._summary(runs, backend, judge_backend, wall0, load_s, interrupted, stopped)
            try:
                write_json_atomic(self.run_dir / "summary.json", summary)
                events.emit("run_end", interrupted=interrupted, exit_status=summary["run"]["exit_status"])
                events.close()
            except OutputError:
                if interrupted is None:  # an earlier error is the one to report
                    raise
            finally:
                gc.unfreeze()
                for b in {id(backend): backend, id(judge_backend): judge_backend}.values():
                    b.close()
        if interrupted:
            raise Interrupted(interrupted, stopped)
        self._notify("gage_run_end", RunEnd(self.run_id, self.run_dir, summary))
        return summary

    def _check_inputs(self, runs: list["TaskRun"]) -> None:
        """Hash each task folder and local data file; on resume, refuse any that changed."""
        now = {tr.name: fingerprint(tr.spec.folder, tr.data_files()) for tr in runs}
        if self.resume and not (self.run_dir / INPUTS_FILE).exists():
            print(f"gage-eval: warning: {self.run_dir / INPUTS_FILE} is missing, so this resume cannot check "
                  f"that the task folders and data are unchanged; it records them now", file=sys.stderr)
        elif self.resume:
            changed = changed_inputs(read_inputs(self.run_dir), now)
            if changed:
                raise GageError(f"--resume {self.run_dir}: the inputs changed since the run began, so its "
                                f"results would mix two versions: " + "; ".join(changed)
                                + ". Start a new run instead.")
            return
        write_json_atomic(self.run_dir / INPUTS_FILE, now)

    def _run_task(self, tr: TaskRun, backend: Backend, judge_backend: Backend, events: EventLog) -> None:
        opts = self.options
        writer = TaskWriter(self.run_dir, tr.name, model_id=backend.model_id, evaluation_id=self.run_id)
        done = IdSet()
        if self.resume:
            retried = 0
            for record, keep in writer.recover(keep=_finished):
                if keep:
                    done.add(str(record.get("id")))
                    tr.account(record)
                else:
                    retried += 1
            events.emit("task_resume", task=tr.name, already_done=len(done), retried=retried)
        events.emit("task_start", task=tr.name)
        window_size = max(1, int(getattr(backend, "max_batch", 64) or 64))
        try:
            expected = tr.expected()
        except (GageError, OSError):  # unreadable data: reading the rows below fails the task with it
            expected = None
        progress = Progress(tr.name, total=expected, quiet=opts.quiet, start=len(done))
        seen = IdSet()
        window: list[Item] = []
        t_load = time.perf_counter()
        try:
            for item in self._items(tr, seen, events, progress):
                if done and item.sample["id"] in done:  # (an empty set: not resuming, no lookup)
                    continue
                window.append(item)
                if len(window) >= window_size or (opts.fail_fast and (item.error is not None
                                                                      or "eval_result" in item.sample)):
                    tr.timings["dataset_materialization_s"] += time.perf_counter() - t_load
                    self._process(tr, window, backend, judge_backend, writer, events, progress)
                    window = []
                    t_load = time.perf_counter()
            tr.timings["dataset_materialization_s"] += time.perf_counter() - t_load
            if window:
                self._process(tr, window, backend, judge_backend, writer, events, progress)
        except (OutputError, FailFast):
            raise
        except GageError as exc:  # the data stopped being readable part way: this task fails, others go on
            tr.failure = self._clean(str(exc))
        except OSError as exc:
            tr.failure = f"reading the data: {exc.filename or ''}: {exc.strerror or exc}"
        finally:
            writer.close()
            progress.close()
            seen.close()
            done.close()
        again = sum(tr.repeated.values())
        if again and not opts.quiet:
            print(f"gage-eval: {tr.name}: {again} more row(s) failed with an error shown above; every row's "
                  f"error is in samples/{tr.name}.jsonl and events.jsonl", file=sys.stderr)
        result = tr.summary()
        if tr.failure:
            events.emit("task_failed", task=tr.name, message=tr.failure)
            if not opts.quiet:
                print(f"gage-eval: task {tr.name} failed: {tr.failure}", file=sys.stderr)
        events.emit("task_done", task=tr.name, counts=tr.counts, timings=result["timings"])
        self._notify("gage_task_done", TaskDone(self.run_id, tr.name, dict(tr.counts), result["metrics"]))

    def _items(self, tr: TaskRun, seen: IdSet, events: EventLog, progress: Progress) -> Iterable[Item]:
        """Rows of the dataset as items: a valid Sample with its request, or an error.
        Each row is checked as ``gage-eval validate`` checks it (gage_eval.rows); its warnings
        (unknown top-level keys) go to the events, and the first few to the console."""
        warned = 0
        for item, warnings in tr.items(self.allowed_dirs, self.options.allow_urls, seen):
            for where, message in warnings:
                events.emit("sample_warning", task=tr.name, locator=item.locator, path=where, message=message)
                warned += 1
                if not self.options.quiet and warned <= MAX_WARNINGS_SHOWN:
                    progress.message(f"warning: {item.locator}: {message}"
                                     + (" (further warnings only in events.jsonl)" if warned == MAX_WARNINGS_SHOWN
                                        else ""))
            yield item

    def _process(self, tr: TaskRun, window: list[Item], backend: Backend, judge_backend: Backend,
                 writer: TaskWriter, events: EventLog, progress: Progress) -> None:
        """One window through the backend's :meth:`~Backend.stream`; each row is written the moment
        it is finished (its output and any unconditioned scores arrived, its judge replied), so an
        interrupt loses only the rows in flight."""
        live = [it for it in window if it.error is None and "eval_result" not in it.sample]
        live_ids = {id(it) for it in live}
        failed = [it for it in window if id(it) not in live_ids]
        if not self.options.fail_fast:  # (with --fail-fast the window ends at its one failed row)
            for it in failed:
                self._write(tr, it, writer, events, progress)
            failed = []
        if live and self.fatal.get("model"):
            for it in live:
                it.error = {"stage": "inference", "message": f"not run: {self.fatal['model']}", "locator": it.locator}
                self._write(tr, it, writer, events, progress)
            live = []
        if not live:
            for it in failed:
                self._write(tr, it, writer, events, progress)
            return
        requests, owners = [], []  # owners[j]: (item, whether request j is its unconditioned one)
        for it in live:
            requests.append(it.request)
            owners.append((it, False))
            if it.request.kind == LOGLIKELIHOOD and it.request.unconditioned is not None:
                requests.append(Request(kind=LOGLIKELIHOOD, sample_id=it.request.sample_id,
                                        prompt=it.request.unconditioned,
                                        continuations=it.request.continuations))
                owners.append((it, True))
        waiting: dict[int, int] = {}
        for it, _ in owners:
            waiting[id(it)] = waiting.get(id(it), 0) + 1
        to_judge: list[Item] = []
        chunk = _judge_chunk(judge_backend) if tr.judge is not None else 0

        def arrived(j: int, out: ModelOutput) -> None:
            it, aux = owners[j]
            if aux:
                it.aux_output = out
            else:
                it.output = out
            waiting[id(it)] -= 1
            if waiting[id(it)]:
                return
            it.model_output = model_output(it, self.options.strip_reasoning)
            bad = it.output.error if it.output is not None and it.output.error else (
                f"unconditioned scores: {it.aux_output.error}" if it.aux_output is not None and it.aux_output.error
                else None)
            if bad:
                it.error = {"stage": "inference", "message": bad, "locator": it.locator}
            if tr.judge is not None and it.error is None:
                to_judge.append(it)
                if len(to_judge) >= chunk:
                    self._judge_and_write(tr, to_judge, judge_backend, writer, events, progress)
                    to_judge.clear()
            else:
                self._write(tr, it, writer, events, progress)

        got: set[int] = set()
        stopped: str | None = None
        t0 = time.perf_counter()
        busy = 0.0  # time spent here writing and judging, not waiting for the model
        stream = _stream(backend, requests)
        try:
            for j, out in stream:
                t_in = time.perf_counter()
                if isinstance(j, int) and 0 <= j < len(requests) and j not in got:
                    got.add(j)
                    arrived(j, out if isinstance(out, ModelOutput) else ModelOutput(
                        error=f"backend returned {type(out).__name__}, not a ModelOutput"))
                busy += time.perf_counter() - t_in
        except FatalBackendError as exc:
            self.fatal["model"] = stopped = self._clean(str(exc))
        except GageError:
            raise
        except Exception as exc:  # a backend bug part way: the rows not yet answered carry it
            stopped = self._clean(f"{type(exc).__name__}: {exc}")
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()
        tr.timings["inference_s"] += time.perf_counter() - t0 - busy
        if self.fatal.get("model"):
            tr.failure = tr.failure or f"the model backend stopped the run: {self.fatal['model']}"
        for j in range(len(requests)):
            if j not in got:
                arrived(j, ModelOutput(error=stopped or f"backend returned no output for request {j} "
                                                        f"of the batch"))
        if to_judge:
            self._judge_and_write(tr, to_judge, judge_backend, writer, events, progress)
        for it in failed:
            self._write(tr, it, writer, events, progress)

    def _judge_and_write(self, tr: TaskRun, items: list[Item], judge_backend: Backend, writer: TaskWriter,
                         events: EventLog, progress: Progress) -> None:
        self._judge(tr, items, judge_backend)
        for it in items:
            self._write(tr, it, writer, events, progress)

    def _write(self, tr: TaskRun, it: Item, writer: TaskWriter, events: EventLog, progress: Progress) -> None:
        """Score one finished row, write it, count it, tell the observers; --fail-fast stops here."""
        t_eval = time.perf_counter()
        record = elide_inline_media(finish_record(tr, it))
        err = (record.get("eval_result") or {}).get("error")
        if err:
            err["message"] = self._clean(str(err.get("message")))
        t_w = time.perf_counter()
        tr.timings["evaluation_s"] += t_w - t_eval
        writer.write(record)
        tr.timings["writing_s"] += time.perf_counter() - t_w
        tr.account(record)
        if err:
            events.emit("sample_error", task=tr.name, sample_id=record["id"], locator=it.locator,
                        stage=err.get("stage"), message=err.get("message"))
            if not self.options.quiet:
                stop = next((f for f in self.fatal.values() if f in err["message"]), None)
                if stop is None:
                    key = (err.get("stage"), err.get("message"))
                    if key not in tr.repeated:  # an error every row gets alike (a template's) is shown once
                        tr.repeated[key] = 0
                        progress.message(f"{it.locator}: {err.get('stage')} error: {err.get('message')}")
                    else:
                        tr.repeated[key] += 1
                elif stop not in self._announced:  # one line for a backend that stopped, not one a row
                    self._announced.add(stop)
                    progress.message(f"{it.locator}: {err.get('stage')} error: {stop}; every row still "
                                     f"to come is written as errored without being run")
        self._notify("gage_sample_done", SampleDone(self.run_id, tr.name, str(record["id"]),
                                                    err.get("message") if err else None,
                                                    (record.get("eval_result") or {}).get("metrics", {})))
        progress.update(errored=bool(err))
        if err and self.options.fail_fast:
            raise FailFast(f"stopped at the first error (--fail-fast): {it.locator}: "
                           f"{err.get('stage')}: {err.get('message')}")

    def _judge(self, tr: TaskRun, items: list[Item], judge_backend: Backend) -> None:
        requests, owners = [], []
        for it in items:
            try:
                reqs = tr.judge.requests(it.sample, it.model_output)
            except (ValueError, KeyError) as exc:
                it.error = {"stage": "judge", "message": f"building the judge prompt: {exc}", "locator": it.locator}
                continue
            if not reqs:  # nothing to judge (an mcq row of a mixed task): no verdict, not an error
                continue
            requests.extend(reqs)
            owners.append((it, len(reqs)))
        if not requests:
            return
        t0 = time.perf_counter()
        if self.fatal.get("judge"):
            replies = [ModelOutput(error=f"not run: {self.fatal['judge']}") for _ in requests]
        else:
            try:
                replies = _safe_run(judge_backend, requests)
            except FatalBackendError as exc:
                self.fatal["judge"] = self._clean(str(exc))
                replies = [ModelOutput(error=self.fatal["judge"]) for _ in requests]
        if self.fatal.get("judge"):
            tr.failure = tr.failure or f"the judge backend stopped the run: {self.fatal['judge']}"
        tr.timings["judge_s"] += time.perf_counter() - t0
        pos = 0
        for it, k in owners:
            mine = replies[pos:pos + k]
            pos += k
            verdict = tr.judge.verdict(it.sample, it.model_output, mine)
            it.verdict = verdict
            if verdict.error:
                it.error = {"stage": "judge", "message": verdict.error, "locator": it.locator}

    def _summary(self, runs: list[TaskRun], backend: Backend, judge_backend: Backend, wall0: float,
                 load_s: float, interrupted: str | None, stopped: int | None = None) -> dict:
        opts = self.options
        wall = time.perf_counter() - wall0
        tasks = {tr.name: tr.summary(opts.max_error_rate) for tr in runs}
        n = sum(tr.counts["total"] for tr in runs)
        timings = derived_timings({k: sum(tr.timings[k] for tr in runs) for k in STAGES}, n, wall)
        timings["model_load_s"] = load_s
        settings = asdict(opts)
        summary = {
            "run": {
                "id": self.run_id,
                "created": datetime.now().astimezone().isoformat(timespec="seconds"),  # RFC 3339
                "command": opts.command,
                "interrupted": interrupted,
                "exit_status": stopped if stopped is not None else exit_status(tasks),
                "versions": {"gage_eval": __version__, "python": platform.python_version(),
                             "plugins": {name: version for name, version in plugin_versions().items()
                                         if self.pm.get_plugin(name) is not None}},
                "model": {"name": opts.model, "model_id": backend.model_id, "args": opts.model_args,
                          "settings": backend.settings()},
                "judge": ({"name": opts.judge_model or opts.model, "model_id": judge_backend.model_id,
                           "args": opts.judge_args, "settings": judge_backend.settings()}
                          if any(tr.judge for tr in runs) else None),
                "settings": settings,
                "timings": {k: (round(v, 6) if isinstance(v, float) else v) for k, v in timings.items()},
            },
            "tasks": tasks,
        }
        return redact(summary, self.secrets)





def _finished(record: Mapping[str, Any]) -> bool:
    """On resume, a written row counts as done unless a backend failed it (inference or judge):
    those may succeed now that the cause is fixed, so they run again."""
    err = (record.get("eval_result") or {}).get("error")
    return not err or err.get("stage") not in ("inference", "judge")



def _stream(backend: Backend, requests: list) -> Iterator[tuple[int, ModelOutput]]:
    """The backend's stream; a backend without :meth:`Backend.stream` (not derived from
    :class:`Backend`) is run whole."""
    if not requests:
        return iter(())
    stream = getattr(backend, "stream", None)
    if stream is None:
        return enumerate(_safe_run(backend, requests))
    return iter(stream(requests))


def _judge_chunk(judge_backend: Backend) -> int:
    """How many finished rows wait for their judge together: enough to keep the judge busy
    (its concurrency, for an HTTP judge), few enough that an interrupt loses little."""
    size = getattr(judge_backend, "concurrency", None) or 16
    return max(1, min(int(size), int(getattr(judge_backend, "max_batch", 64) or 64)))


def _safe_run(backend: Backend, requests: list) -> list[ModelOutput]:
    """Run a batch; a backend exception becomes every request's error, never a lost row."""
    try:
        outputs = backend.run(requests)
    except GageError:
        raise
    except Exception as exc:
        msg = f"{type(exc).__name__}: {exc}"
        return [ModelOutput(error=msg) for _ in requests]
    if len(outputs) != len(requests):
        msg = f"backend returned {len(outputs)} outputs for {len(requests)} requests"
        return [ModelOutput(error=msg) for _ in requests]
    return list(outputs)
