"""The metric contract, field paths, and streaming aggregation (mean, stderr, slices)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Mapping

from gage_eval.errors import GageError

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

    def compute(self, ctx: MetricContext) -> Any:
        raise NotImplementedError


def metric_value(result: Any) -> float | None:
    t = type(result)
    if t is dict:
        value = result.get("value")
    elif t is float or t is int or t is bool:
        value = result
    else:
        value = result.get("value") if isinstance(result, Mapping) else result
    if type(value) is float:
        return value
    if value is None:
        return None
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    raise GageError(f"metric returned {value!r}; a metric value must be a number or bool")


@dataclass
class MeanAccumulator:
    """Running mean and sample variance (Welford), so memory does not grow with n."""

    n: int = 0
    mean: float = 0.0
    m2: float = 0.0

    def add(self, x: float) -> None:
        self.n += 1
        delta = x - self.mean
        self.mean += delta / self.n
        self.m2 += delta * (x - self.mean)

    def result(self) -> dict[str, Any]:
        if self.n == 0:
            return {"value": None, "stderr": None, "n": 0}
        # standard error of the mean with the sample (n-1) variance, as lm-eval reports it
        stderr = math.sqrt(self.m2 / (self.n - 1) / self.n) if self.n > 1 else None
        return {"value": self.mean, "stderr": stderr, "n": self.n}


@dataclass
class TaskAggregate:
    """Aggregates for one task: each metric overall and by each ``data_tag`` value."""

    metrics: dict[str, MeanAccumulator] = field(default_factory=dict)
    slices: dict[str, dict[str, dict[str, MeanAccumulator]]] = field(default_factory=dict)

    def add(self, values: Mapping[str, float | None], data_tag: Mapping[str, Any] | None) -> None:
        metrics = self.metrics
        for name, value in values.items():
            if value is None:
                continue
            acc = metrics.get(name)
            if acc is None:
                acc = metrics[name] = MeanAccumulator()
            acc.add(value)
            if not data_tag:
                continue
            for key, tag in data_tag.items():
                tags = tag if isinstance(tag, list) else [tag]
                for t in tags:
                    by_value = self.slices.setdefault(key, {}).setdefault(str(t), {})
                    by_value.setdefault(name, MeanAccumulator()).add(value)

    def result(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, acc in self.metrics.items():
            out[name] = acc.result()
        slices = {
            key: {value: {name: acc.result() for name, acc in metrics.items()}
                  for value, metrics in sorted(by_value.items())}
            for key, by_value in sorted(self.slices.items())
        }
        return {"metrics": out, "slices": slices}
