"""Ctrl-C and SIGTERM: both stop a run the same way, so the summary of what finished is written."""
from __future__ import annotations

from typing import Any, Callable

from gage_eval.errors import EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_OUTPUT, EXIT_TERMINATED, GageError


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) or SIGTERM: raised where the run was, handled like Ctrl-C everywhere;
    ``exit_status`` is what the process exits with."""

    def __init__(self, message: str, exit_status: int = EXIT_INTERRUPTED):
        super().__init__(message)
        self.exit_status = exit_status


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Interrupted("terminated (SIGTERM)", EXIT_TERMINATED)


class sigterm_interrupts:
    """Within the block, SIGTERM interrupts the run as Ctrl-C does (the summary of what finished
    is written), instead of killing the process where it stands. Main thread only."""

    def __enter__(self):
        import signal
        import threading

        self._old = None
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGTERM, _on_sigterm)
        return self

    def __exit__(self, *exc: Any) -> None:
        import signal

        if self._old is not None:
            signal.signal(signal.SIGTERM, self._old)



def stop_reason(exc: BaseException, clean: Callable[[str], str]) -> tuple[str, int]:
    """What stopped a run, in one line with secrets masked by ``clean``, and the exit status
    that goes with it."""
    if isinstance(exc, KeyboardInterrupt):
        return str(exc) or "interrupted by the user (Ctrl-C)", getattr(exc, "exit_status", EXIT_INTERRUPTED)
    if isinstance(exc, GageError):
        return clean(str(exc)), exc.exit_code
    if isinstance(exc, OSError):
        return clean(f"{exc.filename or ''}: {exc.strerror or exc}"), EXIT_OUTPUT
    return clean(f"internal error: {type(exc).__name__}: {exc}"), EXIT_INTERNAL
