"""--num-fewshot: a task's few-shot source, lm-eval's seeded sampling, the rendered examples, errors."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gage_eval.api import hookimpl
from gage_eval.engine.loop import Engine, RunOptions, TaskRun
from gage_eval.tasks.fewshot import FewShotSampler
from gage_eval.plugins import load_plugins
from gage_eval.tasks.rows import RowChecker
from gage_eval.api.schemas import validation_errors
from gage_eval.tasks.spec import read_task_file

ROOT = Path(__file__).resolve().parents[2]
PIQA = ROOT / "tasks" / "piqa"
LM_EVAL = json.loads(Path(__file__).with_name("lm_eval_fewshot.json").read_text())


def piqa_on_sample_rows(task_yaml: Path) -> None:
    """The copied piqa reads its folder's sample.jsonl (the invented rows, or those the test wrote)
    and draws few-shot examples from it, as the shipped task did before it read real PIQA."""
    text = task_yaml.read_text()
    start, end = text.index("dataset:"), text.index("preprocessor:")
    text = text[:start] + "dataset:\n  loader: jsonl\n  args:\n    path: sample.jsonl\n" + text[end:]
    task_yaml.write_text(text.replace("fewshot:\n", "fewshot:\n  path: sample.jsonl\n", 1)
                         .replace("  split: train\n", "", 1))


def piqa_copy(tmp_path: Path, fewshot: str | None = "  path: sample.jsonl\n", rows: list[str] | None = None,
              name: str = "piqa") -> Path:
    """The shipped piqa task folder, copied, with another ``fewshot:`` body (None: no section)."""
    folder = tmp_path / name
    shutil.copytree(PIQA, folder)
    piqa_on_sample_rows(folder / "task.yaml")
    text = (folder / "task.yaml").read_text()
    start, end = text.index("fewshot:"), text.index("metrics:")
    (folder / "task.yaml").write_text(text[:start] + (f"fewshot:\n{fewshot}" if fewshot is not None else "")
                                      + text[end:])
    if rows is not None:
        (folder / "sample.jsonl").write_text("\n".join(rows) + "\n")
    return folder


def task_run(folder: Path, **options) -> TaskRun:
    _, registry = load_plugins()
    spec = read_task_file(folder)
    return TaskRun(spec, registry, RunOptions(tasks=[spec.name], **options))


def built(folder: Path, order=None, **options) -> list:
    """(request, rendered) for each data row, built as a run builds them (in ``order`` if given)."""
    tr = task_run(folder, **options)
    assert tr.failure is None, tr.failure
    checker = RowChecker(tr.name, tr.preprocess, base_dir=tr.data_dir)
    rows = [(i, checker.check(loc, i, rec).sample) for i, loc, rec in tr.rows()]
    out = {}
    for i, sample in (order(rows) if order else rows):
        out[i] = tr.builder.build(sample, i)
    return [out[i] for i in sorted(out)]


def failure(folder: Path, **options) -> str:
    tr = task_run(folder, **options)
    assert tr.failure is not None
    return tr.failure


SAMPLE_LINES = (PIQA / "sample.jsonl").read_text().splitlines()


# --- the same prompts as lm-evaluation-harness 0.4.13 (tests/core/lm_eval_fewshot_fixture.py) ------

def test_prompts_equal_lm_evals_with_a_separate_pool(tmp_path):
    folder = piqa_copy(tmp_path, "  path: pool.jsonl\n", rows=SAMPLE_LINES[16:])
    (folder / "pool.jsonl").write_text("\n".join(SAMPLE_LINES[:16]) + "\n")
    got = built(folder, num_fewshot=3)
    expected = LM_EVAL["plain_from_train"]
    assert len(got) == len(expected) == 8
    for (request, rendered), lm in zip(got, expected):
        assert request.prompt == lm["context"]
        assert list(request.continuations) == lm["continuations"]
        assert rendered["prompt"] == lm["context"]


def test_prompts_equal_lm_evals_when_the_source_is_the_evaluated_data(tmp_path):
    """The shipped piqa task draws from its own rows: K + 1 drawn, the row itself left out."""
    got = built(PIQA, num_fewshot=3)
    expected = LM_EVAL["plain_same_source"]
    assert [r.prompt for r, _ in got] == [lm["context"] for lm in expected]
    for (request, _), line in zip(got, SAMPLE_LINES):
        goal = json.loads(line)["goal"]
        assert request.prompt.count(f"Question: {goal}\n") == 1  # only as the question asked
        assert request.prompt.count("\n\n") == 3


# --- seeded and reproducible -----------------------------------------------------------------------

def test_same_seed_same_examples_in_any_order_and_on_resume(tmp_path):
    in_order = [r.prompt for r, _ in built(PIQA, num_fewshot=2, seed=7)]
    backwards = [r.prompt for r, _ in built(PIQA, order=lambda rows: list(reversed(rows)), num_fewshot=2, seed=7)]
    resumed = [r.prompt for r, _ in built(PIQA, order=lambda rows: rows[10:] + rows[:10], num_fewshot=2, seed=7)]
    assert in_order == backwards == resumed
    assert len(set(in_order)) == len(in_order)  # each row its own question...
    shots = {p.rsplit("\n\nQuestion: ", 1)[0] for p in in_order}
    assert len(shots) > 10  # ...and different rows get different examples
    other = [r.prompt for r, _ in built(PIQA, num_fewshot=2, seed=8)]
    assert other != in_order
    assert sum(a != b for a, b in zip(other, in_order)) > 10


def test_the_task_files_seed_wins_over_the_runs(tmp_path):
    folder = piqa_copy(tmp_path, "  path: sample.jsonl\n  seed: 7\n")
    assert [r.prompt for r, _ in built(folder, num_fewshot=2, seed=99)] == \
           [r.prompt for r, _ in built(PIQA, num_fewshot=2, seed=7)]


def test_default_seed_is_lm_evals_1234():
    assert RunOptions(tasks=["x"]).seed == 1234


def test_first_n_takes_the_first_rows_but_never_the_row_itself(tmp_path):
    folder = piqa_copy(tmp_path, "  path: sample.jsonl\n  sampler: first_n\n")
    got = [r.prompt for r, _ in built(folder, num_fewshot=2)]
    goals = [json.loads(line)["goal"] for line in SAMPLE_LINES]
    head = lambda p: [q.split("\n")[0][len("Question: "):] for q in p.split("\n\n")[:-1]]  # noqa: E731
    assert head(got[5]) == goals[:2]
    assert head(got[0]) == [goals[1], goals[2]]
    assert head(got[1]) == [goals[0], goals[2]]


def test_sampler_replays_its_stream():
    pool = [{"messages": [{"role": "user", "content": str(i)}]} for i in range(10)]
    one = FewShotSampler(pool, 3, seed=5)
    first = [one.examples({"messages": []}, i) for i in range(6)]
    other = FewShotSampler(pool, 3, seed=5)
    assert other.examples({"messages": []}, 5) == first[5]
    assert other.examples({"messages": []}, 2) == first[2]  # back: the stream starts over
    assert other.examples({"messages": []}, 2) == first[2]


# --- the examples: answer and delimiters ---------------------------------------------------------

def test_generate_task_examples_use_the_reference_and_the_tasks_delimiters(tmp_path):
    folder = tmp_path / "qa"
    folder.mkdir()
    rows = [{"schema_version": "v1", "id": f"q{i}", "messages": [{"role": "user", "content": f"What is {i}+{i}?"}],
             "references": [str(2 * i)]} for i in range(4)]
    (folder / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (folder / "prompt.jinja").write_text("Q: {{ question }}\nA:")
    (folder / "task.yaml").write_text(
        "dataset: {loader: jsonl, args: {path: rows.jsonl}}\n"
        "request: {kind: generate, prompt: prompt.jinja, target_delimiter: '  '}\n"
        "fewshot: {path: rows.jsonl, sampler: first_n, delimiter: \"\\n###\\n\"}\n"
        "metrics: [exact_match]\n")
    got = built(folder, num_fewshot=2)
    assert got[3][0].prompt == "Q: What is 0+0?\nA:  0\n###\nQ: What is 1+1?\nA:  2\n###\nQ: What is 3+3?\nA:"
    assert got[0][0].prompt.startswith("Q: What is 1+1?\nA:  2\n###\nQ: What is 2+2?")


def test_a_samples_own_examples_stay_without_num_fewshot_and_go_with_zero(tmp_path):
    folder = tmp_path / "own"
    folder.mkdir()
    shot = {"messages": [{"role": "user", "content": "2+2?"}], "references": ["4"]}
    row = {"schema_version": "v1", "id": "a", "messages": [{"role": "user", "content": "3+3?"}],
           "references": ["6"], "few_shot_examples": [shot]}
    (folder / "rows.jsonl").write_text(json.dumps(row) + "\n")
    (folder / "task.yaml").write_text("dataset: {loader: jsonl, args: {path: rows.jsonl}}\n"
                                      "request: {kind: generate, chat: true}\nmetrics: [exact_match]\n")
    request, _ = built(folder)[0]
    assert [m["role"] for m in request.messages] == ["user", "assistant", "user"]
    assert request.messages[1]["content"][0]["text"] == "4"
    request, _ = built(folder, num_fewshot=0)[0]
    assert [m["role"] for m in request.messages] == ["user"]


# --- sources: split, errors ----------------------------------------------------------------------

class _Splits:
    def __init__(self, split: str = "test", base_dir: str | None = None):
        goals = {"train": ["Train one.", "Train two.", "Train three."], "test": ["Test one.", "Test two."]}
        self.rows = [{"goal": g, "sol1": "yes", "sol2": "no", "label": 0} for g in goals[split]]
        self.split = split

    def __iter__(self):
        return iter((f"splits[{self.split}][{i}]", r) for i, r in enumerate(self.rows))


@pytest.fixture
def split_loader(fresh_plugins):
    class Plugin:
        @hookimpl
        def gage_register_loaders(self, register):
            register("splits", _Splits)

    fresh_plugins.register_plugin(Plugin(), "test-fewshot-splits")


def test_a_split_of_the_tasks_dataset(tmp_path, split_loader):
    folder = piqa_copy(tmp_path, "  split: train\n  sampler: first_n\n")
    text = (folder / "task.yaml").read_text()
    start, end = text.index("dataset:"), text.index("preprocessor:")
    (folder / "task.yaml").write_text(text[:start] + "dataset:\n  loader: splits\n  args: {split: test}\n"
                                      + text[end:])
    prompts = [r.prompt for r, _ in built(folder, num_fewshot=2)]
    assert prompts[1] == "Question: Train one.\nAnswer: yes\n\nQuestion: Train two.\nAnswer: yes\n\n" \
                         "Question: Test two.\nAnswer:"


@pytest.mark.parametrize("k, sampler, message", [
    (24, "random", "has only 24 rows (K + 1 are drawn"),
    (25, "first_n", "has only 24 rows;"),
])
def test_more_examples_than_the_source_has(tmp_path, k, sampler, message):
    folder = piqa_copy(tmp_path, f"  path: sample.jsonl\n  sampler: {sampler}\n")
    text = failure(folder, num_fewshot=k)
    assert f"--num-fewshot {k}" in text and message in text and "sample.jsonl" in text


def test_first_n_with_every_row_asked_for_is_a_row_error(tmp_path):
    folder = piqa_copy(tmp_path, "  path: sample.jsonl\n  sampler: first_n\n")
    tr = task_run(folder, num_fewshot=24)
    sample = RowChecker("piqa", tr.preprocess, base_dir=folder).check("x", 0, json.loads(SAMPLE_LINES[0])).sample
    with pytest.raises(ValueError, match="only 23 few-shot examples are left"):
        tr.builder.build(sample, 0)


def test_a_task_without_a_source_names_its_file(tmp_path):
    folder = piqa_copy(tmp_path, None)
    text = failure(folder, num_fewshot=2)
    assert "--num-fewshot 2" in text and "no few-shot source" in text and str(folder / "task.yaml") in text
    assert task_run(folder, num_fewshot=0).failure is None
    assert task_run(folder).failure is None


@pytest.mark.parametrize("body, message", [
    ("  path: sample.jsonl\n  split: train\n", "exactly one of 'path'"),
    ("  sampler: first_n\n", "exactly one of 'path'"),
    ("  path: nowhere.jsonl\n", "'nowhere.jsonl' does not exist"),
])
def test_bad_sources_name_the_key(tmp_path, body, message):
    folder = piqa_copy(tmp_path, body)
    text = failure(folder, num_fewshot=1)
    assert f"{folder / 'task.yaml'}: key 'fewshot" in text and message in text


def test_a_bad_row_in_the_source_fails_the_task_with_its_line(tmp_path):
    folder = piqa_copy(tmp_path, "  path: pool.jsonl\n")
    (folder / "pool.jsonl").write_text(SAMPLE_LINES[0] + "\n" + '{"goal": "No choices."}\n' + SAMPLE_LINES[1] + "\n")
    text = failure(folder, num_fewshot=1)
    assert "pool.jsonl:2" in text and "key 'fewshot'" in text


@pytest.mark.parametrize("section, ok", [
    ({"path": "x.jsonl", "sampler": "random", "seed": 3, "delimiter": "\n"}, True),
    ({"split": "train", "sampler": "first_n"}, True),
    ({"path": "x.jsonl", "sampler": "balanced"}, False),
    ({"path": "x.jsonl", "k": 3}, False),
    ({"path": "x.jsonl", "seed": "one"}, False),
])
def test_schema_of_the_fewshot_key(section, ok):
    task = {"dataset": {"loader": "jsonl"}, "request": {"kind": "loglikelihood"}, "metrics": ["acc"],
            "fewshot": section}
    assert (validation_errors(task, "task") == []) == ok


# --- a run -------------------------------------------------------------------------------------

def test_a_run_writes_the_few_shot_prompt_and_fails_a_task_that_cannot(tmp_path):
    folder = piqa_copy(tmp_path, None, name="nofewshot")
    (folder / "task.yaml").write_text((folder / "task.yaml").read_text().replace("name: piqa", "name: nofewshot"))
    options = RunOptions(tasks=["piqa", "nofewshot"], model="dummy", limit=4, num_fewshot=3, quiet=True,
                         include_paths=[str(tmp_path)], output_dir=str(tmp_path / "runs"))
    (tmp_path / "runs" / "r").mkdir(parents=True)
    summary = Engine(options, tmp_path / "runs" / "r").run()
    assert summary["tasks"]["piqa"]["status"] == "ok"
    assert summary["tasks"]["nofewshot"]["status"] == "failed"
    assert "no few-shot source" in summary["tasks"]["nofewshot"]["failure"]
    rows = [json.loads(line) for line in (tmp_path / "runs" / "r" / "samples" / "piqa.jsonl").open()]
    expected = [lm["context"] for lm in LM_EVAL["plain_same_source"]]
    assert sorted(r["predict_result"][0]["prompt"] for r in rows) == sorted(expected[:4])
