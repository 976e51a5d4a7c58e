"""The metric ids of spec 004 section 8 that gage-eval names otherwise or did not have:
``multi_choice_accuracy``, ``judge_threshold``, ``mmmu_accuracy`` and ``docvqa_anls``.

Each takes the spec's argument names (``label_field``, ``prediction_field``, ``option_map_field``,
``answers_field``, ``judge_field``/``score_field``, ``threshold``) with the spec's defaults, read
through :func:`gage_plugins_builtin.metrics.fields.spec_get` (a spec canonical path a gage-eval
record lacks, such as ``model_output.answer``, is read at its gage-eval place), and reports its
value both as ``value`` (what gage-eval aggregates) and under the spec's ``value_key`` (``acc``,
``score``, ``anls``) in the sample's ``eval_result.metrics``.

``multi_choice_accuracy`` reads the answer from generated text the way lm-evaluation-harness's
generative multiple-choice tasks do (its ``multi_choice_regex`` filter, MMLU generative's answer
regex, then take-first), in this order:

1. the whole answer is an option id, bare or decorated: ``B``, ``(B)``, ``B.``, ``b)``;
2. ``regex_pattern`` (default: an option id after an "answer is" / "answer:" / "option" /
   "choice" lead-in, ``\\(?B\\)?``), the ``group_select``-th match (0: the first), its first
   non-empty group;
3. an option's text in the answer (compared after ``ignore_case``/``ignore_punctuation``/
   ``regexes_to_ignore``, as lm-eval's filter does; the longest option first, whole words only,
   an option's leading and trailing punctuation not required);
4. an option id after a colon (``...: B``), lm-eval's last fallback.

An answer that names no option scores 0 and is counted (``counters: invalid_format``), like
lm-eval's ``[invalid]``. ``<think>...</think>`` blocks are dropped first (spec 004 section 7.2).
"""
from __future__ import annotations

import re
import string
import sys
import unicodedata
from functools import lru_cache
from string import ascii_uppercase as LETTERS
from typing import Any, Mapping, Sequence

from gage_eval.api import Metric, MetricContext, content_text
from gage_plugins_builtin.metrics.fields import as_texts, pick, spec_get, strip_blocks, text_of
from gage_plugins_builtin.multimodal.metrics import ANLS, MMMUAccuracy



@lru_cache(maxsize=1)
def _unicode_punctuation() -> dict:
    """Every Unicode punctuation code point (lm-eval's ignore_punctuation table), built on first use."""
    return dict.fromkeys(i for i in range(sys.maxunicode) if unicodedata.category(chr(i)).startswith("P"))

_EDGE = string.punctuation + string.whitespace


def _ids_alternation(ids: Sequence[str]) -> str:
    return "|".join(re.escape(i) for i in sorted(ids, key=len, reverse=True))


def default_answer_pattern(ids: Sequence[str]) -> str:
    """An option id after an answer lead-in ("The answer is (B)", "Answer: B", "option B"); the
    lead-in in any case, the id as written."""
    lead = r"(?i:\banswer\s*(?:is)?\s*[:\-]?\s*|\boption\s*[:\-]?\s*|\bchoice\s*[:\-]?\s*)"
    return lead + r"\(?(" + _ids_alternation(ids) + r")\)?(?!\w)"


def option_map(value: Any) -> dict[str, str]:
    """``{id: text}`` from a mapping, a list of ``{id|label, content|text}`` items (gage-eval's
    ``options``, the spec's option lists) or a list of texts (lettered A, B, ...)."""
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return {str(k): content_text(v) if isinstance(v, list) else str(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        out: dict[str, str] = {}
        for i, item in enumerate(value):
            if isinstance(item, Mapping):
                key = item.get("id", item.get("label", LETTERS[i] if i < len(LETTERS) else str(i)))
                text = item.get("content", item.get("text", ""))
                out[str(key)] = content_text(text) if isinstance(text, list) else str(text)
            else:
                out[LETTERS[i] if i < len(LETTERS) else str(i)] = str(item)
        return out
    raise ValueError(f"an option map must be a mapping or a list, not {type(value).__name__}")


class MultiChoiceAccuracy(Metric):
    """1 when the option named in the generated answer is the correct one (spec 004
    ``multi_choice_accuracy``, ``value_key: acc``).

    :param prediction_field: the answer's path (``model_output.answer``: gage-eval's
        ``model_output.text`` when the output has no ``answer``).
    :param label_field: the correct choice: an option id, an option's text or a 0-based index
        (``sample.metadata.correct_choice``: gage-eval's ``sample.label`` when absent); a list
        means any of them.
    :param option_map_field: ``{id: text}`` or a list of options (``sample.metadata.option_map``:
        gage-eval's ``sample.options`` when absent). Without options the ids are A-J.
    :param regex_pattern: the answer regex of step 2 (lm-eval's argument name); its first
        non-empty group is the id (or an option's text).
    """

    name = "multi_choice_accuracy"
    counter_descriptions = {"invalid_format": "answers named no option; each was scored 0"}  # (report.html's words)
    value_key = "acc"

    def __init__(self, prediction_field: str = "model_output.answer",
                 label_field: str = "sample.metadata.correct_choice",
                 option_map_field: str = "sample.metadata.option_map", regex_pattern: str | None = None,
                 group_select: int = 0, ignore_case: bool = True, ignore_punctuation: bool = False,
                 regexes_to_ignore: Sequence[str] | None = None, strip_thinking: bool = True):
        self.prediction_field = prediction_field
        self.label_field = label_field
        self.option_map_field = option_map_field
        try:
            self.regex = re.compile(regex_pattern) if regex_pattern else None
            self.ignores = [re.compile(r) for r in regexes_to_ignore or ()]
        except re.error as exc:
            raise ValueError(f"{self.name}: bad regular expression: {exc}") from None
        self.group_select = int(group_select)
        self.ignore_case = bool(ignore_case)
        self.ignore_punctuation = bool(ignore_punctuation)
        self.strip_thinking = bool(strip_thinking)

    # -- reading the sample ------------------------------------------------------------

    def options(self, ctx: MetricContext) -> dict[str, str]:
        return option_map(spec_get(ctx, self.option_map_field, None))

    def answer(self, ctx: MetricContext) -> str:
        try:
            value = spec_get(ctx, self.prediction_field)
        except KeyError:
            raise ValueError(f"no prediction at {self.prediction_field!r} (prediction_field)") from None
        return text_of(value)

    def correct_ids(self, ctx: MetricContext, options: Mapping[str, str]) -> list[str]:
        try:
            value = spec_get(ctx, self.label_field)
        except KeyError:
            raise ValueError(f"no correct choice at {self.label_field!r} (label_field)") from None
        values = value if isinstance(value, (list, tuple)) else [value]
        out = []
        for v in values:
            if isinstance(v, Mapping) or (isinstance(v, list)):
                texts = as_texts([v])
                v = texts[0] if texts else ""
            out.append(self.to_id(v, options))
        if not out:
            raise ValueError(f"no correct choice at {self.label_field!r} (label_field)")
        return out

    def to_id(self, value: Any, options: Mapping[str, str]) -> str:
        """An option id for a label or an extracted answer: an id (any case when ``ignore_case``),
        an option's text, or a 0-based index; else the value itself, stripped."""
        if isinstance(value, bool):
            return str(value)
        ids = list(options) or list(LETTERS[:10])
        if isinstance(value, int) and ids and value not in ids:
            return ids[value] if 0 <= value < len(ids) else str(value)
        text = str(value).strip()
        if text in options:
            return text
        bare = text.strip(_EDGE)
        for i in ids:
            if bare == i or (self.ignore_case and bare.lower() == i.lower()):
                return i
        norm = self._filter(text)
        for i, option in options.items():
            if norm and norm == self._filter(option):
                return i
        if text.isdigit() and ids and 0 <= int(text) < len(ids):
            return ids[int(text)]
        return text

    # -- reading the answer ------------------------------------------------------------

    def _filter(self, text: str) -> str:
        for regex in self.ignores:
            text = regex.sub("", text)
        if self.ignore_case:
            text = text.lower()
        if self.ignore_punctuation:
            text = text.translate(_unicode_punctuation())
        return " ".join(text.split())

    def _first(self, regex: re.Pattern, text: str) -> str | None:
        found = regex.findall(text)
        if not found:
            return None
        try:
            match = found[self.group_select]
        except IndexError:
            return None
        if isinstance(match, tuple):
            match = next((m for m in match if m), "")
        return match.strip() or None

    def extract(self, answer: str, options: Mapping[str, str]) -> tuple[str | None, str]:
        """(the option id the answer names, how it was found) or (None, "invalid")."""
        ids = list(options) or list(LETTERS[:10])
        if self.strip_thinking:
            answer = strip_blocks(answer, ("think",))
        alternation = _ids_alternation(ids)
        flags = re.I if self.ignore_case else 0
        whole = re.fullmatch(r"\W*\(?(" + alternation + r")\)?\W*", answer.strip(), flags)
        if whole:
            return self.to_id(whole.group(1), options), "id"
        regex = self.regex or re.compile(default_answer_pattern(ids))
        got = self._first(regex, answer)
        if got is not None:
            found = self.to_id(got, options)
            if found in ids:
                return found, "regex"
        if options:
            # an option's text without its closing full stop ("Pour it." in "pour it, then")
            texts = {self._filter(t).strip(_EDGE): i for i, t in options.items() if self._filter(t).strip(_EDGE)}
            if texts:
                pattern = re.compile(r"(?<!\w)(?:" + "|".join(
                    re.escape(t) for t in sorted(texts, key=len, reverse=True)) + r")(?!\w)")
                hit = pattern.search(self._filter(answer))
                if hit:
                    return texts[hit.group(0)], "option_text"
        got = self._first(re.compile(r":\s*\(?(" + alternation + r")\)?(?!\w)"), answer)
        if got is not None:
            return self.to_id(got, options), "colon"
        return None, "invalid"

    def compute(self, ctx: MetricContext) -> dict:
        answer = self.answer(ctx)
        options = self.options(ctx)
        correct = self.correct_ids(ctx, options)
        found, method = self.extract(answer, options)
        ok = found is not None and found in correct
        out: dict[str, Any] = {"value": float(ok), self.value_key: float(ok), "correct": ok,
                               "extracted": found or "", "method": method, "reference": ",".join(correct)}
        if found is None:
            out["counters"] = ["invalid_format"]
        return out


class JudgeThreshold(Metric):
    """1 when the judge's score is at least ``threshold``, else 0 (spec 004 ``judge_threshold``,
    ``value_key: score``): a judge's score turned into a pass rate. A row the judge did not grade
    (no verdict, or a verdict without a score: a judge error, counted by the engine) gets no value.

    :param judge_field: the score's path (``judge_output.score``, where gage-eval's judges write
        their 0..1 score); ``score_field`` is the same argument under spec 004 section 10.8.2's name.
    :param threshold: the pass mark (``0.5``).
    """

    name = "judge_threshold"
    value_key = "score"

    def __init__(self, judge_field: str | None = None, threshold: float = 0.5, score_field: str | None = None):
        self.field = pick(self.name, {"judge_field": judge_field, "score_field": score_field}, "judge_output.score")
        try:
            self.threshold = float(threshold)
        except (TypeError, ValueError):
            raise ValueError(f"{self.name}: threshold must be a number, not {threshold!r}") from None

    def compute(self, ctx: MetricContext) -> dict:
        if ctx.judge_output is None and self.field.startswith("judge_output."):
            return {"value": None}
        raw = spec_get(ctx, self.field, None)
        if raw is None:
            return {"value": None}
        try:
            score = float(raw)
        except (TypeError, ValueError):
            raise ValueError(f"judge score at {self.field!r} is not a number: {raw!r}") from None
        ok = score >= self.threshold
        out: dict[str, Any] = {"value": float(ok), self.value_key: float(ok), "correct": ok,
                               "judge_score": score, "threshold": self.threshold, "method": "judge_threshold"}
        label = (ctx.judge_output or {}).get("label")
        if label is not None:
            out["extracted"] = str(label)
        return out


class _SpecFieldsAlias:
    """A gage-eval metric under a spec 004 id: the prediction read at ``self.field`` and the
    golds at ``self.gold_field`` (spec paths, :func:`spec_get`), the value also under the
    spec's ``value_key``."""

    field: str
    gold_field: str
    value_key: str

    def response(self, ctx: MetricContext) -> str:
        return text_of(spec_get(ctx, self.field, None))

    def golds(self, ctx: MetricContext) -> list[str]:
        return as_texts(spec_get(ctx, self.gold_field, None))

    def compute(self, ctx: MetricContext) -> dict:
        out = super().compute(ctx)  # type: ignore[misc]
        out[self.value_key] = out["value"]
        return out


class MMMUAccuracySpec(_SpecFieldsAlias, MMMUAccuracy):
    """gage-eval's ``mmmu_acc`` (MMMU's answer parsing) under spec 004's id ``mmmu_accuracy``
    (``value_key: acc``), with its fields: ``label_field``
    (``sample.choices.0.message.content.0.text``: gage-eval's ``sample.references`` when absent) and
    ``prediction_field`` (``model_output.answer``: ``model_output.text`` when absent)."""

    name = "mmmu_accuracy"
    value_key = "acc"

    def __init__(self, label_field: str = "sample.choices.0.message.content.0.text",
                 prediction_field: str = "model_output.answer", seed: int = 0):
        super().__init__(seed=seed, field=prediction_field)
        self.gold_field = label_field


class DocVQAANLS(_SpecFieldsAlias, ANLS):
    """gage-eval's ``anls`` under spec 004's id ``docvqa_anls`` (``value_key: anls``), with its
    fields: ``answers_field`` (``sample.metadata.answers``: gage-eval's ``sample.references`` when
    absent), ``prediction_field`` (``model_output.answer``: ``model_output.text`` when absent) and
    ``threshold`` (0.5)."""

    name = "docvqa_anls"
    value_key = "anls"

    def __init__(self, answers_field: str = "sample.metadata.answers", prediction_field: str = "model_output.answer",
                 threshold: float = 0.5):
        super().__init__(threshold=threshold, field=prediction_field)
        self.gold_field = answers_field
