"""Reading a metric's prediction and references through field paths.

Besides gage-eval's own paths (``model_output.text``, ``sample.references``, ``sample.label``,
``sample.options``), :func:`spec_get` reads the field paths of spec 004 (the seed system's metric
``params``, section 10.8): a path without a root (``label``) starts at ``sample``, as the spec
says, and a spec canonical path that a gage-eval record does not have is read where gage-eval keeps
the same thing (:data:`SPEC_FALLBACKS`), so a metric entry written for the spec reads the same
values here. Only a path that is absent falls back: a path that is present is read as given.
"""
from __future__ import annotations

from typing import Any

from gage_eval.api import MetricContext, content_text, reference_text

DEFAULT_PREDICTION = "model_output.text"
DEFAULT_REFERENCE = "sample.references"

ROOTS = ("sample", "model_output", "judge_output")

# spec 004 canonical field (sections 8, 10.8.3) -> where a gage-eval record keeps it
SPEC_FALLBACKS = {
    "model_output.answer": "model_output.text",
    "sample.label": "sample.references",
    "sample.metadata.correct_choice": "sample.label",
    "sample.metadata.option_map": "sample.options",
    "sample.metadata.answers": "sample.references",
    "sample.choices.0.message.content.0.text": "sample.references",
    "judge_output.answer": "judge_output.raw",  # the judge's reply (spec 004 section 6.4.3)
}

_MISSING = object()


def spec_path(path: str) -> str:
    """``path`` with its root: a spec path without one (``label``) starts at ``sample``."""
    if not isinstance(path, str) or not path:
        raise ValueError(f"a field path must be a non-empty string, not {path!r}")
    return path if path.partition(".")[0] in ROOTS else "sample." + path


def spec_get(ctx: MetricContext, path: str, default: Any = _MISSING) -> Any:
    """The value at a spec 004 field path (:func:`spec_path`); an absent canonical path is read at
    its gage-eval place (:data:`SPEC_FALLBACKS`). Absent: ``default``, else ``KeyError``."""
    full = spec_path(path)
    value = ctx.get(full, _MISSING)
    if value is _MISSING and full in SPEC_FALLBACKS:
        value = ctx.get(SPEC_FALLBACKS[full], _MISSING)
    if value is _MISSING:
        if default is _MISSING:
            raise KeyError(f"field {path!r} is missing")
        return default
    return value


def pick(metric: str, given: dict[str, Any], default: Any) -> Any:
    """The one value given under any of several argument names (gage-eval's and the spec's
    synonyms, e.g. ``prediction`` and ``prediction_field``); ``default`` when none is given."""
    set_ = {k: v for k, v in given.items() if v is not None}
    if len(set_) > 1:
        raise ValueError(f"{metric}: give one of {', '.join(sorted(set_))}, not both")
    return next(iter(set_.values())) if set_ else default


def as_texts(value: Any) -> list[str]:
    """References in any accepted shape (a string, a list of strings or reference items) as texts."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(v, dict) and v.get("type") for v in value):
            return [content_text(value)]  # a segment list is one answer
        return [reference_text(v) for v in value]
    return [reference_text(value)]


def text_of(value: Any) -> str:
    """A prediction value as text: a list of content segments joined, None as ``""``."""
    if isinstance(value, list):
        return content_text(value)
    return "" if value is None else str(value)


def prediction(ctx: MetricContext, path: str) -> str:
    return text_of(spec_get(ctx, path))


def references(ctx: MetricContext, path: str) -> list[str]:
    refs = as_texts(spec_get(ctx, path, None))
    if not refs:
        raise ValueError(f"no reference at {path!r}")
    return refs


def strip_blocks(text: str, names: tuple[str, ...], then_space: bool = False) -> str:
    """``text`` without its ``<NAME>...</NAME>`` blocks (any case; with ``then_space`` the whitespace
    after each too), as ``re.sub(r"<(NAME|...)>.*?</\\1>\\s*", "", text, flags=re.S | re.I)`` leaves it,
    in one pass: that pattern scanned to the end of the text at each opening tag never closed."""
    import bisect
    import re

    alternation = "|".join(map(re.escape, names))
    closes: dict[str, list[tuple[int, int]]] = {}
    for m in re.finditer(f"</({alternation})>", text, re.I):
        closes.setdefault(m.group(1).lower(), []).append((m.start(), m.end()))
    out, done = [], 0
    for m in re.finditer(f"<({alternation})>", text, re.I):
        found = closes.get(m.group(1).lower(), [])
        k = bisect.bisect_left(found, (m.end(), -1))
        if m.start() < done or k == len(found):
            continue
        end = found[k][1]
        while then_space and end < len(text) and text[end].isspace():
            end += 1
        out.append(text[done:m.start()])
        done = end
    return "".join(out) + text[done:]
