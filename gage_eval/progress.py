"""A one-line progress bar on stderr when it is a terminal; silent otherwise."""
from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, label: str, total: int | None = None, quiet: bool = False, start: int = 0,
                 stream=None):
        self.stream = stream or sys.stderr
        self.enabled = not quiet and self.stream.isatty()
        self.label = label
        self.total = total
        self.count = start
        self._t0 = time.monotonic()
        self._last = 0.0
        self._done_now = 0

    def update(self, n: int = 1) -> None:
        self.count += n
        self._done_now += n
        now = time.monotonic()
        if self.enabled and now - self._last > 0.2:
            self._last = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        rate = self._done_now / max(now - self._t0, 1e-9)
        total = f"/{self.total}" if self.total else ""
        self.stream.write(f"\r{self.label}: {self.count}{total} samples, {rate:.1f}/s ")
        self.stream.flush()

    def message(self, text: str) -> None:
        """A line that must be seen (a row error): printed even when not a terminal."""
        if self.enabled:
            self.stream.write("\r\033[K")
        self.stream.write(f"gage-eval: {text}\n")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self._draw(time.monotonic())
            self.stream.write("\n")
            self.stream.flush()
