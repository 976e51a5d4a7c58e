"""Flag values an outside attack pass (issue 24) found let through, through the real CLI."""
from __future__ import annotations

from harness import ROOT, USAGE, check

SAMPLE = ROOT / "tasks" / "piqa" / "sample.jsonl"


def test_max_error_rate_nan_is_refused(gage):
    # click's FloatRange(0, 1) lets nan pass (every comparison with nan is false); the run then
    # exited 0 with half its rows errored, and config.json recorded max_error_rate as null.
    o = gage("--tasks", "piqa", "--data", f"piqa={SAMPLE}", "--limit", "4", "--model", "dummy",
             "--model-args", "fail_every=2", "--max-error-rate", "nan", "--no-report")
    check(o, USAGE, "--max-error-rate", "nan")
    assert o.run_dir is None or not (o.run_dir / "summary.json").exists()
