"""The ``gage-eval`` entry point (the console script, ``python -m gage_eval.cli``).

It handles Ctrl-C before anything heavy is imported: a SIGINT at any moment, the import of the
command line included, ends the process with status 130 and one line, never a traceback. While
a command runs, Ctrl-C raises KeyboardInterrupt as usual (``gage_eval.cli_app``), so a stopped
run still writes the summary of what finished.
"""
from __future__ import annotations

import os
import signal
import sys
import threading

_EXIT_INTERRUPTED = 130  # gage_eval.errors.EXIT_INTERRUPTED, not imported so that nothing comes before the handler


def _leave(signum: int | None = None, frame: object = None) -> None:
    # Outside a command (importing, exiting) there is nothing to save: say so and end at once.
    try:
        sys.stdout.flush()
        sys.stderr.write("gage-eval: interrupted\n")
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001 - a second Ctrl-C or a closed stream must not stop the exit
        pass
    os._exit(_EXIT_INTERRUPTED)


def _ignore_late_ctrl_c() -> None:
    # The last exit handler: the status is decided and every thread has ended; the interpreter's
    # own teardown would let a late SIGINT kill the process (status -2) once its handlers are gone.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def main() -> None:
    """Run ``gage-eval`` on ``sys.argv`` and exit with the documented status."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _leave)
        import atexit

        atexit.register(_ignore_late_ctrl_c)  # registered first, so it runs last
    try:
        from gage_eval.cli_app import run

        run()
    except KeyboardInterrupt:
        _leave()


def __getattr__(name: str):
    # ``from gage_eval.cli import cli``: the click group lives in cli_app, imported only when asked for
    if name in ("cli", "PluginGroup", "option_spellings"):
        from gage_eval import cli_app

        return getattr(cli_app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    main()
