"""The infer stage: a window of rows through the model backend's stream, each row handed on
the moment its outputs arrived (its unconditioned scores too, when it has a second request).

Every output has the run's secrets masked the moment it arrives (:mod:`gage_eval.engine.replies`),
before anything reads it. The backend may be a plugin's wrapper of the model's (``gage_wrap_backend``:
the builtin response cache answers from its file first)."""
from __future__ import annotations

import time
from typing import Callable, Iterator

from gage_eval.api.backend import LOGLIKELIHOOD, Backend, ModelOutput, Request, checked_output, safe_run
from gage_eval.api.errors import PLUGIN_FAULTS, FatalBackendError, GageError, fault_text
from gage_eval.engine.replies import scrub_output
from gage_eval.engine.reasoning import strip_output
from gage_eval.engine.row import Answer, Row, stage_error
from gage_eval.engine.taskrun import TaskRun


class Stops(dict):
    """Why a role's backend can take no more requests, by role (``model``, ``judge``: ``get(role)``
    is None while it can), and which of those messages the console already showed."""

    def __init__(self, clean: Callable[[str], str]):
        super().__init__()
        self.announced: set[str] = set()
        self.clean = clean  # a message with every known secret masked

    def stop(self, role: str, message: str) -> str:
        self[role] = self.clean(message)
        return self[role]


class Inference:
    """Runs rows through the model backend; ``done(row)`` gets each row once, with its answer."""

    def __init__(self, backend: Backend, stops: Stops, strip_reasoning: bool = False, secrets: tuple[str, ...] = ()):
        self.backend = backend
        self.stops = stops
        self.strip_reasoning = strip_reasoning
        self.secrets = tuple(s for s in secrets if s)  # masked in every output as it arrives

    def run(self, tr: TaskRun, live: list[Row], done: Callable[[Row], None]) -> None:
        if self.stops.get("model"):
            for row in live:
                done(row._replace(error=stage_error(row, "inference", f"not run: {self.stops.get('model')}")))
            return
        requests, owners = _requests(live)
        waiting = [0] * len(live)
        for pos, _ in owners:
            waiting[pos] += 1
        outputs: list[ModelOutput | None] = [None] * len(live)
        aux_outputs: list[ModelOutput | None] = [None] * len(live)
        scrubbed = [0] * len(live)
        parts: dict[int, list] = {}  # a row whose request has per-choice contexts: its parts' outputs

        def arrived(j: int, out: ModelOutput) -> None:
            pos, aux = owners[j]
            if self.secrets:  # (a run without secrets has nothing to mask)
                out, scrubbed_here = scrub_output(out, self.secrets)
                scrubbed[pos] += scrubbed_here
            if aux is True:
                aux_outputs[pos] = out
            elif aux is False:
                outputs[pos] = out
            else:  # part ``aux`` of a request with per-choice contexts
                got_parts = parts.setdefault(pos, [None] * len(live[pos].request.contexts))
                got_parts[aux] = out
                if all(p is not None for p in got_parts):
                    outputs[pos] = merged_parts(got_parts)
            waiting[pos] -= 1
            if not waiting[pos]:
                done(self._answered(live[pos], outputs[pos], aux_outputs[pos], scrubbed[pos]))

        got, stopped, busy, t0 = self._stream(requests, arrived)
        tr.timings["inference_s"] += time.perf_counter() - t0 - busy
        if self.stops.get("model"):
            tr.failure = tr.failure or f"the model backend stopped the run: {self.stops.get('model')}"
        for j in range(len(requests)):
            if j not in got:
                arrived(j, ModelOutput(error=stopped or f"backend returned no output for request {j} of the batch"))

    def _stream(self, requests: list[Request], arrived: Callable[[int, ModelOutput], None]
                ) -> tuple[set[int], str | None, float, float]:
        """Feed each output to ``arrived`` as it comes; returns the requests answered, why the
        stream stopped early (if it did), the time spent in ``arrived`` and the start time."""
        got: set[int] = set()
        stopped: str | None = None
        t0 = time.perf_counter()
        busy = 0.0  # time spent writing and judging, not waiting for the model
        stream = stream_outputs(self.backend, requests)
        downstream = False  # in arrived (scoring, writing, judging): what fails there is not the backend's
        try:
            for j, out in stream:
                t_in = time.perf_counter()
                if isinstance(j, int) and 0 <= j < len(requests) and j not in got:
                    got.add(j)
                    downstream = True
                    arrived(j, checked_output(requests[j], out))  # malformed: the row errors, never lost
                    downstream = False
                busy += time.perf_counter() - t_in
        except FatalBackendError as exc:
            if downstream:
                raise
            stopped = self.stops.stop("model", str(exc))
        except GageError:
            raise
        except PLUGIN_FAULTS as exc:  # a backend bug (or sys.exit) part way: the rows not yet answered carry it
            if downstream:  # a row taken from the stream must be written or stop the run, never vanish
                raise
            stopped = self.stops.clean(fault_text(exc) if isinstance(exc, SystemExit)
                                       else f"{type(exc).__name__}: {exc}")
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()
        return got, stopped, busy, t0

    def _answered(self, row: Row, output: ModelOutput | None, aux: ModelOutput | None, scrubbed: int) -> Row:
        """The row with the model's answer (an inference error when an output is one)."""
        answer = Answer(output, aux, model_output(row, output, aux, self.strip_reasoning), scrubbed)
        if output is not None and output.error:
            return row._replace(answer=answer, error=stage_error(row, "inference", output.error))
        if aux is not None and aux.error:
            return row._replace(answer=answer, error=stage_error(row, "inference", f"unconditioned scores: {aux.error}"))
        return row._replace(answer=answer)


def model_output(row: Row, output: ModelOutput | None, aux_output: ModelOutput | None,
                 strip_reasoning: bool = False) -> dict:
    """The backend's output with the row's rendered prompt pieces; for log-likelihood requests the
    chosen continuation (highest log-likelihood) is its text. ``strip_reasoning``: the text after
    the model's reasoning block, the original kept as ``raw_text`` (:mod:`gage_eval.engine.reasoning`)."""
    out = output.to_dict() if output else {}
    if strip_reasoning:
        strip_output(out)
    for k, v in row.rendered.items():  # the rendered pieces the output does not have
        if k not in out:
            out[k] = v
    if aux_output is not None and aux_output.loglikelihoods is not None:
        out["unconditioned_loglikelihoods"] = aux_output.loglikelihoods
    if row.request is not None and row.request.kind == LOGLIKELIHOOD and out.get("loglikelihoods"):
        lls = out["loglikelihoods"]
        best = max(range(len(lls)), key=lls.__getitem__)
        out.setdefault("text", row.rendered["choices"][best])
    return out


def stream_outputs(backend: Backend, requests: list) -> Iterator[tuple[int, ModelOutput]]:
    """The backend's stream; a backend without :meth:`Backend.stream` (not derived from
    :class:`Backend`) is run whole."""
    if not requests:
        return iter(())
    stream = getattr(backend, "stream", None)
    if stream is None:
        return enumerate(safe_run(backend, requests))
    return iter(stream(requests))


def _requests(live: list[Row]) -> tuple[list[Request], list[tuple[int, bool | int]]]:
    """The window's requests; ``owners[j]`` is request j's row (its position in ``live``) and
    whether it is that row's unconditioned request (acc_mutual_info's second pass), or, for a
    request with per-choice ``contexts``, which of its one-pair requests it is (an int)."""
    requests: list[Request] = []
    owners: list[tuple[int, bool | int]] = []
    for pos, row in enumerate(live):
        request = row.request
        if request.kind == LOGLIKELIHOOD and request.contexts:
            for i, (context, cont) in enumerate(zip(request.contexts, request.continuations)):
                requests.append(Request(kind=LOGLIKELIHOOD, sample_id=request.sample_id, prompt=context,
                                        continuations=(cont,), modalities=request.modalities))
                owners.append((pos, i))
            continue
        requests.append(request)
        owners.append((pos, False))
        if request.kind == LOGLIKELIHOOD and request.unconditioned is not None:
            requests.append(Request(kind=LOGLIKELIHOOD, sample_id=request.sample_id,
                                    prompt=request.unconditioned, continuations=request.continuations))
            owners.append((pos, True))
    return requests, owners


def merged_parts(outputs: list[ModelOutput]) -> ModelOutput:
    """One output for a request with per-choice contexts, from its one-pair outputs in order: the
    first error, else each part's log-likelihood (and greedy flag) in the choices' order."""
    for out in outputs:
        if out.error:
            return out
    greedy = [out.is_greedy[0] for out in outputs if out.is_greedy]
    tokens = [out.input_tokens for out in outputs if out.input_tokens is not None]
    return ModelOutput(loglikelihoods=[out.loglikelihoods[0] for out in outputs],
                       is_greedy=greedy if len(greedy) == len(outputs) else None,
                       input_tokens=sum(tokens) if tokens else None)
