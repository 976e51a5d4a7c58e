"""``gage-eval compare RUN_A RUN_B``. Light to import (``gage-eval --help`` lists it): the
comparison is imported when the command runs."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from gage_plugins_builtin.compare import DEFAULT_SAMPLES, DEFAULT_SEED


@click.command("compare")
@click.argument("run_a", type=click.Path(path_type=Path))
@click.argument("run_b", type=click.Path(path_type=Path))
@click.option("--task", "tasks", multiple=True, metavar="T",
              help="Compare only this task (repeatable, or comma-separated; default: every task in both runs).")
@click.option("--samples", "resamples", type=int, default=DEFAULT_SAMPLES, show_default=True, metavar="B",
              help="Bootstrap resamples for the interval of each difference (0: no interval).")
@click.option("--seed", type=int, default=DEFAULT_SEED, show_default=True, metavar="N",
              help="Seed of the bootstrap resampling.")
@click.option("--html", "html_file", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE",
              help="Also write the comparison as a self-contained HTML page.")
@click.option("--json", "as_json", is_flag=True, help="Print the whole comparison as JSON.")
def compare_command(run_a, run_b, tasks, resamples, seed, html_file, as_json):
    """Compare two run folders sample by sample: per task and metric the means, the difference
    B-A with a paired bootstrap 95% interval, McNemar's exact test and the flipped samples for
    binary metrics, and the settings that differ. Exits 2 when the runs cannot be aligned."""
    from gage_eval.api import GageError
    from gage_plugins_builtin import pages

    from gage_plugins_builtin.compare.paired import compare_runs
    from gage_plugins_builtin.compare.show import render_console, render_html

    try:
        if html_file is not None:  # before the work: a refused page costs nothing
            pages.check_page_output(html_file, [run_a, run_b], "--html")
        tasks = [t.strip() for arg in tasks for t in arg.split(",") if t.strip()]  # (as rescore's --task)
        result = compare_runs(run_a, run_b, tasks=tasks, resamples=resamples, seed=seed,
                              warn=lambda msg: click.echo(f"gage-eval: warning: {msg}", err=True))
        click.echo(json.dumps(result, indent=2) if as_json else render_console(result))  # (a page may fail)
        if html_file is not None:
            pages.write_page(html_file, [render_html(result)])  # (its folder made, as report's -o)
    except GageError as exc:
        click.echo(f"gage-eval: error: {exc}", err=True)
        sys.exit(exc.exit_code)
    if html_file is not None and not as_json:
        click.echo(f"HTML: {html_file}")
