"""acc_mutual_info: multiple-choice accuracy on pointwise mutual information, as lm-evaluation-harness
defines it.

Each choice is scored ``log P(choice | context) - log P(choice | unconditioned context)`` and the
row is correct when the highest score is the gold option (the first maximum wins, like acc). The
unconditioned context is the sample's ``unconditioned_input`` (spec 000, 1.3.11), or an empty
context when the sample has none, which is what lm-eval uses for every row. Listing this metric is
what makes the run ask for the second set of scores: :class:`gage_eval.tasks.requests.RequestBuilder`
sets ``Request.unconditioned`` only when a task's metric has ``needs_unconditioned``, and the
engine hands the result to metrics as ``model_output.unconditioned_loglikelihoods``.
"""
from __future__ import annotations

from gage_eval.api import MetricContext
from gage_plugins_builtin.metrics.choice import Accuracy

UNCONDITIONED = "model_output.unconditioned_loglikelihoods"


class MutualInfoAccuracy(Accuracy):
    """acc on ``loglikelihood - unconditioned loglikelihood`` per option.

    :param gold: path of the gold option id (default ``sample.label``).
    :param loglikelihoods: path of the conditional scores.
    :param unconditioned: path of the unconditioned scores, same order as the options.
    """

    name = "acc_mutual_info"
    needs_unconditioned = True  # read by RequestBuilder: requests carry their unconditioned context

    def __init__(self, gold: str = "sample.label", loglikelihoods: str = "model_output.loglikelihoods",
                 unconditioned: str = UNCONDITIONED):
        super().__init__(gold, loglikelihoods)
        self.unconditioned = unconditioned

    def scores(self, ctx: MetricContext) -> list[float]:
        lls = super().scores(ctx)
        base = ctx.get(self.unconditioned, None)
        if base is None:
            raise ValueError(f"no unconditioned log-likelihoods at {self.unconditioned!r} (the request "
                             f"was sent without an unconditioned context)")
        if len(base) != len(lls):
            raise ValueError(f"{len(base)} unconditioned log-likelihoods for {len(lls)} choices")
        return [c - float(u) for c, u in zip(lls, base)]

    def compute(self, ctx: MetricContext) -> dict:
        result = super().compute(ctx)
        return {**result, "method": "mutual_information_argmax"}
