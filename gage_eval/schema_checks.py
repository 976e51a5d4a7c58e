"""Checks JSON Schema cannot express, registered per schema name in :mod:`gage_eval.schemas`.

Each check takes one decoded row and returns ``(json path, message)`` pairs. They run
beside the schema's own errors, so they must tolerate rows the schema already refuses.
"""
from __future__ import annotations

import re
from typing import Any

from gage_eval.jsonio import json_type
from gage_eval.schemas import EXTRA_CHECKS, WARNING_CHECKS, load_schema, validation_errors

SAMPLE_REQUIRED = ("schema_version", "id", "messages", "references")
_REQUIRED_MESSAGE = re.compile(r"^'([^']+)' is a required property$")

LEGAL_TOP_LEVEL = frozenset({
    "schema_version", "id", "dataset", "task_type", "prompt", "context", "messages", "attachments",
    "metadata", "rubric", "reference_answers", "choices", "correct_choice_ids",
})


def legal_eval_v1_errors(row: Any) -> list[tuple[str, str]]:
    """Spec 003 rules beyond the schema: unique choice ids, correct ids among them, blank messages."""
    if not isinstance(row, dict):
        return []
    problems: list[tuple[str, str]] = []
    messages = row.get("messages")
    if isinstance(messages, list):
        for i, message in enumerate(messages):
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, str) and content and not content.strip():
                problems.append((f"$.messages[{i}].content", "message content is only whitespace; it must be non-empty text"))
    choices = row.get("choices")
    ids: list[str] = []
    if isinstance(choices, list):
        seen: dict[str, int] = {}
        for i, choice in enumerate(choices):
            cid = choice.get("id") if isinstance(choice, dict) else None
            if not isinstance(cid, str):
                continue
            if cid in seen:
                problems.append((f"$.choices[{i}].id", f"duplicate choice id {cid!r} (also choices[{seen[cid]}])"))
            else:
                seen[cid] = i
            ids.append(cid)
    correct = row.get("correct_choice_ids")
    if isinstance(correct, list) and isinstance(choices, list):
        for i, cid in enumerate(correct):
            if isinstance(cid, str) and cid not in ids:
                problems.append((f"$.correct_choice_ids[{i}]",
                                 f"{cid!r} is not a choice id (choices are {', '.join(ids) or 'none'})"))
    return problems


def legal_eval_v1_warnings(row: Any) -> list[tuple[str, str]]:
    """Unknown top-level keys are allowed by spec 003 but should move into metadata."""
    if not isinstance(row, dict):
        return []
    return [(f"$.{key}", "unknown top-level field; spec 003 allows it but it belongs in metadata")
            for key in row if key not in LEGAL_TOP_LEVEL]


def sample_v1_required_errors(row: Any) -> list[tuple[str, str]]:
    """Spec 000's required fields of a row given as Sample v1, with messages that name them:
    a missing field, ``references``/``messages`` not a list, ``schema_version`` not ``v1``.
    Nothing here is ever filled in or coerced."""
    if not isinstance(row, dict):
        return [("$", f"expected a JSON object (a Sample v1 row), got {json_type(row)}")]
    problems = [("$", f"missing required field '{key}'") for key in SAMPLE_REQUIRED if key not in row]
    for key in ("messages", "references"):
        if key in row and not isinstance(row[key], list):
            problems.append((f"$.{key}", f"expected a list, got {json_type(row[key])}"))
    if "schema_version" in row and row["schema_version"] != "v1":
        problems.append(("$.schema_version", f"expected 'v1', got {row['schema_version']!r}"))
    return problems


def sample_v1_row_errors(row: Any) -> list[tuple[str, str]]:
    """Every problem of a row given as Sample v1: the required-field messages above, then the
    schema's own errors for everything they do not already say."""
    required = sample_v1_required_errors(row)
    if required and not isinstance(row, dict):
        return required
    said = {where for where, _ in required if where != "$"}
    missing = {key for key in SAMPLE_REQUIRED if key not in row}
    rest = []
    for where, what in validation_errors(row, "sample"):
        named = _REQUIRED_MESSAGE.match(what) if where == "$" else None
        if where in said or (named and named.group(1) in missing):
            continue
        rest.append((where, what))
    return required + rest


def sample_v1_warnings(row: Any) -> list[tuple[str, str]]:
    """A top-level key spec 000 does not define: kept and written, but probably a typo or
    something that belongs in ``metadata``."""
    if not isinstance(row, dict):
        return []
    known = load_schema("sample")["properties"]
    return [(f"$.{key}", "unknown top-level field; Sample v1 (spec 000) does not define it "
                         "(put it in metadata)") for key in row if key not in known]


EXTRA_CHECKS.setdefault("legal_eval_v1", legal_eval_v1_errors)
WARNING_CHECKS.setdefault("legal_eval_v1", legal_eval_v1_warnings)
WARNING_CHECKS.setdefault("sample", sample_v1_warnings)
