"""The ``gage-eval`` command line. Sub-commands arrive through the ``gage_register_commands`` hook.
The console script enters through ``gage_eval.cli``, which handles Ctrl-C before this is imported."""
from __future__ import annotations

import os
import shlex
import sys

import click

from gage_eval import __version__
from gage_eval.api.errors import EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_OUTPUT, GageError
from gage_eval.cli.conventions import MAX_SEED

# The core's own commands, each imported only when it runs (or its full help is asked for): name ->
# (module:attribute, the first paragraph of its help, which `gage-eval --help` lists without importing
# it; tests/core/test_cli_lazy.py checks that these say what the commands say).
CORE_COMMANDS = {
    "tasks": ("gage_eval.cli.commands:tasks_command",
              "List the tasks that can run, with the plugin (or path) each comes from."),
    "plugins": ("gage_eval.cli.commands:plugins_command",
                "List the loaded plugins, their versions and what each registered."),
    "validate": ("gage_eval.cli.validate:validate_command",
                 "Check every row of FILE (jsonl, json or a task.yaml) against a schema (``summary``: a run "
                 "folder's summary.json, one JSON object)."),
    "rescore": ("gage_eval.engine.rescore:rescore_command",
                "Compute the metrics of RUN_DIR again from its stored model outputs (and its judge, with "
                "--judge-model), without loading the model, into a new run folder NEW_DIR."),
    "merge": ("gage_eval.engine.merge:merge_command",
              "Join the shards of one run (each run with --shard I/N) into one run folder, its summary computed "
              "again from every record: the same as the unsharded run's."),
}


def option_spellings(params) -> tuple[dict[str, str], dict[str, str]]:
    """Each spelling of the options in ``params``: its kind (``flag``, ``value``,
    ``optional:DEFAULT``) and the option's main ``--long`` name."""
    kinds: dict[str, str] = {}
    long_names: dict[str, str] = {}
    for p in params:
        if not isinstance(p, click.Option):
            continue
        kind = ("flag" if p.is_flag or p.count else
                f"optional:{p.flag_value}" if getattr(p, "_flag_needs_value", False) else "value")
        main = next((o for o in p.opts if o.startswith("--")), p.opts[0])
        for name in [*p.opts, *p.secondary_opts]:
            kinds[name] = kind
            long_names[name] = name if name in p.secondary_opts else main
    return kinds, long_names


def click_option(option) -> click.Option:
    """A plugin's :class:`gage_eval.api.options.RunOption` as a click option (no default: a value
    not given is None, so the run config, the environment and the declared default come next)."""
    kinds = {"whole": click.IntRange(min=option.minimum), "number": click.FLOAT}
    kind = click.Choice(option.choices) if option.choices is not None else kinds.get(option.type)
    env = f" Env: {' (or '.join(option.env)}{')' * (len(option.env) - 1)}." if option.env else ""
    if option.type == "switch":
        decls = [f"{flag}/--no-{flag[2:]}" for flag in option.flags]
        return click.Option([*decls, option.key], default=None, help=option.help + env)
    return click.Option([*option.flags, option.key], type=kind, default=None, metavar=option.metavar,
                        help=option.help + env)


class PluginGroup(click.Group):
    """A group that loads plugins (and their commands) only when it is asked for commands."""

    _loaded = False

    def _load(self) -> None:
        if not self._loaded:
            self._loaded = True
            from gage_eval.plugins import load_plugins

            pm, _ = load_plugins()
            pm.hook.gage_register_commands(cli=self)

    def parse_args(self, ctx, args):
        if ctx.parent is None:
            self._plugin_options()
        if ctx.parent is None and not ctx.resilient_parsing:
            from gage_eval.cli.conventions import translate

            kinds, long_names = option_spellings(self.get_params(ctx))
            args, notes = translate(args, kinds, long_names, self.list_commands(ctx), self._lm_eval)
            if not ({"-q", "--quiet"} & set(args)):
                for note in notes:
                    click.echo(f"gage-eval: note: {note}", err=True)
        return super().parse_args(ctx, args)

    _added: tuple = ()  # the plugins' run options (gage_register_options) now among the params
    _lm_eval: dict[str, str] = {}

    def _plugin_options(self) -> None:
        """The loaded plugins' run options as options of the run (again when the plugins changed).
        Checked here against the core's flags; against the core's settings without a flag when a
        command is invoked (:meth:`invoke`), so --help does not import the settings."""
        from gage_eval.plugins import load_plugins

        declared = tuple(reg for reg in load_plugins()[1].options.values() if reg.option.flags)
        if declared == self._added:
            return
        self.params = [p for p in self.params if p.name not in {reg.option.key for reg in self._added}]
        own = {name for p in self.params for name in (*p.opts, *p.secondary_opts, p.name)}
        at = next(i for i, p in enumerate(self.params) if p.name == "seed")
        _refuse_clashes(declared, own)
        self.params[at:at] = [click_option(reg.option) for reg in declared]
        self._added = declared
        self._lm_eval = {name: reg.option.flags[0] for reg in declared for name in reg.option.lm_eval}

    def list_commands(self, ctx):
        self._load()
        return sorted({*super().list_commands(ctx), *CORE_COMMANDS})

    def get_command(self, ctx, name):
        self._load()
        if name not in self.commands and name in CORE_COMMANDS:
            self.add_command(core_command(name))
        return super().get_command(ctx, name)

    def format_commands(self, ctx, formatter):
        # as click's, but a core command not yet imported is listed from CORE_COMMANDS
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.commands.get(name)
            if cmd is None and name in CORE_COMMANDS:
                rows.append((name, None))
            elif cmd is not None and not cmd.hidden:
                rows.append((name, cmd))
        if rows:
            limit = formatter.width - 6 - max(len(name) for name, _ in rows)
            with formatter.section("Commands"):
                formatter.write_dl([(name, cmd.get_short_help_str(limit) if cmd is not None
                                     else click.utils.make_default_short_help(core_help(name), limit))
                                    for name, cmd in rows])

    def invoke(self, ctx):
        # Ctrl-C raises while a command runs (a stopped run writes its summary); before that (parsing,
        # --help) the entry point's handler (gage_eval.cli) ends the process with the same line
        from dataclasses import fields

        from gage_eval.api.runfolder import use_reread
        from gage_eval.config.options import RunOptions
        from gage_eval.engine.interrupts import ctrl_c_interrupts

        _refuse_clashes(self._added, {f.name for f in fields(RunOptions)} - {"plugin_options"})
        use_reread(_reread_samples)  # a plugin's command (report) may read a stored run's rows again
        with ctrl_c_interrupts():
            return super().invoke(ctx)

    def main(self, *args, **kwargs):
        debug = "--debug" in sys.argv
        try:
            return super().main(*args, standalone_mode=False, **kwargs)
        except GageError as exc:
            _traceback(debug)
            click.echo(f"gage-eval: error: {_said(exc)}", err=True)
            sys.exit(exc.exit_code)
        except click.exceptions.Abort as exc:
            if isinstance(exc.__cause__, KeyboardInterrupt):  # click's word for a Ctrl-C while it parses
                _interrupted(exc.__cause__)
            click.echo("gage-eval: aborted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        except click.ClickException as exc:
            exc.show()
            sys.exit(exc.exit_code)
        except click.exceptions.Exit as exc:
            sys.exit(exc.exit_code)
        except KeyboardInterrupt as exc:
            _interrupted(exc)
        except OSError as exc:
            _traceback(debug)
            where = f"{exc.filename}: " if exc.filename else ""
            click.echo(f"gage-eval: error: {_said(where)}{_said(exc.strerror or exc)}", err=True)
            sys.exit(EXIT_OUTPUT)
        except Exception as exc:  # a bug (ours or a plugin's): one line, the traceback only with --debug
            from gage_eval.engine.interrupts import interrupt_of

            if interrupt_of(exc):  # a library turned Ctrl-C or SIGTERM into an error of its own
                _interrupted(interrupt_of(exc))
            _traceback(debug)
            click.echo(f"gage-eval: internal error: {type(exc).__name__}: {_said(exc)[:500]} "
                       f"(run again with --debug for the traceback, and please report it)", err=True)
            sys.exit(EXIT_INTERNAL)
        except BaseException as exc:
            from gage_eval.engine.interrupts import interrupt_of

            if not interrupt_of(exc):  # SystemExit among them
                raise
            _interrupted(interrupt_of(exc))


def _said(text) -> str:
    """A message as the console may show it: a URL's user-info, a secret query value or a
    ``header_NAME=`` value masked (the user's own arguments are echoed in many messages)."""
    from gage_eval.api.secrets import strip_credentials

    return strip_credentials(str(text))


def _refuse_clashes(declared, own: set[str]) -> None:
    for reg in declared:
        clash = sorted({reg.option.key, *reg.option.spellings()} & own)
        if clash:
            raise GageError(f"plugin {reg.plugin!r} declares run option {clash[0]!r}, which is gage-eval's "
                            f"own; disable it with GAGE_EVAL_DISABLE_PLUGINS={reg.plugin}")


def _reread_samples(run_dir, task):
    from gage_eval.engine.reread import reread_samples

    return reread_samples(run_dir, task)


def _traceback(debug: bool) -> None:
    # --debug adds the traceback; the line and the exit status stay those of a run without it
    if debug:
        import traceback

        traceback.print_exc()


def _interrupted(interrupt: KeyboardInterrupt) -> None:
    click.echo(f"gage-eval: {str(interrupt) or 'interrupted'}", err=True)
    sys.exit(getattr(interrupt, "exit_status", EXIT_INTERRUPTED))


def _no_nan(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    """click's FloatRange lets nan through (every comparison with it is false)."""
    if value is not None and value != value:
        raise click.BadParameter("nan is not a share of rows; give a number from 0 to 1", ctx, param)
    return value


@click.group(cls=PluginGroup, invoke_without_command=True,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--tasks", "-t", multiple=True,
              help="Tasks, groups or glob patterns ('mmlu_*'), comma- or space-separated, or repeated "
                   "(see `gage-eval tasks`).")
@click.option("--model", "-m", default=None,
              help="Backend name (default: the one a plugin declares the default; `gage-eval plugins` lists them).")
@click.option("--model-args", "-a", default=None, help="Backend arguments: k=v,k2=v2 (e.g. pretrained=DIR,dtype=float32).")
@click.option("--device", default=None,
              help="cpu, cuda, cuda:N, auto: sets the device= model argument (backends that run the model here).")
@click.option("--judge-model", default=None, help="Backend for the judge role (default: the --model backend).")
@click.option("--judge-args", default=None, help="Judge backend arguments: k=v,k2=v2.")
@click.option("--batch-size", "-b", default=None, help="Batch size: a number or 'auto'.")
@click.option("--limit", "-l", default=None,
              help="Rows per task: a count N, or a fraction in (0, 1] of each task's rows (rounded up); "
                   "the first ones, or with --shuffle a seeded random choice. Env: GAGE_EVAL_MAX_SAMPLES.")
@click.option("--max-samples", default=None, metavar="N",
              help="Rows per task, a whole number: spec 004's name for --limit N (the same setting).")
@click.option("--shuffle/--no-shuffle", "shuffle", default=None,
              help="--limit takes a seeded random choice of each task's rows instead of the first ones (the "
                   "same on any machine; the rows still run in the data's order). Env: GAGE_EVAL_SHUFFLE.")
@click.option("--shuffle-seed", type=click.IntRange(min=0), default=None, metavar="N",
              help="The seed of --shuffle's choice (implies --shuffle; default: --seed). "
                   "Env: GAGE_EVAL_SHUFFLE_SEED.")
@click.option("--output-dir", "-o", default=None,
              help="Where run folders go (default: runs). Env: GAGE_EVAL_OUTPUT_DIR (or GAGE_EVAL_SAVE_DIR).")
@click.option("--run-id", default=None, help="Name of the run folder (default: time stamp + random suffix).")
@click.option("--include-path", "include_paths", multiple=True, help="A folder of task folders (or one task folder); repeatable.")
@click.option("--data", "data", multiple=True, help="TASK=PATH: run TASK on a local jsonl/json/csv/parquet file or folder.")
@click.option("--config", "config_file", type=click.Path(dir_okay=False), default=None,
              help="Run config YAML (models by role, tasks with overrides); flags override it.")
@click.option("--system-prompt", default=None, help="A system message put before every prompt.")
@click.option("--gen-kwargs", default=None,
              help="Generation settings over the task's: k=v,... of max_new_tokens, temperature, top_p, top_k, "
                   "seed, do_sample, stop (stop=TEXT or stop=[\"A\",\"B\"]).")
@click.option("--num-fewshot", type=click.IntRange(min=0), default=None,
              help="Few-shot examples per prompt, drawn (seeded) from the task's few-shot source.")
@click.option("--repeats", type=click.IntRange(min=1), default=None,
              help="Answers drawn per row, each with its own seed (default: the task's repeats, else 1); "
                   "adds pass@k and maj@k.")
@click.option("--fewshot-data", "fewshot_data", multiple=True, metavar="TASK=PATH",
              help="Draw TASK's --num-fewshot examples from a local file or folder of solved rows (read like "
                   "--data) instead of the task's few-shot source; repeatable.")
@click.option("--fewshot-as-multiturn/--no-fewshot-as-multiturn", default=None,
              help="Few-shot examples as chat turns, or all in one user turn (default: chat turns whenever "
                   "the chat template is on, as lm-eval does).")
@click.option("--apply-chat-template/--no-apply-chat-template", default=None,
              help="Format prompts with the model's chat template, log-likelihood tasks too (default: the task's "
                   "request.chat).")
@click.option("--strip-reasoning", is_flag=True,
              help="Score the answer after the last </think>; the raw text stays in the record.")
@click.option("--dry-run", type=click.IntRange(min=1), is_flag=False, flag_value=3, default=None, metavar="[N]",
              help="Print the resolved settings and the first N (default 3) requests of each task, then stop: "
                   "no model is loaded and no run folder is made.")
@click.option("--writer", "writers", multiple=True, metavar="NAME[:k=v,...]",
              help="Also write the results through a plugin's writer (repeatable; `gage-eval plugins` lists "
                   "them). Named on --resume, it is rebuilt from every record of the run.")
@click.option("--drop-writer", "drop_writers", multiple=True, metavar="NAME",
              help="Leave out a writer the run names (the run config's, or on --resume the stored run's): for a "
                   "plugin writer that fails on every resume. Repeatable; kept out of later resumes.")
@click.option("--shard", default=None, metavar="I/N",
              help="Run only shard I of N (0-based): the rows whose sample id hashes there. Each shard is an "
                   "ordinary run; `gage-eval merge` joins them.")
@click.option("--executor", default=None, metavar="NAME",
              help="Where the model runs: in this process (local, the default) or through an executor a plugin "
                   "registers (`gage-eval plugins` lists them; the builtin ray runs replicas on a Ray cluster: "
                   "--model-args replicas=N,num_cpus=C,num_gpus=G each).")
@click.option("--seed", type=click.IntRange(0, MAX_SEED), default=None,
              help="Seed for sampling and for deterministic fallbacks.")
@click.option("--resume", type=click.Path(file_okay=False), default=None,
              help="Continue an interrupted run in this run folder (its settings are reused).")
@click.option("--fail-fast", is_flag=True, help="Stop at the first row that errors (it is still written).")
@click.option("--max-error-rate", type=click.FloatRange(0.0, 1.0), default=None, callback=_no_nan,
              help="Exit 0 while at most this share of a task's rows errored (default 0: any error exits 1).")
@click.option("--allow-path", "allow_paths", multiple=True, type=click.Path(exists=True, file_okay=False),
              help="A folder that paths in data rows (images, attachments) may point into, besides the "
                   "data file's own folder; repeatable.")
@click.option("--allow-urls", is_flag=True, help="Let the harness fetch http(s) URLs found in data rows.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar and no per-row error lines.")
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.version_option(__version__, prog_name="gage-eval")
@click.pass_context
def cli(ctx, tasks, debug, **flags):
    """Evaluate language and vision-language models on benchmark task folders.

    \b
    Examples:
      gage-eval --tasks piqa --limit 20            # the default model on 20 real PIQA rows
      gage-eval --tasks piqa --model NAME --model-args KEY=VALUE,...   # a backend `gage-eval plugins` lists
      gage-eval --tasks piqa --data piqa=validation.jsonl              # your own copy of the rows
      gage-eval --tasks piqa --dry-run             # the prompts, without loading the model
      gage-eval tasks | plugins | validate FILE --schema sample

    lm-evaluation-harness spellings (--model_args, --num_fewshot, --output_path, ...) are
    accepted where they mean the same; the others are answered with what to use instead.
    """
    if ctx.invoked_subcommand is not None:  # run options before a command were dropped silently
        given = [p.opts[0] for p in ctx.command.params if p.name not in ("quiet", "debug")
                 and ctx.get_parameter_source(p.name) == click.core.ParameterSource.COMMANDLINE]
        if given:
            raise GageError(f"{given[0]} is an option of a run, which `gage-eval {ctx.invoked_subcommand}` "
                            f"does not read; put that command's options after its name "
                            f"(gage-eval {ctx.invoked_subcommand} --help)")
        return
    from gage_eval.cli.run import run_from_cli

    if not tasks and not flags["resume"] and not flags["config_file"]:
        if any(v is not None and v is not False and v != () for v in flags.values()):
            raise GageError("no task to run: name them with --tasks (see `gage-eval tasks`), "
                            "or continue a run with --resume RUN_DIR")
        click.echo(ctx.get_help())  # a bare `gage-eval`
        return
    # each option under its run_from_cli / build_options name; repeatable ones as lists
    run_from_cli(tasks=",".join(tasks) or None,
                 command=" ".join(["gage-eval"] + [shlex.quote(a) for a in sys.argv[1:]]),
                 **{k: list(v) if isinstance(v, tuple) else v for k, v in flags.items()})


def core_command(name: str) -> click.Command:
    """The core command ``name``, imported now."""
    import importlib

    module, _, attr = CORE_COMMANDS[name][0].partition(":")
    return getattr(importlib.import_module(module), attr)


def core_help(name: str) -> str:
    """What ``gage-eval --help`` says of a core command it has not imported."""
    return CORE_COMMANDS[name][1]


def run() -> None:
    """Run the command line on ``sys.argv``; exits with the documented status."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    cli.main(prog_name="gage-eval")
