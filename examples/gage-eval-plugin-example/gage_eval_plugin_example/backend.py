"""A keyword-lookup "model": answers a question from a small table of facts.

Each fact has keywords and an answer. For every request the backend finds
the fact whose keywords cover most words of the prompt's last question line
and answers with it; when no keyword is present it says it does not know.
It is deterministic, needs no weights, and declares only the ``generate`` and
``chat`` capabilities, so a log-likelihood task is refused before it starts.
"""
from __future__ import annotations

import json
import re
import time
from importlib import resources
from pathlib import Path
from typing import Sequence

from gage_eval.api import GENERATE, Backend, GageError, ModelOutput, Request, messages_text

UNKNOWN = "I don't know."
_WORD = re.compile(r"[a-z0-9]+")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def load_facts(path: str | None) -> list[dict]:
    """The fact table: a JSON list of ``{"keywords": [...], "answer": "..."}``."""
    if path is None:
        text = resources.files("gage_eval_plugin_example").joinpath("facts.json").read_text(encoding="utf-8")
        where = "the built-in facts.json"
    else:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise GageError(f"example/lookup: facts={path}: cannot read: {exc.strerror}") from None
        where = path
    try:
        facts = json.loads(text)
    except json.JSONDecodeError as exc:
        raise GageError(f"example/lookup: {where}:{exc.lineno}: invalid JSON: {exc.msg}") from None
    if not isinstance(facts, list):
        raise GageError(f"example/lookup: {where}: expected a list of facts, got {type(facts).__name__}")
    for i, fact in enumerate(facts):
        if not (isinstance(fact, dict) and isinstance(fact.get("answer"), str)
                and isinstance(fact.get("keywords"), list) and fact["keywords"]
                and all(isinstance(k, str) and words(k) for k in fact["keywords"])):
            raise GageError(f"example/lookup: {where}: fact {i}: expected "
                            '{"keywords": [non-empty strings], "answer": string}')
    return facts


class LookupBackend(Backend):
    """``facts``: a JSON file of facts (default: the bundled table).
    ``unknown``: what to answer when no keyword matches."""

    name = "example/lookup"
    capabilities = frozenset({GENERATE, "chat"})

    def __init__(self, facts: str | None = None, unknown: str = UNKNOWN, batch_size: int | str = 32,
                 seed: int = 0, **unused):
        if unused:
            raise GageError(f"example/lookup: unknown argument(s) {', '.join(sorted(unused))}; "
                            "it takes facts=PATH, unknown=TEXT, batch_size=N")
        self.facts_path = facts
        self.unknown = unknown
        self.max_batch = int(batch_size) if str(batch_size).isdigit() else 32
        self.model_id = "gage-eval-plugin-example/lookup"
        self.facts: list[dict] = []
        # each fact's keywords as word tuples, so "new zealand" matches as a phrase
        self._index: list[tuple[tuple[str, ...], ...]] = []

    def open(self) -> None:
        self.facts = load_facts(self.facts_path)
        self._index = [tuple(tuple(words(k)) for k in f["keywords"]) for f in self.facts]

    def settings(self) -> dict:
        return {"facts": self.facts_path or "builtin", "n_facts": len(self.facts), "unknown": self.unknown,
                "batch_size": self.max_batch}

    def answer(self, question: str) -> str:
        """The answer of the fact whose keywords cover the most question words (first wins a tie)."""
        q = words(question)
        joined = " " + " ".join(q) + " "
        best, best_score = None, 0
        for fact, keywords in zip(self.facts, self._index):
            score = sum(len(k) for k in keywords if " " + " ".join(k) + " " in joined)
            if score > best_score:
                best, best_score = fact, score
        return best["answer"] if best is not None else self.unknown

    def run(self, requests: Sequence[Request]) -> list[ModelOutput]:
        return [self._one(r) for r in requests]

    def _one(self, req: Request) -> ModelOutput:
        t0 = time.perf_counter()
        prompt = req.prompt if req.prompt is not None and not req.chat else messages_text(req.messages or ())
        # the question is the last non-empty line that is not an answer cue such as "Answer:"
        lines = [ln for ln in prompt.splitlines() if ln.strip() and not ln.strip().endswith(":")]
        question = lines[-1] if lines else prompt
        text = self.answer(question)
        return ModelOutput(text=text, input_tokens=len(words(prompt)), output_tokens=len(words(text)),
                           finish_reason="stop", latency_ms=(time.perf_counter() - t0) * 1000)
