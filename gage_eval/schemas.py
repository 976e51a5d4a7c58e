"""The JSON Schemas in ``schemas/``: lookup, cached validators, and file validation."""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from gage_eval.errors import GageError

SCHEMA_FILES = {
    "sample": "sample.schema.json",
    "instance": "instance_level_eval_0.2.0.schema.json",
    "task": "task.schema.json",
    "legal_eval_v1": "legal_eval_v1.schema.json",
    "summary": "summary.schema.json",  # a run folder's summary.json: one JSON object, not rows
}

# Rules JSON Schema cannot say (uniqueness, membership) are checked in code by
# functions registered here; each returns (json path, message) pairs.
EXTRA_CHECKS: dict[str, Callable[[Any], list[tuple[str, str]]]] = {}
# Warnings (not errors) per schema, same shape.
WARNING_CHECKS: dict[str, Callable[[Any], list[tuple[str, str]]]] = {}


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


EXTRA_CHECKS["summary"] = _summary_checks


def schemas_dir() -> Path:
    here = Path(__file__).resolve().parent
    for candidate in (here / "schemas", here.parent / "schemas"):
        if candidate.is_dir():
            return candidate
    raise GageError("the schemas folder is missing from this installation of gage-eval")


@lru_cache(maxsize=None)
def load_schema(name: str) -> dict:
    if name not in SCHEMA_FILES:
        raise GageError(f"unknown schema {name!r}; choose one of {', '.join(SCHEMA_FILES)}")
    return json.loads((schemas_dir() / SCHEMA_FILES[name]).read_text(encoding="utf-8"))


@lru_cache(maxsize=None)
def validator(name: str):
    import jsonschema

    schema = load_schema(name)
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


@lru_cache(maxsize=None)
def fast_validator(name: str):
    """A compiled validator (jsonschema-rs) used to pass valid rows quickly; None when unavailable.

    Invalid rows always go through :func:`validator` for the detailed, path-naming errors.
    """
    try:
        import jsonschema_rs
    except ImportError:
        return None
    try:
        return jsonschema_rs.validator_for(load_schema(name))
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


def validation_errors(instance: Any, name: str) -> list[tuple[str, str]]:
    """Every problem of ``instance`` against schema ``name`` as (JSON path, message)."""
    problems = []
    fast = fast_validator(name)
    if fast is None or not fast.is_valid(instance):  # the slow validator only to say what is wrong
        for error in sorted(validator(name).iter_errors(instance), key=lambda e: list(map(str, e.absolute_path))):
            best = _best(error)
            message = best.message
            if best.validator == "not" and best.validator_value == {}:  # a forbidden field: say why, not "{}"
                message = (best.schema.get("description") if isinstance(best.schema, dict) else None) or \
                    "field not allowed here"
            problems.append((_path(best) if name != "task" else ".".join(map(str, best.absolute_path)), message))
    if name in EXTRA_CHECKS:  # code checks tolerate rows the schema refused, so report everything at once
        problems.extend(EXTRA_CHECKS[name](instance))
    return problems


def validation_warnings(instance: Any, name: str) -> list[tuple[str, str]]:
    check = WARNING_CHECKS.get(name)
    return check(instance) if check else []


from gage_eval import schema_checks  # noqa: E402,F401  (registers the code checks above)
