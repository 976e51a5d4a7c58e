"""BFCL's ``multi_turn_base``: its rows as Sample v1 agent rows, its API classes (file system,
messaging, trading, travel, vehicle control ...) as the ``bfcl_multi_turn`` tool of the tool
loop, and ``bfcl_multi_turn``, the metric that checks a trajectory by state and response with
the rules of BFCL's multi-turn checker.

The API classes are the installed ``bfcl-eval`` package's (``eval_checker/multi_turn_eval/
func_source_code``; they import the standard library and, for MathAPI, mpmath), imported by
module path without BFCL's own top-level modules. The golden side is worked out once, when a row
is read: the possible answer's calls run on fresh instances, and each turn's results and the
instances' state after it are kept in the row (``metadata.bfcl``), so scoring, and rescoring,
runs no tool. The model's side is what the loop recorded: its calls, their results and, per user
turn, the instances' state.
"""
from __future__ import annotations

import ast
import copy
import datetime
import importlib
import inspect
import json
from collections import Counter
from typing import Any, Mapping

from gage_eval.api import Metric, MetricContext, Preprocessor, RowContext, text_segment, tools

from gage_plugins_builtin.tools.bfcl import package_data, schema_of
from gage_plugins_builtin.tools.calls import MAX_BITS, power_too_big, tool_call

SOURCE = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code"
# BFCL's class -> (module, function-doc file)
CLASSES = {
    "GorillaFileSystem": ("gorilla_file_system", "gorilla_file_system.json"),
    "MathAPI": ("math_api", "math_api.json"),
    "MessageAPI": ("message_api", "message_api.json"),
    "TwitterAPI": ("posting_api", "posting_api.json"),
    "TicketAPI": ("ticket_api", "ticket_api.json"),
    "TradingBot": ("trading_bot", "trading_bot.json"),
    "TravelAPI": ("travel_booking", "travel_booking.json"),
    "VehicleControlAPI": ("vehicle_control", "vehicle_control.json"),
}
STATELESS = ("MathAPI",)
MAX_DIGITS = 10_000  # of a logarithm or square root (BFCL's rows ask for at most 10; 10,000 take 0.1 s)
REFUSED = ("kill", "exit", "quit", "remove", "unlink", "popen", "Popen", "run")  # BFCL's list
INSTRUCTION = ("Work through each request with the functions. Call functions until the request is done; "
               "once nothing is left to call, reply without a call and the next request follows.")


def api_instances(involved: list[str], initial_config: Mapping[str, Any]) -> dict[str, Any]:
    """Fresh instances of the involved classes, each loaded with its part of the row's starting state."""
    out = {}
    for name in involved:
        if name not in CLASSES:
            raise ValueError(f"unknown BFCL API class {name!r} (known: {', '.join(CLASSES)})")
        instance = getattr(importlib.import_module(f"{SOURCE}.{CLASSES[name][0]}"), name)()
        if name not in STATELESS:
            instance._load_scenario(copy.deepcopy(initial_config.get(name, {})), long_context=False)
        out[name] = instance
    return out


def method_owners(instances: Mapping[str, Any]) -> dict[str, Any]:
    """Public method name -> instance (a later class wins a name two classes have, as in BFCL)."""
    owners = {}
    for instance in instances.values():
        for name, _ in inspect.getmembers(instance, inspect.ismethod):
            if not name.startswith("_"):
                owners[name] = instance
    return owners


def execute(owner: Any, name: str, args: tuple, kwargs: Mapping[str, Any]) -> str:
    """One call's result text, as BFCL's executor words it (an exception as ``Error during execution``)."""
    try:
        if name in REFUSED:
            raise Exception(f"Function call {name} is not allowed.")
        if owner is None:
            raise NameError(f"name '{name}' is not defined")
        if name == "power" and power_too_big(kwargs.get("base"), kwargs.get("exponent")):  # MathAPI's power
            raise OverflowError(f"the result of {name} would have more than {MAX_BITS} bits")
        if name in ("logarithm", "square_root") and _digits(kwargs.get("precision")) > MAX_DIGITS:  # MathAPI's
            raise OverflowError(f"{name} to more than {MAX_DIGITS} digits would take too long")
        return tools.Tool.result_text(getattr(owner, name)(*args, **kwargs))
    except Exception as exc:  # the model's (or the answer's) mistake is a result, as in BFCL
        return f"Error during execution: {exc}"


def _digits(precision: Any) -> int:
    """The digits MathAPI's logarithm (mpmath) or square_root (decimal) would compute to: ``int()`` of it, as
    mpmath reads it (10**7 held a core for hours in one C call); 0 when it is no number (the method says so)."""
    try:
        return int(precision)
    except (TypeError, ValueError, OverflowError):
        return 0


def snapshot(value: Any) -> Any:
    """An instance attribute as JSON whose equality is the attribute's ``==``: a file by name and
    content, a directory by name and contents (its parent left out, as its ``__eq__`` does),
    tuples and dicts with keys other than strings marked so they never equal lists and string keys."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, list):
        return [snapshot(v) for v in value]
    if isinstance(value, tuple):
        return {"__tuple__": [snapshot(v) for v in value]}
    if isinstance(value, Mapping):
        if all(isinstance(k, str) for k in value):
            return {k: snapshot(v) for k, v in value.items()}
        return {f"{type(k).__name__}:{k}": snapshot(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return {"__set__": sorted(json.dumps(snapshot(v), sort_keys=True) for v in value)}
    if isinstance(value, (datetime.date, datetime.time)):
        return {"__datetime__": value.isoformat()}
    kind = type(value).__name__
    if kind == "File":
        return {"__file__": value.name, "content": value.content}
    if kind == "Directory":
        return {"__directory__": value.name, "contents": snapshot(value.contents)}
    return {"__object__": kind, **{k: snapshot(v) for k, v in vars(value).items() if not k.startswith("_")}}


def instance_state(instances: Mapping[str, Any]) -> dict:
    return {name: {k: snapshot(v) for k, v in vars(inst).items() if not k.startswith("_")}
            for name, inst in instances.items()}


def parse_call(text: str) -> tuple[str, tuple, dict]:
    """A possible answer's call ``f(1, b='x')``: name, positional and keyword values (literals)."""
    node = ast.parse(text.strip(), mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"not a call: {text!r}")
    return (node.func.id, tuple(ast.literal_eval(a) for a in node.args),
            {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords})


def golden_run(record: Mapping[str, Any]) -> tuple[list[list[str]], list[dict], list[list[dict]]]:
    """The possible answer run on fresh instances: each turn's results, the state after each turn,
    and each turn's calls in Sample v1's shape (positional values named by the method's signature)."""
    instances = api_instances(record["involved_classes"], record.get("initial_config") or {})
    owners = method_owners(instances)
    results, states, calls = [], [], []
    for turn in record["ground_truth"]:
        turn_results, turn_calls = [], []
        for i, text in enumerate(turn):
            name, args, kwargs = parse_call(text)
            owner = owners.get(name)
            named = dict(kwargs)
            if owner is not None and args:
                params = [p for p in inspect.signature(getattr(owner, name)).parameters]
                named = {**dict(zip(params, args)), **kwargs}
            turn_calls.append(tool_call(name, named, i, f"call_{len(calls)}_{i}"))
            turn_results.append(execute(owner, name, args, kwargs))
        results.append(turn_results)
        states.append(instance_state(instances))
        calls.append(turn_calls)
    return results, states, calls


def function_docs(involved: list[str], excluded: list[str]) -> list[dict]:
    docs = []
    for name in involved:
        with open(package_data() / "multi_turn_func_doc" / CLASSES[name][1], encoding="utf-8") as fh:
            docs.extend(d for d in map(json.loads, filter(str.strip, fh)) if d["name"] not in excluded)
    return docs


def _messages(turn: list) -> list[dict]:
    return [{"role": m["role"], "content": [text_segment(str(m.get("content") or ""))]} for m in turn]


class BFCLMultiTurnRow(Preprocessor):
    """A BFCL multi-turn row as a Sample v1 agent row: the first turn's messages, the later turns
    as ``metadata.user_turns`` (the tool loop sends each once the model stops calling), the
    involved classes' functions as OpenAI tools, the possible answer as ``golden_trajectories``
    (its calls and their results, turn by turn) and, for the metric, ``metadata.bfcl``."""

    def __call__(self, record: Mapping[str, Any], ctx: RowContext) -> dict:
        for key in ("id", "question", "involved_classes", "ground_truth"):
            if key not in record:
                raise ValueError(f"BFCL multi-turn row has no {key!r}")
        turns = record["question"]
        if not isinstance(turns, list) or not turns or len(turns) != len(record["ground_truth"]):
            raise ValueError("'question' must hold one list of messages per turn of 'ground_truth'")
        results, states, calls = golden_run(record)
        golden: list[dict] = []
        for t, (turn_calls, turn_results) in enumerate(zip(calls, results)):
            if t:
                golden.extend(_messages(turns[t]))
            if turn_calls:
                golden.append({"role": "assistant", "tool_calls": turn_calls})
                golden.extend({"role": "tool", "tool_call_id": c["id"], "name": c["function"]["name"],
                               "content": [text_segment(r)]} for c, r in zip(turn_calls, turn_results))
            golden.append({"role": "assistant", "content": [text_segment("")]})
        defs = [{"type": "function", "function": {"name": f["name"], "description": f.get("description", ""),
                                                    "parameters": schema_of(f.get("parameters", {}))}}
                 for f in function_docs(record["involved_classes"], record.get("excluded_function") or [])]
        system = {"role": "system", "content": [text_segment(INSTRUCTION)]}
        return {"schema_version": "v1", "id": str(record["id"]), "task_type": "agent",
                "messages": [system, *_messages(turns[0])], "tools": defs, "tool_choice": "auto",
                "golden_trajectories": [golden],
                "references": [json.dumps(record["ground_truth"], ensure_ascii=False)],
                "data_tag": {"classes": "+".join(record["involved_classes"])},
                "metadata": {"user_turns": [_messages(t) for t in turns[1:]],
                             "bfcl": {"id": str(record["id"]), "involved_classes": record["involved_classes"],
                                      "initial_config": record.get("initial_config") or {},
                                      "ground_truth": record["ground_truth"], "golden_results": results,
                                      "golden_states": states}}}


class BFCLTools(tools.Tool):
    """The row's BFCL API instances (``metadata.bfcl``): each call runs on the instance whose
    class has the method; ``state()`` is every instance's public attributes (:func:`snapshot`)."""

    def __init__(self, sample: Mapping[str, Any] | None = None):
        super().__init__(sample)
        bfcl = ((sample or {}).get("metadata") or {}).get("bfcl") or {}
        self.instances = api_instances(bfcl.get("involved_classes") or [], bfcl.get("initial_config") or {})
        self.owners = method_owners(self.instances)

    def functions(self) -> list[str]:
        return list(self.owners) + [n for n in REFUSED if n not in self.owners]

    def call(self, name: str, arguments: Mapping[str, Any]) -> str:
        return execute(self.owners.get(name), name, (), arguments)

    def state(self) -> dict:
        return instance_state(self.instances)


def model_turns(trajectory: list) -> list[list[tuple[list, list[str]]]]:
    """The trajectory's user turns, each a list of steps with calls: (calls, the texts of the tool
    turns that follow them, in order: call ids repeat from one reply to the next)."""
    turns: list[list] = [[]]
    previous = None
    for m in trajectory:
        role = m.get("role")
        if role == "user" and previous not in (None, "user"):
            turns.append([])
        elif role == "assistant" and m.get("tool_calls"):
            turns[-1].append((m["tool_calls"], []))
        elif role == "tool" and turns[-1]:
            turns[-1][-1][1].append("".join(s.get("text", "") for s in m.get("content") or ()
                                            if isinstance(s, Mapping)))
        previous = role
    return turns


def check(trajectory: list, states: list, bfcl: Mapping[str, Any]) -> tuple[bool, str, str]:
    """BFCL's multi-turn rules on a recorded trajectory: (valid, error type, reason)."""
    truth = bfcl["ground_truth"]
    turns = model_turns(trajectory)
    if len(turns) != len(truth) or len(states) != len(truth):
        return False, "multi_turn:force_terminated", f"{len(turns)} turns done of {len(truth)}"
    so_far: list[str] = []
    for t, steps in enumerate(turns):
        so_far.extend(r for _, rs in steps for r in rs)
        if not truth[t]:
            continue
        if not steps:
            return False, "multi_turn:empty_turn_model_response", f"no call in turn {t}"
        model_state = (states[t] or {}).get(BFCLTools.__name__) or {}
        for cls, attrs in bfcl["golden_states"][t].items():
            for attr, value in attrs.items():
                if (model_state.get(cls) or {}).get(attr) != value:
                    return False, "multi_turn:instance_state_mismatch", f"turn {t}: {cls}.{attr} differs"
        missing = Counter(bfcl["golden_results"][t]) - Counter(so_far)
        if missing:
            return (False, "multi_turn:execution_response_mismatch",
                    f"turn {t}: {sum(missing.values())} golden result(s) not among the model's")
    return True, "", ""


class BFCLMultiTurn(Metric):
    """1 when the trajectory passes BFCL's multi-turn check: every turn done, each turn with a
    possible answer has calls, the instances' state after it equals the answer's, and the
    answer's results are among the model's results so far. ``error_type`` names a failure."""

    name = "bfcl_multi_turn"

    def compute(self, ctx: MetricContext) -> dict:
        out = ctx.model_output
        loop = (out.get("raw") or {}).get("tool_loop") or {}
        valid, error_type, reason = check(list(out.get("trajectory") or []), list(loop.get("states") or []),
                                          ctx.get("sample.metadata.bfcl"))
        return {"value": 1.0} if valid else {"value": 0.0, "error_type": error_type, "reason": reason}
