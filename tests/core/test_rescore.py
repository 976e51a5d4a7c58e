"""``gage-eval rescore``: metrics (and judges, when asked) computed again from a run's stored
outputs, without the model. With nothing changed the new summary's tasks equal the original's."""
from __future__ import annotations

import json
import shutil
import sys
import zlib
from pathlib import Path

import pytest
from click.testing import CliRunner

from gage_eval.api import hookimpl
from gage_eval.engine.rescore import rescore_command
from gage_plugins_builtin.backends.dummy import DummyBackend

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "golden"))

import golden  # noqa: E402

TEST_TASKS = ROOT / "tests" / "data"


def rescore(*args) -> object:
    return CliRunner().invoke(rescore_command, [str(a) for a in args], catch_exceptions=False)


def tasks_part(run: Path) -> dict:
    """summary.json's tasks, timings left out."""
    tasks = json.loads((run / "summary.json").read_text(encoding="utf-8"))["tasks"]
    return {name: {k: v for k, v in entry.items() if k != "timings"} for name, entry in tasks.items()}


def records(run: Path, task: str) -> list[dict]:
    return [json.loads(line) for line in (run / "samples" / f"{task}.jsonl").read_text(encoding="utf-8").splitlines()]


def write_records(run: Path, task: str, recs: list[dict]) -> None:
    (run / "samples" / f"{task}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")


def validate_summary(run: Path) -> None:
    from gage_eval.api.schemas import validation_errors

    assert validation_errors(json.loads((run / "summary.json").read_text()), "summary") == []


@pytest.fixture
def piqa_run(tmp_path, run_cli):
    result = run_cli("--tasks", "piqa", "--model", "dummy", "--limit", 12, "-o", tmp_path, "--run-id", "src", "-q")
    assert result.exit_code == 0, result.output
    return tmp_path / "src"


# -- with nothing changed, every builtin task's summary is the original's ----------------------

def test_every_builtin_task_rescored_unchanged_equals_the_original(tmp_path, run_cli):
    if not golden.SHARED_DATA.is_dir():
        pytest.skip(f"needs the shared data at {golden.SHARED_DATA}")
    pytest.importorskip("pyarrow", reason="the MMMU slice is written as parquet")
    data = golden.write_slices(golden.SHARED_DATA, tmp_path / "slices")
    args = ["--tasks", ",".join(golden.TASKS), "--model", "dummy", "--judge-model", "dummy",
            "--judge-args", golden.JUDGE_ARGS, "--limit", golden.PIQA_ROWS, "-o", tmp_path, "--run-id", "src", "-q"]
    for task, path in data.items():
        args += ["--data", f"{task}={path}"]
    result = run_cli(*args)
    assert result.exit_code == 0, result.output
    src, new = tmp_path / "src", tmp_path / "new"
    result = rescore(src, "-o", new, "-q")
    assert result.exit_code == 0, result.output
    before, after = tasks_part(src), tasks_part(new)
    assert list(after) == list(golden.TASKS)
    for task in golden.TASKS:
        assert after[task] == before[task], task
        assert before[task]["counts"]["scored"] > 0
        # the records too, byte for byte (the stored model output and judge verdicts kept)
        assert (new / "samples" / f"{task}.jsonl").read_bytes() == (src / "samples" / f"{task}.jsonl").read_bytes()
        assert (new / "instances" / f"{task}.jsonl").is_file()
    assert before["legal_eval_v1"]["metrics"]["judge_score"]["n"] > 0  # the judged rows were rescored too
    validate_summary(new)
    config = json.loads((new / "config.json").read_text())
    assert config["command"].startswith(f"gage-eval rescore {src.resolve()} ")
    summary = json.loads((new / "summary.json").read_text())
    source = json.loads((src / "summary.json").read_text())
    assert summary["run"]["model"]["model_id"] == source["run"]["model"]["model_id"]
    start = json.loads((new / "events.jsonl").read_text().splitlines()[0])
    assert start["event"] == "run_start" and start["rescored_from"] == str(src.resolve())
    # one task of a run whose tasks read --data files
    result = rescore(src, "--task", "mmmu", "-o", tmp_path / "one", "-q")
    assert result.exit_code == 0, result.output
    assert tasks_part(tmp_path / "one") == {"mmmu": before["mmmu"]}
    assert list(json.loads((tmp_path / "one" / "config.json").read_text())["data"]) == ["mmmu"]


def test_piqa_with_acc_mutual_info_rescored_unchanged(tmp_path, run_cli):
    result = run_cli("--tasks", "piqa_mi", "--include-path", TEST_TASKS, "--model", "dummy", "-o", tmp_path,
                     "--run-id", "src", "-q")
    assert result.exit_code == 0, result.output
    result = rescore(tmp_path / "src", "-o", tmp_path / "new", "-q")
    assert result.exit_code == 0, result.output
    before, after = tasks_part(tmp_path / "src"), tasks_part(tmp_path / "new")
    assert after == before
    assert before["piqa_mi"]["metrics"]["acc_mutual_info"]["n"] == before["piqa_mi"]["counts"]["scored"] > 0


# -- what is recomputed and what is kept -------------------------------------------------------

def test_metric_errors_are_recomputed_inference_errors_kept(tmp_path, run_cli):
    result = run_cli("--tasks", "piqa", "--model", "dummy", "--model-args", "fail_every=4", "--limit", 12,
                     "-o", tmp_path, "--run-id", "src", "-q", "--max-error-rate", "0.5")
    assert result.exit_code == 0, result.output
    src = tmp_path / "src"
    original = tasks_part(src)
    assert original["piqa"]["counts"]["errored"] == 3
    # a row whose metric failed then: its record holds the model output and a metric error
    recs = records(src, "piqa")
    i = next(i for i, r in enumerate(recs) if "error" not in r["eval_result"])
    recs[i]["eval_result"] = {"error": {"stage": "metric", "message": "acc: boom", "locator": "x.jsonl:1"}}
    write_records(src, "piqa", recs)
    result = rescore(src, "-o", tmp_path / "new", "-q")
    assert result.exit_code == 0, result.output
    assert tasks_part(tmp_path / "new") == original  # the metric error is gone, the inference errors stay
    new = records(tmp_path / "new", "piqa")
    assert [r["eval_result"].get("error") for r in new if r["eval_result"].get("error")] == \
        [r["eval_result"]["error"] for r in recs if r["eval_result"].get("error", {}).get("stage") == "inference"]


def test_metrics_option_replaces_the_metrics_and_changes_nothing_else(tmp_path, run_cli, shared_data):
    docvqa = shared_data / golden.DOCVQA
    result = run_cli("--tasks", "docvqa", "--model", "dummy", "--model-args", "response=echo", "--data",
                     f"docvqa={docvqa}", "-o", tmp_path, "--run-id", "src", "-q")
    assert result.exit_code == 0, result.output
    result = rescore(tmp_path / "src", "--metrics", "anls,exact_match", "-o", tmp_path / "new", "-q")
    assert result.exit_code == 0, result.output
    before, after = tasks_part(tmp_path / "src")["docvqa"], tasks_part(tmp_path / "new")["docvqa"]
    assert list(after["metrics"]) == ["anls", "exact_match"]
    assert after["metrics"]["anls"] == before["metrics"]["anls"]  # the task's own entry, with its arguments
    assert after["metrics"]["exact_match"]["n"] == before["counts"]["scored"]
    for key in ("counts", "status", "errors_by_stage", "primary_metric", "source"):
        assert after[key] == before[key], key
    for tag, groups in before["slices"].items():
        for group, metrics in groups.items():
            assert after["slices"][tag][group]["anls"] == metrics["anls"]
    # the model outputs are the stored ones
    assert [r["predict_result"] for r in records(tmp_path / "new", "docvqa")] == \
        [r["predict_result"] for r in records(tmp_path / "src", "docvqa")]
    config = json.loads((tmp_path / "new" / "config.json").read_text())
    assert config["task_overrides"]["docvqa"]["metrics"][1] == "exact_match"
    # only exact_match: it becomes the primary metric
    result = rescore(tmp_path / "src", "--metrics", "exact_match", "-o", tmp_path / "new2", "-q")
    assert result.exit_code == 0, result.output
    only = tasks_part(tmp_path / "new2")["docvqa"]
    assert list(only["metrics"]) == ["exact_match"] and only["primary_metric"] == "exact_match"
    assert only["metrics"]["exact_match"] == after["metrics"]["exact_match"]


class KeyedDummy(DummyBackend):
    """The dummy backend with an api_key, as a network judge would take one."""

    def __init__(self, api_key: str = "", **kwargs):
        super().__init__(**kwargs)
        self.secrets = (api_key,)


class KeyedPlugin:
    @hookimpl
    def gage_register_backends(self, register):
        register("keyed_dummy", KeyedDummy)


def test_judge_runs_again_with_judge_model_and_its_secret_is_masked(tmp_path, run_cli, shared_data, fresh_plugins):
    fresh_plugins.register_plugin(KeyedPlugin(), "keyed-test")
    legal = golden.write_slices(shared_data, tmp_path / "slices")["legal_eval_v1"]
    result = run_cli("--tasks", "legal_eval_v1", "--model", "dummy", "--judge-model", "dummy", "--judge-args",
                     golden.JUDGE_ARGS, "--data", f"legal_eval_v1={legal}", "-o", tmp_path, "--run-id", "src", "-q")
    assert result.exit_code == 0, result.output
    secret = "sk-rescore-secret-123456"
    result = rescore(tmp_path / "src", "--judge-model", "keyed_dummy", "--judge-args",
                     f"response=fixed,text=Verdict: incorrect,api_key={secret}", "-o", tmp_path / "new", "-q")
    assert result.exit_code == 0, result.output
    before, after = tasks_part(tmp_path / "src")["legal_eval_v1"], tasks_part(tmp_path / "new")["legal_eval_v1"]
    assert before["metrics"]["judge_score"]["value"] == 1.0
    assert after["metrics"]["judge_score"]["value"] == 0.0
    assert after["metrics"]["choice_set_match"] == before["metrics"]["choice_set_match"]  # mcq rows: no judge
    assert after["counts"] == before["counts"]
    config = json.loads((tmp_path / "new" / "config.json").read_text())
    assert config["judge_model"] == "keyed_dummy" and config["judge_args"]["api_key"] == "***"
    for path in (tmp_path / "new").rglob("*"):
        if path.is_file():
            assert secret not in path.read_text(encoding="utf-8", errors="replace"), path
    assert secret not in result.output
    summary = json.loads((tmp_path / "new" / "summary.json").read_text())
    assert summary["run"]["judge"]["args"]["api_key"] == "***"
    validate_summary(tmp_path / "new")


class AnswerJudge(DummyBackend):
    """A judge whose verdict follows what it is asked (so each repeated answer gets its own):
    correct when the prompt's crc32 is even (odd with ``flip``)."""

    def __init__(self, flip: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.flip = bool(int(flip))

    def run(self, requests):
        from gage_eval.api.backend import ModelOutput

        outs = []
        for req in requests:
            asked = json.dumps(req.messages if req.messages is not None else req.prompt, sort_keys=True)
            good = (zlib.crc32(asked.encode()) % 2 == 0) != self.flip
            outs.append(ModelOutput(text=f"Verdict: {'correct' if good else 'incorrect'}"))
        return outs


class AnswerJudgePlugin:
    @hookimpl
    def gage_register_backends(self, register):
        register("answer_judge", AnswerJudge)


def test_judge_model_judges_every_answer_of_a_repeated_row(tmp_path, run_cli, fresh_plugins):
    """--judge-model on a run with --repeats: each of a row's answers is judged again (its own
    prompt and verdict in eval_result.repeats), and the row's mean, pass@k and maj@k come from them."""
    fresh_plugins.register_plugin(AnswerJudgePlugin(), "answer-judge-test")
    result = run_cli("--tasks", "legal_eval_v1", "--model", "dummy", "--model-args", "response=letter",
                     "--judge-model", "answer_judge", "--repeats", 3, "-o", tmp_path, "--run-id", "src", "-q")
    assert result.exit_code == 0, result.output
    src = records(tmp_path / "src", "legal_eval_v1")
    judged = [r for r in src if r["task_type"] != "mcq"]
    assert judged and all(len(r["eval_result"]["repeats"]) == 3 for r in src)
    scores = [rep["judge"]["score"] for r in judged for rep in r["eval_result"]["repeats"]]
    assert 0 < sum(s >= 0.7 for s in scores) < len(scores)  # the answers' verdicts differ
    same = rescore(tmp_path / "src", "--judge-model", "answer_judge", "-o", tmp_path / "same", "-q")
    assert same.exit_code == 0, same.output
    assert records(tmp_path / "same", "legal_eval_v1") == src
    assert tasks_part(tmp_path / "same") == tasks_part(tmp_path / "src")
    flipped = rescore(tmp_path / "src", "--judge-model", "answer_judge", "--judge-args", "flip=1",
                      "-o", tmp_path / "flip", "-q")
    assert flipped.exit_code == 0, flipped.output
    for was, now in zip(src, records(tmp_path / "flip", "legal_eval_v1")):
        assert now["predict_result"] == was["predict_result"]  # every answer kept
        reps, old = now["eval_result"]["repeats"], was["eval_result"]["repeats"]
        assert len(reps) == 3
        if was["task_type"] == "mcq":  # no judge: scored as before
            assert now["eval_result"] == was["eval_result"]
            continue
        for r, (rep, before) in enumerate(zip(reps, old)):
            assert rep["judge"]["prompts"] == before["judge"]["prompts"]  # asked about answer r again
            if was["task_type"] == "reference_qa":
                assert rep["judge"]["score"] == 1.0 - before["judge"]["score"]
        passed = [rep["overall"]["passed"] for rep in reps]
        metrics = now["eval_result"]["metrics"]
        assert metrics["pass@1"]["value"] == pytest.approx(sum(passed) / 3)
        assert metrics["pass@3"]["value"] == float(any(passed))
        assert metrics["maj@3"]["value"] == float(passed[metrics["maj@3"]["repeat"]])
        assert metrics["score"]["repeats"] == [rep["metrics"]["score"]["value"] for rep in reps]
    summary = tasks_part(tmp_path / "flip")["legal_eval_v1"]
    assert summary["metrics"]["judge_score"]["n"] == len(judged)
    validate_summary(tmp_path / "flip")


def test_a_repeated_row_whose_judge_failed_keeps_every_answer_and_is_judged_again(tmp_path, run_cli):
    """One answer's judge error fails its row, whose record still holds all n answers and their
    scores; --judge-model judges them all again, giving the run a judge that never failed gives."""
    base = ["--tasks", "legal_eval_v1", "--model", "dummy", "--model-args", "response=letter", "--judge-model",
            "dummy", "--repeats", 3, "-o", tmp_path, "-q", "--max-error-rate", 1]
    assert run_cli(*base, "--judge-args", golden.JUDGE_ARGS, "--run-id", "clean").exit_code == 0
    assert run_cli(*base, "--judge-args", golden.JUDGE_ARGS + ",fail_every=2", "--run-id", "src").exit_code == 0
    clean, src = records(tmp_path / "clean", "legal_eval_v1"), records(tmp_path / "src", "legal_eval_v1")
    failed = [r for r in src if r["eval_result"].get("error")]
    assert failed and all(r["eval_result"]["error"]["stage"] == "judge" for r in failed)
    for rec in failed:
        assert [p["index"] for p in rec["predict_result"]] == [0, 1, 2]
        assert len(rec["eval_result"]["repeats"]) == 3
    result = rescore(tmp_path / "src", "--judge-model", "dummy", "--judge-args", golden.JUDGE_ARGS,
                     "-o", tmp_path / "new", "-q")
    assert result.exit_code == 0, result.output
    new = records(tmp_path / "new", "legal_eval_v1")
    assert [r["eval_result"] for r in new] == [r["eval_result"] for r in clean]
    assert [[p["message"] for p in r["predict_result"]] for r in new] == \
        [[p["message"] for p in r["predict_result"]] for r in clean]
    assert tasks_part(tmp_path / "new") == tasks_part(tmp_path / "clean")


def test_task_option_rescores_one_task(tmp_path, run_cli):
    result = run_cli("--tasks", "piqa,piqa_mi", "--include-path", TEST_TASKS, "--model", "dummy", "-o", tmp_path,
                     "--run-id", "src", "-q")
    assert result.exit_code == 0, result.output
    result = rescore(tmp_path / "src", "--task", "piqa_mi", "-o", tmp_path / "new", "-q")
    assert result.exit_code == 0, result.output
    assert tasks_part(tmp_path / "new") == {"piqa_mi": tasks_part(tmp_path / "src")["piqa_mi"]}
    assert not (tmp_path / "new" / "samples" / "piqa.jsonl").exists()


def test_a_changed_task_folder_is_warned_about(tmp_path, run_cli):
    tasks = tmp_path / "tasks"
    shutil.copytree(TEST_TASKS / "piqa_mi", tasks / "piqa_mi")
    task_file = tasks / "piqa_mi" / "task.yaml"
    task_file.write_text(task_file.read_text().replace("../../../tasks/piqa/sample.jsonl",
                                                       str(ROOT / "tasks" / "piqa" / "sample.jsonl")))
    result = run_cli("--tasks", "piqa_mi", "--include-path", tasks, "--model", "dummy", "-o", tmp_path,
                     "--run-id", "src", "-q")
    assert result.exit_code == 0, result.output
    (tasks / "piqa_mi" / "prompt.jinja").write_text((tasks / "piqa_mi" / "prompt.jinja").read_text() + "\n")
    result = CliRunner().invoke(rescore_command, [str(tmp_path / "src"), "-o", str(tmp_path / "new"),
                                                                  "-q"])
    assert result.exit_code == 0, result.output
    assert f"task folder {tasks / 'piqa_mi'} (piqa_mi) changed" in result.stderr


# -- refusals ----------------------------------------------------------------------------------

def test_a_folder_that_is_no_run_is_refused(tmp_path):
    (tmp_path / "nothing").mkdir()
    for path in (tmp_path / "nothing", tmp_path / "missing"):
        result = CliRunner().invoke(rescore_command, [str(path), "-o", str(tmp_path / "new")])
        assert result.exit_code == 2
        assert str(path) in result.stderr and "not a gage-eval run folder" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "new").exists()


def test_an_existing_new_dir_is_refused(piqa_run, tmp_path):
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "keep.txt").write_text("mine")
    result = CliRunner().invoke(rescore_command, [str(piqa_run), "-o", str(tmp_path / "new")])
    assert result.exit_code == 2 and "exists" in result.stderr and str(tmp_path / "new") in result.stderr
    assert [p.name for p in (tmp_path / "new").iterdir()] == ["keep.txt"]
    result = CliRunner().invoke(rescore_command, [str(piqa_run), "-o", str(piqa_run)])
    assert result.exit_code == 2


def test_an_unknown_task_or_metric_is_refused(piqa_run, tmp_path):
    result = CliRunner().invoke(rescore_command, [str(piqa_run), "--task", "nope", "-o",
                                                                  str(tmp_path / "new")])
    assert result.exit_code == 2 and "nope" in result.stderr and "piqa" in result.stderr
    result = CliRunner().invoke(rescore_command, [str(piqa_run), "--metrics", "acc,no_such_metric",
                                                                  "-o", str(tmp_path / "new")])
    assert result.exit_code == 2 and "no_such_metric" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    result = CliRunner().invoke(rescore_command, [str(piqa_run), "--judge-args", "a=1", "-o",
                                                                  str(tmp_path / "new")])
    assert result.exit_code == 2 and "--judge-model" in result.stderr
    assert not (tmp_path / "new").exists()


def test_rescoring_a_rescored_run_and_its_metric_subset(piqa_run, tmp_path):
    result = rescore(piqa_run, "--metrics", "acc_norm", "-o", tmp_path / "a", "-q")
    assert result.exit_code == 0, result.output
    after = tasks_part(tmp_path / "a")["piqa"]
    assert list(after["metrics"]) == ["acc_norm"] and after["primary_metric"] == "acc_norm"
    assert after["metrics"]["acc_norm"] == tasks_part(piqa_run)["piqa"]["metrics"]["acc_norm"]
    result = rescore(tmp_path / "a", "-o", tmp_path / "b", "-q")  # its config carries the override
    assert result.exit_code == 0, result.output
    assert tasks_part(tmp_path / "b") == tasks_part(tmp_path / "a")


def test_a_data_file_gone_since_the_run_is_not_needed(tmp_path, run_cli):
    data = tmp_path / "rows.jsonl"
    data.write_text("".join((ROOT / "tasks" / "piqa" / "sample.jsonl").read_text().splitlines(True)[:6]))
    result = run_cli("--tasks", "piqa", "--model", "dummy", "--data", f"piqa={data}", "-o", tmp_path,
                     "--run-id", "src", "-q")
    assert result.exit_code == 0, result.output
    data.unlink()
    result = CliRunner().invoke(rescore_command, [str(tmp_path / "src"), "-o", str(tmp_path / "new"), "-q"])
    assert result.exit_code == 0, result.stderr
    assert f"its data {data} is gone" in result.stderr
    assert tasks_part(tmp_path / "new") == tasks_part(tmp_path / "src")
    inputs = json.loads((tmp_path / "new" / "inputs.json").read_text())
    source = json.loads((tmp_path / "src" / "inputs.json").read_text())
    assert str(data) in inputs["piqa"]["data"]  # the rows scored are the run's
    assert inputs["piqa"]["data"] == source["piqa"]["data"]


def test_judge_errors_are_judged_again_with_judge_model(tmp_path, run_cli, shared_data):
    legal = golden.write_slices(shared_data, tmp_path / "slices")["legal_eval_v1"]
    base = ["--tasks", "legal_eval_v1", "--model", "dummy", "--judge-model", "dummy", "--data",
            f"legal_eval_v1={legal}", "-o", tmp_path, "-q", "--max-error-rate", "1"]
    assert run_cli(*base, "--judge-args", golden.JUDGE_ARGS, "--run-id", "clean").exit_code == 0
    assert run_cli(*base, "--judge-args", golden.JUDGE_ARGS + ",fail_every=2", "--run-id", "src").exit_code == 0
    flaky = tasks_part(tmp_path / "src")["legal_eval_v1"]
    assert flaky["counts"]["judge_errors"] > 0
    kept = rescore(tmp_path / "src", "-o", tmp_path / "kept", "-q")  # without --judge-model: kept as they were
    assert kept.exit_code == 0 and tasks_part(tmp_path / "kept")["legal_eval_v1"] == flaky
    result = rescore(tmp_path / "src", "--judge-model", "dummy", "--judge-args", golden.JUDGE_ARGS,
                     "-o", tmp_path / "new", "-q")
    assert result.exit_code == 0, result.output
    assert tasks_part(tmp_path / "new") == tasks_part(tmp_path / "clean")


def test_the_rescored_run_has_its_own_report(piqa_run, tmp_path, run_cli):
    """report.html of the new folder shows the rescored metrics (written as a run writes it), and
    a run made with --no-report gets none."""
    result = rescore(piqa_run, "--metrics", "acc_norm", "-o", tmp_path / "new", "-q")
    assert result.exit_code == 0, result.output
    page = (tmp_path / "new" / "report.html").read_text(encoding="utf-8")
    assert "acc_norm" in page and "new" in page
    quiet = run_cli("--tasks", "piqa", "--model", "dummy", "--limit", 5, "-o", tmp_path, "--run-id", "bare", "-q",
                    "--no-report")
    assert quiet.exit_code == 0
    assert rescore(tmp_path / "bare", "-o", tmp_path / "bare2", "-q").exit_code == 0
    assert not (tmp_path / "bare2" / "report.html").exists()
