"""lm-evaluation-harness's command-line spellings, and the values gage-eval reads the way it does
(``--limit``, ``--gen-kwargs``). Standard library only: the CLI imports this for ``--help``.

:func:`translate` rewrites the top-level arguments before click parses them: lm-eval's spelling
of an option with the same meaning becomes ours, a spelling whose meaning gage-eval does not
share is refused with what to do instead, and lm-eval's space-separated lists
(``--tasks a b``, ``--model_args k=v k2=v2``) become ours.
"""
from __future__ import annotations

import ast
import math
import re
from typing import Any, Iterable, Mapping

from gage_eval.api.errors import GageError

# lm-eval's spelling -> ours, where the meaning is the same
ALIASES = {
    "--model_args": "--model-args",
    "--batch_size": "--batch-size",
    "--output_path": "--output-dir",
    "--num_fewshot": "--num-fewshot", "-f": "--num-fewshot",
    "--gen_kwargs": "--gen-kwargs",
    "--apply_chat_template": "--apply-chat-template",
    "--system_instruction": "--system-prompt",
    "--fewshot_as_multiturn": "--fewshot-as-multiturn",
    "--include_path": "--include-path",
    "--write_out": "--dry-run", "-w": "--dry-run",
    "-L": "--limit", "-M": "--model", "-C": "--config",
}
# accepted and dropped: gage-eval always does what they ask for
NO_OPS = {
    "--log_samples": "samples are always written (RUN_DIR/samples/TASK.jsonl)",
    "-s": "samples are always written (RUN_DIR/samples/TASK.jsonl)",
    "--confirm_run_unsafe_code": "model-written code (humaneval, code_exec) always runs in a sandbox; where none "
                                 "can run, the code task fails and --allow-unsandboxed-code runs it on this machine",
}
_LOGGERS = ("gage-eval has no built-in experiment logger; results are in RUN_DIR/summary.json, and a plugin "
            "can send them on from the gage_run_end hook")
_CACHE = ("use --cache DIR: model responses are kept in one SQLite file in DIR and reused by later runs "
          "(lm-eval's value is a file prefix, so it is not taken as is); an interrupted run continues with "
          "--resume RUN_DIR")
REFUSED = {
    "--max_batch_size": "no such option; --batch-size auto picks batch sizes itself, --batch-size N fixes one",
    "--use_cache": _CACHE, "-c": _CACHE,
    "--cache_requests": "no request cache: prompts are built as the rows stream; --cache DIR reuses model answers",
    "--check_integrity": "no such option; the tests run with pytest, and `gage-eval validate FILE` checks data files",
    "--show_config": "the resolved settings are in RUN_DIR/config.json and summary.json; --dry-run prints them "
                     "without running",
    "--wandb_args": _LOGGERS, "--wandb_config_args": _LOGGERS, "--hf_hub_log_args": _LOGGERS,
    "--trackio_args": _LOGGERS,
    "--predict_only": "metrics are always computed; the predictions are in RUN_DIR/samples/TASK.jsonl",
    "-x": "metrics are always computed; the predictions are in RUN_DIR/samples/TASK.jsonl",
    "--trust_remote_code": "give it to the backend: --model-args trust_remote_code=true",
    "--metadata": "task settings live in task.yaml or a run config (--config), model settings in --model-args",
    "--samples": "no such option; run chosen rows with --data TASK=FILE (a file holding just those rows) or --limit",
    "-E": "no such option; run chosen rows with --data TASK=FILE (a file holding just those rows) or --limit",
    "--verbosity": "no log levels; --quiet prints less, --debug shows tracebacks",
    "-v": "no log levels; --quiet prints less, --debug shows tracebacks",
}
TRUE_WORDS, FALSE_WORDS = ("true", "1", "yes"), ("false", "0", "no")
MAX_SEED = 2**32 - 1  # numpy's largest seed (lm-eval seeds random, numpy and torch with one value)
GREEDY_PAIRS = ("--model-args", "--judge-args", "--gen-kwargs")  # `k=v k2=v2` as lm-eval takes them


class _Cursor:
    """The arguments being translated, read one at a time."""

    def __init__(self, args: list[str]):
        self.args, self.i = args, 0

    def take(self) -> str | None:
        if self.i < len(self.args):
            self.i += 1
            return self.args[self.i - 1]
        return None

    def peek(self) -> str | None:
        return self.args[self.i] if self.i < len(self.args) else None


def translate(args: Iterable[str], kinds: Mapping[str, str], long_names: Mapping[str, str],
              commands: Iterable[str] = (), aliases: Mapping[str, str] | None = None) -> tuple[list[str], list[str]]:
    """The top-level arguments in gage-eval's spelling, and notes to show (options accepted as no-ops).

    ``kinds`` maps every spelling of the group's options to ``flag``, ``value`` or
    ``optional:DEFAULT`` (a value that may be left out); ``long_names`` maps each spelling to the option's main
    ``--long`` name; ``aliases``: lm-eval's spellings of the plugins' run options (they win over
    :data:`REFUSED`). The first argument that is not an option or an option's value (a
    sub-command) ends the top-level part; it and what follows pass through unchanged.
    """
    cur, commands = _Cursor(list(args)), set(commands)
    out: list[str] = []
    notes: list[str] = []
    while cur.peek() is not None:
        tok = cur.take()
        if tok == "--" or not tok.startswith("-") or tok == "-":
            if tok == "run" and "run" not in commands:
                raise GageError("no `run` sub-command: gage-eval takes the run's options directly "
                                "(gage-eval --tasks NAME --model NAME ...)")
            if tok == "ls" and "ls" not in commands:
                raise GageError("no `ls` sub-command: `gage-eval tasks` lists the tasks and groups")
            out.append(tok)
            out.extend(cur.args[cur.i:])
            break
        out.extend(_option(tok, cur, kinds, long_names, commands, notes, aliases or {}))
    return out, notes


def _option(tok: str, cur: _Cursor, kinds: Mapping[str, str], long_names: Mapping[str, str],
            commands: set[str], notes: list[str], aliases: Mapping[str, str]) -> list[str]:
    """One option (with its value, taken from ``cur`` when separate) in gage-eval's spelling."""
    name, eq, value = tok.partition("=") if tok.startswith("--") else (tok, "", "")
    if name in aliases:
        tok = aliases[name] + eq + value
        name = aliases[name]
    if name in NO_OPS:
        notes.append(f"{name}: {NO_OPS[name]}")
        return []
    if name in REFUSED:
        raise GageError(f"{name} (lm-evaluation-harness): {REFUSED[name]}")
    lm_name = name
    name = ALIASES.get(name, name)
    if name in ("--apply-chat-template", "--fewshot-as-multiturn") and lm_name != name:
        return _switch(lm_name, name, value if eq else None, cur.take, cur.peek, commands)
    if not tok.startswith("--") and name == tok and len(tok) > 2:
        return _short_bundle(tok, kinds, long_names, cur.take, cur.peek)
    kind = kinds.get(name)
    if kind is None:
        dashed = name.replace("_", "-")
        if tok.startswith("--") and dashed != name and dashed in kinds:
            raise GageError(f"no such option: {name}; gage-eval spells it {dashed}")
        return [tok]  # click names the unknown option
    if kind == "flag":
        return [name + (eq + value)]
    if kind.startswith("optional:"):  # written out whole, so click never takes the next argument
        if not eq and (cur.peek() or "").isdigit():
            value, eq = cur.take(), "="
        return [f"{name}={value if eq else kind.partition(':')[2]}"]
    if not eq:
        got = cur.take()
        if got is None:
            return [name]  # click says the value is missing
        value = got
    return _with_value(long_names.get(name, name), lm_name, value, cur.take, cur.peek)


def _with_value(name: str, given: str, value: str, take, peek) -> list[str]:
    if name == "--tasks":
        values = [value]
        while peek() is not None and not peek().startswith("-"):
            values.append(take())
        for v in set(values) & {"list", "list_groups", "list_subtasks", "list_tags"}:  # lm-eval's listings
            raise GageError(f"--tasks {v} (lm-evaluation-harness): `gage-eval tasks` lists the tasks and groups "
                            f"(`gage-eval tasks --include-path DIR`: yours too)")
        return [x for v in values for x in ("--tasks", v)]
    if name in GREEDY_PAIRS:
        parts = [value]
        while peek() is not None and not peek().startswith("-") and "=" in peek():
            parts.append(take())
        return [name, ",".join(p.strip(",") for p in parts if p.strip(","))]
    if name == "--seed" and "," in value:
        raise GageError(f"--seed {value}: gage-eval takes one seed for the run, not lm-eval's list of one "
                        f"seed per library")
    if given == "--output_path" and value.lower().endswith(".json"):
        raise GageError(f"--output_path {value}: gage-eval writes a run folder (summary.json, samples/, ...); "
                        f"give --output-dir DIR, and the run folder is DIR/RUN_ID")
    return [name, value]


def _switch(given: str, name: str, value: str | None, take, peek, commands) -> list[str]:
    """lm-eval's ``--apply_chat_template [NAME]`` and ``--fewshot_as_multiturn [BOOL]``."""
    if value is None:
        nxt = peek()
        if nxt is not None and not nxt.startswith("-") and nxt not in commands:
            if nxt.lower() in TRUE_WORDS + FALSE_WORDS or name == "--apply-chat-template":
                value = take()
    if value is None or value.lower() in TRUE_WORDS:
        return [name]
    if value.lower() in FALSE_WORDS:
        return ["--no-" + name[2:]]
    if name == "--apply-chat-template":
        raise GageError(f"{given} {value}: named chat templates are not supported; --apply-chat-template uses "
                        f"the model's own chat template (its tokenizer's)")
    raise GageError(f"{given} {value}: expected true or false")


def _short_bundle(tok: str, kinds: Mapping[str, str], long_names: Mapping[str, str], take, peek) -> list[str]:
    """``-ql 5``, ``-l5``, ``-tpiqa``: flags, then at most one option with its value."""
    out = []
    for j, ch in enumerate(tok[1:], start=1):
        kind = kinds.get("-" + ch)
        if kind == "flag":
            continue
        if kind is None:
            return [tok]  # click names the unknown option
        rest = tok[j + 1:]
        value = rest if rest else take()
        if value is None:
            return [tok]
        head = tok[:j]
        out = [head] if head != "-" else []
        return out + _with_value(long_names.get("-" + ch, "-" + ch), "-" + ch, value, take, peek)
    return [tok]


# -- --limit -----------------------------------------------------------------------------------

LIMIT_RULE = "a positive whole number of rows, or a fraction in (0, 1] of each task's rows (1.0 = all)"


def parse_limit(value: Any, where: str = "--limit") -> int | float:
    """A row count (``int`` >= 1) or a fraction (``float`` in (0, 1], rounded up per task); ``1``
    is one row and ``1.0`` every row. Anything else is a GageError naming ``where``."""
    if isinstance(value, bool):
        raise GageError(f"{where}: expected {LIMIT_RULE}, got {value!r}")
    text = str(value).strip()
    shown = f"{where} {text}" if where.startswith("--") else f"{where}: {text}"
    if isinstance(value, int) or re.fullmatch(r"[+-]?\d+", text):
        n = int(text)
        if n == 0:
            raise GageError(f"{shown}: a limit of 0 rows runs nothing; expected {LIMIT_RULE}")
        if n < 0:
            raise GageError(f"{shown}: expected {LIMIT_RULE}"
                            + ("; to run every row leave the limit out (lm-eval's -1)" if n == -1 else ""))
        return n
    try:
        x = float(text)
    except ValueError:
        raise GageError(f"{shown}: not a number; expected {LIMIT_RULE}") from None
    if not math.isfinite(x):
        raise GageError(f"{shown}: expected {LIMIT_RULE}")
    if not 0 < x <= 1:
        hint = (f"; for {int(x)} rows write {int(x)}" if 1 < x < 1e15 and x == int(x) else "")
        raise GageError(f"{shown}: expected {LIMIT_RULE}{hint}")
    return x


# -- --gen-kwargs ------------------------------------------------------------------------------

GEN_KWARGS = ("max_new_tokens", "temperature", "top_p", "top_k", "stop", "seed", "do_sample")
GEN_ALIASES = {"max_gen_toks": "max_new_tokens", "until": "stop"}  # lm-eval's names


def split_pairs(text: str) -> list[str]:
    """``text`` split at the commas that are outside brackets and quotes."""
    parts, depth, quote, start = [], 0, None, 0
    for k, ch in enumerate(text):
        if quote:
            if ch == "\\":
                continue
            if ch == quote and text[k - 1] != "\\":
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth = max(0, depth - 1)
        elif ch == "," and depth == 0:
            parts.append(text[start:k])
            start = k + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def parse_gen_kwargs(text: str | None, option: str = "--gen-kwargs") -> dict:
    """``k=v,...`` generation settings, checked (:func:`check_gen_kwargs`). ``stop`` takes one
    string (``stop=\\n\\n``: ``\\n`` and ``\\t`` mean newline and tab) or several as a list
    (``stop=["\\n\\n","Question:"]``, JSON or Python quoting)."""
    out: dict[str, Any] = {}
    for part in split_pairs(text or ""):
        key, sep, raw = part.partition("=")
        key, raw = key.strip(), raw.strip()
        if not sep or not key:
            raise GageError(f"{option}: expected key=value pairs separated by commas, got {part!r}")
        key = GEN_ALIASES.get(key, key)
        if key not in GEN_KWARGS:
            raise GageError(f"{option}: unknown key {key!r}; known: {', '.join(GEN_KWARGS)}")
        out[key] = _stop_value(raw, option) if key == "stop" else _scalar(raw)
    return check_gen_kwargs(out, option)


def _stop_value(raw: str, option: str) -> Any:
    if raw[:1] in "[\"'" and raw:
        try:
            return ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            raise GageError(f"{option}: stop={raw}: not a quoted string or a list of quoted strings "
                            f"(e.g. stop=[\"\\n\\n\",\"Question:\"])") from None
    return raw.replace("\\\\", "\x00").replace("\\n", "\n").replace("\\t", "\t").replace("\x00", "\\")


def _scalar(text: str) -> Any:
    """A --gen-kwargs value as --model-args reads one (kv.parse_value), except that none/null stay
    text: a generation setting has no "unset" value to give."""
    from gage_eval.config.kv import parse_value  # not at the top: --help needs none of it

    return text if text.lower() in ("none", "null") else parse_value(text)


def check_gen_kwargs(value: Any, where: str) -> dict:
    """Generation settings checked and normalized (numbers to int or float, ``stop`` to a list
    of strings), from the command line or a run config; ``where`` prefixes every error."""
    if not isinstance(value, Mapping):
        raise GageError(f"{where}: expected a mapping of generation settings ({', '.join(GEN_KWARGS)})")
    out: dict[str, Any] = {}
    for key, v in value.items():
        key = GEN_ALIASES.get(str(key), str(key))
        if key not in GEN_KWARGS:
            raise GageError(f"{where}: unknown key {key!r}; known: {', '.join(GEN_KWARGS)}")
        number = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        whole = number and float(v) == int(v)
        if key in ("max_new_tokens", "top_k", "seed"):
            low = 1 if key == "max_new_tokens" else 0
            if not whole or int(v) < low or (key == "seed" and int(v) > MAX_SEED):
                raise GageError(f"{where}: {key}={v!r}: expected a whole number >= {low}"
                                + (f" and <= {MAX_SEED}" if key == "seed" else ""))
            out[key] = int(v)
        elif key == "temperature":
            if not number or v < 0:
                raise GageError(f"{where}: temperature={v!r}: expected a number >= 0")
            out[key] = float(v)
        elif key == "top_p":
            if not number or not 0 < v <= 1:
                raise GageError(f"{where}: top_p={v!r}: expected a number in (0, 1]")
            out[key] = float(v)
        elif key == "do_sample":
            if not isinstance(v, bool):
                raise GageError(f"{where}: do_sample={v!r}: expected true or false")
            out[key] = v
        else:  # stop
            stops = [v] if isinstance(v, str) else v
            if not isinstance(stops, (list, tuple)) or not all(isinstance(s, str) and s for s in stops):
                raise GageError(f"{where}: stop={v!r}: expected a non-empty string or a list of them")
            out[key] = list(stops)
    return out
