"""One test per hook: a plugin registered in-process implements it, and a real run shows its effect."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import click
import pytest

from gage_eval import hookimpl, hookspecs
from gage_eval.backend import Backend, ModelOutput
from gage_eval.judge import Judge, Verdict
from gage_eval.metric import Metric
from gage_eval.sample import user_message

HOOKS = sorted(n for n in dir(hookspecs) if n.startswith("gage_"))


class MemoryLoader:
    def __init__(self, n: int = 3, base_dir: str | None = None):
        self.n = n

    def __iter__(self):
        for i in range(self.n):
            yield f"memory:{i}", {"q": f"say {i}", "a": str(i)}


def to_sample(**_):
    def convert(record, ctx):
        return {"schema_version": "v1", "id": f"m{ctx.index}", "messages": [user_message(record["q"])],
                "references": [record["a"]], "label": record["a"]}
    return convert


class LastWordBackend(Backend):
    """Answers with the last word of the prompt."""

    name = "lastword"
    capabilities = frozenset({"generate", "chat"})
    model_id = "test/lastword"

    def __init__(self, **_):
        pass

    def run(self, requests):
        return [ModelOutput(text=(r.prompt or "").split()[-1], input_tokens=3, output_tokens=1) for r in requests]


class KeywordJudge(Judge):
    def __init__(self, base_dir=None, **_):
        pass

    def requests(self, sample, model_output):
        from gage_eval.backend import Request

        return [Request(kind="generate", sample_id=sample["id"], prompt=f"grade {model_output['text']}")]

    def verdict(self, sample, model_output, replies):
        return Verdict(score=1.0 if replies[0].text == model_output["text"] else 0.0, raw=replies[0].text)


class CharCount(Metric):
    name = "chars"

    def __init__(self, field: str = "model_output.text"):
        self.field = field

    def compute(self, ctx):
        return float(len(ctx.get(self.field)))


class Recorder:
    def __init__(self, task_root: Path):
        self.task_root = task_root
        self.events: list[tuple[str, object]] = []

    @hookimpl
    def gage_register_loaders(self, register):
        register("memory", MemoryLoader)

    @hookimpl
    def gage_register_preprocessors(self, register):
        register("memory_rows", to_sample)

    @hookimpl
    def gage_register_backends(self, register):
        register("lastword", LastWordBackend)

    @hookimpl
    def gage_register_judges(self, register):
        register("keyword", KeywordJudge)

    @hookimpl
    def gage_register_metrics(self, register):
        register("chars", CharCount)

    @hookimpl
    def gage_register_task_paths(self, register):
        register(str(self.task_root))

    @hookimpl
    def gage_register_commands(self, cli):
        @cli.command("hello")
        def hello():
            """Say hello."""
            click.echo("hello from a plugin")

    @hookimpl
    def gage_run_start(self, event):
        self.events.append(("run_start", event))

    @hookimpl
    def gage_sample_done(self, event):
        self.events.append(("sample_done", event))

    @hookimpl
    def gage_task_done(self, event):
        self.events.append(("task_done", event))

    @hookimpl
    def gage_run_end(self, event):
        self.events.append(("run_end", event))


TASK = """\
name: memtask
dataset: {loader: memory, args: {n: 3}}
preprocessor: {name: memory_rows}
request: {kind: generate, prompt: prompt.jinja}
judge: {name: keyword}
metrics: [exact_match, chars]
"""


@pytest.fixture
def plugin_run(tmp_path, fresh_plugins, run_cli):
    root = tmp_path / "tasks"
    (root / "memtask").mkdir(parents=True)
    (root / "memtask" / "task.yaml").write_text(TASK)
    (root / "memtask" / "prompt.jinja").write_text("Repeat: {{ question }}")
    rec = Recorder(root)
    fresh_plugins.register_plugin(rec, "recorder")
    result = run_cli("--tasks", "memtask", "--model", "lastword", "-o", tmp_path / "runs", "--run-id", "r1", "-q")
    assert result.exit_code == 0, result.output
    run_dir = tmp_path / "runs" / "r1"
    samples = [json.loads(l) for l in (run_dir / "samples" / "memtask.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())
    return rec, samples, summary, run_dir


def test_every_hookspec_has_a_test_and_docstring():
    source = Path(__file__).read_text()
    for name in HOOKS:
        assert f"def test_hook_{name}" in source, f"no test for hook {name}"
        doc = getattr(hookspecs, name).__doc__ or ""
        assert ":param" in doc and ":return:" in doc, f"hook {name} is not fully documented"


def test_hook_gage_register_loaders(plugin_run):
    _, samples, summary, _ = plugin_run
    assert [s["id"] for s in samples] == ["m0", "m1", "m2"]
    assert summary["tasks"]["memtask"]["counts"]["total"] == 3


def test_hook_gage_register_preprocessors(plugin_run):
    _, samples, _, _ = plugin_run
    assert samples[1]["label"] == "1" and samples[1]["messages"][0]["content"][0]["text"] == "say 1"


def test_hook_gage_register_backends(plugin_run):
    _, samples, summary, _ = plugin_run
    assert samples[2]["predict_result"][0]["message"]["content"][0]["text"] == "2"
    assert summary["run"]["model"]["model_id"] == "test/lastword"
    assert summary["tasks"]["memtask"]["metrics"]["exact_match"]["value"] == 1.0


def test_hook_gage_register_judges(plugin_run):
    _, samples, _, _ = plugin_run
    # the judge ran on the same backend: "grade 0" -> "0", equal to the answer
    assert all(s["eval_result"]["judge"]["score"] == 1.0 for s in samples)


def test_hook_gage_register_metrics(plugin_run):
    _, samples, summary, _ = plugin_run
    assert samples[0]["eval_result"]["metrics"]["chars"] == 1.0
    assert summary["tasks"]["memtask"]["metrics"]["chars"]["n"] == 3


def test_hook_gage_register_task_paths(plugin_run, run_cli):
    result = run_cli("tasks")
    assert "memtask" in result.output and "recorder" in result.output


def test_hook_gage_register_commands(plugin_run, run_cli):
    from gage_eval.cli import cli

    cli._loaded = False  # let the group load the recorder's command
    cli.commands.pop("hello", None)
    result = run_cli("hello")
    assert result.exit_code == 0 and "hello from a plugin" in result.output


def test_hook_gage_run_start(plugin_run):
    rec = plugin_run[0]
    starts = [e for k, e in rec.events if k == "run_start"]
    assert len(starts) == 1 and starts[0].tasks == ("memtask",) and starts[0].model == "lastword"


def test_hook_gage_sample_done(plugin_run):
    rec = plugin_run[0]
    done = [e for k, e in rec.events if k == "sample_done"]
    assert sorted(e.sample_id for e in done) == ["m0", "m1", "m2"] and all(e.error is None for e in done)


def test_hook_gage_task_done(plugin_run):
    rec = plugin_run[0]
    done = [e for k, e in rec.events if k == "task_done"]
    assert len(done) == 1 and done[0].counts["scored"] == 3


def test_hook_gage_run_end(plugin_run):
    rec, _, _, run_dir = plugin_run
    ends = [e for k, e in rec.events if k == "run_end"]
    assert len(ends) == 1 and ends[0].run_dir == run_dir and "memtask" in ends[0].summary["tasks"]
    assert [k for k, _ in rec.events][0] == "run_start" and [k for k, _ in rec.events][-1] == "run_end"


def test_duplicate_name_names_both_plugins(fresh_plugins):
    class Clash:
        @hookimpl
        def gage_register_backends(self, register):
            register("dummy", LastWordBackend)

    from gage_eval.errors import GageError

    with pytest.raises(GageError, match=r"'builtin'.*'clash'"):
        fresh_plugins.register_plugin(Clash(), "clash")


def test_disable_plugins_blocks_by_name(fresh_plugins, monkeypatch):
    monkeypatch.setenv("GAGE_EVAL_DISABLE_PLUGINS", "builtin")
    _, registry = fresh_plugins.load_plugins()
    assert "dummy" not in registry.backends and registry.task_paths == []


def test_task_override_warns(tmp_path, fresh_plugins, run_cli):
    root = tmp_path / "mine"
    (root / "piqa").mkdir(parents=True)
    (root / "piqa" / "task.yaml").write_text(textwrap.dedent("""\
        dataset: {loader: jsonl, args: {path: rows.jsonl}}
        request: {kind: generate}
        metrics: [exact_match]
        """))
    result = run_cli("tasks", "--include-path", root)
    assert "overrides the one from builtin" in result.output
    assert "--include-path" in [l for l in result.output.splitlines() if l.startswith("piqa")][0]


def test_tasks_and_plugins_work_with_every_plugin_disabled(tmp_path, monkeypatch):
    """The core owns `tasks` and `plugins`: they answer even with the builtin plugin disabled."""
    import subprocess
    import sys

    env = {**__import__("os").environ, "GAGE_EVAL_DISABLE_PLUGINS": "builtin"}
    for command in ("plugins", "tasks"):
        proc = subprocess.run([sys.executable, "-m", "gage_eval.cli", command], capture_output=True, text=True,
                              env=env)
        assert proc.returncode == 0, proc.stderr
        assert "no " in proc.stderr and "Traceback" not in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "gage_eval.cli", "tasks", "--include-path",
                           str(Path(__file__).resolve().parents[1] / "data")], capture_output=True, text=True,
                          env=env)
    assert proc.returncode == 0 and "piqa_mi" in proc.stdout, proc.stderr
