"""hellaswag, winogrande, copa, cb, rte, sst2 and mrpc against lm-evaluation-harness 0.4.13: the rows
lm-eval scored (tests/suite/fixtures/lm_eval_suite_c.json, written by lm_eval_suite_c_fixture.py)
run through each task folder's preprocessor and request builder give the same (context,
continuation) pairs, and lm-eval's log-likelihoods through the task's metrics give its per-row acc.
Also: per-choice contexts through the engine, corpus-level F1, and (slow) the real model."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from suite_parity import ROOT, built, real_model_records

from gage_eval.api import MetricContext, RowContext
from gage_eval.engine.infer import merged_parts
from gage_eval.api.backend import ModelOutput
from gage_eval.api.metric import TaskAggregate
from gage_eval.config.options import RunOptions
from gage_eval.plugins import load_plugins
from gage_eval.tasks.requests import RequestBuilder
from gage_eval.tasks.spec import read_task_file
from gage_plugins_builtin.metrics.corpus_f1 import F1, MacroF1, class_f1
from gage_plugins_builtin.suite_choice import hellaswag_clean

FIXTURE = json.loads(Path(__file__).parent.joinpath("fixtures", "lm_eval_suite_c.json").read_text(encoding="utf-8"))
TASKS = sorted(FIXTURE["tasks"])
CASES = [(t, i) for t in TASKS for i in range(len(FIXTURE["tasks"][t]))]


def pairs(request) -> list[list[str]]:
    contexts = request.contexts or (request.prompt,) * len(request.continuations)
    return [[c, k] for c, k in zip(contexts, request.continuations)]


def test_the_fixture_covers_every_task():
    assert TASKS == sorted(["hellaswag", "winogrande", "copa", "cb", "rte", "sst2", "mrpc"])
    assert all(len(rows) >= 5 for rows in FIXTURE["tasks"].values())


@pytest.mark.parametrize("task,i", CASES)
def test_same_pairs_as_lm_eval(task, i):
    row = FIXTURE["tasks"][task][i]
    _, request, _ = built(task, row["doc"], row["doc_id"])
    assert pairs(request) == row["pairs"]


@pytest.mark.parametrize("task,i", CASES)
def test_lm_evals_scores_give_lm_evals_acc(task, i):
    row = FIXTURE["tasks"][task][i]
    sample, _, rendered = built(task, row["doc"], row["doc_id"])
    _, registry = load_plugins()
    acc = registry.build("metrics", "acc", task)
    out = {"loglikelihoods": row["loglikelihoods"], "choices": rendered["choices"]}
    assert acc.compute(MetricContext(sample=sample, model_output=out))["value"] == row["acc"]


def test_hellaswag_cleanup():
    assert hellaswag_clean(" Pets: [header] How to bathe a dog [title] Fill the tub. [step] Wet it ") == \
        "Pets: How to bathe a dog. Fill the tub. Wet it"
    sample, request, _ = built("hellaswag", {"activity_label": "Skiing", "ctx_a": "A man skis.", "ctx_b": "THE man",
                                             "endings": ["falls [step] down.", "waves."], "label": "1"}, 0)
    assert request.prompt == "Skiing: A man skis. The man" and request.continuations == (" falls down.", " waves.")
    assert sample["label"] == "B"


def test_copa_connective_and_double_space():
    doc = {"premise": "It rained.", "choice1": "The grass got wet.", "choice2": "The sun shone.",
           "question": "effect", "label": 0}
    _, request, _ = built("copa", doc, 0)
    assert request.prompt == "It rained therefore"
    assert request.continuations == ("  the grass got wet.", "  the sun shone.")
    _, request, _ = built("copa", dict(doc, question="cause"), 0)
    assert request.prompt == "It rained because"


def test_winogrande_contexts_and_few_shot(tmp_path):
    doc = {"sentence": "Ann lent Beth a pen because _ had two.", "option1": "Ann", "option2": "Beth", "answer": "1"}
    _, request, rendered = built("winogrande", doc, 0)
    assert request.prompt is None and request.contexts == ("Ann lent Beth a pen because Ann",
                                                           "Ann lent Beth a pen because Beth")
    assert request.continuations == (" had two.", " had two.") and rendered["prompt"] == "had two."
    # a few-shot example is its gold context, the delimiter and its rest (lm-eval's multiple input)
    folder = tmp_path / "winogrande"
    folder.mkdir()
    shot = {"sentence": "Cal beat Dee since _ ran fast.", "option1": "Cal", "option2": "Dee", "answer": "1"}
    other = {"sentence": "Eve told Fay _ won.", "option1": "Eve", "option2": "Fay", "answer": "2"}
    (folder / "shots.jsonl").write_text(json.dumps(shot) + "\n" + json.dumps(other) + "\n")
    text = (ROOT / "tasks" / "winogrande" / "task.yaml").read_text().replace(
        "  split: train\n", "  path: shots.jsonl\n  sampler: first_n\n")
    (folder / "task.yaml").write_text(text)
    (folder / "prompt.jinja").write_text((ROOT / "tasks" / "winogrande" / "prompt.jinja").read_text())
    _, registry = load_plugins()
    spec = read_task_file(folder)
    sample = registry.build("preprocessors", "winogrande", "t")(doc, RowContext(task="winogrande", locator="x", index=0))
    request, _ = RequestBuilder(spec, RunOptions(tasks=["winogrande"], num_fewshot=1), registry).build(sample, 0)
    assert request.contexts[1] == "Cal beat Dee since Cal ran fast.\n\nAnn lent Beth a pen because Beth"


def test_per_choice_parts_merge_in_order_and_an_error_wins():
    parts = [ModelOutput(loglikelihoods=[-1.5], is_greedy=[True]), ModelOutput(loglikelihoods=[-0.5], is_greedy=[False])]
    merged = merged_parts(parts)
    assert merged.loglikelihoods == [-1.5, -0.5] and merged.is_greedy == [True, False]
    assert merged_parts([parts[0], ModelOutput(error="boom")]).error == "boom"


def test_winogrande_runs_through_the_engine_one_pair_per_choice(tmp_path):
    rows = tmp_path / "wino.jsonl"
    rows.write_text("".join(json.dumps(r["doc"]) + "\n" for r in FIXTURE["tasks"]["winogrande"]))
    out = tmp_path / "runs"
    proc = subprocess.run([sys.executable, "-m", "gage_eval.cli", "--tasks", "winogrande", "--model", "dummy",
                           "--data", f"winogrande={rows}", "-o", str(out), "--quiet"],
                          capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stderr
    samples = next(p for p in out.rglob("winogrande.jsonl") if p.parent.name == "samples")
    records = sorted(map(json.loads, samples.open()), key=lambda rec: int(rec["id"].rsplit("-", 1)[1]))
    assert len(records) == len(FIXTURE["tasks"]["winogrande"])
    for rec, row in zip(records, FIXTURE["tasks"]["winogrande"]):
        entry = rec["predict_result"][0]
        assert [list(p) for p in zip(entry["contexts"], entry["continuations"])] == row["pairs"]
        assert len(entry["loglikelihoods"]) == 2


def _pair_rows(pairs_: list[tuple[int, int]], n: int) -> list:
    ids = "ABC"[:n]
    return [({"options": [{"id": x} for x in ids], "label": ids[g]},
             {"loglikelihoods": [0.0 if k == p else -1.0 for k in range(n)]}) for g, p in pairs_]


def test_f1_is_one_score_over_all_rows():
    # golds/predictions: class 0 F1 = 2/3, class 1 F1 = 1/2, class 2 F1 = 0 (never right)
    pairs_ = [(0, 0), (0, 1), (1, 1), (2, 0), (1, 2)]
    assert class_f1(pairs_, 0) == pytest.approx(0.5) and class_f1(pairs_, 1) == pytest.approx(0.5)
    assert class_f1(pairs_, 2) == 0.0 and class_f1([(0, 0)], 1) == 0.0
    for metric, expected in ((MacroF1(), (0.5 + 0.5 + 0.0) / 3), (F1(positive=1), 0.5)):
        agg = TaskAggregate()
        agg.corpus = {"f1": metric.aggregate}
        for sample, output in _pair_rows(pairs_, 3):
            result = metric.compute(MetricContext(sample=sample, model_output=output))
            assert result["value"] is None  # no per-row value: a mean of rows would be wrong
            agg.add({"f1": None}, {"split": "all"}, None, {"f1": result["item"]})
        out = agg.result()
        assert out["metrics"]["f1"]["value"] == pytest.approx(expected)
        assert out["metrics"]["f1"]["n"] == 5 and out["metrics"]["f1"]["stderr"] is None
        assert out["slices"]["split"]["all"]["f1"]["value"] == pytest.approx(expected)


@pytest.mark.slow
def test_real_model_scores_winogrande_as_lm_eval(tmp_path, reuse_weights, run_cli):
    """SmolLM2 (the bundled GGUF, float32, CPU; the default model): three winogrande rows score within 1e-4
    of lm-eval."""
    rows_ = FIXTURE["tasks"]["winogrande"][:3]
    records = real_model_records("winogrande", [r["doc"] for r in rows_], tmp_path, run_cli, reuse_weights)
    got = {sid: rec["predict_result"][0]["loglikelihoods"] for sid, rec in records.items()}
    assert sorted(got) == [f"winogrande-{i}" for i in range(3)]  # (written as they finish, in any order)
    for i, row in enumerate(rows_):
        assert got[f"winogrande-{i}"] == pytest.approx(row["loglikelihoods"], abs=1e-4)
