"""Task folders: discovery, the validated task spec, and sandboxed Jinja2 templates."""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from gage_eval.errors import GageError
from gage_eval.jsonio import json_type, not_regular, read_yaml
from gage_eval.schemas import validation_errors

TASK_FILE = "task.yaml"
TASK_NAME = re.compile(r"^[A-Za-z0-9_.\-/]+$")


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
            raise GageError(f"{path}: key 'metrics.{i}': {exc}") from None
    return out


def read_task_data(folder: Path) -> dict:
    """The task folder's task.yaml as a mapping, read strictly and checked against the task schema."""
    path = folder / TASK_FILE
    data = read_yaml(path)
    if data is None:
        raise GageError(f"{path}: the file is empty; a task file needs dataset, request and metrics")
    if not isinstance(data, dict):
        raise GageError(f"{path}: expected a mapping of task settings, got {json_type(data)}")
    problems = validation_errors(data, "task")
    if problems:
        lines = "\n".join(f"  {path}: key '{where or '<top>'}': {msg}" for where, msg in problems)
        raise GageError(f"invalid task file {path}:\n{lines}")
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
    """The task folder's task.yaml, read strictly (:func:`gage_eval.jsonio.read_yaml`) and
    checked against the task schema; every problem a GageError naming the file and key.
    ``params``: one entry of the file's ``variants``, put in for its ``{placeholders}``."""
    path = folder / TASK_FILE
    data = read_task_data(folder)
    if data.get("variants") and not params:
        raise GageError(f"{path}: the file is a template of the tasks its 'variants' name; run one of those")
    data = variant_data(data, params)
    if not TASK_NAME.match(str(data.get("name", folder.name))):
        raise GageError(f"{path}: key 'name': {data.get('name')!r} is no task name (letters, digits, _ . - /)")
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
        metrics=metric_entries(path, data["metrics"]),
        judge=data.get("judge"),
        requires=tuple(data.get("requires", ())),
        primary_metric=data.get("primary_metric"),
        cluster_by=(data.get("stderr") or {}).get("cluster_by"),
        params=dict(params or {}),
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
            for source in _task_sources(folder, origin):
                name = source.name
                if name in found and found[name].folder.resolve() != folder.resolve():
                    warn(f"task {name!r} from {origin} ({folder}) overrides the one from "
                         f"{found[name].origin} ({found[name].folder})")
                found[name] = source
    return found


def _task_sources(folder: Path, origin: str) -> list[TaskSource]:
    """The folder's task, or one task per entry of its ``variants`` (each named by ``name`` with
    the entry's ``{placeholders}`` put in)."""
    try:
        data = read_yaml(folder / TASK_FILE)
    except GageError:  # reported when the task is read
        return [TaskSource(folder.name, folder, origin)]
    if not isinstance(data, dict):
        return [TaskSource(folder.name, folder, origin)]
    variants = data.get("variants")
    if not isinstance(variants, list) or not variants:
        name = data["name"] if isinstance(data.get("name"), str) else folder.name
        tags = data.get("tags") if isinstance(data.get("tags"), list) else []
        return [TaskSource(name, folder, origin, tags=tuple(map(str, tags)))]
    out, seen = [], set()
    for i, params in enumerate(variants):
        if not isinstance(params, dict):
            continue  # the schema says so when the task is read
        params = {str(k): str(v) for k, v in params.items()}
        one = variant_data(data, params)
        name = one.get("name") if isinstance(one.get("name"), str) else folder.name
        if name in seen:
            raise GageError(f"{folder / TASK_FILE}: key 'variants.{i}': gives task name {name!r} again; "
                            f"put each variant's parameters in 'name' (name: task_{{param}})")
        seen.add(name)
        tags = one.get("tags") if isinstance(one.get("tags"), list) else []
        out.append(TaskSource(name, folder, origin, params, tuple(map(str, tags))))
    return out


# ---------------------------------------------------------------------------
# Templates
# ---------------------------------------------------------------------------

_env = None


def template_env():
    """The one sandboxed, size-bounded Jinja2 environment (see :mod:`gage_eval.sandbox`)."""
    global _env
    if _env is None:
        from gage_eval.sandbox import BoundedEnvironment

        _env = BoundedEnvironment()
    return _env


_MISSING = object()
_DICT_ATTRS = frozenset(dir(dict))
_SPECIAL_NAMES = frozenset({"self", "loop", "caller", "varargs", "kwargs", "super"})


def _plain_fields(ast: Any) -> tuple | None:
    """The template's output as parts when it is only literal text and ``{{ name }}``,
    ``{{ name.key }}`` or ``{{ name['key'] }}`` fields (``Question: {{ question }}\nAnswer:``):
    a str is literal text, a ``(name, key)`` pair a field (key None for a bare name). Else None.

    For such a template, when every field's value is a ``str`` (a variable, or a plain ``dict``
    looked into by a key that is no dict attribute), Jinja's output is the text and those very
    strings joined: literal text is written as parsed (the lexer already dropped the trailing
    newline and applied ``-`` whitespace control), the sandbox's finalize passes a string
    through, and ``str()`` of a str is itself. Every other case (a missing name or key, None, a
    number, a subclass) still renders through Jinja, so undefined errors, ``'None'`` and number
    formatting stay Jinja's own."""
    from jinja2 import nodes

    if len(ast.body) != 1 or type(ast.body[0]) is not nodes.Output:
        return None
    if any(n.name in _SPECIAL_NAMES for n in ast.find_all(nodes.Name)):
        return None  # {{ self }} is the template itself in Jinja, not a variable
    parts: list = []
    for expr in ast.body[0].nodes:
        if type(expr) is nodes.TemplateData:
            parts.append(expr.data)
        elif type(expr) is nodes.Name and expr.ctx == "load":
            parts.append((expr.name, None))
        elif type(expr) is nodes.Getattr and type(expr.node) is nodes.Name and expr.node.ctx == "load":
            parts.append((expr.node.name, expr.attr))
        elif (type(expr) is nodes.Getitem and type(expr.node) is nodes.Name and expr.node.ctx == "load"
              and type(expr.arg) is nodes.Const and type(expr.arg.value) is str):
            parts.append((expr.node.name, expr.arg.value))
        else:
            return None
    if not any(type(p) is tuple for p in parts):
        return None  # literal text alone: rare, and Jinja is cheap there
    return tuple(parts)


def _field_value(variables: dict, name: str, key: str | None) -> Any:
    value = variables.get(name, _MISSING)
    if key is None:
        return value
    if type(value) is dict and key not in _DICT_ATTRS:
        return value.get(key, _MISSING)
    return _MISSING


class Template:
    """A compiled template that names its file and line in every error.

    Loading raises :class:`GageError` (a syntax error, include/import/extends); rendering
    raises ``ValueError`` for every failure (the engine writes such a row with stage
    ``template``). ``where`` is the template file, or for a template written inline in
    task.yaml a description such as ``task.yaml: request.choice``.
    """

    def __init__(self, source: str, where: str, *, is_file: bool = False):
        from jinja2 import TemplateSyntaxError

        from gage_eval.sandbox import refused_tag

        self.where = where
        self._is_file = is_file
        self._multiline = "\n" in source.strip()
        env = template_env()
        try:
            ast = env.parse(source)
            tag = refused_tag(ast)
            if tag is not None:
                raise GageError(f"{self._at(tag.lineno)}: include/import/extends are not supported: "
                                f"write the template in one file")
            code = env.compile(ast, filename=where)
        except TemplateSyntaxError as exc:
            raise GageError(f"{self._at(exc.lineno)}: template syntax error: {exc.message}") from None
        except (RecursionError, SyntaxError, MemoryError):
            raise GageError(f"{where}: the template is nested too deeply to compile") from None
        self._template = env.template_class.from_code(env, code, env.make_globals(None), None)
        self._parts = _plain_fields(ast)
        # {{ NAME.KEY }} alone (the default choice template): (NAME, KEY) for render_field
        self.lone_field = self._parts[0] if self._parts is not None and len(self._parts) == 1 \
            and self._parts[0][1] is not None and self._parts[0][1] not in _DICT_ATTRS else None
        import gage_eval.sandbox as sandbox

        self._sandbox = sandbox  # its MAX_SIZE read at each render, as the Jinja path does


    @classmethod
    def from_file(cls, path: Path) -> "Template":
        try:
            source = path.read_bytes().decode("utf-8-sig")
        except OSError as exc:
            raise GageError(f"{path}: cannot read: {exc.strerror or exc}") from None
        except UnicodeDecodeError as exc:
            line = exc.object.count(b"\n", 0, exc.start) + 1
            raise GageError(f"{path}:{line}: not UTF-8 text: {exc.reason}") from None
        return cls(source, str(path), is_file=True)

    def _at(self, line: int | None) -> str:
        if not line:
            return self.where
        if self._is_file:
            return f"{self.where}:{line}"
        return f"{self.where} (line {line})" if self._multiline else self.where

    def render(self, **variables: Any) -> str:
        if self._parts is not None:  # text and {{ name }} / {{ name.key }}: Jinja's answer without running it
            out = self._fast(variables)
            if out is not None:
                return out
        from gage_eval.sandbox import MAX_SIZE, TemplateLimit

        try:
            parts, size = [], 0
            for chunk in self._template.generate(**variables):
                size += len(chunk)
                if size > MAX_SIZE:
                    raise TemplateLimit(f"template output larger than {MAX_SIZE} characters")
                parts.append(chunk)
            return "".join(parts)
        except Exception as exc:  # whatever a template does wrong is this row's error, never a traceback
            raise ValueError(self._describe(exc, variables)) from None

    def render_dict(self, variables: dict) -> str:
        """``render(**variables)`` for variables already in a dict (a plain-field template reads
        them without the keyword-argument copy)."""
        if self._parts is not None:
            out = self._fast(variables)
            if out is not None:
                return out
        return self.render(**variables)

    def render_field(self, value: Any, variables: Mapping[str, Any], **more: Any) -> str:
        """``render(NAME=value, **more, **variables)`` for a template that is :attr:`lone_field`
        ``(NAME, KEY)`` alone: a plain dict's str under KEY is the answer, found without building
        the keyword arguments; anything else renders through :meth:`render`."""
        if type(value) is dict:
            text = value.get(self.lone_field[1])
            if type(text) is str and len(text) <= self._sandbox.MAX_SIZE:
                return text
        return self.render(**{self.lone_field[0]: value}, **more, **variables)

    def _fast(self, variables: dict) -> str | None:
        parts = self._parts
        if len(parts) == 1:  # {{ option.content }}, the default choice template
            value = _field_value(variables, *parts[0])
            return value if type(value) is str and len(value) <= self._sandbox.MAX_SIZE else None
        out = []
        for part in parts:
            if type(part) is str:
                out.append(part)
            else:
                name, key = part
                value = variables.get(name, _MISSING)  # _field_value, inlined (a per-row path)
                if key is not None:
                    value = value.get(key, _MISSING) if type(value) is dict and key not in _DICT_ATTRS else _MISSING
                if type(value) is not str:
                    return None
                out.append(value)
        text = "".join(out)
        return text if len(text) <= self._sandbox.MAX_SIZE else None

    def _describe(self, exc: Exception, variables: Mapping[str, Any]) -> str:
        from jinja2 import TemplateError, UndefinedError
        from jinja2.sandbox import SecurityError

        from gage_eval.sandbox import TemplateLimit

        line = None
        tb = exc.__traceback__
        while tb is not None:  # the innermost frame of the template's own code
            if tb.tb_frame.f_code.co_filename == self.where:
                line = tb.tb_lineno
            tb = tb.tb_next
        where = self._at(line)
        if isinstance(exc, UndefinedError):
            return f"{where}: {undefined_message(exc, variables)}"
        if isinstance(exc, SecurityError):
            return f"{where}: not allowed in a template: {exc.message}"
        if isinstance(exc, RecursionError):
            return f"{where}: recursion too deep (a macro that calls itself?)"
        if isinstance(exc, TemplateError):
            return f"{where}: {exc.message}"
        if isinstance(exc, MemoryError):
            return f"{where}: out of memory while rendering"
        if isinstance(exc, (TemplateLimit, OverflowError)):
            return f"{where}: {exc}"
        return f"{where}: {type(exc).__name__}: {exc}"


MAX_NAMES_LISTED = 30


def undefined_message(exc: Exception, variables: Mapping[str, Any]) -> str:
    """What an undefined variable, key or attribute error says: the name looked up, and the
    names that are there (the template's variables, or the keys of the value looked into),
    the value named by its path from the variables where it is found (``'sample.metadata'``)."""
    from jinja2.utils import missing

    from gage_eval.sandbox import UndefinedName

    available = _listed(list(variables)) if variables else "none (the template gets no variables)"
    if not isinstance(exc, UndefinedName):
        return f"{exc.message}; available: {available}"
    obj, name = exc.obj, exc.name
    if obj is missing:
        return f"{name!r} is undefined; available: {available}"
    path = _path_of(obj, variables)
    label = f"{path!r}" if path else f"a {_kind(obj)}"
    if isinstance(obj, Mapping):
        keys = [str(k) for k in obj]
        return f"{label} has no key {name!r}; " + (f"its keys: {_listed(keys)}" if keys else "it is empty")
    if isinstance(obj, (list, tuple, str)) and isinstance(name, int):
        return f"{label} has no item {name} (it has {len(obj)})"
    return f"{label} ({_kind(obj)}) has no attribute {name!r}" if path else f"{label} has no attribute {name!r}"


def _kind(value: Any) -> str:
    if isinstance(value, Mapping):
        return "mapping"
    if isinstance(value, (list, tuple)):
        return "list"
    return {str: "string", bool: "boolean", int: "number", float: "number"}.get(type(value), type(value).__name__)


def _listed(names: list[str]) -> str:
    shown = ", ".join(names[:MAX_NAMES_LISTED])
    return shown + (f", ... ({len(names)} in all)" if len(names) > MAX_NAMES_LISTED else "")


def _path_of(target: Any, variables: Mapping[str, Any], budget: int = 5000) -> str | None:
    """The shortest path (``sample.options[0]``) from the variables to ``target`` itself, if any."""
    queue = [(str(k), v) for k, v in variables.items()]
    for path, value in queue:  # the queue grows while it is read: breadth first
        if value is target:
            return path
        if len(queue) > budget:
            continue
        if isinstance(value, Mapping):
            queue.extend((f"{path}.{k}" if isinstance(k, str) and k.isidentifier() else f"{path}[{k!r}]", v)
                         for k, v in value.items())
        elif isinstance(value, (list, tuple)):
            queue.extend((f"{path}[{i}]", v) for i, v in enumerate(value))
    return None


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

    JSON (``.jsonl``, ``.json``) is read by the strict jsonl loader, the reader ``validate`` uses;
    csv and parquet by the hf loader.

    In a folder of Hugging Face shards (``validation-00000-of-00001.parquet``) only
    the shards of ``split`` (the task's own split) are read. Local files are
    streamed, so memory does not grow with the file.
    """
    p = Path(path)
    if not p.exists():
        raise GageError(f"--data: {path} does not exist")
    special = not_regular(p)
    if special:
        raise GageError(f"--data: {path}: {special}; give a data file or a folder of them")
    if p.is_file() and p.suffix in (".jsonl", ".json"):  # read strictly, as validate does
        return {"loader": "jsonl", "args": {"path": str(p.resolve())}}
    if p.is_dir() and _saved_dataset(p):
        # a Hugging Face save_to_disk folder (or a folder of them, one per split): the hf loader reads it
        return {"loader": "hf", "args": {"path": str(p.resolve()), "split": split or "train"}}
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
        if not shards and (all(f.suffix == ".jsonl" for f in files) or all(f.suffix == ".json" for f in files)):
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


def _saved_dataset(p: Path) -> bool:
    """A ``save_to_disk`` folder: state.json beside arrow files, here or in its sub-folders."""
    return any((d / "state.json").is_file() and any(d.glob("*.arrow")) for d in (p, *p.iterdir()) if d.is_dir())


def with_dataset(spec: TaskSpec, dataset: Mapping[str, Any]) -> TaskSpec:
    from dataclasses import replace

    merged = dict(dataset)
    return replace(spec, dataset=merged)
