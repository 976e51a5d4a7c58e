"""Running generated code: the sandbox contract a plugin implements (``gage_register_sandboxes``)
and the lookup of the registered sandboxes a metric runs code in.

A sandbox runs one :class:`Job` (a command, the files of a fresh working folder, stdin, the row's
``sandbox.setup`` and ``env``) under :class:`Limits` and returns a :class:`JobResult`; it never
raises for what the code did (a crash, a timeout, a fork bomb are results). ``run`` is called
from several threads at once. The name ``unsandboxed`` is reserved for the sandbox that runs code
on this machine as the user: :func:`open_sandbox` returns it only when the run allows it (the
run option ``allow_unsandboxed_code``, ``--allow-unsandboxed-code``, which the plugin that
registers ``unsandboxed`` declares), and says so on every run.
"""
from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, ClassVar, Mapping

from gage_eval.api import registered
from gage_eval.api.errors import GageError
from gage_eval.api.options import run_value

UNSANDBOXED = "unsandboxed"
ALLOW_UNSANDBOXED, UNSANDBOXED_FLAG = "allow_unsandboxed_code", "--allow-unsandboxed-code"
PYTHON = "python"  # a Job's command[0] naming the sandbox's own Python interpreter

# how a job ended: the command exited (any status), ran past the wall time, printed past the
# output limit, or could not be run at all (the sandbox's own failure: a setup that failed, ...)
EXITED, TIMEOUT, OUTPUT_LIMIT, ERROR = "exited", "timeout", "output_limit", "error"


class Status:
    """A :class:`JobResult`'s ``status`` values, by name."""

    EXITED, TIMEOUT, OUTPUT_LIMIT, ERROR = EXITED, TIMEOUT, OUTPUT_LIMIT, ERROR


@dataclass(frozen=True)
class Limits:
    """What a job may use. Every process the job starts is gone when it ends."""

    wall_s: float = 10.0  # the whole job, setup included
    cpu_s: float = 10.0  # per process (RLIMIT_CPU)
    memory_mb: int = 1024  # address space per process (RLIMIT_AS)
    processes: int = 64  # processes and threads alive at once (RLIMIT_NPROC)
    open_files: int = 64  # per process (RLIMIT_NOFILE)
    output_bytes: int = 1 << 20  # stdout and stderr together; past it the job is killed
    disk_mb: int = 64  # the working folder and /tmp

    def replace(self, **changes: Any) -> "Limits":
        known = set(self.__dataclass_fields__)
        unknown = sorted(set(changes) - known)
        if unknown:
            raise ValueError(f"unknown limit {', '.join(unknown)}; limits: {', '.join(sorted(known))}")
        return Limits(**{**{k: getattr(self, k) for k in known}, **changes})


NAME_MAX, PATH_MAX = 255, 4000  # bytes of one part of a file's name, of the whole (the OS's 4096 less a folder)


def _text_problem(text: str) -> str:
    """Why ``text`` cannot reach a job (a command line, an environment, a file): "" when it can."""
    if "\0" in text:
        return "holds a NUL character"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "holds a lone surrogate (not UTF-8 text)"
    return ""


def file_name_problem(name: str) -> str:
    """Why ``name`` cannot be a file of a job's working folder (Sample v1 ``sandbox.files``): "" when
    it is a relative path that stays inside the folder and the file system takes."""
    parts = PurePosixPath(name).parts
    if "\0" in name or not parts or parts[0] == "/" or ".." in parts:
        return f"{name!r} is not a relative path inside the working folder"
    if why := _text_problem(name):
        return f"{name!r} {why}"
    if len(name.encode()) > PATH_MAX or any(len(p.encode()) > NAME_MAX for p in parts):
        return f"{name[:60]!r}... is longer than a file system takes ({NAME_MAX} bytes a part, {PATH_MAX} in all)"
    return ""


def sandbox_problems(box: Mapping[str, Any]) -> list[tuple[str, str]]:
    """What no sandbox could prepare in a row's Sample v1 ``sandbox`` section (already valid in the
    schema: texts), as (JSON path, message): a file name :func:`file_name_problem` refuses, two names
    of one file (``a``, ``./a``) or a file that is another's folder (``a``, ``a/b``), a NUL or lone
    surrogate in a file, ``env`` or ``setup``, an ``env`` name that is empty or holds ``=``."""
    problems, files = [], box.get("files") or {}
    named = {name: file_name_problem(name) for name in files}
    folders = {str(p) for n, bad in named.items() if not bad for p in PurePosixPath(n).parents}
    seen: dict[str, str] = {}
    for name, text in files.items():
        path = str(PurePosixPath(name))
        bad = named[name] or (f"{name!r} names the same file as {seen[path]!r}" if path in seen else "") \
            or (f"{name!r} is a file and also the folder of another file" if path in folders else "") \
            or (f"{name!r}: its text {why}" if (why := _text_problem(text)) else "")
        seen.setdefault(path, name)
        if bad:
            problems.append(("$.sandbox.files", bad))
    for key, value in (box.get("env") or {}).items():
        if not key or "=" in key or _text_problem(key):
            problems.append(("$.sandbox.env", f"{key!r} is no environment variable name"))
        elif why := _text_problem(value):
            problems.append(("$.sandbox.env", f"{key}: its value {why}"))
    if isinstance(box.get("setup"), str) and (why := _text_problem(box["setup"])):
        problems.append(("$.sandbox.setup", f"the script {why}"))
    return problems


@dataclass(frozen=True)
class Job:
    """One command to run in a fresh working folder holding ``files`` (relative path -> text).
    ``command[0] == "python"`` is the sandbox's Python interpreter."""

    PYTHON: ClassVar[str] = PYTHON
    command: tuple[str, ...]
    files: Mapping[str, str] = field(default_factory=dict)
    stdin: str = ""
    setup: str | None = None  # Sample v1 sandbox.setup: a shell script run first, in the same folder
    env: Mapping[str, str] = field(default_factory=dict)  # Sample v1 sandbox.env
    image: str | None = None  # Sample v1 sandbox.image: only a sandbox that runs images accepts one
    limits: Limits = field(default_factory=Limits)

    @classmethod
    def for_row(cls, box: Mapping[str, Any] | None, command: tuple[str, ...], files: Mapping[str, str] = (),
                **fields: Any) -> "Job":
        """A job in the setting of a row's Sample v1 ``sandbox`` section (``box``): its files (under
        ``files``, which win), setup, env and image, texts as texts."""
        box = box or {}
        return cls(command=command, files={**{str(k): str(v) for k, v in (box.get("files") or {}).items()},
                                           **dict(files)},
                   setup=box.get("setup"), env={str(k): str(v) for k, v in (box.get("env") or {}).items()},
                   image=box.get("image"), **fields)


@dataclass(frozen=True)
class JobResult:
    status: str  # EXITED, TIMEOUT, OUTPUT_LIMIT or ERROR
    exit_code: int | None = None  # negative: killed by that signal
    stdout: str = ""
    stderr: str = ""
    reason: str = ""  # a short reason when the job did not simply exit
    wall_s: float = 0.0


class Sandbox:
    """Contract of a sandbox (``gage_register_sandboxes``). ``isolated`` is False only for one that
    runs code on the host as the user."""

    name: str = "sandbox"
    isolated: bool = True

    def check(self) -> None:
        """Raise :class:`GageError` when this sandbox cannot run here, naming how to install what
        it lacks; called once, before any model work."""

    def run(self, job: Job) -> JobResult:
        raise NotImplementedError

    def close(self) -> None:
        """Release what the sandbox holds (called at exit)."""


_open: dict[tuple, Sandbox] = {}
_lock = threading.Lock()


def open_sandbox(name: str = "local", **args: Any) -> Sandbox:
    """The registered sandbox ``name`` built with ``args`` and checked (one instance per name and
    arguments). When it cannot run here, the unsandboxed one if the run allows it, else a
    GageError that names how to install it and the flag."""
    allowed = bool(run_value(ALLOW_UNSANDBOXED, False))
    key = (name, tuple(sorted((k, repr(v)) for k, v in args.items())), allowed)
    with _lock:
        if key not in _open:
            _open[key] = _checked(name, args, allowed)
        return _open[key]


def check_sandbox(name: Any, args: Any, refuse: Any) -> Sandbox:
    """:func:`open_sandbox` at a task's setup; ``refuse("sandbox" or "sandbox_args", problem)`` for a wrong type."""
    if not isinstance(name, str):
        raise refuse("sandbox", "expected a registered sandbox's name")
    if not isinstance(args, (Mapping, type(None))):
        raise refuse("sandbox_args", "expected a mapping of the sandbox's arguments")
    return open_sandbox(name, **dict(args or {}))


def _build(name: str, args: Mapping[str, Any]) -> Sandbox:
    table = registered.table("sandboxes")
    if name not in table:
        known = ", ".join(sorted(table)) or "none"
        raise GageError(f"unknown sandbox {name!r}; registered sandboxes: {known}")
    return table[name].factory(**args)


def _checked(name: str, args: Mapping[str, Any], allowed: bool) -> Sandbox:
    if name == UNSANDBOXED and not allowed:
        raise GageError(f"sandbox {UNSANDBOXED!r} runs generated code on this machine as you; "
                        f"it needs {UNSANDBOXED_FLAG}")
    sandbox = _build(name, args)
    try:
        sandbox.check()
    except GageError as exc:
        if not allowed:
            raise GageError(f"{exc}; or, at your own risk, run the code on this machine without a sandbox: "
                            f"{UNSANDBOXED_FLAG}") from None
        sandbox = _build(UNSANDBOXED, {})
        print(f"gage-eval: warning: sandbox {name!r} cannot run here ({exc})", file=sys.stderr)
    if not sandbox.isolated:
        print(f"gage-eval: warning: generated code runs UNSANDBOXED on this machine, as you "
              f"({UNSANDBOXED_FLAG})", file=sys.stderr)
    return sandbox
