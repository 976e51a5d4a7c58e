"""Perplexity tasks: documents scored whole (``loglikelihood_rolling``), as lm-evaluation-harness 0.4.13's
wikitext and its generic perplexity tasks count them.

A document's Sample holds its text as the one user message (the text the model scores, also its
one reference: lm-eval's target) and, in
``metadata``, the counts its perplexities divide by: ``words``, the pieces ``re.split(r"\\s+", text)``
makes (lm-eval's ``count_words``: a leading or trailing space adds an empty piece), and ``bytes``,
its UTF-8 length. The corpus-level metrics (:mod:`gage_plugins_builtin.metrics.perplexity`) pool
every document's log-likelihood and counts.

- ``document``: any row with a text column (``{"text": "..."}``; a ``.txt`` file read by the
  ``text`` loader is such a row): the text is scored and counted as it is.
- ``wikitext``: a row of ``EleutherAI/wikitext_document_level`` (``{"page": "..."}``): the page is
  scored after lm-eval's wikitext detokenization (`` @-@ `` back to ``-``, spaces around
  punctuation and brackets removed), while words and bytes are counted in the page as written,
  as lm-eval counts them.
"""
from __future__ import annotations

import re
from typing import Any, Mapping

from gage_eval.api import Preprocessor, RowContext, SCHEMA_VERSION, user_message

from gage_plugins_builtin.suite_choice import text_field

_SPACES = re.compile(r"\s+")


def count_words(text: str) -> int:
    """lm-eval's word count: the pieces of ``text`` split at each run of whitespace."""
    return len(_SPACES.split(text))


def count_bytes(text: str) -> int:
    return len(text.encode("utf-8"))


def _document(record: Mapping[str, Any], field: str) -> str:
    text = text_field(record, field)
    if not text:
        raise ValueError(f"field {field!r} is empty: a document needs at least one token to score")
    return text


def document_sample(ctx: RowContext, sample_id: str, scored: str, counted: str, metadata: dict) -> dict:
    """A Sample scoring ``scored`` whole, with the word and byte counts of ``counted``."""
    return {
        "schema_version": SCHEMA_VERSION,
        "id": sample_id,
        "task_type": "perplexity",
        "messages": [user_message(scored)],
        "references": [scored],  # the text is its own target, as lm-eval's doc_to_target
        "metadata": {**metadata, "words": count_words(counted), "bytes": count_bytes(counted)},
    }


class Document(Preprocessor):
    """A document scored and counted as it is.

    :param field: the column holding the text (default ``text``).
    :param id_field: a column holding a stable id (default: ``TASK-ROWINDEX``).
    :param metadata: columns copied into ``metadata`` (a name or a list).
    """

    def __init__(self, field: str = "text", id_field: str | None = None, metadata: Any = None):
        self.field = field
        self.id_field = id_field
        self.keep = [metadata] if isinstance(metadata, str) else list(metadata or [])

    def sample_id(self, record: Mapping[str, Any], ctx: RowContext) -> str:
        if self.id_field:
            if record.get(self.id_field) is None:
                raise ValueError(f"id field {self.id_field!r} is missing")
            return str(record[self.id_field])
        return f"{ctx.task}-{ctx.index}"

    def kept(self, record: Mapping[str, Any]) -> dict:
        return {k: record[k] for k in self.keep if record.get(k) is not None}

    def __call__(self, record: Mapping[str, Any], ctx: RowContext) -> dict:
        text = _document(record, self.field)
        return document_sample(ctx, self.sample_id(record, ctx), text, text, self.kept(record))


# lm-eval 0.4.13's wikitext detokenizer, rule by rule (wikitext-103/-2 "raw" pages put spaces
# around punctuation and write in-word hyphens and number separators as " @-@ ", " @,@ ", " @.@ ")
_PLAIN = (("s '", "s'"), (" @-@ ", "-"), (" @,@ ", ","), (" @.@ ", "."), (" : ", ": "), (" ; ", "; "),
          (" . ", ". "), (" ! ", "! "), (" ? ", "? "), (" , ", ", "))
_BRACKETS = ((re.compile(r"\(\s*([^\)]*?)\s*\)"), r"(\1)"), (re.compile(r"\[\s*([^\]]*?)\s*\]"), r"[\1]"),
             (re.compile(r"{\s*([^}]*?)\s*}"), r"{\1}"), (re.compile(r"\"\s*([^\"]*?)\s*\""), r'"\1"'),
             (re.compile(r"'\s*([^']*?)\s*'"), r"'\1'"))
_AFTER = (("= = = =", "===="), ("= = =", "==="), ("= =", "=="), (" \u00b0 ", "\u00b0"), (" \n", "\n"),
          ("\n ", "\n"), (" N ", " 1 "), (" 's", "'s"))


def wikitext_detokenize(page: str) -> str:
    """A wikitext "raw" page as lm-eval's ``wikitext_detokenizer`` turns it back into plain text."""
    text = page.replace(*_PLAIN[0])
    text = re.sub(r"/' [0-9]/", r"/'[0-9]/", text)  # (matches only a literal "/' 7/", as lm-eval's)
    for old, new in _PLAIN[1:]:
        text = text.replace(old, new)
    for pattern, repl in _BRACKETS:
        text = pattern.sub(repl, text)
    for old, new in _AFTER:
        text = text.replace(old, new)
    return text


class Wikitext(Document):
    """A wikitext page: scored detokenized, counted as written (lm-eval's wikitext).

    :param field: the column holding the page (default ``page``).
    :param id_field: a column holding a stable id (default: ``TASK-ROWINDEX``).
    :param metadata: columns copied into ``metadata``.
    """

    def __init__(self, field: str = "page", id_field: str | None = None, metadata: Any = None):
        super().__init__(field, id_field, metadata)

    def __call__(self, record: Mapping[str, Any], ctx: RowContext) -> dict:
        page = _document(record, self.field)
        return document_sample(ctx, self.sample_id(record, ctx), wikitext_detokenize(page), page, self.kept(record))
