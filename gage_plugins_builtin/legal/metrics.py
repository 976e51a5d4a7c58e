"""legal_eval_v1 metrics: programmatic mcq grading and the judge's score (spec 003 grading contract)."""
from __future__ import annotations

import re
from typing import Any, Sequence

from gage_eval.api import Metric, MetricContext

from gage_plugins_builtin.judges import json_objects, strip_reasoning

_SEP = r"(?:\s*(?:,|and|und|et|e|y|&|/|\+)\s*|\s+)"


def _id_pattern(ids: Sequence[str]) -> str:
    return "|".join(re.escape(i) for i in sorted(ids, key=len, reverse=True))


def parse_choice_ids(text: str, ids: Sequence[str]) -> tuple[list[str], str] | None:
    """The set of choice ids an answer names, and how it was found; ``None`` when it names none.

    In order: a JSON object's ``answer``/``answers``/``choice`` (string or list); the last
    ``Answer: X[, Y]`` line (also ``\\boxed{X}``, "the answer is X"); a reply that is only ids.
    """
    body = strip_reasoning(text or "")
    if not body:
        return None
    idset = set(ids)
    pat = _id_pattern(ids)
    one = rf"\(?(?:{pat})\)?(?![\w])"
    for obj in reversed(json_objects(body)):
        for key in ("answer", "answers", "choice", "choices", "correct_choice_ids"):
            value = obj.get(key)
            if isinstance(value, str):
                value = re.split(r"[,\s]+", value.strip())
            if isinstance(value, list):
                found = [str(v).strip("() .") for v in value]
                if found and all(f in idset for f in found):
                    return _order(found, ids), "json"
    boxed = list(re.finditer(rf"\\boxed\{{\s*((?:{pat})(?:{_SEP}(?:{pat}))*)\s*\}}", body))
    if boxed:
        return _ids_in(boxed[-1].group(1), ids), "boxed"
    answer = list(re.finditer(
        rf"(?i:answer|antwort|réponse|risposta|respuesta|vastaus|option|choice)(?i:s)?\s*(?i:is|are|ist|lautet|:|=)?"
        rf"\s*[:\-]?\s*\**\s*({one}(?:{_SEP}{one})*)", body))
    named = [found for found in (_ids_in(m.group(1), ids) for m in answer) if found]
    if named:
        return named[-1], "answer_line"
    stripped = body.strip().strip("*.` ")
    if re.fullmatch(rf"{one}(?:{_SEP}{one})*(?:[.:)]\s.*)?", stripped, re.S):
        head = re.match(rf"{one}(?:{_SEP}{one})*", stripped).group(0)
        return _ids_in(head, ids), "bare"
    return None


def _ids_in(span: str, ids: Sequence[str]) -> list[str]:
    found = re.findall(rf"(?<![\w])({_id_pattern(ids)})(?![\w])", span)
    return _order(found, ids)


def _order(found: Sequence[str], ids: Sequence[str]) -> list[str]:
    wanted = set(found)
    return [i for i in ids if i in wanted]


class ChoiceSetMatch(Metric):
    """1 when the set of choice ids parsed from the answer equals the correct set, else 0.

    For samples with options (mcq); others get no value. An answer naming no choice
    scores 0 and is counted (``counters: no_choice``), so it is never hidden.
    """

    name = "choice_set_match"
    counter_descriptions = {"no_choice": "answers named no choice; each was scored 0"}  # (report.html's words)

    def __init__(self, field: str = "model_output.text", correct_field: str = "sample.metadata.correct_choice_ids"):
        self.field = field
        self.correct_field = correct_field

    def compute(self, ctx: MetricContext) -> Any:
        options = ctx.sample.get("options") or []
        if not options:
            return {"value": None}
        correct = ctx.get(self.correct_field, None)
        if correct is None:
            label = ctx.sample.get("label") or ""
            correct = [c for c in label.split(",") if c]
        ids = [str(o["id"]) for o in options]
        text = ctx.get(self.field, "") or ""
        parsed = parse_choice_ids(str(text), ids)
        if parsed is None:
            return {"value": 0.0, "correct": False, "extracted": "", "method": "choice_set_match",
                    "counters": ["no_choice"]}
        found, how = parsed
        ok = set(found) == {str(c) for c in correct}
        return {"value": float(ok), "correct": ok, "extracted": ",".join(found), "method": "choice_set_match",
                "parse": how}


class JudgeScore(Metric):
    """The judge's score (0..1) read from ``field``; no value for samples the judge did not grade.

    ``programmatic_task_types``: task types graded by :class:`ChoiceSetMatch` instead, so one
    metric covers a mixed legal_eval_v1 file (mcq programmatic, the rest by the judge).
    """

    name = "judge_score"
    counter_descriptions = ChoiceSetMatch.counter_descriptions  # (its mcq rows are ChoiceSetMatch's)

    def __init__(self, field: str = "judge_output.score", programmatic_task_types: Sequence[str] = (),
                 pass_threshold: float | None = None):
        self.field = field
        self.programmatic = set(programmatic_task_types or ())
        self.choice = ChoiceSetMatch()
        self.pass_threshold = pass_threshold

    def compute(self, ctx: MetricContext) -> Any:
        if ctx.sample.get("task_type") in self.programmatic:
            return self.choice.compute(ctx)
        if ctx.judge_output is None:
            return {"value": None}
        score = ctx.get(self.field, None)
        if score is None:
            return {"value": None}
        out: dict[str, Any] = {"value": float(score), "method": "llm_judge"}
        label = ctx.judge_output.get("label")
        if self.pass_threshold is not None:
            out["correct"] = float(score) >= self.pass_threshold
        elif label in ("pass", "fail"):
            out["correct"] = label == "pass"
        if label is not None:
            out["extracted"] = str(label)
        return out
