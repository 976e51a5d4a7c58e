"""``--resume RUN_DIR``: the stored run's settings, checked against any flags given again (what
changes the results may not change; where it runs and how errors count may), and the command that
continues a stopped run."""
from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from gage_eval.api.errors import GageError
from gage_eval.api.secrets import REDACTED, redact
from gage_eval.cli.settings import build_options, declared_options, without_writers, writer_specs
from gage_eval.config.options import RunOptions, load_options
from gage_eval.runfolder.rundir import masked_keys, matches_stored


def resume_command(run_dir: Path, options: RunOptions) -> str:
    """The command that continues ``run_dir``; arguments that held a secret (never stored) must be
    given again, so they are shown with a placeholder."""
    cmd = f"gage-eval --resume {shlex.quote(str(run_dir))}"
    for flag, args in (("--model-args", options.model_args), ("--judge-args", options.judge_args)):
        secret = [k for k in args or {} if k in masked_keys(redact(args or {}))]
        if secret:
            cmd += f" {flag} {','.join(f'{k}=<{k}>' if k in secret else f'{k}={v}' for k, v in args.items())}"
    return cmd


# flags a resume may repeat (they must then equal the stored settings), by RunOptions field
RESUME_CHECKED = ("tasks", "model", "model_args", "judge_model", "judge_args", "batch_size", "limit", "shuffle",
                  "shuffle_seed", "seed", "shard",
                  "include_paths", "data", "fewshot_data", "allow_paths", "allow_urls", "system_prompt", "gen_kwargs", "num_fewshot",
                  "repeats", "fewshot_as_multiturn", "apply_chat_template", "strip_reasoning")
# how to treat errors and where the model runs may change on resume (the plugins' options say for themselves)
RESUME_FREE = ("fail_fast", "max_error_rate", "executor")
# writers named on resume join the stored ones: each writer is rebuilt whole from the kept records


def resumed_options(run_dir: Path, given: dict, drop_writers: Any = ()) -> RunOptions:
    """The stored settings, checked against any given again; secrets the store holds only as
    ``***`` are taken from the flags given now, and their absence stops the resume. Writers
    named now join the stored ones; ``drop_writers`` are left out (and from config.json)."""
    declared = [o for o in declared_options() if o.stored]
    stored = load_options(run_dir, plugin_keys=[o.key for o in declared])
    switches = {"apply_chat_template", "fewshot_as_multiturn", "shuffle",
                *(o.key for o in declared if o.type == "switch")}
    flags = {k: v for k, v in given.items()  # (0 is a value given; False is an unset switch, but not
             if k not in ("command", "output_dir", "run_id") and v is not None  # --no-apply-chat-template)
             and (v is not False or k in switches)
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
    diffs += _plugin_options(declared, stored, fresh, flags)
    if diffs:
        raise GageError(f"--resume {run_dir}: these settings differ from the stored run's, so the results would "
                        "mix two runs:\n" + "\n".join(diffs) + "\nresume without them, or start a new run")
    for name in RESUME_FREE:
        if name in flags:
            setattr(stored, name, getattr(fresh, name))
    if fresh.writers:
        stored.writers = writer_specs([*stored.writers, *fresh.writers])
    stored.writers = without_writers(stored.writers, drop_writers)
    _check_writer_secrets(run_dir, stored.writers)
    for name, role in (("model_args", "--model-args"), ("judge_args", "--judge-args")):
        if name in supplied:
            setattr(stored, name, supplied[name])
            continue
        missing = masked_keys(getattr(stored, name))
        if missing:
            raise GageError(f"--resume {run_dir}: {role} {', '.join(missing)} held a secret, which is never "
                            f"stored; give the arguments again with the secret: gage-eval --resume "
                            f"{shlex.quote(str(run_dir))} {role} ..., or pass keys through an environment variable (api_key_env)")
    if placement is not None:
        stored.model_args = {**stored.model_args, **placement}
    return stored


def _plugin_options(declared: list, stored: RunOptions, fresh: RunOptions, flags: dict) -> list[str]:
    """The plugins' options on resume: each kept, or changed when given now, unless it changes the
    results (``resume_checked``): then another value is a difference, returned as a line."""
    diffs = []
    for option in declared:
        before, after = stored.plugin_options.get(option.key), fresh.plugin_options[option.key]
        if option.key not in stored.plugin_options:  # (a run stored before the plugin declared it)
            stored.plugin_options[option.key] = after
        elif option.resume_checked and (option.key in flags or "config_file" in flags) and before != after:
            diffs.append(f"  {option.key}: {redact(before)!r} -> {redact(after)!r}")
        elif option.key in flags:
            stored.plugin_options[option.key] = after
    return diffs


def _placement(stored: RunOptions, fresh: RunOptions, args_given: bool, executor_given: bool) -> dict | None:
    """Where the model runs may change on resume, what it computes may not: the replica
    arguments (``replicas``, ``num_cpus``, ``num_gpus``) are taken out of both sides of the
    model_args comparison; returns the ones to run with now (None: the stored ones). Resuming
    with ``--executor local`` drops the stored ones."""
    from gage_eval.engine.executor import placement_args
    from gage_eval.plugins import load_plugins

    taken = placement_args(load_plugins()[1])

    def strip(args: dict) -> dict:
        return {k: v for k, v in args.items() if k not in taken}

    kept = {k: v for k, v in stored.model_args.items() if k in taken}
    if not args_given and not (executor_given and fresh.executor == "local" and kept):
        return None
    stored.model_args = strip(stored.model_args)
    given = {k: v for k, v in fresh.model_args.items() if k in taken}
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
                            f"never stored; give it again: gage-eval --resume {shlex.quote(str(run_dir))} --writer "
                            f"{name}:{','.join(f'{k}=...' for k in masked)}")
