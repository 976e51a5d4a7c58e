"""The multi-turn tool loop: a backend wrapper (``gage_wrap_backend``) that carries out each
request whose task opted in (``request.tool_loop``) as a conversation.

Each step sends the model the row's messages and the trajectory so far; the calls of its reply
run through the row's tools (``gage_register_tools``: a fresh instance of each per row, built with
the task's ``tool_loop.tool_args`` for it) and the results go back as ``tool`` turns (a tool's
error too; a tool that cannot be built for the row, or a call that raises :class:`~gage_eval.api.tools.RowFailed`,
is the row's error instead). A reply without calls ends the user turn: the next one (the
row's ``metadata.user_turns``, each a list of messages) follows, or the row is done. A user
turn with more than ``max_steps`` replies with calls stops the row there (BFCL's force quit).
The rows of one batch step together, so a local backend still batches. Each step's request goes
through the response cache beneath (keyed by the tools and the conversation so far).

What comes back is one output per row: ``text`` the last reply's, ``trajectory`` every message
after the request's own (Sample v1's shape), and ``raw.tool_loop``: the user turns done, the
steps taken, why it stopped and, per user turn, the tools' ``state()``.
"""
from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any, Iterator, Mapping, Sequence

from gage_eval.api import Backend, ModelOutput, Request, running, text_segment, tools

from gage_plugins_builtin.tools.calls import call_arguments

MAX_STEPS = 20  # BFCL's MAXIMUM_STEP_LIMIT
MAX_RESULT_CHARS = 65_536  # of one call's result, the model (and the trajectory) get at most this much
CALL_TIMEOUT_S = 300.0  # a call that has not returned by then is abandoned (a tool that hangs)


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[result cut: {len(text) - limit} more characters]"


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):  # (its str is only the status)
        return f"Error during execution: SystemExit({exc.code!r})"
    return f"Error during execution: {exc}"


class _Hung(Exception):
    pass


def _call_within(tool: Any, name: str, args: dict, timeout_s: float) -> Any:
    """``tool.call(name, args)`` in a thread of its own, waited for ``timeout_s`` (a hung call is left
    to run in that daemon thread: Python cannot stop it, but the row and the run go on)."""
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["value"] = tool.call(name, args)
        except BaseException as exc:  # (handed to the caller, which decides)
            box["exc"] = exc

    worker = threading.Thread(target=work, name=f"tool call {name}", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise _Hung
    if "exc" in box:
        raise box["exc"]
    return box.get("value")


def _build(name: str, row: Mapping[str, Any], args: dict) -> Any:
    """One row's instance of tool ``name``; a failure names the tool and the task's ``tool_args`` for it."""
    make = tools.factory(name)
    try:
        return make(sample=row, **args)
    except Exception as exc:
        given = f"tool_args.{name}: {', '.join(sorted(args))}" if args else f"no tool_args.{name}"  # (keys only:
        # a value may be a credential, as a remote sandbox's token)
        raise ValueError(f"tool {name} ({given}): {type(exc).__name__}: {exc}") from None


class Toolbox:
    """One row's tool instances and the functions each serves (a later tool wins a name two serve,
    as BFCL maps a method to the last class that has it)."""

    def __init__(self, names: Sequence[str], row: Mapping[str, Any], args: Mapping[str, Any] | None = None,
                 max_result_chars: int = MAX_RESULT_CHARS, call_timeout_s: float = CALL_TIMEOUT_S):
        args = dict(args or {})
        self.max_result_chars, self.call_timeout_s = max_result_chars, call_timeout_s
        self.hung: set[int] = set()  # the tools (by id) a call of which never came back
        unknown = sorted(set(args) - set(names))
        if unknown:
            raise ValueError(f"tool_args names {', '.join(unknown)}, not among the tools {', '.join(names)}")
        self.tools = [_build(name, row, dict(args.get(name) or {})) for name in names]
        self.owner: dict[str, Any] = {}
        for tool in self.tools:
            for fn in tool.functions():
                self.owner[fn] = tool

    def definitions(self) -> list[dict]:
        return [d for tool in self.tools for d in tool.definitions()]

    def run(self, call: Mapping[str, Any]) -> str:
        """One call's result text; whatever goes wrong is the text, for the model to read (but a
        :class:`~gage_eval.api.tools.RowFailed`, raised again naming the function: the row's setting failed, not the model)."""
        fn = call.get("function") if isinstance(call, Mapping) else None
        name = fn.get("name") if isinstance(fn, Mapping) else None
        tool = self.owner.get(name) if isinstance(name, str) else None
        if tool is None:
            return f"Error: unknown function {name!r}; the functions: {', '.join(sorted(self.owner))}"
        try:
            args = call_arguments(fn.get("arguments"))
        except ValueError as exc:
            return f"Error: the arguments of {name} are not valid JSON: {exc}"
        if not isinstance(args, dict):
            return f"Error: the arguments of {name} are not a JSON object"
        if id(tool) in self.hung:
            return f"Error: {name} is unavailable: an earlier call of its tool did not return"
        wait = self.call_timeout_s  # or longer for a tool that bounds its own calls (Tool.call_timeout_s)
        if isinstance(tool, tools.Tool) and tool.call_timeout_s:  # (a tool not built on tools.Tool has none)
            wait = max(wait, float(tool.call_timeout_s))
        try:
            return _cut(tools.Tool.result_text(_call_within(tool, name, args, wait)), self.max_result_chars)
        except tools.RowFailed as exc:
            raise tools.RowFailed(f"tool {name}: {exc}") from None
        except _Hung:
            self.hung.add(id(tool))
            return f"Error: {name} did not return within {wait:g} s"
        except (Exception, SystemExit) as exc:  # a tool's failure is the model's to read, never the run's
            return _cut(_error_text(exc), self.max_result_chars)

    def state(self) -> dict | None:
        states = {}
        for t in self.tools:
            if id(t) in self.hung:  # (its call may still be changing it)
                states[type(t).__name__] = {"error": "a call did not return"}
                continue
            try:
                s = t.state()
            except Exception as exc:  # a state that cannot be read is recorded as such, not the row's crash
                s = {"error": _error_text(exc)}
            if s is not None:
                states[type(t).__name__] = s
        return states or None


class Conversation:
    """One row's loop: the request it started from, its trajectory, its tools."""

    def __init__(self, request: Request):
        loop = request.tool_loop or {}
        self.request = request
        self.row = loop.get("row") or {}
        self.max_steps = int(loop.get("max_steps") or MAX_STEPS)
        self.trajectory: list[dict] = []
        self.pending_turns = list((self.row.get("metadata") or {}).get("user_turns") or [])
        self.states: list[Any] = []
        self.steps = self.turn_steps = self.turns = 0
        self.stopped = self.failure = ""
        self.latency_ms = 0.0
        self.tokens = [0, 0]
        self.last: ModelOutput | None = None
        self.toolbox = Toolbox(loop.get("tools") or (), self.row, loop.get("tool_args"),
                               int(loop.get("max_result_chars") or MAX_RESULT_CHARS),
                               float(loop.get("call_timeout_s") or CALL_TIMEOUT_S))
        self.tools = request.tools or tuple(self.toolbox.definitions()) or None

    def next_request(self) -> Request:
        messages = tuple(self.request.messages or ()) + tuple(self.trajectory)
        return replace(self.request, messages=messages, tools=self.tools, tool_loop=None)

    def take(self, out: ModelOutput) -> bool:
        """Record one reply (and run its calls); whether the row is done."""
        self.last, self.steps = out, self.steps + 1
        self.latency_ms += out.latency_ms or 0.0
        self.tokens = [self.tokens[0] + (out.input_tokens or 0), self.tokens[1] + (out.output_tokens or 0)]
        if out.error is not None:
            self.stopped = "error"
            return True
        message: dict[str, Any] = {"role": "assistant", "content": [text_segment(out.text or "")]}
        if out.tool_calls:
            message["tool_calls"] = out.tool_calls
        self.trajectory.append(message)
        if out.tool_calls:
            for i, call in enumerate(out.tool_calls):
                fn = call.get("function") if isinstance(call, Mapping) else None
                try:
                    text = self.toolbox.run(call)
                except tools.RowFailed as exc:  # the row's setting failed, not the model: the row's error
                    self.stopped, self.failure = "error", str(exc)
                    return True
                self.trajectory.append({"role": "tool", "tool_call_id": str(call.get("id") or f"call_{i}"),
                                        "name": str((fn or {}).get("name") or ""), "content": [text_segment(text)]})
            self.turn_steps += 1
            if self.turn_steps <= self.max_steps:
                return False
            self.stopped = "max_steps"
            self._end_turn()
            return True
        self._end_turn()
        if not self.pending_turns:
            self.stopped = "done"
            return True
        self.trajectory.extend(self.pending_turns.pop(0))
        self.turn_steps = 0
        return False

    def _end_turn(self) -> None:
        self.turns += 1
        self.states.append(self.toolbox.state())

    def result(self) -> ModelOutput:
        out = self.last or ModelOutput(text="")
        if self.failure:
            out = replace(out, error=self.failure)
        raw = dict(out.raw or {})
        raw["tool_loop"] = {"user_turns": self.turns, "steps": self.steps, "stopped": self.stopped}
        if any(s is not None for s in self.states):
            raw["tool_loop"]["states"] = self.states
        tokens = {"input_tokens": self.tokens[0], "output_tokens": self.tokens[1]} if any(self.tokens) else {}
        return replace(out, trajectory=self.trajectory, raw=raw, latency_ms=round(self.latency_ms, 3), **tokens)


class ToolLoopBackend(Backend):
    """The model's backend with the tool loop in front: requests without ``tool_loop`` pass
    through untouched; each with one is carried out as a :class:`Conversation`."""

    def __init__(self, backend: Any, use: running.BackendUse, owned: Any = None):
        self.inner, self.use, self.owned = backend, use, owned
        self.max_batch = getattr(backend, "max_batch", 64)
        self.concurrency = getattr(backend, "concurrency", None)

    def _inner_stream(self, requests: Sequence[Request]) -> Iterator[tuple[int, ModelOutput]]:
        stream = getattr(self.inner, "stream", None)
        return iter(stream(requests)) if stream is not None else enumerate(self.inner.run(requests))

    def stream(self, requests: Sequence[Request]) -> Iterator[tuple[int, ModelOutput]]:
        if all(r.tool_loop is None for r in requests):  # (the backend's own stream: no step through here per reply)
            return self._inner_stream(requests)
        return self._loops(requests)

    def _loops(self, requests: Sequence[Request]) -> Iterator[tuple[int, ModelOutput]]:
        plain = [i for i, r in enumerate(requests) if r.tool_loop is None]
        if plain:
            for k, out in self._inner_stream([requests[i] for i in plain]):
                yield plain[k], out
        active: dict[int, Conversation] = {}
        for i, r in enumerate(requests):
            if r.tool_loop is not None:
                try:
                    active[i] = Conversation(r)
                except Exception as exc:  # a tool that cannot be built for this row: the row's error
                    yield i, ModelOutput(error=f"tool loop: cannot set up the tools: {type(exc).__name__}: {exc}")
        while active:
            order = list(active)
            for k, out in self._inner_stream([active[i].next_request() for i in order]):
                conv = active[order[k]]
                if conv.take(out):
                    del active[order[k]]
                    yield order[k], conv.result()

    def run(self, requests: Sequence[Request]) -> list[ModelOutput]:
        outputs: list[Any] = [None] * len(requests)
        for i, out in self.stream(requests):
            outputs[i] = out
        return outputs

    def close(self) -> None:
        if self.owned is not None:  # (a wrapper made here; the engine closes the model's backend itself)
            self.owned.close()
