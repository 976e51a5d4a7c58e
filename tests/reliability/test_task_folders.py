"""Bad task folders, templates and YAML (task.yaml and the run config), through the real CLI."""
from __future__ import annotations

import json
import os
import socket
import textwrap

import pytest

from harness import OK, ROW_ERRORS, TASK_FAILED, USAGE, check

ROWS = "".join(json.dumps({"goal": f"Question {i}?", "sol1": "yes", "sol2": "no", "label": i % 2}) + "\n"
               for i in range(3))

TASK = """\
name: mytask
dataset: {loader: jsonl, args: {path: rows.jsonl}}
preprocessor: {name: legacy, args: {question: goal, choices: [sol1, sol2], answer: label}}
request: {kind: loglikelihood, prompt: prompt.jinja}
metrics: [acc]
"""


def task_folder(gage, task_yaml: str = TASK, prompt: str = "Question: {{ question }}\nAnswer:", **files: str):
    folder = gage.tmp / "tasks" / "mytask"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "task.yaml").write_text(task_yaml)
    (folder / "prompt.jinja").write_text(prompt)
    (folder / "rows.jsonl").write_text(ROWS)
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


def run_task(gage, *extra):
    return gage("--tasks", "mytask", "--model", "dummy", "--include-path", gage.tmp / "tasks", *extra)


# (case id, task.yaml, prompt template, exit status, text the output must hold)
TASK_CASES = [
    ("valid-task", TASK, None, OK, ""),
    ("yaml-syntax", TASK + "metrics: [acc\n", None, TASK_FAILED, "task.yaml:"),
    ("yaml-duplicate-key", TASK + "metrics: [acc_norm]\n", None, TASK_FAILED, "duplicate key 'metrics'"),
    ("yaml-empty", "", None, TASK_FAILED, "task.yaml"),
    ("yaml-not-mapping", "- a\n- b\n", None, TASK_FAILED, "task.yaml"),
    ("unknown-metric", TASK.replace("metrics: [acc]", "metrics: [accuracy_typo]"), None, TASK_FAILED,
     "'mytask'"),
    ("unknown-preprocessor", TASK.replace("name: legacy", "name: nope"), None, TASK_FAILED, "preprocessor"),
    ("unknown-loader-arg", TASK.replace("rows.jsonl}", "rows.jsonl, encodng: utf-8}"), None, TASK_FAILED,
     "key 'dataset.loader' ('jsonl'): unknown argument(s) 'encodng' (did you mean 'encoding'?); it takes path,"),
    ("unknown-preprocessor-arg", TASK.replace("answer: label}", "answer: label, bogus: 1}"), None, TASK_FAILED,
     "key 'preprocessor' ('legacy'): unknown argument(s) 'bogus'; it takes question, choices, answer,"),
    ("loader-base-dir", TASK.replace("rows.jsonl}", "rows.jsonl, base_dir: /tmp}"), None, TASK_FAILED,
     "task.yaml: key 'dataset.args.base_dir': gage-eval sets it (the task's folder); leave it out"),
    ("unknown-request-kind", TASK.replace("kind: loglikelihood", "kind: guess"), None, TASK_FAILED,
     "request.kind"),
    ("missing-template", TASK.replace("prompt.jinja", "missing.jinja"), None, TASK_FAILED, "missing.jinja"),
    ("template-undefined-variable", TASK, "Question: {{ q }}\nAnswer:", TASK_FAILED, "'q' is undefined"),
    ("template-syntax", TASK, "Question: {{ question }\nAnswer:", TASK_FAILED, "prompt.jinja"),
    ("template-include", TASK, "{% include '/etc/passwd' %}", TASK_FAILED, "include"),
    ("template-import", TASK, "{% import 'other.jinja' as o %}{{ question }}", TASK_FAILED, "import"),
    ("template-extends", TASK, "{% extends 'base.jinja' %}", TASK_FAILED, "extends"),
    ("template-huge-range", TASK, "{% for i in range(10**12) %}x{% endfor %}", TASK_FAILED, "range"),
    ("template-string-repeat", TASK, "{{ 'x' * 10**10 }}", TASK_FAILED, "prompt.jinja"),
    ("template-huge-output", TASK, "{% for i in range(99999) %}{{ question * 50 }}{% endfor %}", TASK_FAILED,
     "larger than"),
    ("template-join-bomb", TASK, "{{ ([question ~ 'x' * 3999000] * 250)|join }}", TASK_FAILED,
     "would make a list of more than"),
    ("template-indent-bomb", TASK, "{{ ((question ~ '\\n') * 60)|indent(3999999) }}", TASK_FAILED,
     "the result of filter 'indent' would be longer than"),
    ("template-replace-bomb", TASK, "{{ (question * 99)|replace('', 'x' * 3999999) }}", TASK_FAILED,
     "the result of filter 'replace' would be longer than"),
    ("template-wordwrap-slow", TASK, "{{ (question ~ 'x' * 1600000)|wordwrap(1) }}", TASK_FAILED,
     "would take too long"),
    ("template-format-map", TASK, "{{ '{0.__class__}'.format_map(sample) }}", TASK_FAILED, "prompt.jinja"),
    ("template-dunder", TASK, "{{ sample.__class__.__mro__ }}", TASK_FAILED, "prompt.jinja"),
    ("template-format", TASK, "{{ '{0.__class__.__init__.__globals__}'.format(question) }}", TASK_FAILED,
     "prompt.jinja"),
]


@pytest.mark.parametrize("task_yaml, prompt, rc, message", [c[1:] for c in TASK_CASES],
                         ids=[c[0] for c in TASK_CASES])
def test_bad_task_folder(gage, task_yaml, prompt, rc, message):
    folder = task_folder(gage, task_yaml, **({"prompt": prompt} if prompt is not None else {}))
    o = run_task(gage)
    check(o, rc, message)
    if rc == TASK_FAILED:
        failure = o.summary["tasks"]["mytask"]["failure"]
        assert failure, o.summary["tasks"]["mytask"]
        assert str(folder) in o.text or "prompt.jinja" in o.text or "mytask" in failure


def test_a_broken_task_never_hides_the_others(gage):
    task_folder(gage, TASK.replace("metrics: [acc]", "metrics: [nope]"))
    o = run_task(gage, "--tasks", "mytask,piqa")
    check(o, TASK_FAILED, "mytask", "piqa  acc")
    tasks = o.summary["tasks"]
    assert tasks["mytask"]["status"] == "failed" and "nope" in tasks["mytask"]["failure"]
    assert tasks["piqa"]["status"] == "ok" and tasks["piqa"]["counts"]["scored"] > 0


def run_config(gage, text: str):
    path = gage.tmp / "run.yaml"
    path.write_text(textwrap.dedent(text))
    return gage("--config", path)


@pytest.mark.parametrize("text, message", [
    ("models: {dut: {backend: dummy}}\ntasks: [piqa]\ntasks: [mmmu]\n", "duplicate key 'tasks'"),
    ("models: {dut: {backend: dummy}}\ntasks: [piqa]\nlimt: 3\n", "unknown key(s) limt"),
    ("models: {dut: {backend: dummy}}\ntasks: [piqa\n", "invalid YAML"),
    ("models: {dut: {backend: dummy}}\ntasks: [piqa]\nmax_error_rate: 2\n", "max_error_rate"),
    ("models: {dut: {backend: dummy}}\ntasks: [piqa]\nallow_paths: /tmp\n", "allow_paths"),
    ("models: [1]\ntasks: [piqa]\n", "key 'models'"),
    ("models: {dut: {backend: dummy, args: [1]}}\ntasks: [piqa]\n", "key 'models.dut'"),
    ("models: {dut: {backend: dummy}}\ntasks: piqa\n", "key 'tasks'"),
    ("models: {dut: {backend: dummy}}\ntasks: [piqa]\ninclude_paths: /tmp\n", "key 'include_paths'"),
    ("models: {dut: {backend: dummy}}\ntasks: [piqa]\nlimit: true\n", "key 'limit'"),
    ("models: {dut: {backend: dummy}}\ntasks: [piqa]\nseed: [1]\n", "key 'seed'"),
    ("models: {dut: {backend: dummy}}\ntasks: [piqa]\nbatch_size: many\n", "key 'batch_size'"),
    ("models: {dut: {backend: dummy}}\ntasks: [piqa]\nallow_paths: [nowhere]\n", "key 'allow_paths'"),
], ids=["duplicate-key", "unknown-key", "yaml-syntax", "bad-error-rate", "allow-paths-not-list", "models-a-list",
        "args-a-list", "tasks-a-string", "include-paths-a-string", "limit-a-bool", "seed-a-list", "batch-size-word",
        "allow-path-missing"])
def test_bad_run_config(gage, text, message):
    check(run_config(gage, text), USAGE, message, "run.yaml")


def test_unknown_task_is_a_usage_error(gage):
    check(gage("--tasks", "nope", "--model", "dummy"), USAGE, "unknown task(s): nope")


def test_an_unknown_task_names_the_task_files_that_could_not_be_read(gage):
    """A task file that does not parse is known by its folder's name only: asking for the name
    inside it said 'unknown task(s): px' and no more; now the unreadable file and its line follow."""
    folder = task_folder(gage, TASK.replace("name: mytask", "name: px") + "\tbad: [\n")
    out = gage("--tasks", "px", "--model", "dummy", "--include-path", gage.tmp / "tasks")
    check(out, USAGE, "unknown task(s): px", "task files that could not be read",
          f"{folder / 'task.yaml'}:6: invalid YAML")
    check(gage("--tasks", "nope", "--model", "dummy"), USAGE, "unknown task(s): nope")
    assert "could not be read" not in gage("--tasks", "nope", "--model", "dummy").text


def test_row_errors_in_a_template_name_the_row(gage):
    # a template that fails on one row only: that row is errored, the others scored
    task_folder(gage, prompt="{{ question if 'Question 1' not in question else sample.missing.deeper }}")
    o = run_task(gage)
    check(o, ROW_ERRORS)
    errors = o.errors("mytask")
    assert len(errors) == 1
    (locator, err), = errors.items()
    assert locator.endswith("rows.jsonl:2") and err["stage"] == "template" and "prompt.jinja" in err["message"]


@pytest.mark.parametrize("kind", ["fifo", "socket", "folder"])
def test_a_task_file_that_is_no_file_is_reported_not_skipped(gage, kind, monkeypatch):
    """A task.yaml that is a FIFO, a socket or a folder was passed over in silence (asking for
    its task: 'unknown task'); it is the task's INVALID line, and its run fails naming it. A
    FIFO is never opened: that would wait for a writer."""
    folder = gage.tmp / "tasks" / "oddtask"
    folder.mkdir(parents=True)
    if kind == "fifo":
        os.mkfifo(folder / "task.yaml")
    elif kind == "socket":
        monkeypatch.chdir(folder)  # (a socket's path is short: bind it by its name)
        socket.socket(socket.AF_UNIX).bind("task.yaml")  # (the file stays when the socket closes)
    else:
        (folder / "task.yaml").mkdir()
    problem = {"fifo": "not a regular file (a FIFO)", "socket": "not a regular file (a socket)",
               "folder": "a folder, not a file"}[kind]
    line = f"{folder / 'task.yaml'}: {problem}"
    listing = gage("tasks", "--include-path", gage.tmp / "tasks", "--json", timeout=60)
    check(listing, OK)
    row, = [r for r in json.loads(listing.out) if r["name"] == "oddtask"]
    assert (row["kind"], row["description"]) == ("INVALID", line)
    o = gage("--tasks", "oddtask", "--model", "dummy", "--include-path", gage.tmp / "tasks", timeout=60)
    check(o, TASK_FAILED, line)
    assert o.summary["tasks"]["oddtask"]["failure"] == line
