"""Replies and the response cache, from outside: a server reply quoting the key, a header value or
the Basic token of a URL's user-info is written masked everywhere and counted; the cache keys a
model routed by a header by that header's value; a reply that had to be masked is never cached;
a foreign or unreadable cache file is refused unchanged (exit 2), and so is a cache broken
mid-run, after which --resume finishes the run."""
from __future__ import annotations

import base64
import json
import shutil
import sqlite3
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from harness import OK, ROOT, USAGE, check

sys.path.insert(0, str(ROOT / "tests" / "backends"))
from openai_fake_server import FakeServer  # noqa: E402

KEY, HEADER, PASSWORD = "sk-REPLY-canary-key-4b1e", "REPLY-canary-hdr-9d2f", "REPLY-canary-pw-5c7a"
TOKEN = base64.b64encode(f"grader:{PASSWORD}".encode()).decode()
QUOTED = 3  # rows whose reply quotes a credential (of 6)


def task_folder(tmp: Path, directive: str, rows: int = 6, plain: int = 3) -> Path:
    """A chat task: the first ``rows - plain`` rows carry ``directive``, the others ask for a word."""
    folder = tmp / "tasks" / "reply_task"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    (folder / "task.yaml").write_text(textwrap.dedent("""\
        name: reply_task
        dataset: {loader: jsonl, args: {path: rows.jsonl}}
        preprocessor: {name: identity}
        request: {kind: generate, chat: true, generation: {max_new_tokens: 8, stop: ["\\n"]}}
        metrics: [exact_match]
        """))
    with (folder / "rows.jsonl").open("w") as fh:
        for i in range(rows):
            said = directive if i < rows - plain else ""
            fh.write(json.dumps({"schema_version": "v1", "id": f"r{i}", "references": [f"word{i}"],
                                 "messages": [{"role": "user", "content": f"Repeat the word.{said}\nword{i}"}]})
                     + "\n")
    return folder


def run(gage, tmp: Path, server: FakeServer, args: str, run_id: str, *extra, url: str | None = None, env=None):
    return gage("--tasks", "reply_task", "--include-path", tmp / "tasks", "--model", "openai", "--model-args",
                f"base_url={url or server.url},model=fake-model,max_retries=0,concurrency=1{args}",
                "--cache", tmp / "cache", *extra, run_id=run_id, env={"OPENAI_API_KEY": "", **(env or {})})


def assert_nowhere(canaries: list[str], *places: Path | str) -> None:
    for place in places:
        if isinstance(place, str):
            for c in canaries:
                assert c not in place, f"{c} on the console:\n{place}"
            continue
        for path in [place] if place.is_file() else place.rglob("*"):
            if path.is_file():
                data = path.read_bytes()
                for c in canaries:
                    assert c.encode() not in data, f"{c} in {path}"


CASES = {  # what the server quotes, the run's arguments, the environment, what the masked reply reads
    "key": ("authorization", ",api_key_env=REPLY_KEY", {"REPLY_KEY": KEY}, "ANS-Bearer ***", [KEY]),
    "header": ("x-model", f",header_X-Model={HEADER}", {}, "ANS-***", [HEADER]),
    "basic": ("authorization", "", {}, "ANS-Basic ***", [PASSWORD, TOKEN]),
}


@pytest.mark.parametrize("case", CASES)
def test_a_reply_quoting_a_secret_is_masked_counted_and_not_cached(gage, tmp_path, case):
    header, args, env, masked, canaries = CASES[case]
    task_folder(tmp_path, f" [[quote:{header}]]")
    with FakeServer() as server:
        url = server.url.replace("http://", f"http://grader:{PASSWORD}@") if case == "basic" else None
        first = run(gage, tmp_path, server, args, "a", url=url, env=env)
        check(first, OK)
        quoted = [e for e in server.log if e["headers"].get(header)]
        assert len(server.log) == 6 and len(quoted) == 6  # the credential was sent with every request
        records = {r["id"]: r for r in first.records("reply_task")}
        for i in range(6):
            text = records[f"r{i}"]["predict_result"][0]["message"]["content"][0]["text"]
            assert text == (masked if i < QUOTED else f"word{i}"), (i, text)
            assert records[f"r{i}"]["eval_result"].get("secrets_scrubbed") == (1 if i < QUOTED else None)
        counts = first.summary["tasks"]["reply_task"]["counts"]
        assert counts["secrets_scrubbed"] == QUOTED and counts["total"] == 6
        events = [json.loads(line) for line in (first.run_dir / "events.jsonl").read_text().splitlines()]
        assert [e["counts"]["secrets_scrubbed"] for e in events if e.get("event") == "task_done"] == [QUOTED]
        warnings = [line for line in first.err.splitlines() if "quoted a secret" in line]
        assert len(warnings) == 1 and f"{QUOTED} model or judge replies" in warnings[0], first.err
        assert (first.run_dir / "report.html").is_file() and any((first.run_dir / "instances").iterdir())
        assert_nowhere(canaries, first.run_dir, tmp_path / "cache", first.text)

        # the rerun: the plain rows come from the cache; the masked ones were never kept, so they
        # are asked again (a hit would have returned the mask, not the answer)
        sent = len(server.log)
        second = run(gage, tmp_path, server, args, "b", url=url, env=env)
        check(second, OK)
        assert len(server.log) - sent == QUOTED
        assert second.summary["run"]["cache"]["hits"] == 6 - QUOTED
        assert second.summary["run"]["cache"]["misses"] == QUOTED
        assert second.summary["tasks"]["reply_task"]["counts"]["secrets_scrubbed"] == QUOTED
        assert_nowhere(canaries, second.run_dir, tmp_path / "cache", second.text)
    with sqlite3.connect(tmp_path / "cache" / "responses.sqlite") as db:
        stored = [json.loads(text)["text"] for (text,) in db.execute("SELECT output FROM responses")]
    assert sorted(stored) == [f"word{i}" for i in range(QUOTED, 6)]


def test_models_routed_by_a_header_have_their_own_cache_entries(gage, tmp_path):
    """A gateway choosing the model by a header: gpt-big's answers are never gpt-small's."""
    task_folder(tmp_path, " [[route:x-model]]", rows=5, plain=0)
    answers, sent = {}, {}
    with FakeServer() as server:
        for run_id, model in (("big", "gpt-big-7c1"), ("small", "gpt-small-2e9"), ("big-again", "gpt-big-7c1")):
            before = len(server.log)
            o = run(gage, tmp_path, server, f",header_X-Model={model}", run_id)
            check(o, OK)
            sent[run_id] = len(server.log) - before
            answers[run_id] = [r["predict_result"][0]["message"]["content"][0]["text"]
                               for r in o.records("reply_task")]
            assert all(e["headers"]["x-model"] == model for e in server.log[before:])
            assert_nowhere(["gpt-big-7c1", "gpt-small-2e9"], o.run_dir, o.text)
    assert sent == {"big": 5, "small": 5, "big-again": 0}
    assert len(set(answers["big"])) == 1 and answers["big"][0].startswith("ROUTED-")
    assert set(answers["small"]).isdisjoint(answers["big"])
    assert answers["big-again"] == answers["big"]
    assert_nowhere(["gpt-big-7c1", "gpt-small-2e9"], tmp_path / "cache")


def _foreign(path: Path) -> None:
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE users (name TEXT, email TEXT)")
        db.execute("INSERT INTO users VALUES ('ada', 'ada@example.org')")
    db.close()


def _foreign_beside_ours(path: Path) -> None:
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE responses (key TEXT PRIMARY KEY, identity TEXT NOT NULL, output TEXT NOT NULL,"
                   " created REAL NOT NULL)")
        db.execute("CREATE TABLE invoices (id INTEGER)")
    db.close()


def _other_columns(path: Path) -> None:
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE responses (key TEXT, answer TEXT)")
    db.close()


def _garbage(path: Path) -> None:
    path.write_bytes(b"SQLite format 3\x00" + b"\xff" * 4000)


def _folder(path: Path) -> None:
    path.mkdir()


BAD_FILES = {"foreign": (_foreign, "other tables (users)"), "foreign_beside_ours": (_foreign_beside_ours,
             "other tables (invoices)"), "other_columns": (_other_columns, "not a readable response cache"),
             "garbage": (_garbage, "not a readable response cache"), "folder": (_folder, "not a readable")}


@pytest.mark.parametrize("case", BAD_FILES)
def test_a_file_that_is_not_our_cache_is_refused_unchanged(gage, tmp_path, case):
    make, said = BAD_FILES[case]
    cache = tmp_path / "cache"
    cache.mkdir()
    make(cache / "responses.sqlite")
    before = {p.name: (p.read_bytes() if p.is_file() else None) for p in cache.iterdir()}
    task_folder(tmp_path, "")
    with FakeServer() as server:
        o = run(gage, tmp_path, server, "", "r")
        check(o, USAGE, said)
        assert server.log == []
    lines = [line for line in o.err.splitlines() if line.strip()]
    assert len(lines) == 1 and str(cache / "responses.sqlite") in lines[0], o.err
    assert {p.name: (p.read_bytes() if p.is_file() else None) for p in cache.iterdir()} == before
    assert not o.run_dir.exists()


def test_a_cache_broken_mid_run_stops_it_with_exit_2_and_resume_finishes(gage, tmp_path):
    task_folder(tmp_path, " [[delay:0.2]]", rows=12, plain=0)
    with FakeServer() as server:
        def damage() -> None:  # once the first request is in, the cache's table goes (another program)
            while not server.log:
                time.sleep(0.01)
            with sqlite3.connect(tmp_path / "cache" / "responses.sqlite", timeout=60) as db:
                db.execute("DROP TABLE responses")
            db.close()

        breaker = threading.Thread(target=damage, daemon=True)
        breaker.start()
        o = run(gage, tmp_path, server, ",batch_size=2", "r")
        breaker.join(timeout=5)
        check(o, USAGE, "failed during the run", str(tmp_path / "cache" / "responses.sqlite"), "--resume")
        assert len(server.log) < 12  # it stopped: the rows still to come were not sent
        assert o.summary["run"]["exit_status"] == USAGE
        written = o.records("reply_task")
        assert len(written) == o.summary["tasks"]["reply_task"]["counts"]["total"] < 12
        errors = [line for line in o.err.splitlines() if "error" in line]
        assert len(errors) == 1, o.err

        (tmp_path / "cache" / "responses.sqlite").unlink()
        for extra in (tmp_path / "cache").glob("responses.sqlite-*"):
            extra.unlink()
        resumed = gage("--resume", o.run_dir, env={"OPENAI_API_KEY": ""})
        check(resumed, OK)
        assert sorted(r["id"] for r in resumed.records("reply_task")) == sorted(f"r{i}" for i in range(12))
