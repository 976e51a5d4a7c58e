"""A few-shot source a user names (issue 28 part 5): ``--fewshot-data TASK=PATH`` and the run
config's ``fewshot_data`` put that file's rows in the prompts, summary.json says where the
examples came from, a missing path is a usage error before any model, a resume keeps the source
and refuses another; piqa falls back to its invented rows, saying so, when no train split can be
read; the suite's tasks draw from lm-eval's few-shot split."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gage_eval.tasks.fewshot import FewShotConfig
from gage_eval.tasks.spec import read_task_file

ROOT = Path(__file__).resolve().parents[2]
PIQA_ROWS = (ROOT / "tasks" / "piqa" / "sample.jsonl").read_text().splitlines()

# lm-evaluation-harness 0.4.13's few-shot split of each suite task: fewshot_split where its YAML
# sets one (mmlu: dev), else its training_split (ConfigurableTask.fewshot_docs -> Task.fewshot_docs)
LM_EVAL_FEWSHOT_SPLIT = {
    "arc_challenge": "train", "arc_easy": "train", "boolq": "train", "cb": "train", "commonsense_qa": "train",
    "copa": "train", "hellaswag": "train", "mmlu": "dev", "mrpc": "train", "openbookqa": "train",
    "piqa": "train", "rte": "train", "sciq": "train", "siqa": "train", "sst2": "train", "winogrande": "train",
}


def own_shots(tmp_path: Path) -> Path:
    """Three solved rows no shipped source has (piqa's columns)."""
    rows = [{"goal": f"Own goal number {i}.", "sol1": f"Own answer {i}.", "sol2": "Something else.", "label": 0}
            for i in range(3)]
    path = tmp_path / "shots.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run(run_cli, tmp_path: Path, run_id: str, *args) -> tuple:
    out = tmp_path / "runs"
    result = run_cli("--tasks", "piqa", "--model", "dummy", "--limit", "3", "-o", out, "--run-id", run_id, *args)
    return result, out / run_id


def prompts(run_dir: Path) -> list[str]:
    lines = (run_dir / "samples" / "piqa.jsonl").read_text().splitlines()
    return [json.loads(line)["predict_result"][0]["prompt"] for line in lines]


def test_the_flags_file_is_in_every_prompt_and_in_the_summary(run_cli, tmp_path):
    shots = own_shots(tmp_path)
    result, run_dir = run(run_cli, tmp_path, "a", "--num-fewshot", "2", "--fewshot-data", f"piqa={shots}")
    assert result.exit_code == 0, result.output
    got = prompts(run_dir)
    assert len(got) == 3
    for prompt in got:
        assert prompt.count("Question: Own goal number") == 2 and prompt.count("Answer: Own answer") == 2
    source = json.loads((run_dir / "summary.json").read_text())["tasks"]["piqa"]["source"]["fewshot"]
    assert source == {"from": "--fewshot-data", "path": str(shots), "rows": 3}
    assert json.loads((run_dir / "config.json").read_text())["fewshot_data"] == {"piqa": str(shots)}
    assert f"few-shot examples from --fewshot-data {shots}" in result.output


def test_without_it_the_tasks_own_pool_is_drawn_and_said(run_cli, tmp_path):
    result, run_dir = run(run_cli, tmp_path, "a", "--num-fewshot", "2")
    assert result.exit_code == 0, result.output
    assert not any("Own goal" in p for p in prompts(run_dir))
    source = json.loads((run_dir / "summary.json").read_text())["tasks"]["piqa"]["source"]["fewshot"]
    assert source["from"] == "task" and source["split"] == "train" and source["rows"] == 24


def test_a_missing_file_is_a_usage_error_naming_the_flag(run_cli, tmp_path):
    result, run_dir = run(run_cli, tmp_path, "a", "--num-fewshot", "2", "--fewshot-data",
                          f"piqa={tmp_path / 'nope.jsonl'}")
    assert result.exit_code == 2
    assert f"--fewshot-data piqa={tmp_path / 'nope.jsonl'}: " in result.output and "does not exist" in result.output
    assert "loading model" not in result.output and not run_dir.exists()


@pytest.mark.parametrize("value, message", [
    ("piqa", "--fewshot-data 'piqa': expected TASK=PATH"),
    ("hellaswag={shots}", "--fewshot-data names task(s) not in --tasks: hellaswag"),
])
def test_bad_values_are_refused(run_cli, tmp_path, value, message):
    result, _ = run(run_cli, tmp_path, "a", "--num-fewshot", "1", "--fewshot-data",
                    value.format(shots=own_shots(tmp_path)))
    assert result.exit_code == 2 and message in result.output


def test_run_config_keys_top_level_and_per_task(run_cli, tmp_path):
    shots = own_shots(tmp_path)
    for name, body in (("top", f"tasks: [piqa]\nfewshot_data: {{piqa: {shots}}}\n"),
                       ("task", f"tasks:\n  - name: piqa\n    fewshot_data: {shots}\n")):
        config = tmp_path / f"{name}.yaml"
        config.write_text(body + "num_fewshot: 1\n")
        result = run_cli("--config", config, "--model", "dummy", "--limit", "2", "-o", tmp_path / "runs",
                         "--run-id", name)
        assert result.exit_code == 0, result.output
        assert all("Own goal number" in p for p in prompts(tmp_path / "runs" / name))
    config = tmp_path / "bad.yaml"
    config.write_text(f"tasks: [piqa]\nfewshot_data: {{piqa: {tmp_path / 'nope.jsonl'}}}\n")
    result = run_cli("--config", config, "--model", "dummy")
    assert result.exit_code == 2 and "the fewshot_data of task 'piqa'" in result.output


def test_resume_keeps_the_source_and_refuses_another(run_cli, tmp_path):
    shots = own_shots(tmp_path)
    result, run_dir = run(run_cli, tmp_path, "a", "--num-fewshot", "2", "--fewshot-data", f"piqa={shots}")
    assert result.exit_code == 0, result.output
    (run_dir / "samples" / "piqa.jsonl").write_text("")  # every row to run again
    other = tmp_path / "other.jsonl"
    other.write_text("\n".join(PIQA_ROWS[:4]) + "\n")
    refused = run_cli("--resume", run_dir, "--fewshot-data", f"piqa={other}")
    assert refused.exit_code == 2 and "fewshot_data:" in refused.output
    again = run_cli("--resume", run_dir)
    assert again.exit_code == 0, again.output
    assert all(p.count("Own goal number") == 2 for p in prompts(run_dir))


def test_piqa_falls_back_to_its_invented_rows_and_says_so(run_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("GAGE_EVAL_DATA_PACKAGES", str(tmp_path / "no-packages"))  # no package holds train
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result, run_dir = run(run_cli, tmp_path, "a", "--num-fewshot", "1",
                          "--data", f"piqa={ROOT / 'tasks' / 'piqa' / 'sample.jsonl'}")
    assert result.exit_code == 0, result.output
    source = json.loads((run_dir / "summary.json").read_text())["tasks"]["piqa"]["source"]["fewshot"]
    assert source["path"] == str(ROOT / "tasks" / "piqa" / "sample.jsonl") and "invented" in source["note"]
    assert source["instead_of"]["split"] == "train" and source["rows"] == 24
    assert "invented for this project" in result.output and "could not be read" in result.output


@pytest.mark.parametrize("task", sorted(LM_EVAL_FEWSHOT_SPLIT))
def test_suite_tasks_draw_from_lm_evals_split_and_say_it(task):
    section = yaml.safe_load((ROOT / "tasks" / task / "task.yaml").read_text())["fewshot"]  # (mmlu: variants)
    assert section["split"] == LM_EVAL_FEWSHOT_SPLIT[task]
    readme = (ROOT / "tasks" / task / "README.md").read_text()
    assert f"{LM_EVAL_FEWSHOT_SPLIT[task]} split" in readme and "--fewshot-data" in readme


def test_a_task_with_lm_evals_test_split_draws_k_and_leaves_nothing_out():
    """lm-eval 0.4.13 passes the evaluated doc to its sampler only when the few-shot split is the
    test split (ConfigurableTask.fewshot_context); arc, openbookqa and sciq name a test split, so
    they draw K with one Random(1234) per task, the row at position i getting the i-th draw."""
    import random

    from gage_eval.tasks.fewshot import FewShotSampler

    pool = [{"id": str(i), "messages": [{"role": "user", "content": f"q{i}"}], "options": [], "references": []}
            for i in range(10)]
    sampler = FewShotSampler(pool, 3, seed=1234, leave_out=False)
    rnd = random.Random(1234)
    for index in range(4):
        expected = [pool[i] for i in rnd.sample(range(10), 3)]
        assert sampler.examples(pool[0], index) == expected  # the evaluated pool[0] may be among them
    assert FewShotConfig.from_spec(read_task_file(ROOT / "tasks" / "arc_easy")).leave_out_evaluated is False
    assert FewShotConfig.from_spec(read_task_file(ROOT / "tasks" / "piqa")).leave_out_evaluated is True


def test_the_flag_without_num_fewshot_is_said_to_draw_nothing(run_cli, tmp_path):
    result, run_dir = run(run_cli, tmp_path, "a", "--fewshot-data", f"piqa={own_shots(tmp_path)}")
    assert result.exit_code == 0, result.output
    assert "--fewshot-data is read only with --num-fewshot K" in result.output
    assert not any("Own goal" in p for p in prompts(run_dir))
    assert "fewshot" not in json.loads((run_dir / "summary.json").read_text())["tasks"]["piqa"]["source"]
