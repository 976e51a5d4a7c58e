"""``--dry-run``: the resolved settings and the first requests of each task, printed without
loading a model or making a run folder.

Tasks, rows and requests come from the engine's own pieces (:func:`~gage_eval.tasks.resolve.resolve_tasks`,
:class:`~gage_eval.engine.taskrun.TaskRun`, :class:`~gage_eval.tasks.rows.RowChecker` and the task's
request builder), so what is shown is what a run would send. The backend is built, which
checks its arguments, but never opened. The exit status is a run's: 0 when every row shown
became a request, 1 when a row shown errored, 2 for a bad setting (an unknown task, bad
model arguments, a task the model cannot do), 3 when a task cannot run.
"""
from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any, Callable

import click

from gage_eval.engine.executor import split_args
from gage_eval.config.options import RunOptions, in_shard
from gage_eval.engine.taskrun import TaskRun, _check_capabilities, make_backend
from gage_eval.tasks.resolve import resolve_tasks
from gage_eval.api.errors import EXIT_ROW_ERRORS, EXIT_TASK_FAILED, GageError
from gage_eval.plugins import load_plugins
from gage_eval.api.secrets import mask, redact, strip_credentials

HIDDEN = ("quiet", "command", "run_id", "output_dir")  # not settings of what runs
SHOWN_SEPARATELY = ("kind", "sample_id")


def dry_run(options: RunOptions, rows: int = 3, echo: Callable[[str], Any] = click.echo) -> int:
    """Print ``options`` (secrets masked) and the first ``rows`` requests of each task; the exit status."""
    _, registry = load_plugins()
    specs = resolve_tasks(options, registry)  # an unknown task is a usage error, as in a run
    runs = [TaskRun(spec, registry, options, failure) for spec, failure in specs]
    status, secrets = 0, ()
    echo("gage-eval dry run: nothing is run, no model is loaded, no run folder is made")
    try:
        args, plan = split_args(registry, options.model_args, options.executor)
        backend = make_backend(registry, options.model, args, options.batch_size, options.seed)
        secrets = tuple(getattr(backend, "secrets", ()) or ())
        model_line = f"model: {options.model} ({backend.model_id})" + (f", as {plan.describe()}" if plan else "")
        _check_capabilities([tr.spec for tr in runs if not tr.failure], backend, options.model,
                            chat=options.apply_chat_template)
    except GageError as exc:  # shown with the prompts, and the status says a run would stop here
        model_line = f"model: {options.model}: ERROR: {strip_credentials(mask(str(exc), secrets))}"
        status = 2
    settings = {k: v for k, v in options.as_dict().items() if k not in HIDDEN}
    echo("settings:")
    for key, value in redact(settings, secrets).items():
        echo(f"  {key}: {json.dumps(value, ensure_ascii=False)}")
    echo(model_line)
    for tr in runs:
        echo("")
        task_status = _show_task(tr, options, rows, echo, secrets)
        status = status or task_status
    return status


def _show_task(tr: TaskRun, options: RunOptions, rows: int, echo: Callable[[str], Any],
               secrets: tuple[str, ...]) -> int:
    spec = tr.spec
    head = f"== task {tr.name} ({spec.folder}, {spec.origin})"
    if tr.failure:
        echo(f"{head}: cannot run: {mask(tr.failure, secrets)}")
        return EXIT_TASK_FAILED
    names = ", ".join(name for name, _ in tr.metrics)
    echo(f"{head}: {spec.request.get('kind')}, metrics {names}, limit {tr.limit if tr.limit is not None else 'none'}"
         + (f" (a shuffled choice, seed {tr.shuffle_seed})" if tr.shuffle and tr.limit is not None else "")
         + f"; up to {rows} rows:")
    allowed = tuple(Path(p).expanduser().resolve() for p in options.allow_paths)
    status, shown = 0, 0
    try:
        for item, warnings in tr.items(allowed, options.allow_urls):
            if shown >= rows:
                break
            if options.shard and not in_shard(item.sample["id"], options.shard):
                continue  # (the rows this shard would run)
            shown += 1
            index, locator = item.index, item.locator
            for _, message in warnings:
                echo(f"-- warning: {locator}: {message}")
            stub = item.sample.get("eval_result")
            if stub is not None:
                err = stub["error"]
                echo(f"-- row {index + 1} ({locator}): {err['stage']} error: {mask(err['message'], secrets)}")
                status = EXIT_ROW_ERRORS
                continue
            if item.error is not None:
                echo(f"-- row {index + 1} ({locator}, id {item.sample['id']!r}): template error: "
                     f"{item.error['message']}")
                status = EXIT_ROW_ERRORS
                continue
            echo(f"-- row {index + 1} ({locator}, id {item.sample['id']!r}): {item.request.kind} request")
            _show_request(item.request, echo)
    except GageError as exc:  # the data stopped being readable: the task would fail
        echo(f"-- cannot read the rows: {mask(str(exc), secrets)}")
        return EXIT_TASK_FAILED
    except OSError as exc:
        echo(f"-- cannot read the rows: {exc.filename or ''}: {exc.strerror or exc}")
        return EXIT_TASK_FAILED
    if shown == 0:
        echo("-- no rows")
        return EXIT_TASK_FAILED
    return status


def _show_request(request: Any, echo: Callable[[str], Any]) -> None:
    """Every field of the request that is set: text as an indented block (``|`` marks where each
    line starts; the JSON form shows edge whitespace), everything else as JSON."""
    for f in fields(request):
        value = getattr(request, f.name)
        if f.name in SHOWN_SEPARATELY or value in (None, (), [], {}, False):
            continue
        if f.name == "modalities":
            if set(value) == {"text"}:
                continue
            value = sorted(value)
        if f.name == "messages":
            echo("   messages:")
            for message in value:
                _block(f"{message.get('role')}", _content_text(message.get("content")), echo, indent=5)
        elif isinstance(value, str):
            _block(f.name, value, echo)
        else:
            echo(f"   {f.name}: {json.dumps(value, ensure_ascii=False, default=str)}")


def _block(label: str, text: str, echo: Callable[[str], Any], indent: int = 3) -> None:
    pad = " " * indent
    echo(f"{pad}{label}: {json.dumps(text, ensure_ascii=False)}" if len(text) <= 60 and "\n" not in text
         else f"{pad}{label}:")
    if len(text) > 60 or "\n" in text:
        for line in text.split("\n"):
            echo(f"{pad}  | {line}")
        if text != text.rstrip():  # trailing whitespace is invisible in the block
            echo(f"{pad}  (ends with {json.dumps(text[len(text.rstrip()):])})")


def _content_text(content: Any) -> str:
    """A message's content as text; a media segment as ``[image_url]`` and the like."""
    if isinstance(content, str):
        return content
    parts = []
    for seg in content or []:
        if isinstance(seg, dict) and seg.get("type") == "text":
            parts.append(str(seg.get("text", "")))
        elif isinstance(seg, dict):
            parts.append(f"[{seg.get('type', 'segment')}]")
    return "".join(parts)
