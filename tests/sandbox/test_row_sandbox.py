"""A row's Sample v1 ``sandbox`` section that no sandbox could prepare (two names of one file, a file
that is another's folder, a name longer than a file system takes, a NUL in a file, ``env`` or
``setup``, an ``env`` name that is empty or holds ``=``; a lone surrogate, which the JSONL loader
refuses already, from a preprocessor) is the row's recorded error at the row checks, named by the
data file's line and the field, before the model runs; the good row beside them is scored. Through
the CLI with the code_exec metric: before, each was a metric error raised out of the sandbox
(naming a host temp folder), or a test failure scored 0 (``bwrap: setenv failed``)."""
from __future__ import annotations

import json

import pytest

from tests.sandbox.local_sandbox import needs_local_sandbox

pytestmark = needs_local_sandbox

ANSWER = "def add(a, b):\n    return a + b\n"
BAD = {  # id -> (the row's sandbox section, the field, what the line says)
    "folder": ({"files": {"a": "x", "a/b": "y"}}, "sandbox.files", "'a' is a file and also the folder"),
    "twice": ({"files": {"ok.txt": "x", "./ok.txt": "y"}}, "sandbox.files", "'./ok.txt' names the same file as"),
    "long": ({"files": {"x" * 300: "y"}}, "sandbox.files", "is longer than a file system takes"),
    "env_nul": ({"env": {"K": "a\0b"}}, "sandbox.env", "K: its value holds a NUL character"),
    "env_eq": ({"env": {"K=1": "a"}}, "sandbox.env", "'K=1' is no environment variable name"),
    "env_empty": ({"env": {"": "a"}}, "sandbox.env", "'' is no environment variable name"),
    "setup": ({"setup": "true\0"}, "sandbox.setup", "the script holds a NUL character"),
}


def code_row(rid: str, box: dict) -> dict:
    return {"schema_version": "v1", "id": rid, "task_type": "code-generation",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Write add(a, b)."}]}],
            "sandbox": box, "references": [{"answer": [{"type": "text", "text": ANSWER}]}],
            "metadata": {"execution": {"type": "code_exec", "entry_point": "add",
                                       "test_cases": [{"input": "1, 2", "output": "3"}]}}}


@pytest.fixture(scope="module")
def outcome(tmp_path_factory):
    from click.testing import CliRunner

    from gage_eval.cli import cli

    tmp = tmp_path_factory.mktemp("row_sandbox")
    rows = [code_row(rid, box) for rid, (box, _, _) in BAD.items()]
    rows.append(code_row("good", {"files": {"data/n.txt": "3"}, "env": {"WHO": "me"}, "setup": "true"}))
    return run_rows(lambda *args: CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False),
                    tmp, rows)  # (run_cli, once for the module)


def run_rows(invoke, tmp, rows: list[dict]):
    """``rows`` through the code_exec task, the dummy backend answering ANSWER to each: the CLI's
    result and each record by its row's id (an invalid row's: its metadata.row_id)."""
    (tmp / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp / "script.json").write_text(json.dumps({r["id"]: [{"text": ANSWER}] for r in rows}))
    result = invoke("--tasks", "code_exec", "--data", f"code_exec={tmp / 'rows.jsonl'}", "--model", "dummy",
                    "--model-args", f"response=script,script={tmp / 'script.json'}", "-o", tmp, "--run-id", "r",
                    "--no-report")
    records = [json.loads(line) for line in (tmp / "r" / "samples" / "code_exec.jsonl").read_text().splitlines()]
    return result, {r.get("metadata", {}).get("row_id") or r["id"]: r for r in records}


def test_the_good_row_is_scored_and_the_run_says_rows_errored(outcome):
    result, records = outcome
    assert result.exit_code == 1, result.output  # some rows errored, as for any bad row
    assert records["good"]["eval_result"]["metrics"]["code_exec"]["value"] == 1.0
    assert len(records) == len(BAD) + 1  # no row dropped


@pytest.mark.parametrize("rid", list(BAD))
def test_a_sandbox_no_sandbox_could_prepare_is_the_rows_error_with_its_line_and_field(outcome, rid):
    result, records = outcome
    _, field, said = BAD[rid]
    line = list(BAD).index(rid) + 1
    record = records[rid]
    assert not record.get("predict_result"), record  # the model never saw it
    error = record["eval_result"]["error"]
    assert error["stage"] == "validate" and error["locator"].endswith(f"rows.jsonl:{line}"), error
    assert error["message"].startswith(f"{field}: ") and said in error["message"], error
    shown = [t for t in result.output.splitlines() if f"rows.jsonl:{line}: validate error: {field}: " in t]
    assert len(shown) == 1 and said in shown[0] and "gage-sandbox-" not in shown[0], result.output


def test_a_lone_surrogate_from_a_preprocessor_is_named_too():
    """(The JSONL loader refuses one as the row's load error; a preprocessor may build one.)"""
    from gage_eval.api.execution import sandbox_problems

    assert sandbox_problems({"files": {"a.txt": "\ud800", "\udc80": "x"}, "env": {"K": "\ud800"}}) == [
        ("$.sandbox.files", "'a.txt': its text holds a lone surrogate (not UTF-8 text)"),
        ("$.sandbox.files", "'\\udc80' holds a lone surrogate (not UTF-8 text)"),
        ("$.sandbox.env", "K: its value holds a lone surrogate (not UTF-8 text)")]


def test_a_row_the_sandbox_cannot_prepare_is_the_rows_error_not_a_zero(run_cli, tmp_path):
    """An image the local sandbox does not run, a setup that fails: no answer was tested, so the row
    is recorded as its metric error with its line (it was scored 0, each test 'error'); the run goes on."""
    rows = [code_row("image", {"image": "python:3.10"}), code_row("setup", {"setup": "echo no >&2; exit 3"}),
            code_row("good", {"setup": "true"})]
    result, records = run_rows(run_cli, tmp_path, rows)
    assert result.exit_code == 1, result.output
    assert records["good"]["eval_result"]["metrics"]["code_exec"]["value"] == 1.0
    for line, rid, said in [(1, "image", "the local sandbox runs no container image (the row's sandbox.image is "
                                         "'python:3.10')"), (2, "setup", "sandbox.setup failed (exit 3): no")]:
        error = records[rid]["eval_result"]["error"]
        assert "metrics" not in records[rid]["eval_result"] and error["stage"] == "metric", records[rid]
        assert error["locator"].endswith(f"rows.jsonl:{line}") and said in error["message"], error
        assert f"rows.jsonl:{line}: metric error: code_exec: sandbox local: " in result.output, result.output


def test_a_row_file_in_the_way_of_the_metrics_own_is_the_rows_error_naming_no_host_folder():
    """code_exec adds harness.py and program.py to the row's files; a row file under one
    of those names as a folder cannot be written: the sandbox says so (it used to raise
    IsADirectoryError naming its /tmp staging folder)."""
    from gage_eval.api import execution
    from gage_eval.plugins import load_plugins

    load_plugins()
    box = execution.open_sandbox("local")
    done = box.run(execution.Job(command=(execution.Job.PYTHON, "-c", "print(1)"),
                                 files={"harness.py/x": "y", "harness.py": "print(2)"}))
    assert done.status == execution.Status.ERROR, done
    assert done.reason == "sandbox.files: 'harness.py' cannot be written in the working folder (Is a directory)"


def test_a_rows_own_path_does_not_break_the_sandboxs_own_copy_and_setup():
    """sandbox.env may set PATH for the row's setup and command; the sandbox copies the files in and
    reports a failed setup with the system's tools all the same (a PATH without cp was exit 125,
    scored as the program's failure)."""
    from gage_eval.api import execution
    from gage_eval.plugins import load_plugins

    load_plugins()
    box = execution.open_sandbox("local")
    program = "import os; print(open('a.txt').read(), open('s.txt').read(), os.environ['PATH'])"
    job = execution.Job(command=(execution.Job.PYTHON, "-c", program),
                        files={"a.txt": "x"}, setup="echo made > s.txt", env={"PATH": "/nowhere"})
    done = box.run(job)
    assert (done.status, done.exit_code, done.stdout) == ("exited", 0, "x made\n /nowhere\n"), done
    failed = box.run(execution.Job(command=job.command, setup="echo why >&2; exit 4", env={"PATH": "/nowhere"}))
    assert failed.status == execution.Status.ERROR and failed.reason == "sandbox.setup failed (exit 4): why", failed


def test_row_files_over_the_working_folders_size_are_the_rows_error_not_the_programs():
    """20,000 small files (or one big one) do not fit the working folder: the copy failed with exit 125,
    which code_exec scored 0 as the program's failure; it is the sandbox's ERROR, saying why."""
    from gage_eval.api import execution
    from gage_eval.plugins import load_plugins

    load_plugins()
    box = execution.open_sandbox("local")
    job = execution.Job(command=(execution.Job.PYTHON, "-c", "print(1)"), files={"big.txt": "x" * (3 << 20)},
                        limits=execution.Limits(disk_mb=2))
    done = box.run(job)
    assert done.status == execution.Status.ERROR, done
    assert done.reason.startswith("the job's files could not be copied into its working folder /work: ")
    assert done.reason.endswith(" (limits.disk_mb: 2)") and "\n" not in done.reason  # (a file over it, or the disk)
    many = box.run(execution.Job(command=job.command, files={f"f{i}.txt": "x" for i in range(2000)},
                                 limits=execution.Limits(disk_mb=2)))  # (a page each: 8 MB)
    assert many.status == execution.Status.ERROR and "No space left on device (limits.disk_mb: 2)" in many.reason
    fits = box.run(execution.Job(command=job.command, files={"small.txt": "x"}, limits=execution.Limits(disk_mb=2)))
    assert (fits.status, fits.stdout) == ("exited", "1\n"), fits


def test_a_row_file_named_as_one_of_the_metrics_own_is_the_rows_error_not_replaced(run_cli, tmp_path):
    """code_exec writes harness.py and program.py into the working folder; a row's
    sandbox.files under one of those names (or inside one, or as ./NAME) was silently replaced by the
    metric's (a row's own harness.py never ran, and the row was scored). It is the row's metric error
    naming the file, one line; the row beside it is scored."""
    clashes = {"harness": {"harness.py": "print('mine')"}, "program": {"./program.py": "x = 1"},
               "inside": {"data.txt": "1", "harness.py/x": "y"}}
    rows = [code_row(rid, {"files": files}) for rid, files in clashes.items()]
    rows.append(code_row("good", {"files": {"harness.txt": "fine", "lib/program.py": "y = 2", "job.json": "{}"}}))
    result, records = run_rows(run_cli, tmp_path, rows)
    assert result.exit_code == 1, result.output
    assert records["good"]["eval_result"]["metrics"]["code_exec"]["value"] == 1.0
    for line, (rid, name) in enumerate([("harness", "harness.py"), ("program", "./program.py"),
                                        ("inside", "harness.py/x")], 1):
        error = records[rid]["eval_result"]["error"]
        assert "metrics" not in records[rid]["eval_result"] and error["stage"] == "metric", records[rid]
        said = (f"code_exec: sandbox.files: {name!r} is in the way of a file code_exec writes in the working "
                f"folder (harness.py, program.py): rename it")
        assert error["message"] == said and error["locator"].endswith(f"rows.jsonl:{line}"), error
        assert f"rows.jsonl:{line}: metric error: {said}\n" in result.output, result.output


def test_ctrl_c_kills_the_jobs_still_running_instead_of_waiting_them_out(tmp_path):
    """A row's test may take a minute (timeout_ms 60000) and the program loops: Ctrl-C dropped the
    row for a resume but the process waited for the job's wall time before it exited (57 s)."""
    import os
    import signal
    import subprocess
    import sys
    import time
    import uuid

    marker = f"GAGE_TEST_{uuid.uuid4().hex}"  # in the job's environment: its processes are found by it
    row = code_row("slow", {"env": {marker: "1"}})
    row["metadata"]["execution"]["timeout_ms"] = 60000
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps(row) + "\n")
    script = tmp_path / "replies.json"
    script.write_text(json.dumps([{"text": "```python\ndef add(a, b):\n    while True:\n        pass\n```"}]))
    proc = subprocess.Popen([sys.executable, "-m", "gage_eval.cli", "--tasks", "code_exec", "--model", "dummy",
                             "--model-args", f"response=script,script={script}", "--data", f"code_exec={data}",
                             "-o", tmp_path, "--run-id", "r", "-q"], stderr=subprocess.PIPE, text=True)

    def job_processes() -> list[str]:
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/environ", "rb") as fh:
                    if marker.encode() in fh.read():
                        found.append(pid)
            except OSError:
                continue
        return found

    deadline = time.time() + 60
    while not job_processes() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None and job_processes(), "the job did not start"
    time.sleep(0.5)  # (into its looping test)
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=30)[1]  # (the job alone would hold it for 60 s or more)
    assert proc.returncode == 130, err
    assert job_processes() == []
