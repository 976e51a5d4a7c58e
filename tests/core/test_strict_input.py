"""Strict input: JSON rows (NaN, duplicate keys, deep nesting, encodings), YAML files (duplicate
keys, alias bombs, bad encodings), strict JSON outputs, and the run and ``validate`` agreeing."""
from __future__ import annotations

import gzip
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gage_eval.api import strictjson
from gage_eval.api.errors import GageError
from gage_eval.api.errors import InputError
from gage_eval.api.jsonio import iter_json_rows
from gage_eval.api.yamlio import read_yaml
from gage_eval.api.runfolder import write_json_atomic
from gage_eval.api.jsonlines import dumps
from gage_eval.tasks.spec import read_task_file

ROOT = Path(__file__).resolve().parents[2]
PIQA = {"goal": "Open a jar.", "sol1": "Twist the lid.", "sol2": "Freeze the jar.", "label": 0}
GOOD = json.dumps(PIQA)
LONE = "half of a UTF-16 pair, it cannot be written as UTF-8"
DEEP = '{"goal": ' + "[" * 100_000 + "]" * 100_000 + "}"


def rows(path: Path) -> list[tuple[int, object, str | None]]:
    return list(iter_json_rows(path))


# -- JSON rows -----------------------------------------------------------------------------

@pytest.mark.parametrize("line, error", [
    ('{"a": NaN}', "a: invalid JSON: NaN is not allowed (column 7)"),
    ('{"a": "NaN", "b": [1, Infinity]}', "b[1]: invalid JSON: Infinity is not allowed (column 23)"),
    ('{"a": -Infinity}', "a: invalid JSON: -Infinity is not allowed (column 7)"),
    ('{"a": 1, "b": {"c": 1, "c": 2}}', "invalid JSON: duplicate key 'c' in an object"),
    (DEEP, "goal[0][0][0]...: invalid JSON: nested deeper than 200 levels (column 209)"),
    ('{"a":' * 5000 + "1" + "}" * 5000, "a.a.a.a...: invalid JSON: nested deeper than 200 levels (column 1001)"),
    ('{"a": 1} {"b": 2}', "invalid JSON: extra data after the JSON value (column 10)"),
    ('{"a": 1', "invalid JSON: Expecting ',' delimiter (column 8)"),
    ('{"a": 1e999}', "a: invalid JSON: number out of range: 1e999 (column 7)"),
    ('{"a": [1.5, -1E+400]}', "a[1]: invalid JSON: number out of range: -1E+400 (column 13)"),
    ('{"a": ' + "7" * 5000 + "}",
     "a: invalid JSON: number out of range: an integer of more than 4300 digits (column 7)"),
    (r'{"a": "x\ud800"}', f"a: invalid JSON: lone surrogate \\ud800: {LONE} (column 9)"),
    (r'{"a": "\ude00\ud83d"}', f"a: invalid JSON: lone surrogate \\ude00: {LONE} (column 8)"),
    (r'{"a": ["\ud83d\ude00", "\uDBFF"]}', f"a[1]: invalid JSON: lone surrogate \\udbff: {LONE} (column 25)"),
    (r'{"\udc00": 1}', f"invalid JSON: lone surrogate \\udc00: {LONE} (column 3)"),  # in a key: the row's
    (r'{"a": "\\\ud800"}', f"a: invalid JSON: lone surrogate \\ud800: {LONE} (column 10)"),
    ('{"a b": {"c": [{"d": NaN}]}}', '["a b"].c[0].d: invalid JSON: NaN is not allowed (column 22)'),
])
def test_bad_json_rows_are_row_errors(tmp_path, line, error):
    path = tmp_path / "rows.jsonl"
    path.write_text(f"{GOOD}\n{line}\n{GOOD}\n")
    got = rows(path)
    assert [(n, e) for n, _, e in got] == [(1, None), (2, error), (3, None)]
    assert got[0][1] == got[2][1] == PIQA


def test_nesting_up_to_the_limit_is_read(tmp_path):
    value: object = 1
    for _ in range(strictjson.MAX_DEPTH - 1):
        value = {"a": value}
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"x": value}) + "\n" + json.dumps({"x": [value]}) + "\n")
    (_, ok, e1), (_, _, e2) = rows(path)
    assert ok == {"x": value} and e1 is None
    assert e2 == "x[0].a.a...: invalid JSON: nested deeper than 200 levels (column 1196)"  # the 199th '{'


def test_values_that_look_bad_but_are_not(tmp_path):
    path = tmp_path / "rows.jsonl"
    lines = [r'{"a": "\ud83d\ude00 \uD83D\uDE00", "b": "\\ud800", "c": "1e999"}', '{"a": 1e-400, "b": 1.7e308}',
             '{"a": ' + "7" * 4300 + "}"]
    path.write_text("\n".join(lines) + "\n")
    assert [(v, e) for _, v, e in rows(path)] == [
        ({"a": "\U0001F600 \U0001F600", "b": "\\ud800", "c": "1e999"}, None), ({"a": 0.0, "b": 1.7e308}, None),
        ({"a": int("7" * 4300)}, None)]


def test_brackets_inside_strings_do_not_count(tmp_path):
    path = tmp_path / "rows.jsonl"
    text = "[" * 1000 + '\\"{' * 300
    path.write_text(json.dumps({"q": text}) + "\n")
    assert rows(path) == [(1, {"q": text}, None)]


def test_encodings(tmp_path):
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + GOOD.encode() + b"\n" + b'{"a": "caf\xe9"}\n' + GOOD.encode() + b"\n")
    assert rows(bom) == [(1, PIQA, None), (2, None, "a: not UTF-8 text: invalid continuation byte (byte 11: 0xe9)"),
                         (3, PIQA, None)]
    for name, data, message in [
        ("le.jsonl", GOOD.encode("utf-16"), "looks like UTF-16 text; gage-eval reads UTF-8 jsonl: convert it with "
                                            "iconv -f UTF-16 -t UTF-8"),
        ("nobom.jsonl", GOOD.encode("utf-16-le"), "looks like UTF-16 text"),
        ("be.jsonl", GOOD.encode("utf-16-be"), "looks like UTF-16 text"),
        ("z.jsonl", gzip.compress(GOOD.encode()), "is gzip-compressed; decompress it first (gunzip)"),
    ]:
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(GageError) as err:
            rows(path)
        assert str(err.value).startswith(f"{path}: {message}")


def test_empty_file_has_no_rows(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "blank.jsonl").write_text("\n  \n")
    assert rows(tmp_path / "empty.jsonl") == rows(tmp_path / "blank.jsonl") == []


def test_json_document_rows_carry_their_lines(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text('[\n  {"a": 1},\n\n  {"b": 2},\n  {"c": NaN},\n  {"d": 4}\n]\n')
    assert rows(path) == [(2, {"a": 1}, None), (4, {"b": 2}, None),
                          (5, None, "c: invalid JSON: NaN is not allowed (line 5, column 9); "
                                    "the rest of the file was not read")]
    path.write_text('{"a": 1}\n{"b": 2}\n')  # JSON lines in a .json file, as Hugging Face writes them
    assert rows(path) == [(1, {"a": 1}, None), (2, {"b": 2}, None)]
    path.write_text('{"a": {"b": 1, "b": 2}}')
    assert rows(path) == [(1, None, "invalid JSON: duplicate key 'b' in an object")]


def test_jsonl_loader_reads_through_the_strict_reader(tmp_path):
    from gage_plugins_builtin.loaders import JsonlLoader

    path = tmp_path / "rows.jsonl"
    path.write_text(f'{GOOD}\n[1, 2]\n{{"a": NaN}}\n')
    got = list(JsonlLoader(str(path)))
    assert got[0] == (f"{path}:1", PIQA)
    assert (got[1][0], str(got[1][1])) == (f"{path}:2", "expected a JSON object, got a list")
    assert (got[2][0], str(got[2][1])) == (f"{path}:3", "a: invalid JSON: NaN is not allowed (column 7)")
    with pytest.raises(GageError, match="does not exist"):
        JsonlLoader(str(tmp_path / "missing.jsonl"))
    (tmp_path / "z.jsonl").write_bytes(gzip.compress(b"{}"))
    with pytest.raises(GageError, match="is gzip-compressed"):
        JsonlLoader(str(tmp_path / "z.jsonl"))
    with pytest.raises(GageError, match="reads UTF-8 data"):
        JsonlLoader(str(path), encoding="latin-1")


# -- strict outputs -------------------------------------------------------------------------

def test_outputs_are_strict_json(tmp_path):
    record = {"ll": [-math.inf, -1.5], "score": math.nan, "nested": {"x": (math.inf, 1)}, "ok": 0.25}
    line = dumps(record)
    assert json.loads(line, parse_constant=lambda c: pytest.fail(f"{c} written")) == {
        "ll": [None, -1.5], "score": None, "nested": {"x": [None, 1]}, "ok": 0.25}
    assert dumps({"a": 1.5, "b": "x"}) == '{"a":1.5,"b":"x"}'
    write_json_atomic(tmp_path / "summary.json", {"stderr": math.nan, "value": 0.5})
    assert json.loads((tmp_path / "summary.json").read_text()) == {"stderr": None, "value": 0.5}


# -- YAML ------------------------------------------------------------------------------------

BOMB = "".join(f"{c}: &{c} [{', '.join(['*' + p] * 10) if p else ', '.join(['x'] * 10)}]\n"
               for p, c in zip(["", "a", "b", "c", "d", "e", "f"], "abcdefg"))


@pytest.mark.parametrize("text, message", [
    ("a: 1\nb:\n  c: 2\n  c: 3\n", ":4: duplicate key 'c' (first at line 3)"),
    ("name: x\nname: y\n", ":2: duplicate key 'name' (first at line 1)"),
    (BOMB, ":5: aliases expand to more than 100000 values"),
    ("a: &a [1, *a]\n", ":1: an alias refers to the value that contains it"),
    ("[" * 50_000 + "]" * 50_000, ": invalid YAML: nested deeper than 200 levels"),
    ("a: [1\nb: 2\n", ":2: invalid YAML: expected ',' or ']', but got ':'"),
    ("a: !!python/object/apply:os.system [ls]\n", ":1: invalid YAML: could not determine a constructor"),
])
def test_bad_yaml_is_named(tmp_path, text, message):
    path = tmp_path / "f.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as err:
        read_yaml(path)
    assert str(err.value).startswith(f"{path}{message}")


@pytest.mark.parametrize("text, message", [
    ("name: t\nversion: 1\x00\n", ":2: invalid YAML: character U+0000 (a control character) is not allowed"),
    ("a: 1\nb: 2\nc: x\x07y\n", ":3: invalid YAML: character U+0007 (a control character) is not allowed"),
])
def test_control_characters_in_yaml_are_one_line(tmp_path, text, message):
    # PyYAML's reader error was two lines ('in "<unicode string>", position N') without the line
    path = tmp_path / "f.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as err:
        read_yaml(path)
    assert str(err.value) == f"{path}{message}"


def test_a_yaml_file_that_never_ends_is_refused_not_read(tmp_path):
    with pytest.raises(InputError, match=r"^/dev/zero: larger than 16 MiB: not a task file or run config$"):
        read_yaml(Path("/dev/zero"))


def test_yaml_merge_keys_may_be_overridden(tmp_path):
    path = tmp_path / "f.yaml"
    path.write_text("\ufeffbase: &b {x: 1, y: 2}\nd:\n  <<: *b\n  x: 5\n")
    assert read_yaml(path) == {"base": {"x": 1, "y": 2}, "d": {"x": 5, "y": 2}}


def test_yaml_encodings(tmp_path):
    path = tmp_path / "f.yaml"
    for data, message in [(b"a: 1\nb: caf\xe9\n", ":2: not UTF-8 text"),
                          ("a: 1\n".encode("utf-16"), ": looks like UTF-16 text"),
                          (gzip.compress(b"a: 1\n"), ": is gzip-compressed")]:
        path.write_bytes(data)
        with pytest.raises(InputError) as err:
            read_yaml(path)
        assert str(err.value).startswith(f"{path}{message}")


TASK = ("name: t\ndataset: {loader: jsonl, args: {path: rows.jsonl}}\nrequest: {kind: generate}\n"
        "metrics: [exact_match]\n")


@pytest.mark.parametrize("text, message", [
    ("", ": the file is empty"),
    ("- a\n- b\n", ": expected a mapping of task settings, got a list"),
    ("just text\n", ": expected a mapping of task settings, got a string"),
    (TASK + "metrics: [acc]\n", ":5: duplicate key 'metrics' (first at line 4)"),
    (TASK.replace("generate}", "generate, kind: generate}"), ":3: duplicate key 'kind' (first at line 3)"),
    (TASK + "description: caf\xe9\n", None),
])
def test_task_file_errors_name_the_file(tmp_path, text, message):
    (tmp_path / "task.yaml").write_bytes(text.encode("latin-1"))
    if message is None:  # a latin-1 byte
        message = ":5: not UTF-8 text"
    with pytest.raises(GageError) as err:
        read_task_file(tmp_path)
    assert str(err.value).startswith(f"{tmp_path / 'task.yaml'}{message}")


# -- end to end: the real CLI ----------------------------------------------------------------

def cli(*args, cwd=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "gage_eval.cli", *map(str, args)], capture_output=True,
                          text=True, env=env, cwd=cwd or ROOT, timeout=120)


def samples(run: Path, task: str) -> list[dict]:
    return [json.loads(l, parse_constant=lambda c: pytest.fail(f"{c} in the outputs"))
            for l in (run / "samples" / f"{task}.jsonl").read_text().splitlines()]


BAD_LINES = {  # line -> (text, the field named ("$": the row), the error it must get)
    2: ('{"goal": "g", "sol1": "a", "sol2": NaN, "label": 0}', "$.sol2",
        "invalid JSON: NaN is not allowed (column 36)"),
    3: ('{"goal": "g", "goal": "h", "sol1": "a", "sol2": "b", "label": 1}', "$",
        "invalid JSON: duplicate key 'goal' in an object"),
    4: (DEEP, "$.goal[0][0][0]...", "invalid JSON: nested deeper than 200 levels (column 209)"),
    5: ('{"goal": "g", "sol1": "a", "sol2": "b", "label": -Infinity}', "$.label",
        "invalid JSON: -Infinity is not allowed (column 50)"),
    6: ('{"goal": "g", "sol1": "a", "sol2": "b", "label": 0', "$",
        "invalid JSON: Expecting ',' delimiter (column 51)"),
    7: (r'{"goal": "\ud800", "sol1": "a", "sol2": "b", "label": 0}', "$.goal",
        f"invalid JSON: lone surrogate \\ud800: {LONE} (column 11)"),
    8: ('{"goal": "g", "sol1": "a", "sol2": "b", "label": 1e999}', "$.label",
        "invalid JSON: number out of range: 1e999 (column 50)"),
    9: (b'{"goal": "caf\xe9", "sol1": "a", "sol2": "b", "label": 0}', "$.goal",
        "not UTF-8 text: invalid continuation byte (byte 14: 0xe9)"),
}


def run_message(field: str, message: str) -> str:
    """A row error as a run writes it: the field without ``$.`` before the message."""
    return f"{field[2:]}: {message}" if field != "$" else message


def test_run_and_validate_agree_on_bad_json_rows(tmp_path):
    data = tmp_path / "piqa.jsonl"
    lines = [GOOD] + [BAD_LINES[n][0] for n in sorted(BAD_LINES)] + [GOOD]
    data.write_bytes(b"\xef\xbb\xbf" + b"\n".join(ln if isinstance(ln, bytes) else ln.encode() for ln in lines) + b"\n")
    proc = cli("--tasks", "piqa", "--model", "dummy", "--data", f"piqa={data}", "-o", tmp_path, "--run-id", "r")
    assert "Traceback" not in proc.stderr + proc.stdout
    records = samples(tmp_path / "r", "piqa")
    assert len(records) == len(lines)  # nothing dropped
    errors = {int(r["eval_result"]["error"]["locator"].rpartition(":")[2]): r["eval_result"]["error"]
              for r in records if (r.get("eval_result") or {}).get("error")}
    assert {n: (e["stage"], e["message"]) for n, e in errors.items()} == \
        {n: ("load", run_message(field, message)) for n, (_, field, message) in BAD_LINES.items()}
    assert all(e["locator"].startswith(f"{data}:") for e in errors.values())
    assert sum(1 for r in records if "overall" in (r.get("eval_result") or {})) == 2  # first and last line
    for n, (_, field, message) in BAD_LINES.items():
        assert f"{data}:{n}: load error: {run_message(field, message)}" in proc.stderr

    check = cli("validate", data, "--schema", "sample")
    assert "Traceback" not in check.stderr + check.stdout and check.returncode == 1
    for n, (_, field, message) in BAD_LINES.items():  # the same field and message, by file and line
        assert f"{data}:{n}: {field}: {message}" in check.stdout


def test_json_file_data_is_read_strictly_too(tmp_path):
    data = tmp_path / "piqa.json"
    data.write_text("[\n" + GOOD + ",\n" + GOOD.replace('"label": 0', '"label": 1') + "\n]\n")
    proc = cli("--tasks", "piqa", "--model", "dummy", "--data", f"piqa={data}", "-o", tmp_path, "--run-id", "r")
    assert "Traceback" not in proc.stderr and proc.returncode == 0, proc.stderr
    assert [r["metadata"]["locator"] if "locator" in r.get("metadata", {}) else r["id"]
            for r in samples(tmp_path / "r", "piqa")] == ["piqa-0", "piqa-1"]


@pytest.mark.parametrize("data, message", [
    ("a: 1\n".encode("utf-16"), "looks like UTF-16 text; gage-eval reads UTF-8 jsonl: convert it with iconv"),
    (gzip.compress(GOOD.encode()), "is gzip-compressed; decompress it first (gunzip)"),
])
def test_unreadable_data_files_are_named(tmp_path, data, message):
    path = tmp_path / "piqa.jsonl"
    path.write_bytes(data)
    proc = cli("--tasks", "piqa", "--model", "dummy", "--data", f"piqa={path}", "-o", tmp_path, "--run-id", "r")
    assert "Traceback" not in proc.stderr and proc.returncode != 0
    assert f"{path}: {message}" in proc.stdout + proc.stderr
    check = cli("validate", path, "--schema", "sample")
    assert "Traceback" not in check.stderr and check.returncode != 0
    assert f"{path}: {message}" in check.stderr


def test_duplicate_keys_in_task_file_and_run_config(tmp_path):
    folder = tmp_path / "tasks" / "t"
    folder.mkdir(parents=True)
    (folder / "task.yaml").write_text(TASK + "metrics: [contains]\n")
    proc = cli("--tasks", "t", "--model", "dummy", "--include-path", tmp_path / "tasks", "-o", tmp_path)
    assert "Traceback" not in proc.stderr and proc.returncode != 0
    assert f"{folder / 'task.yaml'}:5: duplicate key 'metrics' (first at line 4)" in proc.stdout + proc.stderr
    check = cli("validate", folder / "task.yaml", "--schema", "task")
    assert check.returncode == 1 and f"{folder / 'task.yaml'}:5: $: duplicate key 'metrics'" in check.stdout

    config = tmp_path / "run.yaml"
    config.write_text("tasks: [piqa]\nlimit: 2\nlimit: 3\n")
    proc = cli("--config", config, "--model", "dummy", "-o", tmp_path)
    assert "Traceback" not in proc.stderr and proc.returncode == 2
    assert f"{config}:3: duplicate key 'limit' (first at line 2)" in proc.stderr


@pytest.mark.parametrize("name, text, said", [
    ("task.yaml", "", "task.yaml:1: the file is empty: a YAML file holding one mapping of keys"),
    ("task.yaml", "# only a comment\n", "task.yaml:1: the file is empty: a YAML file holding one mapping of keys"),
    ("rows.jsonl", "", "rows.jsonl: no rows to check (the file is empty or holds only blank lines)"),
    ("rows.jsonl", "\n\n", "rows.jsonl: no rows to check (the file is empty or holds only blank lines)"),
])
def test_validate_says_why_an_empty_file_fails(tmp_path, run_cli, name, text, said):
    """An empty task.yaml said "None is not of type 'object'"; an empty jsonl only '0 rows ... ' and exit 1."""
    folder = tmp_path / "t"
    folder.mkdir()
    (folder / name).write_text(text)
    result = run_cli("validate", folder / name, "--schema", "task" if name == "task.yaml" else "sample")
    assert result.exit_code == 1
    assert f"{folder}/{said}" in result.output.splitlines(), result.output
