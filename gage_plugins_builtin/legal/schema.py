"""The legal_eval_v1 row schema (spec 003): its file beside this module, the rules JSON Schema
cannot say. Registered through
``gage_register_schemas`` (gage_plugins_builtin/__init__.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

SCHEMA_PATH = Path(__file__).resolve().parent / "legal_eval_v1.schema.json"

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
                problems.append((f"$.choices[{i}].id", f"duplicate choice id {cid[:60]!r} (also choices[{seen[cid]}])"))
            else:
                seen[cid] = i
            ids.append(cid)
    correct = row.get("correct_choice_ids")
    if isinstance(correct, list) and isinstance(choices, list):
        for i, cid in enumerate(correct):
            if isinstance(cid, str) and cid not in ids:
                problems.append((f"$.correct_choice_ids[{i}]",
                                 f"{cid[:60]!r} is not a choice id (choices are {', '.join(ids[:26]) or 'none'}"
                                 f"{f', ... ({len(ids)} in all)' if len(ids) > 26 else ''})"))
    return problems


def legal_eval_v1_warnings(row: Any) -> list[tuple[str, str]]:
    """Unknown top-level keys are allowed by spec 003 but should move into metadata."""
    if not isinstance(row, dict):
        return []
    return [(f"$.{key}", "unknown top-level field; spec 003 allows it but it belongs in metadata")
            for key in row if key not in LEGAL_TOP_LEVEL]
