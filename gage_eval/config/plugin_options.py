"""The values of the run options plugins declare (``gage_register_options``): the flag over the
run config's key over the environment over the declared default, each checked where it came from."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Mapping

from gage_eval.api.errors import GageError
from gage_eval.api.options import RunOption
from gage_eval.config.defaults import env_value, type_parser


def option_values(declared: Iterable[RunOption], given: Mapping[str, Any], cfg: Mapping[str, Any],
                  config_file: str | None, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Each stored option's value by key. ``given``: the flags' values by key (None: not given);
    ``cfg``: the run config (its folder is where a relative ``folder`` value starts). Every
    declared environment variable is checked, so a bad one stops the run before anything runs."""
    out: dict[str, Any] = {}
    for option in declared:
        from_env = env_value(option.env, *type_parser(option.type, option.minimum), environ) if option.env else None
        if not option.stored:
            continue
        if given.get(option.key) is not None:
            where = option.flags[0]
            value = _absolute(given[option.key]) if option.type == "folder" else given[option.key]
        elif cfg.get(option.key) is not None:
            where = f"{config_file}: key '{option.key}'"
            value = config_value(option, cfg[option.key], where, config_file)
        elif from_env is not None:
            where, value = option.env[0], from_env
        else:
            out[option.key] = option.default
            continue
        out[option.key] = checked(option, value, where)
    return out


def config_value(option: RunOption, value: Any, where: str, config_file: str | None) -> Any:
    """A run config's value of ``option``, of its type (a folder: from the config file's folder)."""
    kind = option.type
    if option.choices is not None:
        return value if isinstance(value, (bool, dict, list)) else str(value)  # 0.3 and "0.3": checked() says
    if kind == "switch" and not isinstance(value, bool):
        raise GageError(f"{where}: expected true or false, got {value!r}")
    if kind in ("whole", "number") and (isinstance(value, bool) or not isinstance(value, (int, float))
                                        or (kind == "whole" and not isinstance(value, int))):
        raise GageError(f"{where}: expected {type_parser(kind, option.minimum)[1]}, got {value!r}")
    if kind in ("text", "folder") and not (isinstance(value, str) and value):
        raise GageError(f"{where}: expected {'a folder path' if kind == 'folder' else 'a text'}, got {value!r}")
    if kind == "folder":
        p = Path(value).expanduser()
        return _absolute(p if p.is_absolute() or not config_file else Path(config_file).parent / p)
    return value


def checked(option: RunOption, value: Any, where: str) -> Any:
    """``value`` held to the option's choices, minimum and own check."""
    if option.choices is not None and value not in option.choices:
        raise GageError(f"{where}: expected one of {', '.join(option.choices)}, got {value!r}")
    if option.type == "whole" and option.minimum is not None and value < option.minimum:
        raise GageError(f"{where}: expected {type_parser('whole', option.minimum)[1]}, got {value!r}")
    return option.check(value, where) if option.check is not None else value


def _absolute(path: Any) -> str:
    return os.path.abspath(os.path.expanduser(str(path)))
