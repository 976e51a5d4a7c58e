"""The row checker (gage_eval.tasks.rows): one code path for a run and `gage-eval validate`.

Unit tests of the checker, then the real CLI in a subprocess over a Sample v1 file with
one bad row per rule: each bad row is written with an error naming file:line and the
field or path, the good rows are scored, `validate` gives the same verdict on every row,
and no file outside the data folder is read."""
from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from gage_eval.api.errors import RowError
from gage_eval.tasks.rows import RowChecker
from gage_plugins_builtin.preprocessors import Identity, Legacy

PNG_1PX = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")


def text_row(sid: str = "a", **extra) -> dict:
    return {"schema_version": "v1", "id": sid, "messages": [{"role": "user", "content": "hi"}],
            "references": ["x"], **extra}


def image_row(sid: str, url: str) -> dict:
    return {"schema_version": "v1", "id": sid, "references": ["x"], "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "what is it?"}]}]}


def without(row: dict, key: str) -> dict:
    return {k: v for k, v in row.items() if k != key}


@pytest.fixture
def checker(tmp_path):
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "ok.png").write_bytes(PNG_1PX)
    return RowChecker("t", Identity(), base_dir=tmp_path)


def test_a_valid_row_is_the_sample(checker):
    row = text_row()
    result = checker.check("f:1", 0, row)
    assert result.ok and result.stage is None and result.warnings == []
    assert result.sample["id"] == "a" and result.sample["references"] == [{"answer": [{"type": "text", "text": "x"}]}]
    assert row["references"] == ["x"]  # the input is not changed


@pytest.mark.parametrize("row, message", [
    (without(text_row(), "id"), "missing required field 'id'"),
    (without(text_row(), "schema_version"), "missing required field 'schema_version'"),
    (without(text_row(), "references"), "missing required field 'references'"),
    (without(text_row(), "messages"), "missing required field 'messages'"),
    (text_row(references="8"), "references: expected a list, got a string"),
    (text_row(messages={"role": "user"}), "messages: expected a list, got an object"),
    (text_row(schema_version="v2"), "schema_version: expected 'v1', got 'v2'"),
    (text_row(id=7), "id: 7 is not of type 'string'"),
    (text_row(references=[]), "references: the list is empty"),
    ([1, 2], "expected a JSON object (a Sample v1 row), got a list"),
])
def test_sample_v1_fields_are_never_filled_in(checker, row, message):
    result = checker.check("f:1", 0, row)
    assert not result.ok and result.stage == "validate"
    assert message in result.message, result.message


def test_the_identity_preprocessor_itself_refuses_too():
    with pytest.raises(ValueError, match="missing required field 'id'"):
        Identity()(without(text_row(), "id"), None)
    with pytest.raises(ValueError, match="references: expected a list, got a string"):
        Identity()(text_row(references="8"), None)


def test_every_problem_of_a_row_is_reported_once(checker):
    result = checker.check("f:1", 0, {"messages": "hi", "references": "8"})
    assert [where for where, _ in result.problems] == ["$", "$", "$.messages", "$.references"]
    assert "required property" not in result.message  # the schema's own words for the same fields are not repeated


def test_duplicate_ids_are_refused_across_the_task(checker):
    assert checker.check("f:1", 0, text_row("a")).ok
    dup = checker.check("f:2", 1, text_row("a"))
    assert not dup.ok and dup.problems == [("$.id", "duplicate sample id 'a'")]
    assert checker.check("f:3", 2, text_row("b")).ok


def test_an_invalid_row_does_not_take_its_id(checker):
    assert not checker.check("f:1", 0, text_row("a", references=[])).ok
    assert checker.check("f:2", 1, text_row("a")).ok


def test_a_rubric_stands_in_for_references(checker):
    row = text_row(references=[], eval_config={"rubric": [{"id": "r", "title": "names the court"}]})
    assert checker.check("f:1", 0, row).ok


def test_unknown_top_level_key_is_a_warning(checker):
    result = checker.check("f:1", 0, text_row(colour="red"))
    assert result.ok and result.warnings == [("$.colour", pytest.approx(result.warnings[0][1]))]
    assert "unknown top-level field" in result.warnings[0][1]
    bad = checker.check("f:2", 1, without(text_row("b", colour="red"), "id"))
    assert not bad.ok and bad.warnings  # warned whether or not the row is valid


def test_loader_errors_pass_through(checker):
    result = checker.check("f:1", 0, RowError("invalid JSON: Expecting value at column 1"))
    assert result.stage == "load" and result.message == "invalid JSON: Expecting value at column 1"


def test_local_image_paths_become_resolved_paths(checker, tmp_path, monkeypatch):
    monkeypatch.chdir("/")
    row = image_row("i", "img/ok.png")
    result = checker.check("f:1", 0, row)
    assert result.ok
    assert result.sample["messages"][0]["content"][0]["image_url"]["url"] == str((tmp_path / "img" / "ok.png").resolve())
    assert row["messages"][0]["content"][0]["image_url"]["url"] == "img/ok.png"


@pytest.mark.parametrize("url, words", [
    ("../x.png", ["'../x.png'", "outside the data folder", "--allow-path DIR"]),
    ("/etc/passwd", ["'/etc/passwd'", "outside", "--allow-path"]),
    ("file:///etc/passwd", ["'file:///etc/passwd'", "outside", "--allow-path"]),
    ("http://127.0.0.1:9/x.png", ["http(s) URLs in data are not fetched without --allow-urls"]),
    ("img/missing.png", ["'img/missing.png' not found"]),
])
def test_media_problems_name_the_field_and_path(checker, url, words):
    result = checker.check("f:1", 0, image_row("i", url))
    assert not result.ok and result.stage == "validate"
    assert result.message.startswith("messages[0].content[0].image_url.url: "), result.message
    assert all(w in result.message for w in words), result.message


def test_few_shot_media_are_checked_too(checker):
    row = text_row(few_shot_examples=[{"messages": image_row("s", "../x.png")["messages"], "references": ["y"]}])
    result = checker.check("f:1", 0, row)
    assert not result.ok and "few_shot_examples[0].messages[0].content[0].image_url.url" in result.message


def test_allowed_folder_and_urls(tmp_path):
    data, outside = tmp_path / "data", tmp_path / "outside"
    data.mkdir()
    outside.mkdir()
    (outside / "o.png").write_bytes(PNG_1PX)
    open_checker = RowChecker("t", Identity(), base_dir=data, allowed_dirs=[outside], allow_urls=True)
    assert open_checker.check("f:1", 0, image_row("a", "../outside/o.png")).ok
    assert open_checker.check("f:2", 1, image_row("b", "http://127.0.0.1:9/x.png")).ok
    assert open_checker.check("f:3", 2, image_row("c", "data:image/png;base64,iVBORw0KGgo=")).ok


def test_legacy_errors_name_the_field(checker, tmp_path):
    piqa = RowChecker("piqa", Legacy(question="goal", choices=["sol1", "sol2"], answer="label"), base_dir=tmp_path)
    row = {"goal": "g", "sol1": "a", "sol2": "b"}
    assert piqa.check("f:1", 0, dict(row, label=1)).ok
    out_of_range = piqa.check("f:2", 1, dict(row, label=5))
    assert out_of_range.stage == "preprocess"
    assert out_of_range.message == "label: answer index 5 is outside the 2 choices"
    assert piqa.check("f:3", 2, dict(row, goal=3, label=0)).message.startswith("goal: ")
    assert piqa.check("f:4", 3, {"sol1": "a", "sol2": "b", "label": 0}).message == "missing field 'goal'"
    assert piqa.check("f:5", 4, dict(row)).message == "missing field 'label'"
    unlabelled = RowChecker("t", Legacy(question="goal", choices=["sol1", "sol2"]), base_dir=tmp_path)
    assert unlabelled.check("f:1", 0, row).message.startswith("references: the list is empty")


def test_a_preprocessor_bug_fails_its_row_only(tmp_path):
    def broken(record, ctx):
        return record["x"].upper()

    result = RowChecker("t", broken, base_dir=tmp_path).check("f:1", 0, {"x": 3})
    assert result.stage == "preprocess" and result.message.startswith("AttributeError: ")
    not_a_sample = RowChecker("t", lambda r, c: {"id": "a"}, base_dir=tmp_path).check("f:1", 0, {})
    assert not_a_sample.stage == "validate" and "not valid Sample v1" in not_a_sample.message


# -- the real CLI -------------------------------------------------------------------------------

TASK = """\
dataset: {loader: jsonl, args: {path: rows.jsonl}}
preprocessor: {name: identity}
request: {kind: generate, chat: true, generation: {max_new_tokens: 8}}
metrics: [exact_match]
"""


@pytest.fixture
def corpus(tmp_path):
    """tasks/sv1 (identity), data/rows.jsonl with one bad row per rule, and beside data/:
    a canary file and an outside/ folder that rows try to reach."""
    canary = f"CANARY-{uuid.uuid4().hex}"
    (tmp_path / "tasks" / "sv1").mkdir(parents=True)
    (tmp_path / "tasks" / "sv1" / "task.yaml").write_text(TASK)
    data, outside = tmp_path / "data", tmp_path / "outside"
    (data / "img").mkdir(parents=True)
    outside.mkdir()
    (data / "img" / "ok.png").write_bytes(PNG_1PX)
    (outside / "o.png").write_bytes(PNG_1PX + canary.encode())
    (tmp_path / "canary.txt").write_text(canary)
    (data / "img" / "link.png").symlink_to(tmp_path / "canary.txt")
    outside_png = str(outside / "o.png")
    file_row = image_row("file-seg", "../canary.txt")
    file_row["messages"][0]["content"][0] = {"type": "file_url", "file_url": {"url": "../canary.txt"}}
    # (row, the words its error must hold; None for a row that is scored)
    cases = [
        (text_row("ok-1"), None),
        (without(text_row("no-id"), "id"), ["missing required field 'id'"]),
        (without(text_row("no-sv"), "schema_version"), ["missing required field 'schema_version'"]),
        (text_row("refs", references="8"), ["references: expected a list, got a string"]),
        (text_row("ok-1"), ["id: duplicate sample id 'ok-1'"]),
        (text_row("empty", references=[]), ["references: the list is empty"]),
        (text_row("ok-2", colour="red"), None),
        (image_row("up", "../canary.txt"), ["image_url.url", "'../canary.txt'", "--allow-path"]),
        (image_row("abs", "/etc/passwd"), ["image_url.url", "'/etc/passwd'", "--allow-path"]),
        (image_row("fileurl", "file:///etc/passwd"), ["image_url.url", "'file:///etc/passwd'", "--allow-path"]),
        (image_row("http", "http://127.0.0.1:9/x.png"), ["image_url.url", "'http://127.0.0.1:9/x.png'", "--allow-urls"]),
        (image_row("missing", "img/missing.png"), ["image_url.url", "'img/missing.png' not found"]),
        (image_row("ok-3", "img/ok.png"), None),
        (image_row("link", "img/link.png"), ["image_url.url", "'img/link.png'", "outside the data folder"]),
        (image_row("outside", outside_png), ["image_url.url", repr(outside_png), "--allow-path"]),
        (file_row, ["file_url.url", "'../canary.txt'", "--allow-path"]),
    ]
    rows = data / "rows.jsonl"
    rows.write_text("\n".join(json.dumps(row) for row, _ in cases) + "\n")
    return {"root": tmp_path, "rows": rows, "outside": outside, "canary": canary,
            "expected": {line: words for line, (_, words) in enumerate(cases, 1)}}


def gage(*args, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    return subprocess.run([sys.executable, "-m", "gage_eval.cli", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def run_corpus(corpus, *extra) -> tuple[subprocess.CompletedProcess, Path]:
    root = corpus["root"]
    proc = gage("--tasks", "sv1", "--include-path", root / "tasks", "--data", f"sv1={corpus['rows']}",
                "--model", "dummy", "-o", root / "runs", "--run-id", "r", *extra, cwd=root)
    return proc, root / "runs" / "r"


def validate_verdicts(corpus, *extra) -> tuple[subprocess.CompletedProcess, dict[int, str]]:
    proc = gage("validate", corpus["rows"], "--schema", "sample", *extra, cwd=corpus["root"])
    prefix = f"{corpus['rows']}:"
    invalid: dict[int, str] = {}
    for line in proc.stdout.splitlines():
        if line.startswith(prefix) and ": warning: " not in line and " rows, " not in line:
            number = int(line[len(prefix):].split(":", 1)[0])
            invalid[number] = invalid.get(number, "") + line
    return proc, invalid


def test_cli_run_and_validate_agree_on_every_row(corpus):
    proc, run = run_corpus(corpus)
    assert "Traceback" not in proc.stdout + proc.stderr
    assert proc.returncode == 1, proc.stderr  # the run finished with errored rows
    records = [json.loads(line) for line in (run / "samples" / "sv1.jsonl").read_text().splitlines()]
    expected = corpus["expected"]
    assert len(records) == len(expected)  # every row written, none dropped
    errors = {}
    for record in records:
        error = record["eval_result"].get("error")
        if error:
            file, line = error["locator"].rsplit(":", 1)
            assert file == str(corpus["rows"])
            errors[int(line)] = error["message"]
        else:
            assert "metrics" in record["eval_result"]
    assert set(errors) == {line for line, words in expected.items() if words}
    for line, message in errors.items():
        assert all(w in message for w in expected[line]), (line, message)
        assert f"{corpus['rows']}:{line}: " in proc.stderr  # on the console too, with file:line
    assert f"{corpus['rows']}:7: colour: unknown top-level field" in proc.stderr  # a warning in a run
    summary = json.loads((run / "summary.json").read_text())
    counts = summary["tasks"]["sv1"]["counts"]
    assert counts["total"] == 16 and counts["scored"] == 3 and counts["errored"] == 13

    vproc, invalid = validate_verdicts(corpus)
    assert "Traceback" not in vproc.stdout + vproc.stderr and vproc.returncode == 1
    assert set(invalid) == set(errors)  # the same verdict on every row
    for line, text in invalid.items():
        assert all(w in text for w in expected[line]), (line, text)
    assert f"{corpus['rows']}:7: warning: $.colour:" in vproc.stdout
    assert "16 rows, 3 valid, 13 invalid, 1 warnings" in vproc.stdout

    outputs = [proc.stdout, proc.stderr, vproc.stdout, vproc.stderr]
    outputs += [p.read_text(errors="replace") for p in run.rglob("*") if p.is_file()]
    assert not any(corpus["canary"] in text for text in outputs)  # nothing outside the data folder was read
    assert not any("root:x:0:0" in text for text in outputs)      # nor /etc/passwd


def test_allow_path_makes_an_outside_image_readable(corpus):
    outside = corpus["outside"]
    proc, run = run_corpus(corpus, "--allow-path", outside)
    assert "Traceback" not in proc.stderr
    records = {r["id"]: r for r in map(json.loads, (run / "samples" / "sv1.jsonl").read_text().splitlines())}
    scored = records["outside"]
    assert "error" not in scored["eval_result"]
    assert scored["messages"][0]["content"][0]["image_url"]["url"] == str((outside / "o.png").resolve())
    still_refused = [r for r in records.values() if (r["eval_result"].get("error") or {}).get("message", "").find(
        "'../canary.txt'") >= 0]
    assert len(still_refused) == 2  # the allowed folder does not open its parent
    vproc, invalid = validate_verdicts(corpus, "--allow-path", outside)
    assert 15 not in invalid and 8 in invalid and "16 rows, 4 valid, 12 invalid" in vproc.stdout


def test_allow_urls_lets_a_url_through(corpus):
    vproc, invalid = validate_verdicts(corpus, "--allow-urls")
    assert 11 not in invalid and "16 rows, 4 valid, 12 invalid" in vproc.stdout
