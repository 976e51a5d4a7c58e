"""A backend's reply with every known secret masked, before a writer, the cache, the report or
the console sees it: a server may quote the key, a header value or the Basic token it was sent.

:func:`scrub_output` masks each string a :class:`~gage_eval.api.backend.ModelOutput` holds (text,
raw payload, reasoning, any field a plugin's backend added) with :func:`gage_eval.api.secrets.mask`,
the rule every message of a run follows (long secrets wherever they are, short ones as whole
words), and says whether it had to: such a reply is counted (``secrets_scrubbed``) and never
kept by a backend wrapper such as the response cache (:func:`reusable`), where a later hit would
return the mask instead of the answer.
"""
from __future__ import annotations

import copy
from typing import Any

from gage_eval.api.backend import ModelOutput, checked_output
from gage_eval.api.secrets import mask


def scrub_output(out: Any, secrets: tuple[str, ...]) -> tuple[Any, bool]:
    """``out`` with every secret masked, and whether a field other than ``error`` held one (a
    failed request is no reply: its message is masked, as every error message is, uncounted).
    ``out`` itself when nothing changed; a copy otherwise (the backend's object is left alone)."""
    if not secrets or not isinstance(out, ModelOutput):
        return out, False
    changed: dict[str, Any] = {}
    for name, value in vars(out).items():
        masked, hit = _masked(value, secrets)
        if hit:
            changed[name] = masked
    if not changed:
        return out, False
    clean = copy.copy(out)
    for name, value in changed.items():
        setattr(clean, name, value)
    return clean, any(name != "error" for name in changed)


def _masked(value: Any, secrets: tuple[str, ...]) -> tuple[Any, bool]:
    """``value`` with each string in it masked (dict keys too), and whether any was."""
    if isinstance(value, str):
        masked = mask(value, secrets)
        return masked, masked != value
    if isinstance(value, dict):
        items = [(_masked(k, secrets), _masked(v, secrets)) for k, v in value.items()]
        if not any(k[1] or v[1] for k, v in items):
            return value, False
        return {k[0]: v[0] for k, v in items}, True
    if isinstance(value, (list, tuple)):
        parts = [_masked(v, secrets) for v in value]
        if not any(hit for _, hit in parts):
            return value, False
        return type(value)(v for v, _ in parts) if type(value) in (list, tuple) else [v for v, _ in parts], True
    return value, False


def reusable(request: Any, out: Any, secrets: tuple[str, ...]) -> bool:
    """Whether a reply may be kept for reuse (``BackendUse.keeps``): a well-formed ModelOutput
    without an error, quoting none of the run's ``secrets``."""
    return (isinstance(out, ModelOutput) and not out.error and checked_output(request, out) is out
            and not scrub_output(out, secrets)[1])
