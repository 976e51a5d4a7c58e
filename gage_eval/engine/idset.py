"""A set of sample ids whose memory does not grow with the number of ids."""
from __future__ import annotations

import sqlite3

from gage_eval.api.errors import GageError


class IdSet:
    """Exact membership for millions of ids in a private temporary SQLite database.

    The engine must refuse duplicate ids and skip rows already written on resume;
    a Python set of every id would make peak memory grow with the dataset.
    """

    def __init__(self) -> None:
        self._db = sqlite3.connect("")  # "" = a private temporary database that spills to disk
        self._db.execute("PRAGMA cache_size=-1024")  # at most about 1 MiB of pages in memory
        self._db.execute("PRAGMA journal_mode=OFF")
        self._db.execute("PRAGMA synchronous=OFF")
        self._db.execute("CREATE TABLE ids (id TEXT PRIMARY KEY) WITHOUT ROWID")
        self._n = 0
        self._pending = 0

    def add(self, item: str) -> bool:
        """Add ``item``; False when it was already there."""
        cur = self._db.execute("INSERT OR IGNORE INTO ids VALUES (?)", (item,))
        added = cur.rowcount == 1
        if added:
            self._n += 1
            self._pending += 1
            if self._pending >= 1024:
                self._db.commit()
                self._pending = 0
        return added

    def add_once(self, item: str, where: object) -> None:
        """Add ``item``; a GageError naming ``where`` (a resume's samples file) when it was already there."""
        if not self.add(item):
            raise GageError(f"{where}: sample id {item!r} is there twice; the run folder was changed by hand: "
                            f"remove one of its lines")

    def __contains__(self, item: object) -> bool:
        return self._db.execute("SELECT 1 FROM ids WHERE id = ?", (item,)).fetchone() is not None

    def __len__(self) -> int:
        return self._n

    def close(self) -> None:
        self._db.close()
