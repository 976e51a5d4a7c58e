"""A task that wrote no record (an empty data file) fails with one line; the report does not
add a second one about reading its rows again (it has no sample to order)."""
from __future__ import annotations

from harness import TASK_FAILED, check


def test_an_empty_data_file_is_said_once(gage):
    data = gage.tmp / "empty.jsonl"
    data.write_text("")
    o = gage("--tasks", "piqa", "--model", "dummy", "--data", f"piqa={data}")
    check(o, TASK_FAILED, f"no rows: {data} is empty")
    assert "could not be read again" not in o.text, o.text
    assert (o.run_dir / "report.html").exists()
