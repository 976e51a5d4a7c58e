"""A dependency-free backend whose answers are a pure function of (seed, request).

It measures the harness's own cost and drives tests: the same seed gives the
same answers whatever the batch size, order or resumption.
"""
from __future__ import annotations

import hashlib
import json
import time
from typing import Any, Iterator, Sequence

from gage_eval.api import (GENERATE, LOGLIKELIHOOD, LOGLIKELIHOOD_ROLLING, Backend, GageError, ModelOutput, Request,
                           messages_text)

from gage_plugins_builtin.backends.args import NO_MINIMUM, as_number

MODES = ("letter", "echo", "fixed", "script")


def _unit(*parts: object) -> float:
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


class DummyBackend(Backend):
    """Deterministic answers. ``response``: ``letter`` (a letter A-D; a sampled request's depends
    on its seed too, so repeats differ), ``echo`` (the prompt's last line), ``fixed`` (the
    ``text`` argument) or ``script``: the replies of the
    JSON file ``script`` (``{sample_id: [reply, ...]}``, or one list for every row; a reply is
    ``{"text", "tool_calls"}``, checked when the backend is built), the n-th reply for a conversation holding n-1 assistant turns
    and an empty one past the end, to drive a tool loop (it declares ``tools``). ``fail_every``: make
    every n-th request fail, to exercise error accounting; ``delay_ms``: sleep this
    long per request, to stand in for a slow model."""

    name = "dummy"
    transport_args = ("batch_size",)
    capabilities = frozenset({GENERATE, LOGLIKELIHOOD, LOGLIKELIHOOD_ROLLING, "chat", "vision", "audio", "video",
                              "file"})

    def __init__(self, seed: int = 1234, response: str = "letter", text: str = "", batch_size: int | str = 64,
                 fail_every: int = 0, vision: bool = True, delay_ms: float = 0.0, script: str | None = None,
                 **unused):
        if response not in MODES:
            raise GageError(f"dummy backend: response must be one of {', '.join(MODES)}, not {response!r}")
        if unused:
            raise GageError(f"dummy backend: unknown argument(s) {', '.join(sorted(unused))}")
        self.seed = seed
        self.response = response
        self.text = "" if text is None else str(text)  # (text=7 arrives as a number)
        self.max_batch = int(batch_size) if str(batch_size).isdigit() else 64
        self.fail_every = as_number(fail_every, "fail_every", "dummy backend", int, NO_MINIMUM)
        self.delay_s = as_number(delay_ms, "delay_ms", "dummy backend", float, 0) / 1000
        if not self.delay_s < 86_400:  # (inf, nan: time.sleep refuses them on every row)
            raise GageError(f"dummy backend: delay_ms must be a number of milliseconds under a day, not {delay_ms!r}")
        if not vision:
            self.capabilities = frozenset({GENERATE, LOGLIKELIHOOD, LOGLIKELIHOOD_ROLLING, "chat"})
        self.model_id = "gage-eval/dummy"
        self.script = None
        if response == "script":
            self.script = _read_script(script)
            self.capabilities = self.capabilities | {"tools"}
        self._count = 0

    def settings(self) -> dict:
        out = {"seed": self.seed, "response": self.response, "batch_size": self.max_batch}
        return {**out, "script": self.script} if self.script is not None else out

    def run(self, requests: Sequence[Request]) -> list[ModelOutput]:
        outputs: list = [None] * len(requests)
        for i, out in self.stream(requests):
            outputs[i] = out
        return outputs

    def stream(self, requests: Sequence[Request]) -> Iterator[tuple[int, ModelOutput]]:
        """One output per request, in order, each after its ``delay_ms``."""
        for i, req in enumerate(requests):
            if self.delay_s:
                time.sleep(self.delay_s)
            yield i, self._one(req)

    def _scripted(self, req: Request) -> ModelOutput:
        replies = self.script if isinstance(self.script, list) else self.script.get(req.sample_id, [])
        n = sum(1 for m in req.messages or () if m.get("role") == "assistant")
        reply = replies[n] if n < len(replies) else {}
        return ModelOutput(text=str(reply.get("text", "")), tool_calls=reply.get("tool_calls") or None,
                           finish_reason="stop")

    def _one(self, req: Request) -> ModelOutput:
        t0 = time.perf_counter()
        self._count += 1
        if self.fail_every and self._count % self.fail_every == 0:
            return ModelOutput(error="dummy backend: injected failure")
        prompt = req.prompt if req.prompt is not None else messages_text(req.messages or ())
        if req.kind == LOGLIKELIHOOD_ROLLING:  # about one nat a character, varied by the text
            text = req.continuations[0] if req.continuations else ""
            return ModelOutput(loglikelihoods=[-len(text) * (0.5 + _unit(self.seed, req.sample_id, text))],
                               is_greedy=[False], input_tokens=len(text.split()),
                               latency_ms=(time.perf_counter() - t0) * 1000)
        if req.kind == LOGLIKELIHOOD:
            lls = [-(1 + len(c)) * (0.5 + _unit(self.seed, req.sample_id, prompt, c)) for c in req.continuations]
            best = max(range(len(lls)), key=lls.__getitem__) if lls else 0
            return ModelOutput(loglikelihoods=lls, is_greedy=[i == best for i in range(len(lls))],
                               input_tokens=len(prompt.split()),
                               latency_ms=(time.perf_counter() - t0) * 1000)
        if self.script is not None:
            return self._scripted(req)
        if self.response == "echo":
            text = prompt.strip().splitlines()[-1] if prompt.strip() else ""
        elif self.response == "fixed":
            text = self.text
        else:
            sampled = (req.gen["seed"],) if req.gen.get("do_sample") and "seed" in req.gen else ()
            text = "ABCD"[int(_unit(self.seed, req.sample_id, prompt, *sampled) * 4)]  # (sampling: seeded)
        return ModelOutput(text=text, input_tokens=len(prompt.split()), output_tokens=len(text.split()),
                           finish_reason="stop", latency_ms=(time.perf_counter() - t0) * 1000)


def _read_script(path: str | None) -> Any:
    if not path:
        raise GageError("dummy backend: response=script needs script=FILE (a JSON file of replies)")
    try:
        with open(path, encoding="utf-8") as fh:
            script = json.load(fh)
    except (OSError, ValueError) as exc:
        raise GageError(f"dummy backend: script {path}: {exc}") from None
    if not isinstance(script, (list, dict)):
        raise GageError(f"dummy backend: script {path}: expected a list of replies or an object of lists by sample id")
    lists = {"": script} if isinstance(script, list) else {f"[{json.dumps(k)}]": v for k, v in script.items()}
    for where, replies in lists.items():
        if not isinstance(replies, list):
            raise GageError(f"dummy backend: script {path}: entry {where}: expected a list of replies, "
                            f"not {_kind(replies)}")
        for i, reply in enumerate(replies):
            problem = _reply_problem(reply)
            if problem:
                raise GageError(f"dummy backend: script {path}: entry {where}[{i}]: {problem}")
    return script


def _kind(value: Any) -> str:
    return {str: "a string", list: "a list", dict: "an object", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number")


def _reply_problem(reply: Any) -> str | None:
    """What is wrong with one scripted reply: it is an object (``{"text", "tool_calls"}``, both
    optional; what tool_calls holds goes to the caller as it is, malformed calls included)."""
    if not isinstance(reply, dict):
        return f'expected a reply object {{"text": ..., "tool_calls": [...]}}, not {_kind(reply)}'
    return None
