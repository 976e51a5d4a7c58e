"""Data files whose bytes are no UTF-8 text, named for what they are (not all as UTF-16), and a
byte-order mark in the middle of a file (files joined with cat), through the real CLI."""
from __future__ import annotations

import io
import lzma
import zipfile

import pytest

from harness import ROW_ERRORS, TASK_FAILED, check
from test_data_files import good, rows, run_piqa

TEXT = rows(good(1), good(2))


def _zip(data: bytes) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        z.writestr("rows.jsonl", data)
    return out.getvalue()


@pytest.mark.parametrize("content, message", [
    (TEXT.decode().encode("utf-32"), "looks like UTF-32 text; gage-eval reads UTF-8 jsonl: convert it with iconv -f UTF-32"),
    (TEXT.decode().encode("utf-32-be")[4:], "looks like UTF-32 text"),
    (b"\x00" * 4096 + TEXT, "starts with NUL bytes, not text"),
    (lzma.compress(TEXT), "is xz-compressed; decompress it first (unxz)"),
    (b"\x28\xb5\x2f\xfd" + bytes(range(40)), "is zstd-compressed; decompress it first (unzstd)"),
    (_zip(TEXT), "is a zip archive; unpack it first (unzip)"),
], ids=["utf32", "utf32-be-no-bom", "nul-filled", "xz", "zstd", "zip"])
def test_a_file_that_is_no_text_is_named_for_what_it_is(gage, content, message):
    o, path = run_piqa(gage, content)
    check(o, TASK_FAILED, f"{path}: {message}")
    assert "UTF-16" not in o.text
    v = gage("validate", path, "--schema", "sample")
    assert "Traceback" not in v.text and v.rc != 0 and message in v.text, v.text


def test_a_byte_order_mark_mid_file_is_named(gage):
    o, path = run_piqa(gage, b"\xef\xbb\xbf" + TEXT + b"\xef\xbb\xbf" + TEXT)
    check(o, ROW_ERRORS)
    errors = o.errors("piqa")
    assert list(errors) == [f"{path}:3"], errors
    assert "byte-order mark" in errors[f"{path}:3"]["message"], errors
    assert o.summary["tasks"]["piqa"]["counts"]["scored"] == 3
