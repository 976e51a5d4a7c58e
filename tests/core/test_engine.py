"""The engine's error accounting, streaming outputs, --data, --fail-fast and bad input handling."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gage_eval.api.schemas import validation_errors

GOOD = {"goal": "Open a jar.", "sol1": "Twist the lid.", "sol2": "Freeze the jar.", "label": 0}


def write_rows(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(l) for l in path.read_text().splitlines() if l.strip()]


def test_piqa_dummy_writes_four_valid_outputs(tmp_path, run_cli):
    result = run_cli("--tasks", "piqa", "--model", "dummy", "--limit", 20, "-o", tmp_path, "--run-id", "r")
    assert result.exit_code == 0, result.output
    run = tmp_path / "r"
    assert {p.name for p in run.iterdir()} >= {"samples", "instances", "summary.json", "events.jsonl"}
    instances = read_jsonl(run / "instances" / "piqa.jsonl")
    assert len(instances) == 20
    assert all(validation_errors(i, "instance") == [] for i in instances)
    samples = read_jsonl(run / "samples" / "piqa.jsonl")
    assert all(validation_errors(s, "sample") == [] for s in samples)
    summary = json.loads((run / "summary.json").read_text())
    assert validation_errors(summary, "summary") == []
    task = summary["tasks"]["piqa"]
    assert task["counts"] == {"total": 20, "scored": 20, "errored": 0, "skipped": 0, "judge_errors": 0}
    assert set(task["metrics"]) == {"acc", "acc_norm"}
    acc = sum(s["eval_result"]["metrics"]["acc"]["value"] for s in samples) / 20
    assert task["metrics"]["acc"]["value"] == pytest.approx(acc)
    for key in ("dataset_materialization_s", "inference_s", "evaluation_s", "wall_runtime_s",
                "throughput_total_samples_per_s", "latency_total_ms_per_sample"):
        assert key in summary["run"]["timings"]
    validate = run_cli("validate", run / "instances" / "piqa.jsonl", "--schema", "instance")
    assert validate.exit_code == 0 and "20 valid, 0 invalid" in validate.output


def test_malformed_rows_reported_and_good_rows_scored(tmp_path, run_cli):
    data = write_rows(tmp_path / "rows.jsonl", [
        json.dumps(GOOD),
        '{"goal": "broken json", ',
        json.dumps({"goal": "No answer field", "sol1": "a", "sol2": "b"}) .replace('"sol2": "b"', '"sol2": "b", "label": 5'),
        json.dumps({"sol1": "a", "sol2": "b", "label": 0}),
        json.dumps({"goal": 42, "sol1": "a", "sol2": "b", "label": 1}),
        json.dumps({"goal": "Wrong choice type", "sol1": ["a"], "sol2": "b", "label": 1}),
        "[1, 2, 3]",
        json.dumps({**GOOD, "goal": "Another good one."}),
    ])
    result = run_cli("--tasks", "piqa", "--model", "dummy", "--data", f"piqa={data}", "-o", tmp_path, "--run-id", "r")
    assert result.exit_code == 1, result.output  # finished, with rows errored
    assert "Traceback" not in result.output
    for line, what in [(2, "invalid JSON"), (3, "outside the 2 choices"), (4, "missing field 'goal'"),
                       (5, "question must be a string"), (6, "must be a string"), (7, "expected a JSON object")]:
        assert f"rows.jsonl:{line}:" in result.output and what in result.output, (line, what, result.output)
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    counts = summary["tasks"]["piqa"]["counts"]
    assert counts["total"] == 8 and counts["scored"] == 2 and counts["errored"] == 6
    samples = read_jsonl(tmp_path / "r" / "samples" / "piqa.jsonl")
    assert len(samples) == 8  # every row is written: scored, or with its error
    errors = [s["eval_result"]["error"] for s in samples if "error" in s["eval_result"]]
    assert sorted(e["locator"].rsplit(":", 1)[1] for e in errors) == ["2", "3", "4", "5", "6", "7"]
    events = read_jsonl(tmp_path / "r" / "events.jsonl")
    assert sum(e["event"] == "sample_error" for e in events) == 6
    instances = read_jsonl(tmp_path / "r" / "instances" / "piqa.jsonl")
    assert len(instances) == 8 and sum(1 for i in instances if i.get("error")) == 6
    assert all(validation_errors(i, "instance") == [] for i in instances)


def test_backend_and_metric_errors_are_counted(tmp_path, run_cli):
    data = write_rows(tmp_path / "rows.jsonl", [json.dumps({**GOOD, "goal": f"q{i}"}) for i in range(10)])
    result = run_cli("--tasks", "piqa", "--model", "dummy", "--model-args", "fail_every=3", "--data",
                     f"piqa={data}", "-o", tmp_path, "--run-id", "r", "-q")
    assert result.exit_code == 1, result.output
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["tasks"]["piqa"]["counts"]["errored"] == 3
    assert summary["tasks"]["piqa"]["errors_by_stage"] == {"inference": 3}
    assert summary["tasks"]["piqa"]["metrics"]["acc"]["n"] == 7


def test_fail_fast_stops_at_first_error(tmp_path, run_cli):
    data = write_rows(tmp_path / "rows.jsonl", [json.dumps(GOOD), "not json", json.dumps(GOOD)])
    result = run_cli("--tasks", "piqa", "--model", "dummy", "--data", f"piqa={data}", "--fail-fast",
                     "-o", tmp_path, "--run-id", "r")
    assert result.exit_code == 1
    assert "rows.jsonl:2" in result.output and "Traceback" not in result.output
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["tasks"]["piqa"]["counts"]["total"] == 2  # the bad row is still written


@pytest.mark.parametrize("args, message", [
    (["--tasks", "nope", "--model", "dummy"], "unknown task(s): nope"),
    (["--tasks", "piqa", "--model", "nope"], "unknown backend 'nope'"),
    (["--tasks", "piqa", "--model", "dummy", "--model-args", "oops"], "expected key=value"),
    (["--tasks", "piqa", "--model", "dummy", "--data", "other=x.jsonl"], "not in --tasks"),
    (["--tasks", "piqa", "--model", "dummy", "--model-args", "colour=red"], "unknown argument(s) colour"),
])
def test_bad_command_lines_are_clear(tmp_path, run_cli, args, message):
    result = run_cli(*args, "-o", tmp_path)
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output


def test_missing_data_file_is_a_usage_error_before_the_run(tmp_path, run_cli):
    result = run_cli("--tasks", "piqa", "--model", "dummy", "--data", "piqa=/no/such.jsonl", "-o", tmp_path,
                     "--run-id", "r")
    assert result.exit_code == 2
    assert "/no/such.jsonl does not exist" in result.stderr and "Traceback" not in result.output
    assert not (tmp_path / "r").exists()


def test_bad_task_file_names_file_and_key(tmp_path, run_cli):
    folder = tmp_path / "tasks" / "bad"
    folder.mkdir(parents=True)
    (folder / "task.yaml").write_text("dataset: {loader: jsonl}\nrequest: {kind: guess}\nmetrics: [acc]\n")
    result = run_cli("--tasks", "bad", "--model", "dummy", "--include-path", tmp_path / "tasks", "-o", tmp_path)
    assert result.exit_code == 3  # that task cannot run
    assert f"{folder / 'task.yaml'}:2: key 'request.kind'" in result.output
    (folder / "task.yaml").write_text("dataset: {loader: jsonl\nrequest: [\n")
    result = run_cli("--tasks", "bad", "--model", "dummy", "--include-path", tmp_path / "tasks", "-o", tmp_path)
    assert result.exit_code == 3 and f"{folder / 'task.yaml'}:" in result.output and "invalid YAML" in result.output


def test_validate_reports_every_bad_row(tmp_path, run_cli):
    good = {"schema_version": "v1", "id": "a", "messages": [{"role": "user", "content": "hi"}], "references": ["x"]}
    data = write_rows(tmp_path / "s.jsonl", [json.dumps(good), json.dumps({**good, "id": 3}), "{oops",
                                             json.dumps({**good, "options": [{"id": "A"}]})])
    result = run_cli("validate", data, "--schema", "sample")
    assert result.exit_code == 1
    assert "s.jsonl:2: $.id: 3 is not of type 'string'" in result.output
    assert "s.jsonl:3: $: invalid JSON" in result.output
    assert "s.jsonl:4: $.options[0]: 'content' is a required property" in result.output
    assert "4 rows, 1 valid, 3 invalid" in result.output


def test_full_piqa_dev_set_with_dummy(tmp_path, run_cli, shared_data):
    data = shared_data / "piqa" / "derived" / "validation.jsonl"
    result = run_cli("--tasks", "piqa", "--model", "dummy", "--data", f"piqa={data}", "-o", tmp_path,
                     "--run-id", "r", "-q")
    assert result.exit_code == 0, result.output
    counts = json.loads((tmp_path / "r" / "summary.json").read_text())["tasks"]["piqa"]["counts"]
    assert counts["scored"] == 1838 and counts["errored"] == 0


def test_help_and_tasks_do_not_import_torch():
    code = ("import sys\nfrom click.testing import CliRunner\nfrom gage_eval.cli import cli\n"
            "for args in (['--help'], ['tasks'], ['plugins']):\n"
            "    r = CliRunner().invoke(cli, args)\n    assert r.exit_code == 0, r.output\n"
            "heavy = [m for m in ('torch', 'transformers', 'vllm', 'aiohttp', 'datasets') if m in sys.modules]\n"
            "assert not heavy, heavy\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_run_config_with_roles_and_overrides(tmp_path, run_cli):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("models:\n  dut: {backend: dummy, args: {seed: 7}}\ntasks: [piqa]\nlimit: 4\n")
    result = run_cli("--config", cfg, "-o", tmp_path, "--run-id", "r", "-q")
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["run"]["model"]["settings"]["seed"] == 7
    assert summary["tasks"]["piqa"]["counts"]["total"] == 4
    cfg.write_text("modles: {}\n")
    result = run_cli("--config", cfg, "-o", tmp_path)
    assert result.exit_code == 2 and "unknown key(s) modles" in result.output


def test_include_path_finds_task_folders_in_its_subfolders(tmp_path, run_cli):
    """As lm-eval searches its include path: nested folders, in name order; hidden ones and a task
    folder's own subfolders not searched; a symlink loop visited once."""
    import shutil

    root = tmp_path / "mine"
    for where, name in (("legal/contracts", "deep_task"), ("top", "top_task"), (".hidden/x", "hidden_task"),
                        ("top/inner", "inner_task")):
        shutil.copytree(Path(__file__).resolve().parents[2] / "tasks" / "piqa", root / where, ignore=shutil.ignore_patterns("__pycache__"))
        text = (root / where / "task.yaml").read_text().replace("name: piqa", f"name: {name}", 1)
        (root / where / "task.yaml").write_text(text)
    (root / "legal" / "loop").symlink_to(root)
    listed = run_cli("tasks", "--include-path", root)
    assert listed.exit_code == 0, listed.output
    names = {line.split()[0] for line in listed.output.splitlines() if "--include-path" in line}
    assert names == {"deep_task", "top_task"}  # inner_task is inside top_task's own folder
    result = run_cli("--tasks", "deep_task", "--model", "dummy", "--limit", "2", "--include-path", root,
                     "-o", tmp_path, "--run-id", "r", "-q")
    assert result.exit_code == 0, result.output


def test_a_sibling_whose_variants_repeat_a_name_blocks_no_other_task(tmp_path, run_cli):
    """It stopped every run in its include path (exit 2); now its own tasks are INVALID, named
    by the file's key, and a task beside it runs."""
    import shutil

    piqa = Path(__file__).resolve().parents[2] / "tasks" / "piqa"
    root = tmp_path / "mine"
    for name in ("good", "dup"):
        shutil.copytree(piqa, root / name, ignore=shutil.ignore_patterns("__pycache__"))
        text = (root / name / "task.yaml").read_text().replace("name: piqa", f"name: {name}", 1)
        (root / name / "task.yaml").write_text(text + ("variants:\n  - {x: a}\n  - {x: b}\n" if name == "dup" else ""))
    why = "task.yaml: key 'variants.1': gives task name 'dup' again"
    listed = run_cli("tasks", "--include-path", root)
    assert listed.exit_code == 0 and why in listed.output and "good " in listed.output, listed.output
    good = run_cli("--tasks", "good", "--model", "dummy", "--limit", "2", "--include-path", root, "-o", tmp_path,
                   "--run-id", "g", "-q")
    assert good.exit_code == 0, good.output
    dup = run_cli("--tasks", "dup", "--model", "dummy", "--limit", "2", "--include-path", root, "-o", tmp_path,
                  "--run-id", "d", "-q")
    assert dup.exit_code == 3 and why in dup.output, dup.output
