"""``gage-eval convert PIPELINE.yaml -o DIR``: a seed-system PipelineConfig (spec 004 section 10)
as gage-eval task folders plus a run config.

What it writes: ``DIR/tasks/<name>/task.yaml`` (and ``prompt.jinja`` / ``judge.jinja`` when the
pipeline has prompts), one folder per ``tasks[]`` entry (or per dataset when there are none),
``DIR/run.yaml`` (the DUT and judge models, the tasks with their limits and generation
settings) and ``DIR/CONVERSION.txt`` (what was not converted, one ``FILE:LINE: key: why`` a
line, and what behaves differently). ``gage-eval --config DIR/run.yaml`` runs it.

A PipelineConfig that is not one (bad YAML, wrong types, a required key missing, a reference
to an id that is not declared) is refused with one ``FILE:LINE: key: message`` line (a
GageError: exit 2) before anything is written; the output folder appears whole or not at all.
docs/migration.md explains each mapping.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gage_eval.api import GageError, OutputError, secrets

from gage_plugins_builtin.convert.yamlpos import Lines, load

TOP_KEYS = {"api_version", "kind", "metadata", "datasets", "backends", "role_adapters", "prompts", "metrics",
            "builtin", "custom", "tasks"}
NAME = re.compile(r"[^A-Za-z0-9_.-]+")
CALLABLE = re.compile(r"^[A-Za-z_][\w.]*[:.][A-Za-z_]\w*$")
ENV_REF = re.compile(r"\$\{([A-Za-z_]\w*)(?::-([^}]*))?\}")

# -- metrics ------------------------------------------------------------------------------------
# The seed's metric ids and what gage-eval computes for them. ``spec`` ids registered in
# gage-eval under the same name are written unchanged; the others map to gage-eval's metric.
METRIC_MAP = {
    # seed id: (gage-eval name when the seed id is not registered, argument renames)
    "mmmu_accuracy": ("mmmu_acc", {"prediction_field": "field"}),
    "docvqa_anls": ("anls", {"prediction_field": "field", "threshold": "threshold"}),
    "multi_choice_accuracy": ("mmmu_acc", {"prediction_field": "field"}),
    "judge_threshold": ("judge_score", {"judge_field": "field", "score_field": "field", "threshold": "pass_threshold"}),
    "exact_match": ("exact_match", {"prediction_field": "prediction", "case_sensitive": "!ignore_case",
                                    "strip_whitespace": "strip"}),
    "contains": ("contains", {"prediction_field": "prediction", "case_sensitive": "!ignore_case"}),
    "numeric_match": ("numeric_match", {"prediction_field": "prediction", "tolerance": "tolerance"}),
    "regex_match": ("regex_match", {"target_field": "target", "prediction_field": "target", "pattern": "pattern",
                                    "ignore_case": "ignore_case"}),
    "text_length": ("text_length", {"target_field": "target"}),
    "latency": ("latency", {"target_field": "target"}),
}
# spec 004 section 8 ids that gage-eval registers under the same name with the spec's parameters
SPEC_IDS = {"mmmu_accuracy", "docvqa_anls", "multi_choice_accuracy", "judge_threshold"}
# Field-mapping parameters whose value is where the reference lives: read by the preprocessor,
# so the gage-eval metric finds it at its canonical place (sample.references / options / label).
REFERENCE_PARAMS = {"label_field": "reference", "answers_field": "references", "option_map_field": "options"}
# seed canonical field paths -> gage-eval's
FIELD_PATHS = {"model_output.answer": "model_output.text", "model_output.text": "model_output.text",
               "model_output.latency_ms": "model_output.latency_ms", "judge_output.score": "judge_output.score"}

# -- backends -----------------------------------------------------------------------------------
BACKEND_TYPES = {"openai_http": "openai", "openai": "openai", "litellm": "openai", "sglang": "openai",
                 "tgi": "openai", "vllm": "vllm", "vllm_native": "vllm", "vllm_async": "vllm",
                 "vlm_transformers": "transformers", "hf": "transformers", "hf_inference": "transformers",
                 "transformers": "transformers", "dummy": "dummy"}
BACKEND_ARGS = {
    "openai": {"base_url": "base_url", "model": "model", "timeout": "timeout", "async_max_concurrency": "concurrency",
               "concurrency": "concurrency", "max_retries": "max_retries", "api_key_env": "api_key_env"},
    "vllm": {"model_path": "pretrained", "model_name_or_path": "pretrained", "model": "pretrained",
             "tensor_parallel_size": "tensor_parallel_size", "gpu_memory_utilization": "gpu_memory_utilization",
             "max_model_len": "max_model_len", "dtype": "dtype", "trust_remote_code": "trust_remote_code",
             "max_num_seqs": "max_num_seqs", "enforce_eager": "enforce_eager", "tokenizer": "tokenizer"},
    "transformers": {"model_name_or_path": "pretrained", "model_path": "pretrained", "pretrained": "pretrained",
                     "dtype": "dtype", "torch_dtype": "dtype", "device": "device",
                     "trust_remote_code": "trust_remote_code",
                     "batch_size": "batch_size", "revision": "revision"},
    "dummy": {},
}
# Qwen2.5-VL image resizing (spec 004 sections 5.6 and 10.3): model arguments of the vision backends
for _args in (BACKEND_ARGS["openai"], BACKEND_ARGS["vllm"], BACKEND_ARGS["transformers"]):
    _args.update({"min_pixels": "min_pixels", "max_pixels": "max_pixels", "image_factor": "image_factor"})
GENERATION_KEYS = {"max_new_tokens": "max_new_tokens", "max_tokens": "max_new_tokens", "temperature": "temperature",
                   "top_p": "top_p", "top_k": "top_k", "stop": "stop", "seed": "seed", "do_sample": "do_sample"}
INFORMATIVE = {"capabilities"}  # read for the task (chat, vision), nothing to carry over

# -- datasets -----------------------------------------------------------------------------------
IMAGE_CALLABLES = ("embed_local_message_images", "embed_local_image_as_data_url")
MULTI_CHOICE_PRE = ("multi_choice", "piqa", "mmlu", "gpqa")


@dataclass
class Report:
    """What the conversion could not carry over (``skipped``) and what differs (``notes``)."""
    path: Path
    lines: Lines
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    secrets: list[str] = field(default_factory=list)  # literal secrets left out, named in run.yaml

    def line(self, where: tuple) -> int:
        while where and where not in self.lines:
            where = where[:-1]
        return self.lines.get(where, 1)

    def loc(self, where: tuple) -> str:
        return f"{self.path}:{self.line(where)}: {_dotted(where)}" if where else f"{self.path}:1: (top level)"

    def skip(self, where: tuple, why: str) -> None:
        self.skipped.append(f"{self.loc(where)}: {why}")

    def secret(self, where: tuple, what: str, why: str) -> None:
        """A literal secret left out (never written): named in CONVERSION.txt, on stderr and in run.yaml."""
        self.skip(where, why)
        self.secrets.append(f"{self.loc(where)}: {what}")

    def note(self, where: tuple, what: str) -> None:
        self.notes.append(f"{self.loc(where)}: {what}")

    def refuse(self, where: tuple, why: str) -> GageError:
        return GageError(f"{self.loc(where)}: {why}")


def _dotted(where: tuple) -> str:
    out = ""
    for part in where:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


# -- reading and checking the PipelineConfig ----------------------------------------------------

def _expect(rep: Report, value: Any, kind: type | tuple, where: tuple, what: str) -> Any:
    if not isinstance(value, kind) or (kind is str and not value.strip()):
        got = "nothing" if value is None else type(value).__name__
        raise rep.refuse(where, f"expected {what}, got {got}")
    return value


def _items(rep: Report, data: dict, key: str, id_key: str, required: tuple[str, ...]) -> dict[str, tuple[int, dict]]:
    """A list of mappings keyed by their id, each checked for its required keys and a unique id."""
    value = data.get(key)
    if value is None:
        return {}
    _expect(rep, value, list, (key,), "a list")
    out: dict[str, tuple[int, dict]] = {}
    for i, item in enumerate(value):
        _expect(rep, item, dict, (key, i), "a mapping")
        for req in (id_key, *required):
            if req not in item:
                raise rep.refuse((key, i), f"required key '{req}' missing")
        ident = _expect(rep, item[id_key], str, (key, i, id_key), "a name")
        if ident in out:
            raise rep.refuse((key, i, id_key), f"duplicate {id_key} {ident!r} (first at line "
                                                f"{rep.line((key, out[ident][0]))})")
        out[ident] = (i, item)
    return out


@dataclass
class Pipeline:
    data: dict
    datasets: dict
    backends: dict
    adapters: dict
    prompts: dict
    metrics: list
    tasks: dict
    default_steps: tuple | None  # where the default flow's steps are: ("custom"|"builtin", "steps")


def read_pipeline(path: Path) -> tuple[Pipeline, Report]:
    data, lines = load(path)
    rep = Report(path, lines)
    if not isinstance(data, dict):
        raise GageError(f"{path}:1: expected a PipelineConfig mapping (datasets, role_adapters, ...), got "
                        f"{'an empty file' if data is None else type(data).__name__}")
    kind = data.get("kind")
    if kind is not None and kind != "PipelineConfig":
        raise rep.refuse(("kind",), f"{kind!r}: only a PipelineConfig converts (a RunConfig or BuiltinTemplate "
                                    f"needs the seed's own init first)")
    if data.get("metadata") is not None:
        _expect(rep, data["metadata"], dict, ("metadata",), "a mapping (name, description)")
    for key in data:
        if key not in TOP_KEYS:
            rep.skip((key,), "not a PipelineConfig key gage-eval has an equivalent for")
    datasets = _items(rep, data, "datasets", "dataset_id", ())
    if not datasets:
        raise rep.refuse(("datasets",) if "datasets" in data else (), "required key 'datasets' missing or empty: "
                         "a task needs rows")
    for name, (i, ds) in datasets.items():
        if ds.get("params") is not None:
            _expect(rep, ds["params"], dict, ("datasets", i, "params"), "a mapping")
        if "loader" not in ds and "hub" not in ds:
            raise rep.refuse(("datasets", i), "required key 'loader' missing")
        for key in ("loader", "hub"):
            if key in ds:
                _expect(rep, ds[key], str, ("datasets", i, key), "a name")
        if ds.get("hub_params") is not None:
            _expect(rep, ds["hub_params"], dict, ("datasets", i, "hub_params"), "a mapping (hub_id, subset, split)")
        hub_id = _hub_id(ds, ds.get("params") or {})
        if hub_id is not None and not isinstance(hub_id, str):
            raise rep.refuse(("datasets", i), f"the Hub id (hub_params.hub_id) must be a name, got "
                                              f"{type(hub_id).__name__}")
        if (ds.get("params") or {}).get("path") is not None:
            _expect(rep, ds["params"]["path"], str, ("datasets", i, "params", "path"), "a file path")
    backends = _items(rep, data, "backends", "backend_id", ("type",))
    for name, (i, be) in backends.items():
        _expect(rep, be["type"], str, ("backends", i, "type"), "a backend type")
        _check_backend_config(rep, be.get("config"), ("backends", i, "config"))
    prompts = _items(rep, data, "prompts", "prompt_id", ("template",))
    for name, (i, pr) in prompts.items():
        _expect(rep, pr["template"], str, ("prompts", i, "template"), "a template text")
        if pr.get("params") is not None:
            _expect(rep, pr["params"], dict, ("prompts", i, "params"), "a mapping")
    adapters = _items(rep, data, "role_adapters", "adapter_id", ("role_type",))
    for name, (i, ad) in adapters.items():
        _expect(rep, ad["role_type"], str, ("role_adapters", i, "role_type"), "a role type")
        if ad.get("backend") is not None:
            _expect(rep, ad["backend"], dict, ("role_adapters", i, "backend"), "a mapping {type, config}")
            if "type" not in ad["backend"]:
                raise rep.refuse(("role_adapters", i, "backend"), "required key 'type' missing")
            _expect(rep, ad["backend"]["type"], str, ("role_adapters", i, "backend", "type"), "a backend type")
            _check_backend_config(rep, ad["backend"].get("config"), ("role_adapters", i, "backend", "config"))
        elif ad.get("backend_id") is not None:
            _expect(rep, ad["backend_id"], str, ("role_adapters", i, "backend_id"), "a backend_id")
            if ad["backend_id"] not in backends:
                raise rep.refuse(("role_adapters", i, "backend_id"), f"{ad['backend_id']!r} is not a backends[] "
                                 f"backend_id ({', '.join(backends) or 'none declared'})")
        elif ad["role_type"] in ("dut_model", "judge_model", "helper_model"):
            raise rep.refuse(("role_adapters", i), "required key 'backend' or 'backend_id' missing")
        caps = ad.get("capabilities")
        if caps is not None and not (isinstance(caps, list) and all(isinstance(c, str) for c in caps)):
            raise rep.refuse(("role_adapters", i, "capabilities"), "expected a list of names")
        if ad.get("prompt_params") is not None:
            _expect(rep, ad["prompt_params"], dict, ("role_adapters", i, "prompt_params"), "a mapping")
        if ad.get("prompt_id") is not None:
            _expect(rep, ad["prompt_id"], str, ("role_adapters", i, "prompt_id"), "a prompt_id")
        if ad.get("prompt_id") is not None and ad["prompt_id"] not in prompts:
            raise rep.refuse(("role_adapters", i, "prompt_id"), f"{ad['prompt_id']!r} is not a prompts[] prompt_id")
    metrics = data.get("metrics")
    if metrics is not None:
        _expect(rep, metrics, list, ("metrics",), "a list")
    tasks = _items(rep, data, "tasks", "task_id", ())
    for name, (i, task) in tasks.items():
        ds_id = task.get("dataset_id", task.get("dataset_ref"))
        if ds_id is None:
            if len(datasets) != 1:
                raise rep.refuse(("tasks", i), "required key 'dataset_id' missing")
        elif not isinstance(ds_id, str) or ds_id not in datasets:
            raise rep.refuse(("tasks", i, "dataset_id" if "dataset_id" in task else "dataset_ref"),
                             f"{ds_id!r} is not a datasets[] dataset_id")
        if task.get("metric_overrides") is not None:
            _expect(rep, task["metric_overrides"], list, ("tasks", i, "metric_overrides"), "a list")
        for key in ("max_samples", "concurrency"):
            value = task.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise rep.refuse(("tasks", i, key), f"expected a whole number, got {value!r}")
    default_steps = None
    for key in ("custom", "builtin"):
        if data.get(key) is not None:
            _expect(rep, data[key], dict, (key,), "a mapping with steps")
            steps = data[key].get("steps")
            if steps is not None:
                _expect(rep, steps, list, (key, "steps"), "a list of steps")
                default_steps = (key, "steps")
    return Pipeline(data, datasets, backends, adapters, prompts, metrics or [], tasks, default_steps), rep


def _check_backend_config(rep: Report, config: Any, where: tuple) -> None:
    if config is None:
        return
    _expect(rep, config, dict, where, "a mapping")
    for key in ("default_params", "generation_params", "sampling_params"):
        if config.get(key) is not None:
            _expect(rep, config[key], dict, (*where, key), "a mapping (max_new_tokens, temperature, ...)")


# -- converting ---------------------------------------------------------------------------------

def _registered_metrics() -> set[str]:
    from gage_plugins_builtin import METRICS

    return set(METRICS)


def _expand(value: str) -> str:
    """``${VAR:-default}`` as the seed's loader expands it, from this environment."""
    return ENV_REF.sub(lambda m: os.environ.get(m.group(1)) or (m.group(2) or ""), value)


def _reference(text: str) -> bool:
    return "${" in urllib.parse.unquote(text)


def _clean_url(rep: Report, where: tuple, url: str) -> str:
    """``url`` without the secrets it holds literally (user-info, query keys), each one named; a
    ``${VAR}`` reference is kept as written (gage-eval reads it from the environment when it runs)."""
    clean, user, password = secrets.url_credentials(url)
    if (user or password) and not _reference(f"{user or ''}:{password or ''}"):
        url = clean  # a password in a URL is a secret too: never written to a file
        rep.note(where, "the user and password in the URL are not written: give the URL with them "
                        "when running (--model-args base_url=...)")
    left = [name for name, value in secrets.query_secrets(url) if not _reference(value)]
    if left:
        parts = urllib.parse.urlsplit(url)
        keep = [p for p in parts.query.split("&") if urllib.parse.unquote_plus(p.partition("=")[0]) not in left]
        url = urllib.parse.urlunsplit(parts._replace(query="&".join(keep)))
        for name in left:
            rep.secret(where, f"the {name} query parameter", f"the {name} query parameter is a secret and is not written: export it and add "
                            f"{name}=${{VAR}} to base_url in run.yaml (read from the environment when gage-eval runs)")
    if ENV_REF.search(url):
        rep.note(where, "kept as written: gage-eval reads ${VAR} from the environment when it runs")
    return url


def _headers(rep: Report, where: tuple, headers: dict) -> dict[str, str]:
    """A seed backend's HTTP headers as ``header_NAME`` arguments: a ``${VAR}`` reference is kept,
    a literal value (a credential, as every header value is taken to be) is left out and named."""
    out = {}
    for name, value in headers.items():
        if isinstance(value, str) and ENV_REF.search(value):
            out[f"header_{name}"] = value
        elif value not in (None, ""):
            rep.secret((*where, name), f"header {name}", f"the value of header {name} is a secret and is not written: export it and add "
                                     f"header_{name}: ${{VAR}} to the model's args in run.yaml")
    if out:
        rep.note(where, "kept as written: gage-eval reads ${VAR} from the environment when it runs")
    return out


def _step_list(pipe: Pipeline, task: dict | None, tindex: int | None) -> tuple[Any, tuple | None]:
    """A task's steps (its own, else the default flow's; None when neither) and where they were declared."""
    if task is not None and task.get("steps") is not None:
        return task["steps"], ("tasks", tindex, "steps")
    if pipe.default_steps:
        return pipe.data[pipe.default_steps[0]]["steps"], pipe.default_steps
    return None, None


def _steps(pipe: Pipeline, rep: Report, task: dict | None, tindex: int | None) -> tuple[list[str], tuple | None]:
    """The step names of a task (its own steps, else the default flow) and where they were declared."""
    steps, where = _step_list(pipe, task, tindex)
    if where is None:
        return ["inference", "auto_eval"], None
    _expect(rep, steps, list, where, "a list of steps")
    names = []
    for j, step in enumerate(steps):
        name = step.get("step", step.get("step_type")) if isinstance(step, dict) else step
        if not isinstance(name, str):
            raise rep.refuse((*where, j), "expected a step {step: NAME}")
        names.append(name)
    return names, where


def _step_adapters(pipe: Pipeline, rep: Report, task: dict | None, tindex: int | None) -> dict[str, tuple]:
    """The adapter a task's steps name, by step: ``{"inference": (adapter_id, where)}``."""
    steps, where = _step_list(pipe, task, tindex)
    out: dict[str, tuple] = {}
    for j, step in enumerate(steps if isinstance(steps, list) else []):
        if not isinstance(step, dict) or step.get("adapter_id", step.get("role_ref")) is None:
            continue
        key = "adapter_id" if "adapter_id" in step else "role_ref"
        ident = _expect(rep, step[key], str, (*where, j, key), "an adapter_id")
        if ident not in pipe.adapters:
            raise rep.refuse((*where, j, key), f"{ident!r} is not a role_adapters[] adapter_id")
        out.setdefault(str(step.get("step", step.get("step_type"))), (ident, (*where, j, key)))
    return out


def _chosen(pipe: Pipeline, rep: Report, step: str, role_type: str) -> tuple[str, int, dict] | None:
    """The adapter of ``role_type`` the run uses: the first one a ``step`` names, else the first declared."""
    entries = list(pipe.tasks.values()) or [(None, None)]  # (index, task)
    for ti, task in entries:
        named = _step_adapters(pipe, rep, task, ti).get(step)
        if named and pipe.adapters[named[0]][1]["role_type"] == role_type:
            return _role(pipe, role_type, named[0])
    return _role(pipe, role_type)


def _role(pipe: Pipeline, role_type: str, wanted: str | None = None) -> tuple[str, int, dict] | None:
    found = [(name, i, ad) for name, (i, ad) in pipe.adapters.items()
             if ad["role_type"] == role_type and (wanted is None or name == wanted)]
    return found[0] if found else None


def _backend(pipe: Pipeline, rep: Report, adapter: tuple[str, int, dict]) -> tuple[str, dict, dict, list[str]]:
    """(gage-eval backend, its args, generation settings, capabilities) of a role adapter."""
    name, i, ad = adapter
    if ad.get("backend") is not None:
        spec, where = ad["backend"], ("role_adapters", i, "backend")
        if ad.get("backend_id") is not None:
            rep.note(("role_adapters", i, "backend_id"), "both backend and backend_id: the inline backend is used, "
                                                       "as the seed does")
    else:
        bi, spec = pipe.backends[ad["backend_id"]]
        where = ("backends", bi)
    seed_type = spec["type"]
    config = spec.get("config") or {}
    gage = BACKEND_TYPES.get(seed_type)
    caps = [str(c) for c in ad.get("capabilities") or []]
    if gage is None:
        rep.skip((*where, "type"), f"backend type {seed_type!r} has no gage-eval backend (gage-eval has dummy, "
                                   f"transformers, vllm, openai); the run uses the default model unless --model "
                                   f"names one")
        return "", {}, {}, caps
    if seed_type in ("sglang", "tgi", "litellm"):
        rep.note((*where, "type"), f"{seed_type} is reached through its OpenAI-compatible endpoint (openai backend)")
    args: dict[str, Any] = {}
    generation: dict[str, Any] = {}
    renames = BACKEND_ARGS[gage]
    for key, value in config.items():
        cwhere = (*where, "config", key)
        if key in ("default_params", "generation_params", "sampling_params") and isinstance(value, dict):
            for gk, gv in value.items():
                if gk in GENERATION_KEYS:
                    generation[GENERATION_KEYS[gk]] = gv
                else:
                    rep.skip((*cwhere, gk), "not a gage-eval generation setting (max_new_tokens, temperature, "
                                            "top_p, top_k, stop, seed, do_sample)")
        elif key in GENERATION_KEYS and key not in renames:
            generation[GENERATION_KEYS[key]] = value
        elif secrets.is_secret_key(key):  # api_key, token, password, ...
            whole = ENV_REF.fullmatch(value.strip()) if isinstance(value, str) else None
            if gage == "openai" and whole and not whole.group(2) and re.search(r"api[_-]?key$", key, re.I):
                args["api_key_env"] = whole.group(1)  # the reference, never its value
                rep.note(cwhere, f"{value.strip()} becomes api_key_env={whole.group(1)}: gage-eval reads the key "
                                 f"from that variable when it runs")
            else:
                why = ("a key is never written to a file: export it and set api_key_env=VAR (the openai backend "
                       "reads OPENAI_API_KEY by default)")
                if value in (None, ""):
                    rep.skip(cwhere, why)
                else:
                    rep.secret(cwhere, key, why)
        elif key in ("headers", "extra_headers") and gage == "openai" and isinstance(value, dict):
            args.update(_headers(rep, cwhere, value))
        elif key in renames:
            if renames[key] == "base_url" and isinstance(value, str):
                value = _clean_url(rep, cwhere, value)
            elif isinstance(value, str) and ENV_REF.search(value):
                rep.note(cwhere, "kept as written: gage-eval reads ${VAR} from the environment when it runs")
            args[renames[key]] = value
        else:
            rep.skip(cwhere, f"the {gage} backend has no such argument")
    if gage == "openai" and any(c in ("vision_chat", "vision") for c in caps):
        args["vision"] = True
    if gage in ("vllm", "transformers") and "pretrained" not in args:
        rep.skip((*where, "config"), "no model path (model_path / model_name_or_path): give --model-args "
                                     "pretrained=DIR when running")
    return gage, args, generation, caps


def _metric_entries(rep: Report, entries: list, where: tuple, refs: dict) -> list:
    """The task's metrics; the reference-locating params go to ``refs`` for the preprocessor."""
    registered = _registered_metrics()
    out = []
    for j, entry in enumerate(entries):
        ew = (*where, j)
        params: dict = {}
        if isinstance(entry, str):
            m = re.fullmatch(r"\s*([\w.:-]+)\s*(?:\((.*)\))?\s*", entry)
            if not m:
                raise rep.refuse(ew, f"expected a metric id, got {entry!r}")
            mid = impl = m.group(1)
            for part in filter(None, (p.strip() for p in (m.group(2) or "").split(","))):
                k, eq, v = part.partition("=")
                if not eq:
                    raise rep.refuse(ew, f"expected key=value in {entry!r}")
                params[k.strip()] = yaml.safe_load(v.strip())
        elif isinstance(entry, dict) and "metric_id" in entry:
            mid = _expect(rep, entry["metric_id"], str, (*ew, "metric_id"), "a metric id")
            impl = entry.get("implementation") or mid
            _expect(rep, impl, str, (*ew, "implementation"), "a metric id or class path")
            params = entry.get("params") or {}
            _expect(rep, params, dict, (*ew, "params"), "a mapping")
            for key in entry:
                if key not in ("metric_id", "implementation", "params"):
                    rep.skip((*ew, key), "no gage-eval equivalent for this metric key")
        elif isinstance(entry, dict) and len(entry) == 1:
            ((mid, params),) = entry.items()
            impl = mid
            params = params or {}
            _expect(rep, params, dict, (*ew, mid), "a mapping of params")
        else:
            raise rep.refuse(ew, "expected a metric: an id, {id: {params}} or {metric_id, implementation, params}")
        pw = (*ew, "params") if isinstance(entry, dict) and "metric_id" in entry else ew
        if impl not in METRIC_MAP:
            why = ("a class path: gage-eval metrics are plugins (gage_register_metrics); port the class"
                   if CALLABLE.match(impl) else
                   "no gage-eval metric computes it")
            rep.skip((*ew, "implementation") if isinstance(entry, dict) and "implementation" in entry else ew,
                     f"metric {impl!r}: {why}")
            continue
        gage_name, renames = METRIC_MAP[impl]
        as_is = impl in SPEC_IDS and impl in registered  # the spec's own id, its params unchanged
        if impl in registered:
            gage_name = impl
        elif gage_name != impl:
            rep.note(ew, f"metric {impl!r} is not registered in this gage-eval: computed by {gage_name!r}")
        if impl == "judge_threshold":
            rep.note(ew, "gage-eval's llm_judge scores from 0 to 1 (a reply out of 10 is divided by 10): a threshold "
                         "written for another scale needs changing")
        args: dict[str, Any] = dict(params) if as_is else {}
        for key, value in params.items():
            kw = (*pw, key)
            if as_is and key not in REFERENCE_PARAMS:
                continue
            if key in REFERENCE_PARAMS:
                slot = REFERENCE_PARAMS[key]
                path = str(value)
                if slot == "reference" and path.endswith("correct_choice"):
                    slot = "label"
                if slot in refs and refs[slot][0] != path:
                    rep.skip(kw, f"another metric reads its {key} from {refs[slot][0]!r}; one task has one "
                                 f"reference: give this metric a task of its own")
                else:
                    refs.setdefault(slot, (path, kw))
            elif key in renames:
                target = renames[key]
                if target.startswith("!"):
                    target, value = target[1:], not value
                if key.endswith("_field"):
                    mapped = FIELD_PATHS.get(str(value))
                    if mapped is None:
                        rep.skip(kw, f"{value!r}: no gage-eval field at this path (gage-eval's: model_output.text, "
                                     f"model_output.latency_ms, judge_output.score)")
                        continue
                    value = mapped
                args[target] = value
            else:
                rep.skip(kw, f"{gage_name} has no such parameter")
        item: dict[str, Any] = {"name": gage_name}
        if mid != gage_name:
            item["as"] = mid
        if args:
            item["args"] = args
        out.append(item if len(item) > 1 else gage_name)
    return out


def _preprocessor(rep: Report, ds: dict, di: int, refs: dict, columns: list[str]) -> dict:
    """The task's preprocessor."""
    params = ds.get("params") or {}
    pre = params.get("preprocess")
    kwargs = params.get("preprocess_kwargs") or {}
    pw = ("datasets", di, "params")
    _expect(rep, kwargs, dict, (*pw, "preprocess_kwargs"), "a mapping")
    hub = _hub_id(ds, params)
    args: dict[str, Any] = {}
    if pre and any(k in str(pre) for k in MULTI_CHOICE_PRE) or "choices_field" in kwargs or "options_field" in kwargs:
        piqa = "piqa" in str(pre or "")
        args["question"] = kwargs.get("question_field", "goal" if piqa else "question")
        choices = kwargs.get("choices_field", kwargs.get("options_field"))
        args["choices"] = ["sol1", "sol2"] if piqa and choices in (None, "choices") else (choices or "choices")
        args["answer"] = kwargs.get("answer_field", "label" if piqa else "answer")
        base = kwargs.get("answer_index_base", 0)
        if base not in (0, None):
            rep.skip((*pw, "preprocess_kwargs", "answer_index_base"), f"{base}: gage-eval reads answer indexes "
                     f"from 0; re-number the answers or give letters")
        for key in kwargs:
            if key not in ("question_field", "choices_field", "options_field", "answer_field", "answer_index_base",
                           "system_prompt", "instruction"):
                rep.skip((*pw, "preprocess_kwargs", key), "no gage-eval preprocessor argument for it")
        if kwargs.get("system_prompt"):
            args["system"] = kwargs["system_prompt"]
        if columns:
            args["metadata"] = columns
        return {"name": "legacy", "args": args}
    if hub and "mmmu" in (str(pre or "") + hub).lower():
        return {"name": "mmmu"}
    if hub and "docvqa" in (str(pre or "") + hub).lower():
        return {"name": "docvqa"}
    # the seed's envelope (messages/choices/metadata): read as it is
    for key, value in kwargs.items():
        kw = (*pw, "preprocess_kwargs", key)
        if key in ("answers_field", "answer_field", "label_field"):
            slot = "references" if key == "answers_field" and not str(value).startswith("choices") else "reference"
            refs.setdefault(slot, (str(value), kw))
        elif key in ("question_field", "image_field", "content_field", "content_root"):
            rep.note(kw, "the messages are read as they are (their text and image_url segments); this mapping "
                         "is not needed")
        else:
            rep.skip(kw, "no gage-eval preprocessor argument for it")
    if pre and not any(k in str(pre) for k in ("docvqa", "mmmu", "default", "struct_only", "standardizer")):
        rep.skip((*pw, "preprocess"), f"preprocessor {pre!r}: no gage-eval equivalent; rows are read as the seed's "
                                      f"Sample envelope (seed_sample)")
    if "references" in refs:
        args["references"] = _row_path(refs["references"][0])
        args["reference"] = None
    elif "reference" in refs and _row_path(refs["reference"][0]) != SEED_REFERENCE:
        args["reference"] = _row_path(refs["reference"][0])
    if "options" in refs:
        args["options"] = _row_path(refs["options"][0])
    if "label" in refs:
        args["label"] = _row_path(refs["label"][0])
    if columns:
        args["metadata"] = columns
    return {"name": "seed_sample", "args": args} if args else {"name": "seed_sample"}


SEED_REFERENCE = "choices.0.message.content.0.text"  # where the seed's envelope keeps the answer


def _row_path(path: str) -> str:
    """A seed field path as a path into the row (``sample.`` dropped: the row is the seed's sample)."""
    return path[len("sample."):] if path.startswith("sample.") else path


def _hub_id(ds: dict, params: dict) -> str | None:
    hub_params = ds.get("hub_params") or {}
    if ds.get("hub") or str(ds.get("loader", "")).startswith("hf") or hub_params:
        return hub_params.get("hub_id") or params.get("hub_id") or ds.get("hub_id") or params.get("path")
    return None


def _dataset(rep: Report, ds: dict, di: int) -> dict:
    params = ds.get("params") or {}
    hub_params = ds.get("hub_params") or {}
    loader = str(ds.get("loader", "")).lower()
    w = ("datasets", di)
    hub = _hub_id(ds, params)
    if hub is None and (ds.get("hub") or loader.startswith("hf")):
        raise rep.refuse(w, "required key 'hub_params.hub_id' missing (a Hub dataset needs its id)")
    if hub:  # a name: read_pipeline refused any other
        args: dict[str, Any] = {"path": hub}
        split = hub_params.get("split", params.get("split"))
        subset = hub_params.get("subset", params.get("subset", params.get("name")))
        revision = hub_params.get("revision", params.get("revision"))
        args["split"] = split or "train"
        if subset:
            args["name"] = subset
        if revision:
            args["revision"] = revision
        for key in hub_params:
            if key not in ("hub_id", "split", "subset", "revision"):
                rep.skip((*w, "hub_params", key), "the hf loader has no such argument")
        return {"loader": "hf", "args": args}
    if loader in ("jsonl", "json"):
        path = params.get("path")
        if not isinstance(path, str) or not path:
            raise rep.refuse((*w, "params"), "required key 'path' missing (a jsonl loader reads a file)")
        expanded = _expand(path)
        if expanded != path:
            rep.note((*w, "params", "path"), f"{path!r} expanded from this environment to {expanded!r}")
        return {"loader": "jsonl", "args": {"path": os.path.abspath(os.path.expanduser(expanded))}}
    rep.skip((*w, "loader"), f"loader {ds.get('loader')!r}: gage-eval reads jsonl files and Hugging Face datasets; "
                             f"the task reads a jsonl file given with --data")
    return {"loader": "jsonl", "args": {"path": "data.jsonl"}}


def _template_vars(text: str) -> set[str]:
    import jinja2
    import jinja2.meta

    try:
        return set(jinja2.meta.find_undeclared_variables(jinja2.Environment().parse(text)))
    except jinja2.TemplateSyntaxError:
        return set()


PROMPT_VARS = {"sample", "messages", "question", "options", "metadata", "letters"}
PROMPT_REWRITES = [("sample.metadata.question_text", "question"), ("sample.metadata.option_map", "metadata.option_map"),
                   ("sample.metadata.correct_choice", "sample.label"), ("sample.metadata.", "metadata."),
                   ("payload.model_output.answer", "response"), ("model_output.answer", "response")]


def _prompt_file(rep: Report, text: str, where: tuple, params: dict, columns: list[str], judge: bool) -> str:
    """A seed prompt template as a gage-eval one: the seed's canonical names rewritten, constants and
    raw columns bound with ``set`` in front."""
    for old, new in PROMPT_REWRITES:
        text = text.replace(old, new)
    head = []
    for key, value in (params or {}).items():
        head.append(f"{{%- set {key} = {json.dumps(value, ensure_ascii=False)} -%}}")
    known = PROMPT_VARS | set(params or {}) | ({"response", "references", "conversation", "prompt", "context",
                                               "policy_id"} if judge else set())
    for name in sorted(_template_vars(text) - known):
        if judge:
            rep.skip(where, f"template variable {name!r}: a judge template sees sample, question, references, "
                            f"response, conversation, prompt, metadata")
        else:
            columns.append(name)
            head.append(f"{{%- set {name} = metadata.{name} -%}}")
    return "\n".join([*head, text.rstrip("\n")]) + "\n"


def _adapter_prompt(pipe: Pipeline, rep: Report, adapter: dict, columns: list[str], judge: bool) -> str:
    """The template of an adapter's ``prompt_id`` (checked by read_pipeline), its prompt_params over
    the prompt's params."""
    pi, pspec = pipe.prompts[adapter["prompt_id"]]
    params = {**(pspec.get("params") or {}), **(adapter.get("prompt_params") or {})}
    return _prompt_file(rep, pspec["template"], ("prompts", pi, "template"), params, columns, judge)


def _doc_to(rep: Report, ds: dict, di: int, columns: list[str]) -> tuple[str | None, dict]:
    """doc_to_text / doc_to_choice / doc_to_target / doc_to_visual: a prompt template and legacy
    preprocessor arguments."""
    params = ds.get("params") or {}
    legacy: dict[str, Any] = {}
    prompt = None
    for key in sorted(k for k in {**ds, **params} if isinstance(k, str) and k.startswith("doc_to_")):
        in_params = key in params
        value = params[key] if in_params else ds[key]
        where = ("datasets", di, "params", key) if in_params else ("datasets", di, key)
        if key.endswith("_kwargs"):
            base = key[: -len("_kwargs")]
            if base == "doc_to_visual" and isinstance(value, dict) and set(value) <= {"content_field"} and \
                    str(value.get("content_field", "messages.0.content")).startswith("messages."):
                continue  # images are read from the messages, wherever they are
            rep.skip(where, f"arguments of {base}: no gage-eval equivalent")
            continue
        if not isinstance(value, (str, list)):
            raise rep.refuse(where, f"expected a template or a callable 'pkg.mod:function', got "
                                    f"{type(value).__name__}")
        if isinstance(value, str) and CALLABLE.match(value) and ":" in value:
            if key == "doc_to_visual" and value.rsplit(":", 1)[1] in IMAGE_CALLABLES:
                rep.note(where, "images in the messages are read by the preprocessor (local paths relative to the "
                                "data file; data: URLs as they are); nothing to call")
            else:
                rep.skip(where, f"{value}: gage-eval calls no Python a task names; write a Jinja2 template "
                                f"(request.prompt) or a preprocessor plugin")
            continue
        if key == "doc_to_text":
            prompt = value if isinstance(value, str) else None
            if prompt is None:
                raise rep.refuse(where, "expected a template text")
        elif key in ("doc_to_choice", "doc_to_target"):
            fields = _fields_of(value)
            if not fields:
                rep.skip(where, f"{value!r}: not a column name or '{{{{column}}}}' template")
                continue
            if key == "doc_to_choice":
                legacy["choices"] = fields if len(fields) > 1 or isinstance(value, list) or "[" in str(value) \
                    else fields[0]
            else:
                legacy["answer"] = fields[0]
        else:
            rep.skip(where, "no gage-eval equivalent")
    return prompt, legacy


def _fields_of(value: Any) -> list[str]:
    """Column names of ``label``, ``{{label}}``, ``{{[sol1, sol2]}}`` or ``["{{sol1}}", "{{sol2}}"]``."""
    texts = value if isinstance(value, list) else [value]
    out = []
    for text in texts:
        text = str(text).strip()
        m = re.fullmatch(r"\{\{\s*(.*?)\s*\}\}", text)
        inner = m.group(1) if m else text
        inner = inner.strip("[]")
        for part in inner.split(","):
            part = part.strip()
            if not re.fullmatch(r"[A-Za-z_]\w*", part):
                return []
            out.append(part)
    return out


def convert(pipeline: Path, out_dir: Path) -> tuple[Path, Report]:
    """Convert ``pipeline`` into ``out_dir`` (which must not exist, or be empty)."""
    pipe, rep = read_pipeline(pipeline)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        what = "not empty" if out_dir.is_dir() else "no folder"
        raise GageError(f"-o {out_dir}: exists and is {what}; give a new folder")
    files: dict[str, str] = {}
    run: dict[str, Any] = {}
    data = pipe.data

    description = ""
    if isinstance(data.get("metadata"), dict):
        description = str(data["metadata"].get("description") or data["metadata"].get("name") or "")

    # the roles: one DUT and one judge per run
    dut = _chosen(pipe, rep, "inference", "dut_model")
    judge_ad = _chosen(pipe, rep, "judge", "judge_model")
    used = set()
    dut_caps: list[str] = []
    task_generation: dict[str, Any] = {}
    models: dict[str, Any] = {}
    if dut:
        used.add(dut[0])
        gage, args, task_generation, dut_caps = _backend(pipe, rep, dut)
        if gage:
            models["dut"] = {"backend": gage, **({"args": args} if args else {})}
        for key in dut[2]:
            if key in ("adapter_id", "role_type", "backend", "backend_id", "prompt_id", "prompt_params") or \
                    key in INFORMATIVE:
                continue
            rep.skip(("role_adapters", dut[1], key), "no gage-eval equivalent for this role adapter key")
    else:
        rep.notes.append(f"{pipeline}:1: role_adapters: no dut_model: the run uses gage-eval's default model "
                         f"(or --model)")
    vision = any(c in ("vision_chat", "vision") for c in dut_caps)

    task_specs = _task_specs(pipe, rep)
    run_tasks: list[Any] = []
    names: set[str] = set()
    judge_used = False
    for tname, ti, task, ds_id, di in task_specs:
        ds = pipe.datasets[ds_id][1]
        folder = NAME.sub("_", tname).strip("._-") or "task"
        while folder in names:
            folder += "_"
        names.add(folder)
        if folder != tname:  # (a name that is no folder name, or one taken: said, or its task is not found)
            rep.note(("tasks", ti, "task_id") if ti is not None else ("datasets", di, "dataset_id"),
                     f"{tname!r} is not a task name or is taken: the task is {folder!r}")
        steps, swhere = _steps(pipe, rep, task, ti)
        for j, step in enumerate(steps):
            if step not in ("inference", "auto_eval", "judge", "report"):
                rep.skip((*swhere, j) if swhere else (), f"step {step!r}: gage-eval runs inference, an optional "
                                                        f"judge and the metrics")
        named_by_step = _step_adapters(pipe, rep, task, ti)
        for step, role in (("inference", dut), ("judge", judge_ad)):
            named = named_by_step.get(step)
            if named and role and named[0] != role[0]:
                rep.skip(named[1], f"{named[0]}: one {role[2]['role_type']} per run and this run's is {role[0]}; "
                                   f"run this task on its own with that adapter's model (--model, --model-args)")
        columns: list[str] = []
        refs: dict[str, tuple] = {}
        if task is not None and task.get("metric_overrides"):
            mentries, mwhere = task["metric_overrides"], ("tasks", ti, "metric_overrides")
        else:
            mentries, mwhere = pipe.metrics, ("metrics",)
        metrics = _metric_entries(rep, mentries, mwhere, refs)
        doc_prompt, legacy_extra = _doc_to(rep, ds, di, columns)
        files_here: dict[str, str] = {}
        if dut and dut[2].get("prompt_id"):
            files_here["prompt.jinja"] = _adapter_prompt(pipe, rep, dut[2], columns, False)
            if doc_prompt is not None:
                rep.note(("datasets", di, "params", "doc_to_text"), "the DUT adapter's prompt_id wins over doc_to_text")
        elif doc_prompt is not None:
            files_here["prompt.jinja"] = _prompt_file(rep, doc_prompt, ("datasets", di, "params", "doc_to_text"),
                                                      {}, columns, False)
        preprocessor = _preprocessor(rep, ds, di, refs, sorted(set(columns)))
        if legacy_extra:
            if preprocessor["name"] == "seed_sample":
                preprocessor = {"name": "legacy", "args": {k: v for k, v in (preprocessor.get("args") or {}).items()
                                                           if k == "metadata"}}
            preprocessor.setdefault("args", {}).update(legacy_extra)
            if "question" not in preprocessor["args"] and columns:
                preprocessor["args"]["question"] = columns[0]  # the row's text: the template's first column
        if not metrics:
            rep.notes.append(f"{rep.loc(mwhere if mentries else ('datasets', di))}: no metric converted: the task "
                             f"reports latency only")
            metrics = ["latency"]
        request: dict[str, Any] = {"kind": "generate", "chat": True}
        if "prompt.jinja" in files_here:
            request["prompt"] = "prompt.jinja"
        task_yaml: dict[str, Any] = {
            "description": description or f"Converted from {pipeline.name} (dataset {ds_id}).",
            "dataset": _dataset(rep, ds, di),
            "preprocessor": preprocessor,
            "request": request,
            "metrics": metrics,
        }
        if "judge" in steps or any((m if isinstance(m, str) else m["name"]) in ("judge_score", "judge_threshold")
                                   for m in metrics):
            if judge_ad is None:
                raise rep.refuse(swhere or mwhere, "a judge step or metric needs a role_adapters entry with "
                                                   "role_type judge_model")
            judge_used = True
            jargs: dict[str, Any] = {"reference_template": "judge.jinja", "skip_task_types": []}
            if judge_ad[2].get("prompt_id"):
                files_here["judge.jinja"] = _adapter_prompt(pipe, rep, judge_ad[2], [], True)
            else:
                files_here["judge.jinja"] = JUDGE_TEMPLATE
                rep.note(("role_adapters", judge_ad[1]), "no prompt_id: the judge gets gage-eval's converted "
                                                         "default grading prompt (judge.jinja)")
            task_yaml["judge"] = {"name": "llm_judge", "args": jargs}
        if vision:
            task_yaml["requires"] = ["vision"]
        files[f"tasks/{folder}/task.yaml"] = _task_text(pipeline, ds_id, task_yaml)
        for fname, text in files_here.items():
            files[f"tasks/{folder}/{fname}"] = text
        entry: dict[str, Any] = {"name": folder}
        if task is not None and task.get("max_samples"):
            entry["limit"] = task["max_samples"]
        if task_generation:
            entry["generation"] = dict(task_generation)
        run_tasks.append(entry if len(entry) > 1 else folder)

    if judge_ad:
        used.add(judge_ad[0])
        if judge_used:
            gage, args, jgen, _ = _backend(pipe, rep, judge_ad)
            if gage:
                models["judge"] = {"backend": gage, **({"args": args} if args else {})}
            if jgen:
                rep.note(("role_adapters", judge_ad[1]), "the judge backend's generation settings apply to the "
                                                         "DUT in the seed's shared backend; the judge uses its own "
                                                         "(max_new_tokens 256, temperature 0)")
        else:
            rep.skip(("role_adapters", judge_ad[1]), "judge_model: no judge step or judge metric uses it")
    for name, (i, ad) in pipe.adapters.items():
        if name not in used:
            rep.skip(("role_adapters", i), f"role {ad['role_type']!r} ({name}): gage-eval runs one DUT and one "
                                           f"judge per run")
    for name, (i, _) in pipe.prompts.items():
        if not any(ad.get("prompt_id") == name for ad in (a for n, (_, a) in pipe.adapters.items() if n in used)):
            rep.skip(("prompts", i), "no converted role adapter uses this prompt")

    if models:
        run["models"] = models
    run["include_paths"] = ["tasks"]  # relative to run.yaml's folder: the folder moves whole
    run["tasks"] = run_tasks
    files["run.yaml"] = RUN_HEAD.format(name=pipeline.name) + _secrets_left_out(rep) + yaml.safe_dump(run, sort_keys=False,
                                                                             allow_unicode=True, width=100)
    files["CONVERSION.txt"] = _conversion_text(pipeline, rep)
    _write_all(out_dir, files)
    return out_dir, rep


def _task_specs(pipe: Pipeline, rep: Report) -> list[tuple[str, int | None, dict | None, str, int]]:
    """(name, task index, task, dataset id, dataset index) of each task to write: one per tasks[]
    entry, else one per dataset."""
    if not pipe.tasks:
        return [(ds_id, None, None, ds_id, di) for ds_id, (di, _) in pipe.datasets.items()]
    specs = []
    for tname, (ti, task) in pipe.tasks.items():
        ds_id = task.get("dataset_id", task.get("dataset_ref")) or next(iter(pipe.datasets))
        specs.append((tname, ti, task, ds_id, pipe.datasets[ds_id][0]))
        for key in task:
            if key in ("task_id", "dataset_id", "dataset_ref", "metric_overrides", "steps", "max_samples"):
                continue
            if key == "concurrency":
                rep.note(("tasks", ti, key), "gage-eval sizes its own batches and requests in flight "
                                             "(--batch-size, the openai backend's concurrency)")
            else:
                rep.skip(("tasks", ti, key), "no gage-eval equivalent for this task key")
    for ds_id, (di, _) in pipe.datasets.items():
        if not any(spec[3] == ds_id for spec in specs):
            rep.skip(("datasets", di), "no task uses this dataset")
    return specs


JUDGE_TEMPLATE = """\
{#- Converted default judge prompt: grade the answer against the references. -#}
Question:
{{ question }}

Reference answer(s):
{% for r in references %}- {{ r }}
{% endfor %}
Answer to grade:
{{ response }}

Give a score from 0 to 10 for how well the answer agrees with the references. Reply with the number only.
"""

RUN_HEAD = """\
# Converted from {name} by `gage-eval convert`. Run: gage-eval --config THIS_FILE
# (add --model dummy to check the tasks without a model). CONVERSION.txt lists what was not converted.
"""


def _secrets_left_out(rep: Report) -> str:
    if not rep.secrets:
        return ""
    return ("# Secrets in the pipeline that are not written here: export each one and refer to it as ${VAR}\n"
            + "".join(f"#   {s}\n" for s in rep.secrets))


def _task_text(pipeline: Path, ds_id: str, task: dict) -> str:
    head = (f"# Converted from {pipeline.name} (dataset {ds_id}) by `gage-eval convert`; docs/tasks.md describes "
            f"every key.\n")
    return head + yaml.safe_dump(task, sort_keys=False, allow_unicode=True, width=100)


def _conversion_text(pipeline: Path, rep: Report) -> str:
    out = [f"# gage-eval convert {pipeline}", "", "## Not converted", ""]
    out += rep.skipped or ["(nothing)"]
    out += ["", "## Converted with a difference", ""]
    out += rep.notes or ["(nothing)"]
    return "\n".join(out) + "\n"


def _write_all(out_dir: Path, files: dict[str, str]) -> None:
    """Every file into a scratch folder beside ``out_dir``, then one rename: whole or nothing (a
    write that fails: :class:`OutputError`, exit 4, as a run's)."""
    parent = out_dir.resolve().parent
    if not parent.is_dir():
        raise OutputError(f"-o {out_dir}: its parent folder {parent} does not exist")
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=parent))
    except OSError as exc:
        raise OutputError(f"-o {out_dir}: cannot write in {parent}: {exc.strerror or exc}") from None
    try:
        for rel, text in files.items():
            p = tmp / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text, encoding="utf-8")
        if out_dir.exists():
            out_dir.rmdir()  # empty (checked)
        os.replace(tmp, out_dir)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise OutputError(f"-o {out_dir}: cannot write: {exc.strerror or exc}") from None
