"""From command-line flags (and an optional run config) to a finished run and its printed results."""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import click

from gage_eval.cli.conventions import check_gen_kwargs, parse_gen_kwargs, parse_limit
from gage_eval.config.defaults import DEFAULT_MODEL, DEFAULT_OUTPUT_DIR, DEFAULT_SEED, check_environment, env_setting
from gage_eval.engine.loop import Engine
from gage_eval.engine.interrupts import sigterm_interrupts
from gage_eval.engine.summary import print_results
from gage_eval.config.options import RunOptions, load_options, new_run_id, parse_shard
from gage_eval.api.errors import EXIT_INTERRUPTED, GageError
from gage_eval.config.kv import parse_kv, parse_value
from gage_eval.api.secrets import REDACTED, redact
from gage_eval.runfolder.rundir import LOCK_FILE, RunLock, masked_keys, matches_stored, remove_unused_run_dir
from gage_eval.runfolder.runfiles import RUN_ID
from gage_eval.tasks.spec import parse_data_overrides

CONFIG_KEYS = {"models", "tasks", "limit", "batch_size", "seed", "output_dir", "fail_fast", "include_paths", "data",
               "max_error_rate", "allow_paths", "allow_urls", "allow_unsandboxed_code", "system_prompt", "gen_kwargs",
               "num_fewshot",
               "fewshot_as_multiturn", "apply_chat_template", "strip_reasoning", "writers", "cache", "eee_version",
               "report", "shard", "executor", "ray_address", "max_samples", "shuffle", "shuffle_seed"}
ROLE_KEYS = {"backend", "args"}
EEE_VERSIONS = ("0.2.0", "0.3.0")
TASK_OVERRIDE_KEYS = {"name", "limit", "max_samples", "shuffle", "shuffle_seed", "metrics", "generation", "data"}


def read_run_config(path: str) -> dict:
    """A run config file: models by role (dut, judge), tasks with overrides. Unknown keys are errors."""
    from gage_eval.api.jsonio import read_yaml  # strict: duplicate keys, alias bombs, encodings: GageErrors

    p = Path(path)
    data = read_yaml(p) or {}
    if not isinstance(data, dict):
        raise GageError(f"{p}: expected a mapping at the top level")
    unknown = set(data) - CONFIG_KEYS
    if unknown:
        raise GageError(f"{p}: unknown key(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(CONFIG_KEYS))}")
    for key, kind, what in (("models", dict, "a mapping of roles (dut, judge)"), ("tasks", list, "a list of tasks"),
                            ("include_paths", list, "a list of folders")):
        if data.get(key) is not None and not isinstance(data[key], kind):
            raise GageError(f"{p}: key '{key}': expected {what}, got {type(data[key]).__name__}")
    for role, spec in (data.get("models") or {}).items():
        if role not in ("dut", "judge"):
            raise GageError(f"{p}: key 'models.{role}': roles are 'dut' and 'judge'")
        if (not isinstance(spec, dict) or not isinstance(spec.get("backend"), str) or set(spec) - ROLE_KEYS
                or not isinstance(spec.get("args") or {}, dict)):
            raise GageError(f"{p}: key 'models.{role}': expected {{backend: NAME, args: {{...}}}}")
    if not all(isinstance(x, str) for x in data.get("include_paths") or []):
        raise GageError(f"{p}: key 'include_paths': expected a list of folders")
    for role, spec in (data.get("models") or {}).items():
        spec["args"] = _env_refs(spec.get("args") or {}, f"{p}: key 'models.{role}.args")
    _check_values(p, data)
    for i, task in enumerate(data.get("tasks") or []):
        if isinstance(task, dict):
            bad = set(task) - TASK_OVERRIDE_KEYS
            if "name" not in task or bad:
                raise GageError(f"{p}: key 'tasks.{i}': expected name plus any of "
                                f"{', '.join(sorted(TASK_OVERRIDE_KEYS - {'name'}))}"
                                + (f"; unknown: {', '.join(sorted(bad))}" if bad else ""))
            _check_override(p, f"tasks.{i}", task)
        elif not isinstance(task, str):
            raise GageError(f"{p}: key 'tasks.{i}': expected a task name or a mapping")
    return data


ENV_REF = re.compile(r"\$\{([A-Za-z_]\w*)(?::-([^}]*))?\}")


def _env_refs(value: Any, where: str) -> Any:
    """``value`` with each ``${VAR}`` / ``${VAR:-default}`` read from the environment now, so that a
    run config (``gage-eval convert`` writes one) names a secret rather than holding it."""
    if isinstance(value, dict):
        return {k: _env_refs(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [_env_refs(v, where) for v in value]
    if not isinstance(value, str) or "${" not in value:
        return value

    def one(m: re.Match) -> str:
        got = os.environ.get(m.group(1))
        if m.group(2) is not None:
            return got or m.group(2)
        if got is None:
            raise GageError(f"{where}': ${{{m.group(1)}}} names an environment variable that is not set")
        return got
    return ENV_REF.sub(one, value)


def _check_values(p: Path, data: dict) -> None:
    """The run config's scalar and list keys: their types and ranges (parsed values replace raw ones)."""
    for key in ("seed", "num_fewshot"):
        value = data.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise GageError(f"{p}: key '{key}': expected a whole number, got {value!r}")
    _check_sampling(p, "", data)
    if data.get("gen_kwargs") is not None:
        data["gen_kwargs"] = check_gen_kwargs(data["gen_kwargs"], f"{p}: key 'gen_kwargs'")
    if data.get("system_prompt") is not None and not (isinstance(data["system_prompt"], str)
                                                      and data["system_prompt"]):
        raise GageError(f"{p}: key 'system_prompt': expected a non-empty text, got {data['system_prompt']!r}")
    size = data.get("batch_size")
    if size is not None and size != "auto" and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
        raise GageError(f"{p}: key 'batch_size': expected a number or 'auto', got {size!r}")
    rate = data.get("max_error_rate")
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate <= 1):
        raise GageError(f"{p}: key 'max_error_rate': expected a number from 0 to 1, got {rate!r}")
    paths = data.get("allow_paths")
    if paths is not None and not (isinstance(paths, list) and all(isinstance(x, str) for x in paths)):
        raise GageError(f"{p}: key 'allow_paths': expected a list of folders")
    for key in ("allow_urls", "allow_unsandboxed_code", "fail_fast", "fewshot_as_multiturn",
                "apply_chat_template", "strip_reasoning", "report"):
        if data.get(key) is not None and not isinstance(data[key], bool):
            raise GageError(f"{p}: key '{key}': expected true or false, got {data[key]!r}")
    if data.get("cache") is not None and not (isinstance(data["cache"], str) and data["cache"]):
        raise GageError(f"{p}: key 'cache': expected a folder path")
    if data.get("data") is not None and not isinstance(data["data"], dict):
        raise GageError(f"{p}: key 'data': expected a mapping TASK: PATH")
    writers = data.get("writers")
    if writers is not None and not (isinstance(writers, list) and all(isinstance(w, str) and w for w in writers)):
        raise GageError(f"{p}: key 'writers': expected a list of writer names (NAME or NAME:key=value,...)")


def _check_sampling(p: Path, where: str, data: dict) -> None:
    """``limit`` (``max_samples``, spec 004's name for a whole number of rows, is the same
    setting: it becomes ``limit``), ``shuffle`` and ``shuffle_seed``, at the top or in a task."""
    if data.get("limit") is not None:
        data["limit"] = parse_limit(data["limit"], f"{p}: key '{where}limit'")
    if data.get("max_samples") is not None:
        n = _max_samples(data["max_samples"], f"{p}: key '{where}max_samples'")
        if data.get("limit") is not None and data["limit"] != n:
            raise GageError(f"{p}: keys '{where}limit' ({data['limit']}) and '{where}max_samples' ({n}) are one "
                            f"setting (max_samples is spec 004's name for limit); give one")
        data["limit"] = n
    data.pop("max_samples", None)
    if data.get("shuffle") is not None and not isinstance(data["shuffle"], bool):
        raise GageError(f"{p}: key '{where}shuffle': expected true or false, got {data['shuffle']!r}")
    seed = data.get("shuffle_seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise GageError(f"{p}: key '{where}shuffle_seed': expected a whole number, got {seed!r}")


def _max_samples(value: Any, where: str) -> int:
    """``--max-samples`` / ``max_samples``: a whole number of rows (1 or more) per task."""
    n = parse_limit(value, where)
    if not isinstance(n, int):
        shown = f"{where} {value}" if where.startswith("--") else f"{where}: {value}"
        raise GageError(f"{shown}: expected a whole number of rows, 1 or more (a fraction of the rows is --limit's)")
    return n


def _check_override(p: Path, where: str, task: dict) -> None:
    _check_sampling(p, f"{where}.", task)
    if task.get("metrics") is not None and not (isinstance(task["metrics"], list) and task["metrics"]):
        raise GageError(f"{p}: key '{where}.metrics': expected a non-empty list of metric names or "
                        f"{{name, as, args}} mappings")
    if task.get("generation") is not None and not isinstance(task["generation"], dict):
        raise GageError(f"{p}: key '{where}.generation': expected a mapping (max_new_tokens, temperature, ...)")
    if task.get("data") is not None and not isinstance(task["data"], str):
        raise GageError(f"{p}: key '{where}.data': expected a path")


def build_options(*, quiet, command, tasks=None, model=None, model_args=None, judge_model=None, judge_args=None,
                  batch_size=None, limit=None, output_dir=None, run_id=None, include_paths=(), data=(),
                  config_file=None, seed=None, fail_fast=False, max_error_rate=None, allow_paths=(),
                  allow_urls=False, allow_unsandboxed_code=False, device=None, system_prompt=None,
                  gen_kwargs=None, num_fewshot=None, fewshot_as_multiturn=None, apply_chat_template=None,
                  strip_reasoning=False, writers=(), cache=None, eee_version=None, report=None, shard=None,
                  executor=None, ray_address=None, max_samples=None, shuffle=None, shuffle_seed=None) -> RunOptions:
    """The run's settings: flags > run config > environment (:mod:`gage_eval.config.defaults`) > defaults."""
    check_environment()
    cfg = read_run_config(config_file) if config_file else {}
    limit = _cli_limit(limit, max_samples)
    if shuffle is None and shuffle_seed is not None:
        shuffle = True  # a seed given on the command line asks for shuffling
    task_names, overrides = _task_entries(cfg, tasks, limit, shuffle)
    shuffle, shuffle_seed = _shuffle(cfg, overrides, shuffle, shuffle_seed, seed)
    file_data = {**(cfg.get("data") or {}), **{k: v["data"] for k, v in overrides.items() if v.get("data")}}
    data_map = {**{k: v for k, v in file_data.items() if k in task_names}, **parse_data_overrides(data)}
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
        shuffle=shuffle,
        shuffle_seed=shuffle_seed,
        output_dir=output_dir or cfg.get("output_dir") or env_setting("output_dir") or DEFAULT_OUTPUT_DIR,
        run_id=run_id,
        seed=seed if seed is not None else cfg.get("seed", DEFAULT_SEED),
        include_paths=_include_paths(include_paths, cfg, config_file),
        data={k: _absolute(v) for k, v in data_map.items()},  # a resume may start in another folder
        task_overrides=overrides,
        fail_fast=fail_fast or bool(cfg.get("fail_fast")),
        max_error_rate=max_error_rate if max_error_rate is not None else float(cfg.get("max_error_rate") or 0.0),
        allow_paths=[_absolute(p) for p in allow_paths] + [_config_folder(config_file, p) for p in cfg.get("allow_paths") or []],
        allow_urls=allow_urls or bool(cfg.get("allow_urls")),
        allow_unsandboxed_code=allow_unsandboxed_code or bool(cfg.get("allow_unsandboxed_code")),
        system_prompt=system_prompt if system_prompt is not None else cfg.get("system_prompt"),
        gen_kwargs={**(cfg.get("gen_kwargs") or {}), **parse_gen_kwargs(gen_kwargs)},
        num_fewshot=num_fewshot if num_fewshot is not None else cfg.get("num_fewshot"),
        fewshot_as_multiturn=(fewshot_as_multiturn if fewshot_as_multiturn is not None
                              else cfg.get("fewshot_as_multiturn")),
        apply_chat_template=(apply_chat_template if apply_chat_template is not None
                             else cfg.get("apply_chat_template")),
        strip_reasoning=strip_reasoning or bool(cfg.get("strip_reasoning")),
        writers=_writers([*(cfg.get("writers") or []), *writers]),
        cache=_absolute(cache) if cache else (_config_folder(config_file, cfg["cache"]) if cfg.get("cache") else None),
        eee_version=_eee_version(eee_version or cfg.get("eee_version") or "0.2.0", config_file if not eee_version else None),
        report=report if report is not None else cfg.get("report", True) is not False,
        shard=parse_shard(shard) if shard is not None else parse_shard(cfg.get("shard"), f"{config_file}: key 'shard'"),
        executor=_executor(executor or cfg.get("executor") or "local", config_file if not executor else None),
        ray_address=ray_address or cfg.get("ray_address") or None,
        quiet=quiet,
        command=command,
        config_file=_absolute(config_file) if config_file else None,
    )


def _cli_limit(limit: Any, max_samples: Any) -> int | float | None:
    """``--limit`` and ``--max-samples`` (spec 004's name for a whole number of rows): one setting."""
    n = _max_samples(max_samples, "--max-samples") if max_samples is not None else None
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
    chosen = name or spec.get("backend") or (DEFAULT_MODEL if file_key else None)
    if file_key:
        _check_model_name(chosen, flag if name else file_key)
    option = "--model-args" if file_key else "--judge-args"
    kwargs = (parse_kv(args, option) if args is not None
              else dict(spec.get("args") or {}) if chosen == spec.get("backend") else {})
    return chosen, kwargs


def _eee_version(version: Any, config_file: str | None) -> str:
    if str(version) not in EEE_VERSIONS:
        where = f"{config_file}: key 'eee_version'" if config_file else "--eee-version"
        raise GageError(f"{where}: expected one of {', '.join(EEE_VERSIONS)}, got {version!r}")
    return str(version)


def _executor(name: Any, config_file: str | None) -> str:
    from gage_eval.engine.executor import EXECUTORS

    if name not in EXECUTORS:
        where = f"{config_file}: key 'executor'" if config_file else "--executor"
        raise GageError(f"{where}: expected one of {', '.join(EXECUTORS)}, not {name!r}")
    return str(name)


def _writers(specs: list[str]) -> list[str]:
    """``--writer`` values (and the file's ``writers``), each writer once; NAME:args checked here."""
    from gage_eval.runfolder.writers import parse_writer

    out: dict[str, str] = {}
    for spec in specs:
        out[parse_writer(spec)[0]] = spec  # a later spec of the same writer replaces the earlier one
    return list(out.values())


# lm-eval's model names that gage-eval spells otherwise
LM_EVAL_MODELS = {
    "hf": "transformers", "hf-auto": "transformers", "huggingface": "transformers", "hf-multimodal": "transformers",
    "vllm-vlm": "vllm", "openai-completions": "openai", "openai-chat-completions": "openai",
    "local-completions": "openai (with --model-args base_url=http://HOST/v1)",
    "local-chat-completions": "openai (with --model-args base_url=http://HOST/v1)",
    "gguf": "transformers (with --model-args pretrained=DIR,gguf_file=NAME.gguf)",
}
# backends that take no device= argument, and what to do instead
NO_DEVICE = {
    "dummy": "the dummy backend runs no model",
    "openai": "the server decides where its model runs",
    "vllm": "vLLM uses the GPUs it can see; choose them with CUDA_VISIBLE_DEVICES",
}


def _check_model_name(name: str, where: str) -> None:
    if name in LM_EVAL_MODELS:
        from gage_eval.plugins import load_plugins

        if name not in load_plugins()[1].backends:
            raise GageError(f"{where} {name}: that is lm-evaluation-harness's name; gage-eval's backend is "
                            f"{LM_EVAL_MODELS[name]} (see `gage-eval plugins`)")


def _with_device(model: str, args: dict, device: str, explicit: bool) -> dict:
    """``--device`` as the backend's ``device=`` argument."""
    if model in NO_DEVICE:
        raise GageError(f"--device {device}: backend {model!r} takes no device ({NO_DEVICE[model]})")
    if explicit and "device" in args and str(args["device"]) != device:
        raise GageError(f"--device {device} and --model-args device={args['device']} disagree; give one")
    return {**args, "device": device}


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


def run_from_cli(*, resume: str | None, quiet: bool, dry_run: int | None = None, drop_writers: Any = (),
                 **kwargs: Any) -> dict:
    """Run (or resume) and print the results; exits with the documented status (see the README).
    ``dry_run=N`` prints the settings and N requests a task instead (:mod:`gage_eval.cli.dryrun`);
    ``drop_writers``: writers the run (its config, or the stored run on resume) names, left out."""
    if resume:
        run_dir = Path(resume)
        if not (run_dir / "config.json").is_file():
            raise GageError(f"--resume {run_dir}: no config.json there; is it a gage-eval run folder?")
    if dry_run is not None:
        from gage_eval.cli.dryrun import dry_run as show

        options = (resumed_options(run_dir, kwargs, drop_writers) if resume
                   else _new_options(quiet, kwargs, drop_writers))
        status = show(options, rows=dry_run)
        if status:
            raise SystemExit(status)
        return {}
    if not resume:
        options = _new_options(quiet, kwargs, drop_writers)
        options.run_id = options.run_id or new_run_id()
        if not RUN_ID.fullmatch(options.run_id) or options.run_id in (".", ".."):
            raise GageError(f"--run-id {options.run_id!r}: a run id is a folder name (letters, digits, . _ -), "
                            f"not a path; use --output-dir to choose where run folders go")
        run_dir = Path(options.output_dir) / options.run_id
    fresh = not resume and not run_dir.exists()
    with RunLock(run_dir):
        if resume:
            options = resumed_options(run_dir, kwargs, drop_writers)
            options.quiet = quiet
        elif any(p.name != LOCK_FILE for p in run_dir.iterdir()):
            raise GageError(f"run folder {run_dir} already exists; use --resume {run_dir} to continue it")
        try:
            with sigterm_interrupts():
                summary = Engine(options, run_dir, resume=bool(resume)).run()
        except KeyboardInterrupt as exc:
            # click turns KeyboardInterrupt into a bare "Aborted", so say what to do here
            why = str(exc) or "interrupted by the user (Ctrl-C)"
            if fresh and not (run_dir / "config.json").exists():
                remove_unused_run_dir(run_dir)
                click.echo(f"\ngage-eval: {why} before the run began; nothing was written", err=True)
            else:
                click.echo(f"\ngage-eval: {why}; the rows finished so far and their summary are in {run_dir}; "
                           f"run only what is missing with: {resume_command(run_dir, options)}", err=True)
            raise SystemExit(getattr(exc, "exit_status", EXIT_INTERRUPTED)) from None
        except GageError:
            if fresh:  # refused before anything was written: leave no empty run folder behind
                remove_unused_run_dir(run_dir)
            raise
    print_results(summary, run_dir)
    status = summary["run"]["exit_status"]
    if status:
        raise SystemExit(status)
    return summary


def resume_command(run_dir: Path, options: RunOptions) -> str:
    """The command that continues ``run_dir``; arguments that held a secret (never stored) must be
    given again, so they are shown with a placeholder."""
    import shlex

    cmd = f"gage-eval --resume {shlex.quote(str(run_dir))}"
    for flag, args in (("--model-args", options.model_args), ("--judge-args", options.judge_args)):
        secret = [k for k in args or {} if k in masked_keys(redact(args or {}))]
        if secret:
            cmd += f" {flag} {','.join(f'{k}=<{k}>' if k in secret else f'{k}={v}' for k, v in args.items())}"
    return cmd


# flags a resume may repeat (they must then equal the stored settings), by RunOptions field
RESUME_CHECKED = ("tasks", "model", "model_args", "judge_model", "judge_args", "batch_size", "limit", "shuffle",
                  "shuffle_seed", "seed", "shard",
                  "include_paths", "data", "allow_paths", "allow_urls", "system_prompt", "gen_kwargs", "num_fewshot",
                  "fewshot_as_multiturn", "apply_chat_template", "strip_reasoning")
# how to treat errors, where responses are cached, and the outputs rebuilt on resume may change on resume
RESUME_FREE = ("fail_fast", "max_error_rate", "allow_unsandboxed_code", "cache", "eee_version", "report", "executor",
               "ray_address")
# writers named on resume join the stored ones: each writer is rebuilt whole from the kept records


def _new_options(quiet: bool, flags: dict, drop_writers: Any) -> RunOptions:
    options = build_options(quiet=quiet, **flags)
    options.writers = without_writers(options.writers, drop_writers)
    return options


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


def resumed_options(run_dir: Path, given: dict, drop_writers: Any = ()) -> RunOptions:
    """The stored settings, checked against any given again; secrets the store holds only as
    ``***`` are taken from the flags given now, and their absence stops the resume. Writers
    named now join the stored ones; ``drop_writers`` are left out (and from config.json)."""
    stored = load_options(run_dir)
    flags = {k: v for k, v in given.items()  # (0 is a value given; False is an unset switch, but not
             if k not in ("command", "output_dir", "run_id") and v is not None  # --no-apply-chat-template)
             and (v is not False or k in ("apply_chat_template", "fewshot_as_multiturn", "report", "shuffle"))
             and not (isinstance(v, (str, list, tuple)) and not v)}
    explicit = set(RESUME_CHECKED) if "config_file" in flags else set(flags)
    if "max_samples" in flags:
        explicit.add("limit")  # (spec 004's name for it)
    if "shuffle_seed" in flags:
        explicit.add("shuffle")
    diffs, supplied = [], {}
    if "device" in flags and "model_args" not in explicit:  # alone, --device is checked against device= alone
        device = flags.pop("device")
        if str(stored.model_args.get("device")) != device:
            diffs.append(f"  model_args.device: {stored.model_args.get('device')!r} -> {device!r}")
    fresh = build_options(quiet=True, command="", **{"tasks": ",".join(stored.tasks), **flags})
    placement = _placement(stored, fresh, "model_args" in explicit, "executor" in flags)
    for name in RESUME_CHECKED:
        if name not in explicit:
            continue
        before, after = getattr(stored, name), getattr(fresh, name)
        if name in ("model_args", "judge_args") and matches_stored(before, after):
            supplied[name] = after
        elif before != after or (name == "limit" and type(before) is not type(after)):  # 1 row, 1.0 all
            diffs.append(f"  {name}: {redact(before)!r} -> {redact(after)!r}")
    if diffs:
        raise GageError(f"--resume {run_dir}: these settings differ from the stored run's, so the results would "
                        "mix two runs:\n" + "\n".join(diffs) + "\nresume without them, or start a new run")
    for name in RESUME_FREE:
        if name in flags:
            setattr(stored, name, getattr(fresh, name))
    if fresh.writers:
        stored.writers = _writers([*stored.writers, *fresh.writers])
    stored.writers = without_writers(stored.writers, drop_writers)
    _check_writer_secrets(run_dir, stored.writers)
    for name, role in (("model_args", "--model-args"), ("judge_args", "--judge-args")):
        if name in supplied:
            setattr(stored, name, supplied[name])
            continue
        missing = masked_keys(getattr(stored, name))
        if missing:
            raise GageError(f"--resume {run_dir}: {role} {', '.join(missing)} held a secret, which is never "
                            f"stored; give the arguments again with the secret: gage-eval --resume {run_dir} "
                            f"{role} ..., or pass keys through an environment variable (api_key_env)")
    if placement is not None:
        stored.model_args = {**stored.model_args, **placement}
    return stored


def _placement(stored: RunOptions, fresh: RunOptions, args_given: bool, executor_given: bool) -> dict | None:
    """Where the model runs may change on resume, what it computes may not: the replica
    arguments (``replicas``, ``num_cpus``, ``num_gpus``) are taken out of both sides of the
    model_args comparison; returns the ones to run with now (None: the stored ones). Resuming
    with ``--executor local`` drops the stored ones."""
    from gage_eval.engine.executor import EXECUTOR_KEYS

    def strip(args: dict) -> dict:
        return {k: v for k, v in args.items() if k not in EXECUTOR_KEYS}

    kept = {k: v for k, v in stored.model_args.items() if k in EXECUTOR_KEYS}
    if not args_given and not (executor_given and fresh.executor == "local" and kept):
        return None
    stored.model_args = strip(stored.model_args)
    given = {k: v for k, v in fresh.model_args.items() if k in EXECUTOR_KEYS}
    fresh.model_args = strip(fresh.model_args)
    if args_given:
        return given
    return {}


def _check_writer_secrets(run_dir: Path, specs: list[str]) -> None:
    """A stored --writer argument that held a secret is stored masked: it must be given again."""
    from gage_eval.runfolder.writers import parse_writer

    for spec in specs:
        name, args = parse_writer(spec)
        masked = [k for k, v in args.items() if v == REDACTED]
        if masked:
            raise GageError(f"--resume {run_dir}: --writer {name} held a secret ({', '.join(masked)}), which is "
                            f"never stored; give it again: gage-eval --resume {run_dir} --writer "
                            f"{name}:{','.join(f'{k}=...' for k in masked)}")
