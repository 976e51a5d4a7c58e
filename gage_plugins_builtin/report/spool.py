"""The sample browser's data, written out while the samples files are read: each sample's compact
JSON goes to a temporary binary file as soon as it is made, and the page copies it from there in
the page's order (per run and task, by the row's position in the data). Where that order is the
samples file's own (a task the engine wrote in the data's order), a task's samples are one stretch
of the file, already with their positions, and nothing is kept per sample; another task keeps each
sample's place and id until the rows read again give the positions (:class:`.reread.Reread`), then
its samples are copied in that order. So memory stays flat however many samples a run in the
data's order holds."""
from __future__ import annotations

import re
from array import array
from typing import Any, Iterator, Mapping

__all__ = ["Spool", "position_key", "row_position"]

_BLOCK = 1 << 20  # bytes copied at a time from a stretch in the page's order


class _InOrder:
    """A task's samples in the page's order: one stretch of the spool, separated by commas."""

    __slots__ = ("fh", "start", "end", "n")

    def __init__(self, fh: Any) -> None:
        self.fh = fh
        self.start = self.end = fh.tell()
        self.n = 0

    def add(self, data: bytes) -> None:
        """The next sample's JSON (UTF-8), its position already in it."""
        self.end += self.fh.write(b"," + data if self.n else data)
        self.n += 1

    def texts(self, positions: Mapping[str, int] | None, task: str) -> Iterator[bytes]:
        fh = self.fh
        fh.seek(self.start)
        left = self.end - self.start
        while left > 0:
            block = fh.read(min(_BLOCK, left))
            if not block:  # (the spool is this page's own temporary file: never shorter)
                raise OSError("the report's spool file ended early")
            left -= len(block)
            yield block


class _Unplaced:
    """A task's samples in the samples file's order, each with its place in the spool and its id,
    sorted by their positions in the data when those are known."""

    __slots__ = ("fh", "offsets", "lengths", "ids", "n")

    def __init__(self, fh: Any) -> None:
        self.fh = fh
        self.offsets, self.lengths, self.ids = array("q"), array("q"), []
        self.n = 0

    def add(self, data: bytes, sid: str) -> None:
        """The next sample's JSON (UTF-8, without its position) and its id."""
        self.offsets.append(self.fh.tell())
        self.lengths.append(len(data))
        self.ids.append(sid)
        self.fh.write(data)
        self.n += 1

    def texts(self, positions: Mapping[str, int] | None, task: str) -> Iterator[bytes]:
        fh = self.fh
        where = [row_position(sid, task, positions) for sid in self.ids]
        order = sorted(range(self.n), key=lambda i: (position_key(where[i]), i))
        for j, i in enumerate(order):
            fh.seek(self.offsets[i])
            data = fh.read(self.lengths[i])
            if where[i] is not None:  # the row's position in its data, for the card's heading
                data = data[:-1] + b',"p":%d}' % where[i]
            yield b"," + data if j else data


class Spool:
    """The samples' compact JSON of every task of the page, task by task in the page's order."""

    def __init__(self, fh: Any):
        self.fh = fh
        self.tasks: list[tuple[int, str, _InOrder | _Unplaced]] = []  # (run, task, its samples)

    def task(self, run: int, task: str, in_order: bool) -> Any:
        """Where the samples of the page's next task go: ``add(json)`` in the page's order (each
        with its position), else ``add(json, sample id)``."""
        part = _InOrder(self.fh) if in_order else _Unplaced(self.fh)
        self.tasks.append((run, task, part))
        return part

    @property
    def n(self) -> int:
        return sum(part.n for _, _, part in self.tasks)

    def texts(self, positions: Mapping[tuple[int, str], Mapping[str, int]]) -> Iterator[bytes]:
        """Every sample's JSON (UTF-8), comma-separated, in the page's order: a task not in order sorted by
        ``positions[(run, task)]`` (a sample without a position last, in the samples file's order)."""
        first = True
        for run, task, part in self.tasks:
            if not part.n:
                continue
            if not first:
                yield b","
            first = False
            yield from part.texts(positions.get((run, task)), task)


def row_position(sid: str, task: str, positions: Mapping[str, int] | None) -> int | None:
    """A sample's position in its data: from ``positions``, else from the core's id of a row that
    never became a sample (``<task>-row-<n>``); None when not known."""
    if positions is not None and sid in positions:
        return positions[sid]
    m = re.fullmatch(re.escape(task) + r"-row-(\d+)", sid)
    return int(m.group(1)) if m else None


def position_key(position: int | None) -> float:
    """A position as a sort key: an unknown one after every known one."""
    return float("inf") if position is None else position
