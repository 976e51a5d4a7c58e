"""Reading a metric's prediction and references through field paths."""
from __future__ import annotations

from typing import Any

from gage_eval.api import MetricContext, content_text, reference_text

DEFAULT_PREDICTION = "model_output.text"
DEFAULT_REFERENCE = "sample.references"


def as_texts(value: Any) -> list[str]:
    """References in any accepted shape (a string, a list of strings or reference items) as texts."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(v, dict) and v.get("type") for v in value):
            return [content_text(value)]  # a segment list is one answer
        return [reference_text(v) for v in value]
    return [reference_text(value)]


def prediction(ctx: MetricContext, path: str) -> str:
    value = ctx.get(path)
    if isinstance(value, list):
        return content_text(value)
    return "" if value is None else str(value)


def references(ctx: MetricContext, path: str) -> list[str]:
    refs = as_texts(ctx.get(path))
    if not refs:
        raise ValueError(f"no reference at {path!r}")
    return refs
