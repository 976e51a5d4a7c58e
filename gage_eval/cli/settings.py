"""A new run's settings (:class:`RunOptions`): the command line's flags over the run config over the
environment over the defaults, the plugins' run options among them, and the backends' declared
defaults (the default backend, lm-eval's names, whether it takes ``--device``)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from gage_eval.api.errors import GageError
from gage_eval.cli.conventions import parse_gen_kwargs, parse_limit
from gage_eval.cli.runconfig import parse_max_samples, read_run_config
from gage_eval.config.defaults import DEFAULT_OUTPUT_DIR, DEFAULT_SEED, check_environment, env_setting
from gage_eval.config.kv import parse_kv, parse_value
from gage_eval.config.options import RunOptions, parse_shard
from gage_eval.config.plugin_options import option_values
from gage_eval.tasks.spec import parse_data_overrides


def build_options(*, quiet, command, tasks=None, model=None, model_args=None, judge_model=None, judge_args=None,
                  batch_size=None, limit=None, output_dir=None, run_id=None, include_paths=(), data=(), fewshot_data=(),
                  config_file=None, seed=None, fail_fast=False, max_error_rate=None, allow_paths=(),
                  allow_urls=False, device=None, system_prompt=None, gen_kwargs=None, num_fewshot=None, repeats=None,
                  fewshot_as_multiturn=None, apply_chat_template=None, strip_reasoning=False, writers=(), shard=None, executor=None, max_samples=None,
                  shuffle=None, shuffle_seed=None, **plugin_flags: Any) -> RunOptions:
    """The run's settings: the command line's flags over the run config file's keys over the
    environment variables (:mod:`gage_eval.config.defaults`) over the defaults (a default here: not given).
    ``plugin_flags``: the values of the plugins' run options given as flags (None: not given)."""
    check_environment()
    cfg, plugin_options = _config_and_plugin_options(config_file, plugin_flags)
    limit = _cli_limit(limit, max_samples)
    if shuffle is None and shuffle_seed is not None:
        shuffle = True  # a seed given on the command line asks for shuffling
    task_names, overrides = _task_entries(cfg, tasks, limit, shuffle)
    shuffle, shuffle_seed = _shuffle(cfg, overrides, shuffle, shuffle_seed, seed)
    data_map, flagged = _task_paths(cfg, overrides, task_names, data, "data", "--data")
    _check_paths({k: v for k, v in data_map.items() if k in task_names}, flagged, "--data", "data", config_file)
    if system_prompt is not None and not system_prompt:
        raise GageError("--system-prompt: empty; leave it out to keep the task's own prompts")
    models = cfg.get("models") or {}
    model_name, model_kwargs = _role(models.get("dut") or {}, model, model_args, "--model", "models.dut.backend")
    if device is not None:
        model_kwargs = _with_device(model_name, model_kwargs, device, model_args is not None)
    judge_name, judge_kwargs = _role(models.get("judge") or {}, judge_model, judge_args, "--judge-model", None)
    return RunOptions(
        tasks=task_names, model=model_name, model_args=model_kwargs, judge_model=judge_name, judge_args=judge_kwargs,
        batch_size=_batch_size(batch_size) if batch_size is not None else cfg.get("batch_size"),
        limit=limit if limit is not None else cfg["limit"] if cfg.get("limit") is not None else env_setting("limit"),
        shuffle=shuffle, shuffle_seed=shuffle_seed,
        output_dir=output_dir or cfg.get("output_dir") or env_setting("output_dir") or DEFAULT_OUTPUT_DIR,
        run_id=run_id,
        seed=seed if seed is not None else cfg.get("seed", DEFAULT_SEED),
        include_paths=_include_paths(include_paths, cfg, config_file),
        data={k: _absolute(v) for k, v in data_map.items()},  # a resume may start in another folder
        fewshot_data=_fewshot_data(cfg, overrides, task_names, fewshot_data, config_file, quiet, num_fewshot),
        task_overrides=overrides,
        fail_fast=fail_fast or bool(cfg.get("fail_fast")),
        max_error_rate=max_error_rate if max_error_rate is not None else float(cfg.get("max_error_rate") or 0.0),
        allow_paths=[_absolute(p) for p in allow_paths] + [_config_folder(config_file, p) for p in cfg.get("allow_paths") or []],
        allow_urls=allow_urls or bool(cfg.get("allow_urls")),
        system_prompt=system_prompt if system_prompt is not None else cfg.get("system_prompt"),
        gen_kwargs={**(cfg.get("gen_kwargs") or {}), **parse_gen_kwargs(gen_kwargs)},
        num_fewshot=num_fewshot if num_fewshot is not None else cfg.get("num_fewshot"),
        repeats=repeats if repeats is not None else cfg.get("repeats"),
        fewshot_as_multiturn=(fewshot_as_multiturn if fewshot_as_multiturn is not None
                              else cfg.get("fewshot_as_multiturn")),
        apply_chat_template=(apply_chat_template if apply_chat_template is not None
                             else cfg.get("apply_chat_template")),
        strip_reasoning=strip_reasoning or bool(cfg.get("strip_reasoning")),
        writers=writer_specs([*(cfg.get("writers") or []), *writers]),
        plugin_options=plugin_options,
        shard=parse_shard(shard) if shard is not None else parse_shard(cfg.get("shard"), f"{config_file}: key 'shard'"),
        executor=_executor(executor or cfg.get("executor") or "local", config_file if not executor else None),
        quiet=quiet,
        command=command,
        config_file=_absolute(config_file) if config_file else None,
    )


def _config_and_plugin_options(config_file: str | None, plugin_flags: dict) -> tuple[dict, dict]:
    """The run config (its keys include the plugins' options) and the plugins' options' values."""
    declared = declared_options()
    unknown = set(plugin_flags) - {o.key for o in declared if o.stored}
    if unknown:
        raise TypeError(f"build_options: no run option {', '.join(sorted(unknown))}")
    cfg = read_run_config(config_file, [o.key for o in declared if o.stored]) if config_file else {}
    return cfg, option_values(declared, plugin_flags, cfg, config_file)


def declared_options() -> list:
    """The loaded plugins' run options (:class:`gage_eval.api.options.RunOption`)."""
    from gage_eval.plugins import load_plugins

    return [reg.option for reg in load_plugins()[1].options.values()]


def _cli_limit(limit: Any, max_samples: Any) -> int | float | None:
    """``--limit`` and ``--max-samples`` (spec 004's name for a whole number of rows): one setting."""
    n = parse_max_samples(max_samples, "--max-samples") if max_samples is not None else None
    parsed = parse_limit(limit) if limit is not None else None
    if n is not None and parsed is not None and parsed != n:
        raise GageError(f"--limit {limit} and --max-samples {max_samples} are one setting; give one")
    return n if n is not None else parsed


def _shuffle(cfg: dict, overrides: dict, shuffle: bool | None, seed_flag: int | None, seed: int | None
             ) -> tuple[bool, int | None]:
    """Whether --limit takes a shuffled choice of rows, and its seed (None when nothing
    shuffles): the flags over the file over GAGE_EVAL_SHUFFLE(_SEED); a seed named in the file
    asks for shuffling too; the seed defaults to the run's --seed."""
    if shuffle is None:
        shuffle = cfg.get("shuffle")
        if shuffle is None and cfg.get("shuffle_seed") is not None:
            shuffle = True
    if shuffle is None:
        shuffle = bool(env_setting("shuffle"))
    if not shuffle and not any(o.get("shuffle") for o in overrides.values()):
        return False, None
    for value in (seed_flag, cfg.get("shuffle_seed"), env_setting("shuffle_seed"), seed, cfg.get("seed")):
        if value is not None:
            return bool(shuffle), value
    return bool(shuffle), DEFAULT_SEED


def _task_entries(cfg: dict, tasks: str | None, limit: Any, shuffle: bool | None = None
                  ) -> tuple[list[str], dict[str, dict]]:
    """The task names (--tasks over the file's, each once, in order) and the file's per-task overrides."""
    task_names: list[str] = []
    overrides: dict[str, dict] = {}
    for entry in cfg.get("tasks") or []:
        name = entry if isinstance(entry, str) else entry["name"]
        task_names.append(name)
        if isinstance(entry, dict):
            overrides[name] = {k: v for k, v in entry.items() if k != "name"}
    if tasks:
        task_names = [t.strip() for t in tasks.split(",") if t.strip()]
    task_names = list(dict.fromkeys(task_names))  # each task once, in the order first named
    for entry in overrides.values():
        if limit is not None:  # --limit beats every limit in the file
            entry.pop("limit", None)
        if shuffle is not None:  # and --shuffle / --no-shuffle / --shuffle-seed every shuffle setting
            entry.pop("shuffle", None)
            entry.pop("shuffle_seed", None)
        elif entry.get("shuffle_seed") is not None and entry.get("shuffle") is None:
            entry["shuffle"] = True  # a task's own seed asks for shuffling
    if not task_names:
        raise GageError("no tasks: pass --tasks NAME[,NAME] (see `gage-eval tasks`)")
    return task_names, {name: entry for name, entry in overrides.items() if entry and name in task_names}


def _role(spec: dict, name: str | None, args: str | None, flag: str, file_key: str | None) -> tuple[Any, dict]:
    """A role's backend and arguments: the flags over the run config's ``models.ROLE``. The file's
    args belong to the file's backend: a flag naming another backend starts clean."""
    chosen = name or spec.get("backend") or (_default_model() if file_key else None)
    if file_key:
        _check_model_name(chosen, flag if name else file_key)
    option = "--model-args" if file_key else "--judge-args"
    kwargs = (parse_kv(args, option) if args is not None
              else dict(spec.get("args") or {}) if chosen == spec.get("backend") else {})
    return chosen, kwargs


def _executor(name: Any, config_file: str | None) -> str:
    from gage_eval.engine.executor import executor_names
    from gage_eval.plugins import load_plugins

    known = executor_names(load_plugins()[1])
    if name not in known:
        where = f"{config_file}: key 'executor'" if config_file else "--executor"
        raise GageError(f"{where}: expected one of {', '.join(known)}, not {name!r}")
    return str(name)


def writer_specs(specs: list[str]) -> list[str]:
    """``--writer`` values (and the file's ``writers``), each writer once; NAME:args checked here."""
    from gage_eval.runfolder.writers import parse_writer

    out: dict[str, str] = {}
    for spec in specs:
        out[parse_writer(spec)[0]] = spec  # a later spec of the same writer replaces the earlier one
    return list(out.values())


def _backends() -> dict:
    from gage_eval.plugins import load_plugins

    return load_plugins()[1].backends


def _default_model() -> str:
    """The backend whose factory declares ``default_model`` (the first registered: builtins first)."""
    for name, reg in _backends().items():
        if getattr(reg.factory, "default_model", False):
            return name
    raise GageError("no --model given and no plugin declares a default backend; pass --model NAME "
                    "(see `gage-eval plugins`)")


def _check_model_name(name: str, where: str) -> None:
    """lm-evaluation-harness's name for a backend (declared by its factory's ``lm_eval_names``)."""
    backends = _backends()
    if name in backends:
        return
    for backend, reg in backends.items():
        how = (getattr(reg.factory, "lm_eval_names", None) or {}).get(name)
        if how is not None:
            raise GageError(f"{where} {name}: that is lm-evaluation-harness's name; gage-eval's backend is "
                            f"{backend}{f' ({how})' if how else ''} (see `gage-eval plugins`)")


def _with_device(model: str, args: dict, device: str, explicit: bool) -> dict:
    """``--device`` as the backend's ``device=`` argument (unless its factory declares ``no_device``)."""
    reg = _backends().get(model)
    why = getattr(reg.factory, "no_device", None) if reg is not None else None
    if why:
        raise GageError(f"--device {device}: backend {model!r} takes no device ({why})")
    if explicit and "device" in args and str(args["device"]) != device:
        raise GageError(f"--device {device} and --model-args device={args['device']} disagree; give one")
    return {**args, "device": device}


def _task_paths(cfg: dict, overrides: dict, task_names: list[str], given: Any, key: str, flag: str
                ) -> tuple[dict, dict]:
    """``FLAG TASK=PATH`` over the run config's ``KEY`` and its tasks' own (those of the run's
    tasks): every path by task, and those the flags gave."""
    in_file = {**(cfg.get(key) or {}), **{k: v[key] for k, v in overrides.items() if v.get(key)}}
    flagged = parse_data_overrides(given, flag)
    return {**{k: v for k, v in in_file.items() if k in task_names}, **flagged}, flagged


def _check_paths(paths: dict, flagged: dict, flag: str, key: str, config_file: str | None) -> None:
    """A data path that is not there is a usage error now, before any model loads or run folder is made
    (a task named only through its group is checked when its folder is read: the run resolves groups)."""
    for task, path in paths.items():
        if not os.path.exists(os.path.expanduser(str(path))):
            where = f"{flag} {task}={path}" if task in flagged else f"{config_file}: the {key} of task {task!r}"
            raise GageError(f"{where}: {path} does not exist (no such file or folder)")


def _fewshot_data(cfg: dict, overrides: dict, task_names: list[str], given: Any, config_file: str | None,
                  quiet: bool = True, shots: int | None = None) -> dict:
    """``--fewshot-data TASK=PATH`` over the run config's ``fewshot_data`` and its tasks' own, each
    path there now (a usage error naming the flag or the key, before any model loads), absolute.
    Unless ``quiet``, a warning when the run's --num-fewshot (``shots``, else the file's) draws nothing."""
    out, flagged = _task_paths(cfg, overrides, task_names, given, "fewshot_data", "--fewshot-data")
    _check_paths(out, flagged, "--fewshot-data", "fewshot_data", config_file)
    if out and not quiet and not (shots if shots is not None else cfg.get("num_fewshot")):
        click.echo("gage-eval: warning: --fewshot-data is read only with --num-fewshot K (K > 0); "
                   "without it no examples are drawn", err=True)
    return {k: _absolute(v) for k, v in out.items()}


def _batch_size(text: str) -> int | str:

    value = parse_value(text)
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    if str(text).startswith("auto:"):
        raise GageError(f"--batch-size {text}: gage-eval's auto sizes each batch by its token count, so there "
                        f"is nothing to re-tune; give auto or a number")
    raise GageError(f"--batch-size {text}: expected a positive whole number or auto")


def _absolute(path: str) -> str:
    return os.path.abspath(os.path.expanduser(str(path)))


def _include_paths(given: Any, cfg: dict, config_file: str | None) -> list[str]:
    """--include-path folders (from the current folder), else the run config's (from its folder)."""
    if given:
        return [_absolute(p) for p in given]
    return [_config_relative(config_file, p) for p in cfg.get("include_paths") or []]


def _config_relative(config_file: str | None, path: str) -> str:
    """A folder named in the run config's ``include_paths``: relative to the config file's folder
    (so a config and its task folders move together); a path that is a folder only from the
    current one is read from there, as before."""
    p = Path(path).expanduser()
    if p.is_absolute() or not config_file:
        return _absolute(p)
    beside = Path(config_file).parent / p
    return _absolute(beside if beside.is_dir() or not p.is_dir() else p)


def _config_folder(config_file: str | None, path: str) -> str:
    """A folder named in the run config's ``allow_paths``, relative to the config file's folder."""
    p = Path(path).expanduser()
    p = p if p.is_absolute() or not config_file else Path(config_file).parent / p
    if not p.is_dir():
        raise GageError(f"{config_file}: key 'allow_paths': {path!r} is not a folder ({p})")
    return _absolute(p)


def without_writers(specs: list[str], names: Any) -> list[str]:
    """``--drop-writer NAME`` (repeatable): the writer specs without those named; a name the
    run does not have is said (a typo keeps the writer), not refused (dropped before)."""
    from gage_eval.runfolder.writers import parse_writer

    present = [parse_writer(spec)[0] for spec in specs]
    for name in names or ():
        if name not in present:  # (a resume given the same command again: nothing left to drop)
            have = f"its writers: {', '.join(present)}" if present else "it names none"
            click.echo(f"gage-eval: warning: --drop-writer {name}: the run names no writer {name!r} ({have})",
                       err=True)
    return [spec for spec, name in zip(specs, present) if name not in set(names or ())]
