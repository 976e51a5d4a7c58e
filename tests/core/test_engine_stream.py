"""The engine consumes Backend.stream(): rows are written as their outputs arrive, in any order;
a backend that skips, repeats or stops part way loses no row; unconditioned scores arrive as a
second request per sample."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import gage_eval.engine.executor as executor_mod
from gage_eval.api.backend import LOGLIKELIHOOD, Backend, ModelOutput, Request
from gage_eval.engine.loop import Engine, RunOptions
from gage_eval.api.errors import FatalBackendError

ROOT = Path(__file__).resolve().parents[2]


class Scripted(Backend):
    """Log-likelihood outputs in a chosen order; may skip, repeat or raise after some yields."""

    capabilities = frozenset({"loglikelihood", "generate"})
    model_id = "scripted"

    def __init__(self, order="reverse", stop_after=None, stop_with=None, repeat=False, skip=()):
        self.order, self.stop_after, self.stop_with, self.repeat, self.skip = order, stop_after, stop_with, repeat, skip
        self.max_batch = 8
        self.seen: list[Request] = []
        self.written_when_yielding: list[int] = []

    def run(self, requests):
        raise AssertionError("the engine must use stream()")

    def stream(self, requests):
        self.seen.extend(requests)
        order = list(range(len(requests)))[::-1] if self.order == "reverse" else list(range(len(requests)))
        for n, i in enumerate(order):
            if self.stop_after is not None and n == self.stop_after:
                raise self.stop_with
            if i in self.skip:
                continue
            self.written_when_yielding.append(_lines(self.samples_path))
            out = ModelOutput(loglikelihoods=[-1.0 - i % 3, -2.0], is_greedy=[False, False])
            yield i, out
            if self.repeat:
                yield i, ModelOutput(loglikelihoods=[-99.0, 0.0])


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def run_with(monkeypatch, tmp_path, backend: Scripted, task="piqa", include=()):
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    backend.samples_path = run_dir / "samples" / f"{task}.jsonl"
    monkeypatch.setattr(executor_mod, "make_backend", lambda *a, **k: backend)  # (the model is built in executor.model_backend)
    summary = Engine(RunOptions(tasks=[task], model="dummy", quiet=True, include_paths=list(include)),
                     run_dir).run()
    records = [json.loads(l) for l in backend.samples_path.read_text().splitlines()]
    return summary, records


def test_rows_are_written_as_outputs_arrive_in_any_order(monkeypatch, tmp_path):
    backend = Scripted(order="reverse")
    summary, records = run_with(monkeypatch, tmp_path, backend)
    assert summary["tasks"]["piqa"]["counts"]["scored"] == 24
    assert len({r["id"] for r in records}) == 24
    # before each yield, every earlier output of the window was already on disk
    assert backend.written_when_yielding == [i for i in range(24)]


def test_a_backend_that_skips_or_repeats_loses_nothing_and_counts_once(monkeypatch, tmp_path):
    summary, records = run_with(monkeypatch, tmp_path, Scripted(order="forward", repeat=True, skip={3}))
    counts = summary["tasks"]["piqa"]["counts"]
    assert counts["total"] == 24 and len({r["id"] for r in records}) == 24
    errored = [r for r in records if "error" in r["eval_result"]]
    assert len(errored) == 3  # index 3 of each window of 8 was never answered
    assert all("no output" in r["eval_result"]["error"]["message"] for r in errored)
    first = records[0]["predict_result"][0]["loglikelihoods"]
    assert first != [-99.0, 0.0]  # a repeated index is ignored, not written twice


def test_a_fatal_stop_part_way_writes_the_rest_as_errored(monkeypatch, tmp_path):
    backend = Scripted(order="forward", stop_after=5, stop_with=FatalBackendError("server said 401"))
    summary, records = run_with(monkeypatch, tmp_path, backend)
    task = summary["tasks"]["piqa"]
    assert task["counts"]["total"] == 24 and task["counts"]["scored"] == 5
    assert task["status"] == "failed" and "401" in task["failure"]
    assert len(backend.seen) == 8  # no later window was sent to a stopped backend


def test_a_backend_crash_part_way_keeps_the_finished_rows(monkeypatch, tmp_path):
    backend = Scripted(order="forward", stop_after=2, stop_with=RuntimeError("boom"))
    summary, records = run_with(monkeypatch, tmp_path, backend)
    counts = summary["tasks"]["piqa"]["counts"]
    assert counts["total"] == 24 and counts["scored"] == 24 - 3 * 6
    assert any("RuntimeError: boom" in r["eval_result"].get("error", {}).get("message", "") for r in records)


def test_unconditioned_scores_come_from_a_second_request(monkeypatch, tmp_path):
    backend = Scripted(order="reverse")
    summary, records = run_with(monkeypatch, tmp_path, backend, task="piqa_mi", include=[ROOT / "tests" / "data"])
    assert summary["tasks"]["piqa_mi"]["counts"]["scored"] == 24
    main = [r for r in backend.seen if r.unconditioned is not None]
    aux = [r for r in backend.seen if r.unconditioned is None]
    assert len(main) == len(aux) == 24
    for m in main:  # the same continuations (delimiter included) after the unconditioned context
        twin = next(a for a in aux if a.sample_id == m.sample_id)
        assert twin.kind == LOGLIKELIHOOD and twin.prompt == m.unconditioned == ""
        assert twin.continuations == m.continuations and m.continuations[0].startswith(" ")
    for r in records:
        pred = r["predict_result"][0]
        assert len(pred["unconditioned_loglikelihoods"]) == 2
        assert "acc_mutual_info" in r["eval_result"]["metrics"]


def test_an_unconditioned_request_that_fails_errors_its_row(monkeypatch, tmp_path):
    class FailAux(Scripted):
        def stream(self, requests):
            for i, out in super().stream(requests):
                yield i, (ModelOutput(error="aux failed") if requests[i].unconditioned is None else out)

    summary, records = run_with(monkeypatch, tmp_path, FailAux(), task="piqa_mi", include=[ROOT / "tests" / "data"])
    assert summary["tasks"]["piqa_mi"]["counts"]["errored"] == 24
    assert all("unconditioned scores: aux failed" in r["eval_result"]["error"]["message"] for r in records)


def test_apply_chat_template_is_checked_against_the_model_before_anything_loads():
    from gage_eval.engine.taskrun import _check_capabilities
    from gage_eval.api.errors import GageError
    from gage_eval.tasks.spec import read_task_file

    class NoChat(Backend):
        capabilities = frozenset({"loglikelihood", "generate"})
        model_id = "plain-lm"

    piqa = read_task_file(ROOT / "tasks" / "piqa")
    _check_capabilities([piqa], NoChat(), "plain")  # the task's own setting: no chat needed
    _check_capabilities([piqa], NoChat(), "plain", chat=False)
    with pytest.raises(GageError, match=r"needs chat \(--apply-chat-template\), which model 'plain'"):
        _check_capabilities([piqa], NoChat(), "plain", chat=True)


def test_a_hub_task_offline_fails_alone_with_the_loaders_reason(tmp_path, run_cli, monkeypatch):
    """docvqa's hf loader takes an argument called ``name`` (the dataset config), and the loader is
    asked for its row count before the rows are read: neither may turn into a crash or a usage
    error; the task fails with the loader's own reason and piqa still runs."""
    pytest.importorskip("datasets")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    result = run_cli("--tasks", "docvqa,piqa", "--model", "dummy", "-o", tmp_path, "--run-id", "r")
    assert result.exit_code == 3, result.output
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["tasks"]["docvqa"]["status"] == "failed"
    assert "hf loader: cannot load 'lmms-lab/DocVQA'" in summary["tasks"]["docvqa"]["failure"]
    assert summary["tasks"]["piqa"]["status"] == "ok"
