"""The openai backend end to end through the CLI, against tests/backends/openai_fake_server.py.

Every row ends scored or with its error written; retries cover 429 (Retry-After), 5xx,
timeouts, resets, truncated and garbage replies; the API key never reaches a file or a log.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gage_eval.api.backend import Request
from openai_fake_server import FakeServer, continuation_logprob, tokenize

TASKS = Path(__file__).resolve().parent / "openai_tasks"
FAST = "timeout=1,backoff=0.01,backoff_max=0.05,max_retries=4"


@pytest.fixture
def server():
    with FakeServer(stall_s=10) as s:
        yield s


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def run_task(run_cli, tmp_path, task: str, model_args: str, *extra: str):
    result = run_cli("--tasks", task, "--include-path", TASKS, "--model", "openai", "--model-args", model_args,
                     "-o", tmp_path, "--run-id", "run", "-q", *extra)
    run = tmp_path / "run"
    summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").exists() else None
    return result, run, summary


def test_faults_every_row_scored_or_errored(server, run_cli, tmp_path):
    result, run, summary = run_task(run_cli, tmp_path, "http_faults", f"base_url={server.url},{FAST}")
    assert result.exit_code == 1, result.output
    rows = {r["id"]: r for r in lines(run / "samples" / "http_faults.jsonl")}
    source = lines(TASKS / "http_faults" / "sample.jsonl")
    assert set(rows) == {r["id"] for r in source}
    errored = {sid for sid, r in rows.items() if r["eval_result"].get("error")}
    assert errored == {"exhausted", "exhausted429", "badrequest"}
    for sid, row in rows.items():
        result_ = row["eval_result"]
        if sid in errored:
            assert result_["error"]["stage"] == "inference"
            assert result_["error"]["locator"].startswith(str(TASKS / "http_faults" / "sample.jsonl") + ":") or \
                "sample.jsonl:" in result_["error"]["locator"]
        else:
            expected = 0.0 if sid == "ok-wrong" else 1.0
            assert result_["metrics"]["exact_match"]["value"] == expected, (sid, row["predict_result"])
    assert "gave up after 5 attempt(s): HTTP 500" in rows["exhausted"]["eval_result"]["error"]["message"]
    assert "HTTP 429" in rows["exhausted429"]["eval_result"]["error"]["message"]
    assert "HTTP 400: injected bad request" in rows["badrequest"]["eval_result"]["error"]["message"]
    # retried rows say how many attempts they took
    assert rows["mixed"]["predict_result"][0]["raw"] == {"attempts": 5}
    assert rows["r429x2"]["predict_result"][0]["raw"] == {"attempts": 3}
    assert "raw" not in rows["ok-plain"]["predict_result"][0]
    # what the server saw: a 400 is not retried, exhausted rows made 1 + max_retries attempts
    per_row: dict[str, int] = {}
    for entry in server.log:
        said = entry["body"]["messages"][-1]["content"].splitlines()[-1]
        per_row[said] = per_row.get(said, 0) + 1
    assert per_row["nut"] == 1 and per_row["date"] == 5 and per_row["guava"] == 5 and per_row["apple"] == 1
    assert per_row["mango"] == 2  # the stalled attempt timed out, the second succeeded
    counts = summary["tasks"]["http_faults"]["counts"]
    assert counts["total"] == len(source) == counts["scored"] + counts["errored"] + counts["skipped"]
    assert counts["errored"] == 3 and counts["scored"] == len(source) - 3
    assert summary["tasks"]["http_faults"]["errors_by_stage"] == {"inference": 3}
    events = [e for e in lines(run / "events.jsonl") if e.get("event") == "sample_error"]
    assert sorted(e["sample_id"] for e in events) == sorted(errored)
    instances = lines(run / "instances" / "http_faults.jsonl")
    assert len(instances) == len(source)
    ok = next(i for i in instances if i["sample_id"] == "ok-plain")
    assert ok["token_usage"]["input_tokens"] == len(tokenize("Say the fruit. \napple"))
    assert ok["performance"]["latency_ms"] > 0


def test_retry_after_is_honoured(run_cli, tmp_path):
    with FakeServer(retry_after="1") as server:
        backend_args = f"base_url={server.url},model=fake-model,backoff=0.001,backoff_max=0.002,max_retries=2"
        from gage_plugins_builtin.backends.openai_backend import openai_backend

        kwargs = dict(kv.split("=", 1) for kv in backend_args.split(","))
        backend = openai_backend(**kwargs)
        try:
            out = backend.run([Request(kind="generate", sample_id="x", prompt="[[faults:429]]\nok")])
        finally:
            backend.close()
        assert out[0].error is None and out[0].text == "ok"
        t = [e["t"] for e in server.log]
        assert len(t) == 2 and t[1] - t[0] >= 0.95  # waited for Retry-After, not the 2 ms backoff


def test_streaming_records_time_to_first_token(run_cli, tmp_path):
    with FakeServer(chunk_delay=0.02) as server:
        result, run, summary = run_task(run_cli, tmp_path, "http_faults", f"base_url={server.url},{FAST},stream=true")
    assert result.exit_code == 1, result.output
    rows = {r["id"]: r for r in lines(run / "samples" / "http_faults.jsonl")}
    assert rows["ok-plain"]["predict_result"][0]["message"]["content"][0]["text"] == "apple"
    assert rows["reset2"]["eval_result"]["metrics"]["exact_match"]["value"] == 1.0
    assert all(e["body"].get("stream") is True for e in server.log)
    perf = {i["sample_id"]: i.get("performance", {}) for i in lines(run / "instances" / "http_faults.jsonl")}
    assert 0 < perf["ok-plain"]["time_to_first_token_ms"] <= perf["ok-plain"]["latency_ms"]
    assert summary["tasks"]["http_faults"]["counts"]["errored"] == 3


def test_loglikelihood_from_echoed_logprobs(server, run_cli, tmp_path):
    result, run, summary = run_task(run_cli, tmp_path, "http_choice", f"base_url={server.url},{FAST}")
    assert result.exit_code == 0, result.output
    rows = lines(run / "samples" / "http_choice.jsonl")
    assert len(rows) == 4 and not any(r["eval_result"].get("error") for r in rows)
    for row in rows:
        pred = row["predict_result"][0]
        expected = [continuation_logprob(pred["prompt"], c) for c in pred["continuations"]]
        assert pred["loglikelihoods"] == pytest.approx(expected)
        assert pred["is_greedy"] == [c == " the" for c in pred["continuations"]]
    echo = [e["body"] for e in server.log]
    assert all(b["echo"] is True and b["logprobs"] == 1 and b["max_tokens"] == 1 for b in echo)
    metrics = summary["tasks"]["http_choice"]["metrics"]
    assert metrics["acc"]["value"] == pytest.approx(0.75)  # the fake model prefers " the", "short" is right


def test_server_without_echo_gives_each_row_a_clear_error(run_cli, tmp_path):
    with FakeServer(echo=False) as server:
        result, run, summary = run_task(run_cli, tmp_path, "http_choice",
                                        f"base_url={server.url},{FAST},concurrency=1")
    assert result.exit_code == 3, result.output
    rows = lines(run / "samples" / "http_choice.jsonl")
    assert len(rows) == 4
    for row in rows:
        message = row["eval_result"]["error"]["message"]
        assert "cannot score log-likelihood tasks" in message and "loglikelihood=false" in message
    assert summary["tasks"]["http_choice"]["counts"]["errored"] == 4
    assert len(server.log) == 1  # after the first reply shows no echo, no more requests are sent


def test_loglikelihood_false_refuses_up_front(server, run_cli, tmp_path):
    result = run_cli("--tasks", "http_choice", "--include-path", TASKS, "--model", "openai", "--model-args",
                     f"base_url={server.url},loglikelihood=false", "-o", tmp_path)
    assert result.exit_code == 2
    assert "needs loglikelihood" in result.output + (result.stderr if hasattr(result, "stderr") else "")
    assert server.log == []


def test_api_key_never_written(server, run_cli, tmp_path, capfd, monkeypatch):
    key = "sk-gage-NEVER-WRITE-3f9a1c7e"
    monkeypatch.setenv("GAGE_TEST_OPENAI_KEY", key)
    args = f"base_url={server.url},{FAST},api_key_env=GAGE_TEST_OPENAI_KEY,header_X-Team=evals"
    result, run, summary = run_task(run_cli, tmp_path, "http_faults", args, "--fail-fast")
    assert result.exit_code == 1  # stops at the first error row (--fail-fast), still writes everything so far
    auth = {e["headers"].get("authorization") for e in server.log}
    assert auth == {f"Bearer {key}"}  # the key was used ...
    assert {e["headers"].get("x-team") for e in server.log} == {"evals"}
    result2, run2, _ = run_task(run_cli, tmp_path / "b", "http_choice", args)
    assert result2.exit_code == 0
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len(files) >= 8
    for path in files:  # ... and written nowhere
        assert key not in path.read_text(encoding="utf-8", errors="replace"), path
    out, err = capfd.readouterr()
    for text in (out, err, result.output, result2.output):
        assert key not in text
    assert summary["run"]["model"]["settings"]["api_key_env"] == "GAGE_TEST_OPENAI_KEY"
    assert summary["run"]["model"]["settings"]["authenticated"] is True


def test_model_is_found_with_models_endpoint_and_headers_are_sent(server, run_cli, tmp_path):
    result, run, summary = run_task(run_cli, tmp_path, "http_capitals", f"base_url={server.url}")
    assert result.exit_code == 0, result.output
    assert summary["run"]["model"]["model_id"] == "fake-model"
    bodies = [e["body"] for e in server.log]
    assert len(bodies) == 6 and all(b["model"] == "fake-model" for b in bodies)
    # the task's generation settings reach the request; the chat template is the server's business
    assert all(b["max_tokens"] == 16 and b["temperature"] == 0 and b["stop"] == ["\n"] for b in bodies)
    assert all(b["messages"][-1]["content"].endswith("Answer with one word.") for b in bodies)
    assert all("authorization" not in e["headers"] for e in server.log) or os.environ.get("OPENAI_API_KEY")


def test_unreachable_server_is_a_clear_error(run_cli, tmp_path):
    with FakeServer() as server:
        url = server.url
    result = run_cli("--tasks", "http_capitals", "--include-path", TASKS, "--model", "openai",
                     "--model-args", f"base_url={url}", "-o", tmp_path)
    assert result.exit_code == 3  # a dead server: the backend stopped the run (README, Exit status)
    text = result.output + (result.stderr if hasattr(result, "stderr") else "")
    assert "cannot reach" in text and "model=NAME" in text and "Traceback" not in text


def test_unreachable_server_with_model_name_errors_every_row(run_cli, tmp_path):
    with FakeServer() as server:
        url = server.url
    result, run, summary = run_task(run_cli, tmp_path, "http_capitals",
                                    f"base_url={url},model=m,max_retries=1,backoff=0.01")
    assert result.exit_code == 3
    rows = lines(run / "samples" / "http_capitals.jsonl")
    assert len(rows) == 6 and all("connection error" in r["eval_result"]["error"]["message"] for r in rows)
    assert summary["tasks"]["http_capitals"]["counts"]["errored"] == 6


def test_judged_task_through_the_openai_backend(server, run_cli, tmp_path):
    """The model and the judge (a second openai backend) both talk to the fake server."""
    result, run, summary = run_task(run_cli, tmp_path, "http_judged", f"base_url={server.url},{FAST}",
                                    "--judge-model", "openai", "--judge-args",
                                    f"base_url={server.url},{FAST},concurrency=2")
    assert result.exit_code == 1, result.output
    rows = {r["id"]: r for r in lines(run / "samples" / "http_judged.jsonl")}
    assert rows["j-right"]["eval_result"]["judge"]["score"] == 1.0
    assert rows["j-wrong"]["eval_result"]["judge"]["score"] == 0.0
    assert rows["j-retry"]["eval_result"]["judge"]["score"] == 1.0  # model and judge requests both retried
    failed = rows["j-judge-fails"]["eval_result"]["error"]
    assert failed["stage"] == "judge" and "gave up after 5 attempt(s)" in failed["message"]
    judge_prompts = [e for e in server.log if "Grade the answer" in e["body"]["messages"][-1]["content"]]
    assert len(judge_prompts) == 1 + 1 + 3 + 5
    counts = summary["tasks"]["http_judged"]["counts"]
    assert (counts["total"], counts["scored"], counts["errored"], counts["judge_errors"]) == (4, 3, 1, 1)
    assert summary["run"]["judge"]["settings"]["concurrency"] == 2


@pytest.mark.parametrize("concurrency", [3, 20])
def test_concurrency_limit_is_kept_across_client_pools(concurrency):
    from gage_plugins_builtin.backends.openai_backend import openai_backend

    with FakeServer(latency=0.05) as server:
        backend = openai_backend(base_url=server.url, model="fake-model", concurrency=concurrency)
        try:
            first = backend.run([Request(kind="generate", sample_id=str(i), prompt=f"q\nanswer {i}")
                                 for i in range(60)])
            second = backend.run([Request(kind="generate", sample_id="again", prompt="q\nagain")])
        finally:
            backend.close()
        assert [o.text for o in first] == [f"answer {i}" for i in range(60)]  # in order, none lost
        assert second[0].text == "again"  # the backend's loop and clients live across run() calls
        assert 1 < server.max_inflight <= concurrency
