"""How a comparison is shown: the console text, and the self-contained HTML page of ``--html``."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Mapping

from gage_plugins_builtin import pages
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


def group_rows(result: Mapping[str, Any]) -> list[list[str]]:
    """The groups' table (console and HTML): a header and one row per group and metric, A and B
    the groups' values in summary.json, the interval and McNemar's test over their tasks' paired rows."""
    rows = [["group", "metric", "weighting", "tasks", "n", "A", "B", "B-A",
             f"{int(CONFIDENCE * 100)}% CI (bootstrap)", "McNemar p", UP, DOWN]]
    for name, g in (result.get("groups") or {}).items():
        label = "  " * g["depth"] + ("- " if g["depth"] else "") + str(g["alias"])
        for metric, m in g["metrics"].items():
            p = m["paired"] or {}
            mc = p.get("mcnemar")
            tasks = m["tasks_a"] if m["tasks_a"] == m["tasks_b"] else f"{m['tasks_a']}/{m['tasks_b']}"
            n = m["n_a"] if m["n_a"] == m["n_b"] else f"{m['n_a']}/{m['n_b']}"
            rows.append([label, metric, "size" if m["weight_by_size"] else "task", str(tasks), str(n),
                         _num(m["mean_a"]), _num(m["mean_b"]), _num(m["diff"], True), _ci(p.get("ci")),
                         _p(mc["p"]) if mc else "-", str(mc["c"]) if mc else "-", str(mc["b"]) if mc else "-"])
    return rows


def group_notes(result: Mapping[str, Any]) -> list[str]:
    """What the groups' table leaves out: a paired part over fewer rows than the group's (its own
    means and difference), or none, and why."""
    lines = []
    for name, g in (result.get("groups") or {}).items():
        for metric, m in g["metrics"].items():
            p = m["paired"]
            if p is None:
                lines.append(f"{g['alias']} {metric}: no paired interval, {m['unpaired']}; B-A is the difference "
                             f"of the two groups' values")
            elif p["n"] != m["n_a"] or p["n"] != m["n_b"]:
                lines.append(f"{g['alias']} {metric}: the interval is over the {p['n']} paired rows (n A {m['n_a']}, "
                             f"B {m['n_b']}), where A {_num(p['mean_a'])}, B {_num(p['mean_b'])}, "
                             f"B-A {_num(p['diff'], True)}")
        for side in ("a", "b"):
            if g[f"metrics_only_in_{side}"]:
                lines.append(f"{g['alias']}: metrics only in {side.upper()} (not compared): "
                             f"{', '.join(g[f'metrics_only_in_{side}'])}")
    return lines


def _table(rows: list[list[str]], left: int = 1) -> list[str]:
    """Rows as aligned text: the first ``left`` columns to the left, the rest (numbers) to the right."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
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
    if result.get("groups"):
        lines += ["", "groups: A and B as summary.json aggregates them (weighting: by task size, or each task once);",
                  "  the interval and McNemar's test over their tasks' paired rows, resampled within each task"]
        lines += ["  " + line for line in _table(group_rows(result), left=3)]
        lines += ["  " + line for line in group_notes(result)]
    for side in ("a", "b"):
        if result.get(f"groups_only_in_{side}"):
            only = ", ".join(result[f"groups_only_in_{side}"])
            lines.append(f"groups only in {side.upper()} (not compared): {only}")
    rows = result["settings"]
    differ = [r for r in rows if not r["same"]]
    lines += ["", f"settings: {len(differ)} differ, {len(rows) - len(differ)} the same"]
    if differ:
        table = [["setting", "A", "B"]] + [[r["key"], _show(r["a"], r["in_a"]), _show(r["b"], r["in_b"])]
                                           for r in differ]
        lines += ["  " + line for line in _table(table)]
    return "\n".join(lines).translate(_CONTROL)  # (a sample id from the data never drives the terminal)


# control characters (but the newline) as \xNN: an escape sequence in an id would clear or retitle the terminal
_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0)) if c != 0x0A}


MAX_SIDE_BY_SIDE = 200  # flipped ids of one metric and direction opened side by side on the page
MAX_SIDE_TEXT = 4_000  # characters of a prompt or answer shown there (the samples files have all)


def _score_rows(record: Mapping[str, Any]) -> list[tuple[str, str]]:
    result = record.get("eval_result") or {}
    rows = []
    for name, m in (result.get("metrics") or {}).items():
        value = m.get("value") if isinstance(m, dict) else m
        extracted = m.get("extracted") if isinstance(m, dict) else None
        shown = "-" if value is None else f"{value:.4f}" if isinstance(value, float) else str(value)
        rows.append((str(name), shown + (f" (answer: {extracted})" if extracted not in (None, "") else "")))
    return rows


def side_view(record: Mapping[str, Any]) -> dict:
    """One run's record of a flipped sample as the page shows it: prompt, answer (or the scored
    choices of a log-likelihood row), references, error, metric values; text clipped."""
    from gage_plugins_builtin.report.samples import clip, content_text, loglikelihood_view, turns

    view: dict[str, Any] = {"prompt": None, "ll": None, "norm": False, "answer": None, "turns": [], "error": None}
    predicted = record.get("predict_result") or []
    first = predicted[0] if predicted and isinstance(predicted[0], dict) else {}
    ll = loglikelihood_view(first, record, MAX_SIDE_TEXT) if first else None
    if ll is not None:
        view.update(ll=ll, norm=any(c[3] is not None for c in ll["ch"]))
    else:
        messages = [m for m in record.get("messages") or [] if isinstance(m, dict)]
        prompt = first.get("prompt") if isinstance(first.get("prompt"), str) else "\n\n".join(
            f"{m.get('role', '')}: {content_text(m.get('content'))}" for m in messages)
        view["prompt"] = clip(prompt, MAX_SIDE_TEXT)
        if first:
            text = content_text((first.get("message") or {}).get("content")) or first.get("raw_text") or ""
            view["answer"] = clip(text, MAX_SIDE_TEXT)
            view["turns"] = turns(first, MAX_SIDE_TEXT)  # a tool loop's every turn, or a reply's calls
    error = (record.get("eval_result") or {}).get("error")
    if isinstance(error, dict):
        view["error"] = clip(f"[{error.get('stage')}] {error.get('message')}", MAX_SIDE_TEXT)
    view["refs"] = [clip(content_text(r.get("answer")) if isinstance(r, dict) else r, MAX_SIDE_TEXT)
                    for r in record.get("references") or []]
    view["scores"] = _score_rows(record)
    return view


def flip_views(result: Mapping[str, Any], warn: Callable[[str], None] | None = None) -> dict[str, dict[str, dict]]:
    """{task: {sample id: {"a": view, "b": view, "a_value", "b_value"}}} of the flipped ids the page
    opens (at most MAX_SIDE_BY_SIDE per metric and direction), read again from both runs."""
    from gage_plugins_builtin.compare.paired import StoredRun

    warn = warn or (lambda msg: None)
    runs = StoredRun(Path(result["run_a"]["path"])), StoredRun(Path(result["run_b"]["path"]))
    out: dict[str, dict[str, dict]] = {}
    for task, t in result["tasks"].items():
        wanted: dict[str, str] = {}
        for name, m in t["metrics"].items():
            for ids in (m.get("flips") or {}).values():
                for sid in ids[:MAX_SIDE_BY_SIDE]:
                    wanted.setdefault(sid, name)
        if not wanted:
            continue
        records = [run.samples(task, warn) for run in runs]
        views = out[task] = {}
        for sid, name in wanted.items():
            a, b = records[0].get(sid), records[1].get(sid)
            views[sid] = {"a": side_view(a) if a else None, "b": side_view(b) if b else None,
                          "a_value": _metric_shown(a, name), "b_value": _metric_shown(b, name)}
    return out


def _metric_shown(record: Mapping[str, Any] | None, name: str) -> str:
    result = (record or {}).get("eval_result") or {}
    if name == "overall.passed":
        value = (result.get("overall") or {}).get("passed")
        return "-" if value is None else str(int(bool(value)))
    m = (result.get("metrics") or {}).get(name)
    value = m.get("value") if isinstance(m, dict) else m
    return "-" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def render_html(result: Mapping[str, Any], views: Mapping[str, Mapping[str, dict]] | None = None) -> str:
    """A self-contained page in the report's style (its stylesheet; inline CSS, no script, no
    network): the tables, the flipped ids, each opening both runs' answers side by side
    (``views``: :func:`flip_views`; read here when not given), and the settings diff."""
    from gage_plugins_builtin.report.page import template_env

    def show(value: Any, present: bool) -> str:
        if not present:
            return "(absent)"
        return value if isinstance(value, str) else json.dumps(value, sort_keys=True)

    if views is None:
        views = flip_views(result)
    tables = {task: metric_rows(t) for task, t in result["tasks"].items()}
    groups = group_rows(result) if result.get("groups") else None
    settings = [s for s in result["settings"] if not s["same"]] + [s for s in result["settings"] if s["same"]]
    differ = sum(1 for s in result["settings"] if not s["same"])
    return template_env().get_template("compare.html.jinja").render(
        r=result, tables=tables, groups=groups, group_notes=group_notes(result), differ=differ, show=show,
        settings=settings, views=views, up=UP, max_side=MAX_SIDE_BY_SIDE, generator=pages.PAGE_GENERATOR)
