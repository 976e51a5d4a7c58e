"""The builtin plugin's sub-commands: validate, new-task. Added through gage_register_commands
(``tasks`` and ``plugins`` belong to the core: gage_eval.commands)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from gage_eval.errors import GageError


def add_to(cli: click.Group) -> None:
    cli.add_command(validate_command)
    cli.add_command(new_task_command)


@click.command("validate")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--schema", "schema", required=True,
              type=click.Choice(["sample", "instance", "task", "legal_eval_v1", "summary"]),
              help="Which schema to check against.")
@click.option("--max-errors", type=int, default=0, help="Stop printing after this many errors (0: all).")
@click.option("--allow-path", "allow_paths", multiple=True, metavar="DIR",
              help="Data paths may also point into DIR (repeatable), as in a run.")
@click.option("--allow-urls", is_flag=True, help="Accept http(s) URLs in data, as a run with --allow-urls does.")
def validate_command(file, schema, max_errors, allow_paths, allow_urls):
    """Check every row of FILE (jsonl, json or a task.yaml) against a schema (``summary``: a
    run folder's summary.json, one JSON object).

    Rows of a dataset (``sample``, ``legal_eval_v1``) go through the same checks as in a
    run (gage_eval.rows): duplicate ids, empty references, and the files and URLs they name,
    with paths taken from FILE's folder. Prints each problem as file:line: JSON path:
    message, then a report; exits 1 if any row is invalid."""
    from gage_eval.jsonio import InputError, iter_json_rows, read_yaml
    from gage_eval.schemas import validation_errors, validation_warnings

    path = Path(file)
    if schema == "summary":
        sys.exit(_validate_object(path, schema, max_errors))
    rows = valid = warnings = printed = 0
    invalid_rows = 0
    if schema == "task" or path.suffix in (".yaml", ".yml"):
        try:
            entries = [(1, read_yaml(path), None)]
        except InputError as exc:
            entries = [(exc.line or 1, None, exc.problem)]
    else:
        entries = iter_json_rows(path)  # the jsonl loader's strict reader: validate and a run agree
    checker = None
    if schema in ("sample", "legal_eval_v1") and path.suffix not in (".yaml", ".yml"):
        checker = _row_checker(schema, path, allow_paths, allow_urls)
    for lineno, row, parse_error in entries:
        rows += 1
        if parse_error:
            problems, row_warnings = [("$", parse_error)], []
        elif checker is not None:
            result = checker.check(f"{path}:{lineno}", rows - 1, row)
            problems, row_warnings = result.problems, result.warnings
        else:
            problems, row_warnings = validation_errors(row, schema), validation_warnings(row, schema)
        for where, msg in row_warnings:
            warnings += 1
            click.echo(f"{path}:{lineno}: warning: {where}: {msg}")
        if problems:
            invalid_rows += 1
            for where, msg in problems:
                printed += 1
                if not max_errors or printed <= max_errors:
                    click.echo(f"{path}:{lineno}: {where}: {msg}" if where else f"{path}:{lineno}: {msg}")
        else:
            valid += 1
    if checker is not None:
        checker.close()
    click.echo(f"{path}: {rows} rows, {valid} valid, {invalid_rows} invalid, {warnings} warnings "
               f"(schema {schema})")
    if invalid_rows or rows == 0:
        sys.exit(1)


def _validate_object(path: Path, schema: str, max_errors: int) -> int:
    """Check a file holding one JSON object (a summary.json); prints each problem as file: JSON
    path: message, then a report; returns the exit status (1 if invalid)."""
    from gage_eval.schemas import validation_errors

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
    """The run's row checker for a data file: its rows read as the identity (Sample v1) or
    legal_eval_v1 preprocessor reads them, paths taken from the file's folder."""
    from gage_eval.idset import IdSet
    from gage_eval.rows import RowChecker

    if schema == "sample":
        from gage_plugins_builtin.preprocessors import Identity

        preprocess = Identity()
    else:
        from gage_plugins_builtin.legal.preprocess import LegalEvalV1

        preprocess = LegalEvalV1(attachments="file", validate=False)  # files checked, not read
    return RowChecker(path.stem, preprocess, base_dir=path.resolve().parent, allowed_dirs=allow_paths,
                      allow_urls=allow_urls, seen=IdSet())


@click.command("new-task")
@click.argument("name")
@click.option("--kind", type=click.Choice(["generate", "loglikelihood"]), default="generate", show_default=True,
              help="generate: the model writes an answer; loglikelihood: it scores given choices.")
@click.option("--dir", "parent", default=".", show_default=True, metavar="DIR",
              help="Write the task folder DIR/NAME; run it with --include-path DIR.")
def new_task_command(name, kind, parent):
    """Write a task folder NAME (task.yaml, prompt.jinja, sample.jsonl, README.md) that runs as it is.

    Refuses a folder that already exists. docs/tasks.md explains every key and template variable."""
    from gage_plugins_builtin.new_task import check_name, write_task

    check_name(name)
    folder = write_task(name, kind, Path(parent))
    click.echo(f"wrote {folder}/: task.yaml, prompt.jinja, sample.jsonl, README.md ({kind} task)")
    click.echo("next:")
    click.echo(f"  gage-eval --tasks {name} --include-path {parent} --model dummy   # checks the task, no model")
    click.echo(f"  gage-eval --tasks {name} --include-path {parent}                 # the default model")
    builtin = _builtin_task_names()
    if name in builtin:
        click.echo(f"note: a builtin task is also named {name!r}; with --include-path {parent} this folder "
                   f"overrides it (with a warning)", err=True)


def _builtin_task_names() -> set[str]:
    from gage_eval.plugins import load_plugins
    from gage_eval.tasks import discover

    try:
        _, registry = load_plugins()
        return set(discover(registry.task_paths, [], warn=lambda msg: None))
    except GageError:  # a broken plugin is reported when tasks run, not here
        return set()
