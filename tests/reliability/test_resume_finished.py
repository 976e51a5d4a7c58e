"""--resume of a run with no row left loads no model (it says so by what it does: no backend_open
event, model_load_s 0) and still rebuilds every writer's output; a run cut short loads it."""
from __future__ import annotations

import json

import pytest

from harness import OK, check

ROWS = 12


@pytest.fixture
def data(gage):
    path = gage.tmp / "rows.jsonl"
    path.write_text("".join(json.dumps({"goal": f"Question {i}?", "sol1": f"yes {i}", "sol2": "no", "label": i % 2})
                            + "\n" for i in range(ROWS)))
    return path


def opens(run_dir) -> int:
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    return sum(e.get("event") == "backend_open" for e in events)


def answers(records: list[dict]) -> list[dict]:
    """The records without the model's latency (a run again takes other milliseconds)."""
    for record in records:
        for pred in record.get("predict_result") or []:
            pred.pop("latency_ms", None)
    return records


def first_run(gage, data):
    o = gage("--tasks", "piqa", "--model", "dummy", "--data", f"piqa={data}", "-q", "--writer", "report")
    check(o, OK)
    assert opens(o.run_dir) == 1
    return o


def test_resume_of_a_finished_run_loads_no_model_and_rebuilds_the_outputs(gage, data):
    o = first_run(gage, data)
    records, summary = o.records("piqa"), o.summary
    (o.run_dir / "report.html").unlink()  # (as a SIGTERM while writing it leaves the folder)
    resumed = gage("--resume", o.run_dir)
    check(resumed, OK)
    assert opens(o.run_dir) == 1  # no second load
    assert "nothing left to run" in resumed.err
    assert resumed.summary["run"]["timings"]["model_load_s"] == 0.0
    assert resumed.records("piqa") == records
    assert resumed.summary["tasks"]["piqa"]["metrics"] == summary["tasks"]["piqa"]["metrics"]
    assert resumed.summary["run"]["model"] == summary["run"]["model"]
    assert resumed.summary["run"]["exit_status"] == summary["run"]["exit_status"] == OK
    assert (o.run_dir / "report.html").stat().st_size > 0


def test_resume_of_a_cut_run_loads_the_model_and_finishes_it(gage, data):
    o = first_run(gage, data)
    records = answers(o.records("piqa"))
    samples = o.run_dir / "samples" / "piqa.jsonl"
    samples.write_text("".join(line + "\n" for line in samples.read_text().splitlines()[:5]))
    resumed = gage("--resume", o.run_dir)
    check(resumed, OK)
    assert opens(o.run_dir) == 2 and "nothing left to run" not in resumed.err
    assert answers(resumed.records("piqa")) == records
