"""A CSV that the reader (Hugging Face datasets, pandas) gives up on part way, an unterminated
quote: the task fails with one line naming the file and what the reader said (exit 3), not an
internal error (exit 5)."""
from __future__ import annotations

import pytest

from harness import TASK_FAILED, check


def test_an_unterminated_quote_in_a_csv(gage):
    data = gage.tmp / "bad.csv"
    data.write_text('goal,sol1,sol2,label\nQ?,yes,no,0\n"Q?,yes,no,1\nx,y\n')
    o = gage("--tasks", "piqa", "--model", "dummy", "--data", f"piqa={data}")
    check(o, TASK_FAILED, "bad.csv", "EOF inside string")
    assert "internal error" not in o.text
    failure = o.summary["tasks"]["piqa"]["failure"]
    assert "bad.csv" in failure and "ParserError" in failure, failure



@pytest.mark.parametrize("name, data, message", [
    ("u16.csv", "goal,sol1,sol2,label\nQ?,yes,no,0\n".encode("utf-16"), ": looks like UTF-16 text"),
    ("latin1.csv", b"goal,sol1,sol2,label\nQ?,yes,no,0\ncaf\xe9?,yes,no,1\n", ":3: not UTF-8 text"),
])
def test_a_csv_not_in_utf8_names_the_file_and_its_line(gage, name, data, message):
    # was "cannot read csv:u16.csv ... UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff in
    # position 0": the file's name only and the codec's words, where a jsonl file says what it is
    path = gage.tmp / name
    path.write_bytes(data)
    o = gage("--tasks", "piqa", "--model", "dummy", "--data", f"piqa={path}")
    check(o, TASK_FAILED, f"{path}{message}")
    assert o.summary["tasks"]["piqa"]["failure"].startswith(f"{path}{message}")
