"""How a comparison is shown: the console text, and the self-contained HTML page of ``--html``."""
from __future__ import annotations

import json
from typing import Any, Mapping

from gage_eval.api import pages

from gage_plugins_builtin.compare import CONFIDENCE, DOWN, SHOW_FLIPS, UP


def _num(x: Any, signed: bool = False) -> str:
    if x is None:
        return "-"
    return f"{x:+.4f}" if signed else f"{x:.4f}"


def _p(p: Any) -> str:
    if p is None:
        return "-"
    return f"{p:.4g}" if p >= 1e-4 else f"{p:.2e}"


def _ci(ci: Any) -> str:
    return "-" if not ci else f"[{ci[0]:+.4f}, {ci[1]:+.4f}]"


def _show(value: Any, present: bool) -> str:
    if not present:
        return "(absent)"
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= 72 else text[:69] + "..."  # a sha256 (64) is shown whole


def metric_rows(task_result: Mapping[str, Any]) -> list[list[str]]:
    """The console and HTML table of one task: a header and one row per metric."""
    rows = [["metric", "n", "A", "B", "B-A", f"{int(CONFIDENCE * 100)}% CI (bootstrap)", "McNemar p",
             UP, DOWN]]
    for name, m in task_result["metrics"].items():
        mc = m.get("mcnemar")
        rows.append([name, str(m["n"]), _num(m["mean_a"]), _num(m["mean_b"]), _num(m["diff"], True), _ci(m["ci"]),
                     _p(mc["p"]) if mc else "-", str(mc["c"]) if mc else "-", str(mc["b"]) if mc else "-"])
    return rows


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
            for r in rows]


def render_console(result: Mapping[str, Any]) -> str:
    a, b = result["run_a"], result["run_b"]
    lines = [f"A: {a['path']} (run {a['id']})", f"B: {b['path']} (run {b['id']})",
             f"paired bootstrap: {result['bootstrap_samples']} resamples, seed {result['seed']}"]
    if result["tasks_only_in_a"]:
        lines.append(f"tasks only in A (not compared): {', '.join(result['tasks_only_in_a'])}")
    if result["tasks_only_in_b"]:
        lines.append(f"tasks only in B (not compared): {', '.join(result['tasks_only_in_b'])}")
    for task, t in result["tasks"].items():
        ids, err = t["ids"], t["errored"]
        lines += ["", f"{task}: {ids['common']} sample ids in both (A {ids['a']}, B {ids['b']}); "
                      f"errored rows: A {err['a']}, B {err['b']} ({err['left_out']} common id(s) left out); "
                      f"{t['paired']} paired"]
        for side in ("a", "b"):
            only = t[f"metrics_only_in_{side}"]
            if only:
                lines.append(f"  metrics only in {side.upper()} (not compared): {', '.join(only)}")
        if t["metrics"]:
            lines += ["  " + line for line in _table(metric_rows(t))]
        for name, m in t["metrics"].items():
            if m.get("missing"):
                lines.append(f"  {name}: {m['missing']} paired row(s) without a value on one side, left out")
            flips = m.get("flips") or {}
            for way in (UP, DOWN):
                ids_ = flips.get(way) or []
                if ids_:
                    more = f" ... (+{len(ids_) - SHOW_FLIPS} more; --json lists all)" if len(ids_) > SHOW_FLIPS else ""
                    lines.append(f"  {name} {way} ({len(ids_)}): {', '.join(ids_[:SHOW_FLIPS])}{more}")
    rows = result["settings"]
    differ = [r for r in rows if not r["same"]]
    lines += ["", f"settings: {len(differ)} differ, {len(rows) - len(differ)} the same"]
    if differ:
        table = [["setting", "A", "B"]] + [[r["key"], _show(r["a"], r["in_a"]), _show(r["b"], r["in_b"])]
                                           for r in differ]
        lines += ["  " + line for line in _table(table)]
    return "\n".join(lines)


_HTML = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
{{ generator | safe }}
<title>gage-eval compare: {{ r.run_a.id }} vs {{ r.run_b.id }}</title>
<style>
body{font-family:system-ui,sans-serif;margin:2em;color:#222;max-width:1100px}
table{border-collapse:collapse;margin:.6em 0 1.2em}
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:right;font-variant-numeric:tabular-nums}
th:first-child,td:first-child{text-align:left}
th{background:#f2f2f2}
td.same{color:#888}
tr.differ td{background:#fff5e0}
code{font-size:90%}
.ids{font-family:monospace;font-size:90%;word-break:break-all}
.note{color:#555}
</style></head><body>
<h1>gage-eval compare</h1>
<p>A: <code>{{ r.run_a.path }}</code> (run {{ r.run_a.id }})<br>
B: <code>{{ r.run_b.path }}</code> (run {{ r.run_b.id }})<br>
<span class="note">Paired bootstrap: {{ r.bootstrap_samples }} resamples, seed {{ r.seed }};
McNemar's exact test on binary metrics.</span></p>
{% if r.tasks_only_in_a %}<p class="note">Tasks only in A (not compared): {{ r.tasks_only_in_a|join(", ") }}</p>{% endif %}
{% if r.tasks_only_in_b %}<p class="note">Tasks only in B (not compared): {{ r.tasks_only_in_b|join(", ") }}</p>{% endif %}
{% for task, t in r.tasks.items() %}
<h2 id="task-{{ task }}">{{ task }}</h2>
<p>{{ t.ids.common }} sample ids in both (A {{ t.ids.a }}, B {{ t.ids.b }});
errored rows: A {{ t.errored.a }}, B {{ t.errored.b }} ({{ t.errored.left_out }} common ids left out);
{{ t.paired }} paired.</p>
{% if t.metrics_only_in_a %}<p class="note">Metrics only in A (not compared): {{ t.metrics_only_in_a|join(", ") }}</p>{% endif %}
{% if t.metrics_only_in_b %}<p class="note">Metrics only in B (not compared): {{ t.metrics_only_in_b|join(", ") }}</p>{% endif %}
{% set rows = tables[task] %}
<table class="metrics"><thead><tr>{% for c in rows[0] %}<th>{{ c }}</th>{% endfor %}</tr></thead>
<tbody>{% for row in rows[1:] %}<tr>{% for c in row %}<td>{{ c }}</td>{% endfor %}</tr>{% endfor %}</tbody></table>
{% for name, m in t.metrics.items() %}{% if m.flips %}{% for way, ids in m.flips.items() %}{% if ids %}
<details><summary>{{ name }} {{ way }}: {{ ids|length }} sample(s)</summary>
<p class="ids">{{ ids|join(", ") }}</p></details>
{% endif %}{% endfor %}{% endif %}{% endfor %}
{% endfor %}
<h2>Settings</h2>
<p>{{ differ }} differ, {{ r.settings|length - differ }} the same.</p>
<table class="settings"><thead><tr><th>setting</th><th>A</th><th>B</th></tr></thead><tbody>
{% for s in settings %}<tr class="{{ 'same' if s.same else 'differ' }}"><td>{{ s.key }}</td>
<td class="{{ 'same' if s.same else '' }}">{{ show(s.a, s.in_a) }}</td>
<td class="{{ 'same' if s.same else '' }}">{{ show(s.b, s.in_b) }}</td></tr>
{% endfor %}</tbody></table>
</body></html>
"""


def render_html(result: Mapping[str, Any]) -> str:
    """A self-contained page (inline CSS, no script, no network) with the tables and the flipped ids."""
    import jinja2

    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)

    def show(value: Any, present: bool) -> str:
        if not present:
            return "(absent)"
        return value if isinstance(value, str) else json.dumps(value, sort_keys=True)

    tables = {task: metric_rows(t) for task, t in result["tasks"].items()}
    settings = [s for s in result["settings"] if not s["same"]] + [s for s in result["settings"] if s["same"]]
    differ = sum(1 for s in result["settings"] if not s["same"])
    return env.from_string(_HTML).render(r=result, tables=tables, differ=differ, show=show, settings=settings,
                                             generator=pages.PAGE_GENERATOR)
