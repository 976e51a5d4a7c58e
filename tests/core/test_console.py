"""What a run prints (issue 28 part 3): the response cache's hits and misses on each task's count
line, an n-shot column in the results table, lm-eval's chat-template hint for a model with a
chat template whose tasks go without it."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from gage_eval.api import hookimpl
from gage_eval.config.options import RunOptions
from gage_eval.engine.hints import chat_template_hint
from gage_plugins_builtin.backends.dummy import DummyBackend


def table(output: str) -> list[list[str]]:
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("task "))
    return [line.split() for line in lines[start:] if line.startswith(("task ", "piqa "))]


def test_cache_hits_and_misses_on_the_count_line(run_cli, tmp_path):
    args = ("--tasks", "piqa", "--model", "dummy", "--cache", tmp_path / "cache", "-o", tmp_path / "runs")
    first = run_cli(*args, "--limit", "3", "--run-id", "a")
    assert first.exit_code == 0, first.output
    assert "piqa: 3 rows, 3 scored, 0 errored; cache 0 hits, 3 misses" in first.output
    second = run_cli(*args, "--limit", "5", "--run-id", "b")
    assert "piqa: 5 rows, 5 scored, 0 errored; cache 3 hits, 2 misses" in second.output
    plain = run_cli("--tasks", "piqa", "--model", "dummy", "--limit", "2", "-o", tmp_path / "runs", "--run-id", "c")
    assert "piqa: 2 rows, 2 scored, 0 errored\n" in plain.output and "; cache" not in plain.output


@pytest.mark.parametrize("shots, shown", [((), "0"), (("--num-fewshot", "2"), "2")])
def test_the_results_table_has_an_n_shot_column(run_cli, tmp_path, shots, shown):
    result = run_cli("--tasks", "piqa", "--model", "dummy", "--limit", "3", "-o", tmp_path / "runs", *shots)
    assert result.exit_code == 0, result.output
    rows = table(result.output)
    assert rows[0] == ["task", "metric", "value", "stderr", "n", "n-shot"]
    assert [r[-1] for r in rows[1:]] == [shown, shown] and [r[1] for r in rows[1:]] == ["acc", "acc_norm"]


class ChatDummy(DummyBackend):
    """The dummy model, declaring a chat template of its own (as an instruct model's backend does)."""

    chat_template = True


@pytest.fixture
def chat_dummy(fresh_plugins):
    class Plugin:
        @hookimpl
        def gage_register_backends(self, register):
            register("chatdummy", ChatDummy)

    fresh_plugins.register_plugin(Plugin(), "test-chat-dummy")


def test_a_chat_model_on_a_plain_task_gets_lm_evals_hint(run_cli, tmp_path, chat_dummy):
    result = run_cli("--tasks", "piqa", "--model", "chatdummy", "--limit", "2", "-o", tmp_path / "runs")
    assert result.exit_code == 0, result.output
    hints = [line for line in result.output.splitlines() if line.startswith("gage-eval: hint:")]
    assert len(hints) == 1 and "has a chat template" in hints[0] and "piqa formats prompts without it" in hints[0]
    assert "--apply-chat-template" in hints[0] and hints[0] in result.output.split("loading model")[0]
    forced = run_cli("--tasks", "piqa", "--model", "chatdummy", "--limit", "2", "-o", tmp_path / "runs",
                     "--apply-chat-template")
    assert forced.exit_code == 0, forced.output
    assert "hint:" not in forced.output


def test_the_hint_is_said_only_where_it_applies(capsys):
    spec = SimpleNamespace(name="plain", request={"kind": "generate"})
    chat = SimpleNamespace(name="chatty", request={"kind": "generate", "chat": True})
    model = SimpleNamespace(chat_template=True, model_id="org/model-Instruct")
    run = RunOptions(tasks=["plain"])
    assert chat_template_hint(model, run, [spec, chat]) is not None
    assert "plain formats prompts without it" in capsys.readouterr().err
    assert chat_template_hint(model, run, [chat]) is None  # every task has its chat template already
    assert chat_template_hint(SimpleNamespace(chat_template=False, model_id="m"), run, [spec]) is None
    assert chat_template_hint(model, RunOptions(tasks=["plain"], apply_chat_template=False), [spec]) is None
    assert chat_template_hint(model, RunOptions(tasks=["plain"], quiet=True), [spec]) is None
    assert capsys.readouterr().err == ""


def test_progress_moves_with_generated_tokens_before_any_row_finishes():
    """A generation batch whose rows all finish at its last step (issue 28: 0/10 for minutes, then
    10/10) is seen moving: a backend's Backend.generated reaches the running task's progress."""
    import io

    from gage_eval.api.backend import Backend
    from gage_eval.engine.progress import Progress

    stream = io.StringIO()
    progress = Progress("piqa", total=10, stream=stream, interval=0)
    Backend().generated(24)
    Backend().generated(24)
    assert progress.count == 0 and progress.tokens == 48
    assert "0/10 rows (0%)" in stream.getvalue() and "48 tokens generated" in stream.getvalue()
    progress.close()
    Backend().generated(5)  # no task running: nobody hears it
    assert progress.tokens == 48
    quiet = Progress("piqa", total=10, stream=stream, quiet=True)
    Backend().generated(3)
    assert quiet.tokens == 0


def test_library_noise_goes_above_the_bar_not_through_it():
    """While a task's bar is drawn, a Python warning or a transformers log line is written as a line
    of its own above the bar (Progress.message); afterwards both go where they went before."""
    import io
    import logging
    import warnings

    from gage_eval.engine.progress import Progress

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    logger = logging.getLogger("transformers")
    before = logger.handlers[:]
    if not before:  # as transformers sets it up: a handler of its own on its library logger
        logger.addHandler(logging.StreamHandler(io.StringIO()))
    handlers, shown = logger.handlers[:], warnings.showwarning
    stream = Terminal()
    progress = Progress("gen", total=3, stream=stream)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("`old_arg` is deprecated", FutureWarning)
    logger.warning("Setting `pad_token_id` to `eos_token_id`")
    progress.close()
    text = stream.getvalue()
    assert "gage-eval: FutureWarning: `old_arg` is deprecated\n" in text
    assert "gage-eval: transformers: Setting `pad_token_id` to `eos_token_id`\n" in text
    assert logger.handlers == handlers and warnings.showwarning is shown
    logger.handlers = before
