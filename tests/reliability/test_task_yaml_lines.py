"""A task.yaml value the task schema refuses: one line naming the file, the line and the key
(was two lines, the file named twice and no line); several problems, one line each."""
from __future__ import annotations

import json

import pytest

from harness import TASK_FAILED, check

TASK = """\
name: mytask
dataset: {loader: jsonl, args: {path: rows.jsonl}}
preprocessor: {name: legacy, args: {question: goal, choices: [sol1, sol2], answer: label}}
request:
  kind: loglikelihod
  prompt: prompt.jinja
metrics: [acc]
"""


def run(gage, text):
    folder = gage.tmp / "tasks" / "mytask"
    folder.mkdir(parents=True)
    (folder / "task.yaml").write_text(text)
    (folder / "prompt.jinja").write_text("{{ question }}")
    (folder / "rows.jsonl").write_text(json.dumps({"goal": "Q", "sol1": "a", "sol2": "b", "label": 0}) + "\n")
    return gage("--tasks", "mytask", "--model", "dummy", "--include-path", gage.tmp / "tasks"), folder / "task.yaml"


def failure_lines(o, path):
    return [line for line in o.text.splitlines() if str(path) in line]


def test_one_bad_value_is_one_line_with_its_line(gage):
    o, path = run(gage, TASK)
    check(o, TASK_FAILED)
    failure = o.summary["tasks"]["mytask"]["failure"]
    assert failure.startswith(f"{path}:5: key 'request.kind': 'loglikelihod' is not one of"), failure
    assert "\n" not in failure


@pytest.mark.parametrize("text, line, key", [
    (TASK.replace("kind: loglikelihod", "kind: loglikelihood").replace("metrics: [acc]", "metrics: acc"), 7,
     "metrics"),
    (TASK.replace("kind: loglikelihod", "kind: loglikelihood").replace("name: legacy", "name: [legacy]"), 3,
     "preprocessor.name"),
])
def test_the_line_of_a_nested_key(gage, text, line, key):
    o, path = run(gage, text)
    check(o, TASK_FAILED, f"{path}:{line}: key '{key}'")


def test_several_problems_one_line_each(gage):
    o, path = run(gage, TASK.replace("metrics: [acc]", "metrics: acc"))
    check(o, TASK_FAILED, f"{path}:5: key 'request.kind'", f"{path}:7: key 'metrics'")


def test_validate_names_the_same_line(gage):
    _, path = run(gage, TASK)
    o = gage("validate", path, "--schema", "task")
    check(o, 1, f"{path}:5: request.kind: 'loglikelihod' is not one of")


@pytest.mark.parametrize("text, line, key", [
    ("models: {dut: {backend: dummy}}\ntasks: [piqa]\nlimit: 3\nseed: x\n", 4, "seed"),
    ("models: {dut: {backend: dummy}}\ntasks:\n  - piqa\n  - {name: piqa, limit: -1}\n", 4, "tasks.1.limit"),
    ("models:\n  dut: {backend: dummy}\n  jury: {backend: dummy}\ntasks: [piqa]\n", 3, "models.jury"),
])
def test_a_run_config_key_names_its_line(gage, text, line, key):
    path = gage.tmp / "run.yaml"
    path.write_text(text)
    o = gage("--config", path)
    check(o, 2, f"{path}:{line}: key '{key}'")
