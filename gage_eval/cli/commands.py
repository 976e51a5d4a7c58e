"""The core's own sub-commands, there whatever plugins are loaded or disabled: ``tasks``,
``plugins`` and ``validate`` (gage_eval.cli.validate). Plugins add theirs through the ``gage_register_commands`` hook."""
from __future__ import annotations

import json
import os

import click

from gage_eval.api.errors import GageError


@click.command("tasks")
@click.option("--include-path", multiple=True, help="Also look in this folder of task folders.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def tasks_command(include_path, as_json):
    """List the tasks that can run, with the plugin (or path) each comes from."""
    from gage_eval.plugins import load_plugins
    from gage_eval.tasks.spec import discover, read_task_file

    _, registry = load_plugins()
    found = discover(registry.task_paths, list(include_path))
    rows = []
    for name, src in sorted(found.items()):
        try:
            spec = read_task_file(src.folder, src.origin, src.params)
            rows.append({"name": name, "origin": src.origin, "kind": spec.kind, "folder": str(src.folder),
                         "description": spec.description.strip().splitlines()[0] if spec.description else ""})
        except GageError as exc:
            rows.append({"name": name, "origin": src.origin, "kind": "INVALID", "folder": str(src.folder),
                         "description": str(exc).splitlines()[0]})
    rows += _group_rows(found)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("no tasks found (no plugin registers task folders; add --include-path DIR)", err=True)
    width = max([len(r["name"]) for r in rows] + [4])
    for r in rows:
        click.echo(f"{r['name'].ljust(width)}  {r['kind']:<13}  {r['origin']:<10}  {r['description']}")


def _group_rows(found) -> list[dict]:
    """A row for each group the task files define (``--tasks GROUP`` runs its tasks)."""
    from gage_eval.tasks.groups import discover_groups, leaves

    try:
        groups = discover_groups(found)
        tasks = {name: leaves(name, found, groups) for name in groups}
    except GageError as exc:
        return [{"name": "(groups)", "origin": "", "kind": "INVALID", "folder": "", "description": str(exc)}]
    return [{"name": name, "origin": found[tasks[name][0]].origin, "kind": "group",
             "folder": os.path.dirname(groups[name].where), "description": f"a group of {len(tasks[name])} tasks: "
             f"{', '.join(tasks[name][:3])}{', ...' if len(tasks[name]) > 3 else ''}"}
            for name in sorted(groups) if tasks[name]]


@click.command("plugins")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def plugins_command(as_json):
    """List the loaded plugins, their versions and what each registered."""
    from gage_eval.plugins import BUILTIN, load_plugins, plugin_versions

    pm, registry = load_plugins()
    versions = plugin_versions()
    registered = registry.by_plugin()
    rows = []
    for name, plugin in pm.list_name_plugin():
        if plugin is None:  # blocked by GAGE_EVAL_DISABLE_PLUGINS: pluggy keeps the name, not the plugin
            continue
        version = versions.get(name) or getattr(plugin, "__version__", None)
        if name == BUILTIN:
            from gage_eval import __version__ as version
        rows.append({"name": name, "version": version, "registers": registered.get(name, {})})
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("no plugins loaded (see GAGE_EVAL_DISABLE_PLUGINS)", err=True)
    for row in rows:
        click.echo(f"{row['name']} {row['version'] or ''}".rstrip())
        for kind, names in row["registers"].items():
            click.echo(f"  {kind}: {', '.join(names)}")
