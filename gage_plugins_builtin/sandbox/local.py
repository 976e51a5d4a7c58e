"""The local sandbox: each job in a bubblewrap container on this machine.

No network and no other namespace shared (``--unshare-all``); the system's ``/usr`` and the
Python interpreter read-only; nothing else of the host (no home folder, no ``/etc``, no run
folder); a fresh tmpfs working folder ``/work`` holding the job's files, and a tmpfs ``/tmp``;
a new PID namespace, so every process the job started dies with it. Limits are rlimits
(``prlimit``) and the caller's wall time and output caps. The process limit counts every process
of a uid on the machine (and root is exempt), so run as root each job runs as a uid of its own,
unused elsewhere; run as a user, the limit is the user's processes now plus the job's.
"""
from __future__ import annotations

import itertools
import os
import shutil
import stat
import sys
import tempfile
import threading
from dataclasses import replace
from pathlib import Path, PurePosixPath

from gage_eval.api import GageError, execution
from gage_plugins_builtin.sandbox.process import prlimit_args, run_limited

INSTALL = ("the local code sandbox needs bubblewrap and prlimit: apt-get install bubblewrap util-linux "
           "(Debian, Ubuntu), dnf install bubblewrap util-linux (Fedora)")
UID_BASE = 1_000_000  # run as root, each job runs as its own unused uid: the process limit counts per uid
SETUP_FAILED = "\x1egage-sandbox: setup failed"
# written on stderr as the command starts, before anything it prints: a stderr without it is the launcher's
# (a program printing SETUP_FAILED itself made a wrong answer the row's error, left out of the mean)
STARTED = "\x1egage-sandbox: started\n"
# copy the files in, run the row's setup, then the command; "$1" is the setup script (its own tools
# found on the system's PATH: a row's sandbox.env may set PATH for its setup and command)
# (a copy that fails, as when the files do not fit the working folder, is the row's failure too)
LAUNCHER = ('PATH=/usr/bin:/bin cp -R /in/. /work/ 2>/tmp/.setup.log || { printf "%s the job\'s files could not be '
            'copied into its working folder /work\\n" "$SETUP_FAILED" >&2; PATH=/usr/bin:/bin tail -c 800 /tmp/.setup.log '
            '>&2; exit 125; }; cd /work; s="$1"; shift; '
            'if [ -n "$s" ]; then /bin/sh -c "$s" </dev/null >/tmp/.setup.log 2>&1 || '
            '{ printf "%s sandbox.setup failed (exit %s)\\n" "$SETUP_FAILED" "$?" >&2; PATH=/usr/bin:/bin tail -c 800 '
            '/tmp/.setup.log >&2; exit 125; }; PATH=/usr/bin:/bin rm -f /tmp/.setup.log; fi; printf %s "$STARTED" >&2; unset SETUP_FAILED STARTED; exec "$@"')
IMAGE_REFUSED = ("the local sandbox runs no container image (the row's sandbox.image is {image!r}); run the "
                 "task with a sandbox plugin that runs images (sandbox: NAME in the metric's args or the tool's "
                 "tool_args, registered through gage_register_sandboxes), or drop sandbox.image to run on this "
                 "machine's Python")


def _world_usable(path: Path) -> bool:
    """Whether a user other than the owner can reach ``path`` (every folder above it searchable)."""
    try:
        parts = [path, *path.parents]
        return all(p.stat().st_mode & stat.S_IXOTH for p in parts) and bool(path.stat().st_mode & stat.S_IROTH)
    except OSError:
        return False


class LocalSandbox(execution.Sandbox):
    """``python``: the interpreter jobs run (default: this one, or /usr/bin/python3 when the sandbox
    user cannot reach this one)."""

    name = "local"

    def __init__(self, python: str | None = None):
        self.root = os.geteuid() == 0
        self.python = str(Path(python or self._default_python()).resolve())
        self._checked = False
        self._uids = itertools.cycle(range(UID_BASE + (os.getpid() % 4000) * 1000,
                                           UID_BASE + (os.getpid() % 4000) * 1000 + 1000))
        self._lock = threading.Lock()

    def _user(self) -> int | None:
        if not self.root:
            return None
        with self._lock:
            return next(self._uids)

    def _default_python(self) -> str:
        own = Path(sys.executable).resolve()
        if not self.root or _world_usable(own):
            return str(own)
        return shutil.which("python3", path="/usr/bin:/bin") or str(own)

    def _binds(self) -> list[str]:
        args = ["--ro-bind", "/usr", "/usr"]
        for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
            if os.path.islink(top):
                args += ["--symlink", os.readlink(top), top]
            elif os.path.isdir(top):
                args += ["--ro-bind", top, top]
        prefix = Path(self.python).parent.parent
        if not str(prefix).startswith("/usr/") and str(prefix) != "/usr":
            args += ["--ro-bind", str(prefix), str(prefix)]
        return args

    def argv(self, job: execution.Job, stage: str) -> list[str]:
        """The whole command line: prlimit, bwrap with its binds and environment, the launcher."""
        disk = str(job.limits.disk_mb << 20)
        env = {"PATH": f"{Path(self.python).parent}:/usr/local/bin:/usr/bin:/bin", "HOME": "/work",
               "TMPDIR": "/tmp", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", **job.env,
               "SETUP_FAILED": SETUP_FAILED, "STARTED": STARTED}
        args = [shutil.which("bwrap") or "bwrap", "--unshare-all", "--die-with-parent", "--new-session",
                "--cap-drop", "ALL", "--hostname", "sandbox", *self._binds(), "--proc", "/proc", "--dev", "/dev",
                "--size", disk, "--tmpfs", "/tmp", "--size", disk, "--tmpfs", "/work",
                "--ro-bind", stage, "/in", "--chdir", "/work", "--clearenv"]
        for key, value in env.items():
            args += ["--setenv", str(key), str(value)]
        command = [self.python if c == execution.Job.PYTHON and i == 0 else c for i, c in enumerate(job.command)]
        return prlimit_args(job.limits) + args + ["/bin/sh", "-c", LAUNCHER, "sh", job.setup or "", *command]

    def check(self) -> None:
        if self._checked:
            return
        for tool in ("bwrap", "prlimit"):
            if shutil.which(tool) is None:
                raise GageError(f"{tool} is not installed; {INSTALL}")
        probe = self.run(execution.Job(command=(execution.Job.PYTHON, "-c", "print(6 * 7)"),
                                       limits=execution.Limits(wall_s=30.0, cpu_s=10.0)))
        if probe.status != "exited" or probe.exit_code != 0 or probe.stdout.strip() != "42":
            said = (probe.reason or probe.stderr.strip() or probe.stdout.strip())[-300:]
            raise GageError(f"the local code sandbox (bubblewrap) cannot run {self.python} here: {said} (user "
                            f"namespaces may be disabled: sysctl kernel.unprivileged_userns_clone=1, or "
                            f"kernel.apparmor_restrict_unprivileged_userns=0)")
        self._checked = True

    def run(self, job: execution.Job) -> execution.JobResult:
        if job.image:
            return execution.JobResult(execution.Status.ERROR, reason=IMAGE_REFUSED.format(image=job.image))
        stage = tempfile.mkdtemp(prefix="gage-sandbox-")
        try:
            os.chmod(stage, 0o755)
            bad = _write_files(Path(stage), job.files)
            if bad:
                return execution.JobResult(execution.Status.ERROR, reason=bad)
            limits = job.limits if self.root else job.limits.replace(processes=job.limits.processes + _own_processes())
            result = run_limited(self.argv(replace(job, limits=limits), stage), job.stdin, job.limits,
                                 env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, user=self._user())
        finally:
            shutil.rmtree(stage, ignore_errors=True)
        before, started, after = result.stderr.partition(STARTED)  # (first: anything bwrap itself said)
        if started:
            return replace(result, stderr=before + after)
        if SETUP_FAILED in result.stderr:
            said, _, log = result.stderr.split(SETUP_FAILED, 1)[1].strip().partition("\n")
            if not said.startswith("sandbox.setup"):  # the copy: its last line says why (cp repeats itself)
                log = log.strip().rpartition("\n")[2] + (f" (limits.disk_mb: {job.limits.disk_mb})"
                                                          if "No space left" in log or "size limit" in log else "")
            reason = said + (f": {log.strip()[-300:]}" if log.strip() else "")
            return execution.JobResult(execution.Status.ERROR, result.exit_code, result.stdout, result.stderr, reason,
                             result.wall_s)
        return result


def _own_processes() -> int:
    """How many processes (threads included) this user runs now: the process limit counts them too."""
    uid, n = os.getuid(), 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.stat(f"/proc/{pid}").st_uid == uid:
                n += len(os.listdir(f"/proc/{pid}/task"))
        except OSError:
            continue
    return n


def _write_files(stage: Path, files: dict) -> str:
    """Write the job's files under ``stage``; a path that leaves it, or one that cannot be written
    (a row's file that is the folder of one the caller adds: ``harness.py/x``), is refused (the
    reason, naming no host folder)."""
    for name, text in files.items():
        bad = execution.file_name_problem(name)
        if bad:
            return f"sandbox.files: {bad}"
        target = stage.joinpath(*PurePosixPath(name).parts)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            for folder in [target.parent, *target.parent.parents]:
                if folder == stage:
                    break
                os.chmod(folder, 0o755)
            target.write_text(text, encoding="utf-8")
            os.chmod(target, 0o644)
        except (OSError, ValueError) as exc:  # (a file where a folder goes, or the reverse; text not UTF-8)
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
            return f"sandbox.files: {name!r} cannot be written in the working folder ({why})"
    return ""


