"""``gage-eval report RUN_DIR [RUN_DIR ...] -o FILE``. Light to import (``gage-eval --help`` lists
it): the page is imported when the command runs."""
from __future__ import annotations

from pathlib import Path

import click


@click.command("report")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(file_okay=False, path_type=Path))
@click.option("-o", "--output", "output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The HTML file to write (default: RUN_DIR/report.html for one run, report.html for several).")
def report_command(run_dirs: tuple[Path, ...], output: Path | None) -> None:
    """Write one self-contained HTML report of one or more run folders (several: side by side).
    It is never written into a run folder (but as the one run's own report.html) nor over a file
    that is not a page gage-eval wrote."""
    from gage_eval.api import GageError, RunFolder
    from gage_plugins_builtin import pages

    from gage_plugins_builtin.report.page import render_report

    for d in run_dirs:
        if not d.is_dir():
            raise GageError(f"{d}: no such run folder")
        RunFolder(d).check_idle("report")
    out = output or (run_dirs[0] / "report.html" if len(run_dirs) == 1 else Path("report.html"))
    pages.check_page_output(out, list(run_dirs), "-o" if output else "the report",
                      own_report=run_dirs[0] / "report.html" if len(run_dirs) == 1 else None)
    path = render_report(list(run_dirs), out)
    size = path.stat().st_size
    click.echo(f"wrote {path} ({f'{size / 1e6:.1f} MB' if size >= 1e6 else f'{max(1, round(size / 1e3))} kB'})")
