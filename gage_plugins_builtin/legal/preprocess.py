"""legal_eval_v1 rows (spec 003) as Sample v1 (spec 000)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from gage_eval.api import (SCHEMA_VERSION, Preprocessor, RowContext, normalize_references, paths, text_segment,
                           user_message, validation_errors)

from gage_plugins_builtin.legal.documents import attachment_text
from gage_plugins_builtin.legal.schema import LEGAL_TOP_LEVEL

ATTACHMENT_MODES = ("text", "file")
# The legal_eval_v1 repository keeps the merged file in data/for_eval/ and the documents
# its rows name in data/curated/documents/: look beside the data file, then there.
DEFAULT_ROOTS = (".", "../curated")


class LegalEvalV1(Preprocessor):
    """Map a legal_eval_v1 row to a Sample v1.

    - ``prompt`` (with ``context`` before it, when not empty) is the last user message;
      ``messages``, when present, are the conversation and the prompt its last user turn.
    - mcq: ``choices`` become ``options``, ``correct_choice_ids`` the references and the
      ``label`` (ids joined by ``,`` in choice order); the ids stay in ``metadata.correct_choice_ids``.
    - reference_qa / rubric_qa: ``reference_answers`` are the references; the rubric goes
      to ``eval_config.rubric`` with each weight filled (1.0 when absent).
    - ``metadata`` keeps the row's metadata (``policy_id`` included) plus ``dataset``,
      ``context`` and the resolved attachments; ``data_tag`` holds ``task_type`` and ``dataset``.

    :param attachments: ``text`` (default): each attachment's text is extracted (PDF through
        pypdf) into ``metadata.attachment_texts`` for the prompt template, for models that
        read only text; ``file``: each becomes a ``file_url`` segment of the last user message.
    :param attachment_roots: folders, relative to the data file's folder, where attachment
        paths are looked up, in order. A row's attachment must lie inside one of them (or
        in an ``--allow-path`` folder), symlinks resolved: ``..`` and absolute paths cannot
        leave them (gage_eval.api.paths). The roots are the task's choice, as its file is.
    :param validate: check each row against the legal_eval_v1 schema (``legal/legal_eval_v1.schema.json``)
        here as well. Off by default: the row checker refuses every row invalid in ``input_schema``
        before this runs (in a run, a few-shot pool and ``gage-eval validate``), so only a caller
        outside those needs it.
    """

    input_schema = "legal_eval_v1"  # the row checker validates rows (and warns) before this runs

    def __init__(self, attachments: str = "text", attachment_roots: Any = DEFAULT_ROOTS, validate: bool = False):
        if attachments not in ATTACHMENT_MODES:
            raise ValueError(f"attachments must be one of {', '.join(ATTACHMENT_MODES)}, not {attachments!r}")
        self.attachments = attachments
        self.roots = [attachment_roots] if isinstance(attachment_roots, str) else list(attachment_roots)
        self.validate = validate

    def data_roots(self, base_dir: Path) -> list[Path]:
        """The folders attachments may be read from, besides ``--allow-path`` ones."""
        return [(Path(base_dir) / root).resolve() for root in self.roots]

    def __call__(self, record: Mapping[str, Any], ctx: RowContext) -> dict:
        if self.validate:
            problems = validation_errors(record, "legal_eval_v1")
            if problems:
                raise ValueError("not a valid legal_eval_v1 row: "
                                 + "; ".join(f"{where}: {what}" for where, what in problems[:5]))
        task_type = record["task_type"]
        metadata: dict[str, Any] = dict(record.get("metadata") or {})
        metadata["dataset"] = record["dataset"]
        context = record.get("context") or ""
        if context:
            metadata["context"] = context
        extra = {k: v for k, v in record.items() if k not in LEGAL_TOP_LEVEL}
        if extra:
            metadata["extra_fields"] = extra

        media, texts, resolved = self._attachments(record, ctx)
        if resolved:
            metadata["attachments"] = resolved
        if texts:
            metadata["attachment_texts"] = texts

        sample: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "id": str(record["id"]),
            "task_type": task_type,
            "messages": _messages(record, context, media),
            "references": [],
            "data_tag": {"task_type": task_type, "dataset": record["dataset"]},
        }
        if task_type == "mcq":
            options = [{"id": str(c["id"]), "content": str(c["text"])} for c in record["choices"]]
            order = [o["id"] for o in options]
            correct = sorted({str(c) for c in record["correct_choice_ids"]}, key=order.index)
            sample["options"] = options
            sample["references"] = normalize_references(correct)
            sample["label"] = ",".join(correct)
            metadata["correct_choice_ids"] = correct
        else:
            sample["references"] = normalize_references(list(record.get("reference_answers") or []))
        if task_type == "rubric_qa":
            sample["eval_config"] = {"rubric": [
                {**item, "weight": float(item["weight"]) if item.get("weight") is not None else 1.0}
                for item in record["rubric"]]}
        sample["metadata"] = metadata
        return sample

    def _attachments(self, record: Mapping[str, Any], ctx: RowContext) -> tuple[list[dict], list[dict], list[dict]]:
        media: list[dict] = []
        texts: list[dict] = []
        resolved: list[dict] = []
        attachments = record.get("attachments") or []
        roots = self.data_roots(paths.base_folder(ctx)) if attachments else []
        for i, att in enumerate(attachments):
            field = f"attachments[{i}].path"
            path = paths.data_path(att["path"], ctx, field, search=roots, roots=roots)
            title = att.get("title") or Path(att["path"]).stem
            resolved.append({**att, "title": title, "resolved_path": str(path)})
            if self.attachments == "file":
                media.append({"type": "file_url", "file_url": {"url": path.as_uri()}})
            else:
                try:
                    text = attachment_text(path, att.get("kind"))
                except ValueError as exc:
                    raise ValueError(f"{field}: {exc}") from None
                texts.append({"title": title, "path": att["path"], "text": text})
        return media, texts, resolved


def _messages(record: Mapping[str, Any], context: str, media: list[dict]) -> list[dict]:
    prompt = record["prompt"]
    turns = [{"role": m["role"], "content": [text_segment(m["content"])]} for m in record.get("messages") or []]
    if not turns or turns[-1]["role"] != "user" or turns[-1]["content"][0]["text"] != prompt:
        turns.append(user_message(prompt))
    last = turns[-1]
    lead = [text_segment(f"Context:\n{context}")] if context else []
    turns[-1] = {**last, "content": media + lead + last["content"]}
    return turns
