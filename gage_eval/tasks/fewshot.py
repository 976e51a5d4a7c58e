"""``--num-fewshot K``: solved examples drawn from a task's few-shot source (``fewshot:`` in task.yaml).

The source is a file of rows (``path``, relative to the task folder) or another split of the
task's own dataset (``split``); its rows go through the task's preprocessor and row checks
like the evaluated rows, and a row that fails them fails the task (a silently smaller pool
would change which examples are drawn).

Sampling follows lm-evaluation-harness (0.4.x), so the same pool, rows and seed give the same examples:

- ``random`` (the default): one ``random.Random(seed)`` stream per task; the row at position
  ``i`` of the data gets the ``i``-th draw of ``rnd.sample(pool, K + 1)``, from which the
  evaluated sample is dropped (compared by content: messages, options, references) and the
  first ``K`` are kept. lm-eval draws ``K + 1`` this way whenever a task's ``fewshot_split``
  equals its ``test_split`` (piqa, hellaswag and most tasks evaluated on a validation split
  set neither); for a task with a test split and another few-shot split it draws ``K``, so
  such a task's examples differ from lm-eval's.
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

    @classmethod
    def from_spec(cls, spec: TaskSpec) -> "FewShotConfig | None":
        raw = spec.raw.get("fewshot") if spec.raw else None
        if raw is None:
            return None
        where = f"{spec.folder / TASK_FILE}: key 'fewshot'"
        if ("path" in raw) == ("split" in raw):
            raise GageError(f"{where}: give exactly one of 'path' (a file of rows in the task folder) "
                            f"or 'split' (another split of the task's dataset)")
        return cls(path=raw.get("path"), split=raw.get("split"), sampler=raw.get("sampler", "random"),
                   seed=raw.get("seed"), delimiter=raw.get("delimiter", DEFAULT_DELIMITER))


def content_key(sample: Mapping[str, Any]) -> str:
    """What makes two samples the same question (lm-eval compares documents by equality)."""
    return json.dumps([sample.get("messages"), sample.get("options"), sample.get("references")],
                      sort_keys=True, ensure_ascii=False, default=str)


class FewShotSampler:
    """Draws the examples of each evaluated row from a pool of samples (see the module docstring)."""

    def __init__(self, pool: Sequence[dict], k: int, *, sampler: str = "random", seed: int = 1234,
                 where: str = "the few-shot source"):
        if sampler not in SAMPLERS:
            raise GageError(f"{where}: sampler {sampler!r} is not one of {', '.join(SAMPLERS)}")
        need = k + 1 if sampler == "random" else k
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
        own = content_key(sample)
        chosen = [p for p in chosen if self._keys[p] != own][:self.k]
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
            self._rnd.sample(self._positions, self.k + 1)
            self._next += 1
        drawn = self._rnd.sample(self._positions, self.k + 1)
        self._next += 1
        self._last = (index, drawn)
        return drawn


def load_pool(spec: TaskSpec, config: FewShotConfig, registry: Any) -> tuple[list[dict], str]:
    """The pool's samples and a description of the source for messages. Every failure is a
    GageError naming the task file's ``fewshot`` key."""
    from gage_eval.tasks.rows import RowChecker
    from gage_eval.tasks.spec import dataset_for_path

    where = f"{spec.folder / TASK_FILE}: key 'fewshot'"
    raw_dataset = dict(spec.raw.get("dataset") or spec.dataset)
    if config.path is not None:
        path = Path(config.path).expanduser()
        path = path if path.is_absolute() else spec.folder / path
        if not path.exists():
            raise GageError(f"{where}.path: {config.path!r} does not exist (looked for {path})")
        try:
            dataset = dataset_for_path(str(path), None, registry)
        except GageError as exc:
            raise GageError(f"{where}.path: {exc}") from None
        described = f"the few-shot file {path}"
    else:
        args = dict(raw_dataset.get("args") or {})
        args["split"] = config.split
        dataset = {"loader": raw_dataset.get("loader"), "args": args}
        described = f"split {config.split!r} of the task's dataset"
    loader = registry.build("loaders", dataset["loader"], where, **(dataset.get("args") or {}),
                    base_dir=str(spec.folder))
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
    return pool, described
