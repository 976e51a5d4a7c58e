"""Vision-language models through transformers: a processor and an image-text-to-text model.

Messages are rendered with the processor's chat template (images at their segment's
place), images decoded per request while its batch is in flight, and requests with the
same generation settings batched (sorted by length, left padded).

``min_pixels``, ``max_pixels`` and ``image_factor`` resize every image by Qwen2.5-VL's rule before
the processor sees it (:class:`~gage_plugins_builtin.multimodal.media.ImageResize`; the processor
may still resize within its own bounds); a user turn with images and no text gets
``default_prompt`` (spec 004 section 15.2; empty turns it off).
"""
from __future__ import annotations

import time
from typing import Any, Iterator, Mapping, Sequence

from gage_eval.api import (GENERATE, Backend, GageError, ModelOutput, Request, cut_at_stop, text_segment,
                           user_message)

from gage_plugins_builtin.backends.args import NO_MINIMUM, as_number, check_device, image_args
from gage_plugins_builtin.backends.hf_decode import generate_kwargs, generation_settings

from gage_plugins_builtin.multimodal.media import ImageResize, load_image, segment_url, with_default_prompt

TEXT_AND_IMAGES = frozenset({"text", "image_url"})


def to_processor_messages(messages: Sequence[Mapping[str, Any]], resize: ImageResize | None = None,
                          default_prompt: str | None = None) -> tuple[list[dict], list[Any]]:
    """Our messages as the processor's chat-template input, and their images (decoded, in order,
    resized by ``resize`` when given); an image-only last user turn gets ``default_prompt``.

    Raises ``ValueError`` for a segment the model cannot take (audio, video, file)."""
    out, images = [], []
    for message in with_default_prompt(messages, default_prompt):
        content = message.get("content")
        if isinstance(content, str) or content is None:
            out.append({"role": message.get("role", "user"), "content": [text_segment(content or "")]})
            continue
        parts = []
        for seg in content:
            kind = seg.get("type", "text") if isinstance(seg, Mapping) else "text"
            if kind == "text":
                parts.append(text_segment(seg.get("text", "") if isinstance(seg, Mapping) else str(seg)))
            elif kind == "image_url":
                image = load_image(segment_url(seg))
                images.append(resize.apply(image) if resize is not None else image)
                parts.append({"type": "image"})
            else:
                raise ValueError(f"this model takes text and images only, not {kind} segments")
        out.append({"role": message.get("role", "user"), "content": parts})
    return out, images


class VisionTransformersBackend(Backend):
    """``AutoProcessor`` + ``AutoModelForImageTextToText`` from ``pretrained`` (a folder or hub id).

    :param pretrained: the model folder or id.
    :param dtype: torch dtype name (``float32``, ``bfloat16``, ``auto``).
    :param device: ``cpu``, ``cuda``, ``cuda:1`` ... (default: cuda when available).
    :param batch_size: requests per ``generate`` call.
    :param max_new_tokens: default when a request does not say.
    :param min_pixels, max_pixels, image_factor: resize images by Qwen2.5-VL's rule (any one given
        turns it on; the others take Qwen2.5-VL's defaults 3136, 12845056 and 28).
    :param default_prompt: the text an image-only user turn gets (empty: none).
    """

    name = "transformers-vision"
    transport_args = ("batch_size",)
    capabilities = frozenset({GENERATE, "chat", "vision"})

    def __init__(self, pretrained: str, dtype: str = "auto", device: str | None = None,
                 batch_size: int | str = 8, max_new_tokens: int = 256, seed: int = 1234,
                 trust_remote_code: bool | str = False, revision: str | None = None,
                 default_prompt: str | None = None, **unused: Any):
        self.resize, self.default_prompt, self.image_settings = image_args(unused, default_prompt,
                                                                           "transformers vision backend")
        if unused:
            raise GageError(f"transformers vision backend: unknown argument(s) {', '.join(sorted(unused))}")
        self.pretrained = str(pretrained)
        self.dtype = str(dtype)
        if device is not None and str(device).startswith("cuda"):
            check_device(device, "transformers vision backend")
        self.device = device
        self.max_batch = int(batch_size) if str(batch_size).isdigit() else 8
        where = "transformers vision backend"
        self.max_new_tokens = as_number(max_new_tokens, "max_new_tokens", where, int, NO_MINIMUM)
        self.seed = as_number(seed, "seed", where, int, NO_MINIMUM)
        self.trust_remote_code = str(trust_remote_code).lower() in ("1", "true", "yes")
        self.revision = revision
        self.model_id = self.pretrained
        self.model = None
        self.processor = None

    def settings(self) -> dict:
        return {"pretrained": self.pretrained, "dtype": self.dtype, "device": self.device,
                "batch_size": self.max_batch, "max_new_tokens": self.max_new_tokens, "seed": self.seed,
                **self.image_settings}  # the image settings only when given (args.image_args)

    def open(self) -> None:
        try:
            import torch
            from transformers import AutoModelForImageTextToText, AutoProcessor
        except ImportError as exc:
            raise GageError(f"the transformers backend needs torch and transformers ({exc.name} is missing): "
                            f"pip install 'gage-eval[transformers]'") from None
        if self.device is None:
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = "auto" if self.dtype == "auto" else getattr(torch, self.dtype, None)
        if dtype is None:
            raise GageError(f"transformers backend: unknown dtype {self.dtype!r}")
        try:
            self.processor = AutoProcessor.from_pretrained(self.pretrained, revision=self.revision,
                                                           trust_remote_code=self.trust_remote_code)
            self.model = AutoModelForImageTextToText.from_pretrained(
                self.pretrained, revision=self.revision, dtype=dtype, trust_remote_code=self.trust_remote_code)
        except (OSError, ValueError) as exc:
            raise GageError(f"transformers backend: cannot load {self.pretrained!r} as an image-text-to-text "
                            f"model with a processor: {exc}") from None
        self.model.to(self.device).eval()
        tok = getattr(self.processor, "tokenizer", None)
        if tok is not None:
            tok.padding_side = "left"
            if tok.pad_token is None:
                tok.pad_token = tok.eos_token
        if getattr(self.processor, "chat_template", None) is None:
            raise GageError(f"transformers backend: {self.pretrained} has no chat template in its processor; "
                            f"vision tasks need one to place the images")

    def close(self) -> None:
        self.model = None
        self.processor = None

    def run(self, requests: Sequence[Request]) -> list[ModelOutput]:
        outputs: list[ModelOutput | None] = [None] * len(requests)
        for i, out in self.stream(requests):
            outputs[i] = out
        return [o if o is not None else ModelOutput(error="no output") for o in outputs]

    def stream(self, requests: Sequence[Request]) -> Iterator[tuple[int, ModelOutput]]:
        """Refused requests first, then each ``generate`` batch's outputs as it returns."""
        if self.model is None:
            self.open()
        prepared: list[tuple[int, str, list, dict]] = []
        for i, req in enumerate(requests):
            if req.kind != GENERATE:
                yield i, ModelOutput(error=f"the transformers vision backend cannot compute {req.kind}")
                continue
            if not set(req.modalities) <= TEXT_AND_IMAGES:
                extra = ", ".join(sorted(set(req.modalities) - TEXT_AND_IMAGES))
                yield i, ModelOutput(error=f"model {self.model_id} takes text and images, not {extra}")
                continue
            messages = req.messages or (user_message(req.prompt or ""),)
            try:
                chat, images = to_processor_messages(messages, self.resize, self.default_prompt)
                text = self.processor.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
            except Exception as exc:  # a bad image or template fails this request only
                yield i, ModelOutput(error=f"{type(exc).__name__}: {exc}")
                continue
            prepared.append((i, text, images, generation_settings(req.gen, self.max_new_tokens, self.seed)))
        groups: dict[tuple, list] = {}
        for item in prepared:
            groups.setdefault(tuple(sorted(item[3].items())), []).append(item)
        for items in groups.values():
            items.sort(key=lambda it: len(it[1]))
            for start in range(0, len(items), self.max_batch):
                chunk = items[start:start + self.max_batch]
                try:
                    results = self._generate(chunk)
                except Exception as exc:
                    results = [ModelOutput(error=f"{type(exc).__name__}: {exc}") for _ in chunk]
                for (i, *_), out in zip(chunk, results):
                    yield i, out

    def _generate(self, chunk: list) -> list[ModelOutput]:
        import torch

        t0 = time.perf_counter()
        texts = [text for _, text, _, _ in chunk]
        images = [img for _, _, imgs, _ in chunk for img in imgs]
        settings = chunk[0][3]
        inputs = self.processor(text=texts, images=images or None, return_tensors="pt", padding=True)
        inputs = inputs.to(self.device)
        kwargs = generate_kwargs(settings)
        torch.manual_seed(settings["seed"])
        tok = self.processor.tokenizer
        with torch.inference_mode():
            out = self.model.generate(**inputs, **kwargs, pad_token_id=tok.pad_token_id)
        prompt_len = inputs["input_ids"].shape[1]
        latency = (time.perf_counter() - t0) * 1000 / len(chunk)
        results = []
        for row, mask in zip(out[:, prompt_len:], inputs["attention_mask"]):
            ids = row.tolist()
            n = len(ids)
            finish = "length"
            if tok.eos_token_id is not None and tok.eos_token_id in ids:
                n = ids.index(tok.eos_token_id)
                finish = "stop"
            text = tok.decode(ids[:n], skip_special_tokens=True)
            text, stopped = cut_at_stop(text, settings["stop"])
            results.append(ModelOutput(text=text, input_tokens=int(mask.sum()), output_tokens=n,
                                       finish_reason="stop" if stopped else finish, latency_ms=latency,
                                       formatted_prompt=None))
        return results
