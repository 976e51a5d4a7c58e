"""Every hook gage-eval calls. Plugins implement these with ``@gage_eval.hookimpl``.

Hook argument names are public API: they may be added to, never renamed.
"""
from __future__ import annotations

from typing import Any, Callable

import pluggy

hookspec = pluggy.HookspecMarker("gage_eval")
hookimpl = pluggy.HookimplMarker("gage_eval")


# ---------------------------------------------------------------------------
# Registrar hooks: the core passes ``register``; it records which plugin
# registered each name and refuses a duplicate by naming both plugins.
# ---------------------------------------------------------------------------


@hookspec
def gage_register_loaders(register: Callable[[str, Callable[..., Any]], None]) -> None:
    """Register dataset loaders.

    :param register: call ``register(name, factory)`` once per loader.
        ``factory(**args)`` receives the ``dataset.args`` mapping of a task file
        (plus ``base_dir``, the task folder, for resolving relative paths) and
        returns an iterable of ``(locator, record)`` pairs, read lazily.
        ``locator`` is a short string such as ``"data.jsonl:17"`` that every
        error about that row names; ``record`` is a dict, or a
        :class:`gage_eval.api.errors.RowError` for a row that could not be read
        (it is reported and counted, never dropped).
    :return: nothing; registration happens through ``register``.
    """


@hookspec
def gage_register_preprocessors(register: Callable[[str, Callable[..., Any]], None]) -> None:
    """Register preprocessors that turn a dataset record into a Sample v1 dict.

    :param register: call ``register(name, factory)``. ``factory(**args)``
        receives the ``preprocessor.args`` of a task file and returns a
        callable ``(record, context) -> dict``: a pure function of the record,
        where ``context`` is a :class:`gage_eval.api.sample.RowContext` (task name,
        locator, row index, dataset folder for relative paths). The returned
        Sample is validated against ``schemas/sample.schema.json``.
    :return: nothing.
    """


@hookspec
def gage_register_backends(register: Callable[[str, Callable[..., Any]], None]) -> None:
    """Register model backends.

    :param register: call ``register(name, factory)``. ``factory(**args)``
        receives the parsed ``--model-args`` (strings converted to int, float
        or bool where they look like one) and returns a
        :class:`gage_eval.api.backend.Backend`. A factory imports its heavy
        dependencies (torch, transformers, vllm, aiohttp) itself, when called,
        and raises :class:`gage_eval.api.errors.GageError` naming the extra to
        install when one is missing.
    :return: nothing.
    """


@hookspec
def gage_register_judges(register: Callable[[str, Callable[..., Any]], None]) -> None:
    """Register judges, which score a model's answer with another model.

    :param register: call ``register(name, factory)``. ``factory(**args)``
        receives the ``judge.args`` of a task file (plus ``base_dir``) and
        returns a :class:`gage_eval.api.judge.Judge`.
    :return: nothing.
    """


@hookspec
def gage_register_metrics(register: Callable[[str, Callable[..., Any]], None]) -> None:
    """Register per-sample metrics.

    :param register: call ``register(name, factory)``. ``factory(**args)``
        receives the ``args`` of one entry in a task's ``metrics`` list and
        returns a :class:`gage_eval.api.metric.Metric`.
    :return: nothing.
    """


@hookspec
def gage_register_writers(register: Callable[[str, Callable[..., Any]], None]) -> None:
    """Register output writers: formats fed each finished record as it is written.

    :param register: call ``register(name, factory)``. ``factory(**args)`` receives the
        arguments of ``--writer NAME:key=value,...`` (none for a bare ``--writer NAME``) and
        returns a :class:`gage_eval.api.writer.Writer`. A writer runs only when a run names it
        (``--writer``, repeatable; kept for ``--resume``). The run folder's own files
        (samples, instances, summary.json) are written by the core's writers.
    :return: nothing.
    """


@hookspec
def gage_register_sandboxes(register: Callable[[str, Callable[..., Any]], None]) -> None:
    """Register sandboxes: where generated code runs (code_exec metrics, humaneval).

    :param register: call ``register(name, factory)``. ``factory(**args)`` receives a metric's
        ``sandbox_args`` and returns a :class:`gage_eval.api.execution.Sandbox`: ``check()``
        raises :class:`gage_eval.api.errors.GageError` naming how to install what it lacks
        (called before any model work), ``run(job)`` runs one
        :class:`gage_eval.api.execution.Job` under its limits and returns a ``JobResult`` (never
        raising for what the code did), from several threads at once. The name ``unsandboxed``
        runs code on the host and is used only with ``--allow-unsandboxed-code``.
    :return: nothing.
    """


@hookspec
def gage_register_schemas(register: Callable[..., None]) -> None:
    """Register JSON Schemas that rows are checked against (``validate --schema NAME`` and a
    preprocessor's ``input_schema``).

    :param register: call ``register(name, path, checks=None, warnings=None, rows=None)``.
        ``path`` is the schema file (JSON Schema, any draft jsonschema knows).
        ``checks(row)`` and ``warnings(row)`` return ``(json path, message)`` pairs for what
        the schema cannot say; they must tolerate rows the schema refused. ``rows()``, when
        given, returns the preprocessor that reads such rows in a run, so that ``validate``
        checks a data file exactly as a run would (files, URLs, duplicate ids).
        The core's own schemas (sample, instance, task, summary) cannot be replaced.
    :return: nothing.
    """


@hookspec
def gage_register_task_paths(register: Callable[[str], None]) -> None:
    """Register folders that hold task folders (each with a ``task.yaml``).

    :param register: call ``register(path)`` with a folder whose
        sub-folders are tasks. A task found here overrides a builtin task of
        the same name, with a warning.
    :return: nothing.
    """


@hookspec
def gage_register_data_packages(register: Callable[[str, Any], None]) -> None:
    """Register installed data packages: folders of Hugging Face ``save_to_disk`` copies laid out
    ``<dataset id path>/<config or none>/<split>/``, read offline when the hub is not reached.

    :param register: call ``register(name, root)``; ``root`` is that folder, or a function of no
        arguments returning it (None: not installed), called when a dataset is looked up.
    :return: nothing.
    """


@hookspec
def gage_register_commands(cli: Any) -> None:
    """Add commands to the ``gage-eval`` command line.

    :param cli: the root :class:`click.Group`; add commands with
        ``@cli.command()`` or ``cli.add_command(...)``.
    :return: nothing.
    """


# ---------------------------------------------------------------------------
# Observer hooks: called with frozen event objects, each observer its own copy.
# An exception (or sys.exit) raised by an observer is reported once and that
# plugin's observers are left out for the rest of the run; it is not fatal.
# ---------------------------------------------------------------------------


@hookspec
def gage_run_start(event: Any) -> None:
    """Called once before the first task of a run starts.

    :param event: a :class:`gage_eval.api.events.RunStart` (run id, output
        folder, task names, model name).
    :return: ignored.
    """


@hookspec
def gage_sample_done(event: Any) -> None:
    """Called after each sample's record is written.

    :param event: a :class:`gage_eval.api.events.SampleDone` (task, sample id,
        whether it errored, its metric values).
    :return: ignored.
    """


@hookspec
def gage_task_done(event: Any) -> None:
    """Called after a task's last sample is written and its summary built.

    :param event: a :class:`gage_eval.api.events.TaskDone` (task, counts, metrics).
    :return: ignored.
    """


@hookspec
def gage_run_end(event: Any) -> None:
    """Called once after ``summary.json`` is written.

    :param event: a :class:`gage_eval.api.events.RunEnd` (run id, output folder,
        the summary dict).
    :return: ignored.
    """
