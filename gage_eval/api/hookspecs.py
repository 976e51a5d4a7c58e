"""Every hook gage-eval calls. Plugins implement these with ``@gage_eval.api.hookimpl``.

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
def gage_register_executors(register: Callable[[str, Any], None]) -> None:
    """Register executors: where the model runs other than in this process (``--executor NAME``;
    ``local``, the core's own, runs it here).

    :param register: call ``register(name, executor)`` with a
        :class:`gage_eval.api.running.Executor`: the ``--model-args`` keys it takes, its
        ``plan(args, where)``, the ``refusal`` a local run gives its arguments, and
        ``backend(proto, name, build, plan, options)``, the backend the engine sends requests to.
    :return: nothing.
    """


@hookspec
def gage_wrap_backend(backend: Any, use: Any) -> Any:
    """Wrap a run's backend: a wrapper sees every request the engine sends it and every reply
    (the builtin response cache answers from its file and sends the backend only the rest).

    :param backend: the backend the engine would use for ``use.role`` (already wrapped by the
        plugins registered before this one), built and not yet opened; the engine opens,
        closes and describes the backend itself, so a wrapper implements ``stream`` and ``run``
        (and ``close``, for what it holds) and reads the backend's ``settings()`` only once
        ``open()`` ran, at its first request.
    :param use: a :class:`gage_eval.api.running.BackendUse`: the role (``model``, ``judge``),
        the backend's registered name, the run's seed, secrets and settings, ``keeps(request,
        output)`` (whether a reply may be kept for reuse), a ``tally`` of per-task counts
        that reach summary.json and ``tool_loops`` (whether a task of the run has a tool loop).
    :return: the backend the engine uses instead, or None to leave it. A wrapper whose backend
        raises :class:`gage_eval.api.errors.FatalBackendError` in ``run`` re-raises it; it may
        set the error's ``outputs`` to the list of replies it has (None for the others).
    """


@hookspec
def gage_register_tool_parsers(register: Callable[[str, Callable[..., Any]], None]) -> None:
    """Register tool-call parsers: how a model family writes its calls in text (a local
    backend's model that takes tools through its chat template).

    :param register: call ``register(name, factory)``. ``factory()`` returns a parser with
        ``markers`` (strings whose presence in a chat template picks this parser when the run
        names none) and ``parse(text) -> (content, calls, error)``: the text left for the
        reply, the calls in Sample v1's shape, and why the text could not be read (or None).
        A run picks one with ``--model-args tool_parser=NAME``.
    :return: nothing.
    """


@hookspec
def gage_register_tools(register: Callable[[str, Callable[..., Any]], None]) -> None:
    """Register tools: what runs the calls a model makes in a task's tool loop
    (``request.tool_loop.tools`` names them).

    :param register: call ``register(name, factory)``. ``factory(sample)`` returns one row's
        :class:`gage_eval.api.tools.Tool` (a fresh instance per row: its state is that row's):
        ``functions()``, ``call(name, arguments)``, ``definitions()`` and ``state()``.
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
        returns a :class:`gage_eval.api.writer.Writer`. A writer runs when a run names it
        (``--writer``, repeatable; kept for ``--resume``). ``register(name, factory,
        default=True)`` registers a writer on by default: every run builds it (with no
        arguments, unless the run names it with arguments); it switches itself off by reading
        its own run option at ``start`` (``RunStart.options``, declared with
        ``gage_register_options``), as the builtin ``report`` writer reads ``report``
        (``--no-report``). A default writer whose factory declares ``merged = True`` also
        writes a run ``gage-eval merge`` makes (the builtin ``instances``). The run folder's own
        files (samples, summary.json) are written by the core's writers. Each plugin writer gets
        its own copy of every record, event and summary, so what it changes reaches no file, count
        or other writer; a writer that only reads them declares ``read_only = True`` (a class
        attribute, a promise never to change them) and gets the core's objects uncopied (the
        builtin ``instances`` does).
    :return: nothing.
    """


@hookspec
def gage_register_options(register: Callable[..., None]) -> None:
    """Register run options: settings of a run that a plugin reads (a flag, a run config key).

    :param register: call ``register(key, *flags, **fields)`` once per option, with the fields
        of :class:`gage_eval.api.options.RunOption` (``help``, ``type``, ``choices``, ``default``,
        ``env``, ...). The command line adds each flag to the run; the run config accepts ``key``;
        the value (flag over run config over ``env`` over ``default``) is kept in config.json
        under ``key`` and restored by ``--resume``, and reaches plugins as
        ``RunStart.options[key]`` (writers get it at ``start``). A key or flag registered twice
        is refused naming both plugins.
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
        runs code on the host and is used only when the run's option ``allow_unsandboxed_code`` is on
        (``--allow-unsandboxed-code``, declared by the plugin that registers ``unsandboxed``).
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
