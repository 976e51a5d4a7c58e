"""Row layouts of the standard suite's question-answering sets, read as lm-evaluation-harness 0.4.13 reads them.

Two layouts cover ARC, OpenBookQA, CommonsenseQA, SciQ, Social IQa and BoolQ:

- ``labeled_choices``: a ``choices`` column ``{"text": [...], "label": [...]}`` and an answer
  column naming one of the labels (ARC, OpenBookQA, CommonsenseQA). One option per label, in
  the row's order, the label as the option id: the gold option is the one whose label is the
  answer key (lm-eval's ``choices.label.index(answerKey)``).
- ``choice_columns``: each choice in a column of its own (SciQ's distractors and correct
  answer, Social IQa's answerA/B/C), or the same choices on every row (BoolQ's no/yes). The
  gold choice is a column read as a position (counted from 0, or from 1 where the dataset
  counts so: Social IQa's ``label`` "1", "2", "3"; a bool counts False as 0 and True as 1:
  BoolQ's ``answer``), or one fixed position on every row (SciQ's correct answer, last).

Both copy the columns a prompt template needs besides the question (SciQ's ``support``, Social
IQa's ``context``, BoolQ's ``passage``) into the sample's metadata, where the template reads them
as ``metadata.NAME``.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from gage_eval.api import Preprocessor, RowContext, from_legacy, jsonio


def _key(value: Any) -> bool:
    """Whether ``value`` can be a choice label or an answer key: a string, or an integer (no bool)."""
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def _column(record: Mapping[str, Any], name: str) -> Any:
    if name not in record:
        raise KeyError(name)
    return record[name]


def _names(value: Any) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def _with_metadata(sample: dict, record: Mapping[str, Any], columns: Sequence[str]) -> dict:
    if columns:
        meta = sample.setdefault("metadata", {})
        for name in columns:
            meta[name] = _column(record, name)
    return sample


def _question(record: Mapping[str, Any], name: str) -> str:
    value = _column(record, name)
    if not isinstance(value, str):
        raise ValueError(f"{name}: the question must be a string, got {jsonio.json_type(value)}")
    return value


class LabeledChoices(Preprocessor):
    """Rows with a ``{"text": [...], "label": [...]}`` choices column and an answer-key column.

    :param question: the column holding the question text (OpenBookQA: ``question_stem``).
    :param choices: the choices column.
    :param answer: the column holding the gold label; surrounding spaces are dropped
        (lm-eval strips OpenBookQA's, the other sets have none).
    :param metadata: columns copied into the sample's metadata for the prompt template.
    """

    def __init__(self, question: str = "question", choices: str = "choices", answer: str = "answerKey",
                 metadata: Any = None):
        self.question = question
        self.choices = choices
        self.answer = answer
        self.metadata = _names(metadata)

    def __call__(self, record: Mapping[str, Any], ctx: RowContext) -> dict:
        raw = _column(record, self.choices)
        if not isinstance(raw, Mapping) or not isinstance(raw.get("text"), list) \
                or not isinstance(raw.get("label"), list):
            raise ValueError(f"{self.choices}: expected {{'text': [...], 'label': [...]}}")
        texts, labels = raw["text"], [str(label) for label in raw["label"]]
        bad = [v for v in raw["label"] if not _key(v)] + [v for v in texts if not isinstance(v, str)]
        if bad:
            raise ValueError(f"{self.choices}: a label or text is {jsonio.shown(bad[0])}, not a string")
        if len(texts) != len(labels) or not texts:
            raise ValueError(f"{self.choices}: {len(texts)} texts for {len(labels)} labels")
        if len(set(labels)) != len(labels):
            raise ValueError(f"{self.choices}: the labels {labels} repeat")
        key = _column(record, self.answer)
        key = int(key) if type(key) is float and key.is_integer() else key
        key = str(key).strip() if _key(key) else key
        if key not in labels:
            raise ValueError(f"{self.answer}: {jsonio.shown(key)} is not one of the labels {', '.join(labels)}")
        options = [{"id": label, "content": text} for label, text in zip(labels, texts)]
        sample = from_legacy(record, sample_id=f"{ctx.task}-{ctx.index}",
                             question=_question(record, self.question), choices=options, answer=key,
                             fields={"question": self.question, "choices": self.choices, "answer": self.answer})
        return _with_metadata(sample, record, self.metadata)


class ChoiceColumns(Preprocessor):
    """Rows with one column a choice, or the same choices on every row.

    :param question: the column holding the question text.
    :param choices: the columns holding the choices, in order (``[answerA, answerB, answerC]``).
    :param choice_texts: instead of ``choices``, the same choices for every row (``[no, yes]``).
    :param answer: the column holding the gold choice's position: an integer, a string of
        digits, or a bool (False 0, True 1).
    :param answer_base: the position the ``answer`` column gives the first choice (0 or 1).
    :param answer_index: instead of ``answer``, the gold choice's position on every row.
    :param metadata: columns copied into the sample's metadata for the prompt template.
    """

    def __init__(self, question: str = "question", choices: Any = None, choice_texts: Any = None,
                 answer: str | None = None, answer_base: int = 0, answer_index: int | None = None,
                 metadata: Any = None):
        if (choices is None) == (choice_texts is None):
            raise ValueError("give 'choices' (columns) or 'choice_texts' (the same on every row), one of them")
        if (answer is None) == (answer_index is None):
            raise ValueError("give 'answer' (a column) or 'answer_index' (one position), one of them")
        if answer_base not in (0, 1):
            raise ValueError(f"answer_base is 0 or 1, got {answer_base!r}")
        self.question = question
        self.choices = _names(choices)
        self.choice_texts = [str(t) for t in _names(choice_texts)]
        self.answer = answer
        self.answer_base = answer_base
        self.answer_index = answer_index
        self.metadata = _names(metadata)

    def _texts(self, record: Mapping[str, Any]) -> list[str]:
        if self.choice_texts:
            return list(self.choice_texts)
        texts = []
        for name in self.choices:
            value = _column(record, name)
            if not isinstance(value, str):
                raise ValueError(f"{name}: a choice must be a string, got {jsonio.json_type(value)}")
            texts.append(value)
        return texts

    def _gold(self, record: Mapping[str, Any], count: int) -> int:
        if self.answer_index is not None:
            gold = self.answer_index
        else:
            value = _column(record, self.answer)
            value = int(value) if type(value) is float and value.is_integer() else value  # (1.0 is JSON's 1)
            if isinstance(value, bool) and self.answer_base == 0:  # (BoolQ: counted from 1, true would be the first)
                gold = int(value)
            elif not isinstance(value, bool) and (isinstance(value, int) or (
                    isinstance(value, str) and value.strip().isdecimal() and len(value) < 20)):
                gold = int(value) - self.answer_base
            else:
                raise ValueError(f"{self.answer}: {jsonio.shown(value)} is not a choice position")
        if not 0 <= gold < count:
            raise ValueError(f"{self.answer or 'answer_index'}: position {gold} is outside the {count} choices")
        return gold

    def __call__(self, record: Mapping[str, Any], ctx: RowContext) -> dict:
        texts = self._texts(record)
        gold = self._gold(record, len(texts))
        fields = {"question": self.question}
        if self.answer:
            fields["answer"] = self.answer
        if self.choices:
            fields["choices"] = ", ".join(self.choices)
        sample = from_legacy(record, sample_id=f"{ctx.task}-{ctx.index}",
                             question=_question(record, self.question), choices=texts, answer=gold,
                             fields=fields)
        return _with_metadata(sample, record, self.metadata)
