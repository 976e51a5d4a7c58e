"""A run folder copied or unpacked from elsewhere: a --resume appends to, cuts and replaces its
files, so a symlink in it that leads out of it (to a ~/.bashrc) is refused before anything is
written, and so is a FIFO where a file belongs (opening one would wait forever). A run folder
removed while its run writes is named as gone, not as resumable; a task name cannot lead out of
samples/; a failed write names the run folder to resume even for a task named pkg/name."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from harness import GUARD, OK, OUTPUT, ROOT, TASK_FAILED, USAGE, check

VICTIM = b"export PATH=/usr/bin\nno newline at the end"


def _data(gage, rows: int):
    data = gage.tmp / "data" / "rows.jsonl"
    data.parent.mkdir(exist_ok=True)
    data.write_text("".join(json.dumps({"goal": f"Q{i}?", "sol1": "a", "sol2": "b", "label": i % 2}) + "\n"
                            for i in range(rows)))
    return ("--tasks", "piqa", "--model", "dummy", "--data", f"piqa={data}", "-q")


@pytest.fixture
def stopped(gage):
    """A finished 4-row run with its summary removed (as a run stopped before its end leaves it)."""
    check(gage(*_data(gage, 4)), OK)
    run_dir = gage.tmp / "runs" / "r"
    (run_dir / "summary.json").unlink()
    return run_dir


@pytest.mark.parametrize("name", [".lock", "events.jsonl", "samples/piqa.jsonl", "instances/piqa.jsonl",
                                  "summary.json.tmp", "samples"])
def test_a_symlink_out_of_the_run_folder_is_refused_and_its_target_untouched(gage, stopped, name):
    link, victim = stopped / name, gage.tmp / "victim"
    if name == "samples":  # the folder itself leads elsewhere
        shutil.move(link, victim)
        target, before = victim / "piqa.jsonl", (victim / "piqa.jsonl").read_bytes()
    else:
        link.unlink(missing_ok=True)
        victim.write_bytes(VICTIM)
        target, before = victim, VICTIM
    link.symlink_to(victim)
    check(gage("--resume", stopped, "-q"), USAGE, f"{link}: a symlink to {victim}, outside the run folder")
    assert target.read_bytes() == before
    link.unlink()
    if name == "samples":
        shutil.move(victim, link)
    resumed = gage("--resume", stopped, "-q")  # once it is gone the resume goes on
    check(resumed, OK)
    assert len(resumed.records("piqa")) == 4


def test_a_symlink_inside_the_run_folder_is_followed(gage, stopped):
    (stopped / "events.jsonl").rename(stopped / "events.real")
    (stopped / "events.jsonl").symlink_to("events.real")
    check(gage("--resume", stopped, "-q"), OK)
    assert b"run_end" in (stopped / "events.real").read_bytes()


@pytest.mark.parametrize("name", [".lock", "events.jsonl", "samples/piqa.jsonl"])
def test_a_fifo_in_the_run_folder_is_refused_not_waited_on(gage, stopped, name):
    (stopped / name).unlink()
    os.mkfifo(stopped / name)
    check(gage("--resume", stopped, "-q", timeout=30), USAGE, f"{stopped / name}: a FIFO, not a regular file")


def test_report_of_a_run_folder_whose_lock_is_a_fifo(gage, stopped):
    check(gage("--resume", stopped, "-q"), OK)
    (stopped / ".lock").unlink()
    os.mkfifo(stopped / ".lock")
    check(gage("report", stopped, timeout=30), OK, "report.html")


@pytest.mark.parametrize("removed, how", [("", "run again"), ("samples", "--resume")])
def test_a_run_folder_removed_mid_run_is_named_as_gone(gage, removed, how):
    """The lines written after an rm -r went to a file no one can read: exit 4 (it was 0 with
    samples/ gone), and a resume offered only while the run folder still has its config.json."""
    argv = [sys.executable, "-m", "gage_eval.cli", *_data(gage, 120), "--model-args", "delay_ms=40",
            "--batch-size", "4", "-o", str(gage.tmp / "runs"), "--run-id", "r"]
    env = {**os.environ, "PYTHONPATH": f"{GUARD}:{ROOT}", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=gage.tmp)
    samples = gage.tmp / "runs" / "r" / "samples" / "piqa.jsonl"
    deadline = time.time() + 60
    while not (samples.exists() and samples.stat().st_size) and time.time() < deadline:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    shutil.rmtree(gage.tmp / "runs" / "r" / removed)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == OUTPUT and "Traceback" not in err, err
    assert "was removed while the run wrote it" in err and how in err, err
    assert removed or not (gage.tmp / "runs" / "r").exists()  # (the report made it again, holding report.html)
    if removed:  # the rows whose records went with samples/ run again
        resumed = gage("--resume", gage.tmp / "runs" / "r", "-q")
        check(resumed, OK)
        assert len(resumed.records("piqa")) == 120


@pytest.mark.parametrize("name", ["../escaped", "/tmp/gage-eval-abs/escaped", "a//b", "a/./b", "a/"])
def test_a_task_name_that_would_lead_out_of_samples_fails_its_task(gage, name):
    """samples/<task>.jsonl: a task folder naming its task '../x' wrote beside samples/ (and
    instances/ into the same file), '/abs/x' anywhere on the disk."""
    folder = gage.tmp / "tasks" / "t"
    shutil.copytree(ROOT / "tasks" / "piqa", folder)
    text = (folder / "task.yaml").read_text()
    (folder / "task.yaml").write_text(text.replace("name: piqa\n", f"name: {json.dumps(name)}\n", 1))
    assert name in (folder / "task.yaml").read_text()
    args = _data(gage, 3)
    o = gage("--include-path", folder, "--tasks", name, *args[2:4], "--data", f"{name}={args[5].split('=', 1)[1]}", "-q")
    check(o, TASK_FAILED, "key 'name'", "no '.' or '..' part")
    assert sorted(p.name for p in o.run_dir.iterdir()) == [".lock", "config.json", "events.jsonl", "inputs.json",
                                                           "report.html", "summary.json"]
    assert not (gage.tmp / "escaped.jsonl").exists() and not os.path.exists("/tmp/gage-eval-abs")


def test_a_folder_that_is_no_run_is_not_walked(gage):
    """Only the run folder's own entries and samples/, instances/ are looked at: a new run pointed
    at some other folder is told it exists, its tree (and the links in it) left alone."""
    other = gage.tmp / "runs" / "r" / "photos" / "2026"
    other.mkdir(parents=True)
    (other / "link").symlink_to("/etc")
    check(gage(*_data(gage, 3)), USAGE, "already exists")


def test_a_full_disk_names_the_run_folder_of_a_task_named_with_a_slash(gage):
    """samples/pkg/name.jsonl: the line said 'gage-eval --resume RUN/samples/pkg'."""
    import resource

    folder = gage.tmp / "tasks" / "t"
    shutil.copytree(ROOT / "tasks" / "piqa", folder)
    (folder / "task.yaml").write_text((folder / "task.yaml").read_text().replace("name: piqa\n", "name: pkg/name\n", 1))
    data = _data(gage, 200)[5].split("=", 1)[1]
    run = ("--include-path", folder, "--tasks", "pkg/name", "--model", "dummy", "--data", f"pkg/name={data}", "-q")
    o = gage(*run, preexec=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192)))
    check(o, OUTPUT, f"samples/pkg/name.jsonl: File too large")
    assert o.text.rstrip().endswith(f"gage-eval --resume {o.run_dir}"), o.text
    resumed = gage("--resume", o.run_dir, "-q")
    check(resumed, OK)
    assert len(resumed.records("pkg/name")) == 200


def test_a_record_written_twice_is_refused_on_resume(gage, stopped):
    """A samples line copied by hand: the resume counted 5 rows of a 4-row task (and scored one
    twice); it names the id, the file untouched, and goes on once one line is removed."""
    samples = stopped / "samples" / "piqa.jsonl"
    lines = samples.read_bytes().splitlines(keepends=True)
    samples.write_bytes(b"".join(lines + lines[:1]))
    o = gage("--resume", stopped, "-q")  # (its summary says the run stopped there: not check()'s counts)
    assert o.rc == USAGE and "Traceback" not in o.text, o.text
    assert f"error: {samples}: sample id 'piqa-0' is there twice" in o.text, o.text
    assert samples.read_bytes() == b"".join(lines + lines[:1])
    assert o.summary["run"]["interrupted"].endswith("remove one of its lines")
    samples.write_bytes(b"".join(lines))
    (stopped / "summary.json").unlink(missing_ok=True)
    resumed = gage("--resume", stopped, "-q")
    check(resumed, OK)
    assert resumed.summary["tasks"]["piqa"]["counts"]["total"] == 4
