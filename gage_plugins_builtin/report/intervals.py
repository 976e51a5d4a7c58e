"""The 95% interval the report shows for a metric's mean, one that stays inside the metric's range.

In order of preference:

* ``bootstrap``: summary.json's ``ci95.bootstrap`` (percentiles of resampled means, so inside the
  range of the row values by construction);
* ``Wilson``: the Wilson score interval, for a proportion (every row value 0 or 1) when summary.json
  has no bootstrap interval, or when its bootstrap collapsed to a point because every row agrees
  (a slice of 3 rows all wrong is not known to be exactly 0);
* ``normal``: value +/- 1.96 stderr, clipped to [0, 1] when every row value lies there.

A value over fewer than :data:`SMALL_N` rows is marked on the page.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

from gage_eval.api import stats

SMALL_N = 30  # fewer rows than this: the value is marked as resting on a small sample

__all__ = ["SMALL_N", "interval", "wilson", "RowRange"]


def wilson(p: float, n: int, z: float = stats.Z95) -> tuple[float, float]:
    """The Wilson score interval of a proportion ``p`` observed over ``n`` rows."""
    if n <= 0:
        return 0.0, 1.0
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(max(p * (1 - p) / n + z2 / (4 * n * n), 0.0)) / (1 + z2 / n)
    return (0.0 if p <= 0 else max(0.0, centre - half)), (1.0 if p >= 1 else min(1.0, centre + half))


class RowRange:
    """What the row values of one metric were: all 0/1 (a proportion), all in [0, 1]."""

    __slots__ = ("binary", "unit", "seen")

    def __init__(self) -> None:
        self.binary = self.unit = True
        self.seen = 0

    def add(self, value: Any) -> None:
        if not isinstance(value, (int, float)):  # (None: the row has no value)
            return
        v = float(value)
        self.seen += 1
        if v != 0.0 and v != 1.0:
            self.binary = False
        if not 0.0 <= v <= 1.0:
            self.unit = False


def _pair(value: Any) -> tuple[float, float] | None:
    if (isinstance(value, (list, tuple)) and len(value) == 2
            and all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in value)):
        return float(value[0]), float(value[1])
    return None


def interval(metric: Mapping[str, Any], rows: RowRange | None) -> dict:
    """The page's view of one metric entry of summary.json: value, stderr, n, lo, hi, ``how``
    (bootstrap, Wilson, normal or normal clipped) and ``small`` (n < SMALL_N)."""
    value, stderr, n = metric.get("value"), metric.get("stderr"), metric.get("n")
    out = {"value": value, "stderr": stderr, "n": n, "lo": None, "hi": None, "how": None,
           "higher_is_better": metric.get("higher_is_better"),
           "small": isinstance(n, int) and not isinstance(n, bool) and n < SMALL_N}
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return out
    binary = rows is not None and rows.seen > 0 and rows.binary and 0.0 <= value <= 1.0
    unit = rows is not None and rows.seen > 0 and rows.unit
    ci = metric.get("ci95") if isinstance(metric.get("ci95"), Mapping) else {}
    boot = _pair(ci.get("bootstrap"))
    if boot is not None and not (binary and boot[0] == boot[1] and isinstance(n, int) and n > 0):
        out.update(lo=boot[0], hi=boot[1], how="bootstrap")
    elif binary and isinstance(n, int) and n > 0:
        lo, hi = wilson(float(value), n)
        out.update(lo=lo, hi=hi, how="Wilson")
    elif isinstance(stderr, (int, float)) and not isinstance(stderr, bool):
        lo, hi = stats.normal_interval(value, stderr)
        if unit:
            out.update(lo=max(lo, 0.0), hi=min(hi, 1.0), how="normal, clipped to [0, 1]")
        else:
            out.update(lo=lo, hi=hi, how="normal")
    return out
