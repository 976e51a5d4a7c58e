"""The loader and preprocessor contracts: what the engine reads from a dataset loader and from
a preprocessor. Deriving from these is optional (any iterable of ``(locator, record)`` pairs is
a loader, any ``(record, context) -> dict`` callable a preprocessor); they declare the defaults."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Mapping

from gage_eval.api.sample import RowContext, normalize_references


class Loader:
    """A dataset: ``(locator, record)`` pairs, read lazily.

    ``locator`` is a short string such as ``"data.jsonl:17"`` that every error about the row
    names; ``record`` is a dict, or a :class:`~gage_eval.api.errors.RowError` for a row that could
    not be read (reported and counted, never dropped).
    """

    #: the folder relative media paths in rows resolve against (``RowContext.base_dir``);
    #: None: the task folder
    data_dir: str | Path | None = None
    #: read when :meth:`files` says None: a path, a list of paths, or a mapping of split to
    #: path(s) (the Hugging Face ``data_files`` shape); only existing files count
    data_files: Any = None
    #: where the rows come from, recorded in summary.json (``tasks.NAME.source.dataset``): a
    #: mapping such as ``{"from": "package", "id": ..., "config": ..., "split": ..., "path": ...}``;
    #: None: not said
    source: dict | None = None
    #: the same in words, said once on the console when the run starts; None: nothing said
    source_note: str | None = None

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        raise NotImplementedError(f"{type(self).__name__} does not implement __iter__")

    def files(self) -> list[Path] | None:
        """The local files the rows come from, hashed into inputs.json so that ``--resume``
        refuses changed data; None: not known (``data_files`` is read instead)."""
        return None

    def total(self) -> int | None:
        """The number of rows when known cheaply (the progress bar, a fractional ``--limit``);
        None: unknown."""
        return None


class Preprocessor:
    """Turns one dataset record into a Sample v1 dict: ``preprocessor(record, context)``."""

    #: the format records must be in (a schema name: ``sample``, ``legal_eval_v1``, a plugin's);
    #: rows invalid in it are validate errors and never reach the preprocessor. None: any.
    input_schema: str | None = None

    def data_roots(self, base_dir: Path) -> list[Path]:
        """Folders besides ``base_dir`` that the rows' media files may lie in."""
        return []

    def __call__(self, record: Any, ctx: RowContext) -> dict:
        raise NotImplementedError(f"{type(self).__name__} does not implement __call__")


class SampleIdentity(Preprocessor):
    """For datasets already in Sample v1 form: the row is the sample (the builtin ``identity``
    preprocessor, and what ``validate --schema sample`` reads rows with).

    Required fields are never filled in or coerced: a row without ``id`` or
    ``schema_version``, or with ``references`` that is not a list, is an error naming the
    field. String reference items are written in their structured form
    (``{"answer": [text segment]}``), which means the same. Paths in the row's media
    segments are resolved and confined by the row checker (:mod:`gage_eval.tasks.rows`).
    """

    input_schema = "sample"  # rows are checked against Sample v1 before this runs

    def __call__(self, record: Mapping[str, Any], ctx: RowContext) -> dict:
        from gage_eval.api.schemas import field_message, sample_v1_required_errors

        problems = sample_v1_required_errors(record)
        if problems:
            raise ValueError("; ".join(field_message(where, what) for where, what in problems))
        sample = dict(record)
        sample["references"] = normalize_references(sample["references"])
        return sample

