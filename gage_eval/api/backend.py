"""The backend contract: requests in, one output per request out."""
from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, ClassVar, Iterator, Sequence

from gage_eval.api.errors import GageError

GENERATE = "generate"
LOGLIKELIHOOD = "loglikelihood"
LOGLIKELIHOOD_ROLLING = "loglikelihood_rolling"


@dataclass(frozen=True)
class Request:
    """One thing to ask a model.

    ``kind`` is ``generate``, ``loglikelihood`` or ``loglikelihood_rolling``.

    - generate: ``messages`` (OpenAI-style, content as segment lists) when
      ``chat`` is true, else ``prompt`` (plain text, no chat template).
      ``gen`` holds the generation settings: ``max_new_tokens``, ``stop``
      (list of strings), ``temperature``, ``top_p``, ``do_sample``, ``seed``.
    - loglikelihood: ``prompt`` is the context and ``continuations`` the
      strings whose log-probability after the context is wanted (the choices
      of one multiple-choice question: the context is shared). A backend splits
      each pair into tokens with :func:`encode_pair` / :func:`encode_choices`
      (:mod:`gage_eval.api.loglikelihood`), so every backend scores the same tokens.
      With ``contexts`` (one per continuation, ``prompt`` None) continuation i is scored
      after context i instead (lm-eval's multiple-input tasks: winogrande puts each choice
      in the context and scores the shared rest of the sentence); the engine sends each
      pair as a request of its own, so a backend never sees ``contexts``.
    - loglikelihood_rolling: ``continuations`` holds one text (``prompt`` is None), scored
      whole from the model's prefix token in windows of the model's length
      (:func:`~gage_eval.api.loglikelihood.rolling_windows`, lm-eval's perplexity requests);
      the output's ``loglikelihoods`` is its one summed log-likelihood.

    ``tools`` and ``tool_choice`` (generate only) are the sample's, as Sample v1 holds them
    (OpenAI's tool definitions and choice); a backend that declares the ``tools`` capability
    sends them natively or describes them in the prompt, and returns the calls the model made
    as :attr:`ModelOutput.tool_calls`. ``tool_loop`` (a task's ``request.tool_loop`` with the
    ``row`` it is for): the request is a conversation the builtin tool loop carries out (the
    model's calls run through the registered tools, their results sent back) before one
    output with the whole ``trajectory`` comes back; a backend never sees it.
    """

    kind: str
    sample_id: str
    prompt: str | None = None
    messages: tuple[dict, ...] | None = None
    continuations: tuple[str, ...] = ()
    chat: bool = False
    gen: dict = field(default_factory=dict)
    # images, audio etc. are carried inside messages; this lists the segment
    # types present so a backend can refuse what it cannot take.
    modalities: frozenset[str] = frozenset({"text"})
    # loglikelihood only: a context after which the same continuations (delimiter included, as
    # lm-eval >= 0.4.9 scores them) are also wanted, for mutual-information scoring. The engine sends
    # it as a second request to the backend and hands the result to metrics as
    # ``unconditioned_loglikelihoods``; backends ignore it.
    unconditioned: str | None = None
    contexts: tuple[str, ...] = ()
    tools: tuple[dict, ...] | None = None
    tool_choice: Any = None
    tool_loop: dict | None = None


@dataclass
class ModelOutput:
    """What a backend returns for one request.

    ``error`` set means the request failed; the sample is written with it. ``tool_calls``: the
    calls the model made, in Sample v1's message shape (``{"id", "type": "function", "function":
    {"name", "arguments"}}``, ``arguments`` the JSON text as the model wrote it, unchecked: a
    metric judges a malformed call, so it is a scored failure and never a lost row).
    ``trajectory``: a tool loop's messages after the request's own, in Sample v1's shape (the
    assistant's turns with their ``tool_calls``, the ``tool`` turns with the results, the later
    user turns), as ``golden_trajectories`` hold them.
    """

    text: str | None = None
    loglikelihoods: list[float] | None = None
    is_greedy: list[bool] | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    # this row's own time: a batched backend gives each row its share of the batch's (not the whole)
    latency_ms: float | None = None
    time_to_first_token_ms: float | None = None
    finish_reason: str | None = None
    formatted_prompt: str | None = None
    error: str | None = None
    raw: dict | None = None
    tool_calls: list[dict] | None = None
    trajectory: list[dict] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


def cut_at_stop(text: str, stops: Sequence[str] | None) -> tuple[str, bool]:
    """``text`` cut before the earliest of the ``stops`` strings it holds, and whether one was found.

    Every backend applies a task's stop sequences this way, so the written text never
    holds one even where the model or server already stopped there.
    """
    cut = min((i for i in (text.find(s) for s in stops or () if s) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


class Backend:
    """Base class for backends.

    Subclasses set ``capabilities`` (a subset of ``generate``, ``loglikelihood``,
    ``chat``, ``vision``, ``audio``, ``video``, ``file``) and implement
    :meth:`run` (or :meth:`arun` for network backends). The engine hands
    ``run`` up to ``max_batch`` requests at once; batching, sorting by length
    and concurrency are the backend's business. ``run`` returns exactly one
    :class:`ModelOutput` per request, in order; a failure of one request is
    that output's ``error``, not an exception.
    """

    name: ClassVar[str] = "backend"
    capabilities: frozenset[str] = frozenset()
    max_batch: int = 64
    model_id: str = "unknown"
    # a line for the person watching, printed after open() (e.g. a one-time conversion was cached)
    open_note: str | None = None
    # strings masked as *** wherever the run writes or prints (API keys, header values, URL passwords)
    secrets: tuple[str, ...] = ()
    # as a judge: how many finished rows wait for their verdicts together (None: 16, at most max_batch)
    concurrency: int | None = None
    # settings() keys that change how requests travel, not what the model answers (batching,
    # timeouts, retries): a response cache leaves them out of the model's identity
    transport_args: tuple[str, ...] = ()
    # the model has a chat template of its own (an instruct or chat model): a run whose tasks format
    # their prompts without it is told how to apply it (lm-eval's hint)
    chat_template: bool = False

    def open(self) -> None:
        """Load weights, start sessions. Called once, after the engine has checked
        capabilities against every task, before the first :meth:`run`."""

    def settings(self) -> dict[str, Any]:
        """Settings to record in summary.json (secrets are redacted by the caller too)."""
        return {}

    def stats(self) -> dict[str, Any]:
        """What the backend counted during the run (an HTTP backend: requests and failures
        per endpoint; Ray: replicas lost and replaced), recorded as ``run.model.stats`` in
        summary.json when not empty. Called when the summary is built, before :meth:`close`."""
        return {}

    def run(self, requests: Sequence[Request]) -> list[ModelOutput]:
        return asyncio.run(self.arun(requests))

    def stream(self, requests: Sequence[Request]) -> Iterator[tuple[int, ModelOutput]]:
        """The outputs of :meth:`run` as they finish: ``(index into requests, output)``, each
        index exactly once, in any order. The engine writes each row as soon as its output
        arrives, so an interrupted run loses only the requests in flight. The default waits
        for :meth:`run`; a backend that finishes requests one by one (per batch, per HTTP
        reply) overrides this. :class:`~gage_eval.api.errors.FatalBackendError` may be raised
        part way: the indices not yet yielded are then written as errored."""
        yield from enumerate(self.run(requests))

    async def arun(self, requests: Sequence[Request]) -> list[ModelOutput]:
        raise NotImplementedError(f"backend {self.name!r} implements neither run nor arun")

    def close(self) -> None:
        """Release the model, sockets or processes this backend holds."""

    def generated(self, tokens: int) -> None:
        """Say that ``tokens`` more tokens were generated (call it as a long generation batch
        goes): the progress bar shows them, so a batch whose rows finish together is seen moving."""
        if _token_listener is not None:
            _token_listener(tokens)


_token_listener: Callable[[int], None] | None = None


def use_token_listener(listener: Callable[[int], None] | None) -> None:
    """The core's: who hears :meth:`Backend.generated` (the running task's progress bar; None: nobody)."""
    global _token_listener
    _token_listener = listener


def safe_run(backend: Backend, requests: list) -> list[ModelOutput]:
    """Run a batch; a backend exception becomes every request's error, never a lost row."""
    try:
        outputs = backend.run(requests)
    except GageError:
        raise
    except Exception as exc:
        msg = f"{type(exc).__name__}: {exc}"
        return [ModelOutput(error=msg) for _ in requests]
    if len(outputs) != len(requests):
        msg = f"backend returned {len(outputs)} outputs for {len(requests)} requests"
        return [ModelOutput(error=msg) for _ in requests]
    return list(outputs)


def checked_output(request: Request, out: Any) -> ModelOutput:
    """A backend's output for ``request`` as the engine may use it, or one whose ``error`` says
    what was malformed (the row is then written as errored, never scored nor dropped): not a
    ModelOutput; a log-likelihood request without one finite number per continuation; a
    generate request whose text is not a string."""
    if not isinstance(out, ModelOutput):
        return ModelOutput(error=f"malformed backend output: {type(out).__name__}, not a ModelOutput")
    if out.error is not None:
        return out if isinstance(out.error, str) else replace(out, error=f"backend error: {out.error!r}")
    why = _malformed(request, out)
    return out if why is None else ModelOutput(error=f"malformed backend output: {why}")


def _malformed(request: Request, out: ModelOutput) -> str | None:
    if request.kind in (LOGLIKELIHOOD, LOGLIKELIHOOD_ROLLING):
        lls, n = out.loglikelihoods, len(request.continuations)
        if not isinstance(lls, (list, tuple)):
            return f"loglikelihoods is {type(lls).__name__}, expected a list of {n} numbers"
        if len(lls) != n:
            return f"{len(lls)} loglikelihoods for {n} continuations"
        for i, x in enumerate(lls):
            if isinstance(x, bool) or not isinstance(x, (int, float)):
                return f"loglikelihoods[{i}] is {type(x).__name__}, expected a number"
            if not math.isfinite(x):
                return f"loglikelihoods[{i}] is {x}, expected a finite number"
        greedy = out.is_greedy
        if greedy is not None and not (isinstance(greedy, (list, tuple)) and len(greedy) == n
                                       and all(isinstance(g, bool) for g in greedy)):
            return f"is_greedy is {greedy!r}, expected a list of {n} true/false values"
    elif not isinstance(out.text, str):
        return f"text is {type(out.text).__name__}, expected a string"
    return None
