"""The metric contract, field paths, and streaming aggregation (mean, stderr, slices)."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping

from gage_eval.api.errors import GageError
from gage_eval.api.stats import ClusterSums, MeanAccumulator, results, slice_results

ROOTS = ("sample", "model_output", "judge_output")
_MISSING = object()


@dataclass(frozen=True)
class MetricContext:
    """What a metric reads: the Sample, the model's output and the judge's verdict."""

    sample: Mapping[str, Any]
    model_output: Mapping[str, Any]
    judge_output: Mapping[str, Any] | None = None

    def get(self, path: str, default: Any = _MISSING) -> Any:
        """Read a dotted path such as ``sample.references.0.answer`` or ``model_output.text``."""
        head, parts = _split_path(path) if type(path) is str else _split_path.__wrapped__(path)
        if head not in ROOTS:
            raise GageError(f"field path {path!r} must start with one of {', '.join(ROOTS)}")
        value: Any = getattr(self, head)
        for part in parts:
            if type(value) is dict:  # the usual case: a plain dict, no typing.Mapping check
                if part in value:
                    value = value[part]
                    continue
            elif isinstance(value, Mapping) and part in value:
                value = value[part]
                continue
            if isinstance(value, (list, tuple)) and part.lstrip("-").isdigit() and -len(value) <= int(part) < len(value):
                value = value[int(part)]
            else:
                if default is _MISSING:
                    raise KeyError(f"field {path!r} is missing (no {part!r})")
                return default
        return value


@lru_cache(maxsize=4096)
def _split_path(path: str) -> tuple[str, tuple[str, ...]]:
    """``a.b.c`` as ``("a", ("b", "c"))``; metrics read the same few paths on every row."""
    head, _, rest = path.partition(".")
    return head, tuple(rest.split(".")) if rest else ()


class Metric:
    """Base class for metrics.

    ``compute`` returns the per-sample value (a number or bool), or a dict with
    ``value`` plus any details to keep in the sample's eval_result (the keys the core
    reads are listed in docs/hooks.md, "Result keys"). Every metric is aggregated the
    same way: the mean with its standard error, overall and per ``data_tag`` value.
    ``higher_is_better`` is reported in summary.json. ``needs_unconditioned``: each
    log-likelihood request also scores the choices after the unconditioned context
    (``model_output.unconditioned_loglikelihoods``; acc_mutual_info).
    """

    name: str = "metric"
    higher_is_better: bool = True
    needs_unconditioned: bool = False
    # A corpus-level metric (an F1 over the whole set) sets ``corpus = True``: each row's result is a
    # dict whose ``item`` (any JSON value: (gold, prediction)) is kept, and the task's value is
    # ``aggregate(items)`` over its rows (each data_tag slice: over the slice's rows), with no stderr.
    corpus: bool = False

    def compute(self, ctx: MetricContext) -> Any:
        raise NotImplementedError

    def aggregate(self, items: list) -> float | None:
        """A corpus-level metric's value over the rows' items (only called when ``corpus``)."""
        raise NotImplementedError


MISSING_FIELD_POLICIES = ("error", "warn", "ignore")


class MissingFieldPolicy:
    """A metric entry's ``on_missing_field`` (spec 004 section 7.6) around its metric: a field
    path the row lacks (the metric raises ``KeyError``) errors the row (``error``, the default:
    no wrapper), or scores 0 (``ignore``), or scores 0 and counts the row under the metric's
    ``missing_field`` counter in summary.json (``warn``). Every other failure still errors the row."""

    def __init__(self, metric: Any, policy: str):
        self.metric, self.policy = metric, policy

    def __getattr__(self, name: str) -> Any:  # name, higher_is_better, needs_unconditioned, ...
        return getattr(self.metric, name)

    def compute(self, ctx: MetricContext) -> Any:
        try:
            return self.metric.compute(ctx)
        except KeyError as exc:
            missing = str(exc.args[0]) if exc.args else "a field"
            if self.policy == "ignore":
                return {"value": 0.0, "missing_field": missing}
            return {"value": 0.0, "missing_field": missing, "counters": ["missing_field"]}


def metric_value(result: Any) -> float | None:
    """The number a metric's result counts as (None: no value for this row). A value that is
    no number, or is NaN or infinite, raises: the row is written with a metric error, never
    averaged into a NaN or a null aggregate."""
    t = type(result)
    if t is dict:
        value = result.get("value")
    elif t is float or t is int or t is bool:
        value = result
    else:
        value = result.get("value") if isinstance(result, Mapping) else result
    if type(value) is float:
        if value - value == 0.0:  # (finite: NaN and the infinities give NaN)
            return value
    elif value is None:
        return None
    elif isinstance(value, bool):
        return float(value)
    elif isinstance(value, (int, float)):
        if math.isfinite(value):
            return float(value)
    else:
        raise GageError(f"metric returned {value!r}; a metric value must be a number or bool")
    raise GageError(f"metric returned {value!r}; a metric value must be a finite number")


def cluster_key(record: Mapping[str, Any], path: str) -> str | None:
    """The value at ``sample.<path>`` in a written record as a cluster key; None when absent."""
    value = MetricContext(sample=record, model_output={}).get(path, None)
    if value is None:
        return None
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


class CorpusItems:
    """A corpus-level metric's rows: their items, kept to the end, and the metric's own aggregate."""

    __slots__ = ("items", "aggregate")

    def __init__(self, aggregate: Any) -> None:
        self.items: list = []
        self.aggregate = aggregate

    def add(self, item: Any) -> None:
        self.items.append(item)

    @property
    def n(self) -> int:
        return len(self.items)

    def result(self, seed: str | None = None) -> dict[str, Any]:
        value = self.aggregate(list(self.items)) if self.items else None
        if value is not None:
            value = metric_value(value)
        return {"value": value, "stderr": None, "n": self.n, "aggregation": "corpus"}


class TaskAggregate:
    """Aggregates for one task: each metric overall and by each ``data_tag`` value; with
    ``cluster_by`` (task.yaml ``stderr.cluster_by``, a ``sample.`` field path) also each
    metric's cluster-robust stderr over the clusters that field's values make."""

    def __init__(self, cluster_by: str | None = None) -> None:
        self.metrics: dict[str, MeanAccumulator] = {}
        self.slices: dict[str, dict[str, dict[str, MeanAccumulator]]] = {}
        self.cluster_by = cluster_by
        self.clusters: dict[str, ClusterSums] = {}
        self.corpus: dict[str, Any] = {}  # name -> aggregate(items) of the corpus-level metrics

    def add_result(self, metrics: Mapping[str, Any], data_tag: Mapping[str, Any] | None,
                   record: Mapping[str, Any] | None = None) -> bool:
        """Add a written record's metric results (its ``eval_result.metrics``); False when none
        had a value (the row counts as skipped and adds nothing)."""
        values = {name: metric_value(v) for name, v in metrics.items()}
        corpus = self.corpus
        items = {name: v["item"] for name, v in metrics.items()
                 if name in corpus and isinstance(v, Mapping) and "item" in v} if corpus else None
        if all(v is None for v in values.values()) and not items:
            return False
        self.add(values, data_tag, record, items)
        return True

    def add(self, values: Mapping[str, float | None], data_tag: Mapping[str, Any] | None,
            record: Mapping[str, Any] | None = None, items: Mapping[str, Any] | None = None) -> None:
        metrics = self.metrics
        key = cluster_key(record, self.cluster_by) if self.cluster_by and record is not None else None
        # the row's (tag key, tag value) pairs, worked out once for all its metrics
        tagged = [(tag_key, str(t)) for tag_key, tag in data_tag.items()
                  for t in (tag if isinstance(tag, list) else [tag])] if data_tag else ()
        for name, value in values.items():
            if value is None:
                continue
            acc = metrics.get(name)
            if acc is None:
                acc = metrics[name] = MeanAccumulator()
            acc.add(value)
            if self.cluster_by:
                sums = self.clusters.get(name)
                if sums is None:
                    sums = self.clusters[name] = ClusterSums()
                sums.add(key, value)
            for tag_key, tag_value in tagged:
                by_value = self.slices.setdefault(tag_key, {}).setdefault(tag_value, {})
                acc = by_value.get(name)
                if acc is None:  # (not setdefault: that builds an accumulator on every row)
                    acc = by_value[name] = MeanAccumulator()
                acc.add(value)
        for name, item in (items or {}).items():  # corpus-level metrics: kept whole, aggregated at the end
            aggregate = self.corpus[name]
            for by_value in [metrics] + [self.slices.setdefault(k, {}).setdefault(v, {}) for k, v in tagged]:
                kept = by_value.get(name)
                if kept is None:
                    kept = by_value[name] = CorpusItems(aggregate)
                kept.add(item)

    def result(self, seed: str | int | None = None) -> dict[str, Any]:
        """Each metric's and slice's mean and stderr; with ``seed`` (the run's seed, with the task's
        name) also their 95% intervals, the bootstrap for metric M seeded by ``seed:M`` (and
        ``seed:M:key=value`` for a slice), so each is reproducible on its own."""
        out = results(self.metrics, seed)
        if self.cluster_by:
            for name, sums in self.clusters.items():
                out[name].update(sums.result(), cluster_by=self.cluster_by)
        return {"metrics": out, "slices": slice_results(self.slices, seed) if self.slices else {}}
