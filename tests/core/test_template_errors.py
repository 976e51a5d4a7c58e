"""An undefined template variable, key or item: the error names the name, the template file
and line, and what is available instead; in a run it is each row's error (stage template), it
reaches the console, and a task whose every row fails this way exits 3."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gage_eval.api.templates import Template

ROOT = Path(__file__).resolve().parents[2]
PROMPT_NAMES = "sample, messages, question, options, metadata, letters"


def variables() -> dict:
    sample = {"schema_version": "gage.v1", "id": "s1", "options": [{"id": "A", "content": "Twist."}],
              "metadata": {"n": 1}}
    return {"sample": sample, "messages": [], "question": "Why?", "options": sample["options"],
            "metadata": sample["metadata"], "letters": "ABCDEFGHIJKLMNOPQRSTUVWXYZ"}


def error_of(source: str, where: str = "/t/prompt.jinja", is_file: bool = True, **extra) -> str:
    with pytest.raises(ValueError) as err:
        Template(source, where, is_file=is_file).render(**extra, **variables())
    return str(err.value)


@pytest.mark.parametrize("source, message", [
    ("Q: {{ q }}", f"/t/prompt.jinja:1: 'q' is undefined; available: {PROMPT_NAMES}"),
    ("Q: {{ question }}\n{{ q|upper }}", f"/t/prompt.jinja:2: 'q' is undefined; available: {PROMPT_NAMES}"),
    ("{% if goal %}x{% endif %}", f"/t/prompt.jinja:1: 'goal' is undefined; available: {PROMPT_NAMES}"),
    ("{% for x in q %}{% endfor %}", f"/t/prompt.jinja:1: 'q' is undefined; available: {PROMPT_NAMES}"),
    ("{{ range(q) }}", f"/t/prompt.jinja:1: 'q' is undefined; available: {PROMPT_NAMES}"),
    ("{{ sample.goal }}", "/t/prompt.jinja:1: 'sample' has no key 'goal'; its keys: schema_version, id, "
                          "options, metadata"),
    ("{{ sample['goal'] }}", "/t/prompt.jinja:1: 'sample' has no key 'goal'"),
    ("\n\n{{ metadata.missing }}", "/t/prompt.jinja:3: 'metadata' has no key 'missing'; its keys: n"),
    ("{{ options[3].content }}", "/t/prompt.jinja:1: 'options' has no item 3 (it has 1)"),
    ("{% for o in options %}{{ o.text }}{% endfor %}", "/t/prompt.jinja:1: 'options[0]' has no key 'text'; "
                                                       "its keys: id, content"),
    ("{{ question.text }}", "/t/prompt.jinja:1: 'question' (string) has no attribute 'text'"),
    ("{{ {}.a }}", "/t/prompt.jinja:1: a mapping has no key 'a'; it is empty"),
])
def test_the_error_names_the_name_the_file_line_and_what_is_there(source, message):
    got = error_of(source)
    assert got.startswith(message), got


def test_defined_tests_and_get_still_work():
    out = Template("{{ q is defined }} {{ sample.get('goal', '-') }}", "/t/p.jinja", is_file=True).render(**variables())
    assert out == "False -"


def test_a_choice_template_lists_option_and_index_too():
    got = error_of("{{ option.text }}", "/t/task.yaml: request.choice", is_file=False, option={"id": "A",
                                                                                             "content": "x"}, index=0)
    assert got == "/t/task.yaml: request.choice: 'option' has no key 'text'; its keys: id, content"
    got = error_of("{{ opt }}", "/t/task.yaml: request.choice", is_file=False, option={}, index=0)
    assert got == f"/t/task.yaml: request.choice: 'opt' is undefined; available: option, index, {PROMPT_NAMES}"


def test_a_template_without_variables_says_so():
    with pytest.raises(ValueError, match=r"'x' is undefined; available: none"):
        Template("{{ x }}", "/t/p.jinja", is_file=True).render()


def test_a_long_list_of_keys_is_cut():
    with pytest.raises(ValueError) as err:
        Template("{{ sample.zzz }}", "/t/p.jinja", is_file=True).render(sample={f"k{i}": i for i in range(100)})
    assert str(err.value).endswith("k29, ... (100 in all)")


# -- in a run: the rows, the console, the exit status ----------------------------------------

TASK = """dataset: {loader: jsonl, args: {path: rows.jsonl}}
preprocessor: {name: legacy, args: {question: goal, choices: [sol1, sol2], answer: label}}
request: {kind: loglikelihood, prompt: prompt.jinja, choice: "{{ option.text }}"}
metrics: [acc]
"""
ROWS = [{"goal": "Open a jar.", "sol1": "Twist.", "sol2": "Freeze.", "label": 0}] * 3


def run_task(tmp_path: Path, prompt: str, task: str = TASK) -> tuple[subprocess.CompletedProcess, Path, list]:
    folder = tmp_path / "tasks" / "tpl"
    folder.mkdir(parents=True)
    (folder / "task.yaml").write_text(task)
    (folder / "prompt.jinja").write_text(prompt)
    (folder / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "gage_eval.cli", "--tasks", "tpl", "--model", "dummy",
                           "--include-path", str(tmp_path / "tasks"), "-o", str(tmp_path), "--run-id", "r"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    records = [json.loads(line) for line in (tmp_path / "r" / "samples" / "tpl.jsonl").read_text().splitlines()]
    return proc, folder, records


def test_an_undefined_variable_fails_every_row_visibly_and_the_task_exits_3(tmp_path):
    proc, folder, records = run_task(tmp_path, "Question: {{ q }}\nAnswer:")
    message = f"{folder / 'prompt.jinja'}:1: 'q' is undefined; available: {PROMPT_NAMES}"
    assert "Traceback" not in proc.stdout + proc.stderr
    assert proc.returncode == 3, proc.stderr
    assert len(records) == 3  # every row is recorded, none dropped
    for n, record in enumerate(records, 1):
        assert record["eval_result"]["error"] == {"stage": "template", "message": message,
                                                  "locator": f"{folder / 'rows.jsonl'}:{n}"}
    assert proc.stderr.count(message) == 1  # the same error on every row: shown once, then counted
    assert "tpl: 2 more row(s) failed with an error shown above" in proc.stderr
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    task = summary["tasks"]["tpl"]
    assert task["status"] == "failed" and task["counts"]["errored"] == 3


def test_an_undefined_key_in_the_choice_template_names_the_task_key(tmp_path):
    proc, folder, records = run_task(tmp_path, "Question: {{ question }}\nAnswer:")
    message = f"{folder / 'task.yaml'}: request.choice: 'option' has no key 'text'; its keys: id, content"
    assert proc.returncode == 3, proc.stderr
    assert [r["eval_result"]["error"]["message"] for r in records] == [message] * 3
    assert message in proc.stderr
