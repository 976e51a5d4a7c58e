"""--resume after kill -9 and after Ctrl-C: nothing is run twice, and the summary equals an uninterrupted run's."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROWS = 300


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "rows.jsonl"
    with path.open("w") as fh:
        for i in range(ROWS):
            row = {"goal": f"Question {i}?", "sol1": f"first answer {i}", "sol2": f"second answer {i * 7}",
                   "label": i % 2}
            if i == 17:
                fh.write('{"goal": "broken", \n')  # one bad row, which must stay counted once
            else:
                fh.write(json.dumps(row) + "\n")
    return path


def cmd(*args) -> list[str]:
    return [sys.executable, "-c", "from gage_eval.cli import main; main()", *map(str, args)]


def start(data: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen(cmd("--tasks", "piqa", "--model", "dummy", "--model-args", "delay_ms=8",
                                "--batch-size", 4, "--data", f"piqa={data}", "-o", out, "--run-id", "run", "-q"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_for_lines(path: Path, n: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if path.exists() and path.read_bytes().count(b"\n") >= n:
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError(f"{path} never reached {n} lines")


def comparable(summary: dict) -> dict:
    task = summary["tasks"]["piqa"]
    return {"metrics": task["metrics"], "counts": task["counts"], "slices": task["slices"],
            "errors_by_stage": task["errors_by_stage"]}


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("ref")
    subprocess.run(cmd("--tasks", "piqa", "--model", "dummy", "--data", f"piqa={data}", "-o", out,
                       "--run-id", "run", "-q"), capture_output=True)
    return json.loads((out / "run" / "summary.json").read_text())


def check_resumed(run_dir: Path, reference: dict) -> None:
    result = subprocess.run(cmd("--resume", run_dir, "-q"), capture_output=True, text=True)
    assert result.returncode == 1, result.stderr  # finished; row 17 is errored, as in the reference
    summary = json.loads((run_dir / "summary.json").read_text())
    assert comparable(summary) == comparable(reference)
    samples = [json.loads(l) for l in (run_dir / "samples" / "piqa.jsonl").read_text().splitlines()]
    ids = [s["id"] for s in samples]
    assert len(ids) == len(set(ids)) == ROWS  # no row run twice, none lost
    instances = (run_dir / "instances" / "piqa.jsonl").read_text().splitlines()
    assert sorted(json.loads(l)["sample_id"] for l in instances) == sorted(ids)


def test_resume_after_kill_9(data, tmp_path, reference):
    proc = start(data, tmp_path)
    samples = tmp_path / "run" / "samples" / "piqa.jsonl"
    wait_for_lines(samples, 40, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    # a kill can land mid-line; make sure there is a half-written last line to recover from
    with samples.open("ab") as fh:
        fh.write(b'{"schema_version":"v1","id":"half')
    done_before = samples.read_bytes().count(b"\n")
    assert 40 <= done_before < ROWS
    check_resumed(tmp_path / "run", reference)


def test_resume_after_ctrl_c(data, tmp_path, reference):
    proc = start(data, tmp_path)
    wait_for_lines(tmp_path / "run" / "samples" / "piqa.jsonl", 40, proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert b"--resume" in err and b"Traceback" not in err
    partial = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert partial["run"]["interrupted"]
    check_resumed(tmp_path / "run", reference)


def test_data_at_another_path_with_the_same_content_is_no_change():
    # a data package's files found under another venv (a rebuilt .venv, another machine) were
    # refused as 'data file OLD is gone; data file NEW is new' though every byte is the same
    from gage_eval.runfolder.rundir import changed_inputs

    folder = {"path": "/a/tasks/piqa", "sha256": "f0"}
    before = {"piqa": {"task_folder": folder, "data": {"/old/venv/piqa.arrow": "d1", "/old/x.arrow": "d2"}}}
    moved = {"piqa": {"task_folder": folder, "data": {"/new/venv/piqa.arrow": "d1", "/old/x.arrow": "d2"}}}
    assert changed_inputs(before, moved) == []
    edited = {"piqa": {"task_folder": folder, "data": {"/new/venv/piqa.arrow": "d9", "/old/x.arrow": "d2"}}}
    assert changed_inputs(before, edited) == ["data file /old/venv/piqa.arrow (piqa) is gone",
                                              "data file /new/venv/piqa.arrow (piqa) is new"]


def test_a_stored_record_edited_by_hand_is_named_by_file_line_and_key(data, tmp_path):
    run_dir = tmp_path / "run"
    first = subprocess.run(cmd("--tasks", "piqa", "--model", "dummy", "--data", f"piqa={data}", "--limit", 5,
                               "-o", tmp_path, "--run-id", "run", "-q"), capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    samples = run_dir / "samples" / "piqa.jsonl"
    lines = samples.read_text().splitlines()
    record = json.loads(lines[1])
    record["eval_result"]["metrics"]["acc"] = "high"
    samples.write_text("\n".join([lines[0], json.dumps(record), *lines[2:]]) + "\n")
    resumed = subprocess.run(cmd("--resume", run_dir, "-q"), capture_output=True, text=True)
    assert resumed.returncode == 2, resumed.stderr
    assert resumed.stderr.splitlines()[-1] == (f"gage-eval: error: {samples}:2: key 'eval_result.metrics.acc': "
                                              f"expected a number, an object or null, got a string")
    assert len(samples.read_text().splitlines()) == 5  # the stored records are left as they were


def test_a_model_that_fails_to_load_on_resume_stops_the_run_not_each_task(fresh_plugins, run_cli, tmp_path):
    """A resume loads the model when a row first needs it: a failure then is the run's (one line, its
    exit status, the rows kept), not each task's 'failed' (an OSError read 'reading the data: ...')."""
    from gage_eval.api import hookimpl
    from gage_plugins_builtin.backends.dummy import DummyBackend

    broken = tmp_path / "weights-gone"

    class Flaky(DummyBackend):
        def open(self):
            if broken.exists():
                raise OSError(5, "Input/output error", str(broken))
            super().open()

    class Plugin:
        @hookimpl
        def gage_register_backends(self, register):
            register("flaky", Flaky)

    fresh_plugins.register_plugin(Plugin(), "flaky")
    result = run_cli("--tasks", "piqa,arc_easy", "--model", "flaky", "--limit", "4", "-o", tmp_path, "--run-id", "r", "-q")
    assert result.exit_code == 0, result.output
    samples = tmp_path / "r" / "samples" / "piqa.jsonl"
    samples.write_text("".join(samples.read_text().splitlines(keepends=True)[:2]))  # two rows left to run
    broken.touch()
    resumed = run_cli("--resume", tmp_path / "r", "-q")
    assert resumed.exit_code != 0 and "Input/output error" in resumed.output, resumed.output
    assert "reading the data" not in resumed.output
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert "Input/output error" in summary["run"]["interrupted"]
    assert len(samples.read_text().splitlines()) == 2  # the rows written before are kept
