"""The smaller ones of issue 23, through the real CLI: Ctrl-C at any moment (the import of the
command line included), the circuit breaker's minimum span, model discovery's exit status (with
and without --debug), a FIFO as data, task folders and --data files checked before any model
loads, an empty data file named, and ``validate`` naming the field as a run does."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import OK, ROOT, ROW_ERRORS, TASK_FAILED, USAGE, Outcome, check

sys.path.insert(0, str(ROOT / "tests" / "backends"))
from openai_fake_server import FakeServer  # noqa: E402

GOOD = {"goal": "Keep bread fresh.", "sol1": "Seal it in a bag.", "sol2": "Leave it in the sun.", "label": 0}
HTTP_TASKS = ROOT / "tests" / "backends" / "openai_fault_tasks"
TASK = """\
name: mytask
dataset: {loader: jsonl, args: {path: rows.jsonl}}
preprocessor: {name: legacy, args: {question: goal, choices: [sol1, sol2], answer: label}}
request: {kind: loglikelihood, prompt: prompt.jinja}
metrics: [acc]
"""
BROKEN_TASK = TASK.replace("prompt.jinja}", "prompt.jinja")  # a YAML syntax error


def piqa_rows(path: Path, n: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({**GOOD, "goal": f"Question {i}?", "label": i % 2}) + "\n"
                            for i in range(n)))
    return path


def loaded_a_model(o: Outcome) -> bool:
    return "loading model" in o.err


# -- Ctrl-C at 0.1, 0.2, ... 1.0 s from the start of the process ----------------------------------

ENTRIES = {  # the two ways in: python -m, and what the console script runs
    "module": ["-m", "gage_eval.cli"],
    "console-script": ["-c", "import sys; from gage_eval.cli import main; sys.exit(main())"],
}


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_ctrl_c_at_any_moment_exits_130_without_a_traceback(gage, entry):
    data = piqa_rows(gage.tmp / "data" / "rows.jsonl", 150)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    seen = set()
    for tenth in range(1, 11):
        run_id = f"r{tenth}"
        args = ["--tasks", "piqa", "--model", "dummy", "--model-args", "delay_ms=10", "--batch-size", "1",
                "--data", f"piqa={data}", "-o", str(gage.tmp / "runs"), "--run-id", run_id]
        proc = subprocess.Popen([sys.executable, *ENTRIES[entry], *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=gage.tmp, env=env,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        time.sleep(tenth / 10)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        seen.add(proc.returncode)
        o = Outcome(args, proc.returncode, out, err, gage.tmp / "runs" / run_id)
        assert proc.returncode in (OK, 130), f"at {tenth / 10} s: exit {proc.returncode}\n{err}"
        # no traceback, and a summary (when one was written) that says the same exit status and
        # accounts for every record written
        check(o, proc.returncode)
        assert "Exception ignored" not in err, err
        if proc.returncode == 130:
            assert err.strip().splitlines()[-1].startswith("gage-eval:"), err  # one line says so
    assert 130 in seen  # the run outlasts the first tenths: they did interrupt it


# -- the circuit breaker waits at least breaker_seconds ------------------------------------------

def test_breaker_rides_out_60_percent_transient_faults(gage):
    """Most attempts fail (a connection reset), some rows never succeed (they give up after their
    retries), and failures come many in a row; with breaker_seconds far above what the run takes,
    the breaker never trips: every row ends answered or with its own retries' error."""
    import random

    rng = random.Random(23)
    data = gage.tmp / "http.jsonl"
    with data.open("w") as fh:
        for i in range(100):
            faults = ["reset"] * 9 if i % 20 == 7 else []  # 5 rows that fail every attempt
            while i % 20 != 7 and len(faults) < 4 and rng.random() < 0.6:  # the others: 60% of attempts
                faults.append("reset")
            text = (f"[[faults:{','.join(faults)}]]\n" if faults else "") + f"word{i}"
            fh.write(json.dumps({"schema_version": "v1", "id": f"row-{i:02d}", "references": [f"word{i}"],
                                 "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}]}) + "\n")
    with FakeServer() as server:
        args = (f"base_url={server.url},model=fake-model,backoff=0.01,backoff_max=0.05,max_retries=5,"
                f"breaker_seconds=60,timeout=10,read_timeout=10")
        o = gage("--tasks", "http_rows", "--include-path", HTTP_TASKS, "--data", f"http_rows={data}",
                 "--model", "openai", "--model-args", args, "--max-error-rate", "0.1")
        log = list(server.log)
    check(o, OK)
    records = o.records("http_rows")
    assert len(records) == 100
    errors = {r["id"]: r["eval_result"]["error"]["message"] for r in records if r["eval_result"].get("error")}
    assert sorted(errors) == [f"row-{i:02d}" for i in range(7, 100, 20)], errors
    assert all("gave up after 6 attempt(s)" in m and "failed attempts in a row" not in m for m in errors.values())
    # the streak the breaker counts did reach max_consecutive_failures (5), many times over
    longest = run = 0
    for entry in log:
        run = run + 1 if entry["fault"] else 0
        longest = max(longest, run)
    assert longest >= 5 and len(log) > 150, (longest, len(log))


# -- model discovery: a dead server stops the run as its backend (3), --debug alike ----------------

def test_model_discovery_against_a_dead_server_exits_3_with_and_without_debug(gage):
    with FakeServer() as server:
        url = server.url  # closed again: nothing listens there now
    data = gage.tmp / "http.jsonl"
    data.write_text((HTTP_TASKS / "http_rows" / "sample.jsonl").read_text())
    base = ["--tasks", "http_rows", "--include-path", HTTP_TASKS, "--model", "openai",
            "--model-args", f"base_url={url}"]
    o = gage(*base, run_id="plain")
    check(o, TASK_FAILED, f"cannot reach {url}/models to find the model")
    assert sum(1 for line in o.err.splitlines() if line.startswith("gage-eval: error:")) == 1
    debug = gage(*base, "--debug", run_id="debug")
    assert debug.rc == TASK_FAILED, debug.err  # the same status; --debug only adds the traceback
    assert "Traceback" in debug.err and f"cannot reach {url}/models" in debug.err.splitlines()[-1]


def test_debug_changes_no_exit_status(gage):
    plain, debug = gage("--tasks", "no_such_task"), gage("--tasks", "no_such_task", "--debug", run_id="d")
    check(plain, USAGE, "unknown task(s): no_such_task")
    assert debug.rc == USAGE and "unknown task(s): no_such_task" in debug.err.splitlines()[-1]


# -- a FIFO as data -------------------------------------------------------------------------------

def test_fifo_as_data_is_not_a_regular_file(gage):
    fifo = gage.tmp / "rows.jsonl"
    os.mkfifo(fifo)
    o = gage("--tasks", "piqa", "--model", "dummy", "--data", f"piqa={fifo}", timeout=60)
    check(o, TASK_FAILED, f"{fifo}: not a regular file (a FIFO)")
    assert "unsupported file type" not in o.text
    v = gage("validate", fifo, "--schema", "sample", timeout=60)
    check(v, USAGE, f"{fifo}: not a regular file (a FIFO)")


def test_fifo_in_a_task_folder_fails_the_task_without_waiting(gage):
    folder = gage.tmp / "tasks" / "mytask"
    folder.mkdir(parents=True)
    (folder / "task.yaml").write_text(TASK)
    (folder / "prompt.jinja").write_text("Question: {{ question }}\nAnswer:")
    os.mkfifo(folder / "rows.jsonl")
    o = gage("--tasks", "mytask", "--model", "dummy", "--include-path", gage.tmp / "tasks", timeout=60)
    check(o, TASK_FAILED, f"{folder / 'rows.jsonl'}: not a regular file (a FIFO)")


# -- task folders and --data files are checked before any model loads -----------------------------

def test_missing_data_file_fails_before_the_default_model_loads(gage):
    o = gage("--tasks", "piqa", "--data", f"piqa={gage.tmp / 'nope.jsonl'}")  # the default model: smollm2
    check(o, USAGE, f"{gage.tmp / 'nope.jsonl'} does not exist")
    assert not loaded_a_model(o), o.err
    assert not o.run_dir.exists()


def test_broken_task_folder_fails_before_the_default_model_loads(gage):
    folder = gage.tmp / "tasks" / "mytask"
    folder.mkdir(parents=True)
    (folder / "task.yaml").write_text(BROKEN_TASK)
    o = gage("--tasks", "mytask", "--include-path", gage.tmp / "tasks")
    check(o, TASK_FAILED, str(folder / "task.yaml"))
    assert not loaded_a_model(o), o.err


def test_broken_task_is_said_before_the_model_loads_and_the_others_run(gage):
    folder = gage.tmp / "tasks" / "mytask"
    folder.mkdir(parents=True)
    (folder / "task.yaml").write_text(BROKEN_TASK)
    data = piqa_rows(gage.tmp / "data" / "rows.jsonl", 4)
    o = gage("--tasks", "mytask,piqa", "--include-path", gage.tmp / "tasks", "--model", "dummy",
             "--data", f"piqa={data}")
    check(o, TASK_FAILED, "task mytask cannot run")
    assert o.err.index("task mytask cannot run") < o.err.index("loading model"), o.err
    assert o.summary["tasks"]["piqa"]["counts"]["scored"] == 4  # the other task ran whole


# -- an empty data file is named ------------------------------------------------------------------

def test_empty_data_file_is_named_and_no_model_loads(gage):
    empty = gage.tmp / "empty.jsonl"
    empty.write_text("")
    o = gage("--tasks", "piqa", "--data", f"piqa={empty}")  # the default model
    check(o, TASK_FAILED, f"no rows: {empty} is empty")
    assert not loaded_a_model(o), o.err
    blank = gage.tmp / "blank.jsonl"
    blank.write_text("\n  \n")
    o = gage("--tasks", "piqa", "--model", "dummy", "--data", f"piqa={blank}", run_id="blank")
    check(o, TASK_FAILED, f"no rows: {blank} gave no row to run")


# -- validate names the file, line and field as a run does -----------------------------------------

LINES = [  # (a row, the field named)
    (json.dumps(GOOD).encode(), None),
    ('{"goal": "caf\xe9", "sol1": "a", "sol2": "b", "label": 0}'.encode("latin-1"), "goal"),
    (b'{"goal": "q", "sol1": "a", "sol2": "b", "label": NaN}', "label"),
    (b'{"goal": "q", "sol1": ' + b"[" * 300 + b"]" * 300 + b', "sol2": "b", "label": 0}', "sol1[0][0][0]..."),
    (b'{"goal": "q", "sol1": "a", "sol2": "b", "label": 1e999}', "label"),
]


def test_validate_names_the_field_as_the_run_does(gage):
    data = gage.tmp / "rows.jsonl"
    data.write_bytes(b"".join(line + b"\n" for line, _ in LINES))
    o = gage("--tasks", "piqa", "--model", "dummy", "--data", f"piqa={data}")
    check(o, ROW_ERRORS)
    errors = o.errors("piqa")
    assert sorted(errors) == [f"{data}:{n}" for n in range(2, len(LINES) + 1)]
    v = gage("validate", data, "--schema", "sample")
    assert "Traceback" not in v.text and v.rc == 1
    for n, (_, field) in enumerate(LINES, 1):
        if field is None:
            continue
        message = errors[f"{data}:{n}"]["message"]
        assert message.startswith(f"{field}: "), message  # the run's record names the field
        problem = message[len(field) + 2:]
        assert f"{data}:{n}: load error: {message}" in o.err
        assert f"{data}:{n}: $.{field}: {problem}" in v.out  # validate: the same file, line, field, words
