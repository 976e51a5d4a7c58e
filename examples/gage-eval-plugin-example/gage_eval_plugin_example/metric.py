"""Word-overlap F1 between a prediction and the closest reference (the SQuAD answer F1)."""
from __future__ import annotations

import re
import string
from collections import Counter
from typing import Any

from gage_eval.api import Metric, MetricContext, content_text, reference_text

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize(text: str) -> list[str]:
    """Lower case, no punctuation, no articles, split on whitespace."""
    return _ARTICLES.sub(" ", text.lower().translate(_PUNCT)).split()


def f1(prediction: str, reference: str) -> float:
    pred, ref = normalize(prediction), normalize(reference)
    if not pred or not ref:
        return float(pred == ref)  # both empty: a match; one empty: none
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def as_texts(value: Any) -> list[str]:
    """A reference field as texts: a string, a list of strings, or Sample v1 reference items."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, dict) and "type" in v for v in value):
        return [content_text(value)]  # one content-segment list is one answer
    if isinstance(value, list):
        return [reference_text(v) for v in value]
    return [reference_text(value)]


class WordF1(Metric):
    """F1 of the words shared by the prediction and each reference; the best reference counts.

    :param prediction: field path of the prediction (default ``model_output.text``).
    :param reference: field path of the references (default ``sample.references``).
    """

    name = "example/word_f1"
    higher_is_better = True

    def __init__(self, prediction: str = "model_output.text", reference: str = "sample.references"):
        for key, path in (("prediction", prediction), ("reference", reference)):
            if not isinstance(path, str) or path.partition(".")[0] not in ("sample", "model_output",
                                                                              "judge_output"):
                raise ValueError(f"{key}: {path!r} is not a field path such as model_output.text")
        self.prediction = prediction
        self.reference = reference

    def compute(self, ctx: MetricContext) -> dict:
        value = ctx.get(self.prediction, None)
        pred = content_text(value) if isinstance(value, list) else ("" if value is None else str(value))
        refs = as_texts(ctx.get(self.reference))
        if not refs:
            raise ValueError(f"no reference at {self.reference!r}")
        scores = [f1(pred, r) for r in refs]
        best = max(range(len(scores)), key=scores.__getitem__)
        return {"value": scores[best], "extracted": pred, "reference": refs[best], "method": "word_f1"}
