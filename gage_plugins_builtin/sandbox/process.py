"""One process tree run under limits: rlimits set by util-linux ``prlimit`` (no ``preexec_fn``: jobs
start from several threads at once), output read with a cap, the whole process group killed at the
wall time or past the output limit."""
from __future__ import annotations

import concurrent.futures.thread  # noqa: F401 (see _kill_live)
import os
import shutil
import signal
import subprocess
import threading
import time
from typing import Any, Sequence

from gage_eval.api import execution

CHUNK = 1 << 16


def prlimit_args(limits: execution.Limits) -> list[str]:
    """``prlimit`` and its options for ``limits`` (the CPU's hard limit a second past its soft one:
    SIGXCPU first, then SIGKILL)."""
    cpu = max(1, int(limits.cpu_s + 0.999))
    memory = limits.memory_mb << 20
    disk = limits.disk_mb << 20
    return [shutil.which("prlimit") or "prlimit", f"--cpu={cpu}:{cpu + 1}", f"--as={memory}:{memory}",
            f"--nproc={limits.processes}", f"--nofile={limits.open_files}", f"--fsize={disk}", "--core=0", "--"]


class _Reader(threading.Thread):
    """Reads one pipe into a buffer; past the shared byte budget it sets ``over`` and stops keeping."""

    def __init__(self, pipe: Any, budget: list[int], over: threading.Event):
        super().__init__(daemon=True)
        self.pipe, self.budget, self.over, self.parts = pipe, budget, over, []

    def run(self) -> None:
        try:
            while True:
                chunk = self.pipe.read1(CHUNK) if hasattr(self.pipe, "read1") else self.pipe.read(CHUNK)
                if not chunk:
                    return
                keep = chunk[:max(0, self.budget[0])]
                self.budget[0] -= len(chunk)
                if keep:
                    self.parts.append(keep)
                if self.budget[0] < 0:
                    self.over.set()
        except (OSError, ValueError):  # the pipe was closed under us after a kill
            return

    def text(self) -> str:
        return b"".join(self.parts).decode("utf-8", errors="replace")


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


_live: set = set()  # the jobs running now
_live_lock = threading.Lock()


def _kill_live() -> None:
    """As the interpreter shuts down (a Ctrl-C or SIGTERM stopped the run, whose rows still scoring
    were dropped for a resume): the jobs still running are killed, not waited for up to their wall
    time (a looping program's 60 s test held a Ctrl-C for a minute)."""
    with _live_lock:
        for proc in list(_live):
            _kill_group(proc)


# before the thread pools running the jobs are joined: threading's exit calls run newest first, and
# the pools' own is registered as concurrent.futures.thread is imported (here, first)
getattr(threading, "_register_atexit", lambda f: None)(_kill_live)


def run_limited(argv: Sequence[str], stdin: str, limits: execution.Limits, env: dict[str, str], cwd: str | None = None,
                user: int | None = None) -> execution.JobResult:
    """Run ``argv`` (already wrapped in ``prlimit``) in a new session; wall time and output capped."""
    t0 = time.perf_counter()
    data = stdin.encode("utf-8")  # (a lone surrogate raises here, before a process is left half started)
    extra: dict[str, Any] = {"user": user, "group": user, "extra_groups": []} if user is not None else {}
    try:
        proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=env, cwd=cwd, start_new_session=True, close_fds=True, **extra)
    except OSError as exc:
        return execution.JobResult("error", reason=f"could not start {argv[0]}: {exc.strerror or exc}")
    with _live_lock:
        _live.add(proc)
    try:
        return _watched(proc, data, limits, t0)
    finally:
        with _live_lock:
            _live.discard(proc)


def _watched(proc: subprocess.Popen, stdin: bytes, limits: execution.Limits, t0: float) -> execution.JobResult:
    budget, over = [limits.output_bytes], threading.Event()
    readers = [_Reader(proc.stdout, budget, over), _Reader(proc.stderr, budget, over)]
    for r in readers:
        r.start()
    threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True).start()
    status, reason = execution.Status.EXITED, ""
    deadline = t0 + limits.wall_s
    while proc.poll() is None:
        if over.is_set():
            status, reason = execution.Status.OUTPUT_LIMIT, f"output past {limits.output_bytes} bytes; killed"
            break
        if time.perf_counter() >= deadline:
            status, reason = execution.Status.TIMEOUT, f"ran past {limits.wall_s:g} s wall time; killed"
            break
        over.wait(0.01)
    _kill_group(proc)  # what the job left behind in its group goes too
    code = proc.wait()
    for r in readers:
        r.join(timeout=2.0)
    for pipe in (proc.stdout, proc.stderr):
        pipe.close()
    if status == execution.Status.EXITED and over.is_set():
        status, reason = execution.Status.OUTPUT_LIMIT, f"output past {limits.output_bytes} bytes; cut"
    return execution.JobResult(status, code if status == execution.Status.EXITED else None, readers[0].text(),
                               readers[1].text(), reason, time.perf_counter() - t0)


def _feed(pipe: Any, data: bytes) -> None:
    try:
        if data:
            pipe.write(data)
        pipe.close()
    except (BrokenPipeError, OSError, ValueError):  # the program did not read its stdin
        pass
