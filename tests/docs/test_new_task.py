"""gage-eval new-task: the folder it writes is a valid task for both kinds and any good name
(the walkthroughs in test_task_docs.py run it); a bad name, a folder already there or a --dir
that is a file is refused with exit 2, one line, and nothing written."""
from __future__ import annotations

import pytest
import yaml

from gage_eval.api.schemas import validation_errors
from gage_plugins_builtin.new_task import KINDS, task_files


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_writes_a_valid_commented_task(kind, tmp_path, run_cli):
    result = run_cli("new-task", "my_task-2.b", "--kind", kind, "--dir", tmp_path / "t")
    assert result.exit_code == 0, result.output
    folder = tmp_path / "t" / "my_task-2.b"
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "prompt.jinja", "sample.jsonl", "task.yaml"]
    text = (folder / "task.yaml").read_text()
    spec = yaml.safe_load(text)
    assert validation_errors(spec, "task") == []
    assert spec["request"]["kind"] == kind
    assert spec["request"].get("chat") is (True if kind == "generate" else None)
    assert "docs/tasks.md" in text and "--data my_task-2.b=FILE" in text
    readme = (folder / "README.md").read_text()
    assert f"gage-eval --tasks my_task-2.b --include-path {tmp_path / 't'} --model dummy" in readme
    assert f"gage-eval validate {folder}/task.yaml --schema task" in readme
    assert f"wrote {folder}/" in result.output


def test_the_new_task_runs_on_the_dummy_backend(tmp_path, run_cli):
    assert run_cli("new-task", "qa", "--dir", tmp_path / "t").exit_code == 0
    assert run_cli("new-task", "mc", "--kind", "loglikelihood", "--dir", tmp_path / "t").exit_code == 0
    result = run_cli("--tasks", "qa,mc", "--include-path", tmp_path / "t", "--model", "dummy", "-o", tmp_path / "runs",
                     "--quiet")
    assert result.exit_code == 0, result.output
    assert "qa: 5 rows, 5 scored, 0 errored" in result.output
    assert "mc: 4 rows, 4 scored, 0 errored" in result.output


@pytest.mark.parametrize("name", ["a b", "../up", ".hidden", "x/y", "_x", "é", "a" * 101, ""])
def test_a_bad_name_is_refused(name, tmp_path, run_cli):
    result = run_cli("new-task", name, "--dir", tmp_path)
    assert result.exit_code == 2
    assert f"new-task: {name!r} is not a task name" in result.output
    assert list(tmp_path.iterdir()) == []


def test_an_existing_folder_is_refused_and_left_alone(tmp_path, run_cli):
    (tmp_path / "qa").mkdir()
    (tmp_path / "qa" / "task.yaml").write_text("mine")
    result = run_cli("new-task", "qa", "--dir", tmp_path)
    assert result.exit_code == 2
    assert f"new-task: {tmp_path / 'qa'} already exists; choose another name or --dir (nothing was written)" \
        in result.output
    assert [p.name for p in (tmp_path / "qa").iterdir()] == ["task.yaml"]
    assert (tmp_path / "qa" / "task.yaml").read_text() == "mine"
    (tmp_path / "file").write_text("x")
    assert run_cli("new-task", "file", "--dir", tmp_path).exit_code == 2


def test_a_dir_that_is_a_file_is_refused(tmp_path, run_cli):
    (tmp_path / "f").write_text("x")
    result = run_cli("new-task", "qa", "--dir", tmp_path / "f")
    assert result.exit_code == 2 and "--dir" in result.output and "not a folder" in result.output


def test_an_unknown_kind_is_refused(tmp_path, run_cli):
    result = run_cli("new-task", "qa", "--kind", "chat", "--dir", tmp_path)
    assert result.exit_code == 2 and "generate" in result.output
    assert list(tmp_path.iterdir()) == []


def test_the_name_of_a_builtin_task_is_written_with_a_note(tmp_path, run_cli):
    result = run_cli("new-task", "piqa", "--kind", "loglikelihood", "--dir", tmp_path)
    assert result.exit_code == 0
    assert "a builtin task is also named 'piqa'" in result.output


def test_the_files_name_the_task_everywhere():
    files = task_files("zz9", "generate", "d/zz9", "d")
    assert "--data zz9=FILE" in files["task.yaml"] and files["README.md"].startswith("# zz9\n")
    assert "@" not in "".join(files.values())  # every placeholder filled


def test_the_commands_it_prints_and_writes_quote_a_folder_with_a_space(tmp_path, run_cli):
    parent = tmp_path / "my tasks"
    result = run_cli("new-task", "qa", "--dir", parent)
    assert result.exit_code == 0, result.output
    want = f"gage-eval --tasks qa --include-path '{parent}' --model dummy"
    assert want in result.output and want in (parent / "qa" / "README.md").read_text()
    assert f"gage-eval validate '{parent / 'qa'}'/task.yaml" in (parent / "qa" / "README.md").read_text()
