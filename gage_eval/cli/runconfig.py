"""The run config file (``--config run.yaml``): models by role, tasks with overrides and the run's
settings, each key checked (unknown keys, types, ranges) and ``${VAR}`` references read from the
environment."""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from gage_eval.api.errors import GageError, KeyedError
from gage_eval.cli.conventions import MAX_SEED, check_gen_kwargs, parse_limit

CONFIG_KEYS = {"models", "tasks", "limit", "batch_size", "seed", "output_dir", "fail_fast", "include_paths", "data",
               "fewshot_data", "max_error_rate", "allow_paths", "allow_urls", "system_prompt", "gen_kwargs", "num_fewshot", "repeats",
               "fewshot_as_multiturn", "apply_chat_template", "strip_reasoning", "writers", "shard", "executor", "max_samples", "shuffle", "shuffle_seed"}
ROLE_KEYS = {"backend", "args"}
TASK_OVERRIDE_KEYS = {"name", "limit", "max_samples", "shuffle", "shuffle_seed", "metrics", "generation", "data",
                      "fewshot_data"}


def read_run_config(path: str, plugin_keys: Any = ()) -> dict:
    """A run config file: models by role (dut, judge), tasks with overrides. Unknown keys are errors;
    ``plugin_keys``: the keys of the plugins' run options (their values are checked later)."""
    from gage_eval.api.yamlio import key_line, read_yaml  # strict: duplicate keys, alias bombs, encodings

    p = Path(path)
    data = read_yaml(p) or {}
    try:
        return _checked(p, data, plugin_keys)
    except KeyedError as exc:  # FILE:LINE: key 'a.b': ...
        raise GageError(f"{p}:{key_line(p, exc.key) or 1}: key '{exc.key}': {exc.problem}") from None


def _checked(p: Path, data: Any, plugin_keys: Any) -> dict:
    if not isinstance(data, dict):
        raise GageError(f"{p}: expected a mapping at the top level")
    known = CONFIG_KEYS | set(plugin_keys)
    unknown = set(data) - known
    if unknown:
        raise GageError(f"{p}: unknown key(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}")
    for key, kind, what in (("models", dict, "a mapping of roles (dut, judge)"), ("tasks", list, "a list of tasks"),
                            ("include_paths", list, "a list of folders")):
        if data.get(key) is not None and not isinstance(data[key], kind):
            raise KeyedError(p, key, f"expected {what}, got {type(data[key]).__name__}")
    for role, spec in (data.get("models") or {}).items():
        if role not in ("dut", "judge"):
            raise KeyedError(p, f"models.{role}", "roles are 'dut' and 'judge'")
        if (not isinstance(spec, dict) or not isinstance(spec.get("backend"), str) or set(spec) - ROLE_KEYS
                or not isinstance(spec.get("args") or {}, dict)):
            raise KeyedError(p, f"models.{role}", f"expected {{backend: NAME, args: {{...}}}}")
    if not all(isinstance(x, str) for x in data.get("include_paths") or []):
        raise KeyedError(p, "include_paths", "expected a list of folders")
    for role, spec in (data.get("models") or {}).items():
        spec["args"] = _env_refs(spec.get("args") or {}, p, f"models.{role}.args")
    _check_values(p, data)
    for i, task in enumerate(data.get("tasks") or []):
        if isinstance(task, dict):
            bad = set(task) - TASK_OVERRIDE_KEYS
            if "name" not in task or bad:
                raise KeyedError(p, f"tasks.{i}", f"expected name plus any of "
                                f"{', '.join(sorted(TASK_OVERRIDE_KEYS - {'name'}))}"
                                + (f"; unknown: {', '.join(sorted(bad))}" if bad else ""))
            _check_override(p, f"tasks.{i}", task)
        elif not isinstance(task, str):
            raise KeyedError(p, f"tasks.{i}", "expected a task name or a mapping")
    return data


ENV_REF = re.compile(r"\$\{([A-Za-z_]\w*)(?::-([^}]*))?\}")


def _env_refs(value: Any, p: Path, key: str) -> Any:
    """``value`` with each ``${VAR}`` / ``${VAR:-default}`` read from the environment now, so that a
    run config (``gage-eval convert`` writes one) names a secret rather than holding it."""
    if isinstance(value, dict):
        return {k: _env_refs(v, p, f"{key}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [_env_refs(v, p, key) for v in value]
    if not isinstance(value, str) or "${" not in value:
        return value

    def one(m: re.Match) -> str:
        got = os.environ.get(m.group(1))
        if m.group(2) is not None:
            return got or m.group(2)
        if got is None:
            raise KeyedError(p, key, f"${{{m.group(1)}}} names an environment variable that is not set")
        return got
    return ENV_REF.sub(one, value)


def _check_values(p: Path, data: dict) -> None:
    """The run config's scalar and list keys: their types and ranges (parsed values replace raw ones)."""
    for key, least in (("seed", 0), ("num_fewshot", 0), ("repeats", 1)):
        value = data.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least
                                  or (key == "seed" and value > MAX_SEED)):
            more = " (1 or more)" if least else f" from 0 to {MAX_SEED}" if key == "seed" else ""
            raise KeyedError(p, key, f"expected a whole number{more}, got {value!r}")
    _check_sampling(p, "", data)
    if data.get("gen_kwargs") is not None:
        data["gen_kwargs"] = _keyed(p, "gen_kwargs", check_gen_kwargs, data["gen_kwargs"])
    if data.get("system_prompt") is not None and not (isinstance(data["system_prompt"], str)
                                                      and data["system_prompt"]):
        raise KeyedError(p, "system_prompt", f"expected a non-empty text, got {data['system_prompt']!r}")
    size = data.get("batch_size")
    if size is not None and size != "auto" and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
        raise KeyedError(p, "batch_size", f"expected a number or 'auto', got {size!r}")
    rate = data.get("max_error_rate")
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate <= 1):
        raise KeyedError(p, "max_error_rate", f"expected a number from 0 to 1, got {rate!r}")
    paths = data.get("allow_paths")
    if paths is not None and not (isinstance(paths, list) and all(isinstance(x, str) for x in paths)):
        raise KeyedError(p, "allow_paths", "expected a list of folders")
    for key in ("allow_urls", "fail_fast", "fewshot_as_multiturn", "apply_chat_template", "strip_reasoning"):
        if data.get(key) is not None and not isinstance(data[key], bool):
            raise KeyedError(p, key, f"expected true or false, got {data[key]!r}")
    if data.get("data") is not None and not isinstance(data["data"], dict):
        raise KeyedError(p, "data", "expected a mapping TASK: PATH")
    shots = data.get("fewshot_data")
    if shots is not None and not (isinstance(shots, dict) and all(isinstance(v, str) and v for v in shots.values())):
        raise KeyedError(p, "fewshot_data", "expected a mapping TASK: PATH")
    writers = data.get("writers")
    if writers is not None and not (isinstance(writers, list) and all(isinstance(w, str) and w for w in writers)):
        raise KeyedError(p, "writers", "expected a list of writer names (NAME or NAME:key=value,...)")


def _check_sampling(p: Path, where: str, data: dict) -> None:
    """``limit`` (``max_samples``, spec 004's name for a whole number of rows, is the same
    setting: it becomes ``limit``), ``shuffle`` and ``shuffle_seed``, at the top or in a task."""
    if data.get("limit") is not None:
        data["limit"] = _keyed(p, f"{where}limit", parse_limit, data["limit"])
    if data.get("max_samples") is not None:
        n = _keyed(p, f"{where}max_samples", parse_max_samples, data["max_samples"])
        if data.get("limit") is not None and data["limit"] != n:
            raise GageError(f"{p}: keys '{where}limit' ({data['limit']}) and '{where}max_samples' ({n}) are one "
                            f"setting (max_samples is spec 004's name for limit); give one")
        data["limit"] = n
    data.pop("max_samples", None)
    if data.get("shuffle") is not None and not isinstance(data["shuffle"], bool):
        raise KeyedError(p, f"{where}shuffle", f"expected true or false, got {data['shuffle']!r}")
    seed = data.get("shuffle_seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise KeyedError(p, f"{where}shuffle_seed", f"expected a whole number, got {seed!r}")


def _keyed(p: Path, key: str, check: Any, value: Any) -> Any:
    """``check(value, where)``, a check shared with the command line, its error (after ``where``) keyed."""
    where = f"{p}: key '{key}'"
    try:
        return check(value, where)
    except GageError as exc:
        raise KeyedError(p, key, str(exc).removeprefix(f"{where}: ")) from None


def parse_max_samples(value: Any, where: str) -> int:
    """``--max-samples`` / ``max_samples``: a whole number of rows (1 or more) per task."""
    n = parse_limit(value, where)
    if not isinstance(n, int):
        shown = f"{where} {value}" if where.startswith("--") else f"{where}: {value}"
        raise GageError(f"{shown}: expected a whole number of rows, 1 or more (a fraction of the rows is --limit's)")
    return n


def _check_override(p: Path, where: str, task: dict) -> None:
    _check_sampling(p, f"{where}.", task)
    if task.get("metrics") is not None and not (isinstance(task["metrics"], list) and task["metrics"]):
        raise KeyedError(p, f"{where}.metrics", f"expected a non-empty list of metric names or "
                        f"{{name, as, args}} mappings")
    if task.get("generation") is not None and not isinstance(task["generation"], dict):
        raise KeyedError(p, f"{where}.generation", "expected a mapping (max_new_tokens, temperature, ...)")
    for key in ("data", "fewshot_data"):
        if task.get(key) is not None and not isinstance(task[key], str):
            raise KeyedError(p, f"{where}.{key}", "expected a path")
