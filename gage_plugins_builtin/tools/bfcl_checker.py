"""BFCL's AST check of function calls (its rules, written for gage-eval).

A call is ``{name: {param: value}}``; a possible answer is ``{name: {param: [allowed values]}}``
where ``""`` among the allowed values marks an optional parameter. The rules, as BFCL v4's checker
applies them to Python functions: the function name must match; every required parameter must be
given; no parameter outside the function's properties or the possible answer; each value must
have the declared type (an int passes for a float; a value of the possible answer's own type
passes as a "variable"; arrays and tuples check their items' type one level deep); strings
compare after dropping spaces and ``,./-_*^`` and lower-casing (single quotes read as double);
lists, dicts and lists of dicts compare element-wise with strings so normalised; other values must
be among the allowed ones; a parameter the possible answer requires (no ``""``) must be given.
Parallel calls match possible answers in any order; "multiple" picks one function of several.

Each verdict is ``(valid, error_type, reason)``; the error types are BFCL's names for them.
"""
from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

PYTHON_TYPES = {"string": str, "integer": int, "float": float, "boolean": bool, "array": list, "tuple": list,
                "dict": dict, "any": str}
NESTED = ("array", "tuple")
OK = (True, "", "")

Verdict = tuple[bool, str, str]


def _answer_type(allowed: Sequence[Any]) -> type | None:
    for value in allowed:
        if value != "":
            return type(value)
    return None


def _type_check(param: str, value: Any, allowed: Any, expected: type, nested: type | None,
                described: str) -> tuple[Verdict, bool]:
    """(verdict, whether the value counts as a variable: the possible answer's type, not the declared)."""
    answer_type = _answer_type(allowed)
    variable = answer_type is not None and answer_type != expected
    if type(value) == expected:
        if nested is None:
            return OK, variable
        for item in allowed:
            fits = True
            if type(item) == list:
                fits = all(_type_check(param, v, item, nested, None, nested.__name__)[0][0] for v in value)
            if fits:
                return OK, variable
        if answer_type is not None and type(value) == answer_type:
            return (False, "type_error:nested", f"{param!r}: items are not all {nested.__name__}"), True
        return (False, "type_error:simple", f"{param!r}: expected {described}, got {type(value).__name__}"), False
    if answer_type is not None and type(value) == answer_type:
        return OK, True
    return (False, "type_error:simple", f"{param!r}: expected {described}, got {type(value).__name__} "
            f"({value!r})"), False


def standardize(text: str) -> str:
    return re.sub(r"[ ,./\-_*^]", "", text).lower().replace("'", '"')


def _norm(value: Any) -> Any:
    return standardize(value) if type(value) == str else value


def _string_check(param: str, value: str, allowed: Sequence[Any]) -> Verdict:
    if standardize(value) not in [standardize(a) for a in allowed if type(a) == str]:
        return False, "value_error:string", f"{param!r}: {value!r} is not one of {list(allowed)!r}"
    return OK


def _list_check(param: str, value: list, allowed: Sequence[Any]) -> Verdict:
    if [_norm(v) for v in value] not in [[_norm(x) for x in a] for a in allowed]:
        return False, "value_error:list/tuple", f"{param!r}: {value!r} is not one of {list(allowed)!r}"
    return OK


def _dict_check(param: str, value: dict, allowed: Sequence[Any]) -> Verdict:
    verdict: Verdict = (False, "dict_checker:unclear", f"{param!r}: no possible answer to compare with")
    for answer in allowed:
        if answer == "":
            continue
        verdict = OK
        for key, item in value.items():
            if key not in answer:
                verdict = (False, "value_error:dict_key", f"{param!r}: unexpected key {key!r}")
                break
            if _norm(item) not in [_norm(a) for a in answer[key]]:
                verdict = (False, "value_error:dict_value", f"{param!r}[{key!r}]: {item!r} is not one of "
                           f"{answer[key]!r}")
                break
        if verdict[0]:
            for key, options in answer.items():
                if key not in value and "" not in options:
                    verdict = (False, "value_error:dict_key", f"{param!r}: missing key {key!r}")
                    break
        if verdict[0]:
            return OK
    return verdict


def _list_dict_check(param: str, value: list, allowed: Sequence[Any]) -> Verdict:
    verdict: Verdict = (False, "list_dict_checker:unclear", f"{param!r}: no possible answer to compare with")
    for answer in allowed:
        if len(value) != len(answer):
            verdict = (False, "value_error:list_dict_count", f"{param!r}: {len(value)} dicts, expected {len(answer)}")
            continue
        verdict = OK
        for item, expected in zip(value, answer):
            verdict = _dict_check(param, item, [expected])
            if not verdict[0]:
                break
        if verdict[0]:
            return OK
    return verdict


def check_call(function: Mapping[str, Any], call: Mapping[str, Any], answer: Mapping[str, Any]) -> Verdict:
    """One call against one possible answer, the function's description saying the types."""
    possible = next(iter(answer.values()))
    name = function["name"]
    params = function["parameters"]
    properties, required = params.get("properties", {}), params.get("required", [])
    if name not in call:
        return False, "simple_function_checker:wrong_func_name", f"function {name!r} not called"
    given = call[name]
    for param in required:
        if param not in given:
            return False, "simple_function_checker:missing_required", f"missing required parameter {param!r}"
    for param, value in given.items():
        if param not in properties or param not in possible:
            return False, "simple_function_checker:unexpected_param", f"unexpected parameter {param!r}"
        described = properties[param]["type"]
        expected = PYTHON_TYPES[described]
        nested = PYTHON_TYPES[properties[param]["items"]["type"]] if described in NESTED else None
        if described == "tuple" and type(value) == tuple:
            value = list(value)
        if described == "float" and type(value) == int:
            value = float(value)
        verdict, variable = _type_check(param, value, possible[param], expected, nested, described)
        if not verdict[0]:
            return verdict
        if not variable:
            if expected == dict:
                check = _dict_check
            elif expected == list and nested == dict:
                check = _list_dict_check
            elif expected == str:
                check = _string_check
            elif expected == list:
                check = _list_check
            else:
                check = None
            if check is not None:
                verdict = check(param, value, possible[param])
                if not verdict[0]:
                    return verdict
                continue
        if value not in possible[param]:
            return False, "value_error:others", f"{param!r}: {value!r} is not one of {possible[param]!r}"
    for param, options in possible.items():
        if param not in given and "" not in options:
            return False, "simple_function_checker:missing_optional", f"parameter {param!r} is expected"
    return OK


def _described(functions: Sequence[Mapping[str, Any]], name: str) -> Mapping[str, Any] | None:
    return next((f for f in functions if f["name"] == name), None)


def check_calls(functions: Sequence[Mapping[str, Any]], calls: Sequence[Mapping[str, Any]],
                answers: Sequence[Mapping[str, Any]], category: str) -> Verdict:
    """A reply's calls against a row's possible answers, by BFCL category (``simple``,
    ``multiple``, ``parallel``, ``parallel_multiple``, their ``live_`` forms)."""
    if "parallel" in category:
        if len(calls) != len(answers):
            return (False, "parallel_function_checker_no_order:wrong_count",
                    f"{len(calls)} calls, expected {len(answers)}")
        matched: set[int] = set()
        for i, answer in enumerate(answers):
            function = _described(functions, next(iter(answer)))
            found, last = None, None
            for j, call in enumerate(calls):
                if j in matched:
                    continue
                last = check_call(function, call, answer)
                if last[0]:
                    found = j
                    break
            if found is None:
                why = last[2] if last else "no call left"
                return (False, "parallel_function_checker_no_order:cannot_find_match",
                        f"no call matches expected call {i} ({next(iter(answer))}): {why}")
            matched.add(found)
        return OK
    if "multiple" in category:
        if len(calls) != len(answers):
            return False, "multiple_function_checker:wrong_count", f"{len(calls)} calls, expected {len(answers)}"
        return check_call(_described(functions, next(iter(answers[0]))), calls[0], answers[0])
    if len(calls) != 1:
        return False, "simple_function_checker:wrong_count", f"{len(calls)} calls, expected 1"
    return check_call(functions[0], calls[0], answers[0])
