"""Errors a user can act on. The CLI prints them without a traceback."""
from __future__ import annotations

from dataclasses import dataclass


class GageError(Exception):
    """An expected error: bad input, bad configuration, a missing dependency.

    The message says which file, line or key is wrong and what to do about it.
    """


class FatalBackendError(GageError):
    """Raised by a backend's ``run`` when no further request can succeed (401/403/404, model not
    found, a server that stopped answering). The engine writes the batch's rows and every row
    still to come as errored with this message, and the run exits non-zero."""


@dataclass(frozen=True)
class RowError:
    """A dataset row that could not be read; loaders yield it in place of a record."""

    message: str
    stage: str = "load"

    def __str__(self) -> str:
        return self.message
