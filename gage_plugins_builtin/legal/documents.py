"""Attachment text for models that read only text: PDFs through pypdf, text files as they are."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

TEXT_SUFFIXES = (".txt", ".md", ".csv", ".json", ".html", ".htm", ".xml")


@lru_cache(maxsize=32)
def _pdf_text(path: str, mtime: float) -> str:
    try:
        from pypdf import PdfReader
    except ImportError:
        raise ValueError("reading PDF attachments needs pypdf: pip install 'gage-eval[pdf]'") from None
    import logging

    logging.getLogger("pypdf").setLevel(logging.ERROR)  # its warnings ("EOF marker not found") went to the console
    try:
        reader = PdfReader(path)
        pages = [page.extract_text() or "" for page in reader.pages]
    except Exception as exc:  # pypdf raises many kinds for damaged files
        raise ValueError(f"cannot read PDF {path}: {type(exc).__name__}: {exc}") from None
    return "\n\n".join(p.strip() for p in pages if p.strip())


def attachment_text(path: Path, kind: str | None = None) -> str:
    """The text of one attachment; ``ValueError`` naming the file when it cannot be read."""
    kind = (kind or path.suffix.lstrip(".")).lower()
    if kind == "pdf" or path.suffix.lower() == ".pdf":
        return _pdf_text(str(path), path.stat().st_mtime)
    if path.suffix.lower() in TEXT_SUFFIXES or kind in ("text", "txt", "markdown"):
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"cannot read text attachment {path}: {exc}") from None
    raise ValueError(f"attachment {path}: no text extraction for kind {kind!r} (pdf and text files are supported)")
