"""The prompt-based tool mode: for a model that takes no tools natively, the tools are described
in the system prompt and the calls are read from the reply's text in the pythonic form
(``[get_weather(city="Paris")]``), as BFCL's prompting mode asks of its prompt models."""
from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from gage_eval.api import ModelOutput, Request, text_segment

from gage_plugins_builtin.tools.calls import PythonicParser, tool_functions

INSTRUCTION = (
    "You can call functions. The functions available, as JSON:\n{functions}\n\n"
    "If the request can be carried out with these functions, reply with the calls only, written as a "
    "Python list: [func_name1(param_a=value_a, param_b=value_b), func_name2(param=value)]. Write no other "
    "text. If no function fits the request, or it lacks a parameter a function requires, say so in words "
    "and call nothing.{choice}"
)


def _choice_line(tool_choice: Any) -> str:
    if tool_choice == "required":
        return " You must call at least one function."
    if isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or {}).get("name")
        if name:
            return f" Call the function {name}."
    return ""


def calls_off(request: Request) -> bool:
    """Whether the request asks for no call at all (``tool_choice: none``)."""
    return request.tool_choice == "none"


def instruction(request: Request) -> str:
    functions = json.dumps(tool_functions(request.tools), ensure_ascii=False, indent=1)
    return INSTRUCTION.format(functions=functions, choice=_choice_line(request.tool_choice))


def prompted(request: Request) -> Request:
    """The request with its tools described in the prompt (and no longer sent as tools)."""
    if not request.tools or calls_off(request):
        return replace(request, tools=None, tool_choice=None)
    text = instruction(request)
    if request.chat or request.prompt is None:
        messages = list(request.messages or ())
        if messages and messages[0].get("role") == "system":
            own = messages[0].get("content")
            own_segs = own if isinstance(own, list) else [text_segment(str(own or ""))]
            messages[0] = {**messages[0], "content": [text_segment(text + "\n\n"), *own_segs]}
        else:
            messages.insert(0, {"role": "system", "content": [text_segment(text)]})
        return replace(request, messages=tuple(messages), tools=None, tool_choice=None)
    return replace(request, prompt=text + "\n\n" + request.prompt, tools=None, tool_choice=None)


def read_calls(output: ModelOutput, parser: Any = None) -> ModelOutput:
    """The output with the calls its text holds as ``tool_calls`` (the text kept as it was, so a
    metric may read it again); a text with no readable call keeps why in ``raw.tool_call_error``."""
    if output.error is not None or output.text is None:
        return output
    _, calls, error = (parser or PythonicParser()).parse(output.text)
    raw = dict(output.raw or {})
    if error:
        raw["tool_call_error"] = error
    return replace(output, tool_calls=calls or None, raw=raw or None)
