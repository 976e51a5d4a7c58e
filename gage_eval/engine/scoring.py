"""A finished row's written record: the model's output as predict_result, the metrics, the
overall verdict (eval_result). The record shape lives here; the engine only calls it."""
from __future__ import annotations

from typing import Any, Callable, Mapping

from gage_eval.api.backend import LOGLIKELIHOOD
from gage_eval.api.errors import PLUGIN_FAULTS, fault_text
from gage_eval.api.metric import MetricContext, metric_value
from gage_eval.engine.reasoning import strip_output
from gage_eval.api.sample import elide_inline_media

def written_record(tr: Any, it: Any, clean: Callable[[str], str]) -> dict:
    """:func:`finish_record` as the writers get it (a run's and a rescore's): inline media elided,
    an error's message passed through ``clean`` (secrets masked), and ``secrets_scrubbed`` in
    eval_result (the model's replies) and in its judge entry (the judge's) when a reply quoted a
    secret (masked as it arrived: gage_eval.engine.replies)."""
    record = elide_inline_media(finish_record(tr, it))
    result = record.get("eval_result")
    if isinstance(result, dict):  # how many replies had a secret masked: counted again on resume and rescore
        if getattr(it, "scrubbed", 0):
            result["secrets_scrubbed"] = it.scrubbed
        if getattr(it, "judge_scrubbed", 0) and isinstance(result.get("judge"), dict):
            result["judge"]["secrets_scrubbed"] = it.judge_scrubbed
    err = (record.get("eval_result") or {}).get("error")
    if err:
        err["message"] = clean(str(err.get("message")))
    return record


def finish_record(tr: Any, it: Any) -> dict:
    """The record of one finished row (an error stub as it is): predict_result, the metrics of
    every task metric (a metric that raises errors the row, never loses it), the overall score."""
    if "eval_result" in it.sample:  # an error stub
        return it.sample
    record = dict(it.sample)
    model_output = it.model_output
    if it.output is not None:
        record["predict_result"] = [predict_entry(model_output)]
    result: dict[str, Any] = {}
    if it.verdict is not None:
        result["judge"] = it.verdict.to_dict()
        if it.judge_prompts:  # the judge's prompts, for reading a verdict back (report.html)
            result["judge"]["prompts"] = it.judge_prompts
    if it.error is not None:
        result["error"] = it.error
        record["eval_result"] = result
        return record
    ctx = MetricContext(sample=it.sample, model_output=model_output,
                        judge_output=it.verdict.to_dict() if it.verdict is not None else None)
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
        result["error"] = {"stage": "metric", "message": f"{name}: {fault_text(exc)}", "locator": it.locator}
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



def model_output(it: Any, strip_reasoning: bool = False) -> dict:
    """The backend's output with the rendered prompt pieces; for log-likelihood requests the
    chosen continuation (highest log-likelihood) is its text. ``strip_reasoning``: the text after
    the model's reasoning block, the original kept as ``raw_text`` (:mod:`gage_eval.engine.reasoning`)."""
    out = it.output.to_dict() if it.output else {}
    if strip_reasoning:
        strip_output(out)
    for k, v in it.rendered.items():  # the rendered pieces the output does not have
        if k not in out:
            out[k] = v
    if it.aux_output is not None and it.aux_output.loglikelihoods is not None:
        out["unconditioned_loglikelihoods"] = it.aux_output.loglikelihoods
    if it.request is not None and it.request.kind == LOGLIKELIHOOD and out.get("loglikelihoods"):
        lls = out["loglikelihoods"]
        best = max(range(len(lls)), key=lls.__getitem__)
        out.setdefault("text", it.rendered["choices"][best])
    return out


_ENTRY_KEYS = ("prompt", "formatted_prompt", "raw_text", "choices", "contexts", "continuations", "loglikelihoods",
               "unconditioned_loglikelihoods", "is_greedy",
               "finish_reason", "latency_ms", "time_to_first_token_ms", "raw")


def predict_entry(model_output: Mapping[str, Any]) -> dict:
    entry: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": [
        {"type": "text", "text": model_output.get("text") or ""}]}}
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

