"""The openai backend over several base URLs (``base_url=A|B``): two fake servers, one stopped mid-run.

Routing goes to the least busy healthy endpoint; a failing endpoint leaves the rotation for a
back-off and a retry goes to another at once; only with every endpoint out do the retries and
the breaker end rows and the run, as with one endpoint.
"""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from gage_eval.api.backend import Request
from gage_eval.api.errors import FatalBackendError, GageError
from gage_plugins_builtin.backends.openai_backend import openai_backend
from gage_plugins_builtin.backends.openai_endpoints import Endpoint, Router, split_urls
from openai_fake_server import FakeServer

TASKS = Path(__file__).resolve().parent / "openai_fault_tasks"
CHOICE = Path(__file__).resolve().parent / "openai_tasks"
FAST = "model=fake-model,timeout=2,read_timeout=1,connect_timeout=0.5,max_retries=2,backoff=0.01,backoff_max=0.05," \
       "breaker_seconds=0.3,endpoint_backoff=0.2"
FAST_ARGS = dict(model="fake-model", timeout=2, read_timeout=1, connect_timeout=0.5, max_retries=2, backoff=0.01,
                 backoff_max=0.05, breaker_seconds=0.3, endpoint_backoff=0.2)


def requests(n: int, prefix: str = "") -> list[Request]:
    return [Request(kind="generate", sample_id=str(i), prompt=f"{prefix}q\nanswer{i}") for i in range(n)]


def run_closed(backend, n: int) -> list:
    """The outputs of ``n`` requests; the backend is closed after, whatever happens."""
    try:
        return backend.run(requests(n))
    finally:
        backend.close()


def free_port() -> int:
    with FakeServer() as s:
        return s.port


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def stop_after(server: FakeServer, n: int) -> threading.Thread:
    """Stop ``server`` (its connections dropped, requests in flight lost) once it has taken ``n`` requests."""
    def watch() -> None:
        deadline = time.monotonic() + 60
        while len(server.log) < n and time.monotonic() < deadline:
            time.sleep(0.002)
        server.stop()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


# -- the router alone, on a fake clock --------------------------------------------------------------

def test_router_least_busy_then_in_turn():
    eps = [Endpoint(i, f"http://h{i}/v1") for i in range(3)]
    router = Router(eps, clock=lambda: 0.0)
    picked = [router.pick() for _ in range(6)]
    assert sorted(e.index for e in picked) == [0, 0, 1, 1, 2, 2]  # ties in turn
    router.begin(eps[0])
    router.begin(eps[1])
    assert router.pick() is eps[2]  # the least busy
    router.begin(eps[2])
    router.begin(eps[2])
    assert router.pick() in (eps[0], eps[1])
    assert Router([eps[0]]).pick() is eps[0]


def test_router_backoff_doubles_and_a_restarted_endpoint_comes_back():
    now = [100.0]
    a, b = Endpoint(0, "http://a/v1"), Endpoint(1, "http://b/v1")
    router = Router([a, b], backoff=2.0, backoff_max=5.0, clock=lambda: now[0])
    router.begin(a)
    router.end(a)
    router.failed(a)
    assert not router.all_out() and router.other_available(a)
    router.begin(b)  # b is busier from here on: a is taken whenever it is in the rotation
    assert all(router.pick() is b for _ in range(5))  # a is out for 2 s
    now[0] += 2.0
    assert router.pick() is a  # back-off over: one probe
    router.begin(a)
    assert all(router.pick() is b for _ in range(5))  # while the probe is out, nothing else goes there
    router.end(a)
    router.failed(a)  # still down: 4 s now
    now[0] += 3.9
    assert router.pick() is b
    now[0] += 0.1
    assert router.pick() is a
    router.failed(a)
    router.failed(a)  # 8 s capped at 5
    assert a.until == pytest.approx(now[0] + 5.0)
    now[0] += 5.0
    router.begin(a)
    router.end(a)
    router.succeeded(a)  # it answered: fully back, any number in flight
    router.begin(a)
    router.begin(b)
    assert router.pick() is a and a.failures == 0
    assert router.counts()[0] == {"url": "http://a/v1", "requests": 4, "failures": 4}


def test_router_every_endpoint_out():
    now = [0.0]
    a, b = Endpoint(0, "http://a/v1"), Endpoint(1, "http://b/v1")
    router = Router([a, b], backoff=2.0, clock=lambda: now[0])
    router.failed(a)
    router.failed(b)
    router.failed(b)
    assert router.all_out() and not router.other_available(a)
    assert router.pick() is a  # the one back soonest still answers: the retries and breaker decide
    one = Router([a])
    assert one.all_out() and not one.other_available(a)


def test_split_urls():
    assert split_urls("http://a/v1|http://b/v1") == ["http://a/v1", "http://b/v1"]
    assert split_urls(["http://a/v1", " http://b/v1 "]) == ["http://a/v1", "http://b/v1"]
    assert split_urls("http://a/v1") == ["http://a/v1"]
    with pytest.raises(GageError, match="empty entry"):
        split_urls("http://a/v1|")


# -- the backend against two servers ----------------------------------------------------------------

def test_requests_spread_over_both_and_results_equal_one_endpoint():
    with FakeServer(latency=0.02) as a, FakeServer(latency=0.02) as b:
        reqs = requests(40)
        one = openai_backend(base_url=a.url, **FAST_ARGS)
        two = openai_backend(base_url=f"{a.url}|{b.url}", **FAST_ARGS, concurrency=8)
        try:
            single = one.run(reqs)
            sent_before = len(a.log)
            double = two.run(reqs)
        finally:
            one.close()
            two.close()
        assert [o.text for o in double] == [o.text for o in single] == [f"answer{i}" for i in range(40)]
        on_a, on_b = len(a.log) - sent_before, len(b.log)
        assert on_a + on_b == 40 and on_a >= 10 and on_b >= 10, (on_a, on_b)
        assert b.max_inflight <= 8
        counts = two.endpoint_counts()
        assert [c["requests"] for c in counts] == [on_a, on_b] and all(c["failures"] == 0 for c in counts)
        s = two.settings()
        assert s["base_url"] == [a.url, b.url] and s["endpoint_backoff_s"] == 0.2
        assert two.model_id == "fake-model"
        assert "endpoint_backoff_s" not in one.settings() and one.settings()["base_url"] == a.url


def test_model_found_on_the_first_endpoint_that_answers():
    port = free_port()
    with FakeServer(model="served") as b:
        backend = openai_backend(base_url=f"http://127.0.0.1:{port}/v1|{b.url}", connect_timeout=0.5)
        try:
            backend.open()
            assert backend.model_id == "served"
        finally:
            backend.close()
    backend = openai_backend(base_url=f"http://127.0.0.1:{port}/v1|http://127.0.0.1:{port}/v2",
                             connect_timeout=0.5)
    with pytest.raises(GageError, match="no endpoint answers GET /models"):
        backend.open()


def test_dead_endpoint_costs_no_row_even_without_retries():
    port = free_port()  # nothing listens there
    with FakeServer() as b:
        backend = openai_backend(base_url=f"http://127.0.0.1:{port}/v1|{b.url}",
                                 **{**FAST_ARGS, "max_retries": 0, "max_consecutive_failures": 1})
        out = run_closed(backend, 30)
    assert [o.error for o in out] == [None] * 30 and [o.text for o in out] == [f"answer{i}" for i in range(30)]
    dead, alive = backend.endpoint_counts()
    assert dead["failures"] >= 1 and alive["requests"] == 30


@pytest.mark.parametrize("fault", ["hang", "500", "reset", "badjson"])
def test_broken_endpoint_neither_fails_rows_nor_trips_the_breaker(fault):
    """Hung attempts (0.5 s of silence, past breaker_seconds=0.3) and 5xx answers on one endpoint:
    with the other healthy, every row is answered there."""
    with FakeServer(fault=fault, stall_s=5) as a, FakeServer() as b:
        backend = openai_backend(base_url=f"{a.url}|{b.url}", **{**FAST_ARGS, "read_timeout": 0.5, "max_retries": 0},
                                 concurrency=16)  # 8 attempts at once on the broken one: a streak of 8
        out = run_closed(backend, 30)
    assert [o.error for o in out] == [None] * 30 and [o.text for o in out] == [f"answer{i}" for i in range(30)]
    broken, healthy = backend.endpoint_counts()
    assert broken["failures"] >= 1 and healthy["requests"] >= 30


def test_stopped_endpoint_leaves_and_comes_back_after_its_backoff():
    with FakeServer(latency=0.01) as a, FakeServer(latency=0.01) as b:
        backend = openai_backend(base_url=f"{a.url}|{b.url}", **{**FAST_ARGS, "max_retries": 0}, concurrency=4)
        try:
            port = a.port
            watcher = stop_after(a, 5)
            out = backend.run(requests(40))
            watcher.join(10)
            assert [o.text for o in out] == [f"answer{i}" for i in range(40)]
            assert backend.endpoint_counts()[0]["failures"] >= 1
            with FakeServer(latency=0.01, port=port) as again:  # restarted on its port
                time.sleep(0.5)  # past its back-off (0.2 s, doubled at most a few times)
                out = backend.run(requests(40, "second "))
                assert [o.text for o in out] == [f"answer{i}" for i in range(40)]
                assert len(again.log) >= 5, len(again.log)  # back in the rotation
        finally:
            backend.close()


def test_every_endpoint_dead_trips_the_breaker():
    ports = [free_port(), free_port()]
    backend = openai_backend(base_url="|".join(f"http://127.0.0.1:{p}/v1" for p in ports),
                             **{**FAST_ARGS, "max_retries": 50})
    t0 = time.monotonic()
    with pytest.raises(FatalBackendError, match="failed attempts in a row.*127.0.0.1.*is the server up"):
        run_closed(backend, 5)
    assert time.monotonic() - t0 < 5


@pytest.mark.parametrize("fault, words", [("401", "401 Unauthorized"), ("404model", "404 model not found")])
def test_fatal_answer_from_one_endpoint_stops_at_once_naming_it(fault, words):
    with FakeServer() as a, FakeServer(fault=fault) as b:
        backend = openai_backend(base_url=f"{a.url}|{b.url}", **FAST_ARGS, concurrency=4)
        with pytest.raises(FatalBackendError) as info:
            run_closed(backend, 40)
        assert words in str(info.value) and f"{b.url}/completions" in str(info.value)
        assert len(b.log) <= 4


def test_bad_url_in_the_list_is_named():
    with pytest.raises(GageError, match="base_url must start with http:// or https://, not 'ftp://x'"):
        openai_backend(base_url="http://127.0.0.1:9/v1|ftp://x", model="m")
    with pytest.raises(GageError, match="twice"):
        openai_backend(base_url="http://127.0.0.1:9/v1|http://127.0.0.1:9", model="m")


def test_each_endpoint_gets_its_own_credentials_only(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    import base64
    token = "Basic " + base64.b64encode(b"user:s3cret-pw-2").decode()
    with FakeServer() as a, FakeServer(require_headers={"authorization": token}) as b:
        backend = openai_backend(base_url=f"{a.url}|http://user:s3cret-pw-2@127.0.0.1:{b.port}/v1",
                                 **FAST_ARGS, concurrency=4)
        out = run_closed(backend, 20)
        assert [o.error for o in out] == [None] * 20
        assert b.rejected == 0 and len(b.log) > 0
        assert all("authorization" not in e["headers"] for e in a.log)  # b's password never goes to a
        shown = json.dumps([backend.settings(), backend.model_id, backend.base_url])
        assert "s3cret-pw-2" not in shown and "s3cret-pw-2" in backend.secrets


# -- through the command line -------------------------------------------------------------------------

def run_task(run_cli, out: Path, tasks: str, model_args: str, *extra: str):
    result = run_cli("--tasks", tasks, "--include-path", TASKS, "--include-path", CHOICE, "--model", "openai",
                     "--model-args", model_args, "-o", out, "--run-id", "run", "-q", *extra)
    return result, out / "run"


def outcome(run: Path, task: str) -> dict:
    """Each row's outputs and metrics, timings left out."""
    rows = {}
    for r in lines(run / "samples" / f"{task}.jsonl"):
        preds = [{k: v for k, v in p.items() if k not in ("latency_ms", "raw", "time_to_first_token_ms")}
                 for p in r["predict_result"]]
        rows[r["id"]] = (preds, r["eval_result"].get("metrics"), r["eval_result"].get("error"))
    return rows


def test_cli_two_endpoints_equal_one(run_cli, tmp_path):
    with FakeServer(latency=0.01) as a, FakeServer(latency=0.01) as b:
        one, run1 = run_task(run_cli, tmp_path / "one", "http_rows,http_choice", f"base_url={a.url},{FAST}")
        before = len(a.log)
        two, run2 = run_task(run_cli, tmp_path / "two", "http_rows,http_choice",
                             f"base_url={a.url}|{b.url},{FAST},concurrency=4")
        assert one.exit_code == 0 and two.exit_code == 0, one.output + two.output
        assert len(a.log) > before and len(b.log) > 0  # both served
    for task in ("http_rows", "http_choice"):
        assert outcome(run2, task) == outcome(run1, task)
    s1, s2 = (json.loads((r / "summary.json").read_text()) for r in (run1, run2))
    assert s1["tasks"]["http_rows"]["metrics"] == s2["tasks"]["http_rows"]["metrics"]
    assert s2["run"]["model"]["settings"]["base_url"] == [a.url, b.url]
    assert "requests" in two.output  # the endpoints' counts at the end


def test_cli_yaml_list_of_urls(run_cli, tmp_path):
    with FakeServer() as a, FakeServer() as b:
        config = tmp_path / "run.yaml"
        config.write_text(json.dumps({"models": {"dut": {"backend": "openai", "args": {
            "base_url": [a.url, b.url], "model": "fake-model", "concurrency": 4}}}}))
        result = run_cli("--config", config, "--tasks", "http_rows", "--include-path", TASKS, "-o", tmp_path,
                         "--run-id", "run", "-q")
        assert result.exit_code == 0, result.output
        assert len(a.log) > 0 and len(b.log) > 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["run"]["model"]["settings"]["base_url"] == [a.url, b.url]


def test_cli_server_stopped_mid_run_loses_nothing(run_cli, tmp_path):
    with FakeServer(latency=0.02) as a, FakeServer(latency=0.02) as b:
        watcher = stop_after(a, 4)
        result, run = run_task(run_cli, tmp_path, "http_rows", f"base_url={a.url}|{b.url},{FAST},concurrency=4")
        watcher.join(10)
    assert result.exit_code == 0, result.output
    rows = lines(run / "samples" / "http_rows.jsonl")
    assert len(rows) == 20 and len({r["id"] for r in rows}) == 20
    assert all(not r["eval_result"].get("error") for r in rows)
    assert all(r["eval_result"]["metrics"]["exact_match"]["value"] == 1.0 for r in rows)
    counts = json.loads((run / "summary.json").read_text())["tasks"]["http_rows"]["counts"]
    assert counts["total"] == 20 and counts["errored"] == 0
    assert 4 <= len(a.log) < 20 and len(b.log) >= 16  # a stopped mid-run, b took the rest
    # summary.json keeps what each endpoint took and how often it failed (Backend.stats)
    stats = json.loads((run / "summary.json").read_text())["run"]["model"]["stats"]["endpoints"]
    assert [s["url"] for s in stats] == [a.url, b.url]
    assert stats[0]["failures"] >= 1 and stats[1]["failures"] == 0
    assert stats[1]["requests"] >= 16 and sum(s["requests"] for s in stats) >= 20


def test_cli_every_endpoint_dead_stops_and_resume_finishes(run_cli, tmp_path):
    ports = [free_port(), free_port()]
    urls = "|".join(f"http://127.0.0.1:{p}/v1" for p in ports)
    retrying = FAST.replace("max_retries=2", "max_retries=50")  # (retries enough to outlast breaker_seconds)
    result, run = run_task(run_cli, tmp_path, "http_rows", f"base_url={urls},{retrying}")
    assert result.exit_code == 3, result.output
    assert "failed attempts in a row" in result.output and "Traceback" not in result.output
    rows = lines(run / "samples" / "http_rows.jsonl")
    assert len(rows) == 20 and all("failed attempts in a row" in r["eval_result"]["error"]["message"] for r in rows)
    with FakeServer(port=ports[0]), FakeServer(port=ports[1]):
        again = run_cli("--resume", run, "-q")
    assert again.exit_code == 0, again.output
    rows = lines(run / "samples" / "http_rows.jsonl")
    latest = {r["id"]: r for r in rows}  # a resumed row's record is written again after the failed one
    assert len(latest) == 20 and all(not r["eval_result"].get("error") for r in latest.values())


def test_cli_bad_url_exit_2_and_no_secret_in_any_file(run_cli, tmp_path, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    bad, _ = run_task(run_cli, tmp_path / "bad", "http_rows", "base_url=http://127.0.0.1:9/v1|127.0.0.1:9,model=m")
    assert bad.exit_code == 2 and "'127.0.0.1:9'" in bad.output, bad.output
    import base64
    token = "Basic " + base64.b64encode(b"user:s3cret-pw-2").decode()
    with FakeServer() as a, FakeServer(require_headers={"authorization": token}) as b:
        result, run = run_task(run_cli, tmp_path / "ok", "http_rows",
                               f"base_url={a.url}|http://user:s3cret-pw-2@127.0.0.1:{b.port}/v1,{FAST}")
        assert result.exit_code == 0, result.output
        assert len(b.log) > 0 and b.rejected == 0
    assert "s3cret-pw-2" not in result.output
    for path in (tmp_path / "ok").rglob("*"):
        if path.is_file():
            assert b"s3cret-pw-2" not in path.read_bytes(), path
