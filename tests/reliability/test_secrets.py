"""A unique canary in every place a credential can be given (the key's environment variable,
URL user-info, odd header names, the run config, the judge's arguments): a run that fails a
request against a server quoting the request's headers back, is interrupted and resumed,
writes none of them to any file or console line, and the resumed run still authenticates."""
from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness import GUARD, INTERRUPTED, OK, ROOT, TASK_FAILED, USAGE, check

sys.path.insert(0, str(ROOT / "tests" / "backends"))
from openai_fake_server import FakeServer  # noqa: E402

KEY, PASSWORD = "sk-CANARY-env-key-81f3", "CANARY-url-pw-22c9"
COOKIE, XAUTH, JUDGE_TOKEN = "CANARY-cookie-6d0e", "CANARY-xauth-7a41", "CANARY-judge-hdr-90b5"
CANARIES = [KEY, PASSWORD, COOKIE, XAUTH, JUDGE_TOKEN, base64.b64encode(f"grader:{PASSWORD}".encode()).decode()]
ROWS = 40

JUDGE_TEMPLATE = """Grade the answer against the reference.
Reference: {{ references[0] }}
Answer: {{ response }}
SCORE: {{ 1 if response == references[0] else 0 }}"""


def task_folder(tmp: Path) -> Path:
    folder = tmp / "tasks" / "secret_task"
    folder.mkdir(parents=True)
    (folder / "task.yaml").write_text(textwrap.dedent("""\
        name: secret_task
        dataset: {loader: jsonl, args: {path: rows.jsonl}}
        preprocessor: {name: identity}
        request: {kind: generate, chat: true, generation: {max_new_tokens: 8}}
        judge: {name: llm_judge, args: {reference_template: judge.jinja, generation: {max_new_tokens: 8}}}
        metrics: [judge_score]
        """))
    (folder / "judge.jinja").write_text(JUDGE_TEMPLATE)
    with (folder / "rows.jsonl").open("w") as fh:
        for i in range(ROWS):
            fault = " [[faults:400]]" if i == 3 else ""  # one request the server refuses, quoting our headers
            fh.write(json.dumps({"schema_version": "v1", "id": f"r{i}", "references": [f"word{i}"],
                                 "messages": [{"role": "user", "content": f"Repeat the word.{fault}\nword{i}"}]})
                     + "\n")
    return folder


def config(tmp: Path, dut: FakeServer, judge: FakeServer) -> Path:
    judge_url = judge.url.replace("http://", f"http://grader:{PASSWORD}@")
    path = tmp / "run.yaml"
    path.write_text(textwrap.dedent(f"""\
        models:
          dut:
            backend: openai
            args: {{base_url: "{dut.url}", model: fake-model, api_key_env: CANARY_KEY, concurrency: 1, batch_size: 4,
                    header_Cookie: "{COOKIE}", header_X-Auth: "{XAUTH}", max_retries: 0}}
          judge:
            backend: openai
            args: {{base_url: "{judge_url}", model: fake-model, concurrency: 1, header_X-Grader-Token: "{JUDGE_TOKEN}"}}
        include_paths: [tasks]
        tasks: [secret_task]
        """))
    return path


def env(tmp: Path) -> dict:
    return {**os.environ, "CANARY_KEY": KEY, "PYTHONPATH": f"{GUARD}:{ROOT}", "HF_HUB_OFFLINE": "1",
            "OPENAI_API_KEY": ""}


def assert_no_canary(run_dir: Path, *texts: str) -> None:
    for text in texts:
        for canary in CANARIES:
            assert canary not in text, f"{canary} on the console:\n{text}"
    for path in run_dir.rglob("*"):
        if path.is_file():
            data = path.read_text(errors="replace")
            for canary in CANARIES:
                assert canary not in data, f"{canary} in {path}"


@pytest.mark.slow
def test_secrets_never_written_and_resume_authenticates(gage, tmp_path):
    dut_headers = {"authorization": f"Bearer {KEY}", "cookie": COOKIE, "x-auth": XAUTH}
    judge_headers = {"authorization": "Basic " + base64.b64encode(f"grader:{PASSWORD}".encode()).decode(),
                     "x-grader-token": JUDGE_TOKEN}
    task_folder(tmp_path)
    with FakeServer(require_headers=dut_headers, echo_headers=True, latency=0.15) as dut, \
            FakeServer(require_headers=judge_headers, echo_headers=True) as judge:
        cfg = config(tmp_path, dut, judge)
        argv = [sys.executable, "-m", "gage_eval.cli", "--config", str(cfg), "-o", str(tmp_path / "runs"),
                "--run-id", "r"]
        # (a shell that started the tests in the background may have left SIGINT ignored: undo that)
        proc = subprocess.Popen(argv, cwd=tmp_path, env=env(tmp_path), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        samples = tmp_path / "runs" / "r" / "samples" / "secret_task.jsonl"
        deadline = time.time() + 90
        while not (samples.exists() and samples.read_text().count("\n") >= 8) and time.time() < deadline:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == INTERRUPTED, out + err
        assert "Traceback" not in err and "Task was destroyed" not in err, err
        run_dir = tmp_path / "runs" / "r"
        written = samples.read_text().count("\n")
        assert 8 <= written < ROWS
        assert_no_canary(run_dir, out, err)
        assert dut.rejected == 0 and judge.rejected == 0  # the first run authenticated everywhere
        # the refused request was written with the server's reply, which quoted our headers: scrubbed
        first = [json.loads(line) for line in samples.read_text().splitlines()]
        refused = [r["eval_result"]["error"]["message"] for r in first if r["id"] == "r3"]
        assert refused and "400" in refused[0] and "you sent" in refused[0] and "***" in refused[0], refused

        # a resume without the secrets stops before any request, naming what is missing
        sent = len(dut.log)
        o = gage("--resume", run_dir, env={"CANARY_KEY": KEY, "OPENAI_API_KEY": ""})
        check(o, USAGE, "header_Cookie", "give the arguments again")
        assert len(dut.log) == sent and dut.rejected == 0
        assert_no_canary(run_dir, o.text)

        # given again (the same run config), the resume authenticates and finishes
        o = gage("--resume", run_dir, "--config", cfg, env={"CANARY_KEY": KEY, "OPENAI_API_KEY": ""})
        check(o, OK)  # the refused row ran again on resume (its fault was once only) and scored
        assert dut.rejected == 0 and judge.rejected == 0
        records = o.records("secret_task")
        assert sorted(r["id"] for r in records) == sorted(f"r{i}" for i in range(ROWS))
        assert not o.errors("secret_task")
        assert_no_canary(run_dir, o.text)
        assert any(e.get("fault") == "400" for e in dut.log)


def test_a_header_value_with_a_space_is_masked_whole(gage, tmp_path):
    """``header_Authorization=Bearer X`` on the command line: the stored command and settings hide all of it."""
    token = "CANARY-bearer-5c2e"
    task_folder(tmp_path)
    with FakeServer(require_headers={"authorization": f"Bearer {token}"}) as server:
        o = gage("--tasks", "secret_task", "--include-path", tmp_path / "tasks", "--limit", "3",
                 "--model", "openai", "--model-args",
                 f"base_url={server.url},model=fake-model,header_Authorization=Bearer {token}",
                 "--judge-model", "dummy", "--judge-args", "response=fixed,text=SCORE: 1",
                 env={"OPENAI_API_KEY": ""})
        check(o, OK)
        assert server.rejected == 0 and len(server.log) == 3
    for path in o.run_dir.rglob("*"):
        if path.is_file():
            assert token not in path.read_text(errors="replace"), path
    assert token not in o.text


@pytest.mark.parametrize("flag", ["--data", "--fewshot-data"])
def test_a_password_in_a_data_url_is_not_echoed_in_the_error(gage, flag):
    # was "gage-eval: error: --data piqa=https://bob:PW@host/x.jsonl: https://bob:PW@host/x.jsonl
    # does not exist": the password twice on the console (a CI log keeps it)
    url = f"https://bob:{PASSWORD}@127.0.0.1:1/rows.jsonl"
    o = gage("--tasks", "piqa", "--model", "dummy", flag, f"piqa={url}", "--num-fewshot", "1")
    check(o, USAGE, "https://***@127.0.0.1:1/rows.jsonl")
    assert PASSWORD not in o.text


def test_a_password_in_a_task_files_data_url_is_not_written(gage):
    # an hf data_files URL was joined to the task folder ('TASK/https:/bob:PW@host/...'), which no
    # longer looked like a URL: its password went into the FAILED line, summary.json, events, report
    folder = gage.tmp / "tasks" / "urltask"
    folder.mkdir(parents=True)
    (folder / "task.yaml").write_text(textwrap.dedent(f"""\
        name: urltask
        dataset: {{loader: hf, args: {{path: json, split: train,
                   data_files: "https://bob:{PASSWORD}@127.0.0.1:1/rows.jsonl"}}}}
        request: {{kind: generate, prompt: prompt.jinja}}
        metrics: [exact_match]
        """))
    (folder / "prompt.jinja").write_text("{{ question }}")
    o = gage("--tasks", "urltask", "--include-path", folder.parent, "--model", "dummy",
             env={"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    check(o, TASK_FAILED, "https://***@127.0.0.1:1/rows.jsonl")
    assert PASSWORD not in o.text
    assert not [p for p in o.run_dir.rglob("*") if p.is_file() and PASSWORD.encode() in p.read_bytes()]
