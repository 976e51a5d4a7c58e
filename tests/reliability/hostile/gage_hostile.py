"""A hostile plugin for tests/reliability/test_plugins.py, loaded by the CLI subprocess through a
dist-info entry point the test writes beside it (tests only: gage-eval has no other way in).

- backend ``hostile``: log-likelihoods and texts like the dummy backend's, except every
  ``every``-th request answers with the malformed output ``bad`` names; ``settings_raise=true``
  makes settings() raise.
- writers ``hostile/mutate`` (changes every record and the summary it is handed),
  ``hostile/exit`` (sys.exit(7) at its ``at``-th record, counted per process) and
  ``hostile/raise`` (raises in end()).
- metric ``hostile_value``: ``value`` (nan, inf, -inf) on every ``every``-th row, 1.0 on the others.
- observers: ``HOSTILE_OBSERVER=exit`` makes gage_sample_done call sys.exit(9) at the second
  row, ``raise`` raise there; ``mutate`` changes the run_end summary.
"""
from __future__ import annotations

import hashlib
import os
import sys

from gage_eval.api import GENERATE, LOGLIKELIHOOD, Backend, Metric, ModelOutput, Writer, hookimpl

BAD = {
    "oops": lambda n: ModelOutput(loglikelihoods="oops"),
    "short": lambda n: ModelOutput(loglikelihoods=[-1.0] * (n - 1)),
    "nan_ll": lambda n: ModelOutput(loglikelihoods=[float("nan")] + [-1.0] * (n - 1)),
    "inf_ll": lambda n: ModelOutput(loglikelihoods=[float("inf")] + [-1.0] * (n - 1)),
    "neginf_ll": lambda n: ModelOutput(loglikelihoods=[float("-inf")] + [-1.0] * (n - 1)),
    "strings": lambda n: ModelOutput(loglikelihoods=["-1.0"] * n),
    "bools": lambda n: ModelOutput(loglikelihoods=[True] * n),
    "dict": lambda n: {"loglikelihoods": [-1.0] * n},
    "text_int": lambda n: ModelOutput(text=7),
    "text_none": lambda n: ModelOutput(),
}


def _unit(*parts: object) -> float:
    return int.from_bytes(hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()[:8], "big") / 2**64


class HostileBackend(Backend):
    name = "hostile"
    capabilities = frozenset({GENERATE, LOGLIKELIHOOD, "chat"})

    def __init__(self, bad: str = "", every: int = 4, settings_raise: bool = False, **_engine):  # seed, batch_size
        self.bad, self.every, self.settings_raise = bad, int(every), bool(settings_raise)
        self.model_id = "test/hostile"
        self.count = 0

    def settings(self) -> dict:
        if self.settings_raise:
            raise RuntimeError("settings exploded")
        return {"bad": self.bad, "every": self.every}

    def run(self, requests):
        out = []
        for req in requests:
            self.count += 1
            n = len(req.continuations)
            if self.bad and self.count % self.every == 0:
                out.append(BAD[self.bad](n))
            elif req.kind == LOGLIKELIHOOD:
                out.append(ModelOutput(loglikelihoods=[-1.0 - _unit(req.sample_id, c) for c in req.continuations]))
            else:
                out.append(ModelOutput(text="A"))
        return out


class MutatingWriter(Writer):
    def write(self, task, record):
        for name in list((record.get("eval_result") or {}).get("metrics") or {}):
            record["eval_result"]["metrics"][name] = 1.0
        (record.get("eval_result") or {}).pop("error", None)
        record["id"] = "hijacked"
        record.setdefault("predict_result", []).clear()

    def task_end(self, event):
        event.counts["scored"] = 0
        event.metrics.clear()

    def end(self, summary):
        summary["run"]["exit_status"] = 0
        summary["run"]["interrupted"] = None
        for task in summary["tasks"].values():
            task["status"] = "ok"
            for entry in task["metrics"].values():
                entry["value"] = 1.0


class ExitingWriter(Writer):
    def __init__(self, at: int = 3):
        self.at, self.seen = int(at), 0

    def write(self, task, record):
        self.seen += 1
        if self.seen == self.at:
            sys.exit(7)


class RaisingWriter(Writer):
    def end(self, summary):
        raise RuntimeError("end exploded")


class HostileMetric(Metric):
    name = "hostile_value"

    def __init__(self, value: str = "nan", every: int = 4):  # (task args arrive as numbers: nan, inf)
        self.value, self.every, self.count = float(value), int(every), 0

    def compute(self, ctx):
        self.count += 1
        return self.value if self.count % self.every == 0 else 1.0


@hookimpl
def gage_register_backends(register):
    register("hostile", HostileBackend)


@hookimpl
def gage_register_writers(register):
    register("hostile/mutate", MutatingWriter)
    register("hostile/exit", ExitingWriter)
    register("hostile/raise", RaisingWriter)


@hookimpl
def gage_register_metrics(register):
    register("hostile_value", HostileMetric)


_seen = []


@hookimpl
def gage_sample_done(event):
    mode = os.environ.get("HOSTILE_OBSERVER")
    _seen.append(event.sample_id)
    if mode == "mutate":
        event.record["id"] = "hijacked"
        event.metrics.clear()
    if len(_seen) == 2 and mode == "exit":
        sys.exit(9)
    if len(_seen) == 2 and mode == "raise":
        raise RuntimeError("observer exploded")


@hookimpl
def gage_run_end(event):
    if os.environ.get("HOSTILE_OBSERVER") == "mutate":
        event.summary["run"]["exit_status"] = 0
        event.summary["tasks"].clear()
