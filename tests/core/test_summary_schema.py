"""summary.json has a schema (schemas/summary.schema.json): the summaries of real dummy runs that
finished, errored, failed a task, were interrupted and resumed all validate; a broken summary fails
naming the key; `gage-eval validate FILE --schema summary` checks one JSON object."""
from __future__ import annotations

import copy
import json
from dataclasses import fields
from pathlib import Path

import pytest

from gage_eval.api.schemas import load_schema, validation_errors

GOOD = {"goal": "How do I open a jar?", "sol1": "Twist the lid.", "sol2": "Paint the lid.", "label": 0}


def rows_file(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({**GOOD, "goal": f"q{i}"}) + "\n" for i in range(n)))
    return path


def summary_of(run_dir: Path) -> dict:
    summary = json.loads((run_dir / "summary.json").read_text())
    assert validation_errors(summary, "summary") == []
    return summary


@pytest.fixture(scope="module")
def piqa_summary(tmp_path_factory) -> dict:
    from gage_eval.engine.loop import Engine, RunOptions

    run_dir = tmp_path_factory.mktemp("ok") / "r"
    run_dir.mkdir()
    Engine(RunOptions(tasks=["piqa"], model="dummy", limit=5, quiet=True), run_dir).run()
    return summary_of(run_dir)


def test_finished_run_validates(piqa_summary):
    assert piqa_summary["tasks"]["piqa"]["status"] == "ok" and piqa_summary["run"]["exit_status"] == 0


def test_rows_errored_and_failed_task_validate(tmp_path, run_cli):
    data = rows_file(tmp_path / "rows.jsonl", 6)
    (tmp_path / "bad.jsonl").write_text("not json\n" + json.dumps(GOOD) + "\n")
    result = run_cli("--tasks", "piqa", "--model", "dummy", "--model-args", "fail_every=3", "--data",
                     f"piqa={data}", "-o", tmp_path, "--run-id", "errors", "-q")
    assert result.exit_code == 1, result.output
    task = summary_of(tmp_path / "errors")["tasks"]["piqa"]
    assert task["status"] == "errors" and task["errors_by_stage"] == {"inference": 2}
    (tmp_path / "empty.jsonl").write_text("")
    result = run_cli("--tasks", "piqa", "--model", "dummy", "--data", f"piqa={tmp_path / 'empty.jsonl'}", "-o",
                     tmp_path, "--run-id", "failed", "-q")  # (a missing file is refused before the run, exit 2)
    assert result.exit_code == 3, result.output
    summary = summary_of(tmp_path / "failed")
    assert summary["tasks"]["piqa"]["status"] == "failed" and summary["tasks"]["piqa"]["metrics"] == {}
    result = run_cli("--tasks", "piqa", "--model", "dummy", "--model-args", "fail_every=1", "--data",
                     f"piqa={data}", "-o", tmp_path, "--run-id", "allerrored", "-q")
    assert result.exit_code == 3, result.output
    task = summary_of(tmp_path / "allerrored")["tasks"]["piqa"]
    assert task["status"] == "failed" and task["counts"]["errored"] == 6


def test_broken_task_file_validates(tmp_path, run_cli):
    folder = tmp_path / "tasks" / "bad"
    folder.mkdir(parents=True)
    (folder / "task.yaml").write_text("dataset: {loader: jsonl}\nrequest: {kind: guess}\nmetrics: [acc]\n")
    result = run_cli("--tasks", "bad,piqa", "--model", "dummy", "--limit", 3, "--include-path",
                     tmp_path / "tasks", "-o", tmp_path, "--run-id", "bad", "-q")
    assert result.exit_code == 3, result.output
    summary = summary_of(tmp_path / "bad")
    assert summary["tasks"]["bad"]["status"] == "failed" and summary["tasks"]["piqa"]["status"] == "ok"


@pytest.mark.slow  # (seconds on two cores: left out of the README's quick subset)
def test_judged_run_with_slices_validates(tmp_path, run_cli, shared_data):
    data = shared_data / "legal_eval_v1/data/for_eval/merged_legal_eval_v1.jsonl"
    result = run_cli("--tasks", "legal_eval_v1", "--model", "dummy", "--judge-model", "dummy", "--judge-args",
                     "response=fixed,text=blah", "--data", f"legal_eval_v1={data}",
                     "-o", tmp_path, "--run-id", "r", "-q")
    assert result.exit_code == 1, result.output  # the unreadable verdicts are judge errors
    summary = summary_of(tmp_path / "r")
    assert summary["run"]["judge"]["args"] == {"response": "fixed", "text": "blah"}
    task = summary["tasks"]["legal_eval_v1"]
    assert task["slices"]["task_type"] and task["counts"]["judge_errors"] > 0


def test_interrupted_then_resumed_run_validates(tmp_path, run_cli, monkeypatch):
    from gage_eval.engine.loop import Engine, RunOptions
    from gage_plugins_builtin.backends.dummy import DummyBackend

    data = rows_file(tmp_path / "rows.jsonl", 20)
    one = DummyBackend._one
    calls = []

    def ctrl_c_at_the_eighth(self, req):
        calls.append(1)
        if len(calls) == 8:
            raise KeyboardInterrupt
        return one(self, req)

    monkeypatch.setattr(DummyBackend, "_one", ctrl_c_at_the_eighth)
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    options = RunOptions(tasks=["piqa"], model="dummy", batch_size=2, data={"piqa": str(data)}, quiet=True,
                         output_dir=str(tmp_path), run_id="r")
    with pytest.raises(KeyboardInterrupt):
        Engine(options, run_dir).run()
    summary = summary_of(run_dir)
    assert summary["run"]["interrupted"] and summary["run"]["exit_status"] == 130
    assert 0 < summary["tasks"]["piqa"]["counts"]["total"] < 20
    monkeypatch.setattr(DummyBackend, "_one", one)
    result = run_cli("--resume", run_dir, "-q")
    assert result.exit_code == 0, result.output
    summary = summary_of(run_dir)
    assert summary["run"]["interrupted"] is None and summary["tasks"]["piqa"]["counts"]["total"] == 20


def test_settings_describe_every_core_setting_and_no_plugin_option():
    """The core's settings are each described and required; the plugins' run options (the builtin's
    cache, report, ...) are neither: a run has them only when their plugin was loaded."""
    from gage_eval.config.options import RunOptions

    settings = load_schema("summary")["properties"]["run"]["properties"]["settings"]
    core = {f.name for f in fields(RunOptions)} - {"plugin_options"}  # flattened among the core's
    assert set(settings["properties"]) == set(settings["required"]) == core


@pytest.mark.parametrize("where, change, words", [
    ("missing run", lambda s: s.pop("run"), ["$", "'run' is a required property"]),
    ("missing count", lambda s: s["tasks"]["piqa"]["counts"].pop("scored"),
     ["$.tasks.piqa.counts", "'scored' is a required property"]),
    ("count type", lambda s: s["tasks"]["piqa"]["counts"].__setitem__("total", "5"),
     ["$.tasks.piqa.counts.total", "'5' is not of type 'integer'"]),
    ("status", lambda s: s["tasks"]["piqa"].__setitem__("status", "fine"), ["$.tasks.piqa.status", "'fine'"]),
    ("exit status", lambda s: s["run"].__setitem__("exit_status", None), ["$.run.exit_status", "null is not"]),
    ("unknown key", lambda s: s["run"].__setitem__("extra", 1), ["$.run", "'extra' was unexpected"]),
    ("core setting", lambda s: s["run"]["settings"].__setitem__("seed", "red"), ["$.run.settings.seed", "'red'"]),
    ("missing setting", lambda s: s["run"]["settings"].pop("fewshot_data"),
     ["$.run.settings", "'fewshot_data' is a required property"]),
    ("metric value", lambda s: s["tasks"]["piqa"]["metrics"]["acc"].__setitem__("value", "high"),
     ["$.tasks.piqa.metrics.acc.value", "'high'"]),
])
def test_broken_summary_names_the_key(piqa_summary, where, change, words):
    broken = copy.deepcopy(piqa_summary)
    change(broken)
    problems = validation_errors(broken, "summary")
    assert problems, where
    text = "\n".join(f"{path}: {message}" for path, message in problems)
    assert all(w in text for w in words), text


@pytest.mark.parametrize("change, words", [
    (lambda t: t["counts"].__setitem__("total", 6), "$.tasks.piqa.counts: total 6 is not scored + errored + skipped"),
    (lambda t: t.__setitem__("task", "other"), "$.tasks.piqa.task: 'other' differs from its key 'piqa'"),
    (lambda t: t.__setitem__("errors_by_stage", {"inference": 1}), "$.tasks.piqa.errors_by_stage: adds up to 1"),
])
def test_counts_that_do_not_add_up_are_named(piqa_summary, change, words):
    broken = copy.deepcopy(piqa_summary)
    change(broken["tasks"]["piqa"])
    text = "\n".join(f"{path}: {message}" for path, message in validation_errors(broken, "summary"))
    assert words in text, text


def test_open_where_plugins_add_keys(piqa_summary):
    extended = copy.deepcopy(piqa_summary)
    extended["run"]["model"]["settings"]["anything"] = {"a": 1}
    extended["run"]["model"]["args"]["url"] = "http://x"
    extended["tasks"]["piqa"]["metrics"]["acc"]["ci90"] = [0.1, 0.9]
    extended["run"]["settings"]["colour"] = "red"  # a third-party plugin's run option
    assert "cache" not in piqa_summary["run"]["settings"]  # an Engine run without the builtin's options
    assert validation_errors(extended, "summary") == []


def test_cli_validate_summary(piqa_summary, tmp_path, run_cli):
    good = tmp_path / "summary.json"
    good.write_text(json.dumps(piqa_summary))
    result = run_cli("validate", good, "--schema", "summary")
    assert result.exit_code == 0 and "valid (schema summary)" in result.output, result.output
    broken = copy.deepcopy(piqa_summary)
    del broken["tasks"]["piqa"]["counts"]["total"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(broken))
    result = run_cli("validate", bad, "--schema", "summary")
    assert result.exit_code == 1
    assert f"{bad}: $.tasks.piqa.counts: 'total' is a required property" in result.output
    for name, text, words in [("rows.jsonl", json.dumps(piqa_summary) + "\n{}\n", "invalid JSON"),
                              ("list.json", "[{}]", "expected one JSON object"),
                              ("cut.json", json.dumps(piqa_summary)[:200], "invalid JSON")]:
        (tmp_path / name).write_text(text)
        result = run_cli("validate", tmp_path / name, "--schema", "summary")
        assert result.exit_code == 1 and words in result.output and "Traceback" not in result.output, result.output
