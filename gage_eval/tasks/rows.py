"""One path from a dataset row to a checked Sample v1, shared by a run and ``gage-eval validate``.

:meth:`RowChecker.check` takes what a loader yielded for one row (a record, or a
:class:`~gage_eval.api.errors.RowError`) and returns a :class:`RowResult`: the valid Sample,
or the stage and the problems that make the row an error, and the warnings either way.
The steps, in order:

1. ``load``: the loader could not read the row.
2. ``validate``: a preprocessor that takes rows in a known format (``input_schema``:
   ``sample`` for Sample v1, ``legal_eval_v1``) gets only rows valid in it; required
   Sample v1 fields are never filled in (spec 000).
3. ``preprocess``: the preprocessor raised; its message names the field.
4. ``validate``: the sample it built is Sample v1; it has a reference to score against
   (or ``eval_config.rubric``); every media segment in its messages names a file inside
   the allowed folders that exists, a ``data:`` URL, or an http(s) URL allowed by
   ``--allow-urls`` (:mod:`gage_eval.api.paths`); local paths are rewritten to the resolved
   absolute path, so backends never resolve them against the working directory.
5. ``validate``: its id was not seen before in the task.

A preprocessor may also say which folders, besides the data file's, its rows' files may
lie in (``data_roots(base_dir) -> list[Path]``; the legal task's document roots).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields as dataclass_fields
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from gage_eval.api.errors import GageError, RowError
from gage_eval.api.execution import sandbox_problems
from gage_eval.api.loader import Preprocessor
from gage_eval.api.paths import checked_url
from gage_eval.api.sample import MEDIA_SEGMENTS, RowContext
from gage_eval.api.schemas import SchemaChecks, field_message, sample_v1_row_errors, validation_errors

Problem = tuple[str, str]  # (JSON path such as "$.references", message)
MAX_IN_MESSAGE = 5
TOO_DEEP = "the row is nested too deeply to check"
_new_object = object.__new__
_set_attr = object.__setattr__
_PLAIN_ROW_CONTEXT = not hasattr(RowContext, "__post_init__") and "__slots__" not in vars(RowContext) \
    and [f.name for f in dataclass_fields(RowContext)] == ["task", "locator", "index", "base_dir", "allowed_dirs", "allow_urls"]


@dataclass
class RowResult:
    """The outcome of checking one row: ``sample`` when valid, else ``stage`` and ``problems``.
    ``warnings`` are (JSON path, message) pairs to show either way (unknown top-level keys)."""

    sample: dict | None = None
    stage: str | None = None
    problems: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)
    row_id: str | None = None  # an invalid row's own id (a string), kept in its error record's metadata

    @property
    def ok(self) -> bool:
        return self.sample is not None

    @property
    def message(self) -> str:
        """The problems as one line, each naming its field (``references: expected a list, ...``)."""
        shown = [field_message(where, what) for where, what in self.problems[:MAX_IN_MESSAGE]]
        more = len(self.problems) - MAX_IN_MESSAGE
        return "; ".join(shown) + (f"; and {more} more" if more > 0 else "")


class _Seen:
    """The set of ids seen, when the caller keeps none (an ``IdSet`` has the same ``add``)."""

    def __init__(self) -> None:
        self._ids: set[str] = set()

    def add(self, item: str) -> bool:
        if item in self._ids:
            return False
        self._ids.add(item)
        return True

    def close(self) -> None:
        self._ids.clear()


class RowChecker:
    """Checks the rows of one task (or one file) in order, refusing duplicate ids across them.

    :param task: the task name, handed to the preprocessor in its :class:`RowContext`.
    :param preprocess: ``(record, ctx) -> dict``.
    :param base_dir: the data file's folder: data paths resolve against it and stay in it.
    :param allowed_dirs: further folders data paths may point into (``--allow-path``).
    :param allow_urls: whether http(s) URLs in data may be used (``--allow-urls``).
    :param seen: the ids seen so far (anything with ``add(id) -> bool``, e.g. an ``IdSet``).
    """

    def __init__(self, task: str, preprocess: Callable[[Any, RowContext], Any], *,
                 base_dir: Path | str | None = None, allowed_dirs: Iterable[Path | str] = (),
                 allow_urls: bool = False, seen: Any = None):
        self.task = task
        self.preprocess = preprocess
        self.base_dir = Path(base_dir).resolve() if base_dir is not None else Path.cwd().resolve()
        self.allowed_dirs = tuple(Path(p).expanduser().resolve() for p in allowed_dirs)
        self.allow_urls = bool(allow_urls)
        self.input_schema = getattr(preprocess, "input_schema", None)
        roots_of = getattr(preprocess, "data_roots", None)
        if getattr(roots_of, "__func__", None) is Preprocessor.data_roots:  # the contract's default: none
            roots_of = None
        extra = roots_of(self.base_dir) if callable(roots_of) else ()
        self.roots = tuple(dict.fromkeys([self.base_dir, *([Path(p).resolve() for p in extra] if extra else ())]))
        self.seen = seen if seen is not None else _Seen()
        self._input: SchemaChecks | None = None  # the input schema's checks, looked up at the first row

    def context(self, locator: str, index: int) -> RowContext:
        """The row's :class:`RowContext`, made without the frozen dataclass's six ``object.__setattr__``
        calls (a row at a time): the same object (fields, equality, hash, repr). A RowContext with a
        ``__post_init__`` or ``__slots__`` is made by its constructor."""
        if not _PLAIN_ROW_CONTEXT:
            return RowContext(self.task, locator, index, self.base_dir, self.allowed_dirs, self.allow_urls)
        ctx = _new_object(RowContext)
        _set_attr(ctx, "__dict__", {"task": self.task, "locator": locator, "index": index, "base_dir": self.base_dir,
                                    "allowed_dirs": self.allowed_dirs, "allow_urls": self.allow_urls})
        return ctx

    def check(self, locator: str, index: int, record: Any) -> RowResult:
        if isinstance(record, RowError):
            return RowResult(stage=record.stage, problems=[("", record.message)])
        warnings: list[Problem] = []
        if self.input_schema:
            problems, warnings = self._input_problems(record)
            if problems:
                rid = _row_id(record) if self.input_schema == "sample" else None
                return RowResult(stage="validate", problems=problems, warnings=warnings, row_id=rid)
        ctx = self.context(locator, index)
        try:
            sample = self.preprocess(record, ctx)
        except GageError:
            raise
        except KeyError as exc:
            name = exc.args[0] if exc.args else "?"
            return RowResult(stage="preprocess", problems=[("", f"missing field {name!r}")], warnings=warnings)
        except (ValueError, TypeError) as exc:
            return RowResult(stage="preprocess", problems=[("", str(exc))], warnings=warnings)
        except RecursionError:
            return RowResult(stage="preprocess", problems=[("", "the row is nested too deeply")], warnings=warnings)
        except Exception as exc:  # a preprocessor bug fails its row, not the run
            return RowResult(stage="preprocess", problems=[("", f"{type(exc).__name__}: {exc}")], warnings=warnings)
        problems = self._sample_problems(sample)
        if not problems:
            sample, problems = self._media(sample, ctx)
        if problems:
            return RowResult(stage="validate", problems=problems, warnings=warnings, row_id=_row_id(sample))
        sid = sample["id"]
        if not self.seen.add(sid):
            return RowResult(stage="validate", problems=[("$.id", f"duplicate sample id {sid!r}")], warnings=warnings)
        return RowResult(sample=sample, warnings=warnings)

    def _input_problems(self, record: Any) -> tuple[list[Problem], list[Problem]]:
        """The row's problems and warnings in the rows' format (``input_schema``): Sample v1's
        required-field rules (spec 000) for ``sample``, else the schema's errors; its warnings either way."""
        checks = self._input = self._input or SchemaChecks(self.input_schema)
        try:  # (each check guarded as _guarded does, inlined: a per-row path)
            problems = sample_v1_row_errors(record) if checks.name == "sample" else checks.errors(record)
        except RecursionError:
            problems = [("$", TOO_DEEP)]
        try:
            warnings = checks.warn(record) if checks.warn and isinstance(record, dict) else []
        except RecursionError:
            warnings = [("$", TOO_DEEP)]
        return problems, warnings

    def close(self) -> None:
        close = getattr(self.seen, "close", None)
        if callable(close):
            close()

    def _sample_problems(self, sample: Any) -> list[Problem]:
        if not isinstance(sample, dict):
            return [("", f"the preprocessor returned {type(sample).__name__}, not a Sample v1 object")]
        try:
            problems = validation_errors(sample, "sample")
        except RecursionError:
            problems = [("$", TOO_DEEP)]
        if problems:
            if self.input_schema != "sample":  # a sample built from another format: say whose it is
                where, what = problems[0]
                problems[0] = ("", f"the preprocessor's sample is not valid Sample v1: {field_message(where, what)}")
            return problems
        if not sample["references"] and not (sample.get("eval_config") or {}).get("rubric"):
            return [("$.references", "the list is empty; a sample needs at least one reference (or an "
                                     "eval_config.rubric) to be scored against")]
        if sample.get("sandbox"):  # a file or setting no sandbox could prepare fails the row, before the model runs
            return sandbox_problems(sample["sandbox"])
        return []

    def _media(self, sample: dict, ctx: RowContext) -> tuple[dict, list[Problem]]:
        """Check every media URL the model would be sent; local paths become resolved ones
        (the sample is copied where one changes, never edited in place)."""
        if _text_only(sample.get("messages")) and _text_only(sample.get("unconditioned_input")) \
                and not sample.get("few_shot_examples"):
            return sample, []  # no media segment anywhere: nothing to check or rewrite
        problems: list[Problem] = []
        changes: dict[str, Any] = {}
        for key in ("messages", "unconditioned_input"):
            if isinstance(sample.get(key), list):
                checked = _checked_messages(sample[key], f"$.{key}", ctx, self.roots, problems)
                if checked is not sample[key]:
                    changes[key] = checked
        shots = sample.get("few_shot_examples")
        for i, shot in enumerate(shots if isinstance(shots, list) else []):
            if isinstance(shot, Mapping) and isinstance(shot.get("messages"), list):
                checked = _checked_messages(shot["messages"], f"$.few_shot_examples[{i}].messages", ctx,
                                            self.roots, problems)
                if checked is not shot["messages"]:
                    changes.setdefault("few_shot_examples", list(shots))[i] = {**shot, "messages": checked}
        return ({**sample, **changes} if changes else sample), problems


def _row_id(row: Any) -> str | None:
    """An invalid row's own id, for its error record's ``metadata.row_id``: the record's ``id`` is
    ``TASK-row-N`` all the same, since an invalid row does not take its id (a later, corrected row
    with it runs; records are keyed by id on resume and in compare)."""
    rid = row.get("id") if isinstance(row, dict) else None
    return rid if isinstance(rid, str) and rid else None


def _text_only(messages: Any) -> bool:
    """Whether ``messages`` certainly holds no media segment: not a list, or a list of plain dicts
    whose content is a string or a list of plain-dict ``text`` segments (the per-row fast path;
    anything else is walked by :func:`_checked_messages`)."""
    if type(messages) is not list:
        return not isinstance(messages, list)
    for message in messages:
        if type(message) is not dict:
            return False
        content = message.get("content")
        if type(content) is list:
            for seg in content:
                if type(seg) is not dict or seg.get("type") != "text":
                    return False
        elif isinstance(content, list):
            return False
    return True




def _checked_messages(messages: list, prefix: str, ctx: RowContext, roots: Sequence[Path],
                      problems: list[Problem]) -> list:
    """``messages`` with each media URL checked (a copy only where a URL changed)."""
    out = messages
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, Mapping) else None
        if not isinstance(content, list):
            continue
        new_content = content
        for j, seg in enumerate(content):
            kind = seg.get("type") if isinstance(seg, Mapping) else None
            if kind not in MEDIA_SEGMENTS:
                continue
            ref = seg.get(kind)
            url = ref.get("url") if isinstance(ref, Mapping) else None
            if not isinstance(url, str):
                continue
            where = f"{prefix}[{i}].content[{j}].{kind}.url"
            try:
                checked = checked_url(url, ctx, where[2:], roots=roots)
            except ValueError as exc:
                problems.append((where, str(exc).removeprefix(where[2:] + ": ")))
                continue
            if checked != url:
                new_content = list(content) if new_content is content else new_content
                new_content[j] = {**seg, kind: {**ref, "url": checked}}
        if new_content is not content:
            out = list(messages) if out is messages else out
            out[i] = {**message, "content": new_content}
    return out
