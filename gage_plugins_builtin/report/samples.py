"""One sample record as the report's browser shows it: a compact JSON object (short keys, text
clipped to :data:`MAX_TEXT` characters, images as references to thumbnails), and the same for
log-likelihood rows: the scored context, every choice with its log-likelihood (and the
normalised one where ``acc_norm`` is scored) and the choice each metric took."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping

from gage_plugins_builtin.report.reread import Reread

MAX_TEXT = 20_000  # characters kept of one text field of a sample (the samples file has all)

__all__ = ["MAX_TEXT", "clip", "compact", "content_text", "loglikelihood_view"]


def _answers(predicted: list, repeats: list) -> str:
    """A repeated row's answers one after another, each headed by its number, seed and score."""
    parts = []
    for r, entry in enumerate(predicted):
        scored = repeats[r] if r < len(repeats) and isinstance(repeats[r], dict) else {}
        score = (scored.get("overall") or {}).get("score")
        head = f"[answer {r + 1} of {len(predicted)}, seed {entry.get('seed')}, score {score}]"
        parts.append(f"{head}\n{content_text((entry.get('message') or {}).get('content'))}")
    return "\n\n".join(parts)


def clip(text: Any, limit: int = MAX_TEXT) -> str:
    text = "" if text is None else text if isinstance(text, str) else json.dumps(text, ensure_ascii=False)
    if len(text) > limit:
        return text[:limit] + f"\n... [{len(text) - limit} more characters in the samples file]"
    return text


def content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(content_text(p.get("text")) if isinstance(p, dict) else content_text(p) for p in content)
    return "" if content is None else str(content)


def _finite(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def loglikelihood_view(predicted: Mapping[str, Any], record: Mapping[str, Any], limit: int = MAX_TEXT) -> dict | None:
    """{"ctx": the scored context, "ch": [[id, text, ll, normalised ll or None], ...], "taken":
    {metric: choice id}, "gold": id}; None when the output holds no log-likelihoods."""
    lls = predicted.get("loglikelihoods")
    choices = predicted.get("choices")
    if not isinstance(lls, list) or not lls:
        return None
    if not isinstance(choices, list) or len(choices) != len(lls):
        conts = predicted.get("continuations")
        choices = conts if isinstance(conts, list) and len(conts) == len(lls) else [""] * len(lls)
    options = [o for o in record.get("options") or [] if isinstance(o, dict)]
    ids = [str(o.get("id", "")) for o in options] if len(options) == len(lls) else [str(i) for i in range(len(lls))]
    result = record.get("eval_result") or {}
    metrics = result.get("metrics") if isinstance(result.get("metrics"), dict) else {}
    normalised = "acc_norm" in metrics  # lm-eval's acc_norm: ll / the choice's length in characters
    rows = []
    for ident, ll, text in zip(ids, lls, choices):
        value = ll if type(ll) is float and ll - ll == 0.0 else _finite(ll)  # (the usual case first: finite)
        if type(text) is not str:
            text = str(text)
        norm = value / (len(text) or 1) if normalised and value is not None else None
        rows.append([ident, text if len(text) <= limit else clip(text, limit), value, norm])
    taken = {}
    for name, m in metrics.items():
        if isinstance(m, dict) and m.get("method") == "loglikelihood_argmax" and m.get("extracted") is not None:
            taken[str(name)] = str(m["extracted"])
    if not taken:
        scores = [r[2] for r in rows]
        if all(s is not None for s in scores):
            taken["highest log-likelihood"] = rows[scores.index(max(scores))][0]
    view = {"ctx": clip(predicted.get("prompt"), limit), "ch": rows, "taken": taken}
    label = record.get("label")
    if label is not None:
        view["gold"] = str(label)
    return view


def _calls_text(calls: Any) -> list[str]:
    out = []
    for call in calls if isinstance(calls, list) else ():
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict):
            args = fn.get("arguments")
            out.append(f"call {fn.get('name')}({args if isinstance(args, str) else json.dumps(args)})")
    return out


def turns(predicted: Mapping[str, Any], limit: int = MAX_TEXT) -> list[list[str]]:
    """A tool loop's trajectory (``predict_result[0].trajectory``) as ``[label, text]`` per turn:
    the assistant's words and calls, each tool's result, the later user turns; a single reply's
    calls (no loop) as one turn; nothing for a reply without calls."""
    trajectory = predicted.get("trajectory")
    if not isinstance(trajectory, list):
        calls = _calls_text((predicted.get("message") or {}).get("tool_calls"))
        return [["tool calls", clip("\n".join(calls), limit)]] if calls else []
    out = []
    for m in trajectory:
        if not isinstance(m, dict):
            continue
        role = str(m.get("role", ""))
        label = f"tool {m.get('name')}" if role == "tool" and m.get("name") else role
        lines = [t for t in [content_text(m.get("content"))] if t] + _calls_text(m.get("tool_calls"))
        out.append([label, clip("\n".join(lines), limit)])
    return out


def _status(result: Mapping[str, Any]) -> str:
    """c: correct, w: wrong, e: errored, u: not scored."""
    if result.get("error"):
        return "e"
    overall = result.get("overall") or {}
    passed = overall.get("passed")
    if isinstance(passed, bool):
        return "c" if passed else "w"
    score = overall.get("score")
    if isinstance(score, (int, float)) and not isinstance(score, bool):
        return "c" if score >= 1 else "w"
    return "u"


def _tags(data_tag: Any) -> list[str]:
    out = []
    if isinstance(data_tag, dict):
        for k, v in data_tag.items():
            for item in (v if isinstance(v, list) else [v]):
                if item is not None and not isinstance(item, (dict, list)):
                    out.append(f"{k}={item}")
    return out


def _compact_messages(record: Mapping[str, Any], run: int, task: str, run_dir: Path, images: Reread) -> list:
    """The sample's messages as [role, parts]: text clipped, images as thumbnail references."""
    messages = []
    for m in record.get("messages") or []:
        if not isinstance(m, dict):
            continue
        parts: list[Any] = []
        content = m.get("content")
        for seg in (content if isinstance(content, list) else [content]):
            if isinstance(seg, dict) and isinstance(seg.get("type"), str) and seg["type"] != "text":
                media = seg.get(seg.get("type")) if isinstance(seg.get(seg.get("type")), dict) else seg
                url = media.get("url") if isinstance(media, dict) else None
                if isinstance(url, str) and seg.get("type") == "image_url":
                    parts.append(images.ref(url, run, task, run_dir))
                else:
                    parts.append({"ph": f"[{seg.get('type')}]"})
            else:
                text = seg.get("text", "") if isinstance(seg, dict) else seg
                if text:
                    parts.append(clip(text))
        messages.append([m.get("role", ""), parts])
    return messages


def compact(record: Mapping[str, Any], run: int, task: str, run_dir: Path, images: Reread) -> dict:
    result = record.get("eval_result") or {}
    out: dict[str, Any] = {"r": run, "t": task, "id": str(record.get("id", "")), "s": _status(result)}
    tags = _tags(record.get("data_tag"))
    if tags:
        out["g"] = tags
    messages = _compact_messages(record, run, task, run_dir, images)
    if messages:
        out["m"] = messages
    predicted = record.get("predict_result") or []
    first = predicted[0] if predicted and isinstance(predicted[0], dict) else None
    scored = None if first is None else loglikelihood_view(first, record)
    options = record.get("options")
    if scored is None and isinstance(options, list) and options:  # (with "ll" the choices table shows them as scored)
        out["opt"] = [[str(o.get("id", "")), clip(o.get("content"))] for o in options if isinstance(o, dict)]
    if first is not None:
        if scored is not None:  # the "output" is only the argmax choice: the scores say what happened
            out["ll"] = scored
        else:
            text = content_text((first.get("message") or {}).get("content"))
            if not text and first.get("raw_text"):
                text = first["raw_text"]
            if len(predicted) > 1:  # repeats: every answer, with its seed and its primary score
                text = _answers(predicted, result.get("repeats") or [])
            if text:
                out["o"] = clip(text)
            steps = turns(first)
            if steps:
                out["tr"] = steps
    refs = []
    for ref in record.get("references") or []:
        if isinstance(ref, dict):
            refs.append(clip(content_text(ref.get("answer"))))
        else:
            refs.append(clip(ref))
    if refs:
        out["ref"] = refs
    overall = result.get("overall") or {}
    if overall.get("extracted") is not None:
        out["x"] = clip(overall.get("extracted"))
        if isinstance(overall.get("method"), str):  # how it was found (a "fallback" is a random guess)
            out["xm"] = overall["method"]
    values = {}
    for name, m in (result.get("metrics") or {}).items():  # a result dict, or a bare number
        values[name] = m.get("value") if isinstance(m, dict) else m
    if values:
        out["v"] = values
    error = result.get("error")
    if isinstance(error, dict):
        out["e"] = {"stage": error.get("stage"), "message": clip(error.get("message")),
                    "locator": error.get("locator")}
    judge = result.get("judge")
    if judge:
        out["j"] = judge
    return out
