"""Records on disk: strict JSON lines, append-only files, the instance record, and recovery
of a run folder for --resume (the writers that use them: gage_eval.runfolder.writers)."""
from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from gage_eval.api.errors import GageError
from gage_eval.api.runfolder import finite, output_error

from gage_eval.api.sample import content_text, label_text, messages_text

INSTANCE_SCHEMA_VERSION = "instance_level_eval_0.2.0"


try:  # a fast encoder when installed (a core dependency; the standard library otherwise)
    import orjson as _orjson
except ImportError:  # pragma: no cover - exercised by the fallback test
    _orjson = None

# orjson writes only what the standard library writes the same way: datetimes, dataclasses and
# subclasses of str/int/dict/list go to _refuse (then json writes them, str() as before), a
# non-str key, an int past 64 bits or a lone surrogate make it raise, and so the line is
# written by json. NaN and infinities come out as null, as finite() makes them below.
_ORJSON_OPTS = ((_orjson.OPT_PASSTHROUGH_DATETIME | _orjson.OPT_PASSTHROUGH_DATACLASS |
                 _orjson.OPT_PASSTHROUGH_SUBCLASS) if _orjson is not None else 0)


def _refuse(obj: Any) -> Any:
    raise TypeError


def dumps(obj: Any, **kwargs: Any) -> str:
    """Strict JSON: a NaN or infinite number (a -inf log-likelihood, a metric's nan) is written as null.

    Without ``kwargs`` orjson writes it when it can (compact, UTF-8 as is, the same parsed
    value as the standard library's); whatever it cannot write exactly goes to ``json``."""
    if _orjson is not None and not kwargs:
        try:
            return _orjson.dumps(obj, default=_refuse, option=_ORJSON_OPTS).decode("utf-8")
        except TypeError:  # orjson.JSONEncodeError is a TypeError
            pass
    opts = {"ensure_ascii": False, "separators": (",", ":"), "default": str, "allow_nan": False, **kwargs}
    try:
        return json.dumps(obj, **opts)
    except ValueError:  # rare: only then walk the value
        return json.dumps(finite(obj), **opts)


def dumps_line(obj: Any) -> bytes:
    """:func:`dumps` as one UTF-8 line, newline included (what the jsonl files hold). Text that
    UTF-8 cannot carry (a lone surrogate a backend returned) is written as a ``\\u`` escape."""
    if _orjson is not None:
        try:
            return _orjson.dumps(obj, default=_refuse, option=_ORJSON_OPTS | _orjson.OPT_APPEND_NEWLINE)
        except TypeError:
            pass
    try:
        return (dumps(obj) + "\n").encode("utf-8")
    except UnicodeEncodeError:
        return (dumps(obj, ensure_ascii=True) + "\n").encode("ascii")


def truncate_partial_line(path: Path) -> int:
    """Cut a half-written last line (a kill mid-write); return the bytes removed."""
    if not path.exists():
        return 0
    size = path.stat().st_size
    if size == 0:
        return 0
    with path.open("rb+") as fh:
        fh.seek(max(0, size - 1))
        if fh.read(1) == b"\n":
            return 0
        # walk back to the last newline
        pos = size
        chunk = 65536
        while pos > 0:
            start = max(0, pos - chunk)
            fh.seek(start)
            data = fh.read(pos - start)
            idx = data.rfind(b"\n")
            if idx >= 0:
                cut = start + idx + 1
                fh.truncate(cut)
                return size - cut
            pos = start
        fh.truncate(0)
        return size


def read_jsonl(path: Path) -> Iterator[dict]:
    """The records of a jsonl file the run wrote; a line that is not one means the folder was damaged."""
    for _, record in read_jsonl_numbered(path):
        yield record


def read_jsonl_numbered(path: Path) -> Iterator[tuple[int, dict]]:
    """:func:`read_jsonl`'s records, each with its line number (for messages naming file:line)."""
    if not path.exists():
        return
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            if raw.strip():
                try:
                    record = json.loads(raw)
                except ValueError as exc:
                    record = exc
                if not isinstance(record, dict):
                    raise GageError(f"{path}:{lineno}: not a record written by gage-eval ({record}); the run "
                                    f"folder was changed by hand: remove that line to run its row again")
                yield lineno, record


class JsonlAppender:
    """An append-only jsonl file, flushed after every line so a kill loses at most one line."""

    def __init__(self, path: Path):
        self.path = path
        self._failed = False  # a write failed: that error is the one reported, not close()'s
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = path.open("ab")
        except OSError as exc:
            raise output_error(path, exc) from None

    def write(self, obj: Any) -> None:
        try:
            self._fh.write(dumps_line(obj))
            self._fh.flush()
        except OSError as exc:
            self._failed = True
            raise output_error(self.path, exc) from None

    def close(self) -> None:
        try:
            self._fh.close()
        except OSError as exc:
            if not self._failed:
                raise output_error(self.path, exc) from None


class EventLog(JsonlAppender):
    def __init__(self, path: Path, run_id: str):
        truncate_partial_line(path)
        super().__init__(path)
        self.run_id = run_id

    def emit(self, event: str, **fields: Any) -> None:
        self.write({"ts": round(time.time(), 6), "run_id": self.run_id, "event": event, **fields})


def primary_value(record: Mapping[str, Any]) -> Any:
    return (record.get("eval_result") or {}).get("overall", {}).get("score")


def _instance_input(record: Mapping[str, Any]) -> dict:
    messages = record.get("messages") or []
    pred = (record.get("predict_result") or [{}])[0]
    inp: dict[str, Any] = {
        "raw": pred.get("prompt") or messages_text(messages, "user") or messages_text(messages),
        "reference": label_text(record),
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
    out_text = content_text((pred.get("message") or {}).get("content")) if pred else ""
    inp = _instance_input(record)
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
    perf = {k: pred[k] for k in ("latency_ms", "time_to_first_token_ms") if pred.get(k) is not None}
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


def recover_jsonl(path: Path, keep: Callable[[Mapping[str, Any]], bool]) -> Iterator[tuple[dict, bool]]:
    """The records of a jsonl file an interrupted run wrote, each with ``keep(record)``. A
    half-written last line is cut first; records not kept are removed from the file (replaced
    whole, never half-written). The folder is made when missing (a run stopped before its
    first row has none)."""
    truncate_partial_line(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise output_error(path, exc) from None
    tmp = path.with_suffix(".jsonl.tmp")
    dropped = 0
    try:
        with tmp.open("w", encoding="utf-8") as kept:
            for record in read_jsonl(path):
                ok = keep(record)
                if ok:
                    kept.write(dumps(record) + "\n")
                else:
                    dropped += 1
                yield record, ok
        if dropped:
            os.replace(tmp, path)
    except OSError as exc:
        raise output_error(path, exc) from None
    finally:
        tmp.unlink(missing_ok=True)
