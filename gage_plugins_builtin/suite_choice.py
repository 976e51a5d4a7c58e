"""Preprocessors of the standard suite's multiple-choice tasks whose rows lm-evaluation-harness 0.4.13
reshapes in Python: hellaswag's text cleanup, winogrande's split sentence, copa's connective, and the
fixed answer words of the GLUE/SuperGLUE classification tasks (cb, rte, sst2, mrpc).

Each one builds a Sample v1 whose options are the choices lm-eval scores, whose ``label`` is the gold
option's id, and whose ``metadata`` holds the pieces the task's prompt template reads.
"""
from __future__ import annotations

import re
from string import ascii_uppercase as LETTERS
from typing import Any, Mapping, Sequence

from gage_eval.api import Preprocessor, RowContext, SCHEMA_VERSION, jsonio, user_message

_BRACKETED = re.compile(r"\[.*?\]")


def hellaswag_clean(text: str) -> str:
    """HellaSwag's WikiHow rows carry markup such as ``[title]`` and ``[step]``: a title marker
    ends a sentence, other bracketed markers go, and the double spaces left behind become one."""
    text = text.strip().replace(" [title]", ". ")
    return _BRACKETED.sub("", text).replace("  ", " ")


def _sample(ctx: RowContext, question: str, choices: Sequence[str], gold: int, metadata: dict) -> dict:
    if not 0 <= gold < len(choices):
        raise ValueError(f"answer index {gold} is outside the {len(choices)} choices")
    options = [{"id": LETTERS[i], "content": c} for i, c in enumerate(choices)]
    return {
        "schema_version": SCHEMA_VERSION,
        "id": f"{ctx.task}-{ctx.index}",
        "task_type": "multiple-choice",
        "messages": [user_message(question)],
        "options": options,
        "references": [{"answer": [{"type": "text", "text": LETTERS[gold]}]}],
        "label": LETTERS[gold],
        "metadata": metadata,
    }


def text_field(record: Mapping[str, Any], name: str) -> str:
    """The string field ``name`` of ``record`` (KeyError when missing, ValueError when not a string)."""
    if name not in record:
        raise KeyError(name)
    value = record[name]
    if not isinstance(value, str):
        raise ValueError(f"field {name!r} must be a string, got {jsonio.json_type(value)}")
    return value


def _index(record: Mapping[str, Any], name: str) -> int:
    if name not in record:
        raise KeyError(name)
    value = record[name]
    value = int(value) if type(value) is float and value.is_integer() else value  # (1.0 is JSON's 1)
    if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, str) and value.strip().isdecimal()
                                                                  and len(value) < 20)):
        raise ValueError(f"field {name!r} must be an answer index, got {jsonio.shown(value)}")
    return int(value)


class HellaSwag(Preprocessor):
    """A HellaSwag row (``activity_label, ctx_a, ctx_b, endings, label``): the context is the
    activity label, ": ", ``ctx_a``, a space and ``ctx_b`` capitalized (``str.capitalize``: first
    letter up, the rest down), cleaned by :func:`hellaswag_clean` as each ending is."""

    def __call__(self, record: Mapping[str, Any], ctx: RowContext) -> dict:
        context = text_field(record, "ctx_a") + " " + text_field(record, "ctx_b").capitalize()
        query = hellaswag_clean(text_field(record, "activity_label") + ": " + context)
        endings = record.get("endings")
        if not isinstance(endings, list) or not endings or not all(isinstance(e, str) for e in endings):
            raise ValueError("field 'endings' must be a non-empty list of strings")
        return _sample(ctx, query, [hellaswag_clean(e) for e in endings], _index(record, "label"),
                       {"query": query})


class Winogrande(Preprocessor):
    """A Winogrande row (``sentence`` with one ``_``, ``option1``, ``option2``, ``answer`` "1"/"2"):
    each choice is the sentence up to the blank with that option filled in, and ``metadata.rest``
    is the sentence after the blank, stripped: the continuation scored after each choice
    (the task sets ``request.choices_are_contexts``)."""

    def __call__(self, record: Mapping[str, Any], ctx: RowContext) -> dict:
        sentence = text_field(record, "sentence")
        blank = sentence.find("_")
        if blank < 0:
            raise ValueError("field 'sentence' has no blank '_'")
        head, rest = sentence[:blank], sentence[blank + 1:].strip()
        choices = [head + text_field(record, "option1"), head + text_field(record, "option2")]
        if _index(record, "answer") not in (1, 2):  # "1"/"2" (a CSV's column: 1/2)
            raise ValueError(f"field 'answer' must be '1' or '2', got {jsonio.shown(record['answer'])}")
        return _sample(ctx, sentence, choices, _index(record, "answer") - 1, {"rest": rest})


_CONNECTIVES = {"cause": "because", "effect": "therefore"}


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]


class Copa(Preprocessor):
    """A COPA row (``premise, choice1, choice2, question, label``): the context is the premise
    without its final character (the full stop) and the connective the question asks for
    ("because" for a cause, "therefore" for an effect); each choice is a space and the choice
    with its first letter lower-cased (scored after the target delimiter, so two spaces in all,
    as lm-eval scores it)."""

    def __call__(self, record: Mapping[str, Any], ctx: RowContext) -> dict:
        question = text_field(record, "question")
        if question not in _CONNECTIVES:
            raise ValueError(f"field 'question' must be 'cause' or 'effect', got {jsonio.shown(question)}")
        context = text_field(record, "premise").strip()[:-1] + " " + _CONNECTIVES[question]
        choices = [" " + _lower_first(text_field(record, "choice1")), " " + _lower_first(text_field(record, "choice2"))]
        return _sample(ctx, context, choices, _index(record, "label"), {"connective": _CONNECTIVES[question]})


class FixedChoices(Preprocessor):
    """A classification row whose choices are the same answer words on every row (cb, rte, sst2,
    mrpc): ``choices`` the words in label order, ``answer`` the field holding the label index,
    ``fields`` the text fields copied into ``metadata`` for the prompt template (the first is the
    Sample's question)."""

    def __init__(self, choices: Sequence[str], fields: Sequence[str], answer: str = "label"):
        if not choices or not all(isinstance(c, str) for c in choices):
            raise ValueError("choices must be a non-empty list of strings")
        if not fields:
            raise ValueError("fields must name at least one text field")
        self.choices = list(choices)
        self.fields = list(fields)
        self.answer = answer

    def __call__(self, record: Mapping[str, Any], ctx: RowContext) -> dict:
        texts = {name: text_field(record, name) for name in self.fields}
        return _sample(ctx, texts[self.fields[0]], self.choices, _index(record, self.answer), texts)
