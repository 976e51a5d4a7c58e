"""gage-eval-plugin-example: a backend, a metric, a writer, a schema, a tool and task folders,
registered through hooks.

gage-eval finds this module through the entry point in pyproject.toml
(group ``gage_eval``) and calls each ``@hookimpl`` function below with a
``register`` callable. Names are namespaced ``example/...`` so they cannot
collide with the builtins or with another plugin.
"""
from __future__ import annotations

from pathlib import Path

from gage_eval.api import hookimpl

__version__ = "0.1.0"

TASKS_DIR = Path(__file__).resolve().parent / "tasks"


@hookimpl
def gage_register_backends(register):
    # Registered as the class itself: this plugin has no heavy dependency. A
    # backend that needs torch or httpx registers a small function that imports
    # it when called (see README.md).
    from gage_eval_plugin_example.backend import LookupBackend

    register("example/lookup", LookupBackend)


@hookimpl
def gage_register_metrics(register):
    from gage_eval_plugin_example.metric import WordF1

    register("example/word_f1", WordF1)


@hookimpl
def gage_register_writers(register):
    from gage_eval_plugin_example.writer import ScoresCsv

    register("example/scores_csv", ScoresCsv)


@hookimpl
def gage_register_schemas(register):
    from gage_eval_plugin_example import schema

    register("example/trivia", schema.SCHEMA_PATH, checks=schema.errors, warnings=schema.warnings,
             rows=schema.reader)


@hookimpl
def gage_register_tools(register):
    # a tool of the tool loop: the factory is called once per row with the row
    from gage_eval_plugin_example.tool import Pantry

    register("example/pantry", Pantry)


@hookimpl
def gage_register_task_paths(register):
    register(str(TASKS_DIR))
