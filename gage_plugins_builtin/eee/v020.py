"""Every Eval Ever 0.2.0 (spec 002): the ``instance_level_eval`` record of one written sample,
what ``instances/<task>.jsonl`` holds by default (``--eee-version 0.2.0``)."""
from __future__ import annotations

import hashlib
from typing import Any, Mapping

from gage_eval.api import content_text, messages_text, reference_texts

INSTANCE_SCHEMA_VERSION = "instance_level_eval_0.2.0"


def _instance_input(record: Mapping[str, Any]) -> dict:
    messages = record.get("messages") or []
    pred = (record.get("predict_result") or [{}])[0]
    inp: dict[str, Any] = {
        "raw": pred.get("prompt") or messages_text(messages, "user") or messages_text(messages),
        "reference": str(record["label"]) if record.get("label") is not None else
        next(iter(reference_texts(record)), ""),
    }
    if pred.get("formatted_prompt"):
        inp["formatted"] = pred["formatted_prompt"]
    if record.get("options"):
        inp["choices"] = [str(o.get("content", "")) for o in record["options"]]
    return inp


def build_instance(record: Mapping[str, Any], *, task: str, model_id: str, evaluation_id: str) -> dict:
    """The instance_level_eval 0.2.0 record (spec 002) for one written sample record."""
    result = record.get("eval_result") or {}
    overall = result.get("overall") or {}
    error = result.get("error")
    pred = (record.get("predict_result") or [{}])[0]
    inp = _instance_input(record)
    out_text = content_text((pred.get("message") or {}).get("content")) if pred else ""
    score = overall.get("score")
    instance: dict[str, Any] = {
        "schema_version": INSTANCE_SCHEMA_VERSION,
        "evaluation_id": evaluation_id,
        "model_id": model_id,
        "evaluation_name": task,
        "sample_id": str(record.get("id")),
        "sample_hash": hashlib.sha256((inp["raw"] + "\x00" + inp["reference"]).encode()).hexdigest(),
        "interaction_type": "single_turn",
        "input": inp,
        "output": {"raw": out_text},
        "interactions": None,
        "answer_attribution": [{
            "turn_idx": 0,
            "source": overall.get("source", "output.raw"),
            "extracted_value": str(overall.get("extracted", out_text)),
            "extraction_method": overall.get("method", "custom"),
            "is_terminal": True,
        }],
        "evaluation": {
            "score": float(score) if isinstance(score, (int, float)) else 0.0,
            "is_correct": bool(overall.get("passed", False)),
            "num_turns": 1,
        },
    }
    if error:
        instance["error"] = f"{error.get('stage', 'error')}: {error.get('message', '')}"
    usage = pred.get("usage")
    if usage and usage.get("input_tokens") is not None:
        inp_t = int(usage.get("input_tokens") or 0)
        out_t = int(usage.get("output_tokens") or 0)
        instance["token_usage"] = {"input_tokens": inp_t, "output_tokens": out_t, "total_tokens": inp_t + out_t}
    perf = {}
    for k in ("latency_ms", "time_to_first_token_ms"):
        if pred.get(k) is not None:
            perf[k] = pred[k]
    if perf:
        instance["performance"] = perf
    judge = result.get("judge")
    if judge:
        instance["answer_attribution"].append({
            "turn_idx": 0, "source": "output.raw",
            "extracted_value": str(judge.get("score", judge.get("label", ""))),
            "extraction_method": "llm_judge", "is_terminal": True,
        })
    meta = {"task_type": record.get("task_type")} if record.get("task_type") else {}
    if record.get("data_tag"):
        meta["data_tag"] = record["data_tag"]
    if result.get("metrics"):
        meta["metrics"] = result["metrics"]
    if meta:
        instance["metadata"] = meta
    return instance
