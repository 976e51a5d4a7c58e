"""The report page: one self-contained HTML file for one run, or several runs side by side.

:func:`render_report` reads run folders (``summary.json``, ``samples/<task>.jsonl``,
``config.json``) and writes a single HTML file from the package template
``templates/report.html.jinja`` (beside this module; its stylesheet ``style.css`` is shared with
``compare --html``): per task the metrics with their stderr and a 95% interval that stays in the
metric's range (:mod:`.intervals`: summary.json's bootstrap interval, or Wilson's for a
proportion), values over few rows marked, as a table and an inline SVG plot; the slices by
``data_tag`` with a plot per tag; the counts, the counters in words and the row errors grouped
by their masked message (:mod:`.wording`); timings; settings, model and versions as tables.
The groups of summary.json (``--tasks`` naming a group: lm-eval's groups table) come before the
tasks, each with its members and its aggregate rows exactly as summary.json has them (the core
aggregates; the page computes nothing). Several runs: a combined table and plot (groups too), and
what differs between the runs (n-shot, model, settings). Then a sample browser (search, filters,
pages of 50) drawn by a little plain JavaScript from a compact JSON blob embedded in the page
(:mod:`.samples`), the samples of a task in the order of their rows in the data (:mod:`.reread`),
copied into the page from a temporary file written as the samples files are read (:mod:`.spool`).
No network: styles, script and images are inline, so the file works from ``file://`` and offline.

The writer that writes it at the end of a run is :mod:`.writer`; ``gage-eval report`` is :mod:`.command`.
"""
from __future__ import annotations

import json
import sys
import tempfile
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Sequence

from gage_eval.api import GageError, RunFolder, metric_value

from gage_plugins_builtin import pages
from gage_plugins_builtin.report.intervals import SMALL_N, RowRange, interval
from gage_plugins_builtin.report.plots import bar_plot
from gage_plugins_builtin.report.reread import Reread
from gage_plugins_builtin.report.runsettings import ABSENT, check_groups, settings_of, task_version, unlisted_tasks
from gage_plugins_builtin.report.samples import compact
from gage_plugins_builtin.report.spool import Spool, position_key, row_position
from gage_plugins_builtin.report.wording import ErrorGroups, describe_counters

PAGE_SIZE = 50  # samples per page of the browser
MAX_VALUE = 2_000  # characters of one setting's value shown in a table
MAX_DIFFER = 60  # differing settings listed at the top of a page of several runs
TEMPLATE = "report.html.jinja"

__all__ = ["render_report", "report_data", "print_warning", "template_env"]


# -- settings as tables ---------------------------------------------------------
def _flat(prefix: str, value: Any, out: list[tuple[str, Any]]) -> None:
    if isinstance(value, dict) and value:
        for key, v in value.items():
            _flat(f"{prefix}.{key}" if prefix else str(key), v, out)
    else:
        out.append((prefix, value))


def shown_value(value: Any) -> str:
    """A setting's value as a table cell shows it."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str):
        text = value
    elif isinstance(value, list) and all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in value):
        text = ", ".join(map(str, value)) if value else "(none)"
    elif value == {}:
        text = "(none)"
    else:
        text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= MAX_VALUE else text[:MAX_VALUE] + " …"


def setting_rows(value: Any) -> list[tuple[str, str]]:
    """A nested mapping as (dotted key, value shown) rows."""
    out: list[tuple[str, Any]] = []
    _flat("", value if isinstance(value, dict) else {"value": value}, out)
    return [(k, shown_value(v)) for k, v in out]


def _n_shot(run: Mapping[str, Any]) -> str:
    k = (run.get("settings") or {}).get("num_fewshot")
    return str(k) if isinstance(k, int) and not isinstance(k, bool) else "as the task sets it"


# -- the page's data ----------------------------------------------------------
def _read_summary(run_dir: Path) -> dict:
    return RunFolder(run_dir).summary()


def report_data(run_dirs: Sequence[Path | str], out_dir: Path, summaries: Mapping[Path, Mapping[str, Any]] | None,
                warn: Callable[[str], None] | None, spool: Any, ordered: Mapping[Path, Iterable[str]] | None = None
                ) -> dict:
    """Everything the page shows, from the run folders (the first is the reference column),
    except the samples: each sample's compact JSON goes to ``spool`` (a binary file) as it is made,
    and ``data["samples"]`` (a :class:`.spool.Spool`) gives them back in the order the page lists
    them (per run and task, by the row's position in the data: for the tasks ``ordered`` names per
    run folder the samples file's own order, see :class:`.reread.Reread`), so memory stays flat
    however many samples such a run holds."""
    warn = warn or print_warning
    dirs = [Path(d) for d in run_dirs]
    reread = Reread(out_dir, {(i, t) for i, d in enumerate(dirs) for t in (ordered or {}).get(d, ())})
    store = Spool(spool)
    runs, task_names, stored, empty = [], [], [], set()
    error_positions: dict[tuple[int, str], dict[str, int]] = {}  # a task in order: its errored samples' positions
    for i, run_dir in enumerate(dirs):
        summary = (summaries or {}).get(run_dir) or _read_summary(run_dir)
        check_groups(RunFolder(run_dir).summary_file, summary)
        run = _run_view(summary["run"])
        stored.append(_Stored.of(run_dir, summary))
        tasks, listed = [], dict(summary.get("tasks") or {})
        for name in unlisted_tasks(run_dir, listed):
            warn(f"report: {RunFolder(run_dir).summary_file} does not list task {name!r}; the records of "
                 f"{RunFolder(run_dir).samples_file(name)} are shown without its metrics")
            listed[name] = {"status": "unlisted", "failure": "summary.json does not list this task: its samples "
                                                             "are shown, its metrics are not"}
        for name, t in listed.items():
            task_names.append((i, name))
            in_order = reread.in_file(i, name)
            listed = store.task(i, name, in_order)
            errors = ErrorGroups()
            where = error_positions[(i, name)] = {}
            ranges: dict[str, RowRange] = {}
            n_samples = 0
            for _, record in RunFolder(run_dir).records(name):
                view = compact(record, i, name, run_dir, reread)
                sid = view["id"]
                if in_order:
                    view["p"] = n_samples  # (its place in the file is its position in the data)
                    listed.add(_script_json(view))
                else:
                    listed.add(_script_json(view), sid)
                n_samples += 1
                for metric, value in (view.get("v") or {}).items():
                    rows = ranges.get(metric)
                    if rows is None:
                        rows = ranges[metric] = RowRange()
                    try:
                        rows.add(metric_value(value))
                    except GageError:  # a value the summary did not count either
                        pass
                e = view.get("e")
                if e:
                    errors.add(e["stage"], e["message"], sid)
                    if in_order:
                        where.setdefault(sid, n_samples - 1)
            if not n_samples:  # (no sample to order: its rows are not read again)
                empty.add((i, name))
            total = (t.get("counts") or {}).get("total")
            if isinstance(total, int) and total != n_samples:  # (a samples file cut short or changed by hand)
                warn(f"report: {RunFolder(run_dir).samples_file(name)} holds {n_samples} record(s) but "
                     f"{RunFolder(run_dir).summary_file} counts {total} rows of task {name!r}; the page lists "
                     f"the records")
            version = task_version(stored[-1], name)
            tasks.append(_task_view(i, name, t, ranges, errors, n_samples, None if version is ABSENT else version))
        runs.append({"index": i, "id": run["id"] or run_dir.name, "dir": str(run_dir), "run": run, "tasks": tasks,
                     "groups": group_views(summary), "summary": summary, "n_shot": _n_shot(run),
                     "tables": {"model": setting_rows({"model": run["model"], "judge": run["judge"]}),
                                "settings": setting_rows(run["settings"] or {}),
                                "versions": setting_rows(run["versions"] or {})}})
    reread.recover(dirs, [t for t in task_names if t not in empty], warn)
    for run in runs:
        for task in run["tasks"]:
            key = (run["index"], task["name"])
            where = error_positions[key] if reread.in_file(*key) else reread.positions.get(key)
            task["errors"] = task["errors"].sorted(
                lambda sid, t=task["name"], w=where: position_key(row_position(sid, t, w)))
    data_order = {f"{r}/{t}": reread.known(r, t) for r, t in task_names}
    table = _compare(runs)
    return {"runs": runs, "images": reread.embedded, "compare": table, "compare_groups": _compare_groups(runs),
            "samples": store, "positions": reread.positions, "data_order": data_order,
            "differ": _differences(stored, runs),
            "combined": bar_plot([dict(c, label=f"{row['task']} · {row['metric']}") for row in table
                                  for c in row["cells"] if c], label="label") if len(runs) > 1 else None,
            "n_samples": store.n}


def _task_view(run: int, name: str, t: Mapping[str, Any], ranges: Mapping[str, RowRange], errors: ErrorGroups,
               n_samples: int, version: Any) -> dict:
    metrics = [{"metric": m, "run": run, **interval(v, ranges.get(m))} for m, v in (t.get("metrics") or {}).items()
               if isinstance(v, dict)]
    primary = t.get("primary_metric")
    slices, slice_plots = [], []
    for key, values in (t.get("slices") or {}).items():
        rows = []
        for value, ms in values.items():
            for m, v in ms.items():
                if isinstance(v, dict):
                    rows.append({"key": key, "tag": value, "metric": m, "run": run, **interval(v, ranges.get(m))})
        slices += rows
        shown = primary if any(r["metric"] == primary for r in rows) else (rows[0]["metric"] if rows else None)
        plot = bar_plot([r for r in rows if r["metric"] == shown], label="tag")
        if plot:
            slice_plots.append({"key": key, "metric": shown, "plot": plot})
    counts = t.get("counts") or {}
    source = t.get("source") or {}
    return {"name": name, "status": t.get("status"), "failure": t.get("failure"), "primary": primary,
            "metrics": metrics, "slices": slices, "slice_plots": slice_plots,
            "counts": {k: v for k, v in counts.items() if not isinstance(v, (dict, list))},
            "counters": describe_counters(counts.get("by_counter") or {}, source.get("folder"))
            if isinstance(counts.get("by_counter"), dict) else [],
            "errors_by_stage": t.get("errors_by_stage") or {}, "errors": errors,  # sorted once the data order is known
            "timings": t.get("timings") or {}, "source": source, "version": version,
            "plot": bar_plot(metrics), "samples": n_samples}


class _Stored(NamedTuple):
    """A run folder as :func:`~.runsettings.settings_of` reads it."""

    run: Mapping[str, Any]
    tasks: Mapping[str, Any]
    config: Mapping[str, Any]
    inputs: Mapping[str, Any]

    @classmethod
    def of(cls, run_dir: Path, summary: Mapping[str, Any]) -> "_Stored":
        folder = RunFolder(run_dir)
        try:
            config, inputs = folder.config(missing_ok=True) or {}, folder.inputs(missing_ok=True) or {}
        except GageError:  # the summary alone: what differs is then read from it
            config, inputs = {}, {}
        return cls(summary.get("run") or {}, summary.get("tasks") or {}, config, inputs)


def _run_view(run: Mapping[str, Any]) -> dict:
    """summary.json's run section with every key the template shows (absent ones as None)."""
    view = {key: None for key in ("id", "created", "exit_status", "interrupted", "command", "timings", "model",
                                  "judge", "settings", "versions")}
    view.update(run)
    if isinstance(view["model"], dict):
        view["model"] = {"name": None, "model_id": None, **view["model"]}
    return view


def _by_run(runs: list[dict], part: str, head: Callable[[dict], dict]) -> list[dict]:
    """A table with one column per run of each run's ``part`` ("tasks" or "groups"): rows (name, metric)
    in first-seen order, each ``head(item)`` then the metric and a cell per run (None where absent)."""
    rows: dict[tuple, dict] = OrderedDict()
    for run in runs:
        for item in run[part]:
            for m in item["metrics"]:
                row = rows.setdefault((item["name"], m["metric"]),
                                      {**head(item), "metric": m["metric"], "cells": [None] * len(runs)})
                row["cells"][run["index"]] = m
    return list(rows.values())


def _compare(runs: list[dict]) -> list[dict]:
    """The metrics table with one column per run: rows (task, metric) in first-seen order."""
    return _by_run(runs, "tasks", lambda task: {"task": task["name"]})


def group_views(summary: Mapping[str, Any]) -> list[dict]:
    """summary.json's groups as the page shows them: each group (depth first, as the console's
    table) with its members, its tasks and, per metric it aggregates, summary.json's figures as they are."""
    out = []
    for name, g in (summary.get("groups") or {}).items():
        if not isinstance(g, Mapping):
            continue
        metrics = [{"metric": m, "value": e.get("value"), "stderr": e.get("stderr"), "n": e.get("n"),
                    "tasks": e.get("tasks"), "weight_by_size": e.get("weight_by_size", True),
                    "missing": list(e.get("missing") or [])}
                   for m, e in (g.get("metrics") or {}).items() if isinstance(e, Mapping)]
        out.append({"name": name, "alias": g.get("alias") or name, "depth": g.get("depth") or 0,
                    "members": list(g.get("members") or []), "tasks": list(g.get("tasks") or []), "metrics": metrics})
    return out


def _compare_groups(runs: list[dict]) -> list[dict]:
    """The groups' rows of the several-runs table: (group, metric) in first-seen order, a cell per run."""
    return _by_run(runs, "groups", lambda g: {"group": g["name"], "alias": g["alias"], "depth": g["depth"]})


def _differences(stored: list[_Stored], runs: list[dict]) -> list[dict]:
    """What differs between several runs: n-shot first, then the model, the settings that change
    results, task versions and data (compare's settings diff, for any number of runs)."""
    if len(runs) < 2:
        return []
    tasks = list(dict.fromkeys(t["name"] for r in runs for t in r["tasks"]))
    sides = [settings_of(s, tasks) for s in stored]
    rows = [{"key": "n-shot", "values": [r["n_shot"] for r in runs]}]
    for key in dict.fromkeys(k for side in sides for k in side):
        if key.startswith("reproducibility") or key == "settings.num_fewshot":
            continue
        values = [side.get(key, ABSENT) for side in sides]
        if any(v != values[0] for v in values[1:]):
            rows.append({"key": key, "values": ["(absent)" if v is ABSENT else shown_value(v) for v in values]})
    rows = [r for r in rows if r["key"] != "n-shot" or len(set(r["values"])) > 1]
    return rows[:MAX_DIFFER] + ([{"key": f"… {len(rows) - MAX_DIFFER} more", "values": [""] * len(runs)}]
                                if len(rows) > MAX_DIFFER else [])


def _json_for_script(value: Any) -> str:
    """JSON safe inside <script type="application/json">: '<', '>' and '&' (only ever inside JSON
    strings) and the JavaScript line separators as \\u escapes, so no value can end the element;
    JSON.parse reads them back unchanged."""
    return _script_json(value).decode("utf-8")


def _script_json(value: Any) -> bytes:
    """:func:`_json_for_script` as UTF-8 bytes (as a sample's JSON goes to the spool)."""
    if _orjson is not None:
        try:
            data = _orjson.dumps(value, option=_orjson.OPT_NON_STR_KEYS)
        except TypeError:  # (a lone surrogate: escaped as \\udXXX below, which JSON.parse reads)
            data = None
        if data is not None:
            if b"<" in data or b">" in data or b"&" in data or b"\xe2\x80\xa8" in data or b"\xe2\x80\xa9" in data:
                return data.decode("utf-8").translate(_SCRIPT_ESCAPES).encode("utf-8")
            return data
    text = json.dumps(value, ensure_ascii=True, separators=(",", ":"), default=str)
    return (text.translate(_SCRIPT_ESCAPES) if any(c in text for c in _UNSAFE) else text).encode("utf-8")


try:
    import orjson as _orjson
except ImportError:  # pragma: no cover - a core dependency; json writes the same page
    _orjson = None
_UNSAFE = "<>&\u2028\u2029"
_SCRIPT_ESCAPES = {ord(c): f"\\u{ord(c):04x}" for c in _UNSAFE}


def _fmt(value: Any, digits: int = 4) -> str:
    if isinstance(value, bool) or value is None:
        return "" if value is None else str(value)
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def template_env() -> Any:
    """The Jinja environment of the report and compare pages (autoescaped; both templates folders)."""
    import jinja2

    env = jinja2.Environment(loader=jinja2.ChoiceLoader([
        jinja2.PackageLoader("gage_plugins_builtin.report", "templates"),
        jinja2.PackageLoader("gage_plugins_builtin.compare", "templates")]),
        autoescape=True, undefined=jinja2.StrictUndefined)
    env.filters["fmt"] = _fmt
    env.globals["SMALL_N"] = SMALL_N
    return env


def render_report(run_dirs: Sequence[Path | str], out: Path | str,
                  summaries: Mapping[Path, Mapping[str, Any]] | None = None,
                  warn: Callable[[str], None] | None = None, ordered: Mapping[Path, Iterable[str]] | None = None
                  ) -> Path:
    """Write the report of ``run_dirs`` to ``out`` (replaced whole); returns its path. ``ordered``:
    per run folder, the tasks whose samples file the engine wrote in the data's order."""
    out = Path(out)
    with tempfile.TemporaryFile("w+b") as spool:
        data = report_data(run_dirs, out.parent.resolve(), summaries, warn, spool=spool, ordered=ordered)
        rest = {"images": data["images"], "page": PAGE_SIZE,
                "runs": [{"id": r["id"], "tasks": [t["name"] for t in r["tasks"]]} for r in data["runs"]],
                "summaries": [r["summary"] for r in data["runs"]], "data_order": data["data_order"]}
        html = template_env().get_template(TEMPLATE).render(
            runs=data["runs"], compare=data["compare"], compare_groups=data["compare_groups"], differ=data["differ"],
            combined=data["combined"], n_samples=data["n_samples"], page_size=PAGE_SIZE, generator=pages.PAGE_GENERATOR,
            in_data_order=all(data["data_order"].values()))
        # Every value the template shows is HTML-escaped, so this element (rendered empty) can come
        # only from the template itself: the samples' JSON goes between its tags.
        if html.count(_DATA_ELEMENT) != 1:
            raise GageError(f"the report template {TEMPLATE} must hold {_DATA_ELEMENT} once")
        head, _, tail = html.partition(_DATA_ELEMENT)
        open_tag = _DATA_ELEMENT[:-len("</script>")]

        def chunks() -> Iterable[str]:  # the samples are copied from the spool in the page's order, not held
            yield head + open_tag + '{"samples":['
            yield from data["samples"].texts(data["positions"])
            yield "]," + _json_for_script(rest)[1:] + "</script>" + tail

        pages.write_page(out, chunks())
    return out


_DATA_ELEMENT = '<script type="application/json" id="report-data"></script>'


def print_warning(msg: str) -> None:
    print(f"gage-eval: warning: {msg}", file=sys.stderr)
