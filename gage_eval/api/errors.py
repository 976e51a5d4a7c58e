"""Errors a user can act on. The CLI prints them without a traceback."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

# The exit statuses of ``gage-eval`` (README, "Exit status"), with the words the console uses.
EXIT_OK, EXIT_ROW_ERRORS, EXIT_USAGE, EXIT_TASK_FAILED, EXIT_OUTPUT, EXIT_INTERNAL = 0, 1, 2, 3, 4, 5
EXIT_INTERRUPTED, EXIT_TERMINATED = 130, 143  # Ctrl-C; SIGTERM (128 + 15)
EXIT_MEANING = {
    EXIT_OK: "every task scored, no row errored",
    EXIT_ROW_ERRORS: "some rows errored",
    EXIT_USAGE: "usage or configuration error",
    EXIT_TASK_FAILED: "a task could not run or scored no row",
    EXIT_OUTPUT: "outputs could not be written",
    EXIT_INTERNAL: "internal error",
    EXIT_INTERRUPTED: "interrupted",
    EXIT_TERMINATED: "terminated",
}


class GageError(Exception):
    """An expected error: bad input, bad configuration, a missing dependency.

    The message says which file, line or key is wrong and what to do about it.
    """

    exit_code = EXIT_USAGE  # nothing ran


class OutputError(GageError):
    """The run cannot write its outputs: a full disk, a read-only or missing folder, a file in the way."""

    exit_code = EXIT_OUTPUT


class InputError(GageError):
    """A file that cannot be read: ``WHERE:LINE: problem`` (``WHERE: problem`` without a line)."""

    def __init__(self, where: str | Path, line: int | None, problem: str):
        super().__init__(f"{where}:{line}: {problem}" if line else f"{where}: {problem}")
        self.where = str(where)
        self.line = line
        self.problem = problem


class KeyedError(GageError):
    """A setting refused: ``WHERE: key 'KEY': problem``, with ``key`` and ``problem`` apart."""

    def __init__(self, where: str | Path, key: str, problem: str):
        super().__init__(f"{where}: key '{key}': {problem}")
        self.key, self.problem = key, problem


class FatalBackendError(GageError):
    """Raised by a backend's ``run`` when no further request can succeed (401/403/404, model not
    found, a server that stopped answering). The engine writes the batch's rows and every row
    still to come as errored with this message, and the run exits non-zero."""

    exit_code = EXIT_TASK_FAILED


def interrupt_reason(stop: BaseException) -> tuple[str, int]:
    """What a KeyboardInterrupt (Ctrl-C, or SIGTERM made one) says stopped the run, and its exit status."""
    return str(stop) or "interrupted by the user (Ctrl-C)", getattr(stop, "exit_status", EXIT_INTERRUPTED)


class FailFast(GageError):
    """``--fail-fast``: the run stopped at the first row that errored (written, as every row is)."""

    exit_code = EXIT_ROW_ERRORS


@dataclass(frozen=True)
class RowError:
    """A dataset row that could not be read; loaders yield it in place of a record."""

    message: str
    stage: str = "load"

    def __str__(self) -> str:
        return self.message


# What a plugin's code may raise into the core during a run and be reported for, the run going
# on without it: any bug, and sys.exit (which would otherwise end the process with a status
# the exit table does not hold). Ctrl-C and SIGTERM (KeyboardInterrupt) still stop the run.
PLUGIN_FAULTS = (Exception, SystemExit)


def fault_text(exc: BaseException) -> str:
    """One line saying what a plugin raised."""
    if isinstance(exc, SystemExit):
        return f"it called sys.exit({exc.code!r})"
    if isinstance(exc, (GageError, OSError)):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the known name closest to a mistyped ``name``; empty when none is close."""
    import difflib

    known = list(known)
    close = [k for k in known if k.lower() == name.lower()] or difflib.get_close_matches(name, known, n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""
