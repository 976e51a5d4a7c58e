"""Ctrl-C and SIGTERM: both stop a run the same way, so the summary of what finished is written."""
from __future__ import annotations

from typing import Any

from gage_eval.errors import EXIT_INTERRUPTED, EXIT_TERMINATED

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

