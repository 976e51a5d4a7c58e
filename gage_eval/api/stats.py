"""Interval estimates for a task's metric means: the normal 95% interval, a seeded percentile
bootstrap, and the cluster-robust standard error of a mean; and the accumulators a task's
aggregate adds each row's value to (:class:`MeanAccumulator`, :class:`ClusterSums`), here so that
adding a value and summing up stay in one module. Pure Python, no numpy.

The bootstrap resamples the n row values with replacement and takes the 2.5% and 97.5%
quantiles (linear interpolation, numpy's default) of the resampled means. When the values
take few distinct values (binary accuracy, a 0-1-2 score) the rows are kept as a count per
value (:class:`ValueCounts`) and a resample is drawn as multinomial counts over those values,
which has exactly the distribution of resampling the rows one by one, at O(distinct values)
per resample; memory stays flat in n. Past ``MAX_DISTINCT`` distinct values the rows are kept
in an ``array('d')`` (8 bytes a row) and resampled by index (O(n) per resample): with numpy
when it is installed, else in pure Python (slower; a different random stream, so the interval
of such a metric depends on numpy being there).
"""
from __future__ import annotations

import hashlib
import math
import random
from array import array
from typing import Any, Iterable, Mapping, Sequence

Z95 = 1.959963984540054  # the standard normal's 97.5% quantile
DEFAULT_RESAMPLES = 1000
MAX_DISTINCT = 256
RESAMPLE_CHUNK = 1 << 20  # indices drawn at once by the numpy resampler


def normal_interval(mean: float | None, stderr: float | None, z: float = Z95) -> list[float] | None:
    """``[mean - z*stderr, mean + z*stderr]``; None without a stderr."""
    if mean is None or stderr is None:
        return None
    return [mean - z * stderr, mean + z * stderr]


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """The q-quantile of sorted values by linear interpolation between order statistics
    (Hyndman and Fan's type 7, numpy's default)."""
    if not sorted_values:
        raise ValueError("quantile of no values")
    h = (len(sorted_values) - 1) * q
    lo = math.floor(h)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (h - lo) * (sorted_values[hi] - sorted_values[lo])


def binomial(n: int, p: float, rnd: random.Random) -> int:
    """One Binomial(n, p) draw: inversion when n*min(p, 1-p) < 10, else Hormann's (1993)
    transformed rejection with squeeze (BTRS), O(1) expected time."""
    if n <= 0 or p <= 0.0:
        return 0
    if p >= 1.0:
        return n
    if p > 0.5:
        return n - binomial(n, 1.0 - p, rnd)
    q = 1.0 - p
    if n * p < 10:
        s, a = p / q, (n + 1) * p / q
        r, u, x = q ** n, rnd.random(), 0
        while u > r:
            u -= r
            x += 1
            if x > n:  # rounding left u above the last term
                return n
            r *= a / x - s
        return x
    spq = math.sqrt(n * p * q)
    b = 1.15 + 2.53 * spq
    a = -0.0873 + 0.0248 * b + 0.01 * p
    c = n * p + 0.5
    vr = 0.92 - 4.2 / b
    alpha = (2.83 + 5.1 / b) * spq
    lpq = math.log(p / q)
    m = math.floor((n + 1) * p)
    h = math.lgamma(m + 1) + math.lgamma(n - m + 1)
    while True:
        u = rnd.random() - 0.5
        v = rnd.random()
        us = 0.5 - abs(u)
        k = math.floor((2 * a / us + b) * u + c)
        if k < 0 or k > n:
            continue
        if us >= 0.07 and v <= vr:
            return k
        v = math.log(v * alpha / (a / (us * us) + b))
        if v <= h - math.lgamma(k + 1) - math.lgamma(n - k + 1) + (k - m) * lpq:
            return k


def multinomial(n: int, weights: Sequence[int], rnd: random.Random) -> list[int]:
    """Counts of n draws over len(weights) cells with probabilities proportional to weights,
    as a chain of conditional binomials."""
    out, left, total = [], n, sum(weights)
    for w in weights[:-1]:
        k = binomial(left, w / total, rnd) if total > 0 else 0
        out.append(k)
        left -= k
        total -= w
    out.append(left)
    return out


class ValueCounts:
    """The values added, kept as counts per distinct value while there are few of them, else
    as an ``array('d')``; enough for an exact bootstrap of the mean."""

    __slots__ = ("counts", "values", "n")

    def __init__(self) -> None:
        self.counts: dict[float, int] | None = {}
        self.values: array | None = None
        self.n = 0

    def add(self, x: float) -> None:
        self.n += 1
        counts = self.counts
        if counts is not None:
            if x in counts:
                counts[x] += 1
                return
            if len(counts) < MAX_DISTINCT:
                counts[x] = 1
                return
            self.values = array("d", (v for v, c in counts.items() for _ in range(c)))
            self.counts = None
        self.values.append(x)

    def moments(self) -> tuple[float, float]:
        """The mean and the sum of squared deviations from it, the same whatever order the values
        came in (a resume, a cached rerun and a run in completion order agree to the last bit):
        correctly rounded sums (``math.fsum``) over the values, or over the distinct values in
        sorted order."""
        n = self.n
        if not n:
            return math.nan, 0.0
        if self.counts is not None:
            items = sorted(self.counts.items())
            mean = math.fsum(v * c for v, c in items) / n
            return mean, math.fsum(c * (v - mean) ** 2 for v, c in items)
        values = self.values if self.values is not None else ()
        mean = math.fsum(values) / n
        return mean, math.fsum((x - mean) ** 2 for x in values)

    def bootstrap_interval(self, seed: str | int, resamples: int = DEFAULT_RESAMPLES,
                           level: float = 0.95) -> list[float] | None:
        """The percentile bootstrap interval of the mean; None for fewer than 2 values."""
        if self.n < 2:
            return None
        rnd = random.Random(seed)
        n = self.n
        means = []
        if self.counts is not None:
            support = sorted(self.counts)  # order-free: the same rows in any order give the same interval
            weights = [self.counts[v] for v in support]
            for _ in range(resamples):
                drawn = multinomial(n, weights, rnd)
                means.append(math.fsum(v * k for v, k in zip(support, drawn)) / n)
        else:
            means = _resampled_means(self.values, seed, resamples, rnd)
        means.sort()
        tail = (1.0 - level) / 2
        return [quantile(means, tail), quantile(means, 1.0 - tail)]


def _numpy():
    try:
        import numpy
    except ImportError:
        return None
    return numpy


def _resampled_means(values: array, seed: str | int, resamples: int, rnd: random.Random) -> list[float]:
    """Means of ``resamples`` resamples of ``values`` by index: with numpy when it is installed
    (a PCG64 stream seeded by the sha256 of the seed; about 1 s for 100k rows), else in pure
    Python (about 0.2 s a resample of 100k rows)."""
    n = len(values)
    np = _numpy()
    if np is None:
        choices = rnd.choices
        return [math.fsum(choices(values, k=n)) / n for _ in range(resamples)]
    rng = np.random.Generator(np.random.PCG64(int.from_bytes(hashlib.sha256(str(seed).encode()).digest()[:8], "little")))
    data = np.frombuffer(values, dtype=np.float64)
    chunk = max(1, RESAMPLE_CHUNK // n)  # resamples drawn at once: memory stays near 16 bytes x RESAMPLE_CHUNK
    means: list[float] = []
    for start in range(0, resamples, chunk):
        idx = rng.integers(0, n, size=(min(chunk, resamples - start), n))
        means.extend(data[idx].mean(axis=1).tolist())
    return means


def bootstrap_interval(values: Iterable[float], seed: str | int, resamples: int = DEFAULT_RESAMPLES,
                       level: float = 0.95) -> list[float] | None:
    store = ValueCounts()
    for x in values:
        store.add(float(x))
    return store.bootstrap_interval(seed, resamples, level)


def clustered_stderr(clusters: Mapping[object, tuple[int, float]], small_sample: bool = True) -> float | None:
    """Cluster-robust standard error of the mean of all values, from each cluster's (count, sum):

        SE = sqrt( sum_c (sum_{i in c} (x_i - mean))^2 ) / n,   sum_{i in c}(x_i - mean) = S_c - n_c * mean

    times sqrt(G / (G - 1)) for G clusters with ``small_sample`` (the CR1 factor for a mean, with
    which G = n clusters of one row give the usual stderr exactly). None for fewer than 2 clusters."""
    g = len(clusters)
    n = sum(c for c, _ in clusters.values())
    if g < 2 or n == 0:
        return None
    mean = math.fsum(s for _, s in clusters.values()) / n
    ss = math.fsum((s - c * mean) ** 2 for c, s in clusters.values())
    se = math.sqrt(ss) / n
    return se * math.sqrt(g / (g - 1)) if small_sample else se


class MeanAccumulator(ValueCounts):
    """A metric's values as :class:`ValueCounts`: their mean and sample variance, computed at the
    end so that they do not depend on the order rows finished in, and the bootstrap interval.
    Memory stays flat in n for metrics with few distinct values (8 bytes a row past
    ``MAX_DISTINCT`` of them)."""

    __slots__ = ()

    def result(self, seed: str | None = None) -> dict[str, Any]:
        """value, stderr, n and, with a ``seed`` for the bootstrap, ``ci95`` (normal and bootstrap)."""
        if self.n == 0:
            out = {"value": None, "stderr": None, "n": 0}
        else:
            mean, m2 = self.moments()
            # standard error of the mean with the sample (n-1) variance, as lm-eval reports it:
            # sqrt(sum((x - mean)^2) / (n - 1)) / sqrt(n)
            stderr = math.sqrt(m2 / (self.n - 1)) / math.sqrt(self.n) if self.n > 1 else None
            out = {"value": mean, "stderr": stderr, "n": self.n}
        if seed is not None:
            out["ci95"] = {"normal": normal_interval(out["value"], out["stderr"]),
                           "bootstrap": self.bootstrap_interval(seed)}
        return out


def results(accumulators: Mapping[str, Any], seed: str | int | None, suffix: str = "") -> dict[str, dict]:
    """Each accumulator's ``result`` by metric name, the bootstrap of metric M seeded by
    ``seed:M`` and ``suffix`` (no interval without a ``seed``)."""
    return {name: acc.result(None if seed is None else f"{seed}:{name}{suffix}") for name, acc in accumulators.items()}


def slice_results(slices: Mapping[str, Mapping[str, Mapping[str, Any]]], seed: str | int | None) -> dict:
    """:func:`results` of each ``data_tag`` slice (key -> value -> metric -> accumulator), sorted
    by key and value, the bootstrap of metric M in slice key=value seeded by ``seed:M:key=value``."""
    return {key: {value: results(metrics, seed, f":{key}={value}") for value, metrics in sorted(by_value.items())}
            for key, by_value in sorted(slices.items())}


class ClusterSums:
    """Per cluster value: (rows, sum of values), for the cluster-robust stderr."""

    __slots__ = ("sums", "singles")

    def __init__(self) -> None:
        self.sums: dict[str, list] = {}
        self.singles: list[tuple[int, float]] = []  # rows without the field: each its own cluster

    def add(self, key: str | None, x: float) -> None:
        if key is None:
            self.singles.append((1, x))
            return
        entry = self.sums.get(key)
        if entry is None:
            self.sums[key] = [1, x]
        else:
            entry[0] += 1
            entry[1] += x

    def result(self) -> dict[str, Any]:
        clusters = {("c", k): (c, s) for k, (c, s) in self.sums.items()}
        clusters.update({("r", i): v for i, v in enumerate(self.singles)})
        return {"stderr_clustered": clustered_stderr(clusters), "clusters": len(clusters)}


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimator of pass@k (Chen et al. 2021) from ``n`` answers of which ``c``
    passed: 1 - C(n-c, k) / C(n, k), computed as the product OpenAI's reference evaluation uses."""
    if not (0 < k <= n and 0 <= c <= n):
        raise ValueError(f"pass@{k} of {c} passed out of {n}: needs 0 < k <= n and 0 <= c <= n")
    if n - c < k:
        return 1.0
    product = 1.0
    for i in range(n - c + 1, n + 1):
        product *= 1.0 - k / i
    return 1.0 - product
