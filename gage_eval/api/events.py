"""Frozen event objects handed to the observer hooks."""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

_ATOMS = (str, int, float, bool, type(None))


def plugin_copy(value: Any) -> Any:
    """A deep copy of what the core hands a plugin (a record, a summary, an event): whatever the
    plugin changes in it never reaches the run's files, counts or exit status."""
    t = type(value)
    if t is dict:
        return {k: v if type(v) in _ATOMS else plugin_copy(v) for k, v in value.items()}
    if t is list:
        return [v if type(v) in _ATOMS else plugin_copy(v) for v in value]
    if t in _ATOMS:
        return value
    return copy.deepcopy(value)


@dataclass(frozen=True)
class RunStart:
    run_id: str
    run_dir: Path
    tasks: tuple[str, ...]
    model: str
    model_id: str = ""  # the backend's model_id (weights or endpoint + model name)
    resume: bool = False  # True when this is a --resume of an interrupted run
    options: Mapping[str, Any] = field(default_factory=dict)  # the plugins' run options (gage_register_options)


@dataclass(frozen=True)
class SampleDone:
    run_id: str
    task: str
    sample_id: str
    error: str | None
    metrics: Mapping[str, Any]
    record: Mapping[str, Any] | None = None  # the record as written to samples/<task>.jsonl (do not change it)


@dataclass(frozen=True)
class TaskDone:
    run_id: str
    task: str
    counts: Mapping[str, int]
    metrics: Mapping[str, Any]
    #: True: samples/<task>.jsonl holds this run's records of the task in its data's order, the n-th
    #: record the n-th row that passed its checks (none kept from before a resume, none out of turn)
    in_data_order: bool = False


@dataclass(frozen=True)
class RunEnd:
    run_id: str
    run_dir: Path
    summary: Mapping[str, Any]
