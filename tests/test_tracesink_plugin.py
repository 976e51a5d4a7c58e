"""The trace-sink example plugin (examples/gage-eval-plugin-tracesink) against a local HTTP server.

Two layers: the sink itself, imported from the source folder (fast: batching, retries, the
give-up share, a full queue, the drain at run end); and the plugin installed for real into a
fresh venv and driven through ``gage-eval --tasks piqa --model dummy`` (every event reaches
the server; with the server down every event is in the fallback file; with the server failing
half the time every event is in exactly one of the two places; a run stopped by SIGTERM
delivers every event; the token is nowhere).

The fresh venv sees gage-eval and its dependencies from this checkout's environment through a
``.pth`` file (no network, a few seconds); the plugin is installed into it, non-editable, from
a copy of its folder (so no build output lands in the checkout) with ``--no-build-isolation``
(its build backend is setuptools).
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = ROOT / "examples" / "gage-eval-plugin-tracesink"
TOKEN = "tok-Zq81xPLw3vKd92"  # an unusual string: found anywhere, it leaked


# -- a local endpoint ---------------------------------------------------------------


class Endpoint:
    """Records each batch it accepts. ``fail_every=2``: requests 2, 4, 6... get a 500 (and
    are not recorded); ``hold``: an Event each request waits on before answering."""

    def __init__(self, fail_every: int = 0, hold: threading.Event | None = None, token: str | None = None):
        self.batches: list[dict] = []
        self.requests = 0
        self.auth: set[str | None] = set()
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if hold is not None:
                    hold.wait(30)
                with outer.lock:
                    outer.requests += 1
                    n = outer.requests
                    outer.auth.add(self.headers.get("Authorization"))
                    ok = not (fail_every and n % fail_every == 0)
                    if ok:
                        outer.batches.append(json.loads(body))
                self.send_response(200 if ok else 500)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/ingest"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    @property
    def events(self) -> list[dict]:
        with self.lock:
            return [e for b in self.batches for e in b["events"]]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def endpoint():
    servers = []

    def make(**kwargs) -> Endpoint:
        servers.append(Endpoint(**kwargs))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def closed_port_url() -> str:
    with socket.socket() as s:  # a port nobody listens on once this closes
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/ingest"


def fallback_events(run_dir: Path) -> list[dict]:
    path = run_dir / "trace_fallback.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def assert_exactly_once(received: list[dict], local: list[dict], n: int) -> None:
    seqs = sorted(e["seq"] for e in received + local)
    assert seqs == list(range(n)), "every event exactly once, received or local"


# -- the sink, from the source folder (fast) ------------------------------------------


@pytest.fixture
def ts(monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGIN))
    for name in list(sys.modules):
        if name.startswith("gage_eval_plugin_tracesink"):
            monkeypatch.delitem(sys.modules, name)
    import gage_eval_plugin_tracesink.config as config
    import gage_eval_plugin_tracesink.sink as sink

    return config, sink


def make_sink(ts, tmp_path, url, stderr=None, **settings):
    config, sink = ts
    env = {"GAGE_TRACESINK_URL": url, "GAGE_TRACESINK_BACKOFF_S": "0", "GAGE_TRACESINK_TIMEOUT_S": "5"}
    env.update({f"GAGE_TRACESINK_{k.upper()}": str(v) for k, v in settings.items()})
    return sink.TraceSink(config.from_env(env), tmp_path, "r1", stderr=stderr)


def test_config_from_env(ts):
    config, _ = ts
    assert config.from_env({}) is None
    c = config.from_env({"GAGE_TRACESINK_URL": "https://u:pw@h.example:8443/v1/t?key=s3cret",
                         "GAGE_TRACESINK_TOKEN_ENV": "MY_TOKEN", "MY_TOKEN": TOKEN, "GAGE_TRACESINK_BATCH": "7"})
    assert c.batch_size == 7 and c.headers()["Authorization"] == f"Bearer {TOKEN}"
    assert c.endpoint == "https://h.example:8443/v1/t"  # no user-info, no query
    assert TOKEN not in repr(c)
    c = config.from_env({"GAGE_TRACESINK_URL": "http://h/", "GAGE_TRACESINK_TOKEN_ENV": "T", "T": "x",
                         "GAGE_TRACESINK_HEADER": "X-Api-Key"})
    assert c.headers()["X-Api-Key"] == "x" and "Authorization" not in c.headers()
    # spec 004's variable names; the percentage becomes a share; ours win
    c = config.from_env({"GAGE_EVAL_REPORT_HTTP_URL": "http://h/", "GAGE_EVAL_REPORT_HTTP_FAIL_PCT": "5",
                         "GAGE_EVAL_REPORT_HTTP_BATCH": "9", "GAGE_TRACESINK_BATCH": "3"})
    assert c.max_fail_share == pytest.approx(0.05) and c.batch_size == 3
    from gage_eval.api import GageError

    for env, message in (({"GAGE_TRACESINK_URL": "ftp://h/x"}, "GAGE_TRACESINK_URL: ftp://h...: not an http(s) URL"),
                         ({"GAGE_TRACESINK_URL": "http://h/", "GAGE_TRACESINK_BATCH": "many"},
                          "GAGE_TRACESINK_BATCH='many': not an integer"),
                         ({"GAGE_TRACESINK_URL": "http://h/", "GAGE_TRACESINK_MAX_FAIL_SHARE": "2"},
                          "GAGE_TRACESINK_MAX_FAIL_SHARE='2': must be between 0 and 1"),
                         ({"GAGE_TRACESINK_URL": "http://h/", "GAGE_TRACESINK_TOKEN_ENV": "NOPE"},
                          "GAGE_TRACESINK_TOKEN_ENV names NOPE, which is not set")):
        with pytest.raises(GageError) as err:
            config.from_env(env)
        assert str(err.value) == message


def test_batches_by_size_and_by_interval(ts, tmp_path, endpoint):
    ep = endpoint()
    s = make_sink(ts, tmp_path, ep.url, batch=4, flush_s=0.05)
    for i in range(10):
        s.emit("sample_done", {"sample_id": f"s{i}", "metrics": {"acc": float("nan"), "t": (1, 2)}})
    deadline = time.monotonic() + 20
    while len(ep.events) < 10 and time.monotonic() < deadline:  # the last 2 go by the interval
        time.sleep(0.02)
    assert [len(b["events"]) for b in ep.batches] == [4, 4, 2]
    assert [b["batch"] for b in ep.batches] == [0, 1, 2]
    stats = s.close()
    assert stats["sent"] == 10 and stats["local"] == 0
    events = ep.events
    assert [e["seq"] for e in events] == list(range(10))
    assert events[0]["metrics"] == {"acc": None, "t": [1, 2]} and events[0]["run_id"] == "r1"
    assert not (tmp_path / "trace_fallback.jsonl").exists()


def test_server_down_keeps_everything_locally(ts, tmp_path, capsys):
    s = make_sink(ts, tmp_path, closed_port_url(), batch=3, retries=1, min_tries=2)
    for i in range(20):
        s.emit("sample_done", {"sample_id": f"s{i}"})
    stats = s.close()
    assert stats["sent"] == 0 and stats["local"] == 20
    assert [e["seq"] for e in fallback_events(tmp_path)] == list(range(20))
    err = capsys.readouterr().err
    assert err.count("failed 2 of 2 batches") == 1  # the give-up, said once
    assert "0 of 20 events reached http://127.0.0.1:" in err and "20 are in " in err


def test_half_failing_server_gives_up_and_loses_nothing(ts, tmp_path, endpoint, capsys):
    ep = endpoint(fail_every=2)
    s = make_sink(ts, tmp_path, ep.url, batch=5, retries=0, max_fail_share=0.3, min_tries=4)
    for i in range(100):
        s.emit("sample_done", {"sample_id": f"s{i}"})
    stats = s.close()
    received, local = ep.events, fallback_events(tmp_path)
    assert_exactly_once(received, local, 100)
    assert ep.requests == 4 and len(received) == 10  # 2 of 4 failed (50% > 30%): no request after that
    assert stats["batches_tried"] == 4 and stats["batches_failed"] == 2
    err = capsys.readouterr().err
    assert err.count("failed 2 of 4 batches (more than 30%; last: HTTP 500)") == 1


def test_retries_recover_a_half_failing_server(ts, tmp_path, endpoint):
    ep = endpoint(fail_every=2)
    s = make_sink(ts, tmp_path, ep.url, batch=5, retries=1)
    for i in range(30):
        s.emit("sample_done", {"sample_id": f"s{i}"})
    stats = s.close()
    assert stats["sent"] == 30 and ep.requests == 11  # every failed request retried once, and taken
    assert_exactly_once(ep.events, [], 30)


def test_a_full_queue_spills_to_the_file_and_never_blocks(ts, tmp_path, endpoint, capsys):
    hold = threading.Event()
    ep = endpoint(hold=hold)
    s = make_sink(ts, tmp_path, ep.url, batch=2, queue=2, drain_s=10)
    for i in range(40):  # the sender is stuck on batch 0: 2 wait in the queue, the rest spill
        s.emit("sample_done", {"sample_id": f"s{i}"})
    assert s.stats["spilled"] >= 30
    hold.set()
    stats = s.close()
    assert_exactly_once(ep.events, fallback_events(tmp_path), 40)
    assert stats["sent"] + stats["local"] == 40 and stats["sent"] >= 2
    assert capsys.readouterr().err.count("the sender is behind") == 1


def test_drain_is_bounded_and_keeps_the_rest(ts, tmp_path, endpoint):
    hold = threading.Event()
    ep = endpoint(hold=hold)
    s = make_sink(ts, tmp_path, ep.url, batch=1, drain_s=0, timeout_s=0.5, retries=0, min_tries=1000)
    for i in range(6):
        s.emit("sample_done", {"sample_id": f"s{i}"})
    stats = s.close()  # the first request times out, the rest are past the drain deadline
    hold.set()
    assert stats["sent"] == 0 and [e["seq"] for e in fallback_events(tmp_path)] == list(range(6))


def test_a_bad_setting_writes_everything_locally(ts, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GAGE_TRACESINK_URL", "http://127.0.0.1:9/x")
    monkeypatch.setenv("GAGE_TRACESINK_BATCH", "0")
    import gage_eval_plugin_tracesink as plugin
    from gage_eval.api.events import RunEnd, RunStart, SampleDone, TaskDone

    plugin.gage_run_start(RunStart("r1", tmp_path, ("t",), "dummy"))
    plugin.gage_sample_done(SampleDone("r1", "t", "a", None, {"acc": 1.0}))
    plugin.gage_task_done(TaskDone("r1", "t", {"total": 1}, {}))
    plugin.gage_run_end(RunEnd("r1", tmp_path, {"run": {"exit_status": 0}, "tasks": {}}))
    assert [e["type"] for e in fallback_events(tmp_path)] == ["run_start", "sample_done", "task_done", "run_end"]
    err = capsys.readouterr().err
    assert "GAGE_TRACESINK_BATCH='0': must be between 1 and 100000; this run's events go to" in err


# -- the plugin installed into a fresh venv, driven by a real run (slower) ------------------


class Venv:
    def __init__(self, path: Path):
        self.path = path
        self.python = path / ("Scripts/python.exe" if os.name == "nt" else "bin/python")

    def env(self, **extra: str) -> dict:
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "GAGE_EVAL_DISABLE_PLUGINS", "VIRTUAL_ENV")
               and not k.startswith(("GAGE_TRACESINK_", "GAGE_EVAL_REPORT_HTTP_"))
               and k.lower() not in ("http_proxy", "https_proxy", "all_proxy")}
        env.update(HF_HUB_OFFLINE="1", PIP_DISABLE_PIP_VERSION_CHECK="1", **extra)
        return env

    def gage(self, *args, cwd: Path, env: dict, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run([str(self.python), "-c", "import sys; from gage_eval.cli import main; sys.exit(main())",
                               *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
        if check and proc.returncode != 0:
            pytest.fail(f"gage-eval {' '.join(map(str, args))} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
        return proc


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Venv:
    base = tmp_path_factory.mktemp("tracesink-venv")
    path = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, capture_output=True,
                   timeout=120)
    v = Venv(path)
    site = subprocess.run([str(v.python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    # gage-eval, its dependencies, pip and setuptools: this checkout's environment, read-only
    Path(site, "_checkout_env.pth").write_text(
        f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    src = shutil.copytree(PLUGIN, base / "src", ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    proc = subprocess.run([str(v.python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                           "--no-index", str(src)], cwd=base, env=v.env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return v


def run_piqa(venv: Venv, work: Path, run_id: str, limit: int = 30, **env: str):
    run_env = venv.env(GAGE_TRACESINK_TIMEOUT_S="5", GAGE_TRACESINK_BACKOFF_S="0", **env)
    proc = venv.gage("--tasks", "piqa", "--model", "dummy", "--limit", limit, "-q", "-o", work, "--run-id", run_id,
                     cwd=work, env=run_env)
    run = work / run_id
    rows = len((run / "samples" / "piqa.jsonl").read_text().splitlines())
    assert rows > 0
    return proc, run, rows + 3  # run_start, a sample_done per row, task_done, run_end


@pytest.mark.slow
def test_installed_into_the_fresh_venv_not_the_checkout(venv, tmp_path):
    out = subprocess.run([str(venv.python), "-c", "import gage_eval_plugin_tracesink as t; print(t.__file__)"],
                         capture_output=True, text=True, env=venv.env(), cwd=tmp_path, check=True).stdout.strip()
    assert Path(out).resolve().is_relative_to(venv.path.resolve())
    rows = json.loads(venv.gage("plugins", "--json", cwd=tmp_path, env=venv.env()).stdout)
    assert {r["name"]: r.get("version") for r in rows}["tracesink"] == "0.1.0"
    assert not list(PLUGIN.glob("*.egg-info")) and not (PLUGIN / "build").exists()


@pytest.mark.slow
def test_a_run_delivers_every_event(venv, tmp_path, endpoint):
    ep = endpoint()
    proc, run, n = run_piqa(venv, tmp_path, "ok", GAGE_TRACESINK_URL=ep.url, GAGE_TRACESINK_BATCH="8")
    events = ep.events
    assert len(events) == n
    assert [e["seq"] for e in events] == list(range(n))  # one sender: batches arrive in order
    assert len({e["session"] for e in events}) == 1 and {e["run_id"] for e in events} == {"ok"}
    types = [e["type"] for e in events]
    assert types[0] == "run_start" and types[-2:] == ["task_done", "run_end"]
    assert types.count("sample_done") == n - 3
    samples = {json.loads(line)["id"]: json.loads(line) for line in (run / "samples" / "piqa.jsonl").open()}
    for e in events[1:-2]:
        assert e["task"] == "piqa" and e["error"] is None
        assert e["metrics"]["acc"] == samples[e["sample_id"]]["eval_result"]["metrics"]["acc"]
    summary = json.loads((run / "summary.json").read_text())
    end = events[-1]
    assert end["exit_status"] == 0 and end["tasks"]["piqa"]["counts"] == summary["tasks"]["piqa"]["counts"]
    assert end["tasks"]["piqa"]["metrics"]["acc"]["value"] == summary["tasks"]["piqa"]["metrics"]["acc"]["value"]
    assert not (run / "trace_fallback.jsonl").exists() and proc.stderr == ""
    assert summary["run"]["versions"]["plugins"].get("tracesink") == "0.1.0"


@pytest.mark.slow
def test_a_run_with_the_server_down_loses_nothing(venv, tmp_path):
    proc, run, n = run_piqa(venv, tmp_path, "down", GAGE_TRACESINK_URL=closed_port_url(), GAGE_TRACESINK_BATCH="8",
                            GAGE_TRACESINK_RETRIES="1")
    local = fallback_events(run)
    assert [e["seq"] for e in local] == list(range(n))
    assert proc.stderr.count("failed 4 of 4 batches") == 1 and f"0 of {n} events reached" in proc.stderr


@pytest.mark.slow
def test_a_run_against_a_half_failing_server(venv, tmp_path, endpoint):
    ep = endpoint(fail_every=2)
    proc, run, n = run_piqa(venv, tmp_path, "half", GAGE_TRACESINK_URL=ep.url, GAGE_TRACESINK_BATCH="4",
                            GAGE_TRACESINK_RETRIES="0", GAGE_TRACESINK_MAX_FAIL_SHARE="0.3",
                            GAGE_TRACESINK_MIN_TRIES="4")
    received, local = ep.events, fallback_events(run)
    assert_exactly_once(received, local, n)
    assert ep.requests == 4 and len(received) == 8  # given up after 2 of 4 failed
    assert proc.stderr.count("failed 2 of 4 batches (more than 30%; last: HTTP 500)") == 1


@pytest.mark.slow
def test_the_token_is_sent_and_written_nowhere(venv, tmp_path, endpoint):
    ep = endpoint(fail_every=2)
    proc, run, n = run_piqa(venv, tmp_path, "tok", GAGE_TRACESINK_URL=ep.url, GAGE_TRACESINK_BATCH="8",
                            GAGE_TRACESINK_RETRIES="0", GAGE_TRACESINK_MIN_TRIES="1000",
                            GAGE_TRACESINK_TOKEN_ENV="TRACE_TOKEN", TRACE_TOKEN=TOKEN)
    assert ep.auth == {f"Bearer {TOKEN}"}
    assert_exactly_once(ep.events, fallback_events(run), n)
    assert fallback_events(run)  # half the batches were refused: the fallback file is there, checked too
    assert TOKEN not in proc.stdout + proc.stderr
    files = [p for p in run.rglob("*") if p.is_file()]
    assert len(files) >= 5
    for p in files:
        assert TOKEN.encode() not in p.read_bytes(), p


@pytest.mark.slow
def test_an_interrupted_run_still_delivers_every_event(venv, tmp_path, endpoint, shared_data):
    import signal

    ep = endpoint()
    dev = shared_data / "piqa" / "derived" / "validation.jsonl"  # 1,838 rows at 50 a second: stopped part way
    env = venv.env(GAGE_TRACESINK_URL=ep.url, GAGE_TRACESINK_BATCH="8", GAGE_TRACESINK_FLUSH_S="0.1")
    proc = subprocess.Popen(
        [str(venv.python), "-c", "import sys; from gage_eval.cli import main; sys.exit(main())",
         "--tasks", "piqa", "--model", "dummy", "--model-args", "delay_ms=20,batch_size=1,fail_every=4",
         "--data", f"piqa={dev}", "-q", "-o", tmp_path, "--run-id", "int"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while len(ep.events) < 20 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    run = tmp_path / "int"
    rows = [json.loads(line) for line in (run / "samples" / "piqa.jsonl").read_text().splitlines()]
    assert 0 < len(rows) < 1838, err
    events, local = ep.events, fallback_events(run)
    # run_start, a sample_done per written row, run_end: a task stopped part way gets no
    # gage_task_done from the engine (the interrupt leaves _run_task before it)
    assert local == [] and [e["seq"] for e in events] == list(range(len(rows) + 2))
    assert [e["type"] for e in events if e["type"] != "sample_done"] == ["run_start", "run_end"]
    assert events[-1]["interrupted"] and events[-1]["tasks"]["piqa"]["counts"]["total"] == len(rows)
    errors = {e["sample_id"]: e["error"] for e in events if e["type"] == "sample_done"}
    assert errors == {r["id"]: (r["eval_result"].get("error") or {}).get("message") for r in rows}
    assert any(errors.values()) and not all(errors.values())
