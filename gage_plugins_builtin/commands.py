"""The builtin plugin's sub-commands ``new-task``, ``convert``, ``report`` and ``compare``, added through
gage_register_commands (``tasks``, ``plugins`` and ``validate`` belong to the core: gage_eval.cli.commands).
Each command's module imports only click: what a command runs is imported when it runs."""
from __future__ import annotations

import shlex
from pathlib import Path

import click


def add_to(cli: click.Group) -> None:
    from gage_plugins_builtin.compare.command import compare_command
    from gage_plugins_builtin.report.command import report_command

    for command in (new_task_command, convert_command, report_command, compare_command):
        cli.add_command(command)


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
    click.echo("next:")  # (commands to paste: a path with a space or a quote is quoted)
    parent = shlex.quote(parent)
    click.echo(f"  gage-eval --tasks {name} --include-path {parent} --model dummy   # checks the task, no model")
    click.echo(f"  gage-eval --tasks {name} --include-path {parent}                 # the default model")
    builtin = _builtin_task_names()
    if name in builtin:
        click.echo(f"note: a builtin task is also named {name!r}; with --include-path {parent} this folder "
                   f"overrides it (with a warning)", err=True)


def _builtin_task_names() -> set[str]:
    from gage_plugins_builtin import tasks_dir

    folder = tasks_dir()
    return {p.name for p in folder.iterdir() if (p / "task.yaml").is_file()} if folder.is_dir() else set()


@click.command("convert")
@click.argument("pipeline", metavar="PIPELINE.yaml")
@click.option("-o", "--output", "out_dir", required=True, metavar="DIR",
              help="Write DIR/tasks/<task>/ (task.yaml, templates), DIR/run.yaml and DIR/CONVERSION.txt; "
                   "DIR must not exist or be empty.")
def convert_command(pipeline, out_dir):
    """Convert a seed-system PipelineConfig (spec 004) into gage-eval task folders and a run config.

    Each tasks[] entry (or each dataset, without tasks) becomes a task folder; the dut_model and
    judge_model role adapters become the run config's models. What cannot be converted is listed,
    one PIPELINE.yaml:LINE: key: why a line (also in DIR/CONVERSION.txt). A broken file is refused
    with its line (exit 2) and nothing is written. docs/migration.md explains each mapping. Run the
    result with: gage-eval --config DIR/run.yaml"""
    from gage_plugins_builtin.convert import convert

    folder, report = convert(Path(pipeline), Path(out_dir))
    tasks = sorted(p.parent.name for p in (folder / "tasks").glob("*/task.yaml"))
    click.echo(f"wrote {folder}/: run.yaml, CONVERSION.txt, tasks/ ({', '.join(tasks)})")
    if report.skipped:
        click.echo(f"not converted ({len(report.skipped)}):", err=True)
        for line in report.skipped:
            click.echo(f"  {line}", err=True)
    if report.notes:
        click.echo(f"converted with a difference ({len(report.notes)}):", err=True)
        for line in report.notes:
            click.echo(f"  {line}", err=True)
    click.echo("next:")
    run_yaml = shlex.quote(str(folder / "run.yaml"))
    click.echo(f"  gage-eval --config {run_yaml} --model dummy --limit 5   # checks the tasks, no model")
    click.echo(f"  gage-eval --config {run_yaml}                           # the converted models")
