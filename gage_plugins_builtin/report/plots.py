"""The geometry of the report's bar plots, drawn by the template as inline SVG (no script, no
network): one group of bars per label (a metric, a slice value, a task's metric), one bar per
run, whiskers for the 95% interval, a hollow mark on a value over few rows."""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Sequence

LABEL_W, WIDTH, BAR_H, GAP, RIGHT = 220, 800, 16, 10, 110  # RIGHT: room for the value and its n
MAX_LABEL = 34  # characters of a label drawn (the full label is the bar's tooltip)


def _num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def bar_plot(rows: Sequence[dict], label: str = "metric") -> dict | None:
    """``rows``: dicts with ``label`` (the group's name under that key), ``run``, ``value``, ``lo``,
    ``hi``, ``small``. None when no row has a value."""
    vals = [x for r in rows for x in (r["value"], r["lo"], r["hi"]) if _num(x)]
    if not vals:
        return None
    points = [r["value"] for r in rows if _num(r["value"])] or vals
    lo, hi = min(0.0, min(vals)), max(vals)
    if 0 <= min(points) and max(points) <= 1:  # a rate: the axis is [0, 1]
        lo, hi = 0.0, 1.0
    span = (hi - lo) or 1.0
    plot_w = WIDTH - LABEL_W - RIGHT

    def x(v: float) -> float:
        return round(LABEL_W + (min(max(v, lo), hi) - lo) / span * plot_w, 2)

    groups: dict[str, list[dict]] = OrderedDict()
    for r in rows:
        groups.setdefault(str(r[label]), []).append(r)
    bars, labels, y = [], [], 8
    for name, items in groups.items():
        short = name if len(name) <= MAX_LABEL else name[:MAX_LABEL - 1] + "…"
        labels.append({"y": y + BAR_H * len(items) / 2 + 4, "text": short, "full": name})
        for r in items:
            if _num(r["value"]):
                x0, x1 = sorted((x(0.0 if lo <= 0 <= hi else lo), x(r["value"])))
                bar = {"x": x0, "w": max(round(x1 - x0, 2), 1), "y": y, "h": BAR_H - 3, "run": r["run"],
                       "value": r["value"], "small": bool(r.get("small")), "n": r.get("n"), "name": name,
                       "tx": x(max(r["value"], r["hi"] if _num(r["hi"]) else r["value"])) + 4}
                if _num(r["lo"]) and _num(r["hi"]):
                    bar.update(lo=x(r["lo"]), hi=x(r["hi"]), cy=y + (BAR_H - 3) / 2)
                bars.append(bar)
            y += BAR_H
        y += GAP
    ticks = [{"x": x(lo + span * i / 4), "text": f"{lo + span * i / 4:.3g}"} for i in range(5)]
    return {"width": WIDTH, "height": y + 18, "bars": bars, "labels": labels, "ticks": ticks, "axis_y": y,
            "x0": LABEL_W, "x1": LABEL_W + plot_w}
