"""A disk that fills mid-run (here: RLIMIT_FSIZE, what `ulimit -f` sets): exit 4, the records
written so far kept, one way forward (--resume), and no line telling the user to edit the run
folder by hand; the resume then finishes the run with every row once."""
from __future__ import annotations

import resource

from harness import OK, OUTPUT, check


def small_files():
    resource.setrlimit(resource.RLIMIT_FSIZE, (24 << 10, 24 << 10))


def test_a_full_disk_mid_run_then_resume(gage):
    o = gage("--tasks", "piqa", "--model", "dummy", preexec=small_files)
    written = (o.run_dir / "samples" / "piqa.jsonl").read_bytes().count(b"\n")  # whole records
    check(o, OUTPUT, "File too large", f"gage-eval --resume {o.run_dir}")
    assert "changed by hand" not in o.text and "remove that line" not in o.text, o.text
    assert "report.html" not in o.text and not (o.run_dir / "report.html").exists()  # (no page of cut records)
    resumed = gage("--resume", o.run_dir)
    check(resumed, OK, "0 errored")
    assert (o.run_dir / "report.html").is_file()
    total = resumed.summary["tasks"]["piqa"]["counts"]["total"]
    ids = [r["id"] for r in resumed.records("piqa")]
    assert 0 < written < total and len(ids) == len(set(ids)) == total


def no_file_bytes():
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))


def test_a_full_disk_before_the_first_byte_names_the_folder(gage):
    o = gage("--tasks", "piqa", "--model", "dummy", preexec=no_file_bytes)
    check(o, OUTPUT, f"{o.run_dir}", "File too large")
    assert len([line for line in o.err.splitlines() if "error" in line]) == 1, o.err


def test_the_resume_command_it_prints_can_be_pasted_for_a_folder_with_a_space(gage):
    """The command a full disk or a second run prints is shell-quoted: ``--resume my runs/r`` would run ``my``."""
    out = gage.tmp / "my runs"
    o = gage("--tasks", "piqa", "--model", "dummy", out=out, preexec=small_files)
    check(o, OUTPUT, "File too large", f"gage-eval --resume '{out / 'r'}'")
    again = gage("--tasks", "piqa", "--model", "dummy", out=out)
    assert f"use --resume '{out / 'r'}' to continue it" in again.text, again.text
    check(gage("--resume", o.run_dir), OK, "0 errored")
