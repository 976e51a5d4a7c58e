"""Task folders: discovery, the validated task spec, and sandboxed Jinja2 templates."""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from gage_eval.errors import GageError
from gage_eval.schemas import validation_errors

TASK_FILE = "task.yaml"


@dataclass(frozen=True)
class TaskSource:
    name: str
    folder: Path
    origin: str  # plugin name, or "--include-path"


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
    raw: dict = field(default_factory=dict, repr=False)

    @property
    def kind(self) -> str:
        return self.request["kind"]

    def capabilities_needed(self) -> set[str]:
        needed = {self.kind} | set(self.requires)
        if self.request.get("chat"):
            needed.add("chat")
        return needed


def _yaml_line(path: Path, exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    where = f"{path}:{mark.line + 1}" if mark else str(path)
    return f"{where}: invalid YAML: {getattr(exc, 'problem', None) or exc}"


def read_task_file(folder: Path, origin: str = "") -> TaskSpec:
    path = folder / TASK_FILE
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise GageError(_yaml_line(path, exc)) from None
    except OSError as exc:
        raise GageError(f"{path}: cannot read: {exc.strerror}") from None
    if not isinstance(data, dict):
        raise GageError(f"{path}: expected a mapping of task settings, got {type(data).__name__}")
    problems = validation_errors(data, "task")
    if problems:
        lines = "\n".join(f"  {path}: key '{where or '<top>'}': {msg}" for where, msg in problems)
        raise GageError(f"invalid task file {path}:\n{lines}")
    request = dict(data["request"])
    for key in ("prompt",):
        if key in request and not (folder / request[key]).is_file():
            raise GageError(f"{path}: key 'request.{key}': template file {request[key]!r} not found in {folder}")
    return TaskSpec(
        name=data.get("name", folder.name),
        folder=folder,
        origin=origin,
        description=data.get("description", ""),
        dataset=dict(data["dataset"]),
        preprocessor=dict(data.get("preprocessor") or {"name": "identity"}),
        request=request,
        metrics=list(data["metrics"]),
        judge=data.get("judge"),
        requires=tuple(data.get("requires", ())),
        primary_metric=data.get("primary_metric"),
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
        candidates = [root_path] if (root_path / TASK_FILE).is_file() else sorted(
            p for p in root_path.iterdir() if (p / TASK_FILE).is_file())
        for folder in candidates:
            name = _task_name(folder)
            if name in found and found[name].folder.resolve() != folder.resolve():
                warn(f"task {name!r} from {origin} ({folder}) overrides the one from "
                     f"{found[name].origin} ({found[name].folder})")
            found[name] = TaskSource(name, folder, origin)
    return found


def _task_name(folder: Path) -> str:
    try:
        data = yaml.safe_load((folder / TASK_FILE).read_text(encoding="utf-8"))
        if isinstance(data, dict) and isinstance(data.get("name"), str):
            return data["name"]
    except (yaml.YAMLError, OSError):
        pass
    return folder.name


# ---------------------------------------------------------------------------
# Templates
# ---------------------------------------------------------------------------

_env = None


def template_env():
    """A sandboxed Jinja2 environment: templates can format data, not run code."""
    global _env
    if _env is None:
        from jinja2 import StrictUndefined
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        _env = ImmutableSandboxedEnvironment(undefined=StrictUndefined, keep_trailing_newline=False,
                                             autoescape=False)
    return _env


class Template:
    """A compiled template that names its file in every error."""

    def __init__(self, source: str, where: str):
        from jinja2 import TemplateSyntaxError

        self.where = where
        try:
            self._template = template_env().from_string(source)
        except TemplateSyntaxError as exc:
            raise GageError(f"{where}:{exc.lineno}: template syntax error: {exc.message}") from None

    @classmethod
    def from_file(cls, path: Path) -> "Template":
        return cls(path.read_text(encoding="utf-8"), str(path))

    def render(self, **variables: Any) -> str:
        from jinja2 import TemplateError

        try:
            return self._template.render(**variables)
        except TemplateError as exc:
            raise ValueError(f"{self.where}: template error: {exc}") from None


def parse_data_overrides(values: list[str]) -> dict[str, str]:
    """``--data TASK=PATH`` pairs as a mapping."""
    out = {}
    for value in values:
        task, sep, path = value.partition("=")
        if not sep or not task or not path:
            raise GageError(f"--data {value!r}: expected TASK=PATH")
        out[task] = path
    return out


_SHARD = re.compile(r"^(?P<split>[A-Za-z0-9_.]+)-\d{5}-of-\d{5}\.")
DATA_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")


def dataset_for_path(path: str, split: str | None = None) -> dict:
    """A dataset section that reads a local file or folder, picked by its extension.

    In a folder of Hugging Face shards (``validation-00000-of-00001.parquet``) only
    the shards of ``split`` (the task's own split) are read. Local files are
    streamed, so memory does not grow with the file.
    """
    p = Path(path)
    if not p.exists():
        raise GageError(f"--data: {path} does not exist")
    if p.is_file() and p.suffix == ".jsonl":
        return {"loader": "jsonl", "args": {"path": str(p.resolve())}}
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.suffix in DATA_SUFFIXES and f.is_file())
        if not files:
            raise GageError(f"--data: {path} holds no .jsonl, .json, .csv or .parquet file")
        shards = [f for f in files if _SHARD.match(f.name)]
        if shards:
            splits = sorted({_SHARD.match(f.name)["split"] for f in shards})
            want = split if split in splits else (splits[0] if len(splits) == 1 else None)
            if want is None:
                raise GageError(f"--data: {path} holds shards of splits {', '.join(splits)} but the task "
                                f"reads split {split!r}; point at one file or folder")
            files = [f for f in shards if _SHARD.match(f.name)["split"] == want]
        if all(f.suffix == ".jsonl" for f in files) and not shards:
            return {"loader": "jsonl", "args": {"path": str(p.resolve())}}
        kinds = {f.suffix for f in files}
        if len(kinds) > 1:
            raise GageError(f"--data: {path} mixes file types {sorted(kinds)}; point at one kind")
        fmt = files[0].suffix.lstrip(".")
        return {"loader": "hf", "args": {"path": "json" if fmt == "jsonl" else fmt,
                                         "data_files": [str(f.resolve()) for f in files],
                                         "split": "train", "streaming": True}}
    fmt = {".json": "json", ".csv": "csv", ".parquet": "parquet"}.get(p.suffix)
    if fmt is None:
        raise GageError(f"--data: {path}: unsupported file type {p.suffix!r} (use .jsonl, .json, .csv or .parquet)")
    return {"loader": "hf", "args": {"path": fmt, "data_files": [str(p.resolve())], "split": "train",
                                     "streaming": True}}


def with_dataset(spec: TaskSpec, dataset: Mapping[str, Any]) -> TaskSpec:
    from dataclasses import replace

    merged = dict(dataset)
    return replace(spec, dataset=merged)
