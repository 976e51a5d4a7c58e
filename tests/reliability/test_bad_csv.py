"""A CSV that the reader (Hugging Face datasets, pandas) gives up on part way, an unterminated
quote: the task fails with one line naming the file and what the reader said (exit 3), not an
internal error (exit 5)."""
from __future__ import annotations

from harness import TASK_FAILED, check


def test_an_unterminated_quote_in_a_csv(gage):
    data = gage.tmp / "bad.csv"
    data.write_text('goal,sol1,sol2,label\nQ?,yes,no,0\n"Q?,yes,no,1\nx,y\n')
    o = gage("--tasks", "piqa", "--model", "dummy", "--data", f"piqa={data}")
    check(o, TASK_FAILED, "bad.csv", "EOF inside string")
    assert "internal error" not in o.text
    failure = o.summary["tasks"]["piqa"]["failure"]
    assert "bad.csv" in failure and "ParserError" in failure, failure
