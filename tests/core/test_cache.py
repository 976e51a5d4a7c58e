"""The response cache (--cache DIR, gage_plugins_builtin.cache): a rerun asks the backend nothing it already
answered, writes the same records, counts hits and misses, never keeps errors or secrets, and
two runs may share one cache at once."""
from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gage_eval.api import hookimpl
from gage_eval.api.backend import ModelOutput, Request
from gage_plugins_builtin.cache import FILE_NAME, ResponseCache
from gage_eval.api.errors import GageError
from gage_eval.api.schemas import validation_errors
from gage_eval.engine.replies import reusable
from gage_plugins_builtin.backends.dummy import DummyBackend

ROOT = Path(__file__).resolve().parents[2]


class CountingBackend(DummyBackend):
    """The dummy, counting the requests it is sent; rows named in ``fail_ids`` error."""

    name = "counting"
    calls: list[str] = []
    fail_ids: set[str] = set()

    def stream(self, requests):
        for i, req in enumerate(requests):
            CountingBackend.calls.append(req.sample_id)
            if req.sample_id in CountingBackend.fail_ids:
                yield i, ModelOutput(error="counting backend: injected failure")
            else:
                yield i, self._one(req)


class CountingPlugin:
    @hookimpl
    def gage_register_backends(self, register):
        register("counting", CountingBackend)


@pytest.fixture
def counting(fresh_plugins):
    fresh_plugins.register_plugin(CountingPlugin(), "counting")
    CountingBackend.calls = []
    CountingBackend.fail_ids = set()
    return CountingBackend


def run(run_cli, tmp_path, run_id, *args, model="counting", cache="cache", tasks="piqa", code=0):
    CountingBackend.calls = []
    result = run_cli("--tasks", tasks, "--model", model, "-o", tmp_path / "runs", "--run-id", run_id, "-q",
                     "--cache", tmp_path / cache, *args)
    assert result.exit_code == code, result.output
    summary = json.loads((tmp_path / "runs" / run_id / "summary.json").read_text())
    assert validation_errors(summary, "summary") == []
    return summary


def samples(tmp_path, run_id, task="piqa") -> str:
    return (tmp_path / "runs" / run_id / "samples" / f"{task}.jsonl").read_text()


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def untimed(value):
    """``value`` without its latency fields."""
    if isinstance(value, dict):
        return {k: untimed(v) for k, v in value.items() if "latency" not in k and not k.endswith("_ms")}
    if isinstance(value, list):
        return [untimed(v) for v in value]
    return value


def test_second_run_asks_the_backend_nothing_and_writes_the_same_records(counting, run_cli, tmp_path):
    first = run(run_cli, tmp_path, "a", "--limit", "20")
    assert len(counting.calls) == 20
    assert first["run"]["cache"] == {"path": str(tmp_path / "cache" / FILE_NAME), "hits": 0, "misses": 20}
    assert first["tasks"]["piqa"]["cache"] == {"hits": 0, "misses": 20}
    second = run(run_cli, tmp_path, "b", "--limit", "20")
    assert counting.calls == []
    assert second["run"]["cache"]["hits"] == 20 and second["run"]["cache"]["misses"] == 0
    assert second["tasks"]["piqa"]["cache"] == {"hits": 20, "misses": 0}
    # the records are the stored outputs, latency included: byte for byte the same
    assert samples(tmp_path, "a") == samples(tmp_path, "b")
    assert first["tasks"]["piqa"]["metrics"] == second["tasks"]["piqa"]["metrics"]


def test_a_larger_limit_reuses_the_first_rows(counting, run_cli, tmp_path):
    run(run_cli, tmp_path, "a", "--limit", "10")
    summary = run(run_cli, tmp_path, "b", "--limit", "20")
    assert summary["tasks"]["piqa"]["cache"] == {"hits": 10, "misses": 10}
    assert len(counting.calls) == 10
    assert samples(tmp_path, "b").splitlines()[:10] == samples(tmp_path, "a").splitlines()


def test_another_task_with_the_same_prompts_and_other_metrics_reuses_them(counting, run_cli, tmp_path):
    folder = tmp_path / "tasks" / "piqa_acc"
    shutil.copytree(ROOT / "tasks" / "piqa", folder)
    text = (folder / "task.yaml").read_text().replace("name: piqa", "name: piqa_acc")
    (folder / "task.yaml").write_text(text.replace("  - acc\n  - acc_norm\n", "  - acc\n"))
    run(run_cli, tmp_path, "a", "--limit", "15")
    summary = run(run_cli, tmp_path, "b", "--limit", "15", "--include-path", tmp_path / "tasks", tasks="piqa_acc")
    assert counting.calls == [] and summary["tasks"]["piqa_acc"]["cache"] == {"hits": 15, "misses": 0}
    assert list(summary["tasks"]["piqa_acc"]["metrics"]) == ["acc"]


def test_errored_outputs_are_not_kept(counting, run_cli, tmp_path):
    counting.fail_ids = {"piqa-3", "piqa-7"}
    first = run(run_cli, tmp_path, "a", "--limit", "10", code=1)
    assert first["tasks"]["piqa"]["counts"]["errored"] == 2
    failed = {json.loads(l)["id"] for l in samples(tmp_path, "a").splitlines()
              if json.loads(l)["eval_result"].get("error")}
    assert len(failed) == 2
    counting.fail_ids = set()
    second = run(run_cli, tmp_path, "b", "--limit", "10")
    assert sorted(counting.calls) == sorted(failed)  # only the errored rows are asked again
    assert second["tasks"]["piqa"]["cache"] == {"hits": 8, "misses": 2}
    assert second["tasks"]["piqa"]["counts"]["errored"] == 0
    with sqlite3.connect(tmp_path / "cache" / FILE_NAME) as db:
        stored = [json.loads(t) for (t,) in db.execute("SELECT output FROM responses")]
    assert len(stored) == 10 and not any("error" in s for s in stored)


def test_another_seed_or_model_setting_misses(counting, run_cli, tmp_path):
    run(run_cli, tmp_path, "a", "--limit", "5")
    assert run(run_cli, tmp_path, "b", "--limit", "5", "--seed", "7")["tasks"]["piqa"]["cache"]["hits"] == 0
    other = run(run_cli, tmp_path, "c", "--limit", "5", "--model-args", "response=echo")
    assert other["tasks"]["piqa"]["cache"] == {"hits": 0, "misses": 5}
    # a setting that only changes how requests are sent is not part of the model's identity
    same = run(run_cli, tmp_path, "d", "--limit", "5", "--batch-size", "2")
    assert same["tasks"]["piqa"]["cache"] == {"hits": 5, "misses": 0} and counting.calls == []


def generate_task(tmp_path: Path) -> Path:
    folder = tmp_path / "tasks" / "gen"
    folder.mkdir(parents=True)
    (folder / "task.yaml").write_text(textwrap.dedent("""\
        name: gen
        dataset: {loader: jsonl, args: {path: rows.jsonl}}
        preprocessor: {name: identity}
        request: {kind: generate, chat: true, generation: {max_new_tokens: 8}}
        metrics: [exact_match]
        """))
    with (folder / "rows.jsonl").open("w") as fh:
        for i in range(6):
            fh.write(json.dumps({"schema_version": "v1", "id": f"g{i}", "references": ["A"],
                                 "messages": [{"role": "user", "content": f"Question {i}?"}]}) + "\n")
    return tmp_path / "tasks"


def test_another_generation_setting_misses(counting, run_cli, tmp_path):
    tasks = generate_task(tmp_path)
    run(run_cli, tmp_path, "a", "--include-path", tasks, tasks="gen")
    again = run(run_cli, tmp_path, "b", "--include-path", tasks, tasks="gen")
    assert again["tasks"]["gen"]["cache"] == {"hits": 6, "misses": 0}
    hotter = run(run_cli, tmp_path, "c", "--include-path", tasks, "--gen-kwargs", "temperature=0.7", tasks="gen")
    assert hotter["tasks"]["gen"]["cache"] == {"hits": 0, "misses": 6} and len(counting.calls) == 6


def test_request_keys():
    from gage_plugins_builtin.cache import ModelCache

    view = ModelCache.__new__(ModelCache)
    view.identity, view._media = "model", {}
    base = Request(kind="generate", sample_id="s1", messages=({"role": "user", "content": "hi"},), chat=True,
                   gen={"max_new_tokens": 8})
    from dataclasses import replace

    assert view.key(base) == view.key(replace(base, sample_id="other"))  # the id is no part of the question
    for changed in (replace(base, gen={"max_new_tokens": 9}), replace(base, gen={"max_new_tokens": 8, "seed": 1}),
                    replace(base, chat=False), replace(base, messages=({"role": "user", "content": "hi!"},))):
        assert view.key(changed) != view.key(base)
    other = ModelCache.__new__(ModelCache)
    other.identity, other._media = "another model", {}
    assert other.key(base) != view.key(base)


def test_a_local_image_is_keyed_by_its_content(tmp_path):
    from gage_plugins_builtin.cache import ModelCache

    view = ModelCache.__new__(ModelCache)
    view.identity, view._media = "model", {}
    image = tmp_path / "a.png"
    image.write_bytes(b"first")
    req = Request(kind="generate", sample_id="s", chat=True, modalities=frozenset({"text", "image"}),
                  messages=({"role": "user", "content": [{"type": "image", "image": {"url": str(image)}}]},))
    before = view.key(req)
    image.write_bytes(b"second!")
    assert view.key(req) != before


def test_a_corrupt_cache_file_is_a_usage_error_naming_it(counting, run_cli, tmp_path):
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / FILE_NAME).write_bytes(b"this is not a database" * 100)
    result = run_cli("--tasks", "piqa", "--model", "counting", "--limit", "3", "-o", tmp_path / "runs", "-q",
                     "--cache", tmp_path / "cache")
    assert result.exit_code == 2
    lines = [l for l in result.output.splitlines() if l.strip()]
    assert len(lines) == 1 and str(tmp_path / "cache" / FILE_NAME) in lines[0], result.output
    assert "Traceback" not in result.output and counting.calls == []
    with pytest.raises(GageError, match="not a readable response cache"):
        ResponseCache(tmp_path / "cache")


def test_two_runs_share_one_cache_at_once(tmp_path):
    rows = tmp_path / "rows.jsonl"
    with rows.open("w") as fh:
        for i in range(3000):
            fh.write(json.dumps({"goal": f"Open the jar number {i}.", "sol1": f"Twist lid {i}.",
                                 "sol2": f"Hit jar {i}.", "label": i % 2}) + "\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-m", "gage_eval.cli", "--tasks", "piqa", "--model", "dummy",
                               "--model-args", "batch_size=8", "--data", f"piqa={rows}", "-q",
                               "-o", str(tmp_path / "runs"), "--run-id", name, "--cache", str(tmp_path / "cache")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
             for name in ("one", "two")]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert "locked" not in out + err
    counts = [json.loads((tmp_path / "runs" / n / "summary.json").read_text())["run"]["cache"] for n in ("one", "two")]
    assert all(c["hits"] + c["misses"] == 3000 for c in counts)
    # a row both runs missed at once was answered twice: equal but for its latency
    assert [untimed(r) for r in read(tmp_path / "runs" / "one" / "samples" / "piqa.jsonl")] == \
        [untimed(r) for r in read(tmp_path / "runs" / "two" / "samples" / "piqa.jsonl")]
    with sqlite3.connect(tmp_path / "cache" / FILE_NAME) as db:
        assert db.execute("SELECT count(*) FROM responses").fetchone()[0] == 3000
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


@pytest.mark.parametrize("where", ["env_key", "url_password"])
def test_no_secret_reaches_the_cache_file(run_cli, tmp_path, monkeypatch, where):
    sys.path.insert(0, str(ROOT / "tests" / "backends"))
    from openai_fake_server import FakeServer

    key, header = "sk-CACHE-canary-key-5e1d", "CACHE-canary-hdr-31bc"
    monkeypatch.setenv("GAGE_TEST_CACHE_KEY", key)
    tasks = ROOT / "tests" / "backends" / "openai_tasks"
    with FakeServer() as server:
        if where == "env_key":
            args = f"base_url={server.url},model=fake-model,api_key_env=GAGE_TEST_CACHE_KEY,header_X-Auth={header}"
        else:
            url = server.url.replace("http://", f"http://user:{key}@")
            args = f"base_url={url},model=fake-model,header_X-Auth={header}"
        for run_id in ("a", "b"):
            result = run_cli("--tasks", "http_capitals", "--include-path", tasks, "--model", "openai",
                             "--model-args", args + ",max_retries=0", "-o", tmp_path / "runs", "--run-id", run_id,
                             "-q", "--cache", tmp_path / "cache")
            assert result.exit_code == 0, result.output
        assert all(e["headers"].get("authorization") for e in server.log)  # the credential was used
        sent = len(server.log)
    summary = json.loads((tmp_path / "runs" / "b" / "summary.json").read_text())
    assert summary["run"]["cache"]["misses"] == 0 and summary["run"]["cache"]["hits"] > 0
    assert sent == summary["run"]["cache"]["hits"]  # the first run's requests only
    raw = b"".join(p.read_bytes() for p in (tmp_path / "cache").iterdir())
    for secret in (key, header):
        assert secret.encode() not in raw
    with sqlite3.connect(tmp_path / "cache" / FILE_NAME) as db:
        (description,) = db.execute("SELECT description FROM models").fetchone()
    assert "fake-model" in description and server.url.split("//")[1] in description


@pytest.mark.slow
def test_a_second_smollm2_run_asks_the_model_nothing(reuse_weights, run_cli, tmp_path):
    """The default model (SmolLM2 GGUF through transformers): the rerun is all hits, same summary."""
    summaries = []
    for run_id in ("a", "b"):
        with reuse_weights():
            result = run_cli("--tasks", "piqa", "--limit", "6", "-o", tmp_path / "runs", "--run-id", run_id, "-q",
                             "--cache", tmp_path / "cache")
        assert result.exit_code == 0, result.output
        summaries.append(json.loads((tmp_path / "runs" / run_id / "summary.json").read_text()))
    assert summaries[0]["run"]["cache"]["misses"] == 6
    assert summaries[1]["run"]["cache"] == {**summaries[0]["run"]["cache"], "hits": 6, "misses": 0}
    # the backend answers in its own order (by length), the cache in the rows' order: the same
    # records, and the same metrics to the last bit (the aggregate does not depend on row order)
    assert sorted(samples(tmp_path, "a").splitlines()) == sorted(samples(tmp_path, "b").splitlines())
    assert summaries[0]["tasks"]["piqa"]["metrics"] == summaries[1]["tasks"]["piqa"]["metrics"]
    assert summaries[0]["tasks"]["piqa"]["slices"] == summaries[1]["tasks"]["piqa"]["slices"]


def test_judge_requests_go_through_the_cache(run_cli, tmp_path):
    sys.path.insert(0, str(ROOT / "tests" / "backends"))
    from openai_fake_server import FakeServer

    tasks = ROOT / "tests" / "backends" / "openai_tasks"
    fast = "timeout=1,backoff=0.01,backoff_max=0.05,max_retries=4"
    summaries, sent = [], []
    with FakeServer() as server:
        for run_id in ("a", "b"):
            before = len(server.log)
            result = run_cli("--tasks", "http_judged", "--include-path", tasks, "--model", "openai", "--model-args",
                             f"base_url={server.url},model=fake-model,{fast}", "--judge-model", "openai",
                             "--judge-args", f"base_url={server.url},model=fake-model,{fast},concurrency=2",
                             "-o", tmp_path / "runs", "--run-id", run_id, "-q", "--cache", tmp_path / "cache")
            assert result.exit_code in (0, 1), result.output
            summaries.append(json.loads((tmp_path / "runs" / run_id / "summary.json").read_text()))
            sent.append([e["body"]["messages"][-1]["content"] for e in server.log[before:]])
    first, second = (s["tasks"]["http_judged"]["cache"] for s in summaries)
    assert first["hits"] == 0 and first["judge_hits"] == 0 and first["judge_misses"] == 4
    # the rerun: every model answer and every judge verdict that did not fail comes from the cache
    judged_ok = 4 - summaries[0]["tasks"]["http_judged"]["counts"]["judge_errors"]
    assert judged_ok == 3  # j-judge-fails: its judge gave up, and is asked again
    assert second["misses"] == 0 and second["hits"] == first["misses"]
    assert second["judge_hits"] == judged_ok and second["judge_misses"] == 4 - judged_ok
    assert all("Grade the answer" in text for text in sent[1])  # only judge prompts reached the server
    assert summaries[1]["run"]["cache"]["judge_hits"] == judged_ok


@pytest.mark.slow  # (seconds on two cores: left out of the README's quick subset)
def test_many_processes_creating_one_cache_at_once_all_open_it(tmp_path):
    """SQLite answers two connections switching a new file to WAL at once with "database is
    locked" without waiting: the cache tries again until its busy timeout."""
    script = ("import sys, time; from gage_plugins_builtin.cache import ResponseCache; start = float(sys.argv[2]);"
              "time.sleep(max(0.0, start - time.time())); ResponseCache(sys.argv[1]).close(); print('ok')")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for round_ in range(4):
        folder = tmp_path / f"cache{round_}"
        start = time.time() + 1.5  # every process is started and importing before this
        procs = [subprocess.Popen([sys.executable, "-c", script, str(folder), repr(start)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=env) for _ in range(6)]
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0 and out.strip() == "ok", err


QUOTE_SECRET = "QUOTE-canary-secret-5f0a"


class QuotingBackend(DummyBackend):
    """The dummy whose every answer quotes its own secret after the text (a careless server)."""

    name = "quoting"
    secrets = (QUOTE_SECRET,)
    calls: list[str] = []

    def stream(self, requests):
        for i, req in enumerate(requests):
            QuotingBackend.calls.append(req.sample_id)
            out = self._one(req)
            out.text = f"{out.text} {QUOTE_SECRET}"
            out.raw = {"echo": [QUOTE_SECRET], QUOTE_SECRET: "key"}
            yield i, out


class QuotingPlugin:
    @hookimpl
    def gage_register_backends(self, register):
        register("quoting", QuotingBackend)


def test_a_judge_reply_quoting_a_secret_is_masked_counted_and_not_cached(fresh_plugins, counting, run_cli,
                                                                         tmp_path):
    """The judge's reply is masked before its verdict is read (SCORE: 1 *** still scores), counted,
    never kept in the cache; the model's own answers (no secret) are."""
    fresh_plugins.register_plugin(QuotingPlugin(), "quoting")
    tasks = ROOT / "tests" / "backends" / "openai_tasks"
    summaries = []
    for run_id in ("a", "b"):
        QuotingBackend.calls = []
        result = run_cli("--tasks", "http_judged", "--include-path", tasks, "--model", "counting", "--model-args",
                         "response=echo", "--judge-model", "quoting", "--judge-args", "response=fixed,text=SCORE: 1",
                         "-o", tmp_path / "runs", "--run-id", run_id, "-q", "--cache", tmp_path / "cache")
        assert result.exit_code == 0, result.output
        assert QUOTE_SECRET not in result.output
        assert "4 model or judge replies quoted a secret" in result.output
        assert len(QuotingBackend.calls) == 4  # asked again: a masked reply is never cached
        summaries.append(json.loads((tmp_path / "runs" / run_id / "summary.json").read_text()))
        assert validation_errors(summaries[-1], "summary") == []
        for path in (tmp_path / "runs" / run_id).rglob("*"):
            if path.is_file():
                assert QUOTE_SECRET not in path.read_text(errors="replace"), path
    task = summaries[1]["tasks"]["http_judged"]
    assert task["counts"]["secrets_scrubbed"] == 4 and task["counts"]["scored"] == 4
    assert task["cache"] == {"hits": 4, "misses": 0, "judge_hits": 0, "judge_misses": 4}
    records = read(tmp_path / "runs" / "b" / "samples" / "http_judged.jsonl")
    assert all(r["eval_result"]["judge"]["secrets_scrubbed"] == 1 and "secrets_scrubbed" not in r["eval_result"]
               for r in records)
    assert all(r["eval_result"]["metrics"]["judge_score"] for r in records)
    assert QUOTE_SECRET.encode() not in b"".join(p.read_bytes() for p in (tmp_path / "cache").iterdir())


def test_a_model_reply_quoting_a_secret_is_masked_in_every_field(fresh_plugins, run_cli, tmp_path):
    fresh_plugins.register_plugin(QuotingPlugin(), "quoting")
    tasks = ROOT / "tests" / "backends" / "openai_tasks"
    result = run_cli("--tasks", "http_capitals", "--include-path", tasks, "--model", "quoting", "--model-args",
                     "response=echo", "-o", tmp_path / "runs", "--run-id", "a", "-q")
    assert result.exit_code in (0, 1), result.output
    for path in (tmp_path / "runs" / "a").rglob("*"):
        if path.is_file():
            assert QUOTE_SECRET not in path.read_text(errors="replace"), path
    entry = read(tmp_path / "runs" / "a" / "samples" / "http_capitals.jsonl")[0]["predict_result"][0]
    assert entry["message"]["content"][0]["text"].endswith(" ***")
    assert entry["raw"] == {"echo": ["***"], "***": "key"}
    summary = json.loads((tmp_path / "runs" / "a" / "summary.json").read_text())
    assert summary["tasks"]["http_capitals"]["counts"]["secrets_scrubbed"] == summary["tasks"]["http_capitals"][
        "counts"]["total"]


def test_the_key_holds_header_values_hashed(tmp_path):
    """Two backends differing only by a secret header value are two models; the value is in no
    stored byte, and the description is the same redacted text."""
    cache = ResponseCache(tmp_path / "cache")
    try:
        views = []
        for value in ("gpt-big-1a", "gpt-small-2b", "gpt-big-1a"):
            backend = DummyBackend()
            backend.secrets = (value,)
            views.append(cache.bind(backend, "dummy", 1234, backend.secrets))
        plain = cache.bind(DummyBackend(), "dummy", 1234)
        assert views[0].identity == views[2].identity != views[1].identity
        assert plain.identity not in (views[0].identity, views[1].identity)
        req = Request(kind="generate", sample_id="s", prompt="hi")
        assert views[0].key(req) != views[1].key(req)
        # the core's rule the wrapper follows (BackendUse.keeps): a reply quoting a secret is never kept
        assert not reusable(req, ModelOutput(text="gpt-big-1a says hi"), ("gpt-big-1a",))
        assert reusable(req, ModelOutput(text="hi"), ("gpt-big-1a",))
        assert not reusable(req, ModelOutput(text=None), ()) and not reusable(req, ModelOutput(error="x"), ())
    finally:
        cache.close()
    raw = b"".join(p.read_bytes() for p in (tmp_path / "cache").iterdir())
    assert b"gpt-big-1a" not in raw and b"gpt-small-2b" not in raw
    with sqlite3.connect(tmp_path / "cache" / FILE_NAME) as db:
        descriptions = {d for (d,) in db.execute("SELECT description FROM models")}
    assert len(descriptions) == 1


def test_a_foreign_sqlite_file_is_refused_unchanged(tmp_path):
    folder = tmp_path / "cache"
    folder.mkdir()
    with sqlite3.connect(folder / FILE_NAME) as db:
        db.execute("CREATE TABLE notes (body TEXT)")
    db.close()
    before = (folder / FILE_NAME).read_bytes()
    with pytest.raises(GageError, match=r"not a gage-eval response cache: it holds other tables \(notes\)") as exc:
        ResponseCache(folder)
    assert exc.value.exit_code == 2 and str(folder / FILE_NAME) in str(exc.value)
    assert (folder / FILE_NAME).read_bytes() == before and [p.name for p in folder.iterdir()] == [FILE_NAME]


def test_a_cache_broken_mid_run_is_a_cache_error_with_exit_2(tmp_path):
    from gage_plugins_builtin.cache import CacheError

    cache = ResponseCache(tmp_path / "cache")
    try:
        view = cache.bind(DummyBackend(), "dummy", 1234)
        with sqlite3.connect(tmp_path / "cache" / FILE_NAME) as other:
            other.execute("DROP TABLE responses")
        other.close()
        for action in (lambda: view.lookup(["k"]), lambda: view.put([("k", "{}")])):
            with pytest.raises(CacheError, match="failed during the run") as exc:
                action()
            assert exc.value.exit_code == 2
    finally:
        cache.close()
