"""Text comparison metrics: exact_match, contains, regex_match, numeric_match.

Each also takes the argument names of spec 004 section 8 (``label_field``, ``prediction_field``,
``target_field``, ``case_sensitive``), so a metric entry written for the spec works unchanged;
the spec's ``value_key`` is ``score`` for all four."""
from __future__ import annotations

import math
import re
import string

from gage_eval.api import Metric, MetricContext
from gage_plugins_builtin.metrics.fields import DEFAULT_PREDICTION, DEFAULT_REFERENCE, pick, prediction, references

_PUNCT = str.maketrans("", "", string.punctuation)


def normalize(text: str, ignore_case: bool, ignore_punctuation: bool, strip: bool = True) -> str:
    if ignore_case:
        text = text.lower()
    if ignore_punctuation:
        text = text.translate(_PUNCT)
    return " ".join(text.split()) if strip else text


class _Comparison(Metric):
    """Compare the prediction with each reference; the best match counts."""

    value_key = "score"

    def __init__(self, prediction: str | None = None, reference: str | None = None,
                 ignore_case: bool | None = None, ignore_punctuation: bool = False, strip: bool = True,
                 prediction_field: str | None = None, label_field: str | None = None,
                 case_sensitive: bool | None = None):
        self.prediction_path = pick(self.name, {"prediction": prediction, "prediction_field": prediction_field},
                                    DEFAULT_PREDICTION)
        self.reference_path = pick(self.name, {"reference": reference, "label_field": label_field},
                                   DEFAULT_REFERENCE)
        sensitive = pick(self.name, {"ignore_case": None if ignore_case is None else not ignore_case,
                                     "case_sensitive": case_sensitive}, False)
        self.opts = dict(ignore_case=not sensitive, ignore_punctuation=ignore_punctuation, strip=strip)

    def match(self, pred: str, ref: str) -> bool:
        raise NotImplementedError

    def compute(self, ctx: MetricContext) -> dict:
        pred = prediction(ctx, self.prediction_path)
        refs = references(ctx, self.reference_path)
        p = normalize(pred, **self.opts)
        hit = any(self.match(p, normalize(r, **self.opts)) for r in refs)
        return {"value": float(hit), "extracted": pred, "method": self.name}


class ExactMatch(_Comparison):
    """1 when the normalised prediction equals a normalised reference."""

    name = "exact_match"

    def match(self, pred: str, ref: str) -> bool:
        return pred == ref


class Contains(_Comparison):
    """1 when a normalised reference occurs in the normalised prediction."""

    name = "contains"

    def match(self, pred: str, ref: str) -> bool:
        return bool(ref) and ref in pred


class RegexMatch(Metric):
    """1 when ``pattern`` matches the field (``search`` semantics). With
    ``compare_group``, the captured group is compared with the references instead."""

    name = "regex_match"
    value_key = "score"

    def __init__(self, pattern: str, target: str | None = None, flags: str = "",
                 compare_group: int | None = None, reference: str | None = None, ignore_case: bool = True,
                 target_field: str | None = None, label_field: str | None = None):
        target = pick(self.name, {"target": target, "target_field": target_field}, DEFAULT_PREDICTION)
        reference = pick(self.name, {"reference": reference, "label_field": label_field}, DEFAULT_REFERENCE)
        try:
            self.regex = re.compile(pattern, sum(getattr(re, f) for f in flags.upper() if f in "IMSX"))
        except re.error as exc:
            raise ValueError(f"regex_match: bad pattern {pattern!r}: {exc}") from None
        self.target = target
        self.group = compare_group
        self.reference = reference
        self.ignore_case = ignore_case

    def compute(self, ctx: MetricContext) -> dict:
        text = prediction(ctx, self.target)
        m = self.regex.search(text)
        if self.group is None:
            return {"value": float(m is not None), "extracted": m.group(0) if m else "", "method": "regex"}
        got = m.group(self.group) if m else ""
        refs = references(ctx, self.reference)
        norm = (lambda s: s.strip().lower()) if self.ignore_case else (lambda s: s.strip())
        return {"value": float(bool(m) and any(norm(got) == norm(r) for r in refs)), "extracted": got,
                "method": "regex"}


_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|[-+]?\.\d+")


def parse_number(text: str, which: str = "last") -> float | None:
    found = _NUMBER.findall(text)
    if not found:
        return None
    token = found[-1] if which == "last" else found[0]
    try:
        return float(token.replace(",", ""))
    except ValueError:
        return None


class NumericMatch(Metric):
    """1 when the number in the prediction (the last one by default) is within
    ``tolerance`` (absolute) or ``rel_tolerance`` (relative) of a reference number.
    A prediction with no number scores 0 and is counted as ``invalid_format``."""

    name = "numeric_match"
    value_key = "score"
    counter_descriptions = {"invalid_format": "answers held no number; each was scored 0"}  # (report.html's words)

    def __init__(self, prediction: str | None = None, reference: str | None = None,
                 tolerance: float = 0.0, rel_tolerance: float = 0.0, which: str = "last",
                 prediction_field: str | None = None, label_field: str | None = None):
        self.prediction_path = pick(self.name, {"prediction": prediction, "prediction_field": prediction_field},
                                    DEFAULT_PREDICTION)
        self.reference_path = pick(self.name, {"reference": reference, "label_field": label_field},
                                   DEFAULT_REFERENCE)
        self.tol = float(tolerance)
        self.rel = float(rel_tolerance)
        self.which = which

    def compute(self, ctx: MetricContext) -> dict:
        pred_text = prediction(ctx, self.prediction_path)
        pred = parse_number(pred_text, self.which)
        refs = [parse_number(r, "first") for r in references(ctx, self.reference_path)]
        if pred is None:
            return {"value": 0.0, "extracted": "", "method": "numeric", "counters": ["invalid_format"]}
        ok = any(r is not None and math.isclose(pred, r, abs_tol=self.tol, rel_tol=self.rel) for r in refs)
        return {"value": float(ok), "extracted": repr(pred), "method": "numeric"}
