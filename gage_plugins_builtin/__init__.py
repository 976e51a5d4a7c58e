"""gage-eval's builtin plugins, registered exactly like a third-party plugin package."""
from __future__ import annotations

from pathlib import Path

from gage_eval import hookimpl

__version__ = "0.1.0"


def tasks_dir() -> Path:
    here = Path(__file__).resolve().parent
    for candidate in (here / "tasks", here.parent / "tasks"):
        if candidate.is_dir():
            return candidate
    return here / "tasks"


@hookimpl
def gage_register_loaders(register):
    from gage_plugins_builtin import loaders

    register("jsonl", loaders.JsonlLoader)
    register("hf", loaders.HFLoader)


@hookimpl
def gage_register_preprocessors(register):
    from gage_plugins_builtin import preprocessors

    register("identity", preprocessors.Identity)
    register("legacy", preprocessors.Legacy)


@hookimpl
def gage_register_backends(register):
    from gage_plugins_builtin.backends.dummy import DummyBackend

    register("dummy", DummyBackend)


@hookimpl
def gage_register_metrics(register):
    from gage_plugins_builtin.metrics import choice, stats, text

    register("exact_match", text.ExactMatch)
    register("contains", text.Contains)
    register("regex_match", text.RegexMatch)
    register("numeric_match", text.NumericMatch)
    register("acc", choice.Accuracy)
    register("acc_norm", choice.NormalizedAccuracy)
    register("latency", stats.Latency)
    register("text_length", stats.TextLength)


@hookimpl
def gage_register_task_paths(register):
    register(str(tasks_dir()))


@hookimpl
def gage_register_commands(cli):
    from gage_plugins_builtin import commands

    commands.add_to(cli)
