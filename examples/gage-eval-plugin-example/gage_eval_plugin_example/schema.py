"""A schema: the trivia task's rows (Sample v1 rows with this task's own rules).

``gage-eval validate rows.jsonl --schema example/trivia`` checks a file of such rows against
``trivia.schema.json``, then the rules below, then reads each row as a run does (the builtin
Sample v1 reader), so duplicate ids and empty references are caught too.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

SCHEMA_PATH = Path(__file__).resolve().parent / "trivia.schema.json"


def _question(row: dict) -> str:
    for message in row.get("messages") or []:
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                return " ".join(s.get("text", "") for s in content if isinstance(s, dict))
            return str(content or "")
    return ""


def errors(row: Any) -> list[tuple[str, str]]:
    """Accepted answers must differ once case and spaces are ignored (a repeat weighs nothing)."""
    if not isinstance(row, dict) or not isinstance(row.get("references"), list):
        return []
    seen: dict[str, int] = {}
    problems = []
    for i, ref in enumerate(row["references"]):
        if not isinstance(ref, str):
            continue
        key = " ".join(ref.lower().split())
        if key in seen:
            problems.append((f"$.references[{i}]", f"repeats references[{seen[key]}] ({ref!r})"))
        else:
            seen[key] = i
    return problems


def warnings(row: Any) -> list[tuple[str, str]]:
    """A question that does not end with '?' is allowed, but is often a truncated row."""
    if not isinstance(row, dict):
        return []
    question = _question(row).strip()
    return [("$.messages", "the question does not end with '?'")] if question and not question.endswith("?") else []


def reader() -> Any:
    """How a run reads these rows: as Sample v1 (the task's ``identity`` preprocessor)."""
    from gage_eval.api import SampleIdentity

    return SampleIdentity()
