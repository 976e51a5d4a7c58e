"""JSON Schemas: gage-eval's own (``schemas/``) and those plugins register
(``gage_register_schemas``); lookup, cached validators, the checks a schema cannot express.

A check takes one decoded row and returns ``(json path, message)`` pairs. Checks run beside
the schema's own errors, so they tolerate rows the schema already refuses.
"""
from __future__ import annotations

import json
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from gage_eval.api import registered
from gage_eval.api.errors import GageError
from gage_eval.api.strictjson import shown

Check = Callable[[Any], list[tuple[str, str]]]

# gage-eval's own schemas, files in schemas/; a plugin cannot register these names.
SCHEMA_FILES = {
    "sample": "sample.schema.json",
    "instance": "instance_level_eval_0.2.0.schema.json",
    "task": "task.schema.json",
    "summary": "summary.schema.json",  # a run folder's summary.json: one JSON object, not rows
}
# Every Eval Ever 0.3.0 (--eee-version 0.3.0; gage_plugins_builtin.eee.v030): EEE's own files, not shipped with
# gage-eval; read from GAGE_EVAL_EEE_SCHEMAS, else from ../shared/data beside a checkout.
EEE_SCHEMA_FILES = {
    "instance_0.3.0": "instance_level_eval.schema.json",
    "aggregate_0.3.0": "eval.schema.json",  # eee_aggregate.json: one object
}
EEE_SCHEMAS_ENV = "GAGE_EVAL_EEE_SCHEMAS"
EEE_SHARED = Path("shared", "data", "every_eval_ever", "schemas", "v0.3.0_HEAD_9bce413")

SAMPLE_REQUIRED = ("schema_version", "id", "messages", "references")
_REQUIRED_MESSAGE = re.compile(r"^'([^']+)' is a required property$")


def _summary_checks(summary: Any) -> list[tuple[str, str]]:
    """What summary.schema.json cannot say: each task under its own name, counts that add up."""
    problems = []
    tasks = summary.get("tasks") if isinstance(summary, dict) else None
    for name, task in (tasks or {}).items() if isinstance(tasks, dict) else ():
        if not isinstance(task, dict) or not isinstance(task.get("counts"), dict):
            continue
        where, c = f"$.tasks.{name}", task["counts"]
        if task.get("task") != name:
            problems.append((f"{where}.task", f"{task.get('task')!r} differs from its key {name!r}"))
        if all(isinstance(c.get(k), int) for k in ("total", "scored", "errored", "skipped")) and \
                c["total"] != c["scored"] + c["errored"] + c["skipped"]:
            problems.append((f"{where}.counts", f"total {c['total']} is not scored + errored + skipped "
                                                f"({c['scored']} + {c['errored']} + {c['skipped']})"))
        stages = task.get("errors_by_stage")
        if isinstance(stages, dict) and isinstance(c.get("errored"), int) and \
                all(isinstance(v, int) for v in stages.values()) and sum(stages.values()) != c["errored"]:
            problems.append((f"{where}.errors_by_stage", f"adds up to {sum(stages.values())}, "
                                                         f"not errored ({c['errored']})"))
    return problems


def _json_type(value: Any) -> str:
    # the row reader's word for a value's type; imported here only when an error needs it
    from gage_eval.api.strictjson import json_type

    return json_type(value)


def field_message(where: str, what: str) -> str:
    """``$.a.b`` + message as ``a.b: message``; a row-level (``$`` or empty) message as it is."""
    return f"{where[2:]}: {what}" if where.startswith("$.") or where.startswith("$[") else what


def schemas_dir() -> Path:
    here = Path(__file__).resolve().parent.parent  # gage_eval/: a wheel's schemas, else the checkout's
    for candidate in (here / "schemas", here.parent / "schemas"):
        if candidate.is_dir():
            return candidate
    raise GageError("the schemas folder is missing from this installation of gage-eval")


def data_packages() -> list[tuple[str, str]]:
    """The data packages plugins registered (``gage_register_data_packages``) that are installed,
    as ``(name, folder)`` in registration order, builtins first; a root function that fails or
    returns None counts as not installed."""
    out = []
    for reg in registered.table("data_packages").values():
        try:
            root = reg.factory() if callable(reg.factory) else reg.factory
        except Exception:  # a plugin's lookup must not break a run; the package is just not found
            continue
        if root is not None and os.path.isdir(root):
            out.append((reg.name, str(root)))
    return out


def schema_names() -> list[str]:
    """Every schema that can be named: gage-eval's own, EEE 0.3.0's, then the plugins' (sorted)."""
    return [*SCHEMA_FILES, *EEE_SCHEMA_FILES, *sorted(registered.table("schemas"))]


def eee_schema_path(name: str) -> Path:
    """An Every Eval Ever 0.3.0 schema file: in $GAGE_EVAL_EEE_SCHEMAS, else in the shared data
    beside this checkout; a one-line error saying how to provide it when neither has it."""
    folder = os.environ.get(EEE_SCHEMAS_ENV)
    base = Path(folder) if folder else schemas_dir().resolve().parent.parent / EEE_SHARED
    path = base / EEE_SCHEMA_FILES[name]
    if not path.is_file():
        raise GageError(f"schema {name!r}: Every Eval Ever's 0.3.0 schema files are not part of gage-eval and "
                        f"{path} is missing; set {EEE_SCHEMAS_ENV} to the folder holding "
                        f"{' and '.join(EEE_SCHEMA_FILES.values())} (EEE's schemas/v0.3.0)")
    return path


def schema_path(name: str) -> Path:
    if name in SCHEMA_FILES:
        return schemas_dir() / SCHEMA_FILES[name]
    if name in EEE_SCHEMA_FILES:
        return eee_schema_path(name)
    entry = registered.table("schemas").get(name)
    if entry is None:
        raise GageError(f"unknown schema {name!r}; choose one of {', '.join(schema_names())}")
    return Path(entry.path)


def checks_for(name: str) -> tuple[Check | None, Check | None]:
    """The (error, warning) checks of schema ``name`` beside its JSON Schema; either may be None."""
    if name in _CORE_CHECKS:
        return _CORE_CHECKS[name]
    entry = registered.table("schemas").get(name)
    return (entry.checks, entry.warnings) if entry is not None else (None, None)


def _where(name: str) -> str | None:
    """None for a core schema (its file never changes in a process); a plugin schema's path,
    so the caches below follow a registry rebuilt with another file under the same name."""
    return None if name in SCHEMA_FILES else str(schema_path(name))


def load_schema(name: str) -> dict:
    return _load(name, _where(name))


def validator(name: str):
    return _validator(name, _where(name))


def fast_validator(name: str):
    """A compiled validator (jsonschema-rs) used to pass valid rows quickly; None when unavailable.

    Invalid rows always go through :func:`validator` for the detailed, path-naming errors.
    """
    return _fast_validator(name, _where(name))


@lru_cache(maxsize=None)
def _load(name: str, where: str | None) -> dict:
    path = schema_path(name) if where is None else Path(where)
    try:
        schema = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise GageError(f"schema {name!r}: cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise GageError(f"schema {name!r}: {path} is not valid JSON: {exc}") from None
    if not isinstance(schema, dict):
        raise GageError(f"schema {name!r}: {path} holds {_json_type(schema)}, not a JSON Schema object")
    return schema


@lru_cache(maxsize=None)
def _validator(name: str, where: str | None):
    import jsonschema

    schema = _load(name, where)
    cls = jsonschema.validators.validator_for(schema)
    try:
        cls.check_schema(schema)
    except jsonschema.exceptions.SchemaError as exc:
        raise GageError(f"schema {name!r}: {where or schema_path(name)} is not a valid JSON Schema: "
                        f"{exc.message}") from None
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


@lru_cache(maxsize=None)
def _fast_validator(name: str, where: str | None):
    # jsonschema_rs's module init imports these and panics (a Rust traceback on stderr) when Ctrl-C
    # cuts that import short; imported here first, the interrupt is a plain KeyboardInterrupt
    import decimal  # noqa: F401
    import email.utils  # noqa: F401

    try:
        import jsonschema_rs
    except ImportError:
        return None
    try:
        return jsonschema_rs.validator_for(_load(name, where))
    except Exception:  # a schema feature it does not support: fall back to the reference validator
        return None


def _path(error) -> str:
    out = "$"
    for part in error.absolute_path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def _best(error):
    # For anyOf/oneOf failures report the most specific sub-error.
    import jsonschema

    return jsonschema.exceptions.best_match([error]) if error.context else error


def _schema_errors(instance: Any, name: str) -> list[tuple[str, str]]:
    """The JSON Schema's errors of ``instance`` (the slow validator, which says what is wrong)."""
    problems = []
    for error in sorted(validator(name).iter_errors(instance), key=lambda e: list(map(str, e.absolute_path))):
        best = _best(error)
        message = best.message
        if best.validator == "not" and best.validator_value == {}:  # a forbidden field: say why, not "{}"
            message = (best.schema.get("description") if isinstance(best.schema, dict) else None) or \
                "field not allowed here"
        where = _path(best) if name != "task" else ".".join(map(str, best.absolute_path))
        problems.append((where, _json_forms(best, message)))
    return problems


def _json_forms(error, message: str) -> str:
    """jsonschema's message with the value it starts with written as JSON (``true``, ``null``, ``{"a": 1}``,
    not Python's ``True``, ``None``, ``{'a': 1}``) and cut short; a short string keeps its quotes."""
    head = repr(error.instance)
    if message.startswith(head) and (not isinstance(error.instance, str) or len(head) > 60):
        message = shown(error.instance) + message[len(head):]
    value = error.validator_value
    values = value if isinstance(value, list) else [value]
    if error.validator in ("enum", "const") and not all(isinstance(v, str) for v in values):
        message = message.replace(repr(value), shown(value, 200))
    return message


def validation_errors(instance: Any, name: str) -> list[tuple[str, str]]:
    """Every problem of ``instance`` against schema ``name`` as (JSON path, message)."""
    fast = fast_validator(name)
    problems = [] if fast is not None and fast.is_valid(instance) else _schema_errors(instance, name)
    check = checks_for(name)[0]
    if check is not None:  # code checks tolerate rows the schema refused, so report everything at once
        problems.extend(check(instance))
    return problems


def validation_warnings(instance: Any, name: str) -> list[tuple[str, str]]:
    check = checks_for(name)[1]
    return check(instance) if check else []


class SchemaChecks:
    """Schema ``name``'s validator and checks looked up once, for the many rows of one task or
    file: :meth:`errors` is :func:`validation_errors` without the lookups on every row; ``warn``
    the schema's warning check (None: none)."""

    def __init__(self, name: str):
        self.name = name
        entry = None if name in SCHEMA_FILES or name in EEE_SCHEMA_FILES else registered.table("schemas").get(name)
        if entry is None:  # gage-eval's own (or an unknown name: fast_validator says so)
            self.fast = fast_validator(name)
            self.check, self.warn = checks_for(name)
        else:  # a plugin's, its entry looked up once (fast_validator and checks_for each look it up)
            self.fast = _fast_validator(name, str(Path(entry.path)))
            self.check, self.warn = entry.checks, entry.warnings

    def errors(self, instance: Any) -> list[tuple[str, str]]:
        fast = self.fast
        problems = [] if fast is not None and fast.is_valid(instance) else _schema_errors(instance, self.name)
        if self.check is not None:
            problems.extend(self.check(instance))
        return problems


def sample_v1_required_errors(row: Any) -> list[tuple[str, str]]:
    """Spec 000's required fields of a row given as Sample v1, with messages that name them:
    a missing field, ``references``/``messages`` not a list, ``schema_version`` not ``v1``.
    Nothing here is ever filled in or coerced."""
    if not isinstance(row, dict):
        return [("$", f"expected a JSON object (a Sample v1 row), got {_json_type(row)}")]
    problems = [("$", f"missing required field '{key}'") for key in SAMPLE_REQUIRED if key not in row]
    for key in ("messages", "references"):
        if key in row and not isinstance(row[key], list):
            problems.append((f"$.{key}", f"expected a list, got {_json_type(row[key])}"))
    if "schema_version" in row and row["schema_version"] != "v1":
        problems.append(("$.schema_version", f"expected 'v1', got {row['schema_version']!r}"))
    return problems


def sample_v1_row_errors(row: Any) -> list[tuple[str, str]]:
    """Every problem of a row given as Sample v1: the required-field messages above, then the
    schema's own errors for everything they do not already say."""
    required = sample_v1_required_errors(row)
    if required and not isinstance(row, dict):
        return required
    said = {where for where, _ in required if where != "$"}
    missing = {key for key in SAMPLE_REQUIRED if key not in row}
    rest = []
    for where, what in validation_errors(row, "sample"):
        named = _REQUIRED_MESSAGE.match(what) if where == "$" else None
        if where in said or (named and named.group(1) in missing):
            continue
        rest.append((where, what))
    return required + rest


def sample_v1_warnings(row: Any) -> list[tuple[str, str]]:
    """A top-level key spec 000 does not define: kept and written, but probably a typo or
    something that belongs in ``metadata``."""
    if not isinstance(row, dict):
        return []
    known = load_schema("sample")["properties"]
    return [(f"$.{key}", "unknown top-level field; Sample v1 (spec 000) does not define it "
                         "(put it in metadata)") for key in row if key not in known]


_CORE_CHECKS: dict[str, tuple[Check | None, Check | None]] = {
    "sample": (None, sample_v1_warnings),
    "summary": (_summary_checks, None),
}
