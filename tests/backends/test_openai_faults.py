"""The openai backend against a faulty server: every run ends within a stated bound.

Each test uses short deadlines (``FAST``: 2 s an attempt, 0.5 s of silence, 0.3 s of
breaker span) so a fault costs seconds; the bounds asserted are those deadlines plus
slack for a loaded machine. The defaults' bounds are measured in benchmarks/README.md
("HTTP failure bounds").
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from gage_eval.api.backend import Request
from gage_eval.api.errors import FatalBackendError
from gage_plugins_builtin.backends.openai_backend import openai_backend
from gage_plugins_builtin.backends.openai_http import Breaker
from openai_fake_server import FakeServer

ROOT = Path(__file__).resolve().parents[2]
TASKS = Path(__file__).resolve().parent / "openai_fault_tasks"
FAST = dict(model="fake-model", timeout=2, read_timeout=0.5, connect_timeout=0.5, max_retries=2, backoff=0.01,
            backoff_max=0.05, breaker_seconds=0.3)


def requests(n: int = 20, prefix: str = "") -> list[Request]:
    return [Request(kind="generate", sample_id=str(i), prompt=f"{prefix}q\nanswer{i}") for i in range(n)]


def run_backend(server: FakeServer, reqs: list[Request], **args):
    """(outputs or the FatalBackendError, seconds taken); the backend is closed after."""
    backend = openai_backend(base_url=server.url, **{**FAST, **args})
    t0 = time.monotonic()
    try:
        try:
            return backend.run(reqs), time.monotonic() - t0, backend
        except FatalBackendError as exc:
            return exc, time.monotonic() - t0, backend
    finally:
        backend.close()


# -- fatal answers: the first one stops everything ---------------------------------------------

@pytest.mark.parametrize("fault, words", [
    ("401", ["401 Unauthorized", "api_key_env"]),
    ("403", ["403 Forbidden"]),
    ("404", ["404 Not Found", "check base_url"]),
    ("404model", ["404 model not found", "model=fake-model", "/v1/models"]),
])
def test_fatal_answer_stops_the_run_at_once(fault, words):
    with FakeServer(fault=fault) as server:
        outcome, seconds, backend = run_backend(server, requests(40), concurrency=4)
        sent = len(server.log)
        assert isinstance(outcome, FatalBackendError), outcome
        message = str(outcome)
        assert "\n" not in message and all(w in message for w in words), message
        assert f"{server.url}/completions" in message
        assert seconds < 2
        assert sent <= 4  # only the requests already in flight; none retried, none after
        with pytest.raises(FatalBackendError):  # and every later call, without a request
            backend.run(requests(3))
        assert len(server.log) == sent


def test_model_not_found_in_a_400_is_fatal_too():
    with FakeServer(fault="400model") as server:
        outcome, _, _ = run_backend(server, requests(2))
    assert isinstance(outcome, FatalBackendError) and "400 model not found" in str(outcome)


def test_bad_request_fails_its_row_only_and_is_not_retried():
    with FakeServer() as server:
        reqs = requests(3) + [Request(kind="generate", sample_id="bad", prompt="[[faults:400]]\nx"),
                              Request(kind="generate", sample_id="conflict", prompt="[[faults:409]]\nx")]
        out, seconds, _ = run_backend(server, reqs)
        assert [o.text for o in out[:3]] == ["answer0", "answer1", "answer2"]
        assert "HTTP 400" in out[3].error
        assert "HTTP 409" in out[4].error
        assert sum(1 for e in server.log if "[[faults:" in str(e["body"])) == 2  # one attempt each


# -- the circuit breaker: dead, hung, dripping, always failing -----------------------------------

@pytest.mark.parametrize("fault, bound, words", [
    ("500", 3, ["HTTP 500", "max_consecutive_failures=5"]),
    ("hang", 4, ["sent nothing for 0.5 s (read_timeout=0.5)"]),
    ("drip", 6, ["no complete reply within 2 s (timeout=2)"]),
    ("midreset", 3, ["connection broke in the middle of the reply"]),
    ("badjson", 3, ["bad reply: not JSON"]),
])
def test_breaker_ends_a_run_against_a_broken_server(fault, bound, words):
    with FakeServer(fault=fault, drip_s=0.2) as server:  # (retries enough to outlast breaker_seconds)
        outcome, seconds, _ = run_backend(server, requests(20), max_retries=50)
        assert isinstance(outcome, FatalBackendError), outcome
        message = str(outcome)
        assert "\n" not in message and "failed attempts in a row" in message and server.url in message, message
        assert all(w in message for w in words), message
        assert seconds < bound, seconds


def test_dead_server_ends_the_run_through_the_breaker():
    with FakeServer() as server:
        url = server.url
    backend = openai_backend(base_url=url, **{**FAST, "max_retries": 50})
    t0 = time.monotonic()
    try:
        with pytest.raises(FatalBackendError, match="connection error.*is the server up"):
            backend.run(requests(5))
    finally:
        backend.close()
    assert time.monotonic() - t0 < 3


@pytest.mark.parametrize("fault, requests_n, concurrency", [("dead", 1, 1), ("500", 20, 4)])
def test_the_breaker_says_how_many_attempts_and_requests_failed(fault, requests_n, concurrency):
    """One request retried against a dead server was 'N failures in a row' (its N attempts);
    the message says how many attempts failed, of how many requests, over how long."""
    import re

    with FakeServer(fault=None if fault == "dead" else fault) as server:
        if fault != "dead":
            outcome, _, _ = run_backend(server, requests(requests_n), max_retries=50, concurrency=concurrency)
    if fault == "dead":  # (the server closed: every connection refused)
        outcome, _, _ = run_backend(server, requests(requests_n), max_retries=50, concurrency=concurrency)
    sent = len(server.log)
    assert isinstance(outcome, FatalBackendError), outcome
    m = re.search(r"stopped after (\d+) failed attempts in a row, of (\d+) requests? from \S+ over ([\d.]+) s ",
                  str(outcome))
    assert m, str(outcome)
    attempts, asked, span = int(m[1]), int(m[2]), float(m[3])
    assert span >= 0.3 and asked <= requests_n and attempts >= asked  # (breaker_seconds=0.3)
    if fault == "dead":
        assert asked == 1 and attempts >= 5, str(outcome)
    else:  # each attempt the server saw failed
        assert asked >= 5 and attempts <= sent, (str(outcome), sent)


def test_breaker_waits_out_a_short_outage():
    """A streak shorter than breaker_seconds is ridden out by the retries."""
    with FakeServer() as server:
        reqs = [Request(kind="generate", sample_id=str(i), prompt=f"[[faults:503*3]]\nanswer{i}") for i in range(8)]
        out, _, _ = run_backend(server, reqs, breaker_seconds=5, max_retries=4)
        assert [o.text for o in out] == [f"answer{i}" for i in range(8)]


def test_breaker_counts_a_streak_and_its_span():
    now = [0.0]
    b = Breaker(3, 10.0, clock=lambda: now[0])
    assert not b.failure(0.0) and not b.failure(0.5)
    assert not b.failure(1.0)  # three in a row, but over 1 s
    now[0] = 10.5
    assert b.failure(10.0)
    b.success()
    assert b.streak == 0 and not b.failure(10.6)
    hung = Breaker(3, 10.0, clock=lambda: 70.0)  # attempts that started at 0 and timed out at 70
    assert not hung.failure(0.0) and not hung.failure(0.0) and hung.failure(0.0)
    quick = Breaker(3, 10.0, clock=lambda: 1.0)  # a long streak, but within the span: never tripped
    assert not any(quick.failure(0.0) for _ in range(50))
    one_prompt = Breaker(3, 0.0)  # one request failing again and again is that request's trouble
    assert not any(one_prompt.failure(0.0, "req", own=True) for _ in range(10))
    assert not one_prompt.failure(0.0, "other", own=True) and one_prompt.failure(0.0, "third", own=True)
    assert (one_prompt.attempts, len(one_prompt.requests)) == (12, 3)
    off = Breaker(0, 0.0)
    assert not any(off.failure(0.0) for _ in range(100))


def test_one_failing_prompt_never_stops_the_run():
    """A prompt the server answers with 500 every time fails its row; the breaker stays shut."""
    with FakeServer() as server:
        out, _, _ = run_backend(server, [Request(kind="generate", sample_id="x", prompt="[[faults:500*99]]\nx")],
                                max_retries=8, breaker_seconds=0)
        assert "gave up after 9 attempt(s): HTTP 500" in out[0].error
        out, _, _ = run_backend(server, requests(2))
        assert [o.text for o in out] == ["answer0", "answer1"]


def test_rows_with_broken_replies_error_and_the_run_goes_on():
    with FakeServer() as server:
        reqs = requests(6)
        reqs[1] = Request(kind="generate", sample_id="reset", prompt="[[faults:midreset*9]]\nx")
        reqs[4] = Request(kind="generate", sample_id="json", prompt="[[faults:badjson*9]]\nx")
        out, _, _ = run_backend(server, reqs, breaker_seconds=30)
        assert "gave up after 3 attempt(s): connection error: the connection broke in the middle" in out[1].error
        assert "gave up after 3 attempt(s): bad reply: not JSON" in out[4].error
        assert [o.text for i, o in enumerate(out) if i not in (1, 4)] == ["answer0", "answer2", "answer3",
                                                                         "answer5"]


# -- size cap -----------------------------------------------------------------------------------

@pytest.mark.parametrize("fault", ["huge", "hugechunked"])
def test_oversized_reply_fails_its_row_unread_and_unkept(fault):
    cap = 2 ** 20
    with FakeServer() as server:
        reqs = requests(3)
        reqs[1] = Request(kind="generate", sample_id="big", prompt=f"[[faults:{fault}*9]]\nx")
        tracemalloc.start()
        try:
            out, seconds, _ = run_backend(server, reqs, max_response_bytes=cap)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert out[1].error.endswith(f"reply larger than {cap} bytes (max_response_bytes={cap}); not kept")
        assert [out[0].text, out[2].text] == ["answer0", "answer2"]
        assert sum(1 for e in server.log if "faults:huge" in str(e["body"])) == 1  # not retried
        assert peak < 8 * cap, peak  # the 50 MB reply was never held
        assert server.sent_bytes < 50 * 2 ** 20 and seconds < 5


def test_streamed_reply_is_capped_too():
    with FakeServer() as server:
        out, _, _ = run_backend(server, [Request(kind="generate", sample_id="s", prompt="q\n" + "word " * 400)],
                                stream=True, max_response_bytes=2000)
        assert "reply larger than 2000 bytes" in out[0].error
        out, _, _ = run_backend(server, requests(2), stream=True, max_response_bytes=2000)
        assert [o.text for o in out] == ["answer0", "answer1"]


# -- retry sleeps hold no slot ---------------------------------------------------------------------

def test_retry_sleep_releases_its_concurrency_slot():
    with FakeServer(retry_after="1") as server:
        reqs = [Request(kind="generate", sample_id="a", prompt="[[faults:429]]\nfirst"),
                Request(kind="generate", sample_id="b", prompt="q\nsecond")]
        out, seconds, _ = run_backend(server, reqs, concurrency=1)
        assert [o.text for o in out] == ["first", "second"]
        said = [(e["body"]["prompt"].splitlines()[-1], e["t"]) for e in server.log]
        assert [s for s, _ in said] == ["first", "second", "first"]  # b went while a waited out Retry-After
        assert said[2][1] - said[0][1] >= 0.95


def test_defaults_and_their_settings():
    backend = openai_backend(base_url="http://127.0.0.1:9/v1", model="m")
    s = backend.settings()
    assert (s["timeout_s"], s["connect_timeout_s"], s["read_timeout_s"]) == (120, 10, 60)
    assert s["max_response_bytes"] == 8 * 2 ** 20
    assert (s["max_consecutive_failures"], s["breaker_seconds"], s["max_retries"]) == (5, 10, 5)
    short = openai_backend(base_url="http://127.0.0.1:9/v1", model="m", timeout=5).settings()
    assert short["read_timeout_s"] == 5 and short["connect_timeout_s"] == 5  # never past the attempt's deadline


def test_fatal_error_inside_a_running_event_loop():
    with FakeServer(fault="401") as server:
        backend = openai_backend(base_url=server.url, **FAST)

        async def caller():
            return backend.run(requests(2))

        try:
            with pytest.raises(FatalBackendError, match="401"):
                asyncio.run(caller())
        finally:
            backend.close()


# -- through the real command line ------------------------------------------------------------------

def cli(server: FakeServer, out: Path, args: str = "", env: dict | None = None,
        timeout: float = 60, **over) -> tuple[subprocess.CompletedProcess, float]:
    fast = ",".join(f"{k}={v}" for k, v in {**FAST, **over}.items())
    argv = [sys.executable, "-m", "gage_eval.cli", "--tasks", "http_rows", "--include-path", str(TASKS),
            "--model", "openai", "--model-args", f"base_url={server.url},{fast}{args}", "-o", str(out),
            "--run-id", "r"]
    t0 = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), **(env or {})})
    return proc, time.monotonic() - t0


def rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "r" / "samples" / "http_rows.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("fault, bound, words", [
    ("401", 20, "401 Unauthorized"),
    ("hang", 25, "sent nothing for 0.5 s"),
    ("500", 25, "failed attempts in a row"),
])
def test_cli_stops_on_a_fatal_fault_with_every_row_written(fault, bound, words, tmp_path):
    """Through a subprocess (interpreter start-up included): exit 3, 20 rows written, each errored."""
    with FakeServer(fault=fault) as server:  # (retries enough to outlast breaker_seconds)
        proc, seconds = cli(server, tmp_path, max_retries=50)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 3, text
    assert "Traceback" not in text and words in text
    written = rows(tmp_path)
    assert len(written) == 20 and all(words in r["eval_result"]["error"]["message"] for r in written)
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    counts = summary["tasks"]["http_rows"]["counts"]
    assert counts["total"] == 20 == counts["errored"]
    assert seconds < bound, seconds


def test_cli_oversized_rows_error_and_the_rest_score(tmp_path):
    with FakeServer(fault="hugechunked") as server:
        proc, _ = cli(server, tmp_path, ",max_response_bytes=100000,concurrency=4")
    assert proc.returncode == 3, proc.stdout + proc.stderr  # every row errored: the task scored nothing
    written = rows(tmp_path)
    assert len(written) == 20 and all("reply larger than 100000 bytes" in r["eval_result"]["error"]["message"]
                                      for r in written)
    assert max(p.stat().st_size for p in (tmp_path / "r").rglob("*") if p.is_file()) < 200_000
