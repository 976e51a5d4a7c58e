"""``--num-fewshot K``: solved examples drawn from a task's few-shot source (``fewshot:`` in task.yaml).

The source is a file of rows (``path``, relative to the task folder) or another split of the
task's own dataset (``split``); its rows go through the task's preprocessor and row checks
like the evaluated rows, and a row that fails them fails the task (a silently smaller pool
would change which examples are drawn). A run may name another source for a task
(``--fewshot-data TASK=PATH``, run config ``fewshot_data``): a file or folder of rows read in
place of the task's, with the task's sampler, seed and delimiter. A task whose split no source
holds (offline, no data package with it) may name a ``fallback`` file of its folder and what
its rows are (``note``); the note is said on the console and kept in summary.json.

Sampling follows lm-evaluation-harness (0.4.x), so the same pool, rows and seed give the same examples:

- ``random`` (the default): one ``random.Random(seed)`` stream per task; the row at position
  ``i`` of the data gets the ``i``-th draw of ``rnd.sample(pool, K + 1)``, from which the
  evaluated sample is dropped (compared by content: messages, options, references) and the
  first ``K`` are kept. lm-eval draws ``K + 1`` this way whenever a task's ``fewshot_split``
  equals its ``test_split`` (piqa, hellaswag and most tasks evaluated on a validation split
  set neither); for a task with a test split and another few-shot split (arc, openbookqa,
  sciq) it draws ``K`` and leaves nothing out, which a task file asks for with
  ``leave_out_evaluated: false``.
- ``first_n``: the first ``K`` rows of the pool other than the evaluated sample.

Draws depend only on the seed and the row's position, never on which rows were run before,
so a resumed run gets the same examples (the stream is replayed up to the position asked).
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from gage_eval.api.errors import GageError
from gage_eval.tasks.spec import TASK_FILE, TaskSpec

SAMPLERS = ("random", "first_n")
DEFAULT_DELIMITER = "\n\n"  # lm-eval's fewshot_delimiter


@dataclass(frozen=True)
class FewShotConfig:
    """The ``fewshot:`` section of a task file."""

    path: str | None = None
    split: str | None = None
    sampler: str = "random"
    seed: int | None = None
    delimiter: str = DEFAULT_DELIMITER
    leave_out_evaluated: bool = True  # draw K + 1 and drop the evaluated sample (False: draw K)
    fallback: str | None = None  # a file of the task folder read when no source holds ``split``
    fallback_note: str = ""  # what the fallback's rows are, said wherever they are used
    given: str | None = None  # "--fewshot-data TASK=PATH": the run named the source

    @classmethod
    def from_spec(cls, spec: TaskSpec, given_path: str | None = None) -> "FewShotConfig | None":
        """The task's ``fewshot:`` section, or the run's ``given_path`` for it (None: the task's)."""
        raw = spec.raw.get("fewshot") if spec.raw else None
        if raw is None and given_path is None:
            return None
        raw = raw if isinstance(raw, dict) else {}
        drawn = {"sampler": raw.get("sampler", "random"), "seed": raw.get("seed"),  # (the task's, whatever the rows)
                 "delimiter": raw.get("delimiter", DEFAULT_DELIMITER),
                 "leave_out_evaluated": raw.get("leave_out_evaluated", True)}
        if given_path is not None:
            return cls(path=given_path, given=f"--fewshot-data {spec.name}={given_path}", **drawn)
        if ("path" in raw) == ("split" in raw):
            raise GageError(f"{spec.folder / TASK_FILE}: key 'fewshot': give exactly one of 'path' (a file of rows "
                            f"in the task folder) or 'split' (another split of the task's dataset)")
        fallback = raw.get("fallback") or {}  # (read only for a split: a file of the folder is always there)
        return cls(path=raw.get("path"), split=raw.get("split"), fallback=fallback.get("path"),
                   fallback_note=fallback.get("note", ""), **drawn)


@dataclass
class Pool:
    """A loaded few-shot source: its samples, the source in words (for messages), the source as
    summary.json's ``tasks.NAME.source.fewshot`` keeps it, and a console line when the source
    is not the task's usual one (a run's file, a fallback)."""

    rows: list[dict]
    described: str
    source: dict
    note: str | None = None


def content_key(sample: Mapping[str, Any]) -> str:
    """What makes two samples the same question (lm-eval compares documents by equality)."""
    return json.dumps([sample.get("messages"), sample.get("options"), sample.get("references")],
                      sort_keys=True, ensure_ascii=False, default=str)


class FewShotSampler:
    """Draws the examples of each evaluated row from a pool of samples (see the module docstring)."""

    def __init__(self, pool: Sequence[dict], k: int, *, sampler: str = "random", seed: int = 1234,
                 where: str = "the few-shot source", leave_out: bool = True):
        if sampler not in SAMPLERS:
            raise GageError(f"{where}: sampler {sampler!r} is not one of {', '.join(SAMPLERS)}")
        self.leave_out = leave_out
        self._drawn = k + 1 if leave_out else k
        need = self._drawn if sampler == "random" else k
        if need > len(pool):
            extra = " (K + 1 are drawn for each row, to leave the evaluated sample out)" if need > k else ""
            raise GageError(f"--num-fewshot {k}: {where} has only {len(pool)} rows{extra}; "
                            f"ask for fewer examples or give a larger source")
        self.pool = list(pool)
        self.k = k
        self.sampler = sampler
        self.seed = seed
        self._keys = [content_key(s) for s in self.pool]
        self._positions = list(range(len(self.pool)))
        self._rnd: random.Random | None = None
        self._next = 0  # the row position the stream's next draw belongs to
        self._last: tuple[int, list[int]] | None = None

    def examples(self, sample: Mapping[str, Any], index: int) -> list[dict]:
        """The ``k`` example samples for the evaluated ``sample`` at data position ``index``.
        Raises ValueError when leaving out copies of the sample leaves fewer than ``k``."""
        if self.k <= 0:
            return []
        chosen = self._positions if self.sampler == "first_n" else self._draw(index)
        if self.leave_out:
            own = content_key(sample)
            chosen = [p for p in chosen if self._keys[p] != own]
        chosen = chosen[:self.k]
        if len(chosen) < self.k:
            raise ValueError(f"only {len(chosen)} few-shot examples are left once the copies of this sample "
                             f"are left out, and {self.k} were asked for")
        return [self.pool[p] for p in chosen]

    def _draw(self, index: int) -> list[int]:
        if self._last is not None and self._last[0] == index:
            return self._last[1]
        if self._rnd is None or index < self._next:
            self._rnd, self._next = random.Random(self.seed), 0
        while self._next < index:  # replay the draws of the rows before (a resumed or skipped-to row)
            self._rnd.sample(self._positions, self._drawn)
            self._next += 1
        drawn = self._rnd.sample(self._positions, self._drawn)
        self._next += 1
        self._last = (index, drawn)
        return drawn


def load_pool(spec: TaskSpec, config: FewShotConfig, registry: Any) -> Pool:
    """The pool of samples the examples are drawn from. Every failure is a GageError naming
    the task file's ``fewshot`` key (or the ``--fewshot-data`` that named the source)."""
    where = config.given or f"{spec.folder / TASK_FILE}: key 'fewshot'"
    if config.path is not None:
        return _file_pool(spec, config.path, where, "" if config.given else ".path", registry,
                          {"from": "--fewshot-data" if config.given else "task"})
    raw_dataset = dict(spec.raw.get("dataset") or spec.dataset)
    args = dict(raw_dataset.get("args") or {})
    args["split"] = config.split
    described = f"split {config.split!r} of the task's dataset"
    try:
        loader = registry.build("loaders", raw_dataset.get("loader"), where, **args, base_dir=str(spec.folder))
    except GageError as exc:
        if config.fallback is None:
            raise
        why = str(exc).splitlines()[0].removeprefix(f"{where}: ").split("; ")[0]  # (not the loader's hints)
        pool = _file_pool(spec, config.fallback, where, ".fallback.path", registry,
                          {"from": "task", "instead_of": {"split": config.split, "why": why},
                           "note": config.fallback_note})
        pool.note = (f"few-shot examples from {pool.source['path']} ({config.fallback_note or 'not the task split'}), "
                     f"since split {config.split!r} could not be read ({why}); --fewshot-data {spec.name}=PATH "
                     f"names other rows")
        return pool
    source = getattr(loader, "source", None)
    rows = _checked(spec, loader, registry, where, described)
    return Pool(rows, described, {"from": "task", "split": config.split, "rows": len(rows),
                                  **({"dataset": dict(source)} if isinstance(source, Mapping) else {})})


def _file_pool(spec: TaskSpec, name: str, where: str, key: str, registry: Any, source: dict) -> Pool:
    """A pool read from a file or folder of rows (relative to the task folder); ``key`` is
    the part of the task file's ``fewshot`` section that names it."""
    from gage_eval.tasks.spec import dataset_for_path

    path = Path(name).expanduser()
    path = path if path.is_absolute() else spec.folder / path
    if not path.exists():
        raise GageError(f"{where}{key}: {name!r} does not exist (looked for {path})")
    try:
        dataset = dataset_for_path(str(path), None, registry)
    except GageError as exc:
        raise GageError(f"{where}{key}: {exc}") from None
    described = f"the few-shot file {path}"
    loader = registry.build("loaders", dataset["loader"], where, **(dataset.get("args") or {}),
                            base_dir=str(spec.folder))
    rows = _checked(spec, loader, registry, where, described)
    note = f"few-shot examples from {source['from']} {path}" if source["from"] == "--fewshot-data" else None
    return Pool(rows, described, {**source, "path": str(path), "rows": len(rows)}, note)


def _checked(spec: TaskSpec, loader: Any, registry: Any, where: str, described: str) -> list[dict]:
    """The loader's rows through the task's preprocessor and row checks; a bad row fails the task."""
    from gage_eval.tasks.rows import RowChecker

    pre = spec.preprocessor or {"name": "identity"}
    preprocess = registry.build("preprocessors", pre["name"], where, **(pre.get("args") or {}))
    data_dir = Path(getattr(loader, "data_dir", None) or spec.folder)
    checker = RowChecker(spec.name, preprocess, base_dir=data_dir)
    pool: list[dict] = []
    try:
        for index, (locator, record) in enumerate(loader):
            row = checker.check(locator, index, record)
            if not row.ok:
                raise GageError(f"{where}: {described}: {locator}: {row.stage} error: {row.message}")
            pool.append(row.sample)
    finally:
        checker.close()
    return pool
