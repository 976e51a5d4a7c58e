"""What a person watching a run sees: a tqdm bar per task in a terminal, a plain line every few
seconds when stderr is a log file, and status lines while a model loads."""
from __future__ import annotations

import os
import sys
import time
from typing import Callable, TextIO

from gage_eval.api.backend import use_token_listener

# seconds between plain progress lines when stderr is not a terminal
def _interval() -> float:
    """GAGE_EVAL_PROGRESS_INTERVAL, or 10; a value that is no positive number is ignored, with a
    warning (it only paces the progress lines: not worth stopping a run for)."""
    text = os.environ.get("GAGE_EVAL_PROGRESS_INTERVAL", "").strip()
    if not text:
        return 10.0
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        print(f"gage-eval: warning: GAGE_EVAL_PROGRESS_INTERVAL={text!r} is not a positive number of seconds; "
              "using 10", file=sys.stderr)
        return 10.0
    return value


PLAIN_INTERVAL = _interval()


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def status(text: str, quiet: bool = False, stream: TextIO | None = None) -> None:
    """A one-line status (loading the model, contacting a server), terminal or not."""
    if quiet:
        return
    if stream is None and Progress.drawn is not None:  # (a resume loads the model under a drawn bar)
        return Progress.drawn.message(text)
    stream = stream or sys.stderr
    stream.write(f"gage-eval: {text}\n")
    stream.flush()


class Progress:
    """Rows finished in one task: ``update`` per finished row, ``message`` for a line that must be seen
    (a row error or warning), ``close`` at the end of the task."""

    drawn: "Progress | None" = None  # the one whose bar is drawn: status lines go above it

    def __init__(self, label: str, total: int | None = None, quiet: bool = False, start: int = 0,
                 stream: TextIO | None = None, interval: float | None = None):
        self.stream = stream or sys.stderr
        self.quiet = quiet
        self.label = label
        self.total = total
        self.count = start
        self.errored = 0
        self._start = start
        self._t0 = time.monotonic()
        self._interval = PLAIN_INTERVAL if interval is None else interval
        self._last_line = self._t0
        self._bar = None
        self._closed = False
        self.tokens = 0  # generated so far (Backend.generated): a long batch moves before its rows finish
        self._shown = self._t0
        if not quiet:
            use_token_listener(self._generated)
        if not quiet and _is_tty(self.stream):
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=start, desc=label, unit="row", file=self.stream,
                             dynamic_ncols=True, mininterval=0.1, smoothing=0.1, leave=True)
            self._quiet_noise = _through_bar(self.message)
            Progress.drawn = self

    def update(self, n: int = 1, errored: bool = False) -> None:
        self.count += n
        if errored:
            self.errored += n
        if self._bar is not None:
            if errored:
                self._bar.set_postfix_str(self._postfix(), refresh=False)
            self._bar.update(n)
        elif not self.quiet:
            now = time.monotonic()
            if now - self._last_line >= self._interval:
                self._last_line = now
                self._line(now)

    def _generated(self, n: int) -> None:
        self.tokens += n
        now = time.monotonic()
        if self._bar is not None and now - self._shown >= 0.2:
            self._shown = now
            self._bar.set_postfix_str(self._postfix())  # (refreshes the bar: its elapsed time moves too)
        elif self._bar is None and now - self._last_line >= self._interval:
            self._last_line = now
            self._line(now)

    def _postfix(self) -> str:
        return ", ".join(part for part in (f"{self.errored} errored" if self.errored else "",
                                           f"{self.tokens} tokens generated" if self.tokens else "") if part)

    def _line(self, now: float, final: bool = False) -> None:
        elapsed = now - self._t0
        done_now = self.count - self._start
        rate = done_now / elapsed if elapsed > 0 else 0.0
        parts = [f"{self.count}/{self.total} rows ({100 * self.count / self.total:.0f}%)" if self.total
                 else f"{self.count} rows"]
        parts.append(f"{rate:.1f} rows/s")
        if self.errored:
            parts.append(f"{self.errored} errored")
        if self.tokens and not final:
            parts.append(f"{self.tokens} tokens generated")
        if final:
            parts.append(("done in " if self.count >= (self.total or 0) else "ended after ") + duration(elapsed))
        elif self.total and rate > 0 and self.count < self.total:
            parts.append(f"ETA {duration((self.total - self.count) / rate)}")
        if not final:
            parts.append(f"elapsed {duration(elapsed)}")
        self.stream.write(f"gage-eval: {self.label}: " + ", ".join(parts) + "\n")
        self.stream.flush()

    def message(self, text: str) -> None:
        """A line that must be seen (a row error): printed even when not a terminal, above the bar."""
        line = f"gage-eval: {text}"
        if self._bar is not None:
            self._bar.write(line, file=self.stream)
        else:
            self.stream.write(line + "\n")
            self.stream.flush()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not self.quiet:
            use_token_listener(None)
        if self._bar is not None:
            self._quiet_noise()
            self._bar.close()
            Progress.drawn = None
        elif not self.quiet:
            self._line(time.monotonic(), final=True)


def _through_bar(say: Callable[[str], None]) -> Callable[[], None]:
    """Library noise (Python warnings, transformers' log lines) printed above the bar instead of
    through it while the bar is drawn; returns what puts things back."""
    import logging
    import warnings

    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):  # (warnings' own signature)
        say(f"{category.__name__}: {message}")

    class Handler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            say(f"{record.name}: {record.getMessage()}")

    logger = logging.getLogger("transformers")
    kept = logger.handlers[:]
    propagate = logger.propagate
    handler = Handler(logging.WARNING)
    warnings.showwarning = show
    if kept:  # transformers set up its stderr handler: ours replaces it while the bar runs
        logger.handlers = [handler]
        logger.propagate = False

    def restore() -> None:
        warnings.showwarning = shown
        if kept:
            logger.handlers, logger.propagate = kept, propagate

    return restore


def close_backends(layers: list, backends: tuple) -> None:
    """Close the plugins' wrappers (outermost first), then each backend once."""
    import gc

    gc.unfreeze()
    for layer in reversed(layers):
        close = getattr(layer, "close", None)
        if close is not None:
            close()
    for b in {id(b): b for b in backends}.values():
        b.close()


def open_backends(roles: tuple, quiet: bool) -> float:
    """Load the model (and the judge's, when it is another backend), saying so; returns the
    seconds it took. ``roles``: (role, backend, name) each."""
    import gc

    t_open = time.perf_counter()
    first = roles[0][1]
    for role, b, name in roles:
        if b is first and role != roles[0][0]:
            continue
        status(f"loading {role} {name} ({b.model_id})...", quiet=quiet)
        t_one = time.perf_counter()
        b.open()
        took, note = time.perf_counter() - t_one, getattr(b, "open_note", None)
        if took >= 1.0 or note:
            status(f"{role} ready in {took:.1f}s" + (f" ({note})" if note else ""), quiet=quiet)
    gc.freeze()  # the model's many long-lived objects need no more collector scans (about 1% of a run)
    return time.perf_counter() - t_open
