"""Bad data files and bad rows for a builtin task (piqa, legacy rows), through the real CLI."""
from __future__ import annotations

import gzip
import json

import pytest

from harness import OK, ROW_ERRORS, TASK_FAILED, USAGE, check

GOOD = {"goal": "Keep bread fresh.", "sol1": "Seal it in a bag.", "sol2": "Leave it in the sun.", "label": 0}


def rows(*lines: str | bytes) -> bytes:
    return b"".join((ln if isinstance(ln, bytes) else ln.encode()) + b"\n" for ln in lines)


def good(i: int = 0) -> str:
    return json.dumps({**GOOD, "goal": f"Question {i}?"})


def run_piqa(gage, content: bytes, *extra: str, name: str = "rows.jsonl", run_id: str = "r"):
    path = gage.tmp / "data" / name
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(content)
    return gage("--tasks", "piqa", "--model", "dummy", "--data", f"piqa={path}", *extra, run_id=run_id), path


# (case id, file content, exit status, {line: text the row's error must hold}, text the output must hold)
CASES = [
    ("empty-file", b"", TASK_FAILED, {}, "no rows"),
    ("blank-lines-only", b"\n\n  \n", TASK_FAILED, {}, "no rows"),
    ("every-line-broken", rows("{oops", "[1, 2]", "nope"), TASK_FAILED,
     {1: "invalid JSON", 2: "expected a JSON object", 3: "invalid JSON"}, "all 3 rows errored"),
    ("one-broken-line", rows(good(1), '{"goal": "x", ', good(3)), ROW_ERRORS, {2: "invalid JSON"}, ""),
    ("nan-value", rows(good(1), '{"goal": "q", "sol1": "a", "sol2": "b", "label": NaN}'), ROW_ERRORS,
     {2: "NaN"}, ""),
    ("infinity-value", rows(good(1), '{"goal": "q", "sol1": "a", "sol2": "b", "label": -Infinity}'), ROW_ERRORS,
     {2: "Infinity"}, ""),
    ("number-overflow", rows(good(1), '{"goal": "q", "sol1": "a", "sol2": "b", "label": 1e999}'), ROW_ERRORS,
     {2: "number out of range: 1e999"}, ""),
    ("lone-surrogate", rows(good(1), r'{"goal": "\ud800", "sol1": "a", "sol2": "b", "label": 0}'), ROW_ERRORS,
     {2: "lone surrogate \\ud800"}, ""),
    ("duplicate-key", rows(good(1), '{"goal": "q", "goal": "r", "sol1": "a", "sol2": "b", "label": 0}'),
     ROW_ERRORS, {2: "duplicate key 'goal'"}, ""),
    ("deep-nesting", rows(good(1), '{"goal": ' + "[" * 100000 + "]" * 100000 + "}"), ROW_ERRORS,
     {2: "nest"}, ""),
    ("deep-object-nesting", rows(good(1), '{"a":' * 50000 + "1" + "}" * 50000), ROW_ERRORS, {2: "nest"}, ""),
    ("utf8-bom", b"\xef\xbb\xbf" + rows(good(1), good(2)), OK, {}, ""),
    ("latin1-line", rows(good(1), '{"goal": "caf\xe9", "sol1": "a", "sol2": "b", "label": 0}'.encode("latin-1")),
     ROW_ERRORS, {2: "UTF-8"}, ""),
    ("utf16-file", rows(good(1), good(2)).decode().encode("utf-16"), TASK_FAILED, {}, "UTF-16"),
    ("gzip-file", gzip.compress(rows(good(1), good(2))), TASK_FAILED, {}, "gzip"),
    ("array-row", rows(good(1), "[1, 2, 3]"), ROW_ERRORS, {2: "expected a JSON object"}, ""),
    ("label-out-of-range", rows(good(1), json.dumps({**GOOD, "label": 5})), ROW_ERRORS, {2: "label"}, ""),
    ("label-wrong-type", rows(good(1), json.dumps({**GOOD, "label": "first"})), ROW_ERRORS, {2: "label"}, ""),
    ("missing-field", rows(good(1), json.dumps({"sol1": "a", "sol2": "b", "label": 0})), ROW_ERRORS,
     {2: "goal"}, ""),
    ("wrong-field-type", rows(good(1), json.dumps({**GOOD, "goal": 42})), ROW_ERRORS, {2: "goal"}, ""),
    ("choice-not-string", rows(good(1), json.dumps({**GOOD, "sol1": ["a"]})), ROW_ERRORS, {2: "sol1"}, ""),
    ("nul-bytes", rows(good(1), b'{"goal": "a\x00b", "sol1": "a", "sol2": "b", "label": 0}'), ROW_ERRORS,
     {2: "invalid JSON"}, ""),
    ("huge-string-row", rows(good(1), json.dumps({**GOOD, "goal": "x" * 5_000_000})), ROW_ERRORS,
     {2: "larger than"}, ""),
    ("long-but-sane-row", rows(good(1), json.dumps({**GOOD, "goal": "x" * 200_000})), OK, {}, ""),
]


@pytest.mark.parametrize("content, rc, row_errors, message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_data(gage, content, rc, row_errors, message):
    o, path = run_piqa(gage, content)
    check(o, rc, message)
    errors = o.errors("piqa")
    for line, text in row_errors.items():
        locator = f"{path}:{line}"
        assert locator in errors, f"no error record for {locator}: {sorted(errors)}"
        assert text in errors[locator]["message"], (locator, errors[locator])
    assert len(errors) == len(row_errors), sorted(errors)


def test_missing_data_file(gage):
    o = gage("--tasks", "piqa", "--model", "dummy", "--data", f"piqa={gage.tmp / 'nope.jsonl'}")
    check(o, USAGE, "nope.jsonl does not exist")
    assert not o.run_dir.exists()


def test_folder_without_data(gage):
    (gage.tmp / "empty").mkdir()
    o = gage("--tasks", "piqa", "--model", "dummy", "--data", f"piqa={gage.tmp / 'empty'}")
    check(o, TASK_FAILED, str(gage.tmp / "empty"))


def test_every_row_failing_in_the_backend_fails_the_task(gage):
    o, _ = run_piqa(gage, rows(good(1), good(2), good(3)), "--model-args", "fail_every=1")
    check(o, TASK_FAILED, "all 3 rows errored")


def test_max_error_rate_tolerates_a_share_of_errors(gage):
    content = rows(*[good(i) for i in range(4)])
    o, _ = run_piqa(gage, content, "--model-args", "fail_every=4", "--max-error-rate", "0.3")
    check(o, OK)
    assert o.summary["tasks"]["piqa"]["counts"]["errored"] == 1
    o, _ = run_piqa(gage, content, "--model-args", "fail_every=2", "--max-error-rate", "0.3", run_id="r2")
    check(o, ROW_ERRORS)
