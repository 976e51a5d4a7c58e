"""Hostile code, run for real in the local bubblewrap sandbox through the code_exec metric (and one
run through the CLI): each is contained, scored as a failure with its reason, nothing outside the
working folder changes and no process it started is left."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from gage_eval.api import GageError, MetricContext, execution
from gage_eval.plugins import load_plugins

from tests.sandbox.local_sandbox import needs_local_sandbox

ROOT = Path(__file__).resolve().parents[2]


pytestmark = needs_local_sandbox


@pytest.fixture(scope="module")
def metric():
    from gage_plugins_builtin.code.metric import CodeExec

    load_plugins()
    return CodeExec(timeout_s=1.0, limits={"memory_mb": 256, "processes": 32, "output_bytes": 1 << 16})


def _leftovers(marker: str) -> list[int]:
    """Processes whose environment holds ``marker`` (every process a job starts inherits it)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{pid}/environ").read_bytes():
                found.append(int(pid))
        except OSError:
            continue
    return found


def score(metric, code: str, tests=None, entry: str | None = "f", box: dict | None = None) -> tuple[dict, str]:
    marker = f"GAGE_TEST_{uuid.uuid4().hex}"
    spec = {"type": "code_exec", "test_cases": tests or [{"input": "", "output": "None"}]}
    if entry:
        spec["entry_point"] = entry
    sample = {"id": "x", "metadata": {"execution": spec},
              "sandbox": {**(box or {}), "env": {**(box or {}).get("env", {}), marker: "1"}}}
    result = metric.compute(MetricContext(sample=sample, model_output={"text": code}))
    assert _leftovers(marker) == [], "a process of the job outlived it"
    return result, marker


def statuses(result: dict) -> list[str]:
    return [t["status"] for t in result["tests"]]


def test_a_right_answer_passes_and_a_wrong_one_fails(metric):
    ok, _ = score(metric, "def f(a, b):\n    return a + b\n", [{"input": "1, 2", "output": "3"}])
    assert ok["value"] == 1.0 and statuses(ok) == ["pass"]
    bad, _ = score(metric, "def f(a, b):\n    return a - b\n", [{"input": "1, 2", "output": "3"}])
    assert bad["value"] == 0.0 and statuses(bad) == ["fail"] and "expected 3, got -1" in bad["tests"][0]["reason"]


def test_stdin_stdout_rows_with_files_setup_and_env(metric):
    code = "import os\nprint(open('data.txt').read().strip(), os.environ['WHO'], input())\n"
    box = {"files": {"data.txt": "hello\n"}, "setup": "test -f data.txt && echo made > setup.txt", "env": {"WHO": "me"}}
    result, _ = score(metric, code, [{"input": "x\n", "output": "hello me x\n"}], entry=None, box=box)
    assert statuses(result) == ["pass"]
    with pytest.raises(GageError, match=r"^sandbox local: sandbox.setup failed \(exit 3\)"):  # the row's error
        score(metric, code, [{"input": "x\n", "output": "hello me x\n"}], entry=None, box={"setup": "exit 3"})


def test_an_image_is_refused_naming_a_sandbox_that_runs_images(metric):
    with pytest.raises(GageError, match=r"^sandbox local: .*'python:3.10'.*gage_register_sandboxes"):
        score(metric, "def f():\n    return None\n", box={"image": "python:3.10"})  # the row's error, not a 0


def test_infinite_loop_times_out(metric):
    result, _ = score(metric, "def f():\n    while True:\n        pass\n")
    assert statuses(result) == ["timeout"]


def test_sigterm_ignored_and_alarm_swallowed_still_ends(metric):
    code = ("import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
            "def f():\n    while True:\n        try:\n            pass\n        except BaseException:\n            pass\n")
    result, _ = score(metric, code)
    assert statuses(result) == ["timeout"] and "wall time" in result["tests"][0]["reason"]


def test_fork_bomb_is_contained(metric):
    code = ("import os\ndef f():\n    while True:\n        try:\n            os.fork()\n"
            "        except OSError:\n            pass\n")
    result, _ = score(metric, code)
    assert result["value"] == 0.0 and statuses(result)[0] in ("timeout", "error")


def test_memory_hog_fails(metric):
    # 32 MiB at a time: the 256 MiB limit is reached in a few steps, well within the test's time on a busy machine
    result, _ = score(metric, "def f():\n    x = []\n    while True:\n        x.append(bytearray(1 << 25))\n")
    assert statuses(result) == ["error"] and "MemoryError" in result["tests"][0]["reason"]


def test_huge_output_is_cut_and_fails(metric):
    code = "import os\ndef f():\n    while True:\n        os.write(1, b'x' * 65536)\n"
    result, _ = score(metric, code)
    assert statuses(result) == ["error"] and "output past" in result["tests"][0]["reason"]
    printed, _ = score(metric, "print('y' * (1 << 30))\ndef f():\n    return None\n", entry="f")
    assert printed["value"] == 0.0


def test_nothing_of_the_host_is_readable(metric, tmp_path):
    run_folder = tmp_path / "runs" / "r1"
    run_folder.mkdir(parents=True)
    (run_folder / "summary.json").write_text("{}")
    paths = [str(Path.home() / ".ssh"), str(Path.home()), "/etc/shadow", "/etc/passwd", str(ROOT / "README.md"),
             str(run_folder / "summary.json"), str(Path(sys.executable).resolve().parent.parent / "pyvenv.cfg")]
    code = ("import os\ndef f():\n    seen = []\n"
            f"    for p in {paths!r}:\n"
            "        try:\n            os.listdir(p) if os.path.isdir(p) else open(p).read(1)\n            seen.append(p)\n"
            "        except OSError:\n            pass\n    return seen\n")
    result, _ = score(metric, code, [{"input": "", "output": "[]"}])
    assert statuses(result) == ["pass"], result["tests"]


def test_writes_outside_the_work_folder_change_nothing(metric, tmp_path):
    canary = tmp_path / "canary"
    canary.mkdir()
    (canary / "keep.txt").write_text("keep")
    host_tmp = tempfile.NamedTemporaryFile(prefix="gage-canary-", dir="/tmp")  # in the host's /tmp itself
    code = ("import os\ndef f():\n"
            f"    os.system('rm -rf ~ {canary} /tmp/* 2>/dev/null')\n"
            f"    for p in ['/tmp/gage-escape', '{canary}/new.txt', '{ROOT}/escape.txt', '/usr/escape']:\n"
            "        try:\n            open(p, 'w').write('x')\n        except OSError:\n            pass\n"
            "    return None\n")
    result, _ = score(metric, code)
    assert statuses(result) == ["pass"]
    assert (canary / "keep.txt").read_text() == "keep" and not (canary / "new.txt").exists()
    assert not (ROOT / "escape.txt").exists() and not Path("/usr/escape").exists()
    assert not Path("/tmp/gage-escape").exists()
    assert Path(host_tmp.name).exists()  # (not a listing of /tmp: other processes share it)
    host_tmp.close()


def test_no_network(metric):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    code = ("import socket\ndef f():\n    try:\n"
            f"        socket.create_connection(('127.0.0.1', {port}), timeout=0.5)\n        return 'connected'\n"
            "    except OSError as exc:\n        return 'refused'\n")
    try:
        result, _ = score(metric, code, [{"input": "", "output": "'refused'"}])
    finally:
        server.close()
    assert statuses(result) == ["pass"]


def test_a_daemon_that_outlives_its_test_is_gone(metric):
    code = ("import subprocess, sys\ndef f():\n"
            "    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], start_new_session=True)\n"
            "    return None\n")
    result, _ = score(metric, code)  # score() checks that no process with the job's environment is left
    assert statuses(result) == ["pass"]


def test_killing_the_parent_fails_the_row(metric):
    result, _ = score(metric, "import os, signal\ndef f():\n    os.kill(os.getppid(), signal.SIGKILL)\n    os.kill(os.getpid(), signal.SIGKILL)\n")
    assert result["value"] == 0.0 and statuses(result) == ["error"]


def test_a_program_printing_the_sandboxs_setup_failure_line_is_its_own_failure(metric):
    """The launcher's setup-failure line, printed by the program itself, made a wrong answer the row's
    error (left out of the mean, as if no answer were tested): a 0 now, its stderr as the program wrote it."""
    code = "import os\nos.write(2, b'\\x1egage-sandbox: setup failed (exit 1)\\n')\ndef f():\n    return 2\n"
    result, _ = score(metric, code, [{"input": "", "output": "1"}])
    assert result["value"] == 0.0 and statuses(result) == ["fail"]
    done = execution.open_sandbox("local").run(execution.Job(command=("sh", "-c", "echo out; echo err >&2"),
                                                             limits=execution.Limits(wall_s=20)))
    assert (done.status, done.exit_code, done.stdout, done.stderr) == ("exited", 0, "out\n", "err\n")


def test_an_answer_that_is_not_utf8_text_fails_and_rows_tests_that_are_not_are_the_rows_error(metric):
    """A reply holding a lone surrogate (a server's JSON "\\ud800") could not be written into the
    working folder: the row's error, blaming sandbox.files, so a wrong answer left the mean. It fails
    now, as in OpenAI's reference (exec cannot compile it). A row's own test that is not UTF-8 text
    was every test's error, scored 0 against the model: the row's error now, naming the field."""
    result, _ = score(metric, "def f():\n    return 2  # \ud800\n", [{"input": "", "output": "1"}, {"input": "", "output": "2"}])
    assert result["value"] == 0.0 and statuses(result) == ["error", "error"]
    assert result["tests"][0]["reason"].startswith("the answer is not UTF-8 text")
    with pytest.raises(ValueError, match=r"^sample.metadata.execution.test_cases.1: not UTF-8 text"):
        score(metric, "def f(x):\n    return x\n", [{"input": "1", "output": "1"}, {"input": "'\ud800'", "output": "1"}])
    with pytest.raises(ValueError, match=r"^sample.metadata.execution.test: not UTF-8 text"):
        metric.compute(MetricContext(sample={"id": "x", "metadata": {"execution": {
            "type": "code_exec", "entry_point": "f", "test": "def check(c):\n    assert c() == 1  # \udfff\n"}}},
            model_output={"text": "def f():\n    return 1\n"}))


def test_the_program_finds_no_expected_output_in_its_files(metric):
    """job.json, the tests with their expected outputs (and the verdict's nonce), was deleted from the
    working folder, but the sandbox's copy of the job's files stayed readable at /in: a stdio program
    printed each test's expected output and passed. The job comes on the harness's stdin now."""
    code = ("import os\nfound = []\nfor d in ('/in', '.', '/tmp'):\n    for n in os.listdir(d):\n"
            "        try:\n            text = open(os.path.join(d, n)).read()\n        except OSError:\n            continue\n"
            "        if 'expected' + '-7' in text:\n            found.append(n)\nprint(found)\n")
    result, _ = score(metric, code, [{"input": "", "output": "expected-7\n"}], entry=None)
    assert statuses(result) == ["fail"] and result["tests"][0]["reason"] == "expected 'expected-7\\n', got '[]\\n'"


def test_a_stdio_program_cannot_read_the_expected_output_from_the_harness_memory(metric):
    """A stdio program runs in a child of the harness, as the same user: it read the harness's memory
    (/proc/PPID/mem), found each test's expected output there and printed it, passing. The harness
    is not dumpable now, so its memory is not the child's to read."""
    code = ("import os, re\nfound = 'none'\ntry:\n    pp = os.getppid()\n    mem = open(f'/proc/{pp}/mem', 'rb')\n"
            "    for line in open(f'/proc/{pp}/maps'):\n        lo, hi = (int(x, 16) for x in line.split()[0].split('-'))\n"
            "        try:\n            mem.seek(lo)\n            m = re.search(rb'(expected-[0-9]+)', mem.read(min(hi - lo, 1 << 26)))\n"
            "        except (OSError, ValueError, OverflowError):\n            continue\n"
            "        if m:\n            found = m.group(1).decode()\n            break\n"
            "except OSError as exc:\n    found = 'denied'\nprint(found)\n")
    result, _ = score(metric, code, [{"input": "", "output": "expected-" + "42\n"}], entry=None)
    assert statuses(result) == ["fail"] and result["tests"][0]["reason"] == "expected 'expected-42\\n', got 'denied\\n'"


def test_sandbox_job_directly_honours_limits():
    sandbox = execution.open_sandbox("local")
    done = sandbox.run(execution.Job(command=(execution.Job.PYTHON, "-c", "import os; print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()) == [1, 2])"),
                           limits=execution.Limits(wall_s=20)))
    assert done.status == "exited" and done.stdout.strip() == "True"  # a PID namespace of its own
    done = sandbox.run(execution.Job(command=(execution.Job.PYTHON, "-c", "import resource; print(resource.getrlimit(resource.RLIMIT_NOFILE))"),
                           limits=execution.Limits(open_files=17, wall_s=20)))
    assert done.stdout.strip() == "(17, 17)"


def test_hostile_rows_through_the_cli_are_each_scored_and_the_run_goes_on(tmp_path):
    """Sample v1 code rows through --data; the dummy backend echoes each prompt's last line, the code."""
    lines = {"good": "print(sum(map(int, input().split())))",
             "fork": "import os; [os.fork() for _ in iter(int, 1)]",
             "loop": "while True: pass",
             "kill": "import os, signal; os.kill(os.getppid(), signal.SIGKILL)",
             "rm": "import os; os.system('rm -rf ~'); print(5)",
             "shadow": "print(open('/etc/shadow').read())",
             "fakesetup": "import os; os.write(2, b'\\x1egage-sandbox: setup failed (exit 1)\\n'); f = lambda: 4"}
    rows = [{"schema_version": "v1", "id": name, "task_type": "code-generation",
             "messages": [{"role": "user", "content": [{"type": "text", "text": f"Write code.\n{code}"}]}],
             "references": ["print(sum(map(int, input().split())))"], "metadata": {"execution": {"type": "code_exec", "timeout_ms": 1000,
                                                          "test_cases": [{"input": "2 3\n", "output": "5\n"}]}}}
            for name, code in lines.items()]
    rows[-1]["metadata"]["execution"].update(entry_point="f", test_cases=[{"input": "", "output": "5"}])  # in the harness
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    done = subprocess.run([sys.executable, "-m", "gage_eval.cli", "--tasks", "code_exec", "--model", "dummy",
                           "--model-args", "response=echo", "--data", f"code_exec={data}", "--output-dir",
                           str(tmp_path / "runs"), "--run-id", "r"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]
    records = {r["id"]: r for r in map(json.loads, (tmp_path / "runs/r/samples/code_exec.jsonl").read_text().splitlines())}
    assert set(records) == set(lines)
    passed = {k for k, r in records.items() if r["eval_result"]["metrics"]["code_exec"]["value"] == 1.0}
    assert passed == {"good", "rm"}
    summary = json.loads((tmp_path / "runs/r/summary.json").read_text())
    assert summary["tasks"]["code_exec"]["counts"]["scored"] == len(lines)


@pytest.mark.parametrize("timeout_ms", [-1, 0, "abc", True, 1e308, 10**12])
def test_a_rows_timeout_outside_what_a_test_may_take_is_the_rows_error(timeout_ms):
    """-1 and 1e308 were the harness's error, 0 and True every test's timeout, all scored 0 as the
    program's failure; 10**12 let a looping program run (and burn a core) for 31 years."""
    from gage_plugins_builtin.code.metric import CodeExec

    load_plugins()
    sample = {"id": "x", "metadata": {"execution": {"type": "code_exec", "entry_point": "f", "timeout_ms": timeout_ms,
                                                    "test_cases": [{"input": "1", "output": "1"}]}}}
    with pytest.raises(ValueError, match=r"^sample.metadata.execution.timeout_ms: expected milliseconds above 0 "
                                         r"and at most 600000 \(each test's time\), got "):
        CodeExec().compute(MetricContext(sample=sample, model_output={"text": "def f(x):\n    while True: pass\n"}))
