"""The defaults of a run, defined once: the engine's RunOptions, the command line and the run
config fall back to these; the environment variables people set per machine come between
(the command line, then the run config, then the environment, then these).

Each variable's spelling in spec 004 (section 10.3) is read too where it differs from ours; a
bad value is a one-line error naming the variable (exit 2). README.md "Environment variables"
lists every variable gage-eval reads; those a plugin reads are declared by it
(``gage_register_options`` with ``env``) and checked with these.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Mapping

from gage_eval.api.errors import GageError

DEFAULT_SEED = 1234  # lm-evaluation-harness's default seed, few-shot sampling included
DEFAULT_OUTPUT_DIR = "runs"

# setting -> the variables that set it (ours first, then spec 004's name where it differs)
ENV_NAMES = {
    "output_dir": ("GAGE_EVAL_OUTPUT_DIR", "GAGE_EVAL_SAVE_DIR"),
    "limit": ("GAGE_EVAL_MAX_SAMPLES",),
    "shuffle": ("GAGE_EVAL_SHUFFLE",),
    "shuffle_seed": ("GAGE_EVAL_SHUFFLE_SEED",),
}
TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _whole(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text.strip())  # ValueError: not a whole number
        if value < minimum:
            raise ValueError(text)
        return value
    return parse


def _flag(text: str) -> bool:
    low = text.strip().lower()
    if low in TRUE or low in FALSE:
        return low in TRUE
    raise ValueError(text)


def _folder(text: str) -> str:
    path = Path(text).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(text)
    return os.path.abspath(path)


def type_parser(kind: str, minimum: int | None = None) -> tuple[Callable[[str], Any], str]:
    """How an environment variable's text becomes a value of a run option's ``type``
    (:class:`gage_eval.api.options.RunOption`), and what the message says was expected."""
    if kind == "whole":
        return _whole(minimum or 0), f"a whole number, {minimum or 0} or more"
    if kind == "number":
        return float, "a number"
    if kind == "folder":
        return _folder, "a folder"
    if kind == "switch":
        return _flag, "true or false (1, 0, yes, no, on, off)"
    return str.strip, "a text"


PARSERS: dict[str, tuple[Callable[[str], Any], str]] = {
    "output_dir": type_parser("folder"),
    "limit": (_whole(1), "a whole number of rows, 1 or more"),
    "shuffle": type_parser("switch"),
    "shuffle_seed": type_parser("whole", 0),
}


def env_setting(setting: str, environ: Mapping[str, str] | None = None) -> Any:
    """The value of ``setting`` from its environment variable(s), parsed; None when unset or
    empty. Two spellings set to different values, or a bad value, are a GageError naming them."""
    return env_value(ENV_NAMES[setting], *PARSERS[setting], environ)


def env_value(names: tuple[str, ...], parse: Callable[[str], Any], what: str,
              environ: Mapping[str, str] | None = None) -> Any:
    """The value of the first of the variables ``names`` set, parsed by ``parse``; None when none
    is set. Two set to different values, or a value ``parse`` refuses, are a GageError naming them
    and ``what`` was expected."""
    env = os.environ if environ is None else environ
    given = [(name, env[name]) for name in names if env.get(name, "").strip()]
    if not given:
        return None
    values = []
    for name, raw in given:
        try:
            values.append(parse(raw))
        except ValueError:
            raise GageError(f"environment variable {name}={raw!r}: expected {what}") from None
    if len(set(map(str, values))) > 1:
        raise GageError(f"environment variables {given[0][0]}={given[0][1]!r} and {given[1][0]}={given[1][1]!r} "
                        f"disagree; set one")
    return values[0]


def check_environment(environ: Mapping[str, str] | None = None) -> None:
    """Every setting's variables checked at once, so a bad one stops a run before anything runs."""
    for setting in ENV_NAMES:
        env_setting(setting, environ)
