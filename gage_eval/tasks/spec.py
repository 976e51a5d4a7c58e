"""Task folders: discovery and the validated task spec (templates: gage_eval.api.templates)."""
from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

from gage_eval.api.errors import GageError, InputError, KeyedError
from gage_eval.api.jsonio import not_regular
from gage_eval.api.runfolder import folder_name_ok
from gage_eval.api.strictjson import json_type
from gage_eval.api.yamlio import key_line, read_yaml
from gage_eval.api.schemas import validation_errors

TASK_FILE = "task.yaml"


@dataclass(frozen=True)
class TaskSource:
    name: str
    folder: Path
    origin: str  # plugin name, or "--include-path"
    params: Mapping[str, str] | None = None  # one entry of the task file's variants
    tags: tuple[str, ...] = ()


@dataclass(frozen=True)
class TaskSpec:
    """A task folder's ``task.yaml``, validated. Paths in it are relative to ``folder``."""

    name: str
    folder: Path
    origin: str
    description: str
    dataset: dict
    preprocessor: dict
    request: dict
    metrics: list
    judge: dict | None = None
    requires: tuple[str, ...] = ()
    primary_metric: str | None = None
    cluster_by: str | None = None  # stderr.cluster_by: a sample field whose values cluster the rows
    params: Mapping[str, str] = field(default_factory=dict)  # the variant's parameters (templates: params)
    repeats: Mapping[str, Any] = field(default_factory=dict)  # task.yaml repeats as {n, pass_at, maj_at, generation}
    raw: dict = field(default_factory=dict, repr=False)

    @property
    def kind(self) -> str:
        return self.request["kind"]

    def capabilities_needed(self) -> set[str]:
        needed = {self.kind} | set(self.requires)
        if self.request.get("chat"):
            needed.add("chat")
        return needed


def metric_entry(entry: Any) -> Any:
    """A task.yaml metric entry in gage-eval's form (a name, or ``{name, as, args}``). Spec 004's
    forms (its sections 7.5 and 10.11.2) are read as it: ``{metric_id, implementation, params}`` is
    ``{name: implementation or metric_id, as: metric_id, args: params}``, the call string
    ``"regex_match(pattern='\\d+')"`` is ``{name: regex_match, args: {pattern: ...}}`` (literal
    keyword values only), and ``{numeric_match: {tolerance: 0.1}}`` is ``{name: numeric_match,
    args: {tolerance: 0.1}}``. ``ValueError`` for a call string that is not one."""
    if isinstance(entry, str):
        return _call_entry(entry) if "(" in entry else entry
    if not isinstance(entry, dict) or "name" in entry:
        return entry
    if "metric_id" not in entry:
        if len(entry) == 1:  # {metric: {params}}
            (name, params), = entry.items()
            return {"name": name, **({"args": dict(params)} if params else {})}
        return entry
    out: dict[str, Any] = {"name": entry.get("implementation") or entry["metric_id"]}
    if entry["metric_id"] != out["name"]:
        out["as"] = entry["metric_id"]
    if entry.get("params"):
        out["args"] = dict(entry["params"])
    return out


def _call_entry(text: str) -> dict:
    import ast
    import warnings

    try:
        with warnings.catch_warnings():  # '\d' in a pattern is meant as written: no escape warning
            warnings.simplefilter("ignore")
            call = ast.parse(text.strip(), mode="eval").body
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)) or call.args:
            raise ValueError
        args = {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}
        if None in args:
            raise ValueError
    except (SyntaxError, ValueError):
        raise ValueError(f"{text!r} is neither a metric name nor a call NAME(key=literal, ...)") from None
    return {"name": call.func.id, **({"args": args} if args else {})}


def metric_entries(path: Any, entries: list) -> list:
    out = []
    for i, entry in enumerate(entries):
        try:
            out.append(metric_entry(entry))
        except ValueError as exc:
            raise KeyedError(path, f"metrics.{i}", str(exc)) from None
    return out


def read_task_yaml(path: Path) -> Any:
    """A task.yaml's YAML; a folder, FIFO, socket or device by that name is refused before it is
    opened (a FIFO would block the search for tasks)."""
    special = not_regular(path) or (path.is_dir() and "a folder, not a file")
    if special:
        raise InputError(path, None, special)
    return read_yaml(path)


def read_task_data(folder: Path) -> dict:
    """The task folder's task.yaml as a mapping, read strictly and checked against the task schema."""
    path = folder / TASK_FILE
    data = read_task_yaml(path)
    if data is None:
        raise GageError(f"{path}: the file is empty; a task file needs dataset, request and metrics")
    if not isinstance(data, dict):
        raise GageError(f"{path}: expected a mapping of task settings, got {json_type(data)}")
    problems = validation_errors(data, "task")
    if problems:
        lines = [f"{path}:{key_line(path, where) or 1}: key '{where or '<top>'}': {msg}" for where, msg in problems]
        raise GageError(lines[0] if len(lines) == 1 else "invalid task file:\n  " + "\n  ".join(lines))
    return data


_PLACEHOLDER = re.compile(r"(?<!\{)\{([A-Za-z_][A-Za-z0-9_]*)\}(?!\})")
VARIANT_KEYS = ("name", "tags", "dataset", "fewshot")  # where {param} is replaced


def with_params(value: Any, params: Mapping[str, str]) -> Any:
    """``value`` with each ``{param}`` of a string in it replaced by the variant's value (``{{ x }}``,
    Jinja's, and names that are no parameter are left alone)."""
    if isinstance(value, str):
        return _PLACEHOLDER.sub(lambda m: str(params[m[1]]) if m[1] in params else m[0], value)
    if isinstance(value, list):
        return [with_params(v, params) for v in value]
    if isinstance(value, dict):
        return {k: with_params(v, params) for k, v in value.items()}
    return value


def variant_data(data: dict, params: Mapping[str, str] | None) -> dict:
    """A task file's settings for one of its ``variants`` (the file as it is without one)."""
    if not params:
        return data
    out = {k: v for k, v in data.items() if k not in ("variants", "groups")}
    out.update({k: with_params(data[k], params) for k in VARIANT_KEYS if k in data})
    return out


def read_task_file(folder: Path, origin: str = "", params: Mapping[str, str] | None = None) -> TaskSpec:
    """The task folder's task.yaml, read strictly (:func:`gage_eval.api.yamlio.read_yaml`) and
    checked against the task schema; every problem a GageError naming the file and key.
    ``params``: one entry of the file's ``variants``, put in for its ``{placeholders}``."""
    path = folder / TASK_FILE
    data = read_task_data(folder)
    if data.get("variants") and not params:
        raise GageError(f"{path}: the file is a template of the tasks its 'variants' name; run one of those")
    _check_variant_names(data, folder)
    data = variant_data(data, params)
    if not all(folder_name_ok(part) for part in str(data.get("name", folder.name)).split("/")):  # samples/NAME.jsonl
        raise KeyedError(path, "name", f"{data.get('name')!r} is no task name (letters, digits, _ . - and / between "
                                       f"them, no '.' or '..' part)")
    for key in ("dataset", "judge"):  # (the engine gives the loader and judge the task's folder)
        if isinstance(data.get(key), dict) and "base_dir" in (data[key].get("args") or {}):
            raise KeyedError(path, f"{key}.args.base_dir", "gage-eval sets it (the task's folder); leave it out")
    request = dict(data["request"])
    for key in ("prompt",):
        if key in request and not (folder / request[key]).is_file():
            raise KeyedError(path, f"request.{key}", f"template file {request[key]!r} not found in {folder}")
    return TaskSpec(
        name=data.get("name", folder.name),
        folder=folder,
        origin=origin,
        description=data.get("description", ""),
        dataset=dict(data["dataset"]),
        preprocessor=dict(data.get("preprocessor") or {"name": "identity"}),
        request=request,
        metrics=metric_entries(path, data["metrics"]),
        judge=data.get("judge"),
        requires=tuple(data.get("requires", ())),
        primary_metric=data.get("primary_metric"),
        cluster_by=(data.get("stderr") or {}).get("cluster_by"),
        params=dict(params or {}),
        repeats={"n": data["repeats"]} if isinstance(data.get("repeats"), int) else dict(data.get("repeats") or {}),
        raw=data,
    )


def discover(task_paths: list[tuple[str, str]], include_paths: list[str] = (), warn=None) -> dict[str, TaskSource]:
    """Find task folders: plugin-registered paths in order, then ``--include-path``.

    A later folder with the same task name overrides an earlier one, with a warning.
    """
    warn = warn or (lambda msg: print(f"gage-eval: warning: {msg}", file=sys.stderr))
    found: dict[str, TaskSource] = {}
    roots = list(task_paths) + [("--include-path", p) for p in include_paths]
    for origin, root in roots:
        root_path = Path(root)
        if not root_path.is_dir():
            if origin == "--include-path":
                raise GageError(f"--include-path {root}: not a folder")
            warn(f"plugin {origin!r} registered task folder {root}, which does not exist")
            continue
        for folder in _task_folders(root_path, set()):
            for source in _task_sources(folder, origin):
                name = source.name
                if name in found and found[name].folder.resolve() != folder.resolve():
                    warn(f"task {name!r} from {origin} ({folder}) overrides the one from "
                         f"{found[name].origin} ({found[name].folder})")
                found[name] = source
    return found


def _task_folders(folder: Path, seen: set, depth: int = 0) -> Iterator[Path]:
    """``folder`` when it holds a task.yaml, else the task folders under it, as lm-eval's include path
    is searched: in name order, hidden folders skipped, each real folder once, at most 8 levels down."""
    if os.path.lexists(folder / TASK_FILE):  # (a task.yaml that is no file is reported when read)
        yield folder
        return
    try:
        real = folder.resolve()
        subs = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".") and p.name != "__pycache__")
    except OSError:  # (unreadable: no task there)
        return
    if real not in seen and depth < 8:
        seen.add(real)
        for sub in subs:
            yield from _task_folders(sub, seen, depth + 1)


def _task_sources(folder: Path, origin: str) -> list[TaskSource]:
    """The folder's task, or one task per entry of its ``variants`` (each named by ``name`` with
    the entry's ``{placeholders}`` put in)."""
    try:
        data = read_task_yaml(folder / TASK_FILE)
    except GageError:  # reported when the task is read
        return [TaskSource(folder.name, folder, origin)]
    if not isinstance(data, dict):
        return [TaskSource(folder.name, folder, origin)]
    variants = data.get("variants")
    if not isinstance(variants, list) or not variants:
        name = data["name"] if isinstance(data.get("name"), str) else folder.name
        tags = data.get("tags") if isinstance(data.get("tags"), list) else []
        return [TaskSource(name, folder, origin, tags=tuple(map(str, tags)))]
    out: dict[str, TaskSource] = {}
    for _, name, params, one in _variants(data, folder):  # (a name given twice: its tasks say so when read)
        tags = one.get("tags") if isinstance(one.get("tags"), list) else []
        out.setdefault(name, TaskSource(name, folder, origin, params, tuple(map(str, tags))))
    return list(out.values())


def _variants(data: dict, folder: Path) -> Iterator[tuple[int, str, dict, dict]]:
    """(index, task name, parameters, the task's data) of each entry of ``variants``."""
    for i, params in enumerate(data.get("variants") or []):
        if isinstance(params, dict):  # (else the schema says so when the task is read)
            params = {str(k): str(v) for k, v in params.items()}
            one = variant_data(data, params)
            yield i, one.get("name") if isinstance(one.get("name"), str) else folder.name, params, one


def _check_variant_names(data: dict, folder: Path) -> None:
    """A file whose ``variants`` give one task name twice is refused when any of its tasks is read
    (not when the folder is found: a sibling task still runs)."""
    seen: set[str] = set()
    for i, name, _, _ in _variants(data, folder):
        if name in seen:
            raise KeyedError(folder / TASK_FILE, f"variants.{i}", f"gives task name {name!r} again; "
                             f"put each variant's parameters in 'name' (name: task_{{param}})")
        seen.add(name)


# ---------------------------------------------------------------------------
def parse_data_overrides(values: Any, flag: str = "--data") -> dict[str, str]:
    """``--data TASK=PATH`` pairs (or another flag's, ``--fewshot-data``) as a mapping."""
    out = {}
    for value in values or ():
        task, sep, path = str(value).partition("=")
        if not sep or not task or not path:
            raise GageError(f"{flag} {value!r}: expected TASK=PATH")
        if task in out and out[task] != path:  # (the last one won, silently)
            raise GageError(f"{flag}: task {task!r} is given two files, {out[task]} and {path}; give one")
        out[task] = path
    return out


def dataset_for_path(path: str, split: str | None, registry: Any) -> dict:
    """A dataset section that reads a local file or folder: the first loader (registration order,
    builtins first) whose factory's declared ``for_path(path, split)`` gives its arguments (None:
    not one it reads); ``split`` is the task's own. A loader's declared ``suffixes`` name the
    files it reads, for the message when none does."""
    p = Path(path)
    if not p.exists():
        raise GageError(f"--data: {path} does not exist")
    special = not_regular(p)
    if special:
        raise GageError(f"--data: {path}: {special}; give a data file or a folder of them")
    for name, reg in registry.loaders.items():
        for_path = getattr(reg.factory, "for_path", None)
        args = for_path(p, split) if for_path is not None else None
        if args is not None:
            return {"loader": name, "args": args}
    known = list(dict.fromkeys(s for reg in registry.loaders.values() for s in getattr(reg.factory, "suffixes", ())))
    if not known:
        raise GageError(f"--data: {path}: no loader reads local files (`gage-eval plugins` lists the loaders)")
    listing = ", ".join(known[:-1]) + " or " + known[-1] if len(known) > 1 else known[0]
    if p.is_dir():
        raise GageError(f"--data: {path} holds no {listing} file")
    raise GageError(f"--data: {path}: unsupported file type {p.suffix!r} (use {listing})")


def with_dataset(spec: TaskSpec, dataset: Mapping[str, Any]) -> TaskSpec:
    from dataclasses import replace

    merged = dict(dataset)
    return replace(spec, dataset=merged)
