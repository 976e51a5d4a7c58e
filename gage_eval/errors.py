"""Errors a user can act on. The CLI prints them without a traceback."""
from __future__ import annotations

from dataclasses import dataclass


class GageError(Exception):
    """An expected error: bad input, bad configuration, a missing dependency.

    The message says which file, line or key is wrong and what to do about it.
    """

    exit_code = 2  # a usage or configuration error: nothing ran


class OutputError(GageError):
    """The run cannot write its outputs: a full disk, a read-only or missing folder, a file in the way."""

    exit_code = 4


class FatalBackendError(GageError):
    """Raised by a backend's ``run`` when no further request can succeed (401/403/404, model not
    found, a server that stopped answering). The engine writes the batch's rows and every row
    still to come as errored with this message, and the run exits non-zero."""

    exit_code = 3


class FailFast(GageError):
    """``--fail-fast``: the run stopped at the first row that errored (written, as every row is)."""

    exit_code = 1


@dataclass(frozen=True)
class RowError:
    """A dataset row that could not be read; loaders yield it in place of a record."""

    message: str
    stage: str = "load"

    def __str__(self) -> str:
        return self.message
