"""Perplexities over a whole corpus, as lm-evaluation-harness 0.4.13 aggregates its ``loglikelihood_rolling``
tasks: not a mean of per-document values but one figure from every document's summed log-likelihood
(natural log) and its count of words or bytes (the metric contract's ``corpus`` aggregation):

- ``word_perplexity`` = exp(-sum(ll) / sum(words))
- ``byte_perplexity`` = exp(-sum(ll) / sum(bytes))
- ``bits_per_byte`` = -sum(ll) / sum(bytes) / ln 2

Each row keeps its own figure (its document alone) beside the pair it adds to the corpus.
"""
from __future__ import annotations

import math

from gage_eval.api import Metric, MetricContext


class WordPerplexity(Metric):
    """exp(-(summed log-likelihood) / (summed word count)) over the task's documents.

    :param loglikelihood: path of the document's log-likelihood (default ``model_output.loglikelihoods.0``).
    :param count: path of its count (default ``sample.metadata.words``).
    """

    name = "word_perplexity"
    higher_is_better = False
    corpus = True
    default_count = "sample.metadata.words"

    def __init__(self, loglikelihood: str = "model_output.loglikelihoods.0", count: str | None = None):
        self.loglikelihood = loglikelihood
        self.count = count or self.default_count

    def compute(self, ctx: MetricContext) -> dict:
        ll = ctx.get(self.loglikelihood)
        n = ctx.get(self.count)
        if isinstance(ll, bool) or not isinstance(ll, (int, float)) or not math.isfinite(ll):
            raise ValueError(f"{self.loglikelihood} is {ll!r}, expected a finite log-likelihood")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{self.count} is {n!r}, expected a count of at least 1")
        return {"value": None, "item": [float(ll), n], "document": self.figure(float(ll), n)}

    @staticmethod
    def figure(ll: float, n: int) -> float:
        return math.exp(-ll / n)

    def aggregate(self, items: list) -> float:
        return self.figure(sum(float(ll) for ll, _ in items), sum(int(n) for _, n in items))


class BytePerplexity(WordPerplexity):
    """exp(-(summed log-likelihood) / (summed UTF-8 byte count)) over the task's documents.

    :param loglikelihood: path of the document's log-likelihood (default ``model_output.loglikelihoods.0``).
    :param count: path of its count (default ``sample.metadata.bytes``).
    """

    name = "byte_perplexity"
    default_count = "sample.metadata.bytes"


class BitsPerByte(BytePerplexity):
    """-(summed log-likelihood) / (summed UTF-8 byte count) / ln 2 over the task's documents.

    :param loglikelihood: path of the document's log-likelihood (default ``model_output.loglikelihoods.0``).
    :param count: path of its count (default ``sample.metadata.bytes``).
    """

    name = "bits_per_byte"

    @staticmethod
    def figure(ll: float, n: int) -> float:
        return -ll / n / math.log(2)
