"""A data line too big for a row: reported as that row's load error, read without holding it
whole, and its record stays small, so the run folder stays readable (report.html, --resume).
Before, the row's text went into its record whole: a 300 MB line made a 300 MB samples line,
which the run's own reader refused ("a line over 64 MiB ... changed by hand")."""
from __future__ import annotations

import json

from harness import ROW_ERRORS, check

from gage_eval.api.jsonio import MAX_ROW_BYTES


def test_a_line_over_the_row_limit_is_its_rows_load_error(gage):
    good = json.dumps({"goal": "Q?", "sol1": "yes", "sol2": "no", "label": 0}) + "\n"
    huge = json.dumps({"goal": "x" * (MAX_ROW_BYTES + 10), "sol1": "yes", "sol2": "no", "label": 1}) + "\n"
    data = gage.tmp / "rows.jsonl"
    data.write_text(good + huge + good)
    o = gage("--tasks", "piqa", "--model", "dummy", "--data", f"piqa={data}")
    check(o, ROW_ERRORS, f"{data}:2: load error: a line of {len(huge)} bytes", "over the 16 MiB")
    errors = o.errors("piqa")
    assert list(errors) == [f"{data}:2"] and errors[f"{data}:2"]["stage"] == "load"
    assert o.summary["tasks"]["piqa"]["counts"] == {**o.summary["tasks"]["piqa"]["counts"], "total": 3,
                                                    "scored": 2, "errored": 1}
    assert (o.run_dir / "samples" / "piqa.jsonl").stat().st_size < 1 << 20
    assert (o.run_dir / "report.html").exists()
    v = gage("validate", data, "--schema", "sample")
    assert f"{data}:2:" in v.text and "over the 16 MiB" in v.text and "Traceback" not in v.text
