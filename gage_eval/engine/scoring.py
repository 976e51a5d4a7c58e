"""A finished row's written record: the model's output as predict_result, the metrics, the
overall verdict (eval_result). The record shape lives here; the engine only calls it."""
from __future__ import annotations

import json
import math
from collections import Counter
from typing import Any, Callable, Mapping

from gage_eval.api.errors import PLUGIN_FAULTS, fault_text
from gage_eval.api.metric import MetricContext, metric_value
from gage_eval.api.stats import pass_at_k
from gage_eval.api.sample import elide_inline_media
from gage_eval.engine.row import Row

def written_record(tr: Any, row: Row, clean: Callable[[str], str]) -> dict:
    """:func:`finish_record` as the writers get it (a run's and a rescore's): inline media elided,
    an error's message passed through ``clean`` (secrets masked), and ``secrets_scrubbed`` in
    eval_result (the model's replies) and in its judge entry (the judge's) when a reply quoted a
    secret (masked as it arrived: gage_eval.engine.replies)."""
    record = elide_inline_media(finish_record(tr, row))
    result = record.get("eval_result")
    if isinstance(result, dict):  # how many replies had a secret masked: counted again on resume and rescore
        scrubbed = (sum(r.answer.scrubbed for r in row.repeats if r.answer is not None) if row.repeats
                    else row.answer.scrubbed if row.answer is not None else 0)
        if scrubbed:
            result["secrets_scrubbed"] = scrubbed
        if row.judgement is not None and row.judgement.scrubbed and isinstance(result.get("judge"), dict):
            result["judge"]["secrets_scrubbed"] = row.judgement.scrubbed
    err = (record.get("eval_result") or {}).get("error")
    if err:
        err["message"] = clean(str(err.get("message")))
    return record


def metric_context(row: Row) -> MetricContext:
    """What the row's metrics read: its sample, the model's output and the judge's verdict."""
    verdict = row.judgement.verdict if row.judgement is not None else None
    return MetricContext(sample=row.sample, model_output=row.answer.model_output if row.answer is not None else {},
                         judge_output=verdict.to_dict() if verdict is not None else None)


def finish_record(tr: Any, row: Row) -> dict:
    """The record of one finished row (an error stub as it is): predict_result, the metrics of
    every task metric (a metric that raises errors the row, never loses it), the overall score."""
    if "eval_result" in row.sample:  # an error stub
        return row.sample
    if row.repeats:
        return repeated_record(tr, row)
    record = dict(row.sample)
    answer, verdict = row.answer, row.judgement.verdict if row.judgement is not None else None
    model_output = answer.model_output if answer is not None else {}
    if answer is not None and answer.stored is not None:
        record["predict_result"] = answer.stored
    elif answer is not None and answer.output is not None:
        record["predict_result"] = [predict_entry(model_output)]
    judged = verdict.to_dict() if verdict is not None else None  # what the metrics read as judge_output
    result: dict[str, Any] = {}
    if judged is not None:
        result["judge"] = dict(judged)  # the record's own copy: the prompts (and secrets_scrubbed) go in it
        if row.judgement.prompts:  # the judge's prompts, for reading a verdict back (report.html)
            result["judge"]["prompts"] = row.judgement.prompts
    if row.error is not None:
        result["error"] = row.error
        record["eval_result"] = result
        return record
    ctx = MetricContext(sample=row.sample, model_output=model_output, judge_output=judged)  # (metric_context's)
    metrics: dict[str, Any] = {}
    counters: dict[str, bool] = {}
    values: dict[str, float | None] = {}
    try:
        for name, metric in tr.metrics:
            value = metric.compute(ctx)
            values[name] = metric_value(value)  # refuses a non-numeric value here, where the sample is known
            metrics[name] = value
            t = type(value)
            if t is dict or (t is not float and t is not int and t is not bool and isinstance(value, Mapping)):
                for key in value.get("counters", ()):
                    counters[f"{name}.{key}"] = True
    except PLUGIN_FAULTS as exc:  # a metric bug (a NaN value, sys.exit) must not lose the row nor end the run
        result["error"] = {"stage": "metric", "message": f"{name}: {fault_text(exc)}", "locator": row.locator}
        record["eval_result"] = result
        return record
    result["metrics"] = metrics
    if counters:
        result["counters"] = counters
    primary = metrics.get(tr.primary)
    pv = values[tr.primary] if tr.primary in values else None  # metric_value(primary), computed above
    overall: dict[str, Any] = {"score": pv, "metric": tr.primary}
    if type(primary) is dict or (primary is not None and type(primary) is not float and isinstance(primary, Mapping)):
        overall["passed"] = bool(primary.get("correct", pv is not None and pv >= 1.0 - 1e-9))
        for key in ("extracted", "method", "source"):
            if key in primary:
                overall[key] = primary[key]
    else:
        overall["passed"] = pv is not None and pv >= 1.0 - 1e-9
    overall.setdefault("method", tr.primary)
    result["overall"] = overall
    record["eval_result"] = result
    return record



def repeated_record(tr: Any, row: Row) -> dict:
    """The record of a row answered ``n`` times: every answer in ``predict_result`` (``index`` r)
    and its scores in ``eval_result.repeats``; each metric's value is its mean over the answers
    (with their ``variance``), plus pass@k (Chen et al.'s unbiased estimator over the answers whose
    primary metric passed) and maj@k (the majority answer among the first k, extracted where the
    primary metric extracts one). A failed answer fails the row (resume draws all again), its
    record still holding every answer and each one's scores (a rescore judges them again)."""
    subs = [finish_record(tr, sub) for sub in row.repeats]
    results = [sub.get("eval_result") or {} for sub in subs]
    entries = [dict(sub["predict_result"][0], index=r, **_seed(one)) for r, (sub, one)
               in enumerate(zip(subs, row.repeats)) if sub.get("predict_result")]
    scores = [{k: r[k] for k in ("metrics", "overall", "judge", "error") if k in r} for r in results]
    for sub, result in zip(subs, results):
        if result.get("error"):
            return {**sub, "predict_result": entries, "eval_result": {**result, "repeats": scores}}
    metrics = {name: results[0]["metrics"][name] if name in tr.aggregate.corpus
               else _mean_of([r["metrics"][name] for r in results]) for name in results[0]["metrics"]}
    passed = [bool(r["overall"].get("passed")) for r in results]
    for k in tr.repeats.pass_at:
        metrics.setdefault(f"pass@{k}", {"value": pass_at_k(len(passed), sum(passed), k),
                                         "passed": sum(passed), "n": len(passed)})
    answers = [r["overall"].get("extracted", (sub.get("predict_result") or [{}])[0].get("message"))
               for r, sub in zip(results, subs)]
    for k in tr.repeats.maj_at:
        metrics.setdefault(f"maj@{k}", _majority(answers[:k], passed[:k]))
    pv = metrics[tr.primary]["value"] if isinstance(metrics.get(tr.primary), dict) else None
    record = dict(row.sample)
    record["predict_result"] = entries
    result: dict[str, Any] = {"metrics": metrics, "overall": {
        "score": pv, "metric": tr.primary, "passed": pv is not None and pv >= 1.0 - 1e-9, "method": tr.primary},
        "repeats": scores}
    counters = {k: True for r in results for k in r.get("counters") or {}}
    if counters:
        result["counters"] = counters
    record["eval_result"] = result
    return record


def _seed(row: Row) -> dict:
    """The seed a repeat was drawn with (a rescore's stored answer keeps its own)."""
    return {"seed": row.request.gen["seed"]} if row.request is not None and "seed" in row.request.gen else {}


def _mean_of(results: list) -> dict:
    """A metric's results over a row's answers as one: their mean, variance (n - 1) and values."""
    values = [metric_value(v) for v in results]
    present = [v for v in values if v is not None]
    mean = math.fsum(present) / len(present) if present else None
    var = math.fsum((v - mean) ** 2 for v in present) / (len(present) - 1) if len(present) > 1 else None
    return {"value": mean, "variance": var, "repeats": values}


def _majority(answers: list, passed: list[bool]) -> dict:
    """maj@k: the most frequent answer (ties: the one given first), scored as its first answer was."""
    keys = [json.dumps(a, sort_keys=True, default=str) for a in answers]
    counts = Counter(keys)
    top = max(counts.values())
    first = next(i for i, key in enumerate(keys) if counts[key] == top)
    return {"value": float(passed[first]), "votes": top, "repeat": first}


_ENTRY_KEYS = ("prompt", "formatted_prompt", "raw_text", "choices", "contexts", "continuations", "loglikelihoods",
               "unconditioned_loglikelihoods", "is_greedy", "seed",
               "finish_reason", "latency_ms", "time_to_first_token_ms", "raw", "trajectory")


def predict_entry(model_output: Mapping[str, Any]) -> dict:
    entry: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": [
        {"type": "text", "text": model_output.get("text") or ""}]}}
    if model_output.get("tool_calls"):  # Sample v1's assistant message shape
        entry["message"]["tool_calls"] = model_output["tool_calls"]
    if type(model_output) is dict:  # (a plain dict: get(key) is model_output[key])
        get = model_output.get
        for key in _ENTRY_KEYS:
            value = get(key)
            if value is not None:
                entry[key] = value
    else:
        for key in _ENTRY_KEYS:
            if model_output.get(key) is not None:
                entry[key] = model_output[key]
    if model_output.get("input_tokens") is not None or model_output.get("output_tokens") is not None:
        i, o = model_output.get("input_tokens") or 0, model_output.get("output_tokens") or 0
        entry["usage"] = {"input_tokens": i, "output_tokens": o, "total_tokens": i + o}
    return entry

