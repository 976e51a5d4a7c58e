"""legal_eval_v1 validation (spec 003): the shared file passes; one broken copy of a real row per rule fails."""
from __future__ import annotations

import copy
import json
import shutil

import pytest

from gage_eval.api.schemas import validation_errors, validation_warnings

MERGED = "legal_eval_v1/data/for_eval/merged_legal_eval_v1.jsonl"


@pytest.fixture(scope="module")
def real_rows(shared_data):
    rows = [json.loads(line) for line in (shared_data / MERGED).read_text(encoding="utf-8").splitlines() if line.strip()]
    first = {}
    for row in rows:
        first.setdefault(row["task_type"], row)
        if len(row.get("messages") or []) == 1:
            first.setdefault("with_messages", row)
        if row.get("attachments"):
            first.setdefault("with_attachments", row)
    return first


def test_shared_file_is_valid(shared_data, run_cli):
    result = run_cli("validate", shared_data / MERGED, "--schema", "legal_eval_v1")
    assert result.exit_code == 0, result.output
    assert "108 rows, 108 valid, 0 invalid, 0 warnings" in result.output


def _drop(key):
    return lambda r: r.pop(key)


def _set(key, value):
    return lambda r: r.__setitem__(key, value)


# (which real row, how to break it, the JSON path the error must name, a word of the message)
CASES = {
    "schema_version": ("mcq", _set("schema_version", "legal_eval_v2"), "$.schema_version", "legal_eval_v1"),
    "id required": ("mcq", _drop("id"), "$", "'id' is a required property"),
    "id type": ("mcq", _set("id", 17), "$.id", "string"),
    "dataset required": ("rubric_qa", _drop("dataset"), "$", "'dataset' is a required property"),
    "task_type required": ("reference_qa", _drop("task_type"), "$", "'task_type' is a required property"),
    "task_type enum": ("reference_qa", _set("task_type", "essay"), "$.task_type", "is not one of"),
    "prompt required": ("mcq", _drop("prompt"), "$", "'prompt' is a required property"),
    "prompt type": ("mcq", _set("prompt", ["a"]), "$.prompt", "string"),
    "context type": ("mcq", _set("context", 3), "$.context", "string"),
    "metadata type": ("mcq", _set("metadata", "x"), "$.metadata", "object"),
    "policy_id type": ("mcq", lambda r: r["metadata"].__setitem__("policy_id", 1), "$.metadata.policy_id", "string"),
    "rubric required": ("rubric_qa", _drop("rubric"), "$", "'rubric' is a required property"),
    "rubric empty": ("rubric_qa", _set("rubric", []), "$.rubric", "non-empty"),
    "rubric item id": ("rubric_qa", lambda r: r["rubric"][1].pop("id"), "$.rubric[1]", "'id' is a required"),
    "rubric item title": ("rubric_qa", lambda r: r["rubric"][0].pop("title"), "$.rubric[0]", "'title' is a required"),
    "rubric weight type": ("rubric_qa", lambda r: r["rubric"][2].__setitem__("weight", "8"), "$.rubric[2].weight", "number"),
    "rubric_qa forbids choices": ("rubric_qa", _set("choices", [{"id": "A", "text": "a"}, {"id": "B", "text": "b"}]),
                                  "$.choices", "not allowed when task_type is rubric_qa"),
    "rubric_qa forbids correct_choice_ids": ("rubric_qa", _set("correct_choice_ids", ["A"]), "$.correct_choice_ids",
                                             "not allowed"),
    "rubric_qa reference_answers strings": ("rubric_qa", _set("reference_answers", [1]), "$.reference_answers[0]", "string"),
    "reference_answers required": ("reference_qa", _drop("reference_answers"), "$", "'reference_answers' is a required"),
    "reference_answers empty": ("reference_qa", _set("reference_answers", []), "$.reference_answers", "non-empty"),
    "reference_answers blank item": ("reference_qa", _set("reference_answers", [""]), "$.reference_answers[0]", "non-empty"),
    "reference_qa forbids rubric": ("reference_qa", _set("rubric", [{"id": "r", "title": "t"}]), "$.rubric",
                                    "not allowed when task_type is reference_qa"),
    "reference_qa forbids choices": ("reference_qa", _set("choices", [{"id": "A", "text": "a"}, {"id": "B", "text": "b"}]),
                                     "$.choices", "not allowed"),
    "choices required": ("mcq", _drop("choices"), "$", "'choices' is a required"),
    "choices at least 2": ("mcq", lambda r: r.__setitem__("choices", r["choices"][:1]), "$.choices", "too short"),
    "choice text": ("mcq", lambda r: r["choices"][1].pop("text"), "$.choices[1]", "'text' is a required"),
    "choice ids unique": ("mcq", lambda r: r["choices"][2].__setitem__("id", r["choices"][0]["id"]), "$.choices[2].id",
                          "duplicate choice id"),
    "correct_choice_ids required": ("mcq", _drop("correct_choice_ids"), "$", "'correct_choice_ids' is a required"),
    "correct_choice_ids empty": ("mcq", _set("correct_choice_ids", []), "$.correct_choice_ids", "non-empty"),
    "correct_choice_ids membership": ("mcq", _set("correct_choice_ids", ["Z"]), "$.correct_choice_ids[0]",
                                      "'Z' is not a choice id"),
    "mcq forbids rubric": ("mcq", _set("rubric", [{"id": "r", "title": "t"}]), "$.rubric", "not allowed when task_type is mcq"),
    "mcq forbids reference_answers": ("mcq", _set("reference_answers", ["x"]), "$.reference_answers", "not allowed"),
    "message role": ("with_messages", lambda r: r["messages"][0].__setitem__("role", "bot"), "$.messages[0].role",
                     "is not one of"),
    "message content empty": ("with_messages", lambda r: r["messages"][-1].__setitem__("content", ""),
                              "$.messages[0].content", "non-empty"),
    "message content blank": ("with_messages", lambda r: r["messages"][-1].__setitem__("content", "  \n"),
                              "$.messages[0].content", "whitespace"),
    "message content required": ("with_messages", lambda r: r["messages"][0].pop("content"), "$.messages[0]",
                                 "'content' is a required"),
    "attachment path": ("with_attachments", lambda r: r["attachments"][0].pop("path"), "$.attachments[0]",
                        "'path' is a required"),
    "attachment title type": ("with_attachments", lambda r: r["attachments"][0].__setitem__("title", 5),
                              "$.attachments[0].title", "string"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_rule_refuses_a_broken_real_row(case, real_rows, shared_data, tmp_path, run_cli):
    which, breaker, path, words = CASES[case]
    good = real_rows[which]
    bad = copy.deepcopy(good)
    breaker(bad)
    goods = [dict(good, id=f"{good['id']}#{i}") for i in range(3)]  # validate refuses duplicate ids, as a run does
    for att in good.get("attachments") or []:  # validate checks that attachments exist beside the file
        (tmp_path / att["path"]).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(shared_data / MERGED.rsplit("/", 2)[0] / "curated" / att["path"], tmp_path / att["path"])
    file = tmp_path / "rows.jsonl"
    file.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in (goods[0], goods[1], bad, goods[2])) + "\n",
                    encoding="utf-8")
    result = run_cli("validate", file, "--schema", "legal_eval_v1")
    assert result.exit_code == 1, result.output
    assert "4 rows, 3 valid, 1 invalid" in result.output
    errors = [line for line in result.output.splitlines() if line.startswith(f"{file}:") and " rows, " not in line]
    assert errors and all(line.startswith(f"{file}:3: ") for line in errors), result.output
    assert any(line.startswith(f"{file}:3: {path}: ") and words in line for line in errors), result.output


def test_every_error_of_a_row_is_printed(real_rows, tmp_path, run_cli):
    bad = copy.deepcopy(real_rows["mcq"])
    bad["correct_choice_ids"] = ["Q"]
    bad["rubric"] = [{"id": "r", "title": "t"}]
    bad.pop("prompt")
    file = tmp_path / "rows.jsonl"
    file.write_text(json.dumps(bad) + "\n", encoding="utf-8")
    out = run_cli("validate", file, "--schema", "legal_eval_v1").output
    for where in ("$: 'prompt' is a required", "$.rubric: not allowed", "$.correct_choice_ids[0]: 'Q'"):
        assert f"{file}:1: {where}" in out, out


def test_unknown_top_level_key_is_a_warning_not_an_error(real_rows, tmp_path, run_cli):
    row = dict(real_rows["reference_qa"], source_split="test")
    assert validation_errors(row, "legal_eval_v1") == []
    assert validation_warnings(row, "legal_eval_v1") == [("$.source_split", pytest.approx(
        "unknown top-level field; spec 003 allows it but it belongs in metadata"))]
    file = tmp_path / "rows.jsonl"
    file.write_text(json.dumps(row) + "\n", encoding="utf-8")
    result = run_cli("validate", file, "--schema", "legal_eval_v1")
    assert result.exit_code == 0
    assert f"{file}:1: warning: $.source_split:" in result.output
    assert "1 rows, 1 valid, 0 invalid, 1 warnings" in result.output


def test_code_checks_tolerate_malformed_rows():
    assert validation_errors({"choices": "AB", "correct_choice_ids": [None], "messages": [3]}, "legal_eval_v1")
    assert validation_errors([1, 2], "legal_eval_v1")
