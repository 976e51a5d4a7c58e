"""``gage-eval validate``: check a data file, a task file or a summary.json against a schema,
with the same checks a run makes. A core command: it works with every plugin disabled (the
schemas plugins register join the choices when they are loaded)."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from gage_eval.api.errors import GageError, KeyedError
from gage_eval.api.loader import SampleIdentity
from gage_eval.api.sample import RowContext

OBJECT_SCHEMAS = ("summary",)  # one JSON object per file, not rows


@click.command("validate")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--schema", "schema", required=True, metavar="NAME",
              help="Which schema to check against: sample, instance, task, summary, instance_0.3.0, "
                   "aggregate_0.3.0, or one a plugin registers (legal_eval_v1 from the builtin plugin).")
@click.option("--max-errors", type=int, default=0, help="Stop printing after this many errors (0: all).")
@click.option("--allow-path", "allow_paths", multiple=True, metavar="DIR",
              help="Data paths may also point into DIR (repeatable), as in a run.")
@click.option("--allow-urls", is_flag=True, help="Accept http(s) URLs in data, as a run with --allow-urls does.")
def validate_command(file, schema, max_errors, allow_paths, allow_urls):
    """Check every row of FILE (jsonl, json or a task.yaml) against a schema (``summary``: a
    run folder's summary.json, one JSON object).

    Rows of a dataset (``sample``, and a plugin schema that says how its rows are read, such
    as ``legal_eval_v1``) go through the same checks as in a run (gage_eval.tasks.rows): duplicate
    ids, empty references, and the files and URLs they name, with paths taken from FILE's
    folder. A task file (``task``, named task.yaml) that fits the schema then has each name it
    gives (loader, preprocessor, metrics, judge, request.tool_loop's tools and their arguments,
    a ``sandbox``) looked up in the loaded plugins' registry as a run's task setup does. Prints
    each problem as file:line: JSON path: message, then a report; exits 1 if any row is invalid,
    2 for an unknown schema."""
    from gage_eval.api.schemas import schema_names

    names = schema_names()
    if schema not in names:
        raise click.BadParameter(f"unknown schema {schema!r}; choose one of {', '.join(names)}",
                                 param_hint="'--schema'")
    path = Path(file)
    if schema in OBJECT_SCHEMAS:
        sys.exit(_validate_object(path, schema, max_errors))
    sys.exit(_validate_rows(path, schema, max_errors, allow_paths, allow_urls))


def _entries(path: Path, schema: str):
    from gage_eval.api.errors import InputError
    from gage_eval.api.jsonio import iter_json_rows
    from gage_eval.tasks.spec import read_task_yaml  # (refuses a FIFO before opening it)

    if schema == "task" or path.suffix in (".yaml", ".yml"):
        try:
            return [(1, read_task_yaml(path), None)]
        except InputError as exc:
            return [(exc.line or 1, None, exc.problem)]
    return iter_json_rows(path)  # the jsonl loader's strict reader: validate and a run agree


def _validate_rows(path: Path, schema: str, max_errors: int, allow_paths, allow_urls: bool) -> int:
    """Check each row; prints problems and a report line; returns the exit status."""
    from gage_eval.api.schemas import validation_errors, validation_warnings
    from gage_eval.api.yamlio import key_line

    rows = valid = warnings = printed = invalid_rows = 0
    checker = None
    if path.suffix not in (".yaml", ".yml"):
        checker = _row_checker(schema, path, allow_paths, allow_urls)
    try:
        for lineno, row, parse_error in _entries(path, schema):
            rows += 1
            if parse_error:  # (a RowProblem names the field: $.label)
                problems = [(getattr(parse_error, "where", "$"), getattr(parse_error, "problem", parse_error))]
                row_warnings = []
            elif checker is not None:
                result = checker.check(f"{path}:{lineno}", rows - 1, row)
                problems, row_warnings = result.problems, result.warnings
            elif row is None:  # (an empty YAML file, or one holding only comments)
                problems, row_warnings = [("", "the file is empty: a YAML file holding one mapping of keys")], []
            else:
                problems, row_warnings = validation_errors(row, schema), validation_warnings(row, schema)
                if schema == "task" and not problems:  # then the names it gives, as a run's task setup
                    problems = task_name_problems(path)
            for where, msg in row_warnings:
                warnings += 1
                click.echo(f"{path}:{lineno}: warning: {where}: {msg}")
            if not problems:
                valid += 1
                continue
            invalid_rows += 1
            for where, msg in problems:
                printed += 1
                line = (key_line(path, where) or lineno) if checker is None and where and not parse_error else lineno
                if not max_errors or printed <= max_errors:
                    click.echo(f"{path}:{line}: {where}: {msg}" if where else f"{path}:{line}: {msg}")
    finally:
        if checker is not None:
            checker.close()
    if rows == 0:
        click.echo(f"{path}: no rows to check (the file is empty or holds only blank lines)")
    click.echo(f"{path}: {rows} rows, {valid} valid, {invalid_rows} invalid, {warnings} warnings "
               f"(schema {schema})")
    return 1 if invalid_rows or rows == 0 else 0


def task_name_problems(path: Path) -> list[tuple[str, str]]:
    """What a run's task setup refuses in the task file ``path`` (one that fits the task schema)
    besides the schema, as (key, message): the file read as a run reads it
    (:func:`~gage_eval.tasks.spec.read_task_file`, each of its ``variants``), then each name it
    gives looked up in the loaded plugins' registry (:meth:`~gage_eval.plugins.Registry.get`, the
    lookup of ``Registry.build``) and its tool loop checked (:func:`~gage_eval.tasks.toolcheck.check_tool_loop`).
    No loader, metric or judge is built (no data is read); a tool's ``check_args`` may open its
    sandbox, as at a run's setup. Only a file named task.yaml is a task's (others: the schema alone)."""
    from gage_eval.api.yamlio import key_line
    from gage_eval.plugins import load_plugins
    from gage_eval.tasks.spec import TASK_FILE, read_task_data, read_task_file

    if path.name != TASK_FILE:
        return []
    pm, registry = load_plugins()
    note = _plugins_note(pm)
    folder = path.parent
    try:
        variants = read_task_data(folder).get("variants") or [None]
    except GageError as exc:
        return [_key_problem(exc)]
    problems: list[tuple[str, str]] = []
    for params in variants:
        try:
            spec = read_task_file(folder, "", {str(k): str(v) for k, v in params.items()} if params else None)
        except GageError as exc:
            found = [_key_problem(exc)]
        else:
            found = _name_problems(spec, registry, note)
        problems += [p for p in found if p not in problems]  # (a name every variant gives: once)
    return sorted(problems, key=lambda p: key_line(path, p[0]) or 0)  # in the file's order


def _name_problems(spec: Any, registry: Any, note: str) -> list[tuple[str, str]]:
    """Each registered name ``spec`` gives that ``registry`` lacks, and its tool loop's first
    problem (``note``, which plugins are loaded and disabled, ends a name's message)."""
    from gage_eval.tasks.toolcheck import check_metric_sandbox, check_tool_loop

    pre = "preprocessor.name" if "preprocessor" in spec.raw else "preprocessor"  # (default: identity)
    lookups = [("loaders", spec.dataset.get("loader"), "dataset.loader"),
               ("preprocessors", spec.preprocessor.get("name"), pre)]
    for i, entry in enumerate(spec.metrics):
        entry = {"name": entry} if isinstance(entry, str) else entry
        lookups.append(("metrics", entry.get("name"), f"metrics.{i}"))
    if spec.judge:
        lookups.append(("judges", spec.judge.get("name"), "judge.name"))
    loop = spec.request.get("tool_loop") or {}  # (its tools' sandboxes: their check_args open them)
    problems = []
    for kind, name, key in lookups:
        try:
            registry.get(kind, name)
        except GageError as exc:
            problems.append((key, f"{exc}{note}"))
    for i, entry in enumerate(spec.metrics):  # a metric's sandbox (code_exec's), opened as the run's setup does
        args = entry.get("args") if isinstance(entry, dict) else None
        try:
            check_metric_sandbox(spec, i, args if isinstance(args, dict) else {})
        except KeyedError as exc:
            box = args.get("sandbox", "local")
            unknown = isinstance(box, str) and box not in registry.sandboxes
            problems.append((exc.key, exc.problem + (note if unknown else "")))
    if loop:
        try:
            check_tool_loop(spec, loop, registry)
        except KeyedError as exc:
            unknown = any(n not in registry.tools for n in loop.get("tools") or ())
            problems.append((exc.key, exc.problem + (note if unknown else "")))
    return problems


def _key_problem(exc: GageError) -> tuple[str, str]:
    """(key, problem) of a KeyedError or an InputError (validate names the file and line itself)."""
    return getattr(exc, "key", ""), getattr(exc, "problem", str(exc))


def _plugins_note(pm: Any) -> str:
    """`` (plugins loaded: ...; disabled by GAGE_EVAL_DISABLE_PLUGINS: ...)`` when a plugin is
    disabled (a name only a disabled plugin registers is unknown too), else empty."""
    pairs = pm.list_name_plugin()
    disabled = sorted(name for name, plugin in pairs if plugin is None)  # (pluggy keeps a blocked name)
    if not disabled:
        return ""
    loaded = sorted(name for name, plugin in pairs if plugin is not None)
    return (f" (plugins loaded: {', '.join(loaded) or 'none'}; disabled by GAGE_EVAL_DISABLE_PLUGINS: "
            f"{', '.join(disabled)})")


def _validate_object(path: Path, schema: str, max_errors: int) -> int:
    """Check a file holding one JSON object (a summary.json); prints each problem as file: JSON
    path: message, then a report; returns the exit status (1 if invalid)."""
    from gage_eval.api.schemas import validation_errors

    try:
        value = json.loads(path.read_bytes().decode("utf-8-sig"))
    except UnicodeDecodeError as exc:
        problems = [("", f"not UTF-8 text (byte {exc.start})")]
    except json.JSONDecodeError as exc:
        problems = [("", f"line {exc.lineno}: invalid JSON ({exc.msg}); a {schema} file is one JSON object")]
    else:
        if isinstance(value, dict):
            problems = validation_errors(value, schema)
        else:
            what = "an array" if isinstance(value, list) else f"a JSON {type(value).__name__}"
            problems = [("$", f"expected one JSON object (a run folder's summary.json), got {what}")]
    for i, (where, msg) in enumerate(problems, 1):
        if not max_errors or i <= max_errors:
            click.echo(f"{path}: {where}: {msg}" if where else f"{path}: {msg}")
    verdict = f"invalid, {len(problems)} problem(s)" if problems else "valid"
    click.echo(f"{path}: {verdict} (schema {schema})")
    return 1 if problems else 0


def _row_checker(schema: str, path: Path, allow_paths, allow_urls: bool):
    """The run's row checker for a data file, its rows read as a run reads them (Sample v1 as
    they are; a plugin schema's rows through the preprocessor it names), paths taken from the
    file's folder. None for a schema with no reader: its rows get the schema and its checks."""
    from gage_eval.engine.idset import IdSet
    from gage_eval.plugins import load_plugins
    from gage_eval.tasks.rows import RowChecker

    if schema == "sample":
        preprocess: Any = SampleIdentity()
    else:
        entry = load_plugins()[1].schemas.get(schema)
        if entry is None or entry.rows is None:
            return None
        try:
            preprocess = entry.rows()
        except Exception as exc:  # a plugin's bug: say whose
            raise GageError(f"schema {schema!r} (plugin {entry.plugin!r}): its row reader failed: "
                            f"{type(exc).__name__}: {exc}") from None
        if getattr(preprocess, "input_schema", None) != schema:
            preprocess = _Checked(preprocess, schema)
    return RowChecker(path.stem, preprocess, base_dir=path.resolve().parent, allowed_dirs=allow_paths,
                      allow_urls=allow_urls, seen=IdSet())


class _Checked:
    """A plugin's row reader whose rows are checked against ``schema`` before it reads them."""

    def __init__(self, preprocess: Any, schema: str):
        self.preprocess = preprocess
        self.input_schema = schema
        roots = getattr(preprocess, "data_roots", None)
        if callable(roots):
            self.data_roots = roots

    def __call__(self, record: Any, ctx: RowContext) -> Any:
        return self.preprocess(record, ctx)
