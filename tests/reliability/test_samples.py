"""Sample v1 rows, paths and URLs in data, and legal_eval_v1 rows, through the real CLI; a run
and `gage-eval validate` agree on every row."""
from __future__ import annotations

import json
import re
import struct
import zlib

import pytest

from harness import OK, ROW_ERRORS, USAGE, check

TASK = """\
name: sv1
dataset: {loader: jsonl, args: {path: rows.jsonl}}
preprocessor: {name: identity}
request: {kind: generate, generation: {max_new_tokens: 8}}
metrics: [exact_match]
"""


def png() -> bytes:
    """A valid 1x1 PNG."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\x00\xff\x00\x00")) + chunk(b"IEND", b""))


def sample(i: int, **over) -> dict:
    row = {"schema_version": "v1", "id": f"s{i}", "messages": [{"role": "user", "content": f"Say {i}"}],
           "references": [f"Say {i}"]}
    row.update(over)
    return {k: v for k, v in row.items() if v is not None}


def image_row(i: int, url: str) -> dict:
    return sample(i, messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                            {"type": "text", "text": f"Say {i}"}]}])


def setup(gage, rows: list) -> tuple:
    folder = gage.tmp / "tasks" / "sv1"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "task.yaml").write_text(TASK)
    data = gage.tmp / "data" / "rows.jsonl"
    data.parent.mkdir(exist_ok=True)
    (data.parent / "img.png").write_bytes(png())
    (gage.outside / "img.png").write_bytes(png())
    data.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return folder, data


def run_sv1(gage, rows: list, *extra: str):
    _, data = setup(gage, rows)
    return gage("--tasks", "sv1", "--model", "dummy", "--model-args", "response=echo",
                "--include-path", gage.tmp / "tasks", "--data", f"sv1={data}", *extra), data


def validate(gage, data, *extra):
    return gage("validate", data, "--schema", "sample", *extra)


def invalid_lines(text: str, data) -> set[int]:
    found = (re.match(re.escape(f"{data}:") + r"(\d+): (?!warning:)", line) for line in text.splitlines())
    return {int(m.group(1)) for m in found if m}


# (case id, the second row, the error's text)
BAD_ROWS = [
    ("missing-id", sample(2, id=None), "id"),
    ("missing-schema-version", sample(2, schema_version=None), "schema_version"),
    ("references-a-string", sample(2, references="Say 2"), "references"),
    ("references-empty", sample(2, references=[]), "references"),
    ("duplicate-id", sample(1), "duplicate"),
    ("id-not-a-string", sample(2, id=2), "id"),
    ("messages-missing", sample(2, messages=None), "messages"),
    ("bad-role", sample(2, messages=[{"role": "wizard", "content": "hi"}]), "role"),
    ("nan-in-row", '{"schema_version": "v1", "id": "s2", "messages": [{"role": "user", "content": "x"}], '
                   '"references": ["x"], "metadata": {"w": NaN}}', "NaN"),
    ("image-parent-escape", image_row(2, "../outside/img.png"), "--allow-path"),
    ("image-absolute-etc-passwd", image_row(2, "/etc/passwd"), "/etc/passwd"),
    ("image-file-url", image_row(2, "file:///etc/passwd"), "/etc/passwd"),
    ("image-missing", image_row(2, "nope.png"), "nope.png"),
    ("image-http-url", image_row(2, "http://203.0.113.9/x.png"), "--allow-urls"),
    ("image-https-url", image_row(2, "https://example.com/x.png"), "--allow-urls"),
    ("attachment-escape", sample(2, messages=[{"role": "user", "content": [
        {"type": "file_url", "file_url": {"url": "../../../../etc/hostname"}},
        {"type": "text", "text": "Say 2"}]}]), "file_url"),
]


@pytest.mark.parametrize("bad, text", [c[1:] for c in BAD_ROWS], ids=[c[0] for c in BAD_ROWS])
def test_bad_sample_row(gage, bad, text):
    o, data = run_sv1(gage, [sample(1), bad, sample(3)])
    check(o, ROW_ERRORS)
    errors = o.errors("sv1")
    assert list(errors) == [f"{data}:2"], errors
    assert text in errors[f"{data}:2"]["message"], errors
    # validate reads and checks the rows through the same code, and agrees
    v = validate(gage, data)
    assert "Traceback" not in v.text and v.rc == 1, v.text
    assert invalid_lines(v.text, data) == {2}, v.text
    assert not v.violations


def test_valid_rows_with_a_local_image(gage):
    o, data = run_sv1(gage, [sample(1), image_row(2, "img.png"), image_row(3, "./img.png")])
    check(o, OK)
    v = validate(gage, data)
    assert v.rc == 0 and "3 valid" in v.text, v.text


def test_allow_path_lets_a_folder_in(gage):
    rows = [sample(1), image_row(2, str(gage.outside / "img.png"))]
    o, data = run_sv1(gage, rows)
    check(o, ROW_ERRORS, "--allow-path")
    gage.watch.remove(gage.outside)  # now allowed
    o = gage("--tasks", "sv1", "--model", "dummy", "--model-args", "response=echo", "--include-path",
             gage.tmp / "tasks", "--data", f"sv1={data}", "--allow-path", gage.outside, run_id="r2")
    check(o, OK)
    assert validate(gage, data, "--allow-path", gage.outside).rc == 0


def test_unknown_top_level_key_warns_in_run_and_validate(gage):
    o, data = run_sv1(gage, [sample(1), sample(2, colour="red")])
    check(o, OK, "colour")
    v = validate(gage, data)
    assert v.rc == 0 and "colour" in v.text


def test_every_row_invalid_fails_the_task(gage):
    o, _ = run_sv1(gage, [sample(1, id=None), sample(2, references="x")])
    check(o, 3, "all 2 rows errored")


LEGAL = {"schema_version": "legal_eval_v1", "id": "t:mcq:1", "dataset": "t", "task_type": "mcq",
         "prompt": "Pick one.", "choices": [{"id": "A", "text": "yes"}, {"id": "B", "text": "no"}],
         "correct_choice_ids": ["A"], "metadata": {"policy_id": "p", "language": "English"}}


@pytest.mark.parametrize("bad, text", [
    ({**LEGAL, "id": "t:mcq:2", "correct_choice_ids": ["Z"]}, "correct_choice_ids"),
    ({k: v for k, v in {**LEGAL, "id": "t:mcq:2"}.items() if k != "prompt"}, "prompt"),
    ({**LEGAL, "id": "t:mcq:2", "task_type": "essay"}, "task_type"),
    ({**LEGAL, "id": "t:mcq:2", "attachments": ["../../../../etc/passwd"]}, "attachments"),
], ids=["choice-not-offered", "missing-prompt", "unknown-task-type", "attachment-escape"])
def test_bad_legal_row(gage, bad, text):
    data = gage.tmp / "legal.jsonl"
    data.write_text(json.dumps(LEGAL) + "\n" + json.dumps(bad) + "\n")
    o = gage("--tasks", "legal_eval_v1", "--model", "dummy", "--data", f"legal_eval_v1={data}")
    check(o, ROW_ERRORS)
    errors = o.errors("legal_eval_v1")
    assert list(errors) == [f"{data}:2"], errors
    assert text in errors[f"{data}:2"]["message"], errors
    v = gage("validate", data, "--schema", "legal_eval_v1")
    assert "Traceback" not in v.text and v.rc == 1 and invalid_lines(v.text, data) == {2}, v.text


def test_validate_on_unreadable_input(gage):
    deep = gage.tmp / "deep.jsonl"
    deep.write_text("[" * 100000 + "]" * 100000 + "\n")
    v = validate(gage, deep)
    assert "Traceback" not in v.text and v.rc == 1 and "nest" in v.text
    utf16 = gage.tmp / "u16.jsonl"
    utf16.write_bytes(json.dumps(sample(1)).encode("utf-16"))
    v = validate(gage, utf16)
    assert "Traceback" not in v.text and v.rc != 0 and "UTF-16" in v.text
    assert validate(gage, gage.tmp / "missing.jsonl").rc == USAGE
