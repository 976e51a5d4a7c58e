"""Flag values an outside attack pass (issue 24) found let through, through the real CLI."""
from __future__ import annotations

from harness import ROOT, TASK_FAILED, USAGE, check

SAMPLE = ROOT / "tasks" / "piqa" / "sample.jsonl"


def test_max_error_rate_nan_is_refused(gage):
    # click's FloatRange(0, 1) lets nan pass (every comparison with nan is false); the run then
    # exited 0 with half its rows errored, and config.json recorded max_error_rate as null.
    o = gage("--tasks", "piqa", "--data", f"piqa={SAMPLE}", "--limit", "4", "--model", "dummy",
             "--model-args", "fail_every=2", "--max-error-rate", "nan", "--no-report")
    check(o, USAGE, "--max-error-rate", "nan")
    assert o.run_dir is None or not (o.run_dir / "summary.json").exists()


def test_a_task_given_two_data_files_is_refused(gage, tmp_path):
    # the last --data for a task won, silently: piqa ran seven.jsonl's rows, three.jsonl never named
    three, seven = tmp_path / "three.jsonl", tmp_path / "seven.jsonl"
    lines = SAMPLE.read_text().splitlines(keepends=True)
    three.write_text("".join(lines[:3]))
    seven.write_text("".join(lines[:7]))
    o = gage("--tasks", "piqa", "--data", f"piqa={three}", "--data", f"piqa={seven}", "--model", "dummy")
    check(o, USAGE, f"--data: task 'piqa' is given two files, {three} and {seven}; give one")


def test_a_shard_that_holds_no_row_says_so_not_that_the_data_gave_none(gage):
    o = gage("--tasks", "piqa", "--data", f"piqa={SAMPLE}", "--limit", "4", "--model", "dummy",
             "--shard", "0/99999999999", "--no-report")
    check(o, TASK_FAILED, "no rows: shard 0/99999999999 holds none of the task's rows")
    assert "gave no row to run" not in o.err
