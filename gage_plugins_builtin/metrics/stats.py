"""Descriptive per-sample values: latency and text length."""
from __future__ import annotations

from gage_eval.api import Metric, MetricContext
from gage_plugins_builtin.metrics.fields import DEFAULT_PREDICTION, prediction


class Latency(Metric):
    """The request's latency in milliseconds (``model_output.latency_ms`` by default)."""

    name = "latency"
    higher_is_better = False

    def __init__(self, target: str = "model_output.latency_ms"):
        self.target = target

    def compute(self, ctx: MetricContext):
        value = ctx.get(self.target, None)
        return None if value is None else float(value)


class TextLength(Metric):
    """Length of the prediction in characters (``unit: char``) or words (``unit: word``)."""

    name = "text_length"
    higher_is_better = False

    def __init__(self, target: str = DEFAULT_PREDICTION, unit: str = "char"):
        if unit not in ("char", "word"):
            raise ValueError(f"text_length: unit must be 'char' or 'word', not {unit!r}")
        self.target = target
        self.unit = unit

    def compute(self, ctx: MetricContext) -> float:
        text = prediction(ctx, self.target)
        return float(len(text) if self.unit == "char" else len(text.split()))
