"""A run folder that a gage-eval process is writing now (it holds RUN_DIR/.lock) is not read as
a finished run: rescore, merge, report and compare refuse it in one line naming the process."""
from __future__ import annotations

import os

import pytest

from gage_eval.runfolder.rundir import RunLock


@pytest.fixture
def finished(run_cli, tmp_path):
    for run_id in ("a", "b"):
        result = run_cli("--tasks", "piqa", "--model", "dummy", "--limit", "3", "-o", tmp_path, "--run-id", run_id, "-q")
        assert result.exit_code == 0, result.output
    return tmp_path / "a", tmp_path / "b"


@pytest.mark.parametrize("command", ["rescore", "merge", "report", "compare"])
def test_a_run_being_written_is_refused(run_cli, tmp_path, finished, command):
    a, b = finished
    args = {"rescore": [a, "-o", tmp_path / "new"], "merge": [a, b, "-o", tmp_path / "new"],
            "report": [a, "-o", tmp_path / "new.html"], "compare": [b, a]}[command]
    with RunLock(a):  # as a resume of it would hold it
        held = run_cli(command, *args)
    assert held.exit_code == 2, held.output
    assert f"{a}: the run is still going (gage-eval process {os.getpid()} is writing it); wait for it to end" \
        in held.output
    assert not (tmp_path / "new").exists() and not (tmp_path / "new.html").exists()
    after = run_cli(command, *args)  # the lock released: read as before (merge: two whole runs are no shards)
    assert "still going" not in after.output and after.exit_code == (2 if command == "merge" else 0), after.output
