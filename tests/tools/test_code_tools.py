"""The builtin ``python`` and ``bash`` tools (gage_plugins_builtin/tools/code.py): the model's code run
for real in the local bubblewrap sandbox from inside the tool loop, the dummy backend scripted to
call them. Hostile code (network, writes outside, a fork bomb, a memory hog, an endless loop, a
flood of output, a process left behind, killing its parent) is each contained and comes back to
the model as the tool turn's text; the run goes on."""
from __future__ import annotations

import json
import os
import socket
import uuid
from pathlib import Path

import pytest

from tests.sandbox.local_sandbox import needs_local_sandbox

ROOT = Path(__file__).resolve().parents[2]
TASK = ROOT / "tests" / "tools" / "data" / "code_agent"

pytestmark = needs_local_sandbox


def call(cid: str, name: str, arguments: dict) -> dict:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


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


def row(rid: str, text: str, marker: str, files: dict | None = None, answer: str = "done") -> dict:
    return {"schema_version": "v1", "id": rid, "task_type": "agent",
            "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}],
            "sandbox": {"files": files or {}, "env": {"WHO": "me", marker: "1"}},
            "references": [{"answer": [{"type": "text", "text": answer}]}]}


def run(run_cli, tmp_path, rows: list[dict], script: dict, run_id: str = "r"):
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = tmp_path / "script.json"
    path.write_text(json.dumps(script))
    result = run_cli("--tasks", "code_agent", "--include-path", TASK, "--data", f"code_agent={data}",
                     "--model", "dummy", "--model-args", f"response=script,script={path}",
                     "-o", tmp_path, "--run-id", run_id, "-q", "--no-report")
    samples = {json.loads(line)["id"]: json.loads(line)
               for line in (tmp_path / run_id / "samples" / "code_agent.jsonl").read_text().splitlines()}
    return result, samples


def tool_texts(sample: dict) -> list[str]:
    return [m["content"][0]["text"] for m in sample["predict_result"][0]["trajectory"] if m["role"] == "tool"]


def test_the_model_runs_python_and_bash_on_the_rows_files_and_reads_the_output(run_cli, tmp_path):
    marker = f"GAGE_TEST_{uuid.uuid4().hex}"
    script = {"sum": [
        {"tool_calls": [call("a", "python", {"code": "print(sum(int(x) for x in open('data.txt')))\n"
                                                    "open('left.txt', 'w').write('x')"})]},
        {"tool_calls": [call("b", "bash", {"cmd": "wc -l < data.txt; echo $WHO; ls"}),
                        call("c", "python", {"code": "raise SystemExit('no luck')"}),
                        call("d", "python", {"source": "print(1)"})]},
        {"text": "12"}]}
    result, samples = run(run_cli, tmp_path, [row("sum", "Add up data.txt", marker, {"data.txt": "3\n4\n5\n"}, "12")],
                          script)
    assert result.exit_code == 0, result.output
    first, second, failed, wrong = tool_texts(samples["sum"])
    assert first == "12\n"
    # a fresh folder for each call: the row's file is there again, what the last call wrote is not
    assert second == "3\nme\ndata.txt\n"
    assert failed == "no luck\n[exit status 1]"
    assert wrong.startswith("Error during execution: python() takes one argument, code; not source")
    out = samples["sum"]["predict_result"][0]
    assert out["raw"]["tool_loop"]["states"] == [{"PythonTool": {"calls": 2}, "BashTool": {"calls": 1}}]
    assert samples["sum"]["eval_result"]["metrics"]["exact_match"]["value"] == 1.0
    assert _leftovers(marker) == []


def test_hostile_code_is_contained_and_each_comes_back_as_the_tool_turn(run_cli, tmp_path):
    marker = f"GAGE_TEST_{uuid.uuid4().hex}"
    canary = tmp_path / "canary"
    canary.mkdir()
    (canary / "keep.txt").write_text("keep")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    hostile = {
        "network": f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=0.5)\n"
                   "    print('connected')\nexcept OSError:\n    print('refused')\n",
        "writes": "import os\n"
                  f"os.system('rm -rf ~ {canary} /tmp/* 2>/dev/null')\n"
                  f"for p in ['/tmp/gage-escape', '{canary}/new.txt', '{ROOT}/escape.txt', '/usr/escape']:\n"
                  "    try:\n        open(p, 'w').write('x')\n        print('wrote', p)\n"
                  "    except OSError:\n        pass\nprint('finished')\n",
        "fork_bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
        "memory": "x = []\nwhile True:\n    x.append(bytearray(1 << 25))\n",
        "loop": "while True:\n    pass\n",
        "flood": "import os\nwhile True:\n    os.write(1, b'x' * 65536)\n",
        "daemon": "import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], "
                  "start_new_session=True)\nprint('started')\n",
        "parent": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(os.getpid(), signal.SIGKILL)\n",
    }
    calls = [call(name, "python", {"code": code}) for name, code in hostile.items()]
    calls.append(call("shell", "bash", {"cmd": ":(){ :|:& };: ; echo survived"}))
    # 40 sleepers against a limit of 32 processes: the limit is hit whatever the machine's load
    calls.append(call("procs", "bash", {"cmd": "for i in $(seq 40); do sleep 3 & done; echo spawned"}))
    # the sandbox's own setup-failure line, printed by the model's command: it made the row an error
    calls.append(call("fakesetup", "bash", {"cmd": "printf '\\036gage-sandbox: setup failed (exit 1)\\n' >&2; echo ran"}))
    script = {"bad": [{"tool_calls": calls}, {"text": "done"}], "after": [{"tool_calls": [
        call("ok", "python", {"code": "print(6 * 7)"})]}, {"text": "done"}]}
    try:
        result, samples = run(run_cli, tmp_path, [row("bad", "Break out", marker), row("after", "Then this", marker)],
                              script)
    finally:
        server.close()
    assert result.exit_code == 0, result.output
    texts = dict(zip([*hostile, "shell", "procs", "fakesetup"], tool_texts(samples["bad"])))
    assert texts["network"] == "refused\n"
    # only the sandbox's own /tmp (a tmpfs that goes with the job) took a write; nothing of the host did
    assert texts["writes"] == "wrote /tmp/gage-escape\nfinished\n"
    assert (canary / "keep.txt").read_text() == "keep" and not (canary / "new.txt").exists()
    assert not (ROOT / "escape.txt").exists() and not Path("/usr/escape").exists()
    assert not Path("/tmp/gage-escape").exists()
    assert texts["fork_bomb"] == "[killed: ran past 2 s]"  # its forks refused past the process limit, then its time
    assert "MemoryError" in texts["memory"] and texts["memory"].endswith("[exit status 1]")
    assert texts["loop"] == "[killed: ran past 2 s]"
    assert texts["flood"].endswith("[killed: printed more than 65536 bytes]")
    assert len(texts["flood"]) < 20_000  # what the model is shown is cut
    assert texts["daemon"] == "started\n"
    assert texts["parent"] in ("[exit status 137]", "[killed by signal 9]")  # it only took itself down
    # the classic bomb: whether its forks fail before the job ends depends on the machine's load,
    # so it is checked by what follows (the run goes on, nothing outlives the job)
    assert texts["shell"]
    assert "fork: retry: Resource temporarily unavailable" in texts["procs"]
    assert texts["fakesetup"] == "ran\n\x1egage-sandbox: setup failed (exit 1)\n"
    assert samples["bad"]["predict_result"][0]["raw"]["tool_loop"]["stopped"] == "done"
    assert tool_texts(samples["after"]) == ["42\n"]  # the run went on
    assert _leftovers(marker) == []  # no process any job started outlived it


def test_a_tool_setting_that_names_no_tool_or_a_bad_limit_is_the_rows_error(run_cli, tmp_path):
    from gage_plugins_builtin.tools.code import PythonTool
    from gage_plugins_builtin.tools.loop import Toolbox

    with pytest.raises(ValueError, match="tool_args names pyhton"):
        Toolbox(["python"], {}, {"pyhton": {"timeout_s": 1}})
    with pytest.raises(ValueError, match="unknown limit memory"):
        PythonTool(sample={}, limits={"memory": 1})
    tool = PythonTool(sample={"sandbox": {"files": {"a.txt": "x"}}}, timeout_s=3)
    assert tool.limits.wall_s == 3 and tool.limits.cpu_s == 3 and tool.files == {"a.txt": "x"}
    assert tool.definitions()[0]["function"]["parameters"]["required"] == ["code"]


def test_a_rows_sandbox_file_outside_its_folder_is_the_rows_error_before_the_model(run_cli, tmp_path):
    """A row whose sandbox.files names a path that leaves the working folder (or no path at all) is
    reported with its line and field and recorded as an error; the model never sees it and the
    good row beside it runs (it used to reach the model as a tool turn's error and be scored)."""
    marker = f"GAGE_TEST_{uuid.uuid4().hex}"
    bad_names = ["../up.txt", "/etc/x", "a/../../b", "", "nul\0here"]
    rows = [row(f"bad{i}", "Read it", marker, {name: "x", "fine.txt": "y"}) for i, name in enumerate(bad_names)]
    rows.append(row("good", "Read it", marker, {"fine.txt": "y"}))
    script = {r["id"]: [{"tool_calls": [call("a", "python", {"code": "print(open('fine.txt').read())"})]},
                        {"text": "done"}] for r in rows}
    result, samples = run(run_cli, tmp_path, rows, script)
    assert result.exit_code != 0  # row errors: the run's status says some rows failed
    assert tool_texts(samples["good"]) == ["y\n"]
    assert samples["good"]["eval_result"]["metrics"]["exact_match"]["value"] == 1.0
    events = [json.loads(line) for line in (tmp_path / "r" / "events.jsonl").read_text().splitlines()]
    errors = [e for e in events if e["event"] == "sample_error"]
    assert [e["locator"].rsplit("/", 1)[1] for e in errors] == [f"rows.jsonl:{i + 1}" for i in range(5)]
    for e, name in zip(errors, bad_names):
        assert e["stage"] == "validate"
        assert e["message"] == f"sandbox.files: {name!r} is not a relative path inside the working folder"
    for i in range(5):  # each bad row is recorded as its error and never reached the model
        record = samples[f"code_agent-row-{i}"]
        assert record["metadata"]["row_id"] == f"bad{i}" and "predict_result" not in record
        assert record["eval_result"]["error"]["stage"] == "validate"


@pytest.mark.parametrize("tool_args, key, problem", [
    ("python: {sandbox: nowhere}", "request.tool_loop.tool_args.python",
     "unknown sandbox 'nowhere'; registered sandboxes:"),
    ("python: {sandbox_args: {colour: red}}", "request.tool_loop.tool_args.python", "TypeError"),
    ("bash: {sandbox: unsandboxed}", "request.tool_loop.tool_args.bash", "needs --allow-unsandboxed-code"),
])
def test_a_code_tools_sandbox_that_cannot_be_opened_stops_the_task_at_setup(run_cli, tmp_path, tool_args, key,
                                                                            problem):
    """An unknown sandbox, arguments its factory refuses, or the unsandboxed one without the flag:
    one line naming task.yaml's line and key before any row runs (they were each row's tool error)."""
    folder = tmp_path / "tasks" / "code_agent"
    folder.mkdir(parents=True)
    text = (TASK / "task.yaml").read_text()
    start = text.index("    tool_args:\n")
    end = text.index("  generation:")
    (folder / "task.yaml").write_text(text[:start] + f"    tool_args:\n      {tool_args}\n" + text[end:])
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps(row("one", "hi", "GAGE_TEST_X")) + "\n")
    result = run_cli("--tasks", "code_agent", "--include-path", tmp_path / "tasks", "--data", f"code_agent={data}",
                     "--model", "dummy", "-o", tmp_path, "--run-id", "r", "-q", "--no-report")
    assert result.exit_code == 3, result.output  # as any task that cannot run
    line = [n for n, t in enumerate((folder / "task.yaml").read_text().splitlines(), 1)
            if t.strip() == tool_args][0]
    assert f"task.yaml:{line}): key '{key}': tool " in result.output and problem in result.output, result.output
    assert not (tmp_path / "r" / "samples" / "code_agent.jsonl").exists()


def test_a_row_the_sandbox_cannot_prepare_is_the_rows_error_not_a_tool_turn(run_cli, tmp_path):
    """An image the local sandbox does not run, a sandbox.setup that fails: the environment is
    broken, not the model, so the row is recorded as its error naming the reason and is not scored
    (each call came back to the model as '[the sandbox could not run it: ...]' and the row was scored,
    exact_match 1.0). A program that fails, runs too long or prints too much stays the model's turn."""
    marker = f"GAGE_TEST_{uuid.uuid4().hex}"
    image = row("image", "Run it", marker)
    image["sandbox"]["image"] = "python:3.12"
    setup = row("setup", "Run it", marker)
    setup["sandbox"]["setup"] = "echo no compiler >&2; exit 3"
    good = row("good", "Run it", marker)
    good["sandbox"]["setup"] = "echo 7 > made.txt"
    script = {rid: [{"tool_calls": [call("a", "python", {"code": "print(open('made.txt').read())"}),
                                    call("b", "bash", {"cmd": "exit 9"})]},
                    {"tool_calls": [call("c", "bash", {"cmd": "sleep 5"}),  # (a command line no process takes)
                                    call("d", "bash", {"cmd": "echo " + "x" * 200_000})]}, {"text": "done"}]
              for rid in ("image", "setup", "good")}
    result, samples = run(run_cli, tmp_path, [image, setup, good], script)
    assert result.exit_code == 1, result.output  # some rows errored
    assert tool_texts(samples["good"]) == ["7\n\n", "[exit status 9]", "[killed: ran past 2 s]", (
        "Error during execution: bash() takes a command line under 131072 bytes, not 200005; run a longer program "
        "with python")]
    assert samples["good"]["eval_result"]["metrics"]["exact_match"]["value"] == 1.0
    for line, rid, said in [(1, "image", "the local sandbox runs no container image (the row's sandbox.image is "
                                         "'python:3.12')"), (2, "setup", "sandbox.setup failed (exit 3): no compiler")]:
        record = samples[rid]
        error = record["eval_result"]["error"]
        assert "metrics" not in record["eval_result"], record["eval_result"]
        assert error["stage"] == "inference" and error["locator"].endswith(f"rows.jsonl:{line}"), error
        assert error["message"].startswith(f"tool python: sandbox local: {said}"), error
        events = [json.loads(t) for t in (tmp_path / "r" / "events.jsonl").read_text().splitlines()]
        assert [e["message"] for e in events if e["event"] == "sample_error" and e["locator"] == error["locator"]] \
            == [error["message"]], events
        out = record["predict_result"][0]
        assert out["raw"]["tool_loop"]["stopped"] == "error" and out["raw"]["tool_loop"]["steps"] == 1, out
        assert tool_texts(record) == []  # the model was never answered with the sandbox's failure
    assert _leftovers(marker) == []


def test_a_python_call_that_is_not_utf8_text_starts_no_process(monkeypatch):
    """A call's code holding a lone surrogate (a server's JSON "\\ud800") started the sandbox and then
    failed to write its stdin, leaving the started process to end by itself, unwatched (a zombie);
    now it fails before any process starts, the model reading why."""
    from gage_eval.plugins import load_plugins
    from gage_plugins_builtin.sandbox import process
    from gage_plugins_builtin.tools.loop import Toolbox

    load_plugins()
    started, popen = [], process.subprocess.Popen
    monkeypatch.setattr(process.subprocess, "Popen", lambda *a, **k: started.append(a) or popen(*a, **k))
    toolbox = Toolbox(["python"], {}, {"python": {"timeout_s": 5}})
    text = toolbox.run(call("a", "python", {"code": "print(1)  # \ud800"}))
    assert text.startswith("Error during execution: 'utf-8' codec can't encode character '\\ud800'") and started == []
    assert toolbox.run(call("b", "python", {"code": "print(1)"})) == "1\n" and len(started) == 1
