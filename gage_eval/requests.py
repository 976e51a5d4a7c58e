"""Turning a Sample into a backend Request with the task's templates."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from gage_eval.backend import GENERATE, LOGLIKELIHOOD, Request
from gage_eval.sample import (LETTERS, last_user_text, messages_text, render_few_shot, segment_types,
                              text_segment)
from gage_eval.tasks import TASK_FILE, TaskSpec, Template

GEN_KEYS = ("max_new_tokens", "stop", "temperature", "top_p", "top_k", "do_sample", "seed")


class RequestBuilder:
    """Renders a task's templates for each sample; one instance per task per run."""

    def __init__(self, spec: TaskSpec, metrics: Sequence[Any] = ()):
        req = spec.request
        where = f"{spec.folder / TASK_FILE}: request"
        self.kind: str = req["kind"]
        self.chat: bool = bool(req.get("chat", False))
        self.prompt = Template.from_file(spec.folder / req["prompt"]) if req.get("prompt") else None
        self.choice = Template(req.get("choice", "{{ option.content }}"), f"{where}.choice")
        self.delimiter: str = req.get("target_delimiter", " ")
        self.gen: dict = dict(req.get("generation") or {})
        # only a task with a metric that reads unconditioned scores (acc_mutual_info) pays for them
        self.unconditioned = any(getattr(m, "needs_unconditioned", False) for m in metrics)

    def variables(self, sample: Mapping[str, Any], messages: list[dict]) -> dict:
        return {
            "sample": sample,
            "messages": messages,
            "question": last_user_text(messages),
            "options": sample.get("options") or [],
            "metadata": sample.get("metadata") or {},
            "letters": LETTERS,
        }

    def choices(self, sample: Mapping[str, Any], variables: dict) -> list[str]:
        options = sample.get("options") or []
        if not options:
            raise ValueError("a log-likelihood task needs options on every sample; this one has none")
        return [self.choice.render(option=o, index=i, **variables) for i, o in enumerate(options)]

    def build(self, sample: Mapping[str, Any]) -> tuple[Request, dict]:
        """The request for one sample, and the rendered pieces to keep in predict_result."""
        messages = render_few_shot(sample)
        variables = self.variables(sample, messages)
        rendered = self.prompt.render(**variables) if self.prompt else None
        modalities = frozenset(segment_types(messages) or {"text"})
        sid = str(sample["id"])
        if self.kind == LOGLIKELIHOOD:
            context = rendered if rendered is not None else messages_text(messages)
            choices = self.choices(sample, variables)
            conts = tuple(self.delimiter + c for c in choices)
            return (Request(kind=LOGLIKELIHOOD, sample_id=sid, prompt=context, continuations=conts,
                            modalities=modalities,
                            unconditioned=unconditioned_context(sample) if self.unconditioned else None),
                    {"prompt": context, "choices": choices, "continuations": list(conts)})
        gen = dict(self.gen)
        for key in ("generation_params", "sampling_params"):
            gen.update({k: v for k, v in (sample.get(key) or {}).items() if k in GEN_KEYS})
        if isinstance(gen.get("stop"), str):
            gen["stop"] = [gen["stop"]]
        if self.chat:
            if rendered is not None:
                messages = _replace_last_user_text(messages, rendered)
            return (Request(kind=GENERATE, sample_id=sid, messages=tuple(messages), chat=True, gen=gen,
                            modalities=modalities),
                    {"prompt": rendered if rendered is not None else last_user_text(messages)})
        prompt = rendered if rendered is not None else messages_text(messages)
        return (Request(kind=GENERATE, sample_id=sid, prompt=prompt, messages=tuple(messages), gen=gen,
                        modalities=modalities),
                {"prompt": prompt})


def unconditioned_context(sample: Mapping[str, Any]) -> str:
    """The context for a sample's unconditioned scores: its ``unconditioned_input`` (a string, or
    messages as their text), else the empty context lm-eval uses for acc_mutual_info."""
    value = sample.get("unconditioned_input")
    if value is None:
        return ""
    return value if isinstance(value, str) else messages_text(value)


def _replace_last_user_text(messages: list[dict], text: str) -> list[dict]:
    """Put the rendered prompt in place of the last user message's text; media segments stay first."""
    out = list(messages)
    for i in range(len(out) - 1, -1, -1):
        if out[i].get("role") == "user":
            content = out[i].get("content")
            media = [s for s in content if isinstance(s, Mapping) and s.get("type") != "text"] \
                if isinstance(content, list) else []
            out[i] = {**out[i], "content": media + [text_segment(text)]}
            return out
    return out + [{"role": "user", "content": [text_segment(text)]}]


__all__ = ["RequestBuilder", "GENERATE", "LOGLIKELIHOOD"]
