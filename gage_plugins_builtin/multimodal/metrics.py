"""MMMU accuracy (the official MMMU answer parsing, as lmms-eval ``mmmu_val`` uses it) and ANLS.

MMMU: a multiple-choice answer is parsed for an option letter ("(B)", "B ", "B."),
then for an option's text in a longer answer; when nothing is found the letter is
picked at random, as the reference does, but from a generator seeded by the metric's
``seed`` and the sample id, and the sample is counted (``counters: ["fallback"]``).
An open answer is parsed into candidate strings and numbers and matched against the
normalised gold answers, candidate by candidate (lmms-eval before 0.7.3 flattened the
candidates to one string and scored every open question 0, its issue #1436).

ANLS (DocVQA): per gold answer, 1 - normalised Levenshtein distance of the lower-cased,
stripped strings, 0 when that distance is ``threshold`` (0.5) or more; the best over
the gold answers.
"""
from __future__ import annotations

import hashlib
import random
import re
from typing import Any, Mapping, Sequence

from gage_eval.api import Metric, MetricContext, reference_texts

_EDGE_PUNCT = [",", ".", "!", "?", ";", ":", "'"]


# -- multiple choice ------------------------------------------------------------------

def parse_multi_choice(response: str, letters: Sequence[str], index2ans: Mapping[str, str],
                       rng: random.Random | None = None) -> tuple[str, str]:
    """The option letter a response picks, and how it was found.

    The method is ``bracket`` ("(B)"), ``letter`` ("B " or "B."), ``content`` (an
    option's text inside a response of more than five words) or ``fallback`` (a
    random letter from ``rng``). With several candidates the one found last wins. The
    response is stripped of surrounding whitespace first, as the reference harness does.
    """
    response = response.strip()
    for char in _EDGE_PUNCT:
        response = response.strip(char)
    response = f" {response} "
    candidates = [c for c in letters if f"({c})" in response]
    method = "bracket" if candidates else "letter"
    if not candidates:
        candidates = [c for c in letters if f"{c} " in response]
    if not candidates:
        candidates = [c for c in letters if f"{c}." in response]
    if not candidates and len(response.split()) > 5:
        lower = response.lower()
        candidates = [c for c, text in index2ans.items() if text.lower() in lower]
        method = "content" if candidates else method
    if not candidates:
        return (rng or random.Random(0)).choice(list(letters)), "fallback"
    if len(candidates) == 1:
        return candidates[0], method
    if method == "bracket":
        positions = [response.rfind(f"({c})") for c in candidates]
    elif method == "letter":
        positions = [response.rfind(f" {c} ") for c in candidates]
    else:
        lower = response.lower()
        positions = [lower.rfind(index2ans[c].lower()) for c in candidates]
    return candidates[max(range(len(positions)), key=positions.__getitem__)], method


# -- open questions -------------------------------------------------------------------

_NUM_COMMAS = re.compile(r"-?\b\d{1,3}(?:,\d{3})+\b")
_NUM_SCI = re.compile(r"-?\d+(?:\.\d+)?[eE][+-]?\d+")
_NUM_SIMPLE = re.compile(r"-?(?:\d+\.\d+|\.\d+|\d+\b)(?![eE][+-]?\d+)(?![,\d])")
_KEY_INDICATORS = ("could be ", "so ", "is ", "thus ", "therefore ", "final ", "answer ", "result ")
_TRIVIAL = {":", ",", ".", "!", "?", ";", "'"}


def extract_numbers(text: str) -> list[str]:
    return _NUM_COMMAS.findall(text) + _NUM_SCI.findall(text) + _NUM_SIMPLE.findall(text)


def _is_number(text: str) -> bool:
    try:
        float(text.replace(",", ""))
        return True
    except ValueError:
        return False


def normalize_answer(text: str) -> list:
    """A number as a float rounded to 2 places; text lower-cased (a single character
    padded with a space either side, so it does not match inside words)."""
    text = text.strip()
    if _is_number(text):
        return [round(float(text.replace(",", "")), 2)]
    text = text.lower()
    return [" " + text, text + " "] if len(text) == 1 else [text]


def _key_subresponses(response: str) -> list[str]:
    response = response.strip().strip(".").lower()
    parts = re.split(r"\.\s(?=[A-Z])|\n", response)
    keys = []
    for i, part in enumerate(parts):
        indicators = _KEY_INDICATORS + (("=",) if i == len(parts) - 1 else ())
        shortest = None
        for ind in indicators:
            if ind in part:
                tail = part.split(ind)[-1].strip()
                if shortest is None or len(tail) < len(shortest):
                    shortest = tail
        if shortest and shortest.strip() not in _TRIVIAL:
            keys.append(shortest)
    return keys or [response]


def parse_open(response: str) -> list:
    """Candidate answers of a free-form response: the key phrases after "is", "so",
    "answer", "=" ..., the numbers in them, each normalised; duplicates removed."""
    keys = _key_subresponses(response)
    found = list(keys)
    for key in keys:
        found.extend(extract_numbers(key))
    out: list = []
    for item in found:
        for norm in normalize_answer(item):
            if norm not in out:
                out.append(norm)
    return out


def eval_open(golds: Sequence[str], candidates: Sequence[Any]) -> bool:
    """True when a candidate string contains a normalised gold string, or a candidate
    number equals a normalised gold number."""
    norm_golds: list = []
    for gold in golds:
        norm_golds.extend(normalize_answer(gold))
    for cand in candidates:
        if isinstance(cand, str):
            if any(isinstance(g, str) and g in cand for g in norm_golds):
                return True
        elif cand in norm_golds:
            return True
    return False


def _seeded(seed: int, sample_id: str) -> random.Random:
    digest = hashlib.sha256(f"{seed}\x1f{sample_id}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


class MMMUAccuracy(Metric):
    """Accuracy with MMMU's answer parsing; ``seed`` fixes the fallback letters."""

    name = "mmmu_acc"
    # what the report says after a counter's count (report.html's counters in words)
    counter_descriptions = {"fallback": "answers could not be parsed; a random choice was scored"}

    def __init__(self, seed: int = 0, field: str = "model_output.text"):
        self.seed = int(seed)
        self.field = field

    def response(self, ctx: MetricContext) -> str:
        response = ctx.get(self.field, None) or ""
        return response if isinstance(response, str) else str(response)

    def golds(self, ctx: MetricContext) -> list[str]:
        return reference_texts(ctx.sample)

    def compute(self, ctx: MetricContext) -> dict:
        sample = ctx.sample
        response = self.response(ctx)
        golds = self.golds(ctx)
        options = sample.get("options") or []
        if options:
            index2ans = {o["id"]: str(o.get("content", "")) for o in options}
            pred, method = parse_multi_choice(response, list(index2ans), index2ans,
                                              _seeded(self.seed, str(sample.get("id"))))
            correct = pred in golds
            result = {"value": float(correct), "correct": correct, "extracted": pred, "method": method}
            if method == "fallback":
                result["counters"] = ["fallback"]
            return result
        candidates = parse_open(response)
        correct = eval_open(golds, candidates)
        return {"value": float(correct), "correct": correct, "extracted": [str(c) for c in candidates][:8],
                "method": "open"}


# -- ANLS ---------------------------------------------------------------------------

def levenshtein(a: str, b: str) -> int:
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def anls_score(prediction: str, golds: Sequence[str], threshold: float = 0.5) -> float:
    """Best over ``golds`` of 1 - NL(gold, prediction), where NL is the Levenshtein distance of the
    lower-cased, stripped strings over the longer one's length; 0 when NL >= ``threshold``."""
    pred = prediction.strip().lower()
    best = 0.0
    for gold in golds:
        g = gold.strip().lower()
        longest = max(len(g), len(pred))
        nl = levenshtein(g, pred) / longest if longest else 0.0
        best = max(best, 1.0 - nl if nl < threshold else 0.0)
    return best


class ANLS(Metric):
    """Average Normalised Levenshtein Similarity against every gold answer (DocVQA)."""

    name = "anls"

    def __init__(self, threshold: float = 0.5, field: str = "model_output.text"):
        threshold = float(threshold)
        if not 0 < threshold <= 1:
            raise ValueError(f"threshold must be in (0, 1], got {threshold}")
        self.threshold = threshold
        self.field = field

    def response(self, ctx: MetricContext) -> str:
        return ctx.get(self.field, None) or ""

    def golds(self, ctx: MetricContext) -> list[str]:
        return reference_texts(ctx.sample)

    def compute(self, ctx: MetricContext) -> dict:
        golds = self.golds(ctx)
        if not golds:
            raise ValueError(f"{self.name} needs at least one reference answer")
        pred = self.response(ctx)
        score = anls_score(str(pred), golds, self.threshold)
        return {"value": score, "correct": score >= 1.0 - 1e-9, "extracted": str(pred).strip()}
