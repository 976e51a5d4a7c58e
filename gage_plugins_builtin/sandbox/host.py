"""``unsandboxed``: jobs run on this machine as the user, in a fresh temporary folder, with the
same rlimits, wall time and output caps as the local sandbox but no isolation at all (the code can
read and change the user's files and reach the network, and a process it starts in a session of its
own, a daemon, outlives the job: only the job's process group is killed). Used only with
``--allow-unsandboxed-code``."""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from gage_eval.api import execution
from gage_plugins_builtin.sandbox.local import IMAGE_REFUSED, _write_files
from gage_plugins_builtin.sandbox.process import prlimit_args, run_limited


class HostSandbox(execution.Sandbox):
    name = "unsandboxed"
    isolated = False

    def __init__(self, python: str | None = None):
        self.python = python or sys.executable

    def run(self, job: execution.Job) -> execution.JobResult:
        if job.image:
            return execution.JobResult(execution.Status.ERROR, reason=IMAGE_REFUSED.format(image=job.image))
        work = tempfile.mkdtemp(prefix="gage-unsandboxed-")
        try:
            bad = _write_files(Path(work), job.files)
            if bad:
                return execution.JobResult(execution.Status.ERROR, reason=bad)
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": work, "TMPDIR": work,
                   "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", **job.env}
            limits = prlimit_args(job.limits) if shutil.which("prlimit") else []
            if job.setup:
                done = run_limited(limits + ["/bin/sh", "-c", job.setup], "", job.limits, env, cwd=work)
                if done.status != "exited" or done.exit_code != 0:
                    return execution.JobResult(execution.Status.ERROR, done.exit_code, done.stdout, done.stderr,
                                     f"sandbox.setup failed (exit {done.exit_code}): {done.stderr.strip()[-300:]}")
            command = [self.python if c == execution.Job.PYTHON and i == 0 else c for i, c in enumerate(job.command)]
            return run_limited(limits + command, job.stdin, job.limits, env, cwd=work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
