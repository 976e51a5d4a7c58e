"""Every Eval Ever 0.3.0: the instance records of ``instances/<task>.jsonl`` and the aggregate
(evaluation-level) record ``eee_aggregate.json`` that ``--eee-version 0.3.0`` writes.

The schemas are EEE's own, not shipped with gage-eval: ``validate --schema instance_0.3.0`` (or
``aggregate_0.3.0``) reads them from ``$GAGE_EVAL_EEE_SCHEMAS`` or the shared data beside a
checkout. 0.2.0 (spec 002, :func:`gage_plugins_builtin.eee.v020.build_instance`) stays the default.

How a run maps onto them:

- The aggregate holds one ``evaluation_results`` entry per task and metric of summary.json
  (value, stderr, n), then one per data_tag slice and metric, then one per group of summary.json
  and metric it aggregates (:mod:`gage_plugins_builtin.eee.groups`); :mod:`gage_plugins_builtin.eee.aggregate`
  builds it. Its ``evaluation_id`` is the run id, as in the instance records.
- The 0.3.0 schema asks for one instance record per aggregate result a sample contributes to,
  so a sample with K metric values gets K records, each with the ``evaluation_result_id`` of its
  task-level result (the primary metric first). For each result, its linked records number
  ``n`` and their scores average to its score. Slice results get no instance records of their
  own (a sample's slice is in its ``metadata``). A row that errored, or that no metric scored,
  contributed to no result: it gets one record, without ``evaluation_result_id``.
- The aggregate has no ``detailed_evaluation_results``: EEE's file_path must be a datastore path
  (``data/<collection>/<developer>/<model>/<uuid>_samples.jsonl``), and a run has one instance
  file per task. Records join the aggregate by ``evaluation_id`` and ``evaluation_result_id``.
- Nothing is guessed: a metric's bounds are [0, 1] (a proportion) only when every per-sample
  value the run saw was 0 or 1, otherwise unbounded (``-Infinity``/``Infinity``); the model's
  availability is ``unknown``; the source organisation is ``unknown`` and the evaluator's
  relationship to the model developer ``other``.
"""
from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any, Collection, Mapping

from gage_eval.api import GageError, content_text, messages_text, read_yaml, reference_texts

EEE_VERSION = "0.3.0"
VERSIONS = ("0.2.0", "0.3.0")  # --eee-version choices; 0.2.0 is gage_plugins_builtin.eee.v020.build_instance
INSTANCE_SCHEMA = "instance_0.3.0"
AGGREGATE_SCHEMA = "aggregate_0.3.0"
AGGREGATE_FILE = "eee_aggregate.json"  # in the run folder
LIBRARY = "gage-eval"
_GEN_TYPED = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
              "max_new_tokens": "max_tokens", "max_tokens": "max_tokens"}
_HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def _strings(mapping: Mapping[str, Any]) -> dict[str, str]:
    """EEE's additional_details and metadata: string values only (others as JSON text); None dropped."""
    return {str(k): _text(v) for k, v in mapping.items() if v is not None}


def result_id(task: str, metric: str, tag: tuple[str, str] | None = None) -> str:
    """The evaluation_result_id of a task's metric (or of its data_tag slice)."""
    return f"{task}:{metric}" if tag is None else f"{task}:{metric}:{tag[0]}={tag[1]}"


def sample_hash(raw: str, reference: list[str]) -> str:
    """EEE's recipe: sha256 of the canonical JSON of input.raw and input.reference."""
    text = json.dumps({"raw": raw, "reference": reference}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _metric_value(detail: Any) -> float | None:
    value = detail.get("value") if isinstance(detail, Mapping) else detail
    if isinstance(value, bool):
        return float(value)
    return float(value) if isinstance(value, (int, float)) and value == value and abs(value) != float("inf") else None


def build_instances(record: Mapping[str, Any], *, task: str, model_id: str, evaluation_id: str) -> list[dict]:
    """The EEE 0.3.0 instance records of one written sample record: one per metric value the
    row contributed to the task's aggregate (primary metric first), or one without an
    evaluation_result_id for a row that errored or that no metric scored."""
    result = record.get("eval_result") or {}
    overall = result.get("overall") or {}
    parts = _instance_parts(record, task=task, model_id=model_id, evaluation_id=evaluation_id)
    metrics = result.get("metrics") or {}
    values = {name: _metric_value(detail) for name, detail in metrics.items()}
    scored = [name for name, v in values.items() if v is not None]
    if result.get("error") or not scored:
        score = overall.get("score")
        return [_instance(parts, task, float(score) if _metric_value(score) is not None else 0.0,
                          bool(overall.get("passed", False)), overall.get("extracted"), overall.get("method"), None)]
    primary = overall.get("metric")
    scored.sort(key=lambda name: name != primary)  # stable: the primary first, then as recorded
    out = []
    for name in scored:
        detail = metrics[name] if isinstance(metrics[name], Mapping) else {}
        correct = detail.get("correct")
        if not isinstance(correct, bool):
            correct = bool(overall.get("passed", False)) if name == primary else values[name] == 1.0
        out.append(_instance(parts, task, values[name], correct, detail.get("extracted", overall.get("extracted")),
                             detail.get("method", overall.get("method")), name))
    return out


def _instance_parts(record: Mapping[str, Any], *, task: str, model_id: str, evaluation_id: str) -> dict:
    """What every instance record of one sample shares: the base record, token usage,
    performance, metadata, and the pieces its attribution reads."""
    result = record.get("eval_result") or {}
    preds = [p for p in record.get("predict_result") or [] if isinstance(p, Mapping)]
    pred = preds[0] if preds else {}
    outputs = [content_text((p.get("message") or {}).get("content")) for p in preds]
    messages = record.get("messages") or []
    raw = pred.get("prompt") or messages_text(messages, "user") or messages_text(messages)
    refs = reference_texts(record)
    if not refs and record.get("label") is not None:
        refs = [str(record["label"])]
    inp: dict[str, Any] = {"raw": str(raw), "reference": refs}
    if pred.get("formatted_prompt"):
        inp["formatted"] = str(pred["formatted_prompt"])
    if record.get("options"):
        inp["choices"] = [str(o.get("content", "")) for o in record["options"]]
    base: dict[str, Any] = {
        "schema_version": EEE_VERSION, "evaluation_id": evaluation_id, "model_id": model_id,
        "evaluation_name": task, "sample_id": str(record.get("id")), "sample_hash": sample_hash(inp["raw"], refs),
        "interaction_type": "single_turn", "input": inp, "output": {"raw": outputs},
    }
    usage = pred.get("usage") or {}
    tokens = None
    if isinstance(usage.get("input_tokens"), int) and isinstance(usage.get("output_tokens"), int):
        inp_t, out_t = usage["input_tokens"], usage["output_tokens"]
        tokens = {"input_tokens": inp_t, "output_tokens": out_t, "total_tokens": inp_t + out_t}
    perf = {k: float(pred[k]) for k in ("latency_ms", "time_to_first_token_ms")
            if isinstance(pred.get(k), (int, float)) and pred[k] >= 0}
    meta: dict[str, Any] = {"task_type": record.get("task_type")}
    for key, tag in (record.get("data_tag") or {}).items():
        meta[f"data_tag.{key}"] = tag
    return {"base": base, "tokens": tokens, "perf": perf, "meta": meta, "outputs": outputs,
            "overall": result.get("overall") or {}, "judge": result.get("judge"), "error": result.get("error")}


def _instance(parts: Mapping[str, Any], task: str, score: float, correct: bool, extracted: Any, method: Any,
              metric: str | None) -> dict:
    """One instance record: the shared parts plus one metric's score and attribution."""
    inst = dict(parts["base"])
    overall, outputs, judge, error = parts["overall"], parts["outputs"], parts["judge"], parts["error"]
    if metric is not None:
        inst["evaluation_result_id"] = result_id(task, metric)
    inst["answer_attribution"] = [{
        "turn_idx": 0, "source": overall.get("source", "output.raw"),
        "extracted_value": str(extracted if extracted is not None else (outputs[0] if outputs else "")),
        "extraction_method": str(method or "custom"), "is_terminal": True}]
    if judge and method == "llm_judge":
        inst["answer_attribution"].append({
            "turn_idx": 0, "source": "output.raw",
            "extracted_value": str(judge.get("score", judge.get("label", ""))),
            "extraction_method": "llm_judge", "is_terminal": True})
    inst["evaluation"] = {"score": score, "is_correct": correct, "num_turns": 1}
    if parts["tokens"]:
        inst["token_usage"] = dict(parts["tokens"])
    if parts["perf"]:
        inst["performance"] = dict(parts["perf"])
    if error:
        inst["error"] = f"{error.get('stage', 'error')}: {error.get('message', '')}"
    inst["metadata"] = _strings({**parts["meta"], "metric": metric})
    return inst


class MetricNotes:
    """What the aggregate needs from the sample records and summary.json does not say: whether
    every per-sample value of a metric was 0 or 1 (its score is then a proportion in [0, 1]),
    and which metrics a judge scored."""

    def __init__(self) -> None:
        self.nonbinary: set[tuple[str, str]] = set()
        self.seen: set[tuple[str, str]] = set()
        self.judged: set[tuple[str, str]] = set()

    def add(self, task: str, record: Mapping[str, Any]) -> None:
        result = record.get("eval_result") or {}
        if result.get("error"):
            return
        for name, detail in (result.get("metrics") or {}).items():
            value = _metric_value(detail)
            if value is None:
                continue
            self.seen.add((task, name))
            if value not in (0.0, 1.0):
                self.nonbinary.add((task, name))
            if isinstance(detail, Mapping) and detail.get("method") == "llm_judge":
                self.judged.add((task, name))

    def proportion(self, task: str, metric: str) -> bool:
        return (task, metric) in self.seen and (task, metric) not in self.nonbinary


def _epoch(created: Any) -> str | None:
    try:
        return str(int(datetime.fromisoformat(str(created)).timestamp()))
    except (TypeError, ValueError):
        return None


def _model_info(entry: Mapping[str, Any], self_deployed: Collection[str]) -> dict:
    """``self_deployed``: the backends that run the model themselves; any other is "unknown" (an
    API may be anyone's)."""
    model_id = str(entry.get("model_id") or entry.get("name") or "unknown")
    backend = str(entry.get("name") or "")
    info: dict[str, Any] = {"name": model_id, "id": model_id}
    if _HF_ID.match(model_id):
        info["developer"] = model_id.split("/", 1)[0]
    if backend:
        info["inference_engine"] = {"name": backend}
    info["additional_details"] = {
        "deployment_type": "self_deployed" if backend in self_deployed else "unknown",
        "model_availability": "unknown",
        **_strings({"backend": backend or None, "model_args": entry.get("args") or None,
                    "settings": entry.get("settings") or None}),
    }
    return info


def _task_file(folder: Path | None) -> Mapping[str, Any]:
    if folder is None:
        return {}
    try:
        spec = read_yaml(folder / "task.yaml")
    except (GageError, OSError):
        return {}
    return spec if isinstance(spec, Mapping) else {}


def _read(folder: Path, name: Any) -> str | None:
    if not isinstance(name, str) or not name:
        return None
    try:
        return (folder / name).read_text(encoding="utf-8")
    except (OSError, ValueError):
        return None


def _generation_config(spec: Mapping[str, Any], folder: Path | None, settings: Mapping[str, Any],
                       command: str | None) -> dict | None:
    request = spec.get("request") if isinstance(spec.get("request"), Mapping) else {}
    gen = {**(request.get("generation") or {}), **(settings.get("gen_kwargs") or {})}
    args: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in gen.items():
        typed = _GEN_TYPED.get(key)
        if typed == "max_tokens" and isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            args[typed] = value
        elif typed and typed != "max_tokens" and (value is None or (isinstance(value, (int, float))
                                                                    and not isinstance(value, bool))):
            args[typed] = value
        else:
            extra[key] = value
    if command:
        args["execution_command"] = command
    prompt = _read(folder, request.get("prompt")) if folder is not None else None
    if prompt is not None:
        args["prompt_template"] = prompt
    extra.update({k: settings.get(k) for k in ("system_prompt", "num_fewshot", "fewshot_as_multiturn",
                                               "apply_chat_template", "seed")})
    if request.get("kind"):
        extra["request_kind"] = request["kind"]
    out: dict[str, Any] = {}
    if args:
        out["generation_args"] = args
    details = _strings(extra)
    if details:
        out["additional_details"] = details
    return out or None


def _llm_scoring(spec: Mapping[str, Any], folder: Path | None, judge: Mapping[str, Any],
                 self_deployed: Collection[str]) -> dict | None:
    """The judge and its prompt templates (the task's judge args naming files in its folder)."""
    conf = spec.get("judge") if isinstance(spec.get("judge"), Mapping) else {}
    args = conf.get("args") if isinstance(conf.get("args"), Mapping) else {}
    parts = []
    for key, value in args.items():
        if folder is not None and (key.endswith("template") or key == "system"):
            text = _read(folder, value)
            if text is not None:  # a Jinja comment names each file: the text still renders the same
                parts.append(f"{{# {key}: {value} #}}\n{text}")
    if not parts:
        return None
    one: dict[str, Any] = {"model_info": _model_info(judge, self_deployed)}
    temperature = (args.get("generation") or {}).get("temperature") if isinstance(args.get("generation"), Mapping) \
        else None
    if isinstance(temperature, (int, float)) and not isinstance(temperature, bool):
        one["temperature"] = temperature
    return {"judges": [one], "input_prompt": "\n".join(parts),
            "additional_details": _strings({"judge": conf.get("name"), "judge_args": dict(args)})}


def _source_data(task: str, entry: Mapping[str, Any], inputs: Mapping[str, Any]) -> dict:
    fp = inputs.get(task) if isinstance(inputs.get(task), Mapping) else {}
    folder = (fp.get("task_folder") or {}) if isinstance(fp.get("task_folder"), Mapping) else {}
    details = {
        "task_folder": folder.get("path") or (entry.get("source") or {}).get("folder"),
        "task_folder_sha256": folder.get("sha256"),
        "task_origin": (entry.get("source") or {}).get("origin"),
        "data_files_sha256": fp.get("data") or None,
    }
    return {"dataset_name": task, "source_type": "other", "additional_details": _strings(details)}


def _result(task: str, metric: str, stats: Mapping[str, Any], *, higher: bool, proportion: bool, name: str,
            source: dict, tag: tuple[str, str] | None, evaluated: str | None, extra: Mapping[str, Any]) -> dict | None:
    value = _metric_value(stats.get("value"))
    if value is None:
        return None
    config: dict[str, Any] = {"metric_id": f"{task}.{metric}", "metric_name": metric, "lower_is_better": not higher,
                              "score_type": "continuous"}
    if proportion:
        config.update(metric_unit="proportion", min_score=0.0, max_score=1.0)
    else:
        config.update(min_score="-Infinity", max_score="Infinity")
    config.update(extra)
    if tag is not None:
        config["additional_details"] = {"data_tag": f"{tag[0]}={tag[1]}", "slice_of": result_id(task, metric)}
    details: dict[str, Any] = {"score": value}
    uncertainty: dict[str, Any] = {}
    stderr = _metric_value(stats.get("stderr"))
    if stderr is not None:
        uncertainty["standard_error"] = {"value": stderr, "method": "analytic"}
    ci = stats.get("ci95") if isinstance(stats.get("ci95"), Mapping) else {}
    normal = ci.get("normal")
    if isinstance(normal, list) and len(normal) == 2 and all(_metric_value(x) is not None for x in normal):
        uncertainty["confidence_interval"] = {"lower": float(normal[0]), "upper": float(normal[1]),
                                              "confidence_level": 0.95, "method": "normal"}
    if isinstance(stats.get("n"), int):
        uncertainty["num_samples"] = stats["n"]
    other = {f"ci95_{k}": v for k, v in ci.items() if k != "normal" and v is not None}
    if uncertainty:
        details["uncertainty"] = uncertainty
    if other:
        details["details"] = _strings(other)
    out: dict[str, Any] = {"evaluation_result_id": result_id(task, metric, tag), "evaluation_name": name,
                           "source_data": source}
    if evaluated:
        out["evaluation_timestamp"] = evaluated
    out.update(metric_config=config, score_details=details)
    return out


__all__ = ["AGGREGATE_FILE", "AGGREGATE_SCHEMA", "EEE_VERSION", "INSTANCE_SCHEMA", "MetricNotes", "VERSIONS",
           "build_instances", "result_id", "sample_hash"]
