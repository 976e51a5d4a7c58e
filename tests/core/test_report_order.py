"""The report's sample order without reading the data again (issue 24): the engine says, per
task, whether it wrote ``samples/<task>.jsonl`` in the data's order (``TaskDone.in_data_order``);
the report writer then takes each sample's position from the file and reads no row again, and
reads the rows (for the positions) only when the order is not known: a resume that kept records,
rows skipped by --shard, a row that failed its checks, a rescore. Either way the page lists the
samples in the data's order with the same positions. The page's JSON is escaped as before where
it has something to escape (and left as it is, without a pass over it, where it has not)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import gage_eval.engine.loop as loop
from gage_plugins_builtin.report.writer import ReportWriter


def embedded(path: Path) -> dict:
    m = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', path.read_text(), re.S)
    assert m, "no embedded data"
    return json.loads(m.group(1))


@pytest.fixture
def watched(monkeypatch):
    """What the run tells the report writer (task -> in_data_order) and the tasks whose rows were read again."""
    seen = {"order": {}, "reread": []}
    reread = loop.reread_samples

    def counted(run_dir, task):
        seen["reread"].append(task)
        return reread(run_dir, task)

    monkeypatch.setattr(loop, "reread_samples", counted)
    task_end = ReportWriter.task_end

    def noted(self, event):
        seen["order"][event.task] = event.in_data_order
        return task_end(self, event)

    monkeypatch.setattr(ReportWriter, "task_end", noted)
    return seen


def _run(run_cli, out: Path, run_id: str, *extra) -> Path:
    result = run_cli("--tasks", "piqa", "--model", "dummy", "--limit", "24", "-o", out, "--run-id", run_id, "-q",
                     *extra)
    assert result.exit_code in (0, 1), result.output
    return out / run_id


def _ids(run_dir: Path) -> list[str]:
    return [json.loads(line)["id"] for line in (run_dir / "samples" / "piqa.jsonl").read_text().splitlines()]


def _row(sid: str) -> int:
    return int(sid.rsplit("-", 1)[1])


def test_a_run_in_data_order_is_listed_from_its_samples_file_without_reading_rows_again(run_cli, tmp_path, watched):
    run_dir = _run(run_cli, tmp_path, "r")
    assert watched["order"] == {"piqa": True}
    assert watched["reread"] == []  # the page read no dataset row
    data = embedded(run_dir / "report.html")
    assert [s["id"] for s in data["samples"]] == _ids(run_dir) == [f"piqa-{i}" for i in range(24)]
    assert [s["p"] for s in data["samples"]] == list(range(24))
    assert data["data_order"] == {"0/piqa": True}


def test_a_resumed_run_with_kept_records_is_read_again_and_listed_in_data_order(run_cli, tmp_path, watched):
    run_dir = _run(run_cli, tmp_path, "r", "--model-args", "fail_every=3", "--max-error-rate", "1")
    assert watched["order"] == {"piqa": True} and watched["reread"] == []
    watched["order"].clear()
    result = run_cli("--resume", run_dir, "-q")  # the rows the backend failed run again, after the kept ones
    assert result.exit_code in (0, 1), result.output
    ids = _ids(run_dir)
    assert ids != sorted(ids, key=_row) and sorted(ids, key=_row) == [f"piqa-{i}" for i in range(24)]
    assert watched["order"] == {"piqa": False}
    assert watched["reread"] == ["piqa"]  # the order is not known: the rows give the positions
    data = embedded(run_dir / "report.html")
    assert [s["id"] for s in data["samples"]] == [f"piqa-{i}" for i in range(24)]
    assert [s["p"] for s in data["samples"]] == list(range(24))


def test_rows_skipped_or_failing_their_checks_leave_the_order_unknown(run_cli, tmp_path, watched):
    _run(run_cli, tmp_path, "s", "--shard", "0/2")
    assert watched["order"] == {"piqa": False} and watched["reread"] == ["piqa"]
    rows = [{"goal": f"Goal {i}.", "sol1": "One.", "sol2": "Two.", "label": i % 2} for i in range(6)]
    del rows[2]["goal"]  # row 2 is reported (an error stub), not a sample: its place is not the file's
    data_file = tmp_path / "piqa.jsonl"
    data_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    watched["order"].clear()
    watched["reread"].clear()
    run_dir = _run(run_cli, tmp_path, "b", "--data", f"piqa={data_file}", "--max-error-rate", "1")
    assert watched["order"] == {"piqa": False} and watched["reread"] == ["piqa"]
    data = embedded(run_dir / "report.html")
    assert len(data["samples"]) == 6 and data["data_order"] == {"0/piqa": True}


def test_a_rescore_does_not_claim_the_data_order(run_cli, tmp_path, watched):
    from click.testing import CliRunner

    from gage_eval.engine.rescore import rescore_command

    run_dir = _run(run_cli, tmp_path, "r")
    watched["order"].clear()
    result = CliRunner().invoke(rescore_command, [str(run_dir), "-o", str(tmp_path / "again"), "-q"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert watched["order"] == {"piqa": False}
    assert embedded(tmp_path / "again" / "report.html")["data_order"] == {"0/piqa": True}


def test_the_pages_json_escapes_what_could_end_its_script_element():
    from gage_plugins_builtin.report.page import _json_for_script

    assert _json_for_script({"a": "</script><!-- & \u2028\u2029"}) == \
        '{"a":"\\u003c/script\\u003e\\u003c!-- \\u0026 \\u2028\\u2029"}'
    assert _json_for_script({"a": "plain", "b": [1.5, None]}) == '{"a":"plain","b":[1.5,null]}'  # (nothing to escape)


def test_the_spool_gives_the_samples_back_in_the_pages_order(monkeypatch):
    """A task in the data's order comes back as written (copied in blocks, here of 7 bytes), an
    empty one adds nothing, another is sorted by the positions the rows read again gave (an error
    stub's id gives its own; an unknown one comes last, in the file's order, without a position)."""
    import tempfile

    from gage_plugins_builtin.report import spool as spool_module

    monkeypatch.setattr(spool_module, "_BLOCK", 7)
    with tempfile.TemporaryFile("w+b") as fh:
        spool = spool_module.Spool(fh)
        first = spool.task(0, "a", True)
        first.add(b'{"id":"a-0","p":0}')
        first.add('{"id":"a-1","t":"\u00e9\u2028","p":1}'.encode())
        spool.task(0, "empty", True)
        later = spool.task(0, "b", False)
        for sid in ("b-2", "b-x", "b-0", "b-row-1", "b-y"):
            later.add(b'{"id":"%s"}' % sid.encode(), sid)
        spool.task(1, "b", False).add(b'{"id":"b-9"}', "b-9")  # (another run: its rows were not read again)
        text = b"".join(spool.texts({(0, "b"): {"b-0": 0, "b-2": 2}}))
    assert spool.n == 8
    assert json.loads(b"[" + text + b"]") == [
        {"id": "a-0", "p": 0}, {"id": "a-1", "t": "\u00e9\u2028", "p": 1}, {"id": "b-0", "p": 0},
        {"id": "b-row-1", "p": 1}, {"id": "b-2", "p": 2}, {"id": "b-x"}, {"id": "b-y"}, {"id": "b-9"}]
