"""F1 over a whole multiple-choice task, as lm-evaluation-harness 0.4.13 aggregates it: not a mean of
per-row values but one score over every row's (gold, prediction) pair (the metric contract's
``corpus`` aggregation). The prediction is the option with the highest log-likelihood, as for acc.

- ``f1``: the binary F1 of one positive option (default: the second, index 1), lm-eval's ``f1``
  (scikit-learn's ``f1_score`` with its default ``pos_label=1``; mrpc's "yes").
- ``macro_f1``: the unweighted mean of each option's one-against-the-rest F1, lm-eval's cb ``f1``.

An F1 whose class was neither predicted nor gold on any row is 0, as scikit-learn counts it.
"""
from __future__ import annotations

from typing import Any

from gage_eval.api import MetricContext
from gage_plugins_builtin.metrics.choice import Accuracy


def class_f1(pairs: list[tuple[int, int]], positive: int) -> float:
    """2 TP / (2 TP + FP + FN) of one class over (gold, prediction) pairs; 0 when nothing counts."""
    tp = sum(1 for g, p in pairs if g == positive and p == positive)
    fp = sum(1 for g, p in pairs if g != positive and p == positive)
    fn = sum(1 for g, p in pairs if g == positive and p != positive)
    return 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0


class F1(Accuracy):
    """Binary F1 of the option at index ``positive`` over the task's rows.

    :param positive: the index of the positive option (default 1).
    """

    name = "f1"
    corpus = True

    def __init__(self, positive: int = 1, gold: str = "sample.label",
                 loglikelihoods: str = "model_output.loglikelihoods"):
        super().__init__(gold, loglikelihoods)
        self.positive = int(positive)

    def compute(self, ctx: MetricContext) -> dict:
        chosen = super().compute(ctx)
        ids = [str(o["id"]) for o in ctx.sample.get("options") or []]
        pair = [ids.index(str(ctx.get(self.gold))), ids.index(chosen["extracted"])]
        self.classes = len(ids)
        return {"value": None, "item": pair, "extracted": chosen["extracted"]}

    def aggregate(self, items: list) -> float:
        return class_f1([(int(g), int(p)) for g, p in items], self.positive)


class MacroF1(F1):
    """The mean over every option of its one-against-the-rest F1 (lm-eval's cb ``f1``)."""

    name = "macro_f1"

    def __init__(self, gold: str = "sample.label", loglikelihoods: str = "model_output.loglikelihoods"):
        super().__init__(1, gold, loglikelihoods)
        self.classes: int | None = None

    def aggregate(self, items: list) -> Any:
        pairs = [(int(g), int(p)) for g, p in items]
        n = self.classes or (max(max(g, p) for g, p in pairs) + 1)
        return sum(class_f1(pairs, c) for c in range(n)) / n
