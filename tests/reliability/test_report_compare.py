"""report, compare and rescore read run folders and never damage them: a page is never written
into a run folder or over a file gage-eval did not write; only the folder's own regular files of
bounded size are read (a crafted task name, a symlink to /dev/zero or outside, a FIFO are
refused at once); a torn line or a wrong-typed value is one line naming the file, line and key,
exit 2, in all three commands; no data value can break the report's page."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from harness import OK, USAGE, check

HOSTILE = ["</script><script>document.title='pwned'</script>", "\x00gage-eval-report-data\x00",
           '<script type="application/json" id="report-data"></script>', "<!-- <script>", "a\u2028b\u2029c",
           "</SCRIPT >&amp;&lt;", "]]>"]


def _run(gage, run_id: str, data: Path, *extra) -> Path:
    o = gage("--tasks", "piqa", "--model", "dummy", "--data", f"piqa={data}", "-q", *extra, run_id=run_id)
    check(o, OK)
    return o.run_dir


@pytest.fixture
def runs(gage) -> tuple[Path, Path]:
    data = gage.tmp / "data" / "rows.jsonl"
    data.parent.mkdir()
    data.write_text("".join(json.dumps({"goal": f"Question {i}?", "sol1": f"yes {i}", "sol2": "no", "label": i % 2})
                            + "\n" for i in range(12)))
    return _run(gage, "a", data), _run(gage, "b", data, "--seed", "7")


def snapshot(*folders: Path) -> dict[str, str]:
    """Every file of the run folders (name -> sha256): what a refused command must leave as it was."""
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for f in folders for p in sorted(f.rglob("*"))
            if p.is_file() and not p.is_fifo() and p.name != ".lock"}


def one_error_line(o, *parts: str) -> None:
    """The refusal is one line on stderr naming each of ``parts``."""
    lines = [line for line in o.err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("gage-eval: error: "), o.err
    for part in parts:
        assert part in lines[0], (part, lines[0])


def commands(gage, a: Path, b: Path) -> dict:
    """The three commands that read run folder ``a``."""
    return {"report": lambda: gage("report", a, "-o", gage.tmp / "page.html", run_id=None),
            "compare": lambda: gage("compare", a, b, run_id=None),
            "rescore": lambda: gage("rescore", a, "-o", gage.tmp / "rescored", run_id=None)}


# -- pages are never written into a run folder, nor over a file gage-eval did not write ------------

@pytest.mark.parametrize("target", ["samples/piqa.jsonl", "summary.json", "config.json", "new.html",
                                    "samples/new.html", "instances/piqa.jsonl"])
def test_report_output_inside_a_run_folder_is_refused(gage, runs, target):
    a, b = runs
    before = snapshot(a, b)
    o = gage("report", a, "-o", a / target, run_id=None)
    check(o, USAGE)
    one_error_line(o, f"-o {a / target}", "inside the run folder")
    assert snapshot(a, b) == before
    o = gage("report", b, "-o", a / target, run_id=None)  # into another run's folder: refused as well
    check(o, USAGE)
    one_error_line(o, "inside the run folder")
    assert snapshot(a, b) == before


@pytest.mark.parametrize("target", ["b/summary.json", "a/report.html", "b/samples/piqa.jsonl"])
def test_compare_html_inside_a_run_folder_is_refused(gage, runs, target):
    a, b = runs
    before = snapshot(a, b)
    o = gage("compare", a, b, "--html", a.parent / target, run_id=None)
    check(o, USAGE)
    one_error_line(o, f"--html {a.parent / target}", "inside the run folder")
    assert snapshot(a, b) == before


def test_a_file_gage_eval_did_not_write_is_not_replaced(gage, runs):
    a, b = runs
    notes = gage.tmp / "notes.html"
    notes.write_text("<html><body>my own notes</body></html>\n")
    for o in (gage("report", a, "-o", notes, run_id=None), gage("compare", a, b, "--html", notes, run_id=None)):
        check(o, USAGE)
        one_error_line(o, str(notes), "gage-eval did not write")
        assert notes.read_text() == "<html><body>my own notes</body></html>\n"
    os.mkfifo(gage.tmp / "fifo.html")
    o = gage("report", a, "-o", gage.tmp / "fifo.html", run_id=None)
    check(o, USAGE)
    one_error_line(o, "a FIFO")


def test_a_page_gage_eval_wrote_is_replaced(gage, runs):
    a, b = runs
    page = gage.tmp / "pages" / "page.html"
    for _ in range(2):
        check(gage("report", a, b, "-o", page, run_id=None), OK)
        check(gage("compare", a, b, "--html", page, run_id=None), OK)
    assert "gage-eval compare" in page.read_text()
    before = (a / "report.html").read_bytes()
    (a / "report.html").unlink()
    check(gage("report", a, run_id=None), OK)  # the run's own report.html, written again
    check(gage("report", a, run_id=None), OK)
    assert (a / "report.html").read_bytes() == before
    assert sorted(p.name for p in page.parent.iterdir()) == ["page.html"]  # no temporary file left
    # a page of a gage-eval from before the generator mark (its head as that version wrote it)
    (a / "report.html").write_text('<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<meta name='
                                   '"viewport" content="width=device-width">\n<title>gage-eval report: a</title>\n')
    page.write_text('<!doctype html>\n<html lang="en"><head><meta charset="utf-8">\n<title>gage-eval compare: a vs b'
                    '</title>\n')
    check(gage("report", a, run_id=None), OK)
    check(gage("compare", a, b, "--html", page, run_id=None), OK)
    assert (a / "report.html").read_bytes() == before and "generator" in page.read_text()


# -- only the run folder's own regular files of bounded size are read ---------------------------

def _edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("name", ["../../outside", "../a", "/etc/passwd", "..", "x\\..\\y"])
def test_a_crafted_task_name_is_refused(gage, runs, name):
    a, b = runs
    outside = gage.tmp / "outside.jsonl"
    outside.write_text(json.dumps({"id": "CANARY-OUTSIDE-FILE"}) + "\n")
    gage.watch.append(outside)
    _edit_json(a / "summary.json", lambda s: s["tasks"].update({name: s["tasks"]["piqa"]}))
    for command, call in commands(gage, a, b).items():
        o = call()
        check(o, USAGE)
        one_error_line(o, f"{a / 'summary.json'}", f"task name {name!r}", "not a folder name")
    assert not (gage.tmp / "page.html").exists() and not (gage.tmp / "rescored").exists()


@pytest.mark.parametrize("kind", ["dev-zero-link", "fifo", "link-outside", "dev-zero-summary"])
def test_samples_that_are_no_regular_file_of_the_run_are_refused(gage, runs, kind):
    a, b = runs
    samples = a / "samples" / "piqa.jsonl"
    target, said = samples, "not a regular file"
    if kind == "dev-zero-summary":
        target = a / "summary.json"
    target.unlink()
    if kind == "fifo":
        os.mkfifo(target)  # nobody writes it: reading it would wait forever
        said = "a FIFO, not a regular file"
    elif kind == "link-outside":
        outside = gage.tmp / "outside" / "piqa.jsonl"
        outside.write_text(json.dumps({"id": "CANARY-OUTSIDE-FILE"}) + "\n")
        target.symlink_to(outside)
        said = "outside the run folder"
    else:
        target.symlink_to("/dev/zero")
        said = "resolves to /dev/zero, outside the run folder"
    for command, call in commands(gage, a, b).items():
        o = call()
        check(o, USAGE)
        one_error_line(o, str(target), said)


def test_an_oversized_line_is_refused_without_reading_it_whole(gage, runs, monkeypatch):
    """A samples file of one endless line (a sparse 3 GiB file: no memory is used to write it)."""
    a, b = runs
    samples = a / "samples" / "piqa.jsonl"
    with samples.open("r+b") as fh:
        fh.truncate(3 << 30)
    for command, call in commands(gage, a, b).items():
        o = call()
        check(o, USAGE)
        one_error_line(o, f"{samples}:13", "a line over 64 MiB")


# -- torn lines and wrong types: one line naming the file, line and key, exit 2, in every command --

def test_a_torn_middle_line_is_refused_alike(gage, runs):
    a, b = runs
    samples = a / "samples" / "piqa.jsonl"
    lines = samples.read_text().splitlines(keepends=True)
    lines[4] = lines[4][: len(lines[4]) // 2] + "\n"
    samples.write_text("".join(lines))
    before = snapshot(a, b)
    for command, call in commands(gage, a, b).items():
        o = call()
        check(o, USAGE)
        one_error_line(o, f"{samples}:5:", "not a whole JSON record", "remove that line")
    assert snapshot(a, b) == before


def test_a_torn_last_line_is_refused_alike(gage, runs):
    a, b = runs
    samples = a / "samples" / "piqa.jsonl"
    text = samples.read_text()
    samples.write_text(text[: len(text) - 40])
    for command, call in commands(gage, a, b).items():
        o = call()
        check(o, USAGE)
        one_error_line(o, f"{samples}:12:", "torn", "resume")


def _line(n: int, change):
    def edit(a: Path) -> None:
        path = a / "samples" / "piqa.jsonl"
        lines = path.read_text().splitlines()
        lines[n - 1] = change(json.loads(lines[n - 1]))
        path.write_text("\n".join(lines) + "\n")
    return edit


def _summary(change):
    return lambda a: _edit_json(a / "summary.json", change)


WRONG = {
    "tasks a list": (_summary(lambda s: s.update(tasks=[s["tasks"]["piqa"]])), "summary.json", "key 'tasks'"),
    "run a string": (_summary(lambda s: s.update(run="r")), "summary.json", "key 'run'"),
    "task a number": (_summary(lambda s: s["tasks"].update(piqa=3)), "summary.json", "key 'tasks.piqa'"),
    "metric value a string": (_summary(lambda s: s["tasks"]["piqa"]["metrics"]["acc"].update(value="0.5")),
                              "summary.json", "key 'tasks.piqa.metrics.acc.value'"),
    "metrics a list": (_summary(lambda s: s["tasks"]["piqa"].update(metrics=[1])), "summary.json",
                       "key 'tasks.piqa.metrics'"),
    "model a string": (_summary(lambda s: s["run"].update(model="dummy")), "summary.json", "key 'run.model'"),
    "model settings a list": (_summary(lambda s: s["run"]["model"].update(settings=[])), "summary.json",
                              "key 'run.model.settings'"),
    "slices a string": (_summary(lambda s: s["tasks"]["piqa"].update(slices="x")), "summary.json",
                        "key 'tasks.piqa.slices'"),
    "record a number": (_line(3, lambda r: "42"), "samples/piqa.jsonl:3", "got a number"),
    "record a list": (_line(3, lambda r: "[]"), "samples/piqa.jsonl:3", "got a list"),
    "eval_result a string": (_line(4, lambda r: json.dumps({**r, "eval_result": "ok"})), "samples/piqa.jsonl:4",
                             "key 'eval_result'"),
    "record metrics a list": (_line(4, lambda r: json.dumps({**r, "eval_result": {**r["eval_result"], "metrics": [1]}})),
                       "samples/piqa.jsonl:4", "key 'eval_result.metrics'"),
    "record metric value a string": (_line(2, lambda r: json.dumps(
        {**r, "eval_result": {**r["eval_result"], "metrics": {"acc": "1"}}})), "samples/piqa.jsonl:2",
        "key 'eval_result.metrics.acc'"),
    "error a string": (_line(2, lambda r: json.dumps({**r, "eval_result": {**r["eval_result"], "error": "x"}})),
                       "samples/piqa.jsonl:2", "key 'eval_result.error'"),
    "predict_result an object": (_line(5, lambda r: json.dumps({**r, "predict_result": {}})),
                                 "samples/piqa.jsonl:5", "key 'predict_result'"),
    "predict entry a string": (_line(5, lambda r: json.dumps({**r, "predict_result": ["x"]})),
                               "samples/piqa.jsonl:5", "key 'predict_result[0]'"),
    "messages an object": (_line(6, lambda r: json.dumps({**r, "messages": {}})), "samples/piqa.jsonl:6",
                           "key 'messages'"),
    "id a list": (_line(6, lambda r: json.dumps({**r, "id": [1]})), "samples/piqa.jsonl:6", "key 'id'"),
    "summary a list": (lambda a: (a / "summary.json").write_text("[]"), "summary.json", "expected a JSON object"),
    "summary torn": (lambda a: (a / "summary.json").write_text('{"run": {"id": "a"}, "tas'), "summary.json",
                     "not valid JSON"),
    "inputs entry a list": (lambda a: _edit_json(a / "inputs.json", lambda i: i.update(piqa=[])), "inputs.json",
                            "key 'piqa'"),
}


@pytest.mark.parametrize("case", list(WRONG), ids=[k.replace(" ", "-") for k in WRONG])
def test_wrong_typed_json_is_one_line_in_every_command(gage, runs, case):
    a, b = runs
    edit, where, key = WRONG[case]
    edit(a)
    before = snapshot(a, b)
    for command, call in commands(gage, a, b).items():
        if where == "inputs.json" and command == "report":
            continue  # (report does not read inputs.json)
        o = call()
        check(o, USAGE)
        one_error_line(o, f"{a}/{where}", key)
        assert "internal error" not in o.err
    assert snapshot(a, b) == before
    assert not (gage.tmp / "page.html").exists() and not (gage.tmp / "rescored").exists()


def test_rescore_wrong_typed_config_is_one_line(gage, runs):
    a, b = runs
    _edit_json(a / "config.json", lambda c: c.update(tasks="piqa"))
    o = gage("rescore", a, "-o", gage.tmp / "rescored", run_id=None)
    check(o, USAGE)
    one_error_line(o, f"{a / 'config.json'}", "key 'tasks'", "expected a list")
    _edit_json(a / "config.json", lambda c: c.update(tasks=["piqa"], model_args=[]))
    o = gage("rescore", a, "-o", gage.tmp / "rescored", run_id=None)
    check(o, USAGE)
    one_error_line(o, f"{a / 'config.json'}", "key 'model_args'", "expected an object")


# -- no data value can break the page --------------------------------------------------------------

def page_data(page: Path) -> dict:
    """The report's data as a browser reads it: the script element's text ends at the first
    '</script' (any case), then JSON.parse (node's when installed, else Python's json)."""
    text = page.read_text(encoding="utf-8")
    m = re.search(r'<script type="application/json" id="report-data">(.*?)</script', text, re.S | re.I)
    assert m, "no data element"
    raw = m.group(1)
    node = shutil.which("node")
    if node:
        proc = subprocess.run([node, "-e", "let s='';process.stdin.on('data',d=>s+=d).on('end',()=>"
                               "process.stdout.write(JSON.stringify(JSON.parse(s))))"],
                              input=raw, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)
    return json.loads(raw)


def test_data_values_cannot_break_the_page(gage):
    data = gage.tmp / "data" / "rows.jsonl"
    data.parent.mkdir()
    data.write_text("".join(json.dumps({"goal": h, "sol1": h + " yes", "sol2": "no", "label": i % 2}) + "\n"
                            for i, h in enumerate(HOSTILE)))
    a = _run(gage, "a", data, "--system-prompt", HOSTILE[0] + HOSTILE[2])
    for page in (a / "report.html", gage.tmp / "page.html"):
        if page != a / "report.html":  # values the page shows outside the data element (argv holds no NUL)
            _edit_json(a / "summary.json", lambda s: (s["run"].update(command="".join(HOSTILE)),
                                                      s["run"]["settings"].update(system_prompt="".join(HOSTILE))))
            check(gage("report", a, "-o", page, run_id=None), OK)
        text = page.read_text(encoding="utf-8")
        assert text.lower().count("<script") == 2 and text.lower().count("</script") == 2  # the template's own
        shown = page_data(page)
        assert [s["id"] for s in shown["samples"]] == [f"piqa-{i}" for i in range(len(HOSTILE))]
        texts = [p for s in shown["samples"] for m in s["m"] for p in m[1] if isinstance(p, str)]
        for h in HOSTILE:
            assert any(h in t for t in texts), h
        assert shown["summaries"][0] == json.loads((a / "summary.json").read_text())
