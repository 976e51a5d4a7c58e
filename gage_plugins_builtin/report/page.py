"""The report page: one self-contained HTML file for one run, or several runs side by side.

:func:`render_report` reads run folders (``summary.json``, ``samples/<task>.jsonl``,
``config.json``) and writes a single HTML file from the package template
``templates/report.html.jinja`` (beside this module): per task the metrics with their stderr and 95% interval
(value +/- 1.96 stderr, summary.json's ci95.normal) as a table and an inline SVG plot, the slices by ``data_tag``, the
counts, the row errors grouped by message with their locators, timings, settings (already
masked in the summary) and versions; then a sample browser (search, filters, pages of 50)
drawn by a little plain JavaScript from a compact JSON blob embedded in the page. No network:
styles, script and images are inline, so the file works from ``file://`` and offline.

Images: the samples file keeps a long ``data:`` URL only as a placeholder with its sha256
(:func:`gage_eval.api.sample.elide_inline_media`), so the report reads the task's rows again through
its loader and preprocessor (the run's ``config.json``; :func:`gage_eval.api.reread_samples`), finds the URLs with those hashes and
embeds small JPEG thumbnails (at most :data:`MAX_IMAGES` per report); a local image path is
referenced relative to the report instead. A row that cannot be read again shows a placeholder.

The writer that writes it at the end of a run is :mod:`.writer`; ``gage-eval report`` is :mod:`.command`.
"""
from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import sys
import tempfile
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from gage_eval.api import GageError, RunFolder, pages, reread_samples, stats

PAGE_SIZE = 50  # samples per page of the browser
MAX_TEXT = 20_000  # characters kept of one text field of a sample (the samples file has all)
MAX_IMAGES = 2_000  # thumbnails embedded per report
THUMB_PX = 320  # a thumbnail's longer side
MAX_LOCATORS = 20  # locators listed per error message
TEMPLATE = "report.html.jinja"

__all__ = ["render_report", "report_data"]


# -- reading a run folder ------------------------------------------------------
def _read_summary(run_dir: Path) -> dict:
    summary = RunFolder(run_dir).summary()
    return summary


def _clip(text: Any) -> str:
    text = "" if text is None else text if isinstance(text, str) else json.dumps(text, ensure_ascii=False)
    if len(text) > MAX_TEXT:
        return text[:MAX_TEXT] + f"\n... [{len(text) - MAX_TEXT} more characters in the samples file]"
    return text


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_content_text(p.get("text")) if isinstance(p, dict) else _content_text(p) for p in content)
    return "" if content is None else str(content)


def _elided_hash(url: str) -> str | None:
    """The sha256 in an elided data URL's placeholder (``data:<mime>;elided,sha256=<hex>;...``)."""
    if url.startswith("data:") and ";elided,sha256=" in url[:80]:
        return url.split("sha256=", 1)[1].split(";", 1)[0]
    return None


def _url_digest(url: str) -> str:
    """The sha256 an elided data URL's placeholder names (:func:`gage_eval.api.sample.elide_inline_media`)."""
    return hashlib.sha256(url.encode("ascii", "replace")).hexdigest()


class _Images:
    """The images of the report: thumbnails by key, shared by the samples that show them."""

    def __init__(self, out_dir: Path):
        self.out_dir = out_dir
        self.embedded: dict[str, str] = {}  # key -> data URL (a thumbnail)
        self.wanted: dict[tuple[int, str], set[str]] = {}  # (run, task) -> elided hashes to recover

    def ref(self, url: str, run: int, task: str, run_dir: Path) -> dict:
        """The image part of a message segment: {"k": key} for an embedded thumbnail, {"src": ...}
        for a file beside the report, {"ph": why} when it cannot be shown."""
        digest = _elided_hash(url)
        if digest is not None:
            self.wanted.setdefault((run, task), set()).add(digest)
            return {"k": digest}
        if url.startswith("data:"):  # short enough to be kept in the record
            digest = _url_digest(url)
            self.embedded.setdefault(digest, url)
            return {"k": digest}
        if url.startswith(("http://", "https://")):
            return {"ph": "remote image (not loaded): " + url[:200]}
        path = url[7:] if url.startswith("file://") else url
        p = Path(path)
        if not p.is_absolute():
            p = run_dir / p
        try:
            rel = os.path.relpath(p, self.out_dir)
        except ValueError:  # another drive
            rel = p.as_uri()
        return {"src": Path(rel).as_posix()}

    def recover(self, run_dirs: Sequence[Path], warn: Callable[[str], None]) -> None:
        """Read the rows of the tasks with elided images again and embed their thumbnails."""
        budget = MAX_IMAGES - len(self.embedded)
        for (run, task), hashes in self.wanted.items():
            if budget <= 0:
                break
            try:
                budget -= self._recover_task(run_dirs[run], task, hashes, budget)
            except Exception as exc:  # a report shows what it can: the rows may have moved
                warn(f"report: the images of task {task!r} could not be read again ({type(exc).__name__}: {exc}); "
                     f"placeholders are shown")

    def _recover_task(self, run_dir: Path, task: str, hashes: set[str], budget: int) -> int:
        found = 0
        todo = set(hashes)
        for sample in reread_samples(run_dir, task):
            for url in _data_urls(sample.get("messages")):
                digest = _url_digest(url)
                if digest in todo:
                    todo.discard(digest)
                    thumb = _thumbnail(url)
                    if thumb:
                        self.embedded[digest] = thumb
                        found += 1
            if not todo or found >= budget:
                return found
        return found


def _data_urls(value: Any) -> Iterable[str]:
    if isinstance(value, dict):
        for k, v in value.items():
            if k == "url" and isinstance(v, str) and v.startswith("data:"):
                yield v
            elif isinstance(v, (dict, list)):
                yield from _data_urls(v)
    elif isinstance(value, list):
        for v in value:
            yield from _data_urls(v)


def _thumbnail(url: str) -> str | None:
    """A small JPEG data URL of the image (the image itself when Pillow is missing and it is small)."""
    try:
        head, payload = url.split(",", 1)
        raw = base64.b64decode(payload) if head.endswith(";base64") else payload.encode()
    except ValueError:
        return None
    try:
        from PIL import Image
    except ImportError:
        return url if len(url) <= 200_000 else None
    try:
        with Image.open(io.BytesIO(raw)) as img:
            img.thumbnail((THUMB_PX, THUMB_PX))
            if img.mode not in ("RGB", "L"):
                rgba = img.convert("RGBA")
                img = Image.new("RGB", rgba.size, (255, 255, 255))
                img.paste(rgba, mask=rgba.getchannel("A"))
            buf = io.BytesIO()
            img.save(buf, "JPEG", quality=75)
    except Exception:  # not an image Pillow reads
        return None
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


# -- one sample, compact ------------------------------------------------------
def _status(result: Mapping[str, Any]) -> str:
    """c: correct, w: wrong, e: errored, u: not scored."""
    if result.get("error"):
        return "e"
    overall = result.get("overall") or {}
    passed = overall.get("passed")
    if isinstance(passed, bool):
        return "c" if passed else "w"
    score = overall.get("score")
    if isinstance(score, (int, float)) and not isinstance(score, bool):
        return "c" if score >= 1 else "w"
    return "u"


def _tags(data_tag: Any) -> list[str]:
    out = []
    if isinstance(data_tag, dict):
        for k, v in data_tag.items():
            for item in (v if isinstance(v, list) else [v]):
                if item is not None and not isinstance(item, (dict, list)):
                    out.append(f"{k}={item}")
    return out


def _compact_messages(record: Mapping[str, Any], run: int, task: str, run_dir: Path, images: _Images) -> list:
    """The sample's messages as [role, parts]: text clipped, images as thumbnail references."""
    messages = []
    for m in record.get("messages") or []:
        if not isinstance(m, dict):
            continue
        parts: list[Any] = []
        content = m.get("content")
        for seg in (content if isinstance(content, list) else [content]):
            if isinstance(seg, dict) and isinstance(seg.get("type"), str) and seg["type"] != "text":
                media = seg.get(seg.get("type")) if isinstance(seg.get(seg.get("type")), dict) else seg
                url = media.get("url") if isinstance(media, dict) else None
                if isinstance(url, str) and seg.get("type") == "image_url":
                    parts.append(images.ref(url, run, task, run_dir))
                else:
                    parts.append({"ph": f"[{seg.get('type')}]"})
            else:
                text = seg.get("text", "") if isinstance(seg, dict) else seg
                if text:
                    parts.append(_clip(text))
        messages.append([m.get("role", ""), parts])
    return messages


def _compact(record: Mapping[str, Any], run: int, task: str, run_dir: Path, images: _Images) -> dict:
    result = record.get("eval_result") or {}
    out: dict[str, Any] = {"r": run, "t": task, "id": str(record.get("id", "")), "s": _status(result)}
    tags = _tags(record.get("data_tag"))
    if tags:
        out["g"] = tags
    messages = _compact_messages(record, run, task, run_dir, images)
    if messages:
        out["m"] = messages
    options = record.get("options")
    if isinstance(options, list) and options:
        out["opt"] = [[str(o.get("id", "")), _clip(o.get("content"))] for o in options if isinstance(o, dict)]
    predicted = record.get("predict_result") or []
    if predicted and isinstance(predicted[0], dict):
        first = predicted[0]
        text = _content_text((first.get("message") or {}).get("content"))
        if not text and first.get("raw_text"):
            text = first["raw_text"]
        if text:
            out["o"] = _clip(text)
    refs = []
    for ref in record.get("references") or []:
        if isinstance(ref, dict):
            refs.append(_clip(_content_text(ref.get("answer"))))
        else:
            refs.append(_clip(ref))
    if refs:
        out["ref"] = refs
    overall = result.get("overall") or {}
    if overall.get("extracted") is not None:
        out["x"] = _clip(overall.get("extracted"))
    values = {}
    for name, m in (result.get("metrics") or {}).items():  # a result dict, or a bare number
        values[name] = m.get("value") if isinstance(m, dict) else m
    if values:
        out["v"] = values
    error = result.get("error")
    if isinstance(error, dict):
        out["e"] = {"stage": error.get("stage"), "message": _clip(error.get("message")),
                    "locator": error.get("locator")}
    judge = result.get("judge")
    if judge:
        out["j"] = judge
    return out


# -- the page's data ----------------------------------------------------------
def _interval(metric: Mapping[str, Any]) -> dict:
    value, stderr = metric.get("value"), metric.get("stderr")
    row = {"value": value, "stderr": stderr, "n": metric.get("n"), "lo": None, "hi": None,
           "higher_is_better": metric.get("higher_is_better")}
    if isinstance(value, (int, float)) and isinstance(stderr, (int, float)):
        row["lo"], row["hi"] = value - stats.Z95 * stderr, value + stats.Z95 * stderr
    return row


def _plot(rows: list[dict]) -> dict | None:
    """The bar plot's geometry: one group per metric, one bar per run, whiskers for the interval."""
    vals = [x for r in rows for x in (r["value"], r["lo"], r["hi"]) if isinstance(x, (int, float))]
    if not vals:
        return None
    points = [r["value"] for r in rows if isinstance(r["value"], (int, float))] or vals
    lo, hi = min(0.0, min(vals)), max(vals)
    if 0 <= min(points) and max(points) <= 1:  # a rate: the axis is [0, 1], whiskers clipped to it
        lo, hi = 0.0, 1.0
    span = (hi - lo) or 1.0
    label_w, width, bar_h, gap = 170, 640, 16, 10
    plot_w = width - label_w - 70

    def x(v: float) -> float:
        return round(label_w + (min(max(v, lo), hi) - lo) / span * plot_w, 2)

    groups = OrderedDict()
    for r in rows:
        groups.setdefault(r["metric"], []).append(r)
    bars, labels, y = [], [], 8
    for metric, items in groups.items():
        labels.append({"y": y + bar_h * len(items) / 2 + 4, "text": metric})
        for r in items:
            if isinstance(r["value"], (int, float)):
                x0, x1 = sorted((x(0.0 if lo <= 0 <= hi else lo), x(r["value"])))
                bar = {"x": x0, "w": max(round(x1 - x0, 2), 1), "y": y, "h": bar_h - 3, "run": r["run"],
                       "value": r["value"], "tx": x(max(r["value"], r["hi"] or r["value"])) + 4}
                if r["lo"] is not None:
                    bar.update(lo=x(r["lo"]), hi=x(r["hi"]), cy=y + (bar_h - 3) / 2)
                bars.append(bar)
            y += bar_h
        y += gap
    ticks = [{"x": x(lo + span * i / 4), "text": f"{lo + span * i / 4:.3g}"} for i in range(5)]
    return {"width": width, "height": y + 18, "bars": bars, "labels": labels, "ticks": ticks, "axis_y": y,
            "x0": label_w, "x1": label_w + plot_w}


def report_data(run_dirs: Sequence[Path | str], out_dir: Path, summaries: Mapping[Path, Mapping[str, Any]] | None,
                warn: Callable[[str], None] | None, spool: Any) -> dict:
    """Everything the page shows, from the run folders (the first is the reference column),
    except the samples: each sample's compact JSON goes to ``spool`` (a text file), one per
    line, so memory stays flat however many samples the runs hold."""
    warn = warn or print_warning
    dirs = [Path(d) for d in run_dirs]
    images = _Images(out_dir)
    runs = []
    for i, run_dir in enumerate(dirs):
        summary = (summaries or {}).get(run_dir) or _read_summary(run_dir)
        run = _run_view(summary["run"])
        tasks = []
        for name, t in (summary.get("tasks") or {}).items():
            errors: dict[tuple, dict] = OrderedDict()
            n_samples = 0
            for _, record in RunFolder(run_dir).records(name):
                compact = _compact(record, i, name, run_dir, images)
                spool.write(_json_for_script(compact) + "\n")
                n_samples += 1
                e = compact.get("e")
                if e:
                    group = errors.setdefault((e["stage"], e["message"]), {"stage": e["stage"], "message": e["message"],
                                                                          "count": 0, "locators": []})
                    group["count"] += 1
                    if len(group["locators"]) < MAX_LOCATORS:
                        group["locators"].append(e.get("locator") or compact["id"])
            metrics = [{"metric": m, "run": i, **_interval(v)} for m, v in (t.get("metrics") or {}).items()
                       if isinstance(v, dict)]
            slices = []
            for key, values in (t.get("slices") or {}).items():
                for value, ms in values.items():
                    for m, v in ms.items():
                        slices.append({"key": key, "tag": value, "metric": m, **_interval(v)})
            tasks.append({"name": name, "status": t.get("status"), "failure": t.get("failure"),
                          "primary": t.get("primary_metric"), "metrics": metrics, "slices": slices,
                          "counts": t.get("counts") or {}, "errors_by_stage": t.get("errors_by_stage") or {},
                          "errors": sorted(errors.values(), key=lambda g: -g["count"]),
                          "timings": t.get("timings") or {}, "source": t.get("source") or {},
                          "plot": _plot(metrics), "samples": n_samples})
        runs.append({"index": i, "id": run["id"] or run_dir.name, "dir": str(run_dir), "run": run,
                     "tasks": tasks, "summary": summary})
    if images.wanted:
        images.recover(dirs, warn)
    return {"runs": runs, "images": images.embedded, "compare": _compare(runs),
            "n_samples": sum(t["samples"] for r in runs for t in r["tasks"])}


def _run_view(run: Mapping[str, Any]) -> dict:
    """summary.json's run section with every key the template shows (absent ones as None)."""
    view = {key: None for key in ("id", "created", "exit_status", "interrupted", "command", "timings", "model",
                                  "judge", "settings", "versions")}
    view.update(run)
    if isinstance(view["model"], dict):
        view["model"] = {"name": None, "model_id": None, **view["model"]}
    return view


def _compare(runs: list[dict]) -> list[dict]:
    """The metrics table with one column per run: rows (task, metric) in first-seen order."""
    rows: dict[tuple, dict] = OrderedDict()
    for run in runs:
        for task in run["tasks"]:
            for m in task["metrics"]:
                row = rows.setdefault((task["name"], m["metric"]), {"task": task["name"], "metric": m["metric"],
                                                                   "cells": [None] * len(runs)})
                row["cells"][run["index"]] = m
    return list(rows.values())


def _json_for_script(value: Any) -> str:
    """JSON safe inside <script type="application/json">: '<', '>' and '&' (only ever inside JSON
    strings) and the JavaScript line separators as \\u escapes, so no value can end the element;
    JSON.parse reads them back unchanged."""
    try:
        import orjson

        text = orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode("utf-8")
    except (ImportError, TypeError):  # (a lone surrogate: escaped as \\udXXX, which JSON.parse reads)
        text = json.dumps(value, ensure_ascii=True, separators=(",", ":"), default=str)
    return text.translate(_SCRIPT_ESCAPES)


_SCRIPT_ESCAPES = {ord(c): f"\\u{ord(c):04x}" for c in "<>&\u2028\u2029"}


def _fmt(value: Any, digits: int = 4) -> str:
    if isinstance(value, bool) or value is None:
        return "" if value is None else str(value)
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def render_report(run_dirs: Sequence[Path | str], out: Path | str,
                  summaries: Mapping[Path, Mapping[str, Any]] | None = None,
                  warn: Callable[[str], None] | None = None) -> Path:
    """Write the report of ``run_dirs`` to ``out`` (replaced whole); returns its path."""
    import jinja2

    out = Path(out)
    with tempfile.TemporaryFile("w+", encoding="utf-8") as spool:
        data = report_data(run_dirs, out.parent.resolve(), summaries, warn, spool=spool)
        env = jinja2.Environment(loader=jinja2.PackageLoader("gage_plugins_builtin.report", "templates"),
                                 autoescape=True, undefined=jinja2.StrictUndefined)
        env.filters["fmt"] = _fmt
        env.filters["tojson_compact"] = lambda v: json.dumps(v, ensure_ascii=False, sort_keys=False, indent=1,
                                                             default=str)
        rest = {"images": data["images"], "page": PAGE_SIZE,
                "runs": [{"id": r["id"], "tasks": [t["name"] for t in r["tasks"]]} for r in data["runs"]],
                "summaries": [r["summary"] for r in data["runs"]]}
        html = env.get_template(TEMPLATE).render(runs=data["runs"], compare=data["compare"], z=stats.Z95,
                                                 n_samples=data["n_samples"], page_size=PAGE_SIZE, generator=pages.PAGE_GENERATOR)
        # Every value the template shows is HTML-escaped, so this element (rendered empty) can come
        # only from the template itself: the samples' JSON goes between its tags.
        if html.count(_DATA_ELEMENT) != 1:
            raise GageError(f"the report template {TEMPLATE} must hold {_DATA_ELEMENT} once")
        head, _, tail = html.partition(_DATA_ELEMENT)
        open_tag = _DATA_ELEMENT[:-len("</script>")]

        def chunks() -> Iterable[str]:  # the samples are copied from the spool, not held
            yield head + open_tag + '{"samples":['
            spool.seek(0)
            for j, line in enumerate(spool):
                yield ("," if j else "") + line.rstrip("\n")
            yield "]," + _json_for_script(rest)[1:] + "</script>" + tail

        pages.write_page(out, chunks())
    return out


_DATA_ELEMENT = '<script type="application/json" id="report-data"></script>'


def print_warning(msg: str) -> None:
    print(f"gage-eval: warning: {msg}", file=sys.stderr)
