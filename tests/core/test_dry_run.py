"""--dry-run (lm-eval's --write_out): settings and the first requests of each task, no model
loaded, no run folder made; the usual exit statuses."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gage_plugins_builtin.backends.dummy import DummyBackend

ROOT = Path(__file__).resolve().parents[2]
FIRST_GOALS = [json.loads(line)["goal"] for line in
               (ROOT / "tasks" / "piqa" / "sample.jsonl").read_text().splitlines()[:4]]


@pytest.fixture
def no_model(monkeypatch):
    """The dummy backend, failing the test if anything opens it or sends it a request."""
    def refuse(*args, **kwargs):
        raise AssertionError("a dry run used the model")

    for name in ("open", "run", "stream"):
        monkeypatch.setattr(DummyBackend, name, refuse)


def _task(root: Path, name: str, prompt: str, *, kind: str = "generate", extra: str = "") -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "rows.jsonl").write_text('{"question": "What is 2+2?", "answer": "4"}\n'
                                       '{"question": "What is 3+3?", "answer": "6"}\n')
    (folder / "prompt.jinja").write_text(prompt)
    (folder / "task.yaml").write_text(
        f"name: {name}\ndescription: t\ndataset: {{loader: jsonl, args: {{path: rows.jsonl}}}}\n"
        "preprocessor: {name: legacy, args: {question: question, answer: answer}}\n"
        f"request: {{kind: {kind}, chat: true, prompt: prompt.jinja, generation: {{max_new_tokens: 8}}}}\n"
        f"metrics: [exact_match]\n{extra}")
    return root


def test_settings_and_the_first_prompts_without_model_or_run_folder(run_cli, tmp_path, no_model):
    result = run_cli("--tasks", "piqa", "--model", "dummy", "--model-args", "seed=9", "--dry-run",
                     "-o", tmp_path / "runs")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "no model is loaded, no run folder is made" in out
    assert '  model_args: {"seed": 9}' in out and '  tasks: ["piqa"]' in out
    for goal in FIRST_GOALS[:3]:
        assert f"| Question: {goal}" in out
    assert FIRST_GOALS[3] not in out  # three rows by default
    assert 'continuations: [" ' in out
    assert not (tmp_path / "runs").exists()


def test_dry_run_row_count_and_write_out_alias(run_cli, tmp_path, no_model):
    one = run_cli("--tasks", "piqa", "--model", "dummy", "--dry-run=1", "-o", tmp_path)
    assert one.exit_code == 0 and FIRST_GOALS[0] in one.output and FIRST_GOALS[1] not in one.output
    spaced = run_cli("--tasks", "piqa", "--model", "dummy", "--dry-run", "4", "-o", tmp_path)
    assert spaced.exit_code == 0 and FIRST_GOALS[3] in spaced.output
    limited = run_cli("--tasks", "piqa", "--model", "dummy", "--limit", "2", "--dry-run=5", "-o", tmp_path)
    assert FIRST_GOALS[1] in limited.output and FIRST_GOALS[2] not in limited.output
    plain = run_cli("--tasks", "piqa", "--model", "dummy", "--dry-run", "-o", tmp_path)
    lm_eval = run_cli("--tasks", "piqa", "--model", "dummy", "--write_out", "-o", tmp_path)
    assert lm_eval.exit_code == 0 and lm_eval.output == plain.output
    assert list(tmp_path.iterdir()) == []


def test_chat_request_shows_messages_system_prompt_and_generation(run_cli, tmp_path, no_model):
    root = _task(tmp_path / "tasks", "qa", "Q: {{ question }}\nA:")
    result = run_cli("--tasks", "qa", "--include-path", root, "--model", "dummy", "--dry-run",
                     "--system-prompt", "Answer with a number.", "--gen-kwargs", 'stop=["\\n\\n"],temperature=0')
    assert result.exit_code == 0, result.output
    out = result.output
    assert '     system: "Answer with a number."' in out
    assert "       | Q: What is 2+2?\n       | A:" in out
    assert '   gen: {"max_new_tokens": 8, "stop": ["\\n\\n"], "temperature": 0.0}' in out
    assert "   chat: true" in out


def test_the_default_model_is_not_loaded(tmp_path, smollm2_gguf):
    code = ("import sys\nfrom click.testing import CliRunner\nfrom gage_eval.cli import cli\n"
            f"r = CliRunner().invoke(cli, ['--tasks', 'piqa', '--dry-run=1', '-o', {str(tmp_path / 'runs')!r}])\n"
            "assert r.exit_code == 0, r.output\nassert 'Question: ' in r.output, r.output\n"
            "heavy = [m for m in ('torch', 'transformers') if m in sys.modules]\nassert not heavy, heavy\n")
    subprocess.run([sys.executable, "-c", code], check=True)
    assert not (tmp_path / "runs").exists()


def test_secrets_are_masked(run_cli, tmp_path):
    result = run_cli("--tasks", "piqa", "--model", "openai", "--model-args",
                     "base_url=http://user:canary-pw-91c@127.0.0.1:9/v1,model=m,header_X-Token=canary-hdr-22b",
                     "--judge-model", "openai", "--judge-args", "model=j,header_Authorization=Bearer canary-b-5d",
                     "--dry-run=1", "-o", tmp_path / "runs")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "canary" not in out, out
    assert '"base_url": "http://***@127.0.0.1:9/v1"' in out and '"header_X-Token": "***"' in out
    assert '"header_Authorization": "***"' in out and "Question: " in out
    assert not (tmp_path / "runs").exists()


def test_exit_statuses(run_cli, tmp_path, no_model):
    unknown = run_cli("--tasks", "nope", "--model", "dummy", "--dry-run")
    assert unknown.exit_code == 2 and "unknown task(s): nope" in unknown.output

    bad_model = run_cli("--tasks", "piqa", "--model", "dummy", "--model-args", "response=bogus", "--dry-run=1")
    assert bad_model.exit_code == 2 and "model: dummy: ERROR: dummy backend: response must be" in bad_model.output
    assert FIRST_GOALS[0] in bad_model.output  # the prompts are still shown

    root = _task(tmp_path / "tasks", "undef", "Q: {{ q }}")
    template = run_cli("--tasks", "undef", "--include-path", root, "--model", "dummy", "--dry-run")
    assert template.exit_code == 1, template.output
    assert "-- row 1 (" in template.output and "template error" in template.output and "'q'" in template.output

    _task(tmp_path / "tasks", "broken", "Q", extra="").joinpath("broken", "task.yaml").write_text(
        "name: broken\ndescription: t\ndataset: {loader: nosuchloader}\npreprocessor: {name: legacy}\n"
        "request: {kind: generate}\nmetrics: [exact_match]\n")
    broken = run_cli("--tasks", "broken,piqa", "--include-path", root, "--model", "dummy", "--dry-run=1")
    assert broken.exit_code == 3, broken.output
    assert "== task broken" in broken.output and "cannot run" in broken.output and "nosuchloader" in broken.output
    assert FIRST_GOALS[0] in broken.output  # the other task is still shown


def test_fraction_limit_is_shown_and_applied(run_cli, tmp_path, no_model):
    root = _task(tmp_path / "tasks", "qa", "Q: {{ question }}")
    result = run_cli("--tasks", "qa", "--include-path", root, "--model", "dummy", "--limit", "0.5", "--dry-run")
    assert result.exit_code == 0, result.output
    assert "limit 0.5" in result.output
    assert "What is 2+2?" in result.output and "What is 3+3?" not in result.output  # ceil(2 * 0.5) = 1


def test_resume_dry_run_shows_the_stored_run(run_cli, tmp_path):
    first = run_cli("--tasks", "piqa", "--model", "dummy", "--limit", "2", "--seed", "5", "-o", tmp_path,
                    "--run-id", "r", "-q")
    assert first.exit_code == 0, first.output
    before = sorted((p.name, p.stat().st_mtime_ns) for p in (tmp_path / "r").rglob("*"))
    shown = run_cli("--resume", tmp_path / "r", "--dry-run")
    assert shown.exit_code == 0, shown.output
    assert "  seed: 5" in shown.output and "  limit: 2" in shown.output and FIRST_GOALS[1] in shown.output
    assert sorted((p.name, p.stat().st_mtime_ns) for p in (tmp_path / "r").rglob("*")) == before
    refused = run_cli("--resume", tmp_path / "r", "--limit", "3", "--dry-run")
    assert refused.exit_code == 2 and "limit: 2 -> 3" in refused.output


def test_the_requests_shown_are_the_ones_a_run_sends(run_cli, tmp_path):
    """2 random few-shot examples from the task's own rows: the dry run's prompts equal the
    prompts the run records, row by row (the few-shot draw depends on each row's position)."""
    root = tmp_path / "tasks"
    shutil.copytree(ROOT / "tasks" / "piqa", root / "pq")
    yaml = root / "pq" / "task.yaml"
    text = yaml.read_text().replace("name: piqa", "name: pq")
    yaml.write_text(text if "\nfewshot:" in text else text + "fewshot: {path: sample.jsonl}\n")
    common = ("--tasks", "pq", "--include-path", root, "--model", "dummy", "--num-fewshot", "2", "--limit", "4")
    shown = run_cli(*common, "--dry-run=4")
    assert shown.exit_code == 0, shown.output
    ran = run_cli(*common, "-o", tmp_path, "--run-id", "r", "-q")
    assert ran.exit_code == 0, ran.output
    records = [json.loads(line) for line in (tmp_path / "r" / "samples" / "pq.jsonl").read_text().splitlines()]
    assert len(records) == 4
    for record in records:
        prompt = record["predict_result"][0]["prompt"]
        assert prompt.count("Question: ") == 3  # two examples and the question
        block = "\n".join("     | " + line for line in prompt.split("\n"))
        assert block in shown.output, (block, shown.output)
