"""Wrong-typed values in the rows of the builtin preprocessors (issue 24, H6): each is its row's
error naming the field and showing the value as JSON, cut short; never an id such as
``"{'a': 1}"``, a choice "None", a DocVQA slice per character, or a label read off a bool.
Then the same rows through the real CLI, and the reader's and validate's messages."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gage_eval.api import RowContext
from gage_eval.api.jsonio import iter_json_rows
from gage_eval.api.sample import from_legacy
from gage_plugins_builtin.multimodal.media import decode_image, to_image_url
from gage_plugins_builtin.multimodal.preprocess import MMMU, DocVQA
from gage_plugins_builtin.preprocessors import Legacy
from gage_plugins_builtin.suite_choice import HellaSwag
from gage_plugins_builtin.suite_qa import ChoiceColumns, LabeledChoices

ROOT = Path(__file__).resolve().parents[2]
CTX = RowContext("t", "data.jsonl:1", 0)
DOC = {"questionId": 24580, "question": "What is the name of the university?", "image": "data:image/png;base64,AA==",
       "answers": ["university of california"], "question_types": ["others"]}
MMMU_ROW = {"id": "validation_Accounting_1", "question": "Which?", "options": "['$6', '$7']", "answer": "B",
            "question_type": "multiple-choice", "subfield": "Managerial Accounting"}
ARC = {"question": "Which?", "choices": {"text": ["a", "b"], "label": ["A", "B"]}, "answerKey": "A"}


def error_of(preprocess, row: dict, ctx: RowContext = CTX) -> str:
    with pytest.raises(ValueError) as info:
        preprocess(row, ctx)
    return str(info.value)


@pytest.mark.parametrize("value, shown", [({"a": 1}, '{"a": 1}'), (True, "true"), (None, "null"), ([1, 2], "[1, 2]"),
                                          (1.5, "1.5"), ("", '""')])
def test_an_id_is_a_string_or_an_integer(value, shown):
    assert DocVQA()(DOC, CTX)["id"] == "24580"
    assert error_of(DocVQA(), {**DOC, "questionId": value}) == \
        f"field 'questionId': an id must be a non-empty string or an integer, got {shown}"
    assert "field 'id': an id must be" in error_of(MMMU(), {**MMMU_ROW, "id": value})
    legacy = Legacy(question="q", choices=["a", "b"], answer="label", id_field="qid")
    assert "field 'qid': an id must be" in error_of(legacy, {"q": "x", "a": "1", "b": "2", "label": 0, "qid": value})


def test_null_is_not_missing():
    assert error_of(DocVQA(), {**DOC, "question": None}) == "field 'question' is null"
    assert error_of(Legacy(question="goal", choices=["a", "b"], answer="label"),
                    {"goal": "x", "a": "1", "b": "2", "label": None}) == "field 'label' is null"
    assert error_of(DocVQA(), {**DOC, "question": 5}) == "field 'question' must be a string, got a number"


def test_docvqa_answers_and_question_types():
    assert error_of(DocVQA(), {**DOC, "answers": {"a": 1}}) == \
        "field 'answers' must be a list or a list literal, got an object"  # (its keys were the answers)
    assert error_of(DocVQA(), {**DOC, "answers": ["x", None]}) == \
        "field 'answers': an item is null, not a string or a number"
    assert DocVQA()({**DOC, "question_types": "others"}, CTX)["data_tag"] == {"question_type": ["others"]}
    assert "got a boolean" in error_of(DocVQA(), {**DOC, "question_types": True})


def test_mmmu_options_answer_and_slices():
    assert error_of(MMMU(), {**MMMU_ROW, "options": "[None, '$7']"}) == \
        "field 'options': an item is null, not a string or a number"
    assert error_of(MMMU(), {**MMMU_ROW, "answer": ["B"]}) == 'answer: ["B"] is not one of the option letters A, B'
    assert error_of(MMMU(), {**MMMU_ROW, "subfield": True}) == "field 'subfield' must be a string, got a boolean"


def test_choices_and_labels_are_not_coerced():
    assert error_of(LabeledChoices(), {**ARC, "choices": {"text": ["a", None], "label": ["A", "B"]}}) == \
        "choices: a label or text is null, not a string"
    assert error_of(LabeledChoices(), {**ARC, "answerKey": None}) == "answerKey: null is not one of the labels A, B"
    with pytest.raises(ValueError, match=r"choice 1 is null, not a string or a number"):
        from_legacy({}, sample_id="x", question="q", choices=["a", None], answer=0)
    siqa = ChoiceColumns(choices=["a", "b"], answer="label", answer_base=1)
    row = {"question": "q", "a": "x", "b": "y"}
    assert siqa({**row, "label": "2"}, CTX)["label"] == "B"
    assert error_of(siqa, {**row, "label": True}) == "label: true is not a choice position"  # was B: "1" is A
    boolq = ChoiceColumns(choice_texts=["no", "yes"], answer="label")
    assert boolq({"question": "q", "label": True}, CTX)["label"] == "B"
    hs = {"activity_label": "a", "ctx_a": "b", "ctx_b": "c", "endings": ["x", "y"], "label": "²"}
    assert error_of(HellaSwag(), hs) == "field 'label' must be an answer index, got \"²\""  # (int() refused it)


def test_a_huge_value_is_cut_short():
    for preprocess, row in [(HellaSwag(), {"activity_label": "a", "ctx_a": "b", "ctx_b": "c", "endings": ["x"],
                                           "label": "x" * 3_000_000}),
                            (Legacy(question="q", choices=["a", "b"], answer="label"),
                             {"q": "x", "a": "1", "b": "2", "label": "x" * 3_000_000})]:
        assert len(error_of(preprocess, row)) < 200


def test_images_that_are_not_images(tmp_path):
    assert "expected the image's bytes, got a number" in error_of(
        lambda r, c: to_image_url(r["image"], c), {"image": {"bytes": 5}})  # bytes(5) was five NULs
    assert "characters is no path or URL" in error_of(lambda r, c: to_image_url(r["image"], tmp_path), {"image": "x" * 10000})
    for data, said in [(b"", "the file is empty"), (b"<svg xmlns='http://www.w3.org/2000/svg'/>", "an SVG"),
                       (b"hello", "not an image format Pillow reads")]:
        with pytest.raises(ValueError) as info:
            decode_image(data, "p.png")
        assert said in str(info.value) and "BytesIO" not in str(info.value)


def test_carriage_return_line_endings_are_named(tmp_path):
    data = tmp_path / "old_mac.jsonl"
    data.write_bytes(b'{"a": 1}\r{"a": 2}\r')
    [(line, value, error)] = list(iter_json_rows(data))
    assert value is None and "lines end in CR alone (old Mac style)" in error, error
    data.write_bytes(b'{"a": 1}\r\n{"a": 2}\r\n')
    assert [v for _, v, _ in iter_json_rows(data)] == [{"a": 1}, {"a": 2}]


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "gage_eval.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_validate_prints_json_values(tmp_path):
    data = tmp_path / "s.jsonl"
    data.write_text(json.dumps({"schema_version": "v1", "id": {"a": 1}, "messages": [], "references": ["x"],
                                "label": None}) + "\n")
    out = run_cli("validate", str(data), "--schema", "sample", cwd=ROOT).stdout
    assert f'{data}:1: $.id: {{"a": 1}} is not of type \'string\'' in out, out
    assert f"{data}:1: $.label: null is not of type 'string'" in out, out


def test_docvqa_rows_through_the_cli(tmp_path):
    rows = [{**DOC, "questionId": 1}, {**DOC, "questionId": {"a": 1}}, {**DOC, "questionId": 3, "answers": None},
            {**DOC, "questionId": 4, "image": {"bytes": 5}}, {**DOC, "questionId": 5}]
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = run_cli("--tasks", "docvqa", "--data", f"docvqa={data}", "--model", "dummy", "-o", str(tmp_path / "runs"),
                     cwd=ROOT)
    err = result.stderr + result.stdout
    assert "Traceback" not in err and result.returncode == 1, err
    assert f"{data}:2: preprocess error: field 'questionId': an id must be a non-empty string or an integer, " \
           f'got {{"a": 1}}' in err, err
    assert f"{data}:3: preprocess error: field 'answers' is null" in err, err
    assert f"{data}:4: preprocess error: image.bytes: expected the image's bytes, got a number" in err, err
    assert "docvqa: 5 rows, 2 scored, 3 errored" in err, err


def test_legal_choice_ids_are_listed_short():
    from gage_plugins_builtin.legal.schema import legal_eval_v1_errors

    row = {"choices": [{"id": f"c{i}", "text": str(i)} for i in range(1000)], "correct_choice_ids": ["A" * 5000]}
    [(where, message)] = legal_eval_v1_errors(row)
    assert where == "$.correct_choice_ids[0]" and message.endswith("c25, ... (1000 in all))") and len(message) < 300


def test_an_integral_float_label_is_its_integer():
    # JSON's 1.0 is 1, and a CSV label column with one empty cell reaches the rows as floats (pandas'
    # NaN): every other row of the file was refused ("answer 0.0 is neither an option id ...")
    assert from_legacy({}, sample_id="x", question="q", choices=["a", "b"], answer=1.0)["label"] == "B"
    with pytest.raises(ValueError, match="answer 1.5 is neither"):
        from_legacy({}, sample_id="x", question="q", choices=["a", "b"], answer=1.5)
    hs = {"activity_label": "a", "ctx_a": "b", "ctx_b": "c", "endings": ["x", "y"], "label": 1.0}
    assert HellaSwag()(hs, CTX)["label"] == "B"
    assert ChoiceColumns(choices=["a", "b"], answer="label", answer_base=1)(
        {"question": "q", "a": "x", "b": "y", "label": 2.0}, CTX)["label"] == "B"
    arc = {**ARC, "choices": {"text": ["a", "b"], "label": ["1", "2"]}, "answerKey": 2.0}
    assert LabeledChoices()(arc, CTX)["label"] == "2"


def test_a_csv_with_an_empty_label_scores_its_other_rows(tmp_path):
    data = tmp_path / "p.csv"
    data.write_text("goal,sol1,sol2,label\na,x,p,0\nb,y,q,1\nc,z,r,\n")
    result = run_cli("--tasks", "piqa", "--data", f"piqa={data}", "--model", "dummy", "-o", str(tmp_path / "runs"),
                     cwd=ROOT)
    err = result.stderr + result.stdout
    assert "preprocess error: field 'label' is null" in err and "piqa: 3 rows, 2 scored, 1 errored" in err, err


def test_winogrande_takes_its_answer_as_a_number_too():
    from gage_plugins_builtin.suite_choice import Winogrande

    row = {"sentence": "The cup fell off the _ table.", "option1": "old", "option2": "new"}
    assert [Winogrande()({**row, "answer": a}, CTX)["label"] for a in ("2", 2, 2.0, " 1")] == ["B", "B", "B", "A"]
    for bad in ("3", 0, True, None, "x"):
        with pytest.raises(ValueError, match="field 'answer' must be"):
            Winogrande()({**row, "answer": bad}, CTX)


def test_open_qa_names_the_bad_answer():
    from gage_plugins_builtin.suite_gen import OpenQA

    nq = OpenQA(question="question", answers="answer")
    assert error_of(nq, {"question": "q", "answer": ["x", None]}) == "answer: expected a list of answer strings, one is null"
    assert error_of(nq, {"question": "q", "answer": 5}) == "answer: expected a list of answer strings, got a number"
    trivia = OpenQA(question="question", answers="answer", answer_key="aliases")
    message = error_of(trivia, {"question": "q", "answer": {f"k{i}": i for i in range(1000)}})
    assert message.startswith("answer: a mapping without the answers key 'aliases' (it has [\"k0\"") and len(message) < 200


def test_a_damaged_pdf_attachment_is_one_line(tmp_path):
    pytest.importorskip("pypdf")
    (tmp_path / "documents").mkdir()
    (tmp_path / "documents" / "bad.pdf").write_bytes(b"%PDF-1.4 garbage")
    row = {"schema_version": "legal_eval_v1", "id": "a", "dataset": "d", "task_type": "mcq", "prompt": "Which?",
           "choices": [{"id": "A", "text": "x"}, {"id": "B", "text": "y"}], "correct_choice_ids": ["A"],
           "attachments": [{"path": "documents/bad.pdf", "kind": "pdf"}]}
    data = tmp_path / "legal.jsonl"
    data.write_text(json.dumps(row) + "\n" + json.dumps({**row, "id": "b", "attachments": []}) + "\n")
    result = run_cli("--tasks", "legal_eval_v1", "--data", f"legal_eval_v1={data}", "--model", "dummy",
                     "-o", str(tmp_path / "runs"), cwd=ROOT)
    err = result.stderr + result.stdout
    assert f"{data}:1: preprocess error: attachments[0].path: cannot read PDF" in err, err
    assert "EOF marker not found" not in err, err  # pypdf's own warning, printed to the console
    assert "legal_eval_v1: 2 rows, 1 scored, 1 errored" in err, err


def test_mmlu_rows_have_four_choices(tmp_path):
    # a row with five was scored on all five (" E" too) while its prompt showed A. to D.
    good = {"question": "2+2?", "choices": ["1", "2", "3", "4"], "answer": 3, "subject": "anatomy"}
    rows = [good, {**good, "choices": ["1", "2", "3", "4", "5"], "answer": 4}, good]
    data = tmp_path / "m.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = run_cli("--tasks", "mmlu_anatomy", "--data", f"mmlu_anatomy={data}", "--model", "dummy",
                     "-o", str(tmp_path / "runs"), cwd=ROOT)
    err = result.stderr + result.stdout
    assert f"{data}:2: preprocess error: field 'choices': 5 choice(s), where this task's rows have 4" in err, err
    assert "mmlu_anatomy: 3 rows, 2 scored, 1 errored" in err, err
