"""LLMJudge: a model in the judge role grades answers against references or a weighted rubric.

Judge prompts are Jinja2 templates in the task folder. Replies are parsed as a JSON object,
a ``SCORE: x`` line, or a verdict word (correct/incorrect, yes/no, pass/fail, true/false,
met/not met); a reply that says none of these makes the verdict an error, which the engine
counts as a judge error, never as a score of 0.
"""
from __future__ import annotations

import json
import math
import re
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any, Mapping, Sequence

from gage_eval.api import (GENERATE, GageError, Judge, ModelOutput, Request, Template, Verdict, content_text,
                           last_user_text, reference_texts, text_segment)
from gage_plugins_builtin.metrics.fields import strip_blocks

REASONING_NAMES = ("think", "thinking", "reasoning", "reflection")  # <NAME>...</NAME> blocks strip_reasoning drops
SCORE_LINE = re.compile(r"\bscore\s*[:=]\s*\**\s*(-?\d+(?:\.\d+)?)\s*(?:(/)\s*(\d+(?:\.\d+)?)|(%))?", re.I)
POSITIVE = ("correct", "yes", "pass", "passed", "true", "met", "satisfied", "fulfilled")
NEGATIVE = ("incorrect", "no", "fail", "failed", "false", "not met", "unmet", "not satisfied", "wrong")
JSON_SCORE_KEYS = ("score", "result", "rating", "grade", "criteria_met", "met", "correct", "passed", "verdict", "label")


class ReplyError(ValueError):
    """A judge reply that says no score."""


def strip_reasoning(text: str) -> str:
    """The answer without ``<think>``-style blocks (PRBench cleans responses the same way)."""
    return strip_blocks(text or "", REASONING_NAMES, then_space=True).strip()


def _word_score(text: str) -> float | None:
    low = text.strip().strip("*`'\".").lower()
    if low in NEGATIVE:
        return 0.0
    if low in POSITIVE:
        return 1.0
    return None


def json_objects(text: str) -> list[dict]:
    """Every JSON object embedded in ``text`` (a judge's reply), in order of appearance."""
    decoder = json.JSONDecoder()
    found = []
    for match in re.finditer(r"\{", text):
        try:
            obj, _ = decoder.raw_decode(text[match.start():])
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            found.append(obj)
    return found


def _number(value: Any, max_score: float) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)) and math.isfinite(value):
        value = float(value)
    elif isinstance(value, str):
        word = _word_score(value)
        if word is not None:
            return word
        try:
            value = float(value.strip().rstrip("%"))
        except ValueError:
            return None
    else:
        return None
    if 0.0 <= value <= 1.0:
        return value
    if 1.0 < value <= max_score:
        return value / max_score
    raise ReplyError(f"score {value} is outside 0..{max_score:g}")


def parse_reply(text: str | None, max_score: float = 10.0) -> tuple[float, str | None]:
    """(score in 0..1, reason) from a judge reply; :class:`ReplyError` when it says no score."""
    if text is None or not text.strip():
        raise ReplyError("empty judge reply")
    body = strip_reasoning(text)
    for obj in reversed(json_objects(body)):
        for key in JSON_SCORE_KEYS:
            if key in obj:
                score = _number(obj[key], max_score)
                if score is not None:
                    reason = obj.get("reason") or obj.get("explanation") or obj.get("rationale")
                    return score, str(reason) if reason is not None else None
    match = None
    for match in SCORE_LINE.finditer(body):
        pass
    if match:
        value = float(match.group(1))
        if match.group(2):
            denom = float(match.group(3))
            if denom <= 0 or not 0 <= value <= denom:
                raise ReplyError(f"score {value}/{denom} is not a fraction")
            return value / denom, None
        if match.group(4):
            if not 0 <= value <= 100:
                raise ReplyError(f"score {value}% is outside 0..100")
            return value / 100, None
        score = _number(value, max_score)
        if score is not None:
            return score, None
    lines = [ln for ln in body.splitlines() if ln.strip()]
    for candidate in ([lines[-1], lines[0]] if lines else []):
        head = re.split(r"[:\-–.,]", candidate.strip(), maxsplit=1)
        for piece in (candidate, head[0], re.sub(r"^(verdict|answer|result|grade|judgement|judgment)\s*[:=]\s*", "",
                                                 candidate.strip(), flags=re.I)):
            word = _word_score(piece)
            if word is not None:
                return word, candidate.strip() if piece != candidate else None
    raise ReplyError(f"no score in judge reply {text.strip()[:120]!r}")


def round_half_up(x: float, step: float) -> float:
    steps = Decimal(str(x)) / Decimal(str(step))
    return float(steps.quantize(Decimal(1), rounding=ROUND_HALF_UP) * Decimal(str(step)))


class LLMJudge(Judge):
    """Grade a model's answer with a judge model.

    Mode per sample: ``rubric`` when ``eval_config.rubric`` is present (one judge request per
    criterion; the score is the weighted share of points met, negative weights subtracting,
    clipped to 0..1), else ``reference`` when the sample has references (one request; the
    judge's score in 0..1). Samples whose ``task_type`` is in ``skip_task_types`` get no request.

    :param reference_template: Jinja2 file in the task folder for reference grading.
    :param rubric_template: Jinja2 file for one rubric criterion.
    :param system: optional Jinja2 file for a system message sent before each judge prompt.
    :param generation: judge generation settings (``max_new_tokens``, ``temperature``, ...).
    :param max_score: replies above 1 and up to this are read as out of it (``7/10`` too).
    :param score_step: round reference scores half up to this step (0.1 as LEXam does); 0: off.
    :param pass_threshold: a verdict's label is ``pass`` at or above it.
    """

    name = "llm_judge"

    def __init__(self, base_dir: str = ".", reference_template: str | None = None,
                 rubric_template: str | None = None, system: str | None = None, generation: Mapping | None = None,
                 chat: bool = True, max_score: float = 10.0, score_step: float = 0.0, pass_threshold: float = 0.5,
                 skip_task_types: Sequence[str] = ("mcq",)):
        folder = Path(base_dir)
        self.templates: dict[str, Template] = {}
        for mode, file in (("reference", reference_template), ("rubric", rubric_template), ("system", system)):
            if file:
                path = folder / file
                if not path.is_file():
                    raise GageError(f"{folder / 'task.yaml'}: judge template {file!r} not found in {folder}")
                self.templates[mode] = Template.from_file(path)
        if "reference" not in self.templates and "rubric" not in self.templates:
            raise GageError(f"{folder / 'task.yaml'}: llm_judge needs reference_template or rubric_template")
        self.generation = dict(generation or {"max_new_tokens": 256, "temperature": 0.0})
        self.chat = chat
        self.max_score = float(max_score)
        self.score_step = float(score_step)
        self.pass_threshold = float(pass_threshold)
        self.skip = set(skip_task_types or ())

    # -- requests ---------------------------------------------------------------
    def mode(self, sample: Mapping[str, Any]) -> str | None:
        if sample.get("task_type") in self.skip:
            return None
        if (sample.get("eval_config") or {}).get("rubric"):
            if "rubric" not in self.templates:
                raise ValueError("the sample has a rubric but the judge has no rubric_template")
            return "rubric"
        if sample.get("references"):  # (whether it has any: their texts are read once, for the prompt)
            if "reference" not in self.templates:
                raise ValueError("the sample has references but the judge has no reference_template")
            return "reference"
        raise ValueError("nothing to judge against: the sample has neither a rubric nor references")

    def variables(self, sample: Mapping[str, Any], model_output: Mapping[str, Any]) -> dict:
        messages = sample.get("messages") or []
        metadata = sample.get("metadata") or {}
        conversation = "\n\n".join(f"{m.get('role')}: {content_text(m.get('content'))}" for m in messages)
        return {
            "sample": sample, "metadata": metadata, "policy_id": metadata.get("policy_id"),
            "question": last_user_text(messages), "conversation": conversation,
            "prompt": model_output.get("prompt") or last_user_text(messages),
            "context": metadata.get("context") or "",
            "references": reference_texts(sample),
            "response": strip_reasoning(model_output.get("text") or ""),
        }

    def _request(self, sid: str, text: str, variables: dict) -> Request:
        messages = []
        if "system" in self.templates:
            messages.append({"role": "system", "content": [text_segment(self.templates["system"].render(**variables))]})
        messages.append({"role": "user", "content": [text_segment(text)]})
        return Request(kind=GENERATE, sample_id=sid, prompt=text, messages=tuple(messages), chat=self.chat,
                       gen=dict(self.generation))

    def requests(self, sample: Mapping[str, Any], model_output: Mapping[str, Any]) -> list[Request]:
        mode = self.mode(sample)
        if mode is None:
            return []
        sid = str(sample["id"])
        variables = self.variables(sample, model_output)
        if mode == "reference":
            return [self._request(f"{sid}#judge", self.templates["reference"].render(**variables), variables)]
        out = []
        for i, criterion in enumerate(sample["eval_config"]["rubric"]):
            v = dict(variables, criterion=criterion, criterion_index=i)
            out.append(self._request(f"{sid}#judge:{criterion.get('id', i)}", self.templates["rubric"].render(**v), v))
        return out

    # -- verdicts ---------------------------------------------------------------
    def verdict(self, sample: Mapping[str, Any], model_output: Mapping[str, Any],
                replies: Sequence[ModelOutput]) -> Verdict:
        mode = self.mode(sample)
        raw = [r.text for r in replies]
        if mode == "reference":
            if len(replies) != 1:
                return Verdict(score=None, error=f"expected 1 judge reply, got {len(replies)}")
            reply = replies[0]
            if reply.error:
                return Verdict(score=None, raw=reply.text, error=f"judge model: {reply.error}")
            try:
                score, reason = parse_reply(reply.text, self.max_score)
            except ReplyError as exc:
                return Verdict(score=None, raw=reply.text, error=str(exc))
            if self.score_step:
                score = round_half_up(score, self.score_step)
            return Verdict(score=score, label=self._label(score), reason=reason, raw=reply.text,
                           details={"mode": "reference"})
        rubric = (sample.get("eval_config") or {}).get("rubric") or []
        if len(replies) != len(rubric):
            return Verdict(score=None, error=f"expected {len(rubric)} judge replies (one per criterion), got {len(replies)}")
        items, failures = [], []
        for criterion, reply in zip(rubric, replies):
            weight = float(criterion.get("weight", 1.0) if criterion.get("weight") is not None else 1.0)
            entry: dict[str, Any] = {"id": criterion.get("id"), "weight": weight}
            if reply.error:
                failures.append(f"{criterion.get('id')}: judge model: {reply.error}")
                entry["error"] = reply.error
            else:
                try:
                    score, reason = parse_reply(reply.text, self.max_score)
                    entry["met"] = score >= 0.5
                    if reason:
                        entry["reason"] = reason
                except ReplyError as exc:
                    failures.append(f"{criterion.get('id')}: {exc}")
                    entry["error"] = str(exc)
                entry["raw"] = reply.text
            items.append(entry)
        details = {"mode": "rubric", "criteria": items}
        if failures:
            return Verdict(score=None, raw="\n---\n".join(t or "" for t in raw), details=details,
                           error=f"{len(failures)} of {len(rubric)} rubric criteria unparseable; first: {failures[0]}")
        possible = sum(i["weight"] for i in items if i["weight"] > 0)
        if possible <= 0:
            return Verdict(score=None, details=details, error="the rubric has no criterion of positive weight")
        earned = sum(i["weight"] for i in items if i["met"])
        score = min(1.0, max(0.0, earned / possible))
        details.update(earned=earned, possible=possible, met=sum(1 for i in items if i["met"]))
        return Verdict(score=score, label=self._label(score), details=details)

    def _label(self, score: float) -> str:
        return "pass" if score >= self.pass_threshold else "fail"
