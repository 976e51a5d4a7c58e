"""A task in a run: its components built from task.yaml, its rows (:class:`~gage_eval.engine.row.Row`),
its counts, timings and summary; building backends. Task names become specs in
:mod:`gage_eval.tasks.resolve`."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterator, Mapping

from gage_eval.api.backend import Backend
from gage_eval.api.errors import GageError
from gage_eval.engine.executor import make_backend, model_backend
from gage_eval.engine.hints import chat_template_hint
from gage_eval.engine.idset import IdSet
from gage_eval.engine.repeats import Repeats
from gage_eval.engine.row import Row
from gage_eval.api.metric import MISSING_FIELD_POLICIES, MissingFieldPolicy, TaskAggregate
from gage_eval.api.options import use_run_values
from gage_eval.config.options import RunOptions, shuffled_pick
from gage_eval.plugins import Registry
from gage_eval.tasks.requests import RequestBuilder
from gage_eval.tasks.rows import RowChecker
from gage_eval.api.sample import SCHEMA_VERSION
from gage_eval.api.schemas import field_message
from gage_eval.engine.summary import STAGES, derived_timings
from gage_eval.tasks.spec import TaskSpec
from gage_eval.tasks.toolcheck import check_metric_sandbox

MAX_WARNINGS_SHOWN = 20  # per task, on the console; events.jsonl has all of them


def scrubbed_count(part: Any) -> int:
    """``secrets_scrubbed`` of a record's eval_result (the model's replies) or of its judge entry
    (the judge's): present only when a reply quoted a secret."""
    n = part.get("secrets_scrubbed") if isinstance(part, Mapping) else None
    return n if type(n) is int and n > 0 else 0


def error_stub(task: str, index: int, locator: str, stage: str, message: str, sample_id: str | None = None,
               row_id: str | None = None) -> dict:
    """The record written for a row that never became a valid Sample: ``TASK-row-N``, the row's own
    id (``row_id``, when it has one) in its metadata (an invalid row does not take its id)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "id": sample_id or f"{task}-row-{index}",
        "messages": [],
        "references": [],
        "metadata": {"locator": locator, **({"row_id": row_id} if row_id else {})},
        "eval_result": {"error": {"stage": stage, "message": message, "locator": locator}},
    }


def _named(files: list[Path]) -> str:
    """Data files in a message: the first three, and how many more."""
    return ", ".join(map(str, files[:3])) + (f" and {len(files) - 3} more" if len(files) > 3 else "")


class WriteOrder:
    """Whether a task's rows went to its writers in the data's order: each row written is the
    data's next one, counted from its first, and none is an error stub or a row that came scored
    (so the n-th record of ``samples/<task>.jsonl`` is the n-th row that passed its checks, the
    position the report shows). A row out of turn (a backend, the judge or a background metric
    finished it early, a window wrote its failed rows first, ``--shard`` or ``--resume`` skipped
    rows) ends it for the task; :meth:`TaskRun.in_data_order` also counts kept records."""

    def __init__(self) -> None:
        self.rows = 0  # rows written (noted here)
        self.kept = True  # every one so far the data's next

    def note(self, row: Row) -> None:
        """One row written (:meth:`TaskRun.account` of its record)."""
        self.kept = self.kept and row.index == self.rows and "eval_result" not in row.sample
        self.rows += 1

    def lost(self) -> None:
        """The rows are numbered otherwise than by their place in the data (a rescore's stored rows)."""
        self.kept = False


class TaskRun:
    """The per-task state: components built from the task file, counters, timings."""

    def __init__(self, spec: TaskSpec, registry: Registry, options: RunOptions, failure: str | None = None):
        self.spec = spec
        self.name = spec.name
        self.repeated: dict[tuple, int] = {}  # console: each distinct row error -> rows not shown again
        self.failure = failure  # why the task could not run (or stopped), when it did not
        self.ended = False  # the engine (or merge) finished the task: set as it does
        self.options = options
        overrides = options.task_overrides.get(spec.name) or {}
        self.limit = overrides.get("limit", options.limit)
        self.shuffle = bool(overrides.get("shuffle", options.shuffle))  # (the run config's per-task keys)
        seed = overrides.get("shuffle_seed", options.shuffle_seed)
        self.shuffle_seed = (seed if seed is not None else options.seed) if self.shuffle else None
        self._counted: int | None = None
        self.aggregate = TaskAggregate(cluster_by=spec.cluster_by)
        self.counts = {"total": 0, "scored": 0, "errored": 0, "skipped": 0, "judge_errors": 0}
        self.errors_by_stage: dict[str, int] = {}
        self.timings = dict.fromkeys(STAGES, 0.0)
        self.extra_counts: dict[str, int] = {}
        self.sections: dict[str, dict[str, int]] = {}  # what backend wrappers count (api.running.Tally)
        self.metrics: list = []
        self.higher: dict[str, bool] = {}  # each metric's higher_is_better (summary.json)
        self.background = False  # a metric scores in the background (submit: gage_eval.engine.background)
        self.judge = None
        self.primary = spec.primary_metric
        self.repeats = Repeats(spec.repeats, options.repeats, options.seed)
        self.order = WriteOrder()  # whether the rows are written in the data's order (account notes them)
        if failure is None:
            use_run_values(options.plugin_options)  # (a component may read them while built: api.options.run_value)
            try:
                self._build(registry)
            except GageError as exc:
                self.failure = str(exc)

    def _build(self, registry: Registry) -> None:
        spec = self.spec
        where = f"task {spec.name!r} ({spec.folder / 'task.yaml'})"
        ds = spec.dataset
        self.loader = registry.build("loaders", ds["loader"], where, "dataset.loader",
                                 **(ds.get("args") or {}), base_dir=str(spec.folder))
        self.data_dir = Path(getattr(self.loader, "data_dir", None) or spec.folder)
        pre = spec.preprocessor
        self.preprocess = registry.build("preprocessors", pre["name"], where, "preprocessor",
                                     **(pre.get("args") or {}))
        for i, entry in enumerate(spec.metrics):
            entry = {"name": entry} if isinstance(entry, str) else entry
            args = dict(entry.get("args") or {})
            policy = args.pop("on_missing_field", "error")
            if policy not in MISSING_FIELD_POLICIES:
                raise GageError(f"{where}: key 'metrics.{i}.args.on_missing_field': expected one of "
                                f"{', '.join(MISSING_FIELD_POLICIES)}, not {policy!r}")
            check_metric_sandbox(spec, i, args)  # (its key and line; the metric would open it without)
            metric = registry.build("metrics", entry["name"], where, f"metrics.{i}", **args)
            self.metrics.append((entry.get("as", entry["name"]),
                                 metric if policy == "error" else MissingFieldPolicy(metric, policy)))
        self.aggregate.corpus = {name: m.aggregate for name, m in self.metrics if getattr(m, "corpus", False)}
        self.higher = {name: getattr(m, "higher_is_better", True) for name, m in self.metrics}
        self.background = any(callable(getattr(m, "submit", None)) for _, m in self.metrics)
        self.primary = spec.primary_metric or self.metrics[0][0]
        if spec.judge:
            self.judge = registry.build("judges", spec.judge["name"], where, "judge",
                                    **(spec.judge.get("args") or {}), base_dir=str(spec.folder))
        self.builder = RequestBuilder(spec, self.options, registry, metrics=[m for _, m in self.metrics])
        files = self.dataset_files()
        if files and all(f.stat().st_size == 0 for f in files):  # said before any model loads
            raise GageError(f"no rows: {_named(files)} is empty")

    def dataset_files(self) -> list[Path]:
        """The local files the loader reads rows from; none for a hub dataset."""
        files = getattr(self.loader, "files", None)
        listed = files() if callable(files) else None
        if listed is not None:
            return [Path(f) for f in listed]
        data_files = getattr(self.loader, "data_files", None)
        if isinstance(data_files, str):
            data_files = [data_files]
        elif isinstance(data_files, Mapping):
            data_files = [f for v in data_files.values() for f in ([v] if isinstance(v, str) else v)]
        return [Path(f) for f in data_files or [] if Path(f).is_file()]

    def data_files(self) -> list[Path]:
        """The local files the task reads besides its folder (for the resume check): the loader's,
        and a few-shot file outside the folder; none for a hub dataset."""
        shots = (self.spec.raw.get("fewshot") or {}).get("path") if isinstance(self.spec.raw, Mapping) else None
        extra = [self.spec.folder / shots] if isinstance(shots, str) else []
        given = self.options.fewshot_data.get(self.name)  # --fewshot-data: a file, or a folder of them
        if given:
            extra = [Path(given)] if Path(given).is_file() else sorted(Path(given).rglob("*"))
        return self.dataset_files() + [p for p in extra if p.is_file()]

    def data_source(self) -> dict | None:
        """Where the rows come from (summary.json): ``--data``'s path, else what the loader says
        (``Loader.source``: the hub, an installed data package, a saved folder), else None."""
        if self.name in self.options.data:
            return {"from": "--data", "path": str(self.options.data[self.name])}
        source = getattr(getattr(self, "loader", None), "source", None)
        return dict(source) if isinstance(source, Mapping) else None

    def data_note(self) -> str | None:
        """:meth:`data_source` in words, for the console (None: nothing to say)."""
        shots = getattr(getattr(self, "builder", None), "fewshot_note", None)
        if self.name in self.options.data:
            note = f"rows from --data {self.options.data[self.name]}"
        else:
            note = getattr(getattr(self, "loader", None), "source_note", None)
        return "; ".join(n for n in (note, shots) if isinstance(n, str) and n) or None

    def available(self) -> int | None:
        """The dataset's row count when the loader knows it cheaply (``total()``), else None."""
        total = getattr(self.loader, "total", None)
        if not callable(total):
            return None
        try:
            n = total()
        except Exception:  # a count is a nicety; reading the rows reports what is wrong, failing the task
            return None
        return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else None

    def count(self) -> int:
        """The task's row count: the loader's ``total()``, else the rows counted (one pass)."""
        if self._counted is None:
            n = self.available()
            self._counted = n if n is not None else sum(1 for _ in self.loader)
        return self._counted

    def row_limit(self) -> int | None:
        """``limit`` as a row count: a fraction in (0, 1] of the task's rows is rounded up
        (lm-eval's rule); the rows are counted when the loader cannot say."""
        limit = self.limit
        if limit is None or isinstance(limit, int):
            return limit
        return self.count() if limit >= 1 else math.ceil(self.count() * limit)

    def expected(self) -> int | None:
        """How many rows this run of the task will see, for the progress bar (None: unknown, and
        when the data cannot be read: reading the rows then fails the task with the reason)."""
        try:
            n, limit = self.available(), self.row_limit()
        except (GageError, OSError):
            return None
        if n is None:
            return limit
        return n if limit is None else min(n, limit)

    def rows(self) -> Iterator[tuple[int, str, Any]]:
        """The rows this run takes, as (position, locator, record), in the data's order: the
        first ``limit``, or with ``shuffle`` a seeded random ``limit`` of them
        (:func:`~gage_eval.config.options.shuffled_pick`), still read in one pass in the data's order
        (positions, and so few-shot draws, are the data's)."""
        limit = self.row_limit()
        if limit is not None and limit <= 0:
            return
        if self.shuffle and limit is not None and limit < self.count():
            picked, left = shuffled_pick(self.count(), limit, self.shuffle_seed), limit
            for index, (locator, record) in enumerate(self.loader):
                if picked(index):
                    yield index, locator, record
                    left -= 1
                    if not left:
                        break
            return
        for index, (locator, record) in enumerate(self.loader):
            yield index, locator, record
            if limit is not None and index + 1 >= limit:
                break

    def items(self, allowed_dirs: tuple[Path, ...] = (), allow_urls: bool = False, seen: IdSet | None = None
              ) -> Iterator[tuple[Row, list[tuple[str, str]]]]:
        """Each row checked as ``gage-eval validate`` checks it (:mod:`gage_eval.tasks.rows`) and built
        into its request, with its warnings as (field, message): a row with its request, a row
        whose template failed (``error``), or an error stub for a row that is no valid Sample.
        A run and ``--dry-run`` both read rows through here."""
        checker = RowChecker(self.name, self.preprocess, base_dir=self.data_dir, allowed_dirs=allowed_dirs,
                             allow_urls=allow_urls, seen=seen)
        for index, locator, record in self.rows():
            row = checker.check(locator, index, record)
            warnings = [(where, field_message(where, what)) for where, what in row.warnings] if row.warnings else []
            if row.sample is None:  # (not row.ok)
                yield Row(index, locator, error_stub(self.name, index, locator, row.stage, row.message,
                                                     row_id=row.row_id)), warnings
                continue
            try:
                request, rendered = self.builder.build(row.sample, index)
            except ValueError as exc:
                yield Row(index, locator, row.sample, error={"stage": "template", "message": str(exc),
                                                             "locator": locator}), warnings
                continue
            built = Row(index, locator, row.sample, request, rendered)
            yield from self.repeats.expand(built, warnings) if self.repeats.n > 1 else ((built, warnings),)

    def account(self, record: Mapping[str, Any], row: Row | None = None) -> None:
        """Count one written record and add its metric values; used live (with the ``row`` it was
        written for, noted in :attr:`order`) and on resume (a kept record: no row)."""
        if row is not None:
            self.order.note(row)
        result = record.get("eval_result") or {}
        self.counts["total"] += 1
        scrubbed = scrubbed_count(result) + scrubbed_count(result.get("judge"))
        if scrubbed:
            self.counts["secrets_scrubbed"] = self.counts.get("secrets_scrubbed", 0) + scrubbed
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
        if self.aggregate.add_result(result.get("metrics") or {}, record.get("data_tag"), record):
            self.counts["scored"] += 1
        else:
            self.counts["skipped"] += 1

    def in_data_order(self) -> bool:
        """Whether ``samples/<task>.jsonl`` holds the task's records in its data's order, the n-th
        record the n-th row that passed its checks (:class:`WriteOrder`):
        every record written this run (none kept from before a resume), the task not stopped part way."""
        return self.failure is None and self.order.kept and self.order.rows == self.counts["total"]

    def status(self, max_error_rate: float = 0.0) -> tuple[str, str | None]:
        """``ok``, ``errors`` (rows errored, more than ``max_error_rate`` of them) or ``failed``
        (the task could not run, or no row was scored), with the reason."""
        c = self.counts
        if self.failure:
            return "failed", self.failure
        if c["total"] == 0:
            if not self.ended:  # (not the data's fault: the run stopped before the task wrote a row)
                return "failed", "not run: the run stopped before this task wrote a row"
            files = self.dataset_files() if hasattr(self, "loader") else []
            if self.options.shard:  # (the shard's choice left none, not the data)
                return "failed", f"no rows: shard {self.options.shard} holds none of the task's rows"
            return "failed", (f"no rows: {_named(files)} gave no row to run" if files
                              else "no rows: the dataset is empty")
        if c["scored"] == 0:
            why = (f"all {c['total']} rows errored" if c["errored"] == c["total"]
                   else f"no row was scored ({c['errored']} errored, {c['skipped']} had no metric value)")
            return "failed", why
        if c["errored"] and c["errored"] / c["total"] > max_error_rate:
            return "errors", f"{c['errored']} of {c['total']} rows errored"
        return "ok", None

    def summary(self, max_error_rate: float = 0.0) -> dict:
        agg = self.aggregate.result(seed=f"{self.options.seed}:{self.name}")  # the bootstrap's seed
        for name, entry in agg["metrics"].items():
            entry["higher_is_better"] = self.higher.get(name, True)
        t = derived_timings(self.timings, self.counts["total"])
        status, reason = self.status(max_error_rate)
        return {
            "task": self.name,
            "status": status,
            "failure": reason,
            "source": {"folder": str(self.spec.folder), "origin": self.spec.origin,
                       **({"dataset": self.data_source()} if self.data_source() else {}),
                       **({"fewshot": self.builder.fewshot_source} if getattr(self, "builder", None) is not None
                          and self.builder.fewshot_source else {})},
            "primary_metric": self.primary,
            "metrics": agg["metrics"],
            "slices": agg["slices"],
            "counts": dict(self.counts, **({"by_counter": self.extra_counts} if self.extra_counts else {})),
            "errors_by_stage": self.errors_by_stage,
            "timings": {k: round(v, 6) for k, v in t.items()},
            **{name: dict(part) for name, part in self.sections.items()},
            **(self.repeats.summary() if self.repeats.n > 1 else {}),
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


def make_backends(registry: Registry, opts: RunOptions, ready: list["TaskRun"]) -> tuple[Backend, Backend]:
    """The model's backend and the judge's (the same object when they are the same), checked
    against what the tasks that can run need."""
    backend = model_backend(registry, opts.model, opts.model_args, opts.batch_size, opts.seed, opts.executor,
                            opts.as_dict())
    judge_backend = backend
    if any(tr.judge for tr in ready):
        if opts.judge_model and (opts.judge_model, opts.judge_args) != (opts.model, opts.model_args):
            judge_backend = make_backend(registry, opts.judge_model, opts.judge_args, opts.batch_size, opts.seed)
        _check_capabilities([tr.spec for tr in ready if tr.judge], judge_backend,
                            opts.judge_model or opts.model, role="judge model")
    _check_capabilities([tr.spec for tr in ready], backend, opts.model, chat=opts.apply_chat_template)
    chat_template_hint(backend, opts, [tr.spec for tr in ready])
    return backend, judge_backend
