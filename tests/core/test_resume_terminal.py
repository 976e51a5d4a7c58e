"""A resume in a terminal: the model loads when a row first needs it, after the task's progress
bar is drawn; its status lines go above the bar, never onto the bar's line."""
from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONPATH": str(ROOT)}


def in_terminal(*args: str) -> str:
    """What ``gage-eval ARGS`` shows in a 100-column terminal (stderr and stdout)."""
    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))  # (0 columns: tqdm draws nothing)
    proc = subprocess.Popen([sys.executable, "-m", "gage_eval.cli", *args], stdin=subprocess.DEVNULL,
                            stdout=child, stderr=child, env=ENV, cwd=ROOT)
    os.close(child)
    shown = b""
    try:
        while chunk := os.read(main, 65536):
            shown += chunk
    except OSError:  # (EIO: the child closed the terminal)
        pass
    finally:
        os.close(main)
    assert proc.wait(timeout=120) == 0, shown.decode(errors="replace")
    return shown.decode()


def test_loading_the_model_on_resume_is_said_above_the_bar(tmp_path):
    run = [sys.executable, "-m", "gage_eval.cli", "--tasks", "piqa", "--model", "dummy", "--limit", "6", "-o",
           str(tmp_path), "--run-id", "r", "-q"]
    subprocess.run(run, check=True, capture_output=True, env=ENV, cwd=ROOT)
    samples = tmp_path / "r" / "samples" / "piqa.jsonl"
    samples.write_text("".join(samples.read_text().splitlines(keepends=True)[:2]))  # (cut after 2 of 6 rows)
    (tmp_path / "r" / "summary.json").unlink()
    shown = in_terminal("--resume", str(tmp_path / "r"))
    assert "2/6" in shown and "6/6" in shown, shown  # the bar was drawn before the model loaded
    line, = [part for part in shown.split("\n") if "loading model dummy" in part]
    assert line.split("\r")[-2].startswith("gage-eval: loading model dummy"), repr(line)  # (cleared, then written)
