"""run.reproducibility in summary.json (gage_eval/runfolder/repro.py): a dummy run's record has the library
versions, the platform, the seeds, and hashes equal to the files' sha256; a task folder's git
commit is read from a repository made here; making the record never imports torch."""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gage_eval.runfolder import repro
from gage_eval.runfolder.rundir import folder_digest
from gage_eval.api.schemas import validation_errors

ROOT = Path(__file__).resolve().parents[2]


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def git(folder: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.org", "HOME": str(folder), "PATH": "/usr/bin:/bin"}
    return subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, check=True,
                          env=env).stdout.strip()


@pytest.fixture
def task_repo(tmp_path) -> Path:
    """A copy of the piqa task folder inside a fresh git repository with one commit."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo = tmp_path / "repo"
    folder = repo / "tasks" / "piqa_repro"
    shutil.copytree(ROOT / "tasks" / "piqa", folder)
    text = (folder / "task.yaml").read_text().replace("name: piqa\n", "name: piqa_repro\n")
    # the folder's own rows (tasks/piqa/sample.jsonl, invented), as data and few-shot pool
    start, end = text.index("dataset:"), text.index("preprocessor:")
    text = text[:start] + "dataset: {loader: jsonl, args: {path: sample.jsonl}}\n" + text[end:]
    text = text.replace("fewshot:\n", "fewshot:\n  path: sample.jsonl\n", 1).replace("  split: train\n", "", 1)
    (folder / "task.yaml").write_text(text)
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "task")
    return folder


def test_dummy_run_has_the_record(task_repo, tmp_path):
    from gage_eval.engine.loop import Engine, RunOptions

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    Engine(RunOptions(tasks=["piqa_repro"], model="dummy", limit=4, seed=7, num_fewshot=1, quiet=True,
                      include_paths=[str(task_repo)]), run_dir).run()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert validation_errors(summary, "summary") == []
    rec = summary["run"]["reproducibility"]
    task = rec["tasks"]["piqa_repro"]
    assert task["sha256"] == folder_digest(task_repo)
    assert task["data"] == {str(task_repo / "sample.jsonl"): sha(task_repo / "sample.jsonl")}
    assert task["templates"]["prompt.jinja"] == sha(task_repo / "prompt.jinja")
    assert task["templates"]["request.choice"] == hashlib.sha256(b"{{ option.content }}").hexdigest()
    assert task["git_commit"] == git(task_repo.parent.parent, "rev-parse", "HEAD")
    inputs = json.loads((run_dir / "inputs.json").read_text())["piqa_repro"]
    assert task["sha256"] == inputs["task_folder"]["sha256"] and task["data"] == inputs["data"]
    assert rec["seeds"] == {"run": 7, "fewshot": {"piqa_repro": 7}}
    assert rec["python"]["version"].count(".") == 2 and rec["os"]["system"]
    assert rec["libraries"].get("jinja2") == __import__("importlib.metadata").metadata.version("jinja2")
    assert summary["run"]["versions"]["gage_eval"]  # kept beside the record


def test_git_commit_outside_a_repository_and_by_ref(tmp_path):
    gitdir = tmp_path / "r" / ".git"
    (gitdir / "refs" / "heads").mkdir(parents=True)
    (gitdir / "HEAD").write_text("ref: refs/heads/main\n")
    (gitdir / "packed-refs").write_text("# pack-refs with: peeled\n" + "a" * 40 + " refs/heads/main\n")
    (tmp_path / "r" / "sub").mkdir()
    assert repro.git_commit(tmp_path / "r" / "sub") == "a" * 40  # from packed-refs
    (gitdir / "refs" / "heads" / "main").write_text("b" * 40 + "\n")
    assert repro.git_commit(tmp_path / "r" / "sub") == "b" * 40  # a loose ref wins
    (gitdir / "HEAD").write_text("c" * 40 + "\n")
    assert repro.git_commit(tmp_path / "r") == "c" * 40  # detached
    (gitdir / "HEAD").write_text("ref: refs/heads/none\n")
    assert repro.git_commit(tmp_path / "r") is None  # a branch with no commit


def test_a_folder_outside_any_repository_has_no_commit(tmp_path):
    folder = tmp_path / "plain"
    folder.mkdir()
    if any((p / ".git").exists() for p in folder.parents):
        pytest.skip("the temp folder is inside a git repository")
    assert repro.git_commit(folder) is None


def test_the_record_does_not_import_torch(tmp_path):
    code = ("import sys, json\n"
            "from gage_eval.engine.loop import Engine, RunOptions\n"
            "from pathlib import Path\n"
            f"d = Path({str(tmp_path / 'run')!r}); d.mkdir()\n"
            "s = Engine(RunOptions(tasks=['piqa'], model='dummy', limit=2, quiet=True), d).run()\n"
            "print(json.dumps({'torch': 'torch' in sys.modules, 'gpu': s['run']['reproducibility']['gpu'],\n"
            "                  'libs': s['run']['reproducibility']['libraries']}))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["torch"] is False and result["gpu"] is None


def test_gpu_named_only_when_torch_is_imported(monkeypatch):
    class Cuda:
        @staticmethod
        def is_available():
            return True

        @staticmethod
        def get_device_name(i):
            return "Fake GPU"

        @staticmethod
        def device_count():
            return 2

    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert repro.gpu_model() is None
    monkeypatch.setitem(sys.modules, "torch", type("torch", (), {"cuda": Cuda}))
    assert repro.gpu_model() == {"name": "Fake GPU", "count": 2}


def test_cpu_model_is_a_string_or_none():
    cpu = repro.cpu_model()
    assert cpu is None or (isinstance(cpu, str) and cpu)


def test_resume_warns_when_the_software_changed(tmp_path, run_cli):
    """--resume reads run.reproducibility: a library or Python version that differs from the
    run's start is named in a warning; the resume still runs."""
    result = run_cli("--tasks", "piqa", "--model", "dummy", "--limit", 4, "-o", tmp_path, "--run-id", "r", "-q")
    assert result.exit_code == 0, result.output
    run_dir = tmp_path / "r"
    assert repro.changed_environment(run_dir) == []
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["run"]["reproducibility"]["libraries"]["jinja2"] = "0.0.1"
    summary["run"]["reproducibility"]["python"]["version"] = "2.7.18"
    summary["run"]["versions"]["plugins"].update(builtin="0.0.9", uninstalled="1.0")  # (one upgraded, one gone)
    (run_dir / "summary.json").write_text(json.dumps(summary))
    changed = repro.changed_environment(run_dir)
    assert any(c.startswith("jinja2: 0.0.1 -> ") for c in changed) and any(c.startswith("python: 2.7.18 -> ")
                                                                         for c in changed), changed
    assert "plugin uninstalled: 1.0 -> not installed" in changed and any(
        c.startswith("plugin builtin: 0.0.9 -> ") for c in changed), changed
    result = run_cli("--resume", run_dir, "-q")
    assert result.exit_code == 0, result.output
    assert "the software differs from the run's start" in result.output and "jinja2: 0.0.1 ->" in result.output
