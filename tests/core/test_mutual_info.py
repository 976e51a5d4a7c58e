"""acc_mutual_info: the metric against a hand computation, the requests that carry an unconditioned
context, and the legacy preprocessor's unconditioned_input arguments."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gage_eval.api.backend import LOGLIKELIHOOD
from gage_eval.api.metric import MetricContext, TaskAggregate, metric_value
from gage_eval.tasks.requests import RequestBuilder, unconditioned_context
from gage_eval.api.sample import RowContext
from gage_eval.tasks.spec import TaskSpec
from gage_plugins_builtin.metrics.choice import Accuracy, NormalizedAccuracy
from gage_plugins_builtin.metrics.mutual_info import MutualInfoAccuracy
from gage_plugins_builtin.preprocessors import Legacy

OPTIONS = [{"id": "A", "content": "x"}, {"id": "B", "content": "yy"}, {"id": "C", "content": "zzz"}]

# (gold, conditional, unconditioned) -> by hand: PMI = conditional - unconditioned, argmax, first wins
ROWS = [
    # acc picks A (-1.0); PMI = [-1.0+1.5, -2.0+4.0, -3.0+3.5] = [0.5, 2.0, 0.5] picks B
    ("B", [-1.0, -2.0, -3.0], [-1.5, -4.0, -3.5]),
    # acc picks A (gold); PMI = [-0.5+0.5, -0.7+1.0, -4.0+4.0] = [0.0, 0.3, 0.0] picks B (wrong)
    ("A", [-0.5, -0.7, -4.0], [-0.5, -1.0, -4.0]),
    # a tie in PMI: [-2+3, -1+2, -5+5] = [1.0, 1.0, 0.0]: the first maximum (A) wins, like acc
    ("A", [-2.0, -1.0, -5.0], [-3.0, -2.0, -5.0]),
    # a tie, gold second: still A, so wrong
    ("B", [-2.0, -1.0, -5.0], [-3.0, -2.0, -5.0]),
    # both agree on C
    ("C", [-3.0, -3.0, -0.1], [-1.0, -1.0, -1.0]),
]
EXPECTED_PMI = [1.0, 0.0, 1.0, 0.0, 1.0]
EXPECTED_ACC = [0.0, 1.0, 0.0, 1.0, 1.0]


def ctx(gold, lls, base, **extra) -> MetricContext:
    sample = {"id": "s", "options": OPTIONS, "label": gold}
    out = {"loglikelihoods": lls, "choices": [o["content"] for o in OPTIONS], **extra}
    if base is not None:
        out["unconditioned_loglikelihoods"] = base
    return MetricContext(sample=sample, model_output=out)


def test_hand_computation_per_row_and_mean():
    metric = MutualInfoAccuracy()
    got = [metric_value(metric.compute(ctx(*row))) for row in ROWS]
    assert got == EXPECTED_PMI
    assert [metric_value(Accuracy().compute(ctx(*row))) for row in ROWS] == EXPECTED_ACC
    agg = TaskAggregate()
    for value in got:
        agg.add({"acc_mutual_info": value}, None)
    assert agg.result()["metrics"]["acc_mutual_info"]["value"] == pytest.approx(3 / 5)


def test_details_name_the_pick_and_method():
    result = MutualInfoAccuracy().compute(ctx(*ROWS[0]))
    assert result == {"value": 1.0, "extracted": "B", "method": "mutual_information_argmax"}


def test_needs_unconditioned_only_on_the_mutual_info_metric():
    assert MutualInfoAccuracy.needs_unconditioned is True
    assert not getattr(Accuracy, "needs_unconditioned", False)
    assert not getattr(NormalizedAccuracy, "needs_unconditioned", False)


@pytest.mark.parametrize("base, message", [
    (None, "no unconditioned log-likelihoods"),
    ([-1.0, -2.0], "2 unconditioned log-likelihoods for 3 choices"),
])
def test_missing_or_short_unconditioned_scores_are_errors(base, message):
    with pytest.raises(ValueError, match=message):
        MutualInfoAccuracy().compute(ctx("A", [-1.0, -2.0, -3.0], base))


def test_gold_not_an_option_is_an_error():
    with pytest.raises(ValueError, match="not an option id"):
        MutualInfoAccuracy().compute(ctx("D", [-1.0, -2.0, -3.0], [0.0, 0.0, 0.0]))


def test_registered_as_acc_mutual_info(fresh_plugins):
    _, registry = fresh_plugins.load_plugins()
    metric = registry.get("metrics", "acc_mutual_info").factory()
    assert isinstance(metric, MutualInfoAccuracy) and metric.name == "acc_mutual_info"


# --- requests -------------------------------------------------------------------------------------

def spec(tmp_path: Path) -> TaskSpec:
    (tmp_path / "prompt.jinja").write_text("Question: {{ question }}\nAnswer:")
    request = {"kind": LOGLIKELIHOOD, "prompt": "prompt.jinja", "target_delimiter": " "}
    return TaskSpec(name="t", folder=tmp_path, origin="test", description="", dataset={}, preprocessor={},
                    request=request, metrics=["acc"])


def sample(**extra) -> dict:
    return {"schema_version": "v1", "id": "1", "options": OPTIONS, "label": "A",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Which?"}]}], **extra}


def test_no_unconditioned_request_unless_a_metric_needs_it(tmp_path):
    builder = RequestBuilder(spec(tmp_path), metrics=[Accuracy(), NormalizedAccuracy()])
    request, rendered = builder.build(sample(unconditioned_input="Answer:"))
    assert request.unconditioned is None
    assert request.continuations == (" x", " yy", " zzz")
    assert RequestBuilder(spec(tmp_path)).build(sample())[0].unconditioned is None


@pytest.mark.parametrize("extra, expected", [
    ({}, ""),  # lm-eval's empty context
    ({"unconditioned_input": "Answer:"}, "Answer:"),
    ({"unconditioned_input": [{"role": "user", "content": [{"type": "text", "text": "Pick one."}]}]},
     "Pick one."),
])
def test_unconditioned_context_from_the_sample(tmp_path, extra, expected):
    builder = RequestBuilder(spec(tmp_path), metrics=[Accuracy(), MutualInfoAccuracy()])
    request, _ = builder.build(sample(**extra))
    assert request.unconditioned == expected
    assert request.prompt == "Question: Which?\nAnswer:"
    assert unconditioned_context(sample(**extra)) == expected


# --- preprocessor ---------------------------------------------------------------------------------

RECORD = {"goal": "Open a jar.", "sol1": "Twist.", "sol2": "Freeze.", "label": 0, "bare": "Answer:"}


def legacy(**args) -> Legacy:
    return Legacy(question="goal", choices=["sol1", "sol2"], answer="label", **args)


def test_legacy_fills_unconditioned_input_from_a_field_or_a_constant():
    row = RowContext(task="t", locator="rows.jsonl:1", index=0)
    assert "unconditioned_input" not in legacy()(RECORD, row)
    assert legacy(unconditioned="bare")(RECORD, row)["unconditioned_input"] == "Answer:"
    assert legacy(unconditioned_text="")(RECORD, row)["unconditioned_input"] == ""
    with pytest.raises(KeyError):
        legacy(unconditioned="nope")(RECORD, row)
    with pytest.raises(ValueError, match="not both"):
        legacy(unconditioned="bare", unconditioned_text="")


# --- through the engine (dummy backend) -----------------------------------------------------------

TASKS = Path(__file__).resolve().parents[1] / "data"


def _records(run: Path, task: str) -> list[dict]:
    return [json.loads(line) for line in (run / "samples" / f"{task}.jsonl").read_text().splitlines()]


def test_engine_run_scores_each_row_from_its_recorded_scores(tmp_path, run_cli):
    result = run_cli("--tasks", "piqa_mi", "--include-path", TASKS, "--model", "dummy", "-o", tmp_path,
                     "--run-id", "r", "--quiet")
    assert result.exit_code == 0, result.output
    records = _records(tmp_path / "r", "piqa_mi")
    assert records
    for rec in records:
        pred = rec["predict_result"][0]
        pmi = [c - u for c, u in zip(pred["loglikelihoods"], pred["unconditioned_loglikelihoods"])]
        pick = rec["options"][max(range(len(pmi)), key=pmi.__getitem__)]["id"]
        assert rec["eval_result"]["metrics"]["acc_mutual_info"]["value"] == float(pick == rec["label"])


def test_a_task_without_the_metric_sends_no_unconditioned_request(tmp_path, run_cli):
    result = run_cli("--tasks", "piqa", "--model", "dummy", "--limit", 5, "-o", tmp_path, "--run-id", "r", "--quiet")
    assert result.exit_code == 0, result.output
    assert all("unconditioned_loglikelihoods" not in rec["predict_result"][0]
               for rec in _records(tmp_path / "r", "piqa"))


# --- against lm-evaluation-harness with the real model (heavy: minutes, needs its venv) ------------

@pytest.mark.heavy
@pytest.mark.slow
def test_parity_with_lm_eval_on_piqa_rows(shared_data, smollm2_gguf, tmp_path, monkeypatch):
    """acc, acc_norm and acc_mutual_info of gage-eval equal lm-eval 0.4.13's on the first 40 piqa
    rows, row by row, with every log-likelihood (conditional and unconditioned) within 1e-3."""
    import importlib.util as iu

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "mutual_info_parity.py"
    mod_spec = iu.spec_from_file_location("mutual_info_parity", script)
    parity = iu.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(parity)
    if not (parity.LMEVAL_VENV / "bin" / "python").is_file():
        pytest.skip(f"needs lm-eval 0.4.13 in a venv at {parity.LMEVAL_VENV} (or $LMEVAL_VENV)")
    monkeypatch.setattr(parity, "OUT", tmp_path)
    data = shared_data / "piqa" / "derived" / "validation.jsonl"
    lm = parity.run_lm_eval(smollm2_gguf, data, 40, "16")
    gage = parity.run_gage(data, 40)
    diff = parity.compare(gage, lm)
    assert all(r.get("error") is None for r in gage["rows"].values())
    assert diff["rows_differing"] == {m: [] for m in parity.METRICS}
    assert gage["metrics"] == pytest.approx(lm["metrics"], abs=1e-9)
    assert diff["max_abs_ll_diff"] < 1e-3 and diff["max_abs_unconditioned_ll_diff"] < 1e-3
