"""The commands a user runs on finished run folders (report, compare, rescore), attacked from the
outside: a summary.json edited by hand, an output path inside the run read."""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

from click.testing import CliRunner

from gage_eval.cli import cli


def _invoke(*args) -> object:
    return CliRunner().invoke(cli, [str(a) for a in args])


def _run(tmp_path: Path, run_id: str) -> Path:
    res = _invoke("--tasks", "piqa", "--model", "dummy", "--limit", "6", "-o", tmp_path / "runs", "--run-id", run_id,
                  "-q", "--no-report")
    assert res.exit_code == 0, res.output
    return tmp_path / "runs" / run_id


def _page_samples(page: Path) -> list[dict]:
    m = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', page.read_text(), re.S)
    return json.loads(m.group(1))["samples"]


def test_samples_of_a_task_summary_json_does_not_list_are_shown_and_named(tmp_path):
    a = _run(tmp_path, "a")
    d = tmp_path / "runs" / "d"
    shutil.copytree(a, d)
    summary = json.loads((d / "summary.json").read_text())
    summary["tasks"] = {}  # (edited by hand, or written before the run's tasks ended)
    (d / "summary.json").write_text(json.dumps(summary))
    shutil.copy(d / "samples" / "piqa.jsonl", d / "samples" / "<b>x.jsonl")  # (no task's file: not listed)
    os.mkfifo(d / "samples" / "pipe.jsonl")  # (nor is what is no regular file: never opened)
    res = _invoke("report", a, d, "-o", tmp_path / "both.html")
    assert res.exit_code == 0, res.output
    assert f"{d / 'summary.json'} does not list task 'piqa'" in res.output  # (a warning: not left out in silence)
    assert "<b>x" not in res.output and "pipe" not in res.output
    samples = _page_samples(tmp_path / "both.html")
    assert len(samples) == 12 and sorted({s["r"] for s in samples}) == [0, 1]
    res = _invoke("compare", a, d)
    assert res.exit_code == 2
    assert f"{d / 'summary.json'} does not list task(s) piqa" in res.output and "no task in common" in res.output


def test_rescore_never_writes_into_the_run_it_reads(tmp_path):
    a = _run(tmp_path, "a")
    before = sorted(p.relative_to(a).as_posix() for p in a.rglob("*"))
    for inside in (a / "rescored", a / "samples" / "x"):
        res = _invoke("rescore", a, "-o", inside)
        assert res.exit_code == 2 and f"-o {inside}: inside the run folder {a}" in res.output, res.output
    assert sorted(p.relative_to(a).as_posix() for p in a.rglob("*")) == before


def test_an_image_url_with_any_scheme_but_file_is_never_loaded_by_the_report(tmp_path):
    from gage_plugins_builtin.report.reread import Reread

    reread = Reread(tmp_path)
    for url in ("HTTP://evil.example/x.png", "https://evil.example/x.png", "ftp://evil.example/x.png", "http:evil.x/a"):
        assert reread.ref(url, 0, "t", tmp_path) == {"ph": "remote image (not loaded): " + url}
    assert reread.ref("file:///imgs/a.png", 0, "t", tmp_path)["src"].endswith("imgs/a.png")
    assert reread.ref("imgs/a.png", 0, "t", tmp_path) == {"src": "imgs/a.png"}


def test_a_task_folder_gone_since_the_run_is_named_as_the_runs_setting(tmp_path):
    assert _invoke("new-task", "qa", "--dir", tmp_path / "tasks").exit_code == 0
    for i in (0, 1):
        res = _invoke("--tasks", "qa", "--include-path", tmp_path / "tasks", "--model", "dummy", "--shard", f"{i}/2",
                      "-o", tmp_path / "runs", "--run-id", f"s{i}", "-q", "--no-report")
        assert res.exit_code == 0, res.output
    (tmp_path / "tasks").rename(tmp_path / "moved")
    s0 = tmp_path / "runs" / "s0"
    # (the user gave no --include-path here: the line names the run's config.json, which holds it)
    res = _invoke("rescore", s0, "-o", tmp_path / "new")
    assert res.exit_code == 2, res.output
    assert f"rescore: {s0 / 'config.json'}: --include-path {tmp_path / 'tasks'}: not a folder" in res.output
    res = _invoke("merge", s0, tmp_path / "runs" / "s1", "-o", tmp_path / "merged")
    assert res.exit_code == 2, res.output
    assert f"merge: {s0 / 'config.json'}: --include-path {tmp_path / 'tasks'}: not a folder" in res.output
    assert not (tmp_path / "new").exists() and not (tmp_path / "merged").exists()


def test_compare_task_takes_comma_separated_names_as_rescore_does(tmp_path):
    for run_id in ("a", "b"):
        res = _invoke("--tasks", "piqa,arc_easy", "--model", "dummy", "--limit", "3", "-o", tmp_path / "runs",
                      "--run-id", run_id, "-q", "--no-report")
        assert res.exit_code == 0, res.output
    a, b = tmp_path / "runs" / "a", tmp_path / "runs" / "b"
    res = _invoke("compare", a, b, "--task", "arc_easy, piqa", "--json", "--samples", "0")
    assert res.exit_code == 0, res.output
    assert list(json.loads(res.stdout)["tasks"]) == ["arc_easy", "piqa"]


def test_compare_html_makes_its_folder_and_a_page_that_cannot_be_written_loses_no_result(tmp_path, monkeypatch):
    from gage_eval.api import OutputError
    from gage_plugins_builtin import pages

    a, b = _run(tmp_path, "a"), _run(tmp_path, "b")
    res = _invoke("compare", a, b, "--html", tmp_path / "new" / "c.html", "--samples", "0")
    assert res.exit_code == 0 and (tmp_path / "new" / "c.html").is_file(), res.output

    def disk_full(out, chunks, make_folder=True):
        raise OutputError(f"{out}: cannot write the page (No space left on device)")

    monkeypatch.setattr(pages, "write_page", disk_full)
    res = _invoke("compare", a, b, "--html", tmp_path / "c.html", "--samples", "0", "--json")
    assert res.exit_code == 4 and "cannot write the page (No space left on device)" in res.stderr
    assert json.loads(res.stdout)["tasks"]["piqa"]  # (the comparison was printed first)


def test_a_samples_file_that_disagrees_with_the_summarys_count_is_named(tmp_path):
    a = _run(tmp_path, "a")
    lines = (a / "samples" / "piqa.jsonl").read_text().splitlines(keepends=True)
    (a / "samples" / "piqa.jsonl").write_text("".join(lines[:4]))  # (cut short, by hand or a full disk)
    res = _invoke("report", a, "-o", tmp_path / "a.html")
    assert res.exit_code == 0, res.output
    assert f"{a / 'samples' / 'piqa.jsonl'} holds 4 record(s) but {a / 'summary.json'} counts 6 rows" in res.output
    assert len(_page_samples(tmp_path / "a.html")) == 4


def test_compare_prints_control_characters_of_a_sample_id_escaped(tmp_path):
    a, b = _run(tmp_path, "a"), _run(tmp_path, "b")
    for run, flip in ((a, False), (b, True)):
        path = run / "samples" / "piqa.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        rows[0]["id"] = "row\x1b]0;pwned\x07\x1b[2J"  # (an id from a dataset: retitles and clears a terminal)
        if flip:
            acc = rows[0]["eval_result"]["metrics"]["acc"]
            acc["value"] = 1.0 - acc["value"]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = _invoke("compare", a, b, "--samples", "0")
    assert res.exit_code == 0, res.output
    assert "row\\x1b]0;pwned\\x07\\x1b[2J" in res.stdout and "\x1b" not in res.stdout and "\x07" not in res.stdout


def test_a_hand_edited_groups_entry_is_one_line_in_report_and_compare(tmp_path):
    a, b = _run(tmp_path, "a"), _run(tmp_path, "b")
    summary = json.loads((b / "summary.json").read_text())
    good = {"alias": "g", "depth": 0, "members": ["piqa"], "tasks": ["piqa"],
            "metrics": {"acc": {"value": 0.5, "stderr": 0.2, "n": 6, "tasks": 1, "missing": []}}}
    for groups, why in (({"g": {**good, "depth": "1;x"}}, "'groups.g.depth': expected a whole number, got a string"),
                        ({"g": {**good, "members": 5}}, "'groups.g.members': expected a list, got a number"),
                        ({"g": {**good, "metrics": {"acc": {"missing": 5}}}},
                         "'groups.g.metrics.acc.missing': expected a list, got a number"),
                        ({"g": 5}, "'groups.g': expected an object, got a number"),
                        ([1], "'groups': expected an object, got a list")):
        (b / "summary.json").write_text(json.dumps({**summary, "groups": groups}))
        for args in (("report", b, "-o", tmp_path / "b.html"), ("compare", a, b)):
            res = _invoke(*args)  # (it was an internal error, exit 5, in the report)
            want = f"gage-eval: error: {b / 'summary.json'}: key {why}; not a summary gage-eval wrote"
            assert res.exit_code == 2 and res.output.strip() == want, res.output
    (b / "summary.json").write_text(json.dumps({**summary, "groups": {"g": good}}))
    assert _invoke("report", b, "-o", tmp_path / "b.html").exit_code == 0


def test_rescore_and_compare_of_a_run_that_did_not_finish_say_so(tmp_path):
    a = _run(tmp_path / "my runs", "a")
    summary = json.loads((a / "summary.json").read_text())
    summary["run"]["interrupted"] = "interrupted by the user (Ctrl-C)"
    (a / "summary.json").write_text(json.dumps(summary))
    res = _invoke("compare", a, _run(tmp_path, "c"), "--samples", "0")
    assert res.exit_code == 0 and f"warning: {a} did not finish (interrupted by the user (Ctrl-C)); the rows it " \
                                  f"stored are compared" in res.stderr, res.output
    res = _invoke("rescore", a, "-o", tmp_path / "new", "-q")
    assert res.exit_code == 0, res.output
    assert f"warning: {a} did not finish (interrupted by the user (Ctrl-C)); only its stored rows are rescored " \
           f"(gage-eval --resume '{a}' runs the rest)" in res.stderr
    (a / "summary.json").unlink()  # (killed before it wrote one)
    res = _invoke("rescore", a, "-o", tmp_path / "new2", "-q")
    assert res.exit_code == 0 and f"warning: {a} did not finish (no summary.json)" in res.stderr, res.output
    res = _invoke("rescore", _run(tmp_path, "b"), "-o", tmp_path / "new3", "-q")
    assert res.exit_code == 0 and "did not finish" not in res.stderr
