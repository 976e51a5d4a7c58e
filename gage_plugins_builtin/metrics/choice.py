"""Log-likelihood multiple choice: acc and acc_norm, as lm-evaluation-harness defines them."""
from __future__ import annotations

from gage_eval.api import Metric, MetricContext


class Accuracy(Metric):
    """1 when the option with the highest log-likelihood is the gold one.

    :param gold: path of the gold option id (default ``sample.label``).
    """

    name = "acc"

    def __init__(self, gold: str = "sample.label", loglikelihoods: str = "model_output.loglikelihoods"):
        self.gold = gold
        self.lls = loglikelihoods

    def scores(self, ctx: MetricContext) -> list[float]:
        return [float(x) for x in ctx.get(self.lls)]

    def compute(self, ctx: MetricContext) -> dict:
        scores = self.scores(ctx)
        ids = []
        for o in ctx.sample.get("options") or []:
            ids.append(str(o["id"]))
        if len(scores) != len(ids):
            raise ValueError(f"{len(scores)} log-likelihoods for {len(ids)} options")
        gold = str(ctx.get(self.gold))
        if gold not in ids:
            raise ValueError(f"gold answer {gold!r} is not an option id ({', '.join(ids)})")
        # the first maximum, like numpy.argmax (max keeps the first of equal values; NaN as before)
        best = scores.index(max(scores)) if scores else max(range(0), key=scores.__getitem__)
        return {"value": float(ids[best] == gold), "extracted": ids[best], "method": "loglikelihood_argmax"}


class NormalizedAccuracy(Accuracy):
    """acc with each log-likelihood divided by its choice's length in characters
    (the choice without the target delimiter, as lm-eval's acc_norm)."""

    name = "acc_norm"

    def __init__(self, gold: str = "sample.label", loglikelihoods: str = "model_output.loglikelihoods",
                 choices: str = "model_output.choices"):
        super().__init__(gold, loglikelihoods)
        self.choices = choices

    def scores(self, ctx: MetricContext) -> list[float]:
        lls, choices = ctx.get(self.lls), ctx.get(self.choices)
        return [float(ll) / max(len(c), 1) for ll, c in zip(lls, choices)]  # (one pass over both)
