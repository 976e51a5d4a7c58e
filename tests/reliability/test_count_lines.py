"""The jsonl loader's row count (the progress bar's total) agrees with the rows the reader
yields, and holds no line whole: a 300 MB line took it 100 s and 1 GB (the unfinished line
was copied and split again for every 1 MiB block read)."""
from __future__ import annotations

import tracemalloc

import pytest

from gage_eval.api.jsonio import iter_json_rows
from gage_plugins_builtin.loaders import _count_lines

BLOCK = 1 << 20


@pytest.mark.parametrize("data", [
    b"", b"\n\n", b"{}", b"{}\n", b"{}\n\n  \n{}", b" \t\r\n{}\r\n", b"\xef\xbb\xbf{}\n{}\n",
    b"{}\n" + b" " * (BLOCK - 3) + b"\n{}",          # a blank line across a block boundary
    b"{}\n" + b" " * (BLOCK + 5) + b"x\n",           # a line whose only text is past the boundary
    b"\n" * BLOCK + b"{}",
], ids=["empty", "blank", "no-newline", "one", "blanks-between", "crlf", "bom", "blank-across-block",
        "text-past-block", "many-newlines"])
def test_the_count_is_the_rows_the_reader_yields(tmp_path, data):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(data)
    assert _count_lines(path) == sum(1 for _ in iter_json_rows(path))


def test_a_long_line_is_counted_without_holding_it(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b"{}\n" + b'{"a": "' + b"x" * (40 * BLOCK) + b'"}\n{}\n')
    tracemalloc.start()
    try:
        assert _count_lines(path) == 3
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * BLOCK, f"counting held {peak / BLOCK:.0f} MiB for one 40 MiB line"
