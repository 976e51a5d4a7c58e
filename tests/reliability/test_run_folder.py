"""The run folder: unwritable outputs, one writer at a time, and a resume that checks what it continues."""
from __future__ import annotations

import json
import resource
import shutil
import subprocess
import sys
import time

import pytest

from harness import GUARD, INTERRUPTED, OK, OUTPUT, ROOT, ROW_ERRORS, TASK_FAILED, USAGE, check

ROWS = 200


@pytest.fixture
def data(gage):
    path = gage.tmp / "data" / "rows.jsonl"
    path.parent.mkdir()
    path.write_text("".join(json.dumps({"goal": f"Question {i}?", "sol1": f"yes {i}", "sol2": "no", "label": i % 2})
                            + "\n" for i in range(ROWS)))
    return path


def piqa(data, *extra):
    return ("--tasks", "piqa", "--model", "dummy", "--data", f"piqa={data}", "-q", *extra)


def slow_run(gage, data, run_id="r") -> subprocess.Popen:
    """A run that takes a few seconds (8 ms a batch of 4), started in the background."""
    import os

    argv = [sys.executable, "-m", "gage_eval.cli", *piqa(data, "--model-args", "delay_ms=40", "--batch-size", "4"),
            "-o", str(gage.tmp / "runs"), "--run-id", run_id]
    env = {**os.environ, "PYTHONPATH": f"{GUARD}:{ROOT}", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=gage.tmp)
    samples = gage.tmp / "runs" / run_id / "samples" / "piqa.jsonl"
    deadline = time.time() + 60
    while not (samples.exists() and samples.stat().st_size) and time.time() < deadline:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    return proc


def ids(run_dir) -> list[str]:
    return [json.loads(line)["id"] for line in (run_dir / "samples" / "piqa.jsonl").read_text().splitlines()]


def test_output_dir_is_a_file(gage, data):
    (gage.tmp / "afile").write_text("x")
    check(gage(*piqa(data), out=gage.tmp / "afile"), OUTPUT, "is a file, not a folder")


def test_output_dir_under_a_file(gage, data):
    (gage.tmp / "afile").write_text("x")
    check(gage(*piqa(data), out=gage.tmp / "afile" / "runs"), OUTPUT, "is a file, not a folder")


def test_output_dir_cannot_be_created(gage, data):
    check(gage(*piqa(data), out="/proc/gage-eval-runs"), OUTPUT, "cannot create run folder")


def test_disk_full_mid_run_then_resume(gage, data):
    """RLIMIT_FSIZE makes a write past 8 KB fail as a full disk does (Python ignores SIGXFSZ)."""
    def small_disk():
        resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))

    o = gage(*piqa(data), preexec=small_disk)
    check(o, OUTPUT, "cannot write", "--resume")
    run_dir = gage.tmp / "runs" / "r"
    written = (run_dir / "samples" / "piqa.jsonl").read_bytes()
    assert 0 < written.count(b"\n") < ROWS
    resumed = gage("--resume", run_dir, "-q")
    check(resumed, OK)
    assert sorted(ids(run_dir)) == sorted(f"piqa-{i}" for i in range(ROWS))


def test_read_only_output_folder(gage, data):
    import os

    if os.geteuid() == 0:
        pytest.skip("root writes through a read-only mode; the /proc and file cases cover refusal")
    ro = gage.tmp / "ro"
    ro.mkdir(mode=0o555)
    check(gage(*piqa(data), out=ro), OUTPUT, "Permission denied")


def test_two_runs_on_one_folder(gage, data):
    first = slow_run(gage, data)
    try:
        second = gage(*piqa(data))
        check(second, USAGE, "in use by another gage-eval process")
        resume = gage("--resume", gage.tmp / "runs" / "r", "-q")
        check(resume, USAGE, "in use by another gage-eval process")
    finally:
        first.wait(timeout=120)
    assert first.returncode == OK, first.communicate()
    assert sorted(ids(gage.tmp / "runs" / "r")) == sorted(f"piqa-{i}" for i in range(ROWS))  # each id once


def test_new_run_on_a_used_folder(gage, data):
    check(gage(*piqa(data, "--limit", "3")), OK)
    check(gage(*piqa(data, "--limit", "3")), USAGE, "already exists", "--resume")


def test_resume_of_a_folder_that_is_no_run(gage):
    (gage.tmp / "nothing").mkdir()
    check(gage("--resume", gage.tmp / "nothing"), USAGE, "no config.json")


def _killed_run(gage, data):
    proc = slow_run(gage, data)
    proc.kill()
    proc.wait()
    return gage.tmp / "runs" / "r"


@pytest.mark.parametrize("flags, changed", [
    (("--limit", "5"), "limit"),
    (("--model", "smollm2"), "model"),
    (("--tasks", "piqa,mmmu"), "tasks"),
    (("--model-args", "seed=7"), "model_args"),
    (("--seed", "99"), "seed"),
], ids=["limit", "model", "tasks", "model-args", "seed"])
def test_resume_refuses_changed_settings(gage, data, flags, changed):
    run_dir = _killed_run(gage, data)
    o = gage("--resume", run_dir, *flags)
    check(o, USAGE, "differ from the stored run's", f"  {changed}:")


def test_resume_accepts_the_same_settings_again(gage, data):
    run_dir = _killed_run(gage, data)
    o = gage("--resume", run_dir, "--tasks", "piqa", "--model", "dummy", "--model-args", "delay_ms=40",
             "--batch-size", "4", "--data", f"piqa={data}", "-q")
    check(o, OK)
    assert sorted(ids(run_dir)) == sorted(f"piqa-{i}" for i in range(ROWS))


def test_resume_refuses_changed_data(gage, data):
    run_dir = _killed_run(gage, data)
    with data.open("a") as fh:
        fh.write(json.dumps({"goal": "new", "sol1": "a", "sol2": "b", "label": 0}) + "\n")
    check(gage("--resume", run_dir), USAGE, "inputs changed", f"data file {data}")


def test_data_changed_during_the_run_fails_the_task(gage, data):
    """The rows scored came from a file whose bytes differ from those inputs.json hashed at the
    start: the task fails saying so (a resume would refuse the same file)."""
    proc = slow_run(gage, data)
    data.write_text("".join(json.dumps({"goal": f"New {i}?", "sol1": "a", "sol2": "b", "label": 0}) + "\n"
                            for i in range(ROWS // 2)))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == TASK_FAILED and b"Traceback" not in err, err
    task = json.loads((gage.tmp / "runs" / "r" / "summary.json").read_text())["tasks"]["piqa"]
    assert task["status"] == "failed" and f"data file {data} changed during the run" in task["failure"]
    assert b"changed during the run" in out + err


def test_a_resume_killed_part_way_leaves_no_summary_saying_the_run_finished(gage, data):
    """The stored summary (exit 1, 100 rows errored) stops describing samples/ the moment a
    resume drops the errored rows to run them again: killed (-9) then, it says it is out of date
    (and the report of it is gone)."""
    import os

    check(gage(*piqa(data, "--model-args", "fail_every=2,delay_ms=40", "--batch-size", "4")), ROW_ERRORS)
    run_dir = gage.tmp / "runs" / "r"
    env = {**os.environ, "PYTHONPATH": f"{GUARD}:{ROOT}", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "gage_eval.cli", "--resume", str(run_dir), "-q"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while "task_resume" not in (run_dir / "events.jsonl").read_text() and time.time() < deadline:
        time.sleep(0.02)
    proc.kill()
    proc.wait()
    run = json.loads((run_dir / "summary.json").read_text())["run"]
    assert run["interrupted"] and "--resume" in run["interrupted"], run["interrupted"]
    assert not (run_dir / "report.html").exists()  # (the page of the summary before)
    check(gage("--resume", run_dir, "-q"), ROW_ERRORS)  # finished again: the summary is the run's
    assert json.loads((run_dir / "summary.json").read_text())["run"]["interrupted"] is None
    assert (run_dir / "report.html").is_file()


def test_resume_refuses_a_changed_task_folder(gage, data):
    tasks = gage.tmp / "tasks"
    shutil.copytree(ROOT / "tasks" / "piqa", tasks / "piqa")
    proc_args = piqa(data, "--include-path", tasks)
    check(gage(*proc_args, "--limit", "3"), OK)
    (tasks / "piqa" / "prompt.jinja").write_text("Q: {{ question }}\nA:")
    check(gage("--resume", gage.tmp / "runs" / "r"), USAGE, "task folder", "changed")


def test_resume_applies_a_zero_error_rate_and_refuses_seed_zero(gage, data):
    with data.open("a") as fh:
        fh.write("{not json\n")  # a row error a resume does not run again
    check(gage(*piqa(data, "--max-error-rate", "0.5")), OK)
    run_dir = gage.tmp / "runs" / "r"
    check(gage("--resume", run_dir, "--max-error-rate", "0", "-q"), 1)  # 1 of 201 rows errored: now too many
    check(gage("--resume", run_dir, "--seed", "0"), USAGE, "  seed: 1234 -> 0")


def test_resume_from_another_folder(gage, data, tmp_path):
    rel = data.relative_to(gage.tmp)
    check(gage("--tasks", "piqa", "--model", "dummy", "--data", f"piqa={rel}", "--limit", "5", "-q"), OK)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    o = gage("--resume", gage.tmp / "runs" / "r", "-q", cwd=elsewhere)
    check(o, OK)
    assert o.summary["tasks"]["piqa"]["counts"]["total"] == 5


@pytest.mark.parametrize("damage, message", [
    (lambda run: (run / "config.json").write_text("{"), "config.json is unreadable"),
    (lambda run: (run / "config.json").write_text('{"tasks": ["piqa"], "colour": 1}'), "unknown keys: colour"),
    (lambda run: (run / "samples" / "piqa.jsonl").open("a").write("[1, 2]\n"), "piqa.jsonl:6: not a record"),
], ids=["config-not-json", "config-unknown-key", "samples-bad-line"])
def test_resume_of_a_damaged_folder(gage, data, damage, message):
    check(gage(*piqa(data, "--limit", "5")), OK)
    run_dir = gage.tmp / "runs" / "r"
    damage(run_dir)
    o = gage("--resume", run_dir)
    assert o.rc == USAGE and message in o.text and "Traceback" not in o.text, o.text


def test_bad_model_args_never_echo_a_secret(gage, data):
    o = gage(*piqa(data, "--model-args", "base_url=http://u:CANARY-PW@h/v1,header_X-Auth=CANARY-HDR,oops"))
    check(o, USAGE, "'oops'")
    assert "CANARY" not in o.text


def test_interrupt_exits_130(gage, data):
    import signal

    proc = slow_run(gage, data)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == INTERRUPTED and b"Traceback" not in err and b"--resume" in err
    check(gage("--resume", gage.tmp / "runs" / "r", "-q"), OK)
