"""The run config (--config run.yaml): models by role, per-task overrides, CLI precedence, redacted summary."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from gage_eval.api import hookimpl
from gage_eval.api.errors import GageError
from gage_eval.cli.settings import build_options
from gage_plugins_builtin.backends.dummy import DummyBackend

SECRET = "sk-test-0123456789abcdef"


class KeyedDummy(DummyBackend):
    """The dummy backend with an api_key, as a network backend would take one."""

    def __init__(self, api_key: str = "", **kwargs):
        super().__init__(**kwargs)
        self.secrets = (api_key,)


class KeyedPlugin:
    @hookimpl
    def gage_register_backends(self, register):
        register("keyed_dummy", KeyedDummy)


@pytest.fixture
def keyed(monkeypatch):
    from gage_eval import plugins
    plugins.reset_plugins()
    plugins.register_plugin(KeyedPlugin(), "keyed-test")
    yield
    plugins.reset_plugins()


def _config(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(textwrap.dedent(body), encoding="utf-8")
    return path


CONFIG = f"""\
models:
  dut: {{backend: dummy, args: {{response: letter}}}}
  judge: {{backend: keyed_dummy, args: {{response: fixed, text: "SCORE: 0.5", api_key: {SECRET}}}}}
tasks:
  - name: legal_eval_v1
    limit: 4
    generation: {{max_new_tokens: 16}}
    metrics:
      - {{name: judge_score, as: score, args: {{programmatic_task_types: [mcq]}}}}
"""


def test_run_config_roles_overrides_and_redaction(tmp_path, keyed, run_cli):
    cfg = _config(tmp_path, CONFIG)
    result = run_cli("--config", cfg, "-o", tmp_path / "runs", "--run-id", "r1", "-q")
    assert result.exit_code == 0, result.output
    run = tmp_path / "runs" / "r1"
    text = (run / "summary.json").read_text() + (run / "config.json").read_text() + (run / "events.jsonl").read_text()
    assert SECRET not in text
    summary = json.loads((run / "summary.json").read_text())
    settings = summary["run"]["settings"]
    assert settings["model"] == "dummy" and settings["judge_model"] == "keyed_dummy"
    assert settings["judge_args"]["api_key"] == "***"
    assert settings["task_overrides"]["legal_eval_v1"]["generation"] == {"max_new_tokens": 16}
    assert settings["config_file"] == str(cfg)
    task = summary["tasks"]["legal_eval_v1"]
    assert task["counts"]["total"] == 4  # the per-task limit
    assert list(task["metrics"]) == ["score"] and task["primary_metric"] == "score"  # the metrics override
    records = [json.loads(l) for l in (run / "samples" / "legal_eval_v1.jsonl").open()]
    by_type = {r["task_type"]: r for r in records}
    assert by_type["reference_qa"]["eval_result"]["judge"]["score"] == 0.5
    assert len(by_type["rubric_qa"]["eval_result"]["judge"]["details"]["criteria"]) == 3


def test_cli_flags_override_the_file(tmp_path, keyed, run_cli):
    cfg = _config(tmp_path, CONFIG)
    result = run_cli("--config", cfg, "--limit", "2", "--judge-model", "dummy", "--judge-args",
                     "response=fixed,text=SCORE: 1", "-o", tmp_path / "runs", "--run-id", "r2", "-q")
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "runs" / "r2" / "summary.json").read_text())
    assert summary["tasks"]["legal_eval_v1"]["counts"]["total"] == 2
    assert summary["run"]["judge"]["name"] == "dummy" and summary["run"]["judge"]["args"]["text"] == "SCORE: 1"


def test_file_args_do_not_follow_a_different_cli_backend(tmp_path):
    cfg = _config(tmp_path, CONFIG)
    opts = build_options(tasks=None, model="smollm2", model_args=None, judge_model=None, judge_args=None,
                         batch_size=None, limit=None, output_dir=None, run_id=None, include_paths=[], data=[],
                         config_file=str(cfg), seed=None, fail_fast=False, quiet=True, command="")
    assert opts.model == "smollm2" and opts.model_args == {}
    assert opts.judge_model == "keyed_dummy" and opts.judge_args["api_key"] == SECRET
    assert opts.task_overrides["legal_eval_v1"]["limit"] == 4


@pytest.mark.parametrize("body,words", [
    ("tasks: [legal_eval_v1]\nmodel: dummy\n", "unknown key(s) model"),
    ("models: {dut: {backend: dummy, argz: {}}}\ntasks: [legal_eval_v1]\n", "models.dut"),
    ("tasks:\n  - {name: legal_eval_v1, limit: many}\n", "tasks.0.limit"),
    ("tasks:\n  - {name: legal_eval_v1, generation: 5}\n", "tasks.0.generation"),
    ("tasks:\n  - {name: legal_eval_v1, temperature: 0}\n", "unknown: temperature"),
    ("tasks: [legal_eval_v1\n", "invalid YAML"),
])
def test_bad_run_config_names_file_and_key(tmp_path, body, words):
    cfg = _config(tmp_path, body)
    with pytest.raises(GageError) as err:
        build_options(tasks=None, model=None, model_args=None, judge_model=None, judge_args=None, batch_size=None,
                      limit=None, output_dir=None, run_id=None, include_paths=[], data=[], config_file=str(cfg),
                      seed=None, fail_fast=False, quiet=True, command="")
    assert str(cfg) in str(err.value) and words in str(err.value)


def test_override_that_breaks_the_task_is_refused(tmp_path, run_cli):
    cfg = _config(tmp_path, """\
        models: {dut: {backend: dummy}}
        tasks:
          - {name: legal_eval_v1, generation: {max_new_tokens: 0}}
        """)
    result = run_cli("--config", cfg, "-o", tmp_path / "runs", "-q")
    assert result.exit_code == 3  # the task cannot run
    assert "legal_eval_v1" in result.output and "max_new_tokens" in result.output
