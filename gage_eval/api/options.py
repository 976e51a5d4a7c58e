"""A run option a plugin declares with ``gage_register_options``: plain data, which the command
line turns into a flag of the run, the run config reader into a key, and the run's settings
(config.json) into a value kept for ``--resume``."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

#: what an option's value is; ``switch`` is an on/off flag (``--NAME/--no-NAME``)
TYPES = ("text", "whole", "number", "folder", "switch")
_FLAG = re.compile(r"--[a-z0-9][a-z0-9-]*")
_KEY = re.compile(r"[a-z][a-z0-9_]*")


@dataclass(frozen=True)
class RunOption:
    """One setting of a run that a plugin adds (see docs/hooks.md, ``gage_register_options``).

    ``key`` is its name: the run config's key, config.json's key and the key of
    ``RunStart.options`` (and of what the core hands a writer or backend wrapper).
    ``flags``: its ``--long`` spellings on the command line (none: an environment variable only).
    ``env``: the environment variables that set it when neither the flag nor the run config does
    (checked before a run starts). ``lm_eval``: lm-evaluation-harness's spellings of the same flag.
    ``check(value, where)`` may refuse a value (raise GageError naming ``where``) or normalise it.
    ``resume_checked``: a resume refuses another value (it changes the results), and so does
    ``gage-eval merge`` between shards; otherwise (where or how a run ran, what it writes beside
    its results) a resume may change it and shards of one run may differ in it. ``stored``: kept in config.json (False: an environment variable a
    plugin reads itself, declared so the core checks it and lists it).
    """

    key: str
    flags: tuple[str, ...] = ()
    help: str = ""
    type: str = "text"
    choices: tuple[str, ...] | None = None
    default: Any = None
    env: tuple[str, ...] = ()
    minimum: int | None = None  # type whole: the smallest value
    metavar: str | None = None
    lm_eval: tuple[str, ...] = ()
    check: Callable[[Any, str], Any] | None = None
    resume_checked: bool = False
    stored: bool = True

    def __post_init__(self) -> None:
        if not _KEY.fullmatch(self.key):
            raise ValueError(f"option key {self.key!r}: lower-case letters, digits and _")
        if self.type not in TYPES:
            raise ValueError(f"option {self.key!r}: type {self.type!r} is not one of {', '.join(TYPES)}")
        for flag in self.flags:
            if not _FLAG.fullmatch(flag):
                raise ValueError(f"option {self.key!r}: flag {flag!r} is not a --long-name")
        if not self.flags and not self.env:
            raise ValueError(f"option {self.key!r}: give flags, env, or both")

    def spellings(self) -> tuple[str, ...]:
        """Every command-line spelling it takes: its flags, a switch's ``--no-`` forms, lm-eval's."""
        off = tuple("--no-" + f[2:] for f in self.flags) if self.type == "switch" else ()
        return (*self.flags, *off, *self.lm_eval)
