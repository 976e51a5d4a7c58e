"""The command line: the ``gage-eval`` group and its options (``app``; core commands imported only
when they run), the run, resume and dry-run commands (``run``, ``dryrun``), ``validate``, the
listings ``tasks`` and ``plugins`` (``commands``), and lm-evaluation-harness's
spellings (``conventions``). This module is the entry point (the console script,
``python -m gage_eval.cli``).

It handles Ctrl-C before anything heavy is imported: a SIGINT at any moment, the import of the
command line included, ends the process with status 130 and one line, never a traceback. While
a command runs, Ctrl-C raises KeyboardInterrupt as usual (``gage_eval.cli.app``), so a stopped
run still writes the summary of what finished.
"""
from __future__ import annotations

import os
import sys

# Only what the interpreter has already loaded comes before the handler: not gage_eval.api.errors
# (EXIT_INTERRUPTED), not ``signal`` (it imports enum), not ``threading``.
_EXIT_INTERRUPTED = 130


def _leave(signum: int | None = None, frame: object = None) -> None:
    # Outside a command (importing, exiting) there is nothing to save: say so and end at once.
    try:
        sys.stdout.flush()
        sys.stderr.write("gage-eval: interrupted\n")
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001 - a second Ctrl-C or a closed stream must not stop the exit
        pass
    os._exit(_EXIT_INTERRUPTED)


def _end(status: int, signum: int | None = None, frame: object = None) -> None:
    # The command has ended with ``status`` (its summary says so): a Ctrl-C while the interpreter
    # tears down ends it at once with that same status.
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001 - as in _leave
        pass
    os._exit(status)


def _ignore_late_ctrl_c() -> None:
    # The last exit handler: the status is decided and every thread has ended; the interpreter's
    # own teardown would let a late SIGINT kill the process (status -2) once its handlers are gone.
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _forget_handled_interrupt() -> None:
    # CPython remembers a KeyboardInterrupt that crossed an exec() or eval() of a string (a
    # dataclass or namedtuple being made while a module imports) and at exit kills the process
    # with SIGINT even though it was handled: the status would read -2, not the one decided.
    try:
        import ctypes

        ctypes.c_int.in_dll(ctypes.pythonapi, "_Py_UnhandledKeyboardInterrupt").value = 0
    except (ImportError, AttributeError, ValueError, OSError):  # another interpreter or build
        pass


def _on_ctrl_c(handler) -> bool:
    """Make ``handler`` SIGINT's; False (nothing changed) outside the main thread."""
    try:
        import _signal as signals  # CPython's C module: ``signal`` would import enum first
    except ImportError:  # pragma: no cover - another interpreter
        import signal as signals
    try:
        signals.signal(signals.SIGINT, handler)
    except ValueError:  # not the main thread: the caller's handling stays
        return False
    return True


def main() -> None:
    """Run ``gage-eval`` on ``sys.argv`` and exit with the documented status."""
    in_main = _on_ctrl_c(_leave)
    if in_main:
        import atexit

        atexit.register(_ignore_late_ctrl_c)  # registered first, so it runs last
    status = 0
    try:
        from gage_eval.cli.app import run

        run()
    except KeyboardInterrupt:
        _leave()
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
        raise
    finally:
        if in_main:
            import functools

            _on_ctrl_c(functools.partial(_end, status))
            _forget_handled_interrupt()


def __getattr__(name: str):
    # ``from gage_eval.cli import cli``: the click group lives in cli_app, imported only when asked for
    if name in ("cli", "PluginGroup", "option_spellings"):
        from gage_eval.cli import app as cli_app
        return getattr(cli_app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

