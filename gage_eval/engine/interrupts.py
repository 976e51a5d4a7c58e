"""Ctrl-C and SIGTERM: both stop a run the same way, so the summary of what finished is written."""
from __future__ import annotations

import sys
from typing import Any, Callable

from gage_eval.api.errors import (EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_OUTPUT, EXIT_TERMINATED, GageError,
                                  interrupt_reason)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) or SIGTERM: raised where the run was, handled like Ctrl-C everywhere;
    ``exit_status`` is what the process exits with."""

    def __init__(self, message: str, exit_status: int = EXIT_INTERRUPTED):
        super().__init__(message)
        self.exit_status = exit_status


class _Signals:
    """The last Ctrl-C or SIGTERM raised by the handlers here: a library may turn the interrupt into
    an error of its own (transformers' lazy imports raise ModuleNotFoundError, a Rust extension whose
    import was cut short PanicException), and the run is still stopped as interrupted."""

    last: KeyboardInterrupt | None = None
    holding = 0  # > 0 inside held(): an interrupt waits in `pending` until the block ends
    pending: KeyboardInterrupt | None = None
    hook: Callable[[Any], None] | None = None  # the unraisablehook before the handlers' (_deliver_again)


def _raise(interrupt: KeyboardInterrupt) -> None:
    _Signals.last = interrupt
    if _Signals.holding:
        _Signals.pending = _Signals.pending or interrupt
        return
    raise interrupt


class held:
    """Within the block a Ctrl-C or SIGTERM (under the handlers here) waits until the block ends,
    then is raised: what the block does together (a record written and counted) is never half
    done, so the summary counts every record the files hold."""

    def __enter__(self) -> "held":
        _Signals.holding += 1
        return self

    def __exit__(self, kind: Any, *exc: Any) -> None:
        _Signals.holding -= 1
        if not _Signals.holding and _Signals.pending is not None:
            interrupt, _Signals.pending = _Signals.pending, None
            if kind is None:  # (a block that failed raises its own error; interrupt_of still finds this)
                raise interrupt


def _on_sigterm(signum: int, frame: Any) -> None:
    _raise(Interrupted("terminated (SIGTERM)", EXIT_TERMINATED))


def _on_sigint(signum: int, frame: Any) -> None:
    _raise(KeyboardInterrupt())


def _deliver_again(unraisable: Any) -> None:
    """sys.unraisablehook within the handlers: an interrupt raised while Python ran a finalizer or a
    weakref callback (an import's module lock, say) is swallowed there ("Exception ignored in"),
    and the run would go on; its signal is sent again, to be raised where the run is next."""
    import _thread
    import signal
    import threading

    interrupt = unraisable.exc_value
    if isinstance(interrupt, KeyboardInterrupt) and interrupt is _Signals.last:
        terminated = getattr(interrupt, "exit_status", None) == EXIT_TERMINATED
        # from another thread, a moment later: sent from here, its handler would run inside this
        # hook, and Python would swallow it again
        threading.Timer(0.01, _thread.interrupt_main, (signal.SIGTERM if terminated else signal.SIGINT,)).start()
    else:
        (_Signals.hook or sys.__unraisablehook__)(unraisable)


class _signal_raises:
    """Within the block, ``signum`` raises through ``handler``. Main thread only."""

    signum_name = ""
    handler: Callable[[int, Any], None]

    def __enter__(self):
        import signal
        import threading

        self._old = None
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(getattr(signal, self.signum_name), type(self).handler)
            self._old_hook, sys.unraisablehook = sys.unraisablehook, _deliver_again
            if self._old_hook is not _deliver_again:
                _Signals.hook = self._old_hook
        return self

    def __exit__(self, *exc: Any) -> None:
        import signal

        if self._old is not None:
            signal.signal(getattr(signal, self.signum_name), self._old)
            sys.unraisablehook = self._old_hook


class sigterm_interrupts(_signal_raises):
    """Within the block, SIGTERM interrupts the run as Ctrl-C does (the summary of what finished
    is written), instead of killing the process where it stands. Main thread only."""

    signum_name, handler = "SIGTERM", _on_sigterm


class ctrl_c_interrupts(_signal_raises):
    """Within the block, Ctrl-C raises KeyboardInterrupt (as Python's own handler does) and is
    remembered for :func:`interrupt_of`. Main thread only."""

    signum_name, handler = "SIGINT", _on_sigint

    def __enter__(self):
        _Signals.last = None
        return super().__enter__()


def interrupt_of(exc: BaseException) -> KeyboardInterrupt | None:
    """The interrupt behind ``exc``: itself when it is one, else the Ctrl-C or SIGTERM that came
    (under :class:`ctrl_c_interrupts` or :class:`sigterm_interrupts`) and was turned into ``exc``."""
    if isinstance(exc, KeyboardInterrupt):
        return exc
    return None if isinstance(exc, SystemExit) else _Signals.last


def stop_reason(exc: BaseException, clean: Callable[[str], str]) -> tuple[str, int]:
    """What stopped a run, in one line with secrets masked by ``clean``, and the exit status
    that goes with it."""
    interrupt = interrupt_of(exc)
    if interrupt is not None:
        return interrupt_reason(interrupt)
    if isinstance(exc, GageError):
        return clean(str(exc)), exc.exit_code
    if isinstance(exc, OSError):
        return clean(f"{exc.filename or ''}: {exc.strerror or exc}"), EXIT_OUTPUT
    return clean(f"internal error: {type(exc).__name__}: {exc}"), EXIT_INTERNAL
