"""Checks JSON Schema cannot express, registered per schema name in :mod:`gage_eval.schemas`.

Each check takes one decoded row and returns ``(json path, message)`` pairs. They run
beside the schema's own errors, so they must tolerate rows the schema already refuses.
"""
from __future__ import annotations

from typing import Any

from gage_eval.schemas import EXTRA_CHECKS, WARNING_CHECKS

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


EXTRA_CHECKS.setdefault("legal_eval_v1", legal_eval_v1_errors)
WARNING_CHECKS.setdefault("legal_eval_v1", legal_eval_v1_warnings)
