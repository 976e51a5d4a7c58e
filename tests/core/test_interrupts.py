"""A run a person can watch and interrupt: progress lines when stderr is a log file, SIGINT and
SIGTERM at any moment (model load included) write the summary of what finished and the exact
resume command, and --resume then runs only what is missing. Fractional --limit."""
from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gage_eval.engine.progress import Progress

ROWS = 120
REAL_ROWS = 48  # SmolLM2 rows: enough batches left when the signal comes, few for the resume to run


def rows_file(path: Path, n: int = ROWS) -> Path:
    with path.open("w") as fh:
        for i in range(n):
            fh.write(json.dumps({"goal": f"How do I do thing {i}?", "sol1": f"Use the tool {i}.",
                                 "sol2": f"Use the other tool {i * 3}.", "label": i % 2}) + "\n")
    return path


def cmd(*args) -> list[str]:
    return [sys.executable, "-c", "from gage_eval.cli import main; main()", *map(str, args)]


class Watched:
    """A gage-eval process whose stderr is collected line by line while it runs."""

    def __init__(self, args, env=None):
        import os

        self.lines: list[str] = []
        self.proc = subprocess.Popen(cmd(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, **(env or {})},
                                     preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stderr:
            self.lines.append(line)

    def wait_for(self, predicate, timeout: float = 240) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if predicate():
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"exited {self.proc.returncode} first:\n{''.join(self.lines)}")
            time.sleep(0.05)
        raise AssertionError("timed out:\n" + "".join(self.lines))

    def finish(self, timeout: float = 120) -> tuple[int, str]:
        self.proc.wait(timeout=timeout)
        self._reader.join(timeout=10)
        return self.proc.returncode, "".join(self.lines)


def lines_in(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def resume_and_check(run_dir: Path, n: int = ROWS) -> dict:
    result = subprocess.run(cmd("--resume", run_dir, "-q"), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    ids = [json.loads(l)["id"] for l in (run_dir / "samples" / "piqa.jsonl").read_text().splitlines()]
    assert len(ids) == len(set(ids)) == n  # nothing run twice, nothing lost
    return json.loads((run_dir / "summary.json").read_text())


# -- dummy backend: fast, every run --------------------------------------------------------------

@pytest.mark.parametrize("sig,status,word", [(signal.SIGINT, 130, "Ctrl-C"), (signal.SIGTERM, 143, "SIGTERM")])
def test_signal_mid_run_keeps_rows_writes_summary_and_says_how_to_resume(tmp_path, sig, status, word):
    data = rows_file(tmp_path / "rows.jsonl")
    run = Watched(["--tasks", "piqa", "--model", "dummy", "--model-args", "delay_ms=20", "--batch-size", 4,
                   "--data", f"piqa={data}", "-o", tmp_path, "--run-id", "r"])
    samples = tmp_path / "r" / "samples" / "piqa.jsonl"
    run.wait_for(lambda: lines_in(samples) >= 12)
    run.proc.send_signal(sig)
    code, err = run.finish()
    assert code == status, err
    assert "Traceback" not in err
    assert f"gage-eval --resume {tmp_path / 'r'}" in err and word in err
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    written = lines_in(samples)
    assert 12 <= written < ROWS
    assert summary["run"]["interrupted"] and summary["run"]["exit_status"] == status
    assert summary["tasks"]["piqa"]["counts"]["total"] == written  # the summary is of what finished
    resume_and_check(tmp_path / "r")


def test_a_task_the_interrupt_came_before_is_not_run_not_empty(tmp_path):
    """Its data has rows: the summary must not say it gave none."""
    data = rows_file(tmp_path / "rows.jsonl")
    run = Watched(["--tasks", "piqa,arc_easy", "--model", "dummy", "--model-args", "delay_ms=50", "--batch-size", 4,
                   "--data", f"piqa={data}", "--data", f"arc_easy={data}", "-o", tmp_path, "--run-id", "r"])
    run.wait_for(lambda: lines_in(tmp_path / "r" / "samples" / "piqa.jsonl") >= 8)
    run.proc.send_signal(signal.SIGINT)
    code, err = run.finish()
    assert code == 130, err
    tasks = json.loads((tmp_path / "r" / "summary.json").read_text())["tasks"]
    assert tasks["piqa"]["status"] == "ok" and tasks["piqa"]["counts"]["total"] >= 8
    assert tasks["arc_easy"]["status"] == "failed" and tasks["arc_easy"]["counts"]["total"] == 0
    assert tasks["arc_easy"]["failure"] == "not run: the run stopped before this task wrote a row"


def test_progress_lines_when_stderr_is_not_a_terminal(tmp_path):
    data = rows_file(tmp_path / "rows.jsonl", 40)
    result = subprocess.run(cmd("--tasks", "piqa", "--model", "dummy", "--model-args", "delay_ms=10",
                                "--batch-size", 2, "--data", f"piqa={data}", "-o", tmp_path, "--run-id", "r"),
                            capture_output=True, text=True, env={**__import__("os").environ,
                                                                 "GAGE_EVAL_PROGRESS_INTERVAL": "0.1"})
    assert result.returncode == 0, result.stderr
    lines = [l for l in result.stderr.splitlines() if l.startswith("gage-eval: piqa: ")]
    assert len(lines) >= 3, result.stderr  # several while running, one at the end
    assert all("/40 rows" in l for l in lines)  # the total is known up front (the file's row count)
    assert any("ETA" in l for l in lines[:-1])
    assert "40/40 rows (100%)" in lines[-1] and "done in" in lines[-1]
    assert "loading model dummy" in result.stderr
    quiet = subprocess.run(cmd("--tasks", "piqa", "--model", "dummy", "--data", f"piqa={data}", "-o", tmp_path,
                               "--run-id", "q", "-q"), capture_output=True, text=True)
    assert quiet.returncode == 0 and "rows" not in quiet.stderr and "loading" not in quiet.stderr


def test_progress_counts_errored_rows():
    out = io.StringIO()
    progress = Progress("t", total=4, stream=out, interval=0)
    for bad in (False, True, False, True):
        progress.update(errored=bad)
    progress.close()
    last = out.getvalue().splitlines()[-1]
    assert "4/4 rows (100%)" in last and "2 errored" in last


def test_the_last_progress_line_of_a_task_stopped_short_does_not_say_done():
    out = io.StringIO()
    progress = Progress("t", total=60, stream=out, interval=3600)
    progress.update(14)
    progress.close()  # an interrupt, or a backend that stopped the run
    last = out.getvalue().splitlines()[-1]
    assert "14/60 rows (23%)" in last and "ended after" in last and "done" not in last


def test_progress_bar_in_a_terminal_uses_tqdm():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    out = Tty()
    progress = Progress("piqa", total=10, stream=out)
    for _ in range(10):
        progress.update()
    progress.message("a row error")
    progress.close()
    text = out.getvalue()
    assert "piqa" in text and "10/10" in text and "a row error" in text


@pytest.mark.parametrize("limit,expected", [(0.5, 12), (0.01, 1), (1.0, 24), (1, 1), (0.99, 24)])
def test_fractional_limit_takes_a_share_of_each_task_rounded_up(tmp_path, limit, expected):
    from gage_eval.engine.loop import Engine, RunOptions

    run_dir = tmp_path / "r"
    run_dir.mkdir()
    summary = Engine(RunOptions(tasks=["piqa"], model="dummy", limit=limit, quiet=True), run_dir).run()
    assert summary["tasks"]["piqa"]["counts"]["total"] == expected


def test_jsonl_loader_counts_rows_without_parsing(tmp_path):
    from gage_plugins_builtin.loaders import JsonlLoader

    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1}\n\n  \n{"a": 2}\n{"a": 3}')  # blank lines are not rows; no final newline
    assert JsonlLoader(str(path)).total() == 3


# -- the real model ------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("sig,status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_real_model_rows_are_on_disk_after_a_signal(tmp_path, smollm2_gguf, sig, status):
    # 6 batches of 8: the signal comes after the first; the resume runs the rest on the real model too
    data = rows_file(tmp_path / "rows.jsonl", REAL_ROWS)
    run = Watched(["--tasks", "piqa", "--batch-size", 8, "--data", f"piqa={data}", "-o", tmp_path,
                   "--run-id", "r"])
    samples = tmp_path / "r" / "samples" / "piqa.jsonl"
    run.wait_for(lambda: lines_in(samples) >= 8)  # written per batch, not at the end of the task
    run.proc.send_signal(sig)
    code, err = run.finish()
    assert code == status, err
    written = lines_in(samples)
    assert 8 <= written < REAL_ROWS, err
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["tasks"]["piqa"]["counts"]["total"] == written
    assert f"gage-eval --resume {tmp_path / 'r'}" in err
    resume_and_check(tmp_path / "r", REAL_ROWS)


@pytest.mark.slow
def test_ctrl_c_while_the_model_loads_writes_a_summary(tmp_path, smollm2_gguf):
    run = Watched(["--tasks", "piqa", "--limit", 4, "-o", tmp_path, "--run-id", "r"])
    run.wait_for(lambda: any("loading model" in l for l in run.lines))
    time.sleep(0.5)
    run.proc.send_signal(signal.SIGINT)
    code, err = run.finish()
    assert code == 130, err
    assert "Traceback" not in err and "gage-eval: ;" not in err
    assert f"gage-eval --resume {tmp_path / 'r'}" in err
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["run"]["interrupted"] and summary["run"]["exit_status"] == 130
    resume_and_check(tmp_path / "r", 4)


def test_the_resume_command_asks_for_secrets_again_without_showing_them():
    from gage_eval.engine.loop import RunOptions
    from gage_eval.cli.resume import resume_command

    options = RunOptions(tasks=["a"], model="openai", judge_args={"api_key": "sk-live-123", "model": "j"},
                         model_args={"base_url": "http://h/v1", "header_Authorization": "Bearer tok-9"})
    line = resume_command(Path("runs/my run"), options)
    assert line.startswith("gage-eval --resume 'runs/my run' --model-args base_url=http://h/v1,")
    assert "header_Authorization=<header_Authorization>" in line and "api_key=<api_key>,model=j" in line
    assert "sk-live-123" not in line and "tok-9" not in line
    assert resume_command(Path("r"), RunOptions(tasks=["a"], model="dummy")) == "gage-eval --resume r"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_inside_held_waits_for_the_block_to_end(sig):
    """A record is written and counted together: a Ctrl-C or SIGTERM that arrives between the two
    is raised after both (a summary counting 5 rows beside a samples file of 6 was seen under load)."""
    import os

    from gage_eval.engine.interrupts import ctrl_c_interrupts, held, sigterm_interrupts

    done = []
    with pytest.raises(KeyboardInterrupt):
        with ctrl_c_interrupts(), sigterm_interrupts():
            with held():
                done.append("written")
                os.kill(os.getpid(), sig)
                time.sleep(0.05)  # the handler runs here, and must not raise
                done.append("counted")
            done.append("after the block")  # not reached: the interrupt is raised as the block ends
    assert done == ["written", "counted"]


def test_held_keeps_a_failing_blocks_own_error():
    import os

    from gage_eval.engine.interrupts import ctrl_c_interrupts, held, interrupt_of

    with pytest.raises(OSError) as caught:
        with ctrl_c_interrupts():
            with held():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)
                raise OSError(28, "No space left on device")
    assert isinstance(interrupt_of(caught.value), KeyboardInterrupt)  # the run still stops as interrupted


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_swallowed_by_a_finalizer_is_raised_again(sig):
    """A Ctrl-C (or SIGTERM) whose handler runs inside a weakref callback or a __del__ (an import's
    module lock, say, while the model loads) is swallowed there by Python ("Exception ignored in");
    it is sent again and stops the run where it is next (CI once saw a run go on to exit 0)."""
    import weakref

    from gage_eval.engine.interrupts import ctrl_c_interrupts, interrupt_of, sigterm_interrupts

    class Thing:
        pass

    swallowed = []

    def callback(ref):
        try:
            signal.raise_signal(sig)  # the handler runs here, inside the callback
        finally:
            swallowed.append(True)

    thing = Thing()
    ref = weakref.ref(thing, callback)
    with pytest.raises(KeyboardInterrupt) as caught:
        with ctrl_c_interrupts(), sigterm_interrupts():
            del thing
            for _ in range(1000):  # the signal sent again is raised here, in the run's own code
                time.sleep(0.001)
    assert swallowed and ref() is None
    assert interrupt_of(caught.value) is caught.value
    assert getattr(caught.value, "exit_status", 130) == (143 if sig == signal.SIGTERM else 130)


def test_an_interrupt_while_the_writers_end_leaves_a_summary_that_says_so(tmp_path):
    """SIGTERM while the samples files close, before summary.json is written (or while it is): the
    summary is written saying what stopped the run, as the process's exit status does."""
    from gage_eval.api import Writer
    from gage_eval.engine.interrupts import Interrupted
    from gage_eval.runfolder.writers import SummaryWriter, WriterSet

    class Cut(Writer):
        def end(self, summary):
            raise Interrupted("terminated (SIGTERM)", 143)

    with pytest.raises(Interrupted):
        WriterSet([Cut(), SummaryWriter(tmp_path)], []).end({"run": {"interrupted": None, "exit_status": 0}})
    run = json.loads((tmp_path / "summary.json").read_text())["run"]
    assert (run["interrupted"], run["exit_status"]) == ("terminated (SIGTERM)", 143)


def test_sigterm_while_the_summary_is_built_is_recorded_in_it(tmp_path, monkeypatch):
    """The data files are hashed again as the summary is built (a large file: seconds): a SIGTERM
    then waits for the summary and is recorded in it; none was written before."""
    import os

    from gage_eval.engine import summary as summary_module
    from gage_eval.engine.interrupts import Interrupted, sigterm_interrupts
    from gage_eval.engine.loop import Engine, RunOptions

    def hashed_again(fingerprint):
        os.kill(os.getpid(), signal.SIGTERM)
        return []

    monkeypatch.setattr(summary_module, "changed_data", hashed_again)
    data = rows_file(tmp_path / "rows.jsonl", 4)
    (tmp_path / "r").mkdir()
    with sigterm_interrupts():
        try:
            got = Engine(RunOptions(tasks=["piqa"], model="dummy", data={"piqa": str(data)}, quiet=True),
                         tmp_path / "r").run()
        except Interrupted:  # (not let through: pytest would stop the session)
            pytest.fail("the SIGTERM stopped the summary's build: summary.json was not written")
    stored = json.loads((tmp_path / "r" / "summary.json").read_text())["run"]
    assert (got["run"]["exit_status"], stored["exit_status"], stored["interrupted"]) == (143, 143, "terminated (SIGTERM)")
