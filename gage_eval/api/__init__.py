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
  request kinds :data:`GENERATE` and :data:`LOGLIKELIHOOD`, :func:`cut_at_stop`, and the
  log-likelihood helpers every scoring backend shares (:func:`encode_pair`,
  :func:`encode_choices`, :func:`tokenizer_encoder`, :func:`prefix_token_id`,
  :func:`request_context`, :class:`TokenPair`, ``Encode``; also reachable as the namespace
  :mod:`loglikelihood`, as in ``loglikelihood.encode_pair(...)``).
- judges: :class:`Judge`, :class:`Verdict`, and :class:`Template` (the sandboxed Jinja
  template tasks use; a judge's prompt template renders through it).
- metrics: :class:`Metric`, :class:`MetricContext` (dotted field paths into the sample, the
  model output and the verdict) and :func:`metric_value` (the number a result counts as).
  ``compute`` returns a number/bool, or a dict with ``value`` plus details kept in the
  sample's ``eval_result``.
- loaders and preprocessors: the contracts :class:`Loader` and :class:`Preprocessor` (their
  declared attributes ``data_dir``, ``data_files``, ``files()``, ``total()``,
  ``input_schema``, ``data_roots()``), :class:`RowContext` and the Sample helpers (building messages
  and references, reading their text), the strict JSON row reader (:func:`iter_json_rows`,
  :func:`check_data_file`, :func:`json_type`), file and URL checks for paths in data
  (:func:`data_path`, :func:`checked_url`, :func:`base_folder`, :func:`context_for`),
  schema validation (:func:`validation_errors`, :func:`validation_warnings`,
  :func:`sample_v1_required_errors`; a plugin adds schemas with ``gage_register_schemas``),
  :func:`field_message` for a row error's wording, :func:`data_packages` (the installed data
  packages registered with ``gage_register_data_packages``: offline copies of hub datasets),
  and :class:`SampleIdentity` (rows that
  already are Sample v1, as the builtin ``identity`` preprocessor reads them).
- errors: :class:`GageError` (a one-line error the CLI prints without a traceback),
  :class:`InputError`, :class:`OutputError`, :class:`FatalBackendError` (no further request
  can succeed) and :class:`RowError` (one row's problem).
- writers: :class:`Writer`, the contract of an output format a plugin adds with
  ``gage_register_writers`` (fed each finished record and the run's end).
- sandboxes: :class:`Sandbox` (the contract of ``gage_register_sandboxes``), :class:`Job`,
  :class:`Limits`, :class:`JobResult` (its ``status`` one of :class:`Status`), :func:`open_sandbox`
  (a registered sandbox, checked: how a metric runs code).
- events: :class:`RunStart`, :class:`SampleDone`, :class:`TaskDone`, :class:`RunEnd`, the
  frozen objects the event hooks receive.
- secrets: :func:`redact` (a settings mapping with secret values masked),
  :func:`scrub`/:func:`mask` (secrets removed from a message), :func:`is_secret_key`,
  :func:`strip_credentials`, :func:`url_credentials`, the query-string ones
  (:func:`is_secret_query_name`, :func:`query_secrets`, :func:`masked_url`, :func:`secret_forms`)
  and the placeholder :data:`REDACTED`.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what static tools see; at run time __getattr__ below loads each name on first use
    from gage_eval.api import loglikelihood
    from gage_eval.api.backend import (GENERATE, LOGLIKELIHOOD, Backend, ModelOutput, Request, cut_at_stop)
    from gage_eval.api.errors import (FatalBackendError, GageError, OutputError, RowError)
    from gage_eval.api.events import (RunEnd, RunStart, SampleDone, TaskDone)
    from gage_eval.api.execution import (Job, JobResult, Limits, Sandbox, Status, open_sandbox)
    from gage_eval.api.hookspecs import hookimpl
    from gage_eval.api.jsonio import (InputError, check_data_file, iter_json_rows, json_type)
    from gage_eval.api.judge import (Judge, Verdict)
    from gage_eval.api.loader import (Loader, Preprocessor, SampleIdentity)
    from gage_eval.api.loglikelihood import (Encode, TokenPair, encode_choices, encode_pair, prefix_token_id,
                                             request_context, tokenizer_encoder)
    from gage_eval.api.metric import (Metric, MetricContext, metric_value)
    from gage_eval.api.paths import (REMOTE_SCHEMES, base_folder, checked_url, context_for, data_path)
    from gage_eval.api.secrets import (REDACTED, is_secret_key, is_secret_query_name, mask, masked_url,
                                      query_secrets, redact, scrub, secret_forms, strip_credentials,
                                      url_credentials)
    from gage_eval.api.sample import (LETTERS, MEDIA_SEGMENTS, SCHEMA_VERSION, RowContext, content_text,
                                      from_legacy, label_text, last_user_text, messages_text, normalize_references,
                                      reference_text, reference_texts, text_chat, text_segment, user_message)
    from gage_eval.api.schemas import (data_packages, field_message, sample_v1_required_errors, validation_errors,
                                       validation_warnings)
    from gage_eval.api.templates import Template
    from gage_eval.api.writer import Writer

__all__ = [
    # registering
    "hookimpl",
    # backends
    "Backend", "Request", "ModelOutput", "GENERATE", "LOGLIKELIHOOD", "cut_at_stop",
    # log-likelihood helpers
    "loglikelihood", "Encode", "TokenPair", "encode_pair", "encode_choices", "tokenizer_encoder",
    "prefix_token_id", "request_context",
    # judges and templates
    "Judge", "Verdict", "Template",
    # metrics
    "Metric", "MetricContext", "metric_value",
    # rows: loader and preprocessor contracts, context, Sample helpers, reading, paths, validation
    "Loader", "Preprocessor", "RowContext", "SCHEMA_VERSION", "MEDIA_SEGMENTS", "LETTERS", "text_segment", "user_message",
    "content_text", "messages_text", "text_chat", "last_user_text", "reference_text", "reference_texts",
    "label_text", "normalize_references", "from_legacy",
    "iter_json_rows", "check_data_file", "json_type", "data_packages",
    "REMOTE_SCHEMES", "base_folder", "data_path", "checked_url", "context_for",
    "validation_errors", "validation_warnings", "sample_v1_required_errors", "field_message", "SampleIdentity",
    # errors
    "GageError", "InputError", "OutputError", "FatalBackendError", "RowError",
    # writers
    "Writer",
    # sandboxes: where generated code runs
    "Sandbox", "Job", "JobResult", "Limits", "Status", "open_sandbox",
    # events
    "RunStart", "SampleDone", "TaskDone", "RunEnd",
    # secrets
    "REDACTED", "redact", "scrub", "mask", "is_secret_key", "strip_credentials", "url_credentials",
    "is_secret_query_name", "query_secrets", "masked_url", "secret_forms",
]

# the module of this package each name comes from (``loglikelihood`` is also the module itself)
_NAMES = {
    "backend": "GENERATE LOGLIKELIHOOD Backend ModelOutput Request cut_at_stop",
    "errors": "FatalBackendError GageError OutputError RowError",
    "events": "RunEnd RunStart SampleDone TaskDone",
    "execution": "Job JobResult Limits Sandbox Status open_sandbox",
    "hookspecs": "hookimpl",
    "jsonio": "InputError check_data_file iter_json_rows json_type",
    "judge": "Judge Verdict",
    "loader": "Loader Preprocessor SampleIdentity",
    "loglikelihood": ("loglikelihood Encode TokenPair encode_choices encode_pair prefix_token_id "
                      "request_context tokenizer_encoder"),
    "metric": "Metric MetricContext metric_value",
    "paths": "REMOTE_SCHEMES base_folder checked_url context_for data_path",
    "secrets": ("REDACTED is_secret_key is_secret_query_name mask masked_url query_secrets redact scrub "
                "secret_forms strip_credentials url_credentials"),
    "sample": ("LETTERS MEDIA_SEGMENTS SCHEMA_VERSION RowContext content_text from_legacy label_text "
               "last_user_text messages_text normalize_references reference_text reference_texts text_chat "
               "text_segment user_message"),
    "schemas": "data_packages field_message sample_v1_required_errors validation_errors validation_warnings",
    "templates": "Template",
    "writer": "Writer",
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
