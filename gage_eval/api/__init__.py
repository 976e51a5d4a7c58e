"""The stable plugin API of gage-eval: everything a plugin implements and calls, in one place.

A plugin (the builtin one included, and ``examples/gage-eval-plugin-example``) imports from
``gage_eval.api`` alone; the other ``gage_eval`` modules are the core's internals and may
change between releases without notice. ``tests/core/test_layering.py`` holds every builtin
module to this (an import-linter contract in pyproject.toml and an ``ast`` check), so a
name missing here is a name to add here, not a reason to reach into the core.

This package is the ground the rest of gage-eval stands on: its modules (the hookspecs, the
contracts of backends, judges, loaders, metrics and writers, errors, events, the Sample helpers,
the strict row reader, data paths, secrets, templates, schema validation, statistics) import
nothing else of ``gage_eval`` (an import-linter contract). Each name below is loaded from its
module on first use, so ``import gage_eval.api`` costs nothing and a plugin pays only for what
it uses (no click, no plugin manager).

What is here, by what a plugin does with it:

- register: :data:`hookimpl` decorates the ``gage_register_*`` and event hooks
  (``gage_eval.api.hookspecs`` documents them).
- backends: :class:`Backend` (with its declared attributes ``name``, ``capabilities``,
  ``max_batch``, ``model_id``, ``open_note``), :class:`Request`, :class:`ModelOutput`, the
  request kinds :data:`GENERATE`, :data:`LOGLIKELIHOOD` and :data:`LOGLIKELIHOOD_ROLLING`,
  :func:`cut_at_stop`, and the namespace :mod:`loglikelihood`: the one rule every scoring
  backend splits a pair into tokens by (``loglikelihood.encode_pair``, ``encode_choices``,
  ``tokenizer_encoder``, ``prefix_token_id``, ``request_context``) and the windows a rolling
  request's text is scored in (``loglikelihood.rolling_windows``).
- tools, the namespace :mod:`tools`: ``tools.Tool`` (the base class of a tool the multi-turn
  tool loop runs, registered with ``gage_register_tools``), ``tools.factory(name)`` (a registered
  tool's factory) and ``tools.parser(name)`` (a tool-call parser registered with
  ``gage_register_tool_parsers``).
- judges: :class:`Judge`, :class:`Verdict`, and :class:`Template` (the sandboxed Jinja
  template tasks use; a judge's prompt template renders through it).
- metrics: :class:`Metric`, :class:`MetricContext` (dotted field paths into the sample, the
  model output and the verdict) and :func:`metric_value` (the number a result counts as).
  ``compute`` returns a number/bool, or a dict with ``value`` plus details kept in the
  sample's ``eval_result``.
- loaders and preprocessors: the contracts :class:`Loader` and :class:`Preprocessor` (their
  declared attributes ``data_dir``, ``data_files``, ``files()``, ``total()``,
  ``input_schema``, ``data_roots()``), :class:`RowContext`, the Sample v1 helpers (building
  messages and references, reading their text: :func:`user_message`, :func:`content_text`,
  :func:`from_legacy`, ...), the strict JSON row reader, the namespace :mod:`jsonio`
  (``jsonio.iter_json_rows``, ``jsonio.check_data_file``, ``jsonio.json_type``: how the jsonl
  loader and ``gage-eval validate`` read a row; ``jsonio.loads``: a reply's or a tool call's JSON,
  every failure a ValueError, too-deep nesting included), the namespace :mod:`paths` (file and URL checks
  for paths in data: ``paths.data_path``, ``paths.checked_url``, ``paths.base_folder``,
  ``paths.context_for``, ``paths.REMOTE_SCHEMES``), :func:`validation_errors` (a plugin adds
  schemas with ``gage_register_schemas``), :func:`data_packages` (the installed data packages
  registered with ``gage_register_data_packages``: offline copies of hub datasets), and
  :class:`SampleIdentity` (rows that already are Sample v1, as the builtin ``identity``
  preprocessor reads them).
- errors: :class:`GageError` (a one-line error the CLI prints without a traceback),
  :class:`FatalBackendError` (no further request can succeed), :class:`OutputError` (an output
  the run writes failed: the run stops, the rows written so far kept; the response cache's
  file breaking mid-run) and :class:`RowError` (one row's problem).
- writers: :class:`Writer`, the contract of an output format a plugin adds with
  ``gage_register_writers`` (fed each finished record and the run's end).
- run options: :class:`RunOption`, what ``gage_register_options`` declares (a flag and run config
  key of a plugin's own; its value reaches the plugin as ``RunStart.options[key]``).
- how the backends run, the namespace :mod:`running`: ``running.BackendUse``, what
  ``gage_wrap_backend`` tells a wrapper of a run's backend (role, secrets, settings, what may be
  kept, per-task counts), and ``running.Executor``, the contract of an executor
  ``gage_register_executors`` adds.
- running generated code, the namespace :mod:`execution`: ``execution.Sandbox`` (the contract
  of a sandbox ``gage_register_sandboxes`` adds), ``execution.Job``, ``execution.Limits``,
  ``execution.JobResult`` (its ``status`` one of ``execution.Status``) and
  ``execution.open_sandbox`` (a registered sandbox, checked: how a metric runs code).
- events, the namespace :mod:`events`: ``events.RunStart``, ``events.SampleDone``,
  ``events.TaskDone``, ``events.RunEnd``, the frozen objects the event hooks receive.
- run folders: :class:`RunFolder` (a stored run's layout and its strict readers:
  ``config()``, ``inputs()``, ``summary()``, ``records(task)``, the paths of its files, and
  ``reread_samples(task)``: the task's rows read again from its data, as the report does for the
  images its samples keep only as hashes) and :func:`read_yaml` (a YAML file read strictly, as
  task files are).
- statistics, the namespace :mod:`stats`: ``stats.Z95`` (the 95% normal quantile of
  summary.json's ``ci95.normal``), ``stats.quantile`` (of sorted values, linear between order
  statistics), the bootstrap and the cluster-robust stderr of summary.json.
- secrets, the namespace :mod:`secrets` for backends that hold credentials: ``secrets.mask``
  (secrets removed from a message), ``secrets.is_secret_key``, ``secrets.strip_credentials``,
  ``secrets.url_credentials``, ``secrets.query_secrets``, ``secrets.masked_url``,
  ``secrets.secret_forms`` and the placeholder ``secrets.REDACTED``.

Each name has one spelling: a helper reached through a namespace is not also a name here, and
a name no plugin needs (the core's own internals) is imported by the core from its module.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what static tools see; at run time __getattr__ below loads each name on first use
    from gage_eval.api import events, execution, jsonio, loglikelihood, paths, running, secrets, stats, tools
    from gage_eval.api.backend import (GENERATE, LOGLIKELIHOOD, LOGLIKELIHOOD_ROLLING, Backend, ModelOutput, Request,
                                       cut_at_stop)
    from gage_eval.api.errors import (FatalBackendError, GageError, OutputError, RowError)
    from gage_eval.api.hookspecs import hookimpl
    from gage_eval.api.judge import (Judge, Verdict)
    from gage_eval.api.loader import (Loader, Preprocessor, SampleIdentity)
    from gage_eval.api.metric import (Metric, MetricContext, metric_value)
    from gage_eval.api.options import RunOption
    from gage_eval.api.runfolder import RunFolder
    from gage_eval.api.sample import (MEDIA_SEGMENTS, SCHEMA_VERSION, RowContext, content_text, from_legacy,
                                      last_user_text, messages_text, normalize_references, reference_text,
                                      reference_texts, text_chat, text_segment, user_message)
    from gage_eval.api.schemas import (data_packages, validation_errors)
    from gage_eval.api.templates import Template
    from gage_eval.api.writer import Writer
    from gage_eval.api.yamlio import read_yaml

__all__ = [
    # registering
    "hookimpl",
    # backends
    "Backend", "Request", "ModelOutput", "GENERATE", "LOGLIKELIHOOD", "LOGLIKELIHOOD_ROLLING",
    "cut_at_stop",
    # tools and tool-call parsers, as a namespace: tools.Tool, tools.factory(name), tools.parser(name)
    "tools",
    # log-likelihood helpers, as a namespace: loglikelihood.encode_pair(...)
    "loglikelihood",
    # judges and templates
    "Judge", "Verdict", "Template",
    # metrics
    "Metric", "MetricContext", "metric_value",
    # rows: loader and preprocessor contracts, context, reading, validation; paths in data as a namespace
    "Loader", "Preprocessor", "RowContext", "SampleIdentity", "jsonio", "data_packages", "validation_errors", "paths",
    # Sample v1 helpers
    "SCHEMA_VERSION", "MEDIA_SEGMENTS", "text_segment", "user_message", "content_text", "messages_text", "text_chat",
    "last_user_text", "reference_text", "reference_texts", "normalize_references", "from_legacy",
    # errors
    "GageError", "FatalBackendError", "OutputError", "RowError",
    # writers and run options
    "Writer", "RunOption",
    # how the backends run, as a namespace: running.BackendUse (a backend wrapper's view), running.Executor
    "running",
    # running generated code, as a namespace: execution.open_sandbox(...), execution.Job, ...
    "execution",
    # events the observer hooks receive, as a namespace: events.RunStart, ...
    "events",
    # run folders: reading a stored run back; YAML read strictly
    "RunFolder", "read_yaml",
    # statistics, as a namespace: stats.Z95, stats.quantile(...)
    "stats",
    # secrets, as a namespace: secrets.mask(...)
    "secrets",
]

# the module of this package each name comes from (a namespace, ``paths``, is the module itself)
_NAMES = {
    "backend": "GENERATE LOGLIKELIHOOD LOGLIKELIHOOD_ROLLING Backend ModelOutput Request cut_at_stop",
    "errors": "FatalBackendError GageError OutputError RowError",
    "events": "events",
    "execution": "execution",
    "hookspecs": "hookimpl",
    "jsonio": "jsonio",
    "judge": "Judge Verdict",
    "loader": "Loader Preprocessor SampleIdentity",
    "loglikelihood": "loglikelihood",
    "metric": "Metric MetricContext metric_value",
    "options": "RunOption",
    "paths": "paths",
    "runfolder": "RunFolder",
    "stats": "stats",
    "running": "running",
    "secrets": "secrets",
    "sample": ("MEDIA_SEGMENTS SCHEMA_VERSION RowContext content_text from_legacy last_user_text messages_text "
               "normalize_references reference_text reference_texts text_chat text_segment user_message"),
    "schemas": "data_packages validation_errors",
    "templates": "Template",
    "tools": "tools",
    "writer": "Writer",
    "yamlio": "read_yaml",
}
_MODULE_OF = {name: module for module, names in _NAMES.items() for name in names.split()}


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    loaded = importlib.import_module(f"{__name__}.{module}")
    value = loaded if name == module else getattr(loaded, name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
