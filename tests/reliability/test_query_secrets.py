"""A key in the URL's query string (Azure's ``base_url=https://host/v1?api-key=K``) is a secret
like any other: sent with every request, written nowhere (run folder, console, errors quoting
the URL back), asked for again on resume, never sent as ``***``; ``convert`` writes a
``${VAR}`` reference for it, never its value."""
from __future__ import annotations

import sys
import textwrap
from pathlib import Path

from harness import OK, ROOT, ROW_ERRORS, TASK_FAILED, USAGE, check

sys.path.insert(0, str(ROOT / "tests" / "backends"))
from openai_fake_server import FakeServer  # noqa: E402

KEY = "SECRETVALUE123"
SIG = "CANARY+sig/9f=="  # an Azure SAS signature: + / = percent-encoded in the URL
SIG_IN_URL = "CANARY%2Bsig%2F9f%3D%3D"
CANARIES = (KEY, SIG, SIG_IN_URL, "CANARY")
ROWS = 12
NO_KEY = {"OPENAI_API_KEY": ""}


def task_folder(tmp: Path) -> Path:
    folder = tmp / "tasks" / "query_task"
    folder.mkdir(parents=True)
    (folder / "task.yaml").write_text(textwrap.dedent("""\
        name: query_task
        dataset: {loader: jsonl, args: {path: rows.jsonl}}
        preprocessor: {name: identity}
        request: {kind: generate, chat: true, generation: {max_new_tokens: 8}}
        metrics: [exact_match]
        """))
    # row 3: the server refuses it once, quoting the request's URL (and its key) back
    (folder / "rows.jsonl").write_text("".join(
        f'{{"schema_version": "v1", "id": "r{i}", "references": ["word{i}"], "messages": [{{"role": "user", '
        f'"content": "Repeat.{" [[faults:400]]" if i == 3 else ""}\\nword{i}"}}]}}\n' for i in range(ROWS)))
    return tmp / "tasks"


def assert_nowhere(o, *more: Path) -> None:
    for canary in CANARIES:
        assert canary not in o.text, f"{canary} on the console:\n{o.text}"
    folders = [o.run_dir, *more] if o.run_dir is not None else list(more)
    for folder in folders:
        for path in folder.rglob("*"):
            if path.is_file():
                data = path.read_text(errors="replace")
                assert not any(c in data for c in CANARIES), f"a query secret in {path}"


def run_args(tasks: Path, base_url: str, extra: str = ",model=fake-model") -> list:
    return ["--tasks", "query_task", "--include-path", tasks, "--model", "openai", "--model-args",
            f"base_url={base_url},max_retries=0,concurrency=1{extra}"]


def test_a_query_key_is_sent_written_nowhere_and_asked_for_again_on_resume(gage, tmp_path):
    tasks = task_folder(tmp_path)
    with FakeServer(echo_headers=True, require_query={"api-key": KEY, "sig": SIG, "api-version": "2024-02-01"}) as s:
        url = f"{s.url}?api-version=2024-02-01&api-key={KEY}&sig={SIG_IN_URL}"
        o = gage(*run_args(tasks, url), env=NO_KEY)
        check(o, ROW_ERRORS, "1 errored")
        assert s.rejected == 0 and len(s.log) == ROWS  # the key went with every request
        refused = o.errors("query_task")
        assert len(refused) == 1, refused
        message = next(iter(refused.values()))["message"]
        assert "you sent" in message and "api-key=***" in message and "sig=***" in message, message
        assert o.summary["run"]["model"]["settings"]["base_url"] == \
            f"{s.url}?api-version=2024-02-01&api-key=***&sig=***"
        assert_nowhere(o)

        # a resume without the URL stops before any request, naming the argument that held it
        sent = len(s.log)
        o = gage("--resume", o.run_dir, env=NO_KEY)
        check(o, USAGE, "--model-args base_url held a secret", "give the arguments again")
        assert len(s.log) == sent and s.rejected == 0
        assert_nowhere(o)

        # the stored '***' given back is refused, never sent
        o = gage("--resume", o.run_dir, *run_args(tasks, url.replace(KEY, "***"))[4:], env=NO_KEY)
        check(o, USAGE, "api-key query parameter of base_url is the redacted placeholder")
        assert len(s.log) == sent and s.rejected == 0

        # given again, the resume authenticates and runs only the refused row (its fault was once)
        o = gage("--resume", o.run_dir, *run_args(tasks, url)[4:], env=NO_KEY)
        check(o, OK)
        assert s.rejected == 0 and len(s.log) == sent + 1
        assert sorted(r["id"] for r in o.records("query_task")) == sorted(f"r{i}" for i in range(ROWS))
        assert_nowhere(o)


def test_a_query_key_to_a_dead_server_is_in_no_error(gage, tmp_path):
    tasks = task_folder(tmp_path)
    o = gage(*run_args(tasks, f"http://127.0.0.1:9/v1?api-key={KEY}"), "--limit", "3", env=NO_KEY)
    check(o, TASK_FAILED, "http://127.0.0.1:9/v1/chat/completions")
    assert len(o.errors("query_task")) == 3
    assert_nowhere(o)


def test_model_discovery_and_dry_run_show_no_query_key(gage, tmp_path):
    tasks = task_folder(tmp_path)
    o = gage(*run_args(tasks, f"http://127.0.0.1:9/v1?sig={SIG_IN_URL}&api-key={KEY}", extra=""), env=NO_KEY)
    assert "Traceback" not in o.text and o.rc in (USAGE, TASK_FAILED), o.text  # (the table says 3: issue 23)
    assert "cannot reach http://127.0.0.1:9/v1/models" in o.text, o.text
    assert_nowhere(o, tmp_path / "runs")
    with FakeServer(require_query={"api-key": KEY}) as s:
        o = gage(*run_args(tasks, f"{s.url}?api-key={KEY}"), "--dry-run", env=NO_KEY, run_id="dry")
        check(o, OK, "api-key=***")
        assert_nowhere(o, tmp_path / "runs")


def test_a_converted_pipeline_keeps_the_reference_and_the_run_reads_it(gage, tmp_path):
    """The seed's ``api-key=${AZ_KEY}`` stays a reference in run.yaml; the run reads it then."""
    tasks = task_folder(tmp_path)
    with FakeServer(require_query={"api-key": KEY}) as s:
        pipe = tmp_path / "pipe.yaml"
        pipe.write_text(textwrap.dedent(f"""\
            datasets:
              - {{dataset_id: d, loader: jsonl, params: {{path: rows.jsonl}}}}
            backends:
              - backend_id: b
                type: openai_http
                config: {{base_url: "{s.url}?api-key=${{AZ_KEY}}", model: "${{AZ_MODEL:-fake-model}}"}}
            role_adapters:
              - {{adapter_id: dut, role_type: dut_model, backend_id: b}}
            tasks:
              - {{task_id: t, dataset_id: d, steps: [{{step: inference, adapter_id: dut}}]}}
            metrics:
              - metric_id: exact_match
            """))
        o = gage("convert", pipe, "-o", tmp_path / "converted", env={"AZ_KEY": KEY, **NO_KEY}, run_id=None)
        check(o, OK)
        run_yaml = (tmp_path / "converted" / "run.yaml").read_text()
        assert f"base_url: {s.url}?api-key=${{AZ_KEY}}" in run_yaml, run_yaml
        assert "model: ${AZ_MODEL:-fake-model}" in run_yaml, run_yaml
        assert_nowhere(o, tmp_path / "converted")

        args = ["--config", tmp_path / "converted" / "run.yaml", "--tasks", "query_task", "--include-path", tasks,
                "--limit", "4"]
        o = gage(*args, env=NO_KEY)  # the variable is not set: one line naming it, nothing sent
        check(o, USAGE, "models.dut.args.base_url': ${AZ_KEY} names an environment variable that is not set")
        assert not s.log
        o = gage(*args, env={"AZ_KEY": KEY, **NO_KEY}, run_id="r2")
        check(o, ROW_ERRORS)  # row 3's refusal
        assert s.rejected == 0 and len(s.log) == 4 and o.summary["run"]["model"]["settings"]["model"] == "fake-model"
        assert_nowhere(o, tmp_path / "runs")
