"""From command-line flags (and an optional run config) to a finished run and its printed results."""
from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import click

from gage_eval.api.errors import GageError, interrupt_reason
from gage_eval.api.runfolder import RunFolder, folder_name_ok
from gage_eval.cli.resume import resume_command, resumed_options
from gage_eval.cli.settings import build_options, without_writers
from gage_eval.config.options import RunOptions, new_run_id
from gage_eval.engine.interrupts import sigterm_interrupts
from gage_eval.engine.loop import Engine
from gage_eval.engine.summary import print_results
from gage_eval.runfolder.rundir import LOCK_FILE, RunLock, remove_unused_run_dir


def run_from_cli(*, resume: str | None, quiet: bool, dry_run: int | None = None, drop_writers: Any = (),
                 **kwargs: Any) -> dict:
    """Run (or resume) and print the results; exits with the documented status (see the README).
    ``dry_run=N`` prints the settings and N requests a task instead (:mod:`gage_eval.cli.dryrun`);
    ``drop_writers``: writers the run (its config, or the stored run on resume) names, left out."""
    if resume:
        run_dir = Path(resume)
        if not RunFolder(run_dir).config_file.is_file():
            raise GageError(f"--resume {run_dir}: no config.json there; is it a gage-eval run folder?")
    if dry_run is not None:
        from gage_eval.cli.dryrun import dry_run as show

        options = (resumed_options(run_dir, kwargs, drop_writers) if resume
                   else _new_options(quiet, kwargs, drop_writers))
        status = show(options, rows=dry_run)
        if status:
            raise SystemExit(status)
        return {}
    if not resume:
        options = _new_options(quiet, kwargs, drop_writers)
        options.run_id = options.run_id or new_run_id()
        if not folder_name_ok(options.run_id) or options.run_id.startswith("-"):
            raise GageError(f"--run-id {options.run_id!r}: a run id is a folder name (letters, digits, . _ -, not "
                            f"starting with -), not a path; use --output-dir to choose where run folders go")
        run_dir = Path(options.output_dir) / options.run_id
    fresh = not resume and not run_dir.exists()
    with RunLock(run_dir):
        if resume:
            options = resumed_options(run_dir, kwargs, drop_writers)
            options.quiet = quiet
        elif any(p.name != LOCK_FILE for p in run_dir.iterdir()):
            raise GageError(f"run folder {run_dir} already exists; use --resume {shlex.quote(str(run_dir))} to continue it")
        try:
            with sigterm_interrupts():
                summary = Engine(options, run_dir, resume=bool(resume)).run()
        except KeyboardInterrupt as exc:
            # click turns KeyboardInterrupt into a bare "Aborted", so say what to do here
            why, status = interrupt_reason(exc)
            if fresh and not RunFolder(run_dir).config_file.exists():
                remove_unused_run_dir(run_dir)
                click.echo(f"\ngage-eval: {why} before the run began; nothing was written", err=True)
            else:
                click.echo(f"\ngage-eval: {why}; the rows finished so far and their summary are in {run_dir}; "
                           f"run only what is missing with: {resume_command(run_dir, options)}", err=True)
            raise SystemExit(status) from None
        except GageError:
            if fresh:  # refused before anything was written: leave no empty run folder behind
                remove_unused_run_dir(run_dir)
            raise
    print_results(summary, run_dir)
    status = summary["run"]["exit_status"]
    if status:
        raise SystemExit(status)
    return summary


def _new_options(quiet: bool, flags: dict, drop_writers: Any) -> RunOptions:
    options = build_options(quiet=quiet, **flags)
    options.writers = without_writers(options.writers, drop_writers)
    return options
