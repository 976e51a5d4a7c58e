"""A run's settings (saved as config.json, reloaded by --resume) and its id."""
from __future__ import annotations

import copy
import time
import uuid
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Callable, Iterable

from gage_eval.config.defaults import DEFAULT_OUTPUT_DIR, DEFAULT_SEED
from gage_eval.api.errors import GageError
from gage_eval.api.strictjson import json_type

@dataclass
class RunOptions:
    """Everything that decides what a run does; saved as config.json for --resume."""

    tasks: list[str]
    model: str = ""  # the backend; the command line fills in the one a plugin declares the default
    model_args: dict = field(default_factory=dict)
    judge_model: str | None = None
    judge_args: dict = field(default_factory=dict)
    batch_size: int | str | None = None
    limit: int | float | None = None  # a row count, or a fraction in (0, 1] of each task's rows (--max-samples)
    shuffle: bool = False  # --shuffle: --limit takes a seeded random choice of rows, not the first ones
    shuffle_seed: int | None = None  # --shuffle-seed: the choice's seed (set whenever shuffle is; default --seed)
    output_dir: str = DEFAULT_OUTPUT_DIR
    run_id: str | None = None
    seed: int = DEFAULT_SEED
    include_paths: list[str] = field(default_factory=list)
    data: dict = field(default_factory=dict)
    fewshot_data: dict = field(default_factory=dict)  # --fewshot-data: task -> the file --num-fewshot draws from
    task_overrides: dict = field(default_factory=dict)
    fail_fast: bool = False
    max_error_rate: float = 0.0
    allow_paths: list[str] = field(default_factory=list)
    allow_urls: bool = False
    # prompt controls (issue 12): None / empty means "as the task file says"
    system_prompt: str | None = None
    gen_kwargs: dict = field(default_factory=dict)  # merged over each task's request.generation
    num_fewshot: int | None = None
    repeats: int | None = None  # answers drawn per row (None: as each task's ``repeats`` says)
    fewshot_as_multiturn: bool | None = None  # None: multi-turn whenever the chat template is on (lm-eval)
    apply_chat_template: bool | None = None  # None: the task's request.chat
    strip_reasoning: bool = False  # score the text after the last </think>; the raw text stays in the record
    writers: list[str] = field(default_factory=list)  # plugin writers: NAME or NAME:k=v,... (--writer)
    # the plugins' own options (gage_register_options) by key; config.json keeps them flat, beside these
    plugin_options: dict = field(default_factory=dict)
    shard: str | None = None  # --shard I/N: only the rows whose sample id hashes to shard I of N
    executor: str = "local"  # --executor: the model in this process, or as replicas on a Ray cluster (ray)
    quiet: bool = False
    command: str = ""
    config_file: str | None = None

    def as_dict(self) -> dict:
        """The settings as config.json and summary.json hold them: the plugins' options flat among
        the core's (a resume tells them apart by the keys the plugins declare)."""
        out: dict = {}
        for f in fields(self):
            if f.name == "plugin_options":
                out.update(copy.deepcopy(self.plugin_options))
            else:
                out[f.name] = copy.deepcopy(getattr(self, f.name))
        return out


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]



_ANNOTATION_TYPES = {"list": (list, "a list"), "dict": (dict, "an object"), "str": (str, "a string"),
                     "int": (int, "an integer"), "float": ((int, float), "a number"), "bool": (bool, "true or false"),
                     "None": (type(None), "null")}


def load_options(run_dir: Path, command: str | None = "--resume", plugin_keys: Iterable[str] = ()) -> RunOptions:
    """The run's options from its config.json, each key of the type RunOptions declares. A problem
    is one GageError, led by ``command`` and the folder (as ``--resume DIR: ...``) when given.
    ``plugin_keys``: the keys of the loaded plugins' run options, which go to ``plugin_options``."""
    from gage_eval.api.runfolder import MissingRunFile, RunFolder

    folder = RunFolder(run_dir)
    path, lead = folder.config_file, f"{command} {run_dir}: " if command else ""
    try:
        data = folder.config()
    except MissingRunFile:
        raise GageError(f"{lead or f'{run_dir}: '}no config.json there; is it a gage-eval run folder?") from None
    except GageError as exc:
        if not command:
            raise
        raise GageError(f"{lead}{path} is unreadable ({exc}); the run cannot be resumed") from None
    known = {f.name: f for f in fields(RunOptions) if f.name != "plugin_options"}
    plugin = {k: data.pop(k) for k in list(data) if k in set(plugin_keys) - set(known)}
    extra = sorted(set(data) - set(known))
    if "tasks" not in data or extra:
        raise GageError(f"{lead}{path}: not a gage-eval run config" + (
            f" (unknown keys: {', '.join(extra)}; a run option of a plugin not loaded now? install it again "
            f"to resume)" if extra else " (no 'tasks')"))
    for key, value in data.items():
        names = [part.strip().split("[")[0] for part in str(known[key].type).split("|")]
        kinds = [_ANNOTATION_TYPES[n] for n in names if n in _ANNOTATION_TYPES]
        if kinds and not any(isinstance(value, t) and not (isinstance(value, bool) and t in (int, (int, float)))
                             for t, _ in kinds):
            raise GageError(f"{lead}{path}: key {key!r}: expected {' or '.join(w for _, w in kinds)}, "
                            f"got {json_type(value)}")
    for i, task in enumerate(data["tasks"]):
        if not isinstance(task, str):
            raise GageError(f"{lead}{path}: key 'tasks[{i}]': expected a string, got {json_type(task)}")
    return RunOptions(**data, plugin_options=plugin)


def parse_shard(text: str | None, where: str = "--shard") -> str | None:
    """``I/N`` (0 <= I < N) checked and normalised; None stays None."""
    if text is None:
        return None
    index, slash, count = str(text).partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        i = n = -1
    if not slash or n < 1 or not 0 <= i < n:
        raise GageError(f"{where}: expected I/N with 0 <= I < N (e.g. 0/4), got {text!r}")
    return f"{i}/{n}"


def shuffled_pick(count: int, keep: int, seed: int) -> Callable[[int], bool]:
    """Which of ``count`` rows (by position) a shuffled ``--limit keep`` takes: the rows come in
    a seeded random order, sha256 of ``"seed:position"`` (the same on any machine and Python),
    and the first ``keep`` of that order are taken; a larger ``keep`` takes a superset. Memory
    holds the smaller of the taken and the left-out positions."""
    import hashlib
    import heapq

    def key(i: int) -> tuple[int, int]:
        return int.from_bytes(hashlib.sha256(f"{seed}:{i}".encode()).digest()[:8], "big"), i

    if keep >= count:
        return lambda i: True
    if keep <= count - keep:
        taken = frozenset(heapq.nsmallest(keep, range(count), key=key))
        return taken.__contains__
    left_out = frozenset(heapq.nlargest(count - keep, range(count), key=key))
    return lambda i: i not in left_out


def in_shard(sample_id: str, shard: str) -> bool:
    """Whether a row belongs to ``shard`` (``I/N``): a stable hash of its sample id, so every
    shard of a run, on any machine, splits the rows the same way."""
    import hashlib

    index, _, count = shard.partition("/")
    digest = hashlib.sha256(str(sample_id).encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") % int(count) == int(index)
