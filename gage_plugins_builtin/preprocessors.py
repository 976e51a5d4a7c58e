"""Preprocessors: records that already are Sample v1, and the legacy field mapping of spec 000."""
from __future__ import annotations

from numbers import Integral
from typing import Any, Mapping

from gage_eval.api import Preprocessor, RowContext, SampleIdentity, from_legacy, jsonio


def row_id(record: Mapping[str, Any], field: str) -> str:
    """The sample id a row's ``field`` holds: a non-empty string, or an integer written out
    (DocVQA's ``questionId``). A bool, a float, a list, an object or null is the row's error
    naming the field, never an id such as ``"{'a': 1}"``; a missing field is a KeyError."""
    value = record[field]
    if (isinstance(value, str) and value) or (isinstance(value, Integral) and not isinstance(value, bool)):
        return str(value)
    raise ValueError(f"field {field!r}: an id must be a non-empty string or an integer, got {jsonio.shown(value)}")


def _sample_id(record: Mapping[str, Any], ctx: RowContext, id_field: str | None) -> str:
    return row_id(record, id_field) if id_field else f"{ctx.task}-{ctx.index}"


def _tags(record: Mapping[str, Any], fields: Any) -> dict:
    if fields is None:  # (the usual case)
        return {}
    if isinstance(fields, str):
        fields = [fields]
    return {f: record[f] for f in fields or [] if record.get(f) is not None}


# Sample v1 rows as they are: the core's reader, the same one ``validate --schema sample`` uses.
Identity = SampleIdentity


class Legacy(Preprocessor):
    """Map legacy fields to Sample v1 (spec 000 section 1.5), with column names as arguments.

    :param question: field holding the question text (default: question/prompt/text).
    :param choices: a field holding a list or mapping of choices, or a list of
        fields each holding one choice (``[sol1, sol2]``).
    :param answer: field holding the answer: an option index, an option id or text.
    :param id_field: field holding a stable id (default: ``TASK-ROWINDEX``).
    :param data_tag: fields copied into ``data_tag`` for sliced metrics.
    :param metadata: fields copied into ``metadata``.
    :param task_type: the Sample's task_type (default: the record's question_type).
    :param system: a system message put first.
    :param unconditioned: field holding the sample's ``unconditioned_input`` (a string or messages),
        the context acc_mutual_info scores each choice after.
    :param unconditioned_text: the same for every row, as a constant (``""`` is lm-eval's empty context).
    :param choice_count: the number of choices every row must have (MMLU's prompt shows four: a row
        with five would be scored on a choice its prompt never showed).
    """

    def __init__(self, question: str | None = None, choices: Any = None, answer: str | None = None,
                 id_field: str | None = None, data_tag: Any = None, metadata: Any = None,
                 task_type: str | None = None, system: str | None = None, unconditioned: str | None = None,
                 unconditioned_text: str | None = None, choice_count: int | None = None):
        if unconditioned is not None and unconditioned_text is not None:
            raise ValueError("give 'unconditioned' (a field) or 'unconditioned_text' (a constant), not both")
        self.question = question
        self.choices = choices
        self.answer = answer
        self.id_field = id_field
        self.data_tag = data_tag
        self.metadata = metadata
        self.task_type = task_type
        self.system = system
        self.unconditioned = unconditioned
        self.unconditioned_text = unconditioned_text
        self.choice_count = choice_count

    def _field(self, record: Mapping[str, Any], name: str) -> Any:
        if record[name] is None and name in (self.question, self.answer):  # (else the default fields are read)
            raise ValueError(f"field {name!r} is null")
        return record[name]

    def __call__(self, record: Mapping[str, Any], ctx: RowContext) -> dict:
        question = self._field(record, self.question) if self.question else None
        if isinstance(self.choices, list):
            choices = []
            for f in self.choices:
                choices.append(self._field(record, f))
            for f, c in zip(self.choices, choices):
                if type(c) is not str and not isinstance(c, str):
                    raise ValueError(f"choice field {f!r} must be a string, got {jsonio.json_type(c)}")
        elif isinstance(self.choices, str):
            choices = self._field(record, self.choices)
        else:
            choices = None
        if self.choice_count is not None and isinstance(choices, (list, dict)) and len(choices) != self.choice_count:
            raise ValueError(f"field {self.choices!r}: {len(choices)} choice(s), where this task's rows have "
                             f"{self.choice_count}")
        answer = self._field(record, self.answer) if self.answer else None
        fields = {"question": self.question, "answer": self.answer,
                  "choices": ", ".join(self.choices) if isinstance(self.choices, list) else self.choices}
        sample = from_legacy(record, sample_id=_sample_id(record, ctx, self.id_field), question=question,
                             choices=choices, answer=answer, task_type=self.task_type, system=self.system,
                             fields={k: v for k, v in fields.items() if v})
        tags = _tags(record, self.data_tag) if self.data_tag is not None else None
        if tags:
            sample["data_tag"] = tags
        if self.unconditioned is not None:
            sample["unconditioned_input"] = self._field(record, self.unconditioned)
        elif self.unconditioned_text is not None:
            sample["unconditioned_input"] = self.unconditioned_text
        meta = _tags(record, self.metadata) if self.metadata is not None else None
        if meta:
            sample.setdefault("metadata", {}).update(meta)
        return sample
