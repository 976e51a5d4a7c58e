"""The streaming run loop: read lazily, batch, infer, judge, score, write each sample at once."""
from __future__ import annotations

import gc
import json
import math
import platform
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from gage_eval import __version__
from gage_eval.backend import LOGLIKELIHOOD, Backend, ModelOutput, Request
from gage_eval.defaults import DEFAULT_MODEL, DEFAULT_OUTPUT_DIR, DEFAULT_SEED
from gage_eval.errors import (EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_OK, EXIT_OUTPUT, EXIT_ROW_ERRORS,  # noqa: F401
                              EXIT_TASK_FAILED, EXIT_TERMINATED, FailFast, FatalBackendError, GageError,
                              OutputError)
from gage_eval.idset import IdSet
from gage_eval.events import RunEnd, RunStart, SampleDone, TaskDone
from gage_eval.metric import MetricContext, TaskAggregate, metric_value
from gage_eval.plugins import Registry, load_plugins, plugin_versions
from gage_eval.progress import Progress, status
from gage_eval.records import EventLog, TaskWriter, read_jsonl, write_json_atomic
from gage_eval.redact import mask, redact, strip_credentials
from gage_eval.rundir import INPUTS_FILE, changed_inputs, fingerprint, read_inputs
from gage_eval.reasoning import strip_output
from gage_eval.requests import RequestBuilder
from gage_eval.rows import RowChecker, field_message
from gage_eval.sample import SCHEMA_VERSION, elide_inline_media
from gage_eval.schemas import validation_errors
from gage_eval.tasks import TaskSpec, dataset_for_path, discover, read_task_file, with_dataset


@dataclass
class RunOptions:
    """Everything that decides what a run does; saved as config.json for --resume."""

    tasks: list[str]
    model: str = DEFAULT_MODEL
    model_args: dict = field(default_factory=dict)
    judge_model: str | None = None
    judge_args: dict = field(default_factory=dict)
    batch_size: int | str | None = None
    limit: int | float | None = None  # a row count, or a fraction in (0, 1] of each task's rows
    output_dir: str = DEFAULT_OUTPUT_DIR
    run_id: str | None = None
    seed: int = DEFAULT_SEED
    include_paths: list[str] = field(default_factory=list)
    data: dict = field(default_factory=dict)
    task_overrides: dict = field(default_factory=dict)
    fail_fast: bool = False
    max_error_rate: float = 0.0
    allow_paths: list[str] = field(default_factory=list)
    allow_urls: bool = False
    # prompt controls (issue 12): None / empty means "as the task file says"
    system_prompt: str | None = None
    gen_kwargs: dict = field(default_factory=dict)  # merged over each task's request.generation
    num_fewshot: int | None = None
    fewshot_as_multiturn: bool | None = None  # None: multi-turn whenever the chat template is on (lm-eval)
    apply_chat_template: bool | None = None  # None: the task's request.chat
    strip_reasoning: bool = False  # score the text after the last </think>; the raw text stays in the record
    quiet: bool = False
    command: str = ""
    config_file: str | None = None


@dataclass
class Item:
    """One row in flight."""

    index: int
    locator: str
    sample: dict
    error: dict | None = None
    request: Any = None
    rendered: dict = field(default_factory=dict)
    output: ModelOutput | None = None
    aux_output: ModelOutput | None = None  # the unconditioned scores (Request.unconditioned)
    model_output: dict = field(default_factory=dict)  # output + rendered prompt pieces, for judges and metrics
    verdict: Any = None


MAX_WARNINGS_SHOWN = 20  # per task, on the console; events.jsonl has all of them
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


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]


def error_stub(task: str, index: int, locator: str, stage: str, message: str, sample_id: str | None = None) -> dict:
    """The record written for a row that never became a valid Sample."""
    return {
        "schema_version": SCHEMA_VERSION,
        "id": sample_id or f"{task}-row-{index}",
        "messages": [],
        "references": [],
        "metadata": {"locator": locator},
        "eval_result": {"error": {"stage": stage, "message": message, "locator": locator}},
    }


class TaskRun:
    """The per-task state: components built from the task file, counters, timings."""

    def __init__(self, spec: TaskSpec, registry: Registry, options: RunOptions, failure: str | None = None):
        self.spec = spec
        self.name = spec.name
        self.repeated: dict[tuple, int] = {}  # console: each distinct row error -> rows not shown again
        self.failure = failure  # why the task could not run (or stopped), when it did not
        self.options = options
        self.limit = (options.task_overrides.get(spec.name) or {}).get("limit", options.limit)
        self._counted: int | None = None
        self.aggregate = TaskAggregate()
        self.counts = {"total": 0, "scored": 0, "errored": 0, "skipped": 0, "judge_errors": 0}
        self.errors_by_stage: dict[str, int] = {}
        self.timings = dict.fromkeys(STAGES, 0.0)
        self.extra_counts: dict[str, int] = {}
        self.metrics: list = []
        self.judge = None
        self.primary = spec.primary_metric
        if failure is None:
            try:
                self._build(registry)
            except GageError as exc:
                self.failure = str(exc)

    def _build(self, registry: Registry) -> None:
        spec = self.spec
        where = f"task {spec.name!r} ({spec.folder / 'task.yaml'})"
        ds = spec.dataset
        self.loader = _component(registry, "loaders", ds["loader"], where, "dataset.loader",
                                 **(ds.get("args") or {}), base_dir=str(spec.folder))
        self.data_dir = Path(getattr(self.loader, "data_dir", None) or spec.folder)
        pre = spec.preprocessor
        self.preprocess = _component(registry, "preprocessors", pre["name"], where, "preprocessor",
                                     **(pre.get("args") or {}))
        for i, entry in enumerate(spec.metrics):
            entry = {"name": entry} if isinstance(entry, str) else entry
            metric = _component(registry, "metrics", entry["name"], where, f"metrics.{i}",
                                **(entry.get("args") or {}))
            self.metrics.append((entry.get("as", entry["name"]), metric))
        self.primary = spec.primary_metric or self.metrics[0][0]
        if spec.judge:
            self.judge = _component(registry, "judges", spec.judge["name"], where, "judge",
                                    **(spec.judge.get("args") or {}), base_dir=str(spec.folder))
        self.builder = RequestBuilder(spec, self.options, registry, metrics=[m for _, m in self.metrics])

    def data_files(self) -> list[Path]:
        """The local files the task reads besides its folder (for the resume check): the loader's,
        and a few-shot file outside the folder; none for a hub dataset."""
        shots = (self.spec.raw.get("fewshot") or {}).get("path") if isinstance(self.spec.raw, Mapping) else None
        extra = [self.spec.folder / shots] if isinstance(shots, str) else []
        files = getattr(self.loader, "files", None)
        if callable(files):
            return [Path(f) for f in files()] + [p for p in extra if p.is_file()]
        data_files = getattr(self.loader, "data_files", None)
        if isinstance(data_files, str):
            data_files = [data_files]
        elif isinstance(data_files, Mapping):
            data_files = [f for v in data_files.values() for f in ([v] if isinstance(v, str) else v)]
        return [Path(f) for f in list(data_files or []) + extra if Path(f).is_file()]

    def available(self) -> int | None:
        """The dataset's row count when the loader knows it cheaply (``total()``), else None."""
        total = getattr(self.loader, "total", None)
        if not callable(total):
            return None
        try:
            n = total()
        except GageError:
            raise
        except Exception:  # a count is a nicety; the rows themselves report what is wrong
            return None
        return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else None

    def row_limit(self) -> int | None:
        """``limit`` as a row count: a fraction in (0, 1] of the task's rows is rounded up
        (lm-eval's rule); the rows are counted when the loader cannot say."""
        limit = self.limit
        if limit is None or isinstance(limit, int):
            return limit
        if self._counted is None:
            n = self.available()
            self._counted = n if n is not None else sum(1 for _ in self.loader)
        return self._counted if limit >= 1 else math.ceil(self._counted * limit)

    def expected(self) -> int | None:
        """How many rows this run of the task will see, for the progress bar (None: unknown)."""
        n, limit = self.available(), self.row_limit()
        if n is None:
            return limit
        return n if limit is None else min(n, limit)

    def rows(self) -> Iterator[tuple[int, str, Any]]:
        limit = self.row_limit()
        if limit is not None and limit <= 0:
            return
        for index, (locator, record) in enumerate(self.loader):
            yield index, locator, record
            if limit is not None and index + 1 >= limit:
                break

    def items(self, allowed_dirs: tuple[Path, ...] = (), allow_urls: bool = False, seen: IdSet | None = None
              ) -> Iterator[tuple[Item, list[tuple[str, str]]]]:
        """Each row checked as ``gage-eval validate`` checks it (:mod:`gage_eval.rows`) and built
        into its request, with its warnings as (field, message): an item with a request, an item
        whose template failed (``error``), or an error stub for a row that is no valid Sample.
        A run and ``--dry-run`` both read rows through here."""
        checker = RowChecker(self.name, self.preprocess, base_dir=self.data_dir, allowed_dirs=allowed_dirs,
                             allow_urls=allow_urls, seen=seen)
        for index, locator, record in self.rows():
            row = checker.check(locator, index, record)
            warnings = [(where, field_message(where, what)) for where, what in row.warnings]
            if not row.ok:
                yield Item(index, locator, error_stub(self.name, index, locator, row.stage, row.message)), warnings
                continue
            item = Item(index, locator, row.sample)
            try:
                item.request, item.rendered = self.builder.build(row.sample, index)
            except ValueError as exc:
                item.error = {"stage": "template", "message": str(exc), "locator": locator}
            yield item, warnings

    def account(self, record: Mapping[str, Any]) -> None:
        """Count one written record and add its metric values; used live and on resume."""
        result = record.get("eval_result") or {}
        self.counts["total"] += 1
        err = result.get("error")
        if err:
            self.counts["errored"] += 1
            stage = err.get("stage", "unknown")
            self.errors_by_stage[stage] = self.errors_by_stage.get(stage, 0) + 1
            if stage == "judge":
                self.counts["judge_errors"] += 1
            return
        for key, value in (result.get("counters") or {}).items():
            if value:
                self.extra_counts[key] = self.extra_counts.get(key, 0) + 1
        values = {name: metric_value(v) for name, v in (result.get("metrics") or {}).items()}
        if all(v is None for v in values.values()):
            self.counts["skipped"] += 1
            return
        self.counts["scored"] += 1
        self.aggregate.add(values, record.get("data_tag"))

    def status(self, max_error_rate: float = 0.0) -> tuple[str, str | None]:
        """``ok``, ``errors`` (rows errored, more than ``max_error_rate`` of them) or ``failed``
        (the task could not run, or no row was scored), with the reason."""
        c = self.counts
        if self.failure:
            return "failed", self.failure
        if c["total"] == 0:
            return "failed", "no rows: the dataset is empty (or --limit 0)"
        if c["scored"] == 0:
            why = (f"all {c['total']} rows errored" if c["errored"] == c["total"]
                   else f"no row was scored ({c['errored']} errored, {c['skipped']} had no metric value)")
            return "failed", why
        if c["errored"] and c["errored"] / c["total"] > max_error_rate:
            return "errors", f"{c['errored']} of {c['total']} rows errored"
        return "ok", None

    def summary(self, max_error_rate: float = 0.0) -> dict:
        agg = self.aggregate.result()
        higher = {name: getattr(m, "higher_is_better", True) for name, m in self.metrics}
        for name, entry in agg["metrics"].items():
            entry["higher_is_better"] = higher.get(name, True)
        t = derived_timings(self.timings, self.counts["total"])
        status, reason = self.status(max_error_rate)
        return {
            "task": self.name,
            "status": status,
            "failure": reason,
            "source": {"folder": str(self.spec.folder), "origin": self.spec.origin},
            "primary_metric": self.primary,
            "metrics": agg["metrics"],
            "slices": agg["slices"],
            "counts": dict(self.counts, **({"by_counter": self.extra_counts} if self.extra_counts else {})),
            "errors_by_stage": self.errors_by_stage,
            "timings": {k: round(v, 6) for k, v in t.items()},
        }


def _check_capabilities(tasks: list[TaskSpec], backend: Backend, model: str, role: str = "model",
                        chat: bool | None = None) -> None:
    """Refuse, before anything loads, a task the backend cannot do; ``chat`` is --apply-chat-template
    (True: every task's prompts go through the chat template; False: none do; None: as the task says)."""
    for spec in tasks:
        needed = spec.capabilities_needed()
        if chat is not None and role == "model":
            needed = needed | {"chat"} if chat else needed - {"chat"}
        missing = needed - set(backend.capabilities)
        if missing:
            why = " (--apply-chat-template)" if chat and "chat" in missing else ""
            raise GageError(
                f"task {spec.name!r} needs {', '.join(sorted(missing))}{why}, which {role} {model!r} "
                f"({backend.model_id}) does not support (it supports: "
                f"{', '.join(sorted(backend.capabilities)) or 'nothing'}); pick another model or backend")


def resolve_tasks(options: RunOptions, registry: Registry) -> list[tuple[TaskSpec, str | None]]:
    """Each task's validated spec, or a placeholder and the reason its folder cannot run. Unknown
    names are a usage error; a broken task folder fails that task only."""
    found = discover(registry.task_paths, options.include_paths)
    unknown = [t for t in options.tasks if t not in found]
    if unknown:
        raise GageError(f"unknown task(s): {', '.join(unknown)}; available: {', '.join(sorted(found)) or 'none'} "
                        f"(see `gage-eval tasks`)")
    extra = set(options.data) - set(options.tasks)
    if extra:
        raise GageError(f"--data names task(s) not in --tasks: {', '.join(sorted(extra))}")
    specs = []
    for name in options.tasks:
        src = found[name]
        try:
            spec = read_task_file(src.folder, src.origin)
            if name in options.data:
                split = (spec.dataset.get("args") or {}).get("split")
                spec = with_dataset(spec, dataset_for_path(options.data[name], split))
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
    if overrides.get("metrics") is not None:
        names = [m if isinstance(m, str) else m.get("as", m["name"]) for m in raw["metrics"]]
        primary = primary if primary in names else None
    return replace(spec, request=request, metrics=list(raw["metrics"]), primary_metric=primary, raw=raw)


def _component(registry: Registry, kind: str, name: str, where: str, key: str, **kwargs: Any) -> Any:
    """A task's loader, preprocessor, metric or judge built from its registered factory; an unknown
    name or bad arguments name the task, its file and the key."""
    try:
        factory = registry.get(kind, name).factory
    except GageError as exc:
        raise GageError(f"{where}: key '{key}': {exc}") from None
    try:
        return factory(**kwargs)
    except GageError as exc:  # the component's own message names what is wrong (a missing data file, ...)
        raise GageError(f"{where}: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise GageError(f"{where}: key '{key}' ({name!r}): {exc}") from None


def make_backend(registry: Registry, name: str, args: Mapping[str, Any], batch_size: Any, seed: int) -> Backend:
    factory = registry.get("backends", name).factory
    kwargs = dict(args)
    if batch_size is not None:
        kwargs.setdefault("batch_size", batch_size)
    kwargs.setdefault("seed", seed)
    try:
        return factory(**kwargs)
    except TypeError as exc:
        raise GageError(f"backend {name!r}: bad arguments: {exc}") from None


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
        progress = Progress(tr.name, total=tr.expected(), quiet=opts.quiet, start=len(done))
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
            it.model_output = _model_output(it, self.options.strip_reasoning)
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
        record = elide_inline_media(self._finish(tr, it))
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

    def _finish(self, tr: TaskRun, it: Item) -> dict:
        if "eval_result" in it.sample:  # an error stub
            return it.sample
        record = dict(it.sample)
        model_output = it.model_output
        if it.output is not None:
            record["predict_result"] = [_predict_entry(model_output)]
        result: dict[str, Any] = {}
        if it.verdict is not None:
            result["judge"] = it.verdict.to_dict()
        if it.error is not None:
            result["error"] = it.error
            record["eval_result"] = result
            return record
        ctx = MetricContext(sample=it.sample, model_output=model_output,
                            judge_output=it.verdict.to_dict() if it.verdict is not None else None)
        metrics: dict[str, Any] = {}
        counters: dict[str, bool] = {}
        try:
            for name, metric in tr.metrics:
                value = metric.compute(ctx)
                metric_value(value)  # refuses a non-numeric value here, where the sample is known
                metrics[name] = value
                if isinstance(value, Mapping):
                    for key in value.get("counters", ()):
                        counters[f"{name}.{key}"] = True
        except Exception as exc:  # a metric bug must not lose the row
            result["error"] = {"stage": "metric", "message": f"{name}: {type(exc).__name__}: {exc}",
                               "locator": it.locator}
            record["eval_result"] = result
            return record
        result["metrics"] = metrics
        if counters:
            result["counters"] = counters
        primary = metrics.get(tr.primary)
        pv = metric_value(primary)
        overall: dict[str, Any] = {"score": pv, "metric": tr.primary}
        if isinstance(primary, Mapping):
            overall["passed"] = bool(primary.get("correct", pv is not None and pv >= 1.0 - 1e-9))
            for key in ("extracted", "method", "source"):
                if key in primary:
                    overall[key] = primary[key]
        else:
            overall["passed"] = pv is not None and pv >= 1.0 - 1e-9
        overall.setdefault("method", tr.primary)
        result["overall"] = overall
        record["eval_result"] = result
        return record

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
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
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




class Interrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) or SIGTERM: raised where the run was, handled like Ctrl-C everywhere;
    ``exit_status`` is what the process exits with."""

    def __init__(self, message: str, exit_status: int = EXIT_INTERRUPTED):
        super().__init__(message)
        self.exit_status = exit_status


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Interrupted("terminated (SIGTERM)", EXIT_TERMINATED)


class sigterm_interrupts:
    """Within the block, SIGTERM interrupts the run as Ctrl-C does (the summary of what finished
    is written), instead of killing the process where it stands. Main thread only."""

    def __enter__(self):
        import signal
        import threading

        self._old = None
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGTERM, _on_sigterm)
        return self

    def __exit__(self, *exc: Any) -> None:
        import signal

        if self._old is not None:
            signal.signal(signal.SIGTERM, self._old)


def exit_status(tasks: Mapping[str, Mapping[str, Any]]) -> int:
    """The run's exit status from its tasks' statuses: a failed task outranks errored rows."""
    statuses = {t["status"] for t in tasks.values()}
    if "failed" in statuses or not tasks:
        return EXIT_TASK_FAILED
    return EXIT_ROW_ERRORS if "errors" in statuses else EXIT_OK


def _finished(record: Mapping[str, Any]) -> bool:
    """On resume, a written row counts as done unless a backend failed it (inference or judge):
    those may succeed now that the cause is fixed, so they run again."""
    err = (record.get("eval_result") or {}).get("error")
    return not err or err.get("stage") not in ("inference", "judge")


def _model_output(it: Item, strip_reasoning: bool = False) -> dict:
    """The backend's output with the rendered prompt pieces; for log-likelihood requests the
    chosen continuation (highest log-likelihood) is its text. ``strip_reasoning``: the text after
    the model's reasoning block, the original kept as ``raw_text`` (:mod:`gage_eval.reasoning`)."""
    out = it.output.to_dict() if it.output else {}
    if strip_reasoning:
        strip_output(out)
    out.update({k: v for k, v in it.rendered.items() if k not in out})
    if it.aux_output is not None and it.aux_output.loglikelihoods is not None:
        out["unconditioned_loglikelihoods"] = it.aux_output.loglikelihoods
    if it.request is not None and it.request.kind == LOGLIKELIHOOD and out.get("loglikelihoods"):
        lls = out["loglikelihoods"]
        best = max(range(len(lls)), key=lls.__getitem__)
        out.setdefault("text", it.rendered["choices"][best])
    return out


def _predict_entry(model_output: Mapping[str, Any]) -> dict:
    entry: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": [
        {"type": "text", "text": model_output.get("text") or ""}]}}
    for key in ("prompt", "formatted_prompt", "raw_text", "choices", "continuations", "loglikelihoods",
                "unconditioned_loglikelihoods", "is_greedy",
                "finish_reason", "latency_ms", "time_to_first_token_ms", "raw"):
        if model_output.get(key) is not None:
            entry[key] = model_output[key]
    if model_output.get("input_tokens") is not None or model_output.get("output_tokens") is not None:
        i, o = model_output.get("input_tokens") or 0, model_output.get("output_tokens") or 0
        entry["usage"] = {"input_tokens": i, "output_tokens": o, "total_tokens": i + o}
    return entry


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


def load_options(run_dir: Path) -> RunOptions:
    path = run_dir / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise GageError(f"--resume {run_dir}: no config.json there; is it a gage-eval run folder?") from None
    except (OSError, ValueError) as exc:
        raise GageError(f"--resume {run_dir}: {path} is unreadable ({exc}); the run cannot be resumed") from None
    known = {f.name for f in fields(RunOptions)}
    if not isinstance(data, dict) or not {"tasks"} <= set(data) <= known:
        extra = sorted(set(data) - known) if isinstance(data, dict) else []
        raise GageError(f"--resume {run_dir}: {path} is not a gage-eval run config"
                        + (f" (unknown keys: {', '.join(extra)})" if extra else ""))
    return RunOptions(**data)
