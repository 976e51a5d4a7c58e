"""BFCL's single-turn categories: the rows of the installed ``bfcl-eval`` package (found without
importing it: ``pip install --no-deps bfcl-eval``) as Sample v1 agent rows, and ``bfcl_ast``,
the metric that checks a reply's tool calls as BFCL's AST checker does (:mod:`.bfcl_checker`)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any, Iterator, Mapping

from gage_eval.api import GageError, Loader, Metric, MetricContext, Preprocessor, RowContext, RowError, text_segment

from gage_plugins_builtin.tools.bfcl_checker import check_calls
from gage_plugins_builtin.tools.calls import call_arguments

PACKAGE = "bfcl_eval"
INSTALL = "pip install --no-deps bfcl-eval==2026.3.23"
# BFCL's parameter types as JSON Schema types, for the tools sent to a model (the checker reads BFCL's own)
SCHEMA_TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": "string"}


def package_data() -> Path:
    """bfcl_eval/data of the installed package, found without importing it."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise GageError(f"the BFCL tasks read their rows from the bfcl-eval package: {INSTALL} (or give --data)")
    return Path(list(spec.submodule_search_locations)[0]) / "data"


class BFCLLoader(Loader):
    """One BFCL v4 category's rows (``BFCL_v4_<category>.json``), each with its ``ground_truth``
    from ``possible_answer/`` (irrelevance categories have none: no call is the answer)."""

    def __init__(self, category: str, base_dir: str | None = None):
        data = package_data()
        self.path = data / f"BFCL_v4_{category}.json"
        if not self.path.is_file():
            known = sorted(p.name[len("BFCL_v4_"):-5] for p in data.glob("BFCL_v4_*.json"))
            raise GageError(f"bfcl loader: no category {category!r} in {data} (there: {', '.join(known)})")
        self.answers = data / "possible_answer" / self.path.name
        self.category = category
        self.data_dir = data
        self.source = {"from": "package", "id": "bfcl-eval", "path": str(self.path)}
        self.source_note = f"BFCL v4 {category} from the installed bfcl-eval package ({self.path})"

    def files(self) -> list[Path]:
        return [self.path] + ([self.answers] if self.answers.is_file() else [])

    def total(self) -> int | None:
        with open(self.path, encoding="utf-8") as fh:
            return sum(1 for line in fh if line.strip())

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        truth: dict[str, Any] = {}
        if self.answers.is_file():
            with open(self.answers, encoding="utf-8") as fh:
                for line in fh:
                    if line.strip():
                        row = json.loads(line)
                        truth[row["id"]] = row["ground_truth"]
        with open(self.path, encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                where = f"{self.path}:{n}"
                try:
                    record = json.loads(line)
                except ValueError as exc:
                    yield where, RowError(f"{where}: not JSON: {exc}")
                    continue
                if self.answers.is_file():
                    record["ground_truth"] = truth.get(record.get("id"))
                record.setdefault("category", self.category)
                yield where, record


def schema_of(parameters: Any) -> Any:
    """BFCL's parameter description with JSON Schema type names (dict -> object, float -> number ...)."""
    if isinstance(parameters, list):
        return [schema_of(p) for p in parameters]
    if not isinstance(parameters, Mapping):
        return parameters
    out = {k: schema_of(v) for k, v in parameters.items()}
    if isinstance(parameters.get("type"), str):
        out["type"] = SCHEMA_TYPES.get(parameters["type"], parameters["type"])
    return out


def _check_truth(truth: Any) -> None:
    """BFCL's possible answers: a list of ``{function: {parameter: [allowed values]}}`` (a bare value
    where the list belongs would be checked as a substring or an element, not as one answer)."""
    if truth is None:
        raise ValueError("no 'ground_truth' (the possible answers) for a row that expects calls")
    if not isinstance(truth, list):
        raise ValueError(f"'ground_truth' must be a list of {{function: {{parameter: [values]}}}}, "
                         f"not {type(truth).__name__}")
    for i, call in enumerate(truth):
        if not isinstance(call, Mapping) or len(call) != 1:
            raise ValueError(f"'ground_truth'[{i}] must be one {{function: {{parameter: [values]}}}}")
        (name, params), = call.items()
        if not isinstance(params, Mapping):
            raise ValueError(f"'ground_truth'[{i}].{name} must map each parameter to its allowed values")
        for param, allowed in params.items():
            if not isinstance(allowed, list):
                raise ValueError(f"'ground_truth'[{i}].{name}.{param} must be a list of allowed values, "
                                 f"not {type(allowed).__name__}")


class BFCLRow(Preprocessor):
    """A BFCL row (``id``, ``question``, ``function``, ``ground_truth``, ``category``) as a Sample v1
    agent row: the first turn's messages, the functions as OpenAI tools, ``tool_choice: auto``;
    BFCL's own function descriptions and possible answers kept in ``metadata.bfcl`` for the checker."""

    def __init__(self, category: str | None = None):
        self.category = category

    def __call__(self, record: Mapping[str, Any], ctx: RowContext) -> dict:
        for key in ("id", "question", "function"):
            if key not in record:
                raise ValueError(f"BFCL row has no {key!r}")
        category = record.get("category") or self.category
        if not category:
            raise ValueError("BFCL row has no 'category' and the task names none")
        if not isinstance(category, str):
            raise ValueError(f"'category' must be a string, not {type(category).__name__}")
        turns = record["question"]
        if not isinstance(turns, list) or len(turns) != 1 or not isinstance(turns[0], list):
            raise ValueError("'question' must hold exactly one turn (a list of messages): the single-turn "
                             "categories only")
        for i, m in enumerate(turns[0]):
            if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
                raise ValueError(f"'question'[0][{i}] must be a message with a 'role'")
        functions = record["function"]
        if not isinstance(functions, list) or not all(isinstance(f, Mapping) and "name" in f for f in functions):
            raise ValueError("'function' must be a list of function descriptions with a name")
        irrelevance = "irrelevance" in category
        truth = record.get("ground_truth")
        if not irrelevance:
            _check_truth(truth)
        messages = [{"role": m["role"], "content": [text_segment(str(m.get("content") or ""))]} for m in turns[0]]
        tools = [{"type": "function", "function": {"name": f["name"], "description": f.get("description", ""),
                                                    "parameters": schema_of(f.get("parameters", {}))}}
                 for f in functions]
        return {"schema_version": "v1", "id": str(record["id"]), "task_type": "function-calling",
                "messages": messages, "tools": tools, "tool_choice": record.get("tool_choice", "auto"),
                "references": [json.dumps(truth or [], ensure_ascii=False)],
                "data_tag": {"category": category},
                "metadata": {"bfcl": {"category": category, "functions": functions, "ground_truth": truth or []}}}


def decoded_calls(tool_calls: Any, tools: Any, tool_choice: Any) -> tuple[list[dict] | None, str]:
    """``[{name: arguments}]`` from recorded calls, or None and why a call is malformed: arguments
    that are not a JSON object, a function not among the row's tools, any call when
    ``tool_choice`` is ``none``."""
    known = {(t.get("function") or t).get("name") for t in tools or () if isinstance(t, Mapping)}
    out = []
    for i, call in enumerate(tool_calls or ()):
        fn = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            return None, f"tool call {i} has no function name"
        if tool_choice == "none":
            return None, f"tool call {i} ({fn['name']}) although tool_choice is none"
        if fn["name"] not in known:
            return None, f"tool call {i} names an unknown function {fn['name']!r}"
        try:
            args = call_arguments(fn.get("arguments"))
        except ValueError as exc:
            return None, f"tool call {i} ({fn['name']}): arguments are not valid JSON: {exc}"
        if not isinstance(args, dict):
            return None, f"tool call {i} ({fn['name']}): arguments are not a JSON object"
        out.append({fn["name"]: args})
    return out, ""


class BFCLAst(Metric):
    """1 when the reply's tool calls pass BFCL's AST check against the row's possible answers
    (irrelevance categories: when there is no call). The result keeps ``error_type`` (BFCL's
    name for the failure, or ``tool_call:malformed``) and ``reason``."""

    name = "bfcl_ast"

    def compute(self, ctx: MetricContext) -> dict:
        bfcl = ctx.get("sample.metadata.bfcl")
        category = bfcl["category"]
        calls, malformed = decoded_calls(ctx.model_output.get("tool_calls"), ctx.sample.get("tools"),
                                         ctx.sample.get("tool_choice"))
        if "irrelevance" in category:
            if malformed or calls:
                why = malformed or f"{len(calls)} call(s) where none was expected"
                return {"value": 0.0, "error_type": "irrelevance_error:decoder_success", "reason": why}
            return {"value": 1.0}
        if malformed:
            return {"value": 0.0, "error_type": "tool_call:malformed", "reason": malformed}
        if not calls:
            why = (ctx.model_output.get("raw") or {}).get("tool_call_error") or "no tool call in the reply"
            return {"value": 0.0, "error_type": "ast_decoder:decoder_failed", "reason": why}
        try:
            valid, error_type, reason = check_calls(bfcl["functions"], calls, bfcl["ground_truth"], category)
        except (KeyError, TypeError, AttributeError) as exc:  # a description the rules cannot read
            return {"value": 0.0, "error_type": "checker:unreadable", "reason": f"{type(exc).__name__}: {exc}"}
        return {"value": 1.0} if valid else {"value": 0.0, "error_type": error_type, "reason": reason}
