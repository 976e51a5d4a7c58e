"""``--strip-reasoning``: score the answer after a model's ``<think>...</think>`` reasoning.

The rule (lm-evaluation-harness's ``think_end_token`` post-processing, with vLLM's reasoning
parsers' reading of an unfinished block):

- a text holding ``</think>``: what follows its last occurrence, leading whitespace removed;
- a text that opens ``<think>`` and never closes it (cut off by ``max_new_tokens`` while
  reasoning): no answer, the empty string;
- any other text: unchanged.

The text the model wrote stays in the record as ``raw_text``; metrics and judges see the answer.
Stop sequences still apply to the whole generation, the reasoning included (the backend stops
there while generating, as lm-eval's do).
"""
from __future__ import annotations

from typing import Any, MutableMapping

THINK_START = "<think>"
THINK_END = "</think>"


def strip_reasoning(text: str) -> str:
    """The answer part of ``text`` by the module's rule."""
    head, sep, tail = text.rpartition(THINK_END)
    if sep:
        return tail.lstrip()
    return "" if THINK_START in text else text


def strip_output(output: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """A model output dict with ``text`` stripped and the original kept as ``raw_text`` (only
    when stripping changed it)."""
    text = output.get("text")
    if isinstance(text, str):
        answer = strip_reasoning(text)
        if answer != text:
            output["raw_text"] = text
            output["text"] = answer
    return output
