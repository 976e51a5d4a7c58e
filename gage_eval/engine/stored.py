"""The stored-output stage of a rescore: a run's written records read back as rows that carry
the model's answer (and the judge's verdict) the run stored, in place of reading the data and
the infer stage's call to the backend, so the judge, score and write stages run on them as in
a run (:class:`gage_eval.engine.rescore.Rescore`); and stand-ins for the backends a rescore does
not load."""
from __future__ import annotations

from typing import Any, Iterator, Mapping

from gage_eval.api.runfolder import RunFolder
from gage_eval.engine.row import Answer, Judgement, Row
from gage_eval.engine.taskrun import scrubbed_count

STORED = ("predict_result", "eval_result")  # the parts of a record that are not the sample


class StoredVerdict:
    """A judge verdict read back from a record (``eval_result.judge``), written as it was."""

    def __init__(self, data: Mapping[str, Any]):
        self.data = dict(data)
        self.error = self.data.get("error")
        self.score = self.data.get("score")

    def to_dict(self) -> dict:
        return dict(self.data)


class StoredBackend:
    """Stands in for a backend that is not loaded: its id and settings as the run's summary recorded them."""

    def __init__(self, recorded: Mapping[str, Any] | None, max_batch: int = 256):
        recorded = recorded or {}
        self.max_batch = max_batch  # the rows the engine's window holds
        self.model_id = recorded.get("model_id") or "unknown"
        self._settings = recorded.get("settings") or {}
        self._recorded_stats = recorded.get("stats") or {}
        self.secrets: tuple[str, ...] = ()

    def settings(self) -> dict:
        return dict(self._settings)

    def stats(self) -> dict:  # what the run's backend counted (rescoring sends no request)
        return dict(self._recorded_stats)

    def close(self) -> None:
        pass


def model_output_of(entry: Mapping[str, Any]) -> dict:
    """The model output a metric saw, from a stored ``predict_result`` entry (the inverse of
    :func:`gage_eval.engine.scoring.predict_entry`)."""
    out = {k: v for k, v in entry.items() if k not in ("index", "message", "usage")}
    content = ((entry.get("message") or {}).get("content") or [])
    if (entry.get("message") or {}).get("tool_calls"):
        out["tool_calls"] = entry["message"]["tool_calls"]
    out["text"] = "".join(seg.get("text") or "" for seg in content
                          if isinstance(seg, Mapping) and seg.get("type") == "text")
    usage = entry.get("usage")
    if isinstance(usage, Mapping):
        out["input_tokens"] = usage.get("input_tokens")
        out["output_tokens"] = usage.get("output_tokens")
    return out


def row_of(record: dict, index: int, locator: str, keep_judge: bool) -> Row:
    """The row a stored record came from, with its stored answer (and verdict), ready to be
    scored (and judged) again: the infer stage of a rescore."""
    sample = {k: v for k, v in record.items() if k not in STORED}
    result = record.get("eval_result") or {}
    err = result.get("error") or {}
    pred = record.get("predict_result") or []
    answer = Answer(None, None, model_output_of(pred[0]) if pred else {}, scrubbed_count(result),
                    record.get("predict_result"))  # scrubbed: the model's replies masked then (the judge's: its verdict)
    judgement = (Judgement(StoredVerdict(result["judge"]))
                 if keep_judge and result.get("judge") is not None else None)
    reps = result.get("repeats")  # a repeated row (one that failed too, holding every answer): each scored again
    if isinstance(reps, list) and (not err or len(reps) == len(pred) > 1):
        return Row(index, locator, sample, repeats=tuple(
            Row(index, locator, sample, answer=answer._replace(model_output=model_output_of(entry), stored=[entry],
                                                               scrubbed=answer.scrubbed if r == 0 else 0),
                judgement=Judgement(StoredVerdict(rep["judge"])) if keep_judge and rep.get("judge") else None,
                repeat=r) for r, (entry, rep) in enumerate(zip(pred, reps))))
    return Row(index, err.get("locator") or locator, sample, answer=answer, judgement=judgement)


def kept_as_is(record: Mapping[str, Any], rejudge: bool) -> bool:
    """A row that errored where no score can be made from what is stored (reading, template,
    inference; the judge, unless it runs again)."""
    err = (record.get("eval_result") or {}).get("error")
    if not err:
        return False
    stage = err.get("stage")
    return not (stage == "metric" or (stage == "judge" and rejudge and record.get("predict_result")))


def stored_rows(folder: RunFolder, task: str, rejudge: bool, keep_judge: bool) -> Iterator[Row]:
    """Each record of the run's ``samples/<task>.jsonl`` in its order: the row it came from with
    its stored answer (and, with ``keep_judge``, verdict), or, for a row :func:`kept_as_is`, a
    row whose sample is the record itself (an error stub: written as it was)."""
    source = str(folder.samples_file(task))
    for index, (_, record) in enumerate(folder.records(task)):
        locator = f"{source}:{index + 1}"
        if kept_as_is(record, rejudge):
            yield Row(index, locator, record)
        else:
            yield row_of(record, index, locator, keep_judge)
