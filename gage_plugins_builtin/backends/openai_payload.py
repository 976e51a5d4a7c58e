"""Request bodies for OpenAI-compatible endpoints, and what their replies mean.

Pure functions, no network: the backend calls them, the tests check them directly.
"""
from __future__ import annotations

import json

from typing import Any, Mapping, Sequence

from gage_eval.api import MEDIA_SEGMENTS, content_text, cut_at_stop as _cut_at_stop

_MEDIA = frozenset(MEDIA_SEGMENTS)


class BadReply(Exception):
    """A reply that is not what the endpoint promises (garbage JSON, missing fields): worth a retry."""


class Unscorable(Exception):
    """This request cannot be scored (an empty context or continuation): not worth a retry."""


class Unsupported(Unscorable):
    """The server answered, but cannot do what was asked (no echoed prompt log-probabilities)."""


# -- generation settings -------------------------------------------------------

def sampling_params(gen: Mapping[str, Any], default_max_tokens: int, run_seed: int | None) -> dict:
    """A task's generation settings (``Request.gen``) as OpenAI body fields.

    Greedy unless the task samples: ``do_sample: false`` or no temperature sends
    ``temperature: 0`` (OpenAI's default is 1). The run seed is sent when the task
    gives none, so sampling runs repeat where the server honours ``seed``.
    """
    body: dict[str, Any] = {"max_tokens": int(gen.get("max_new_tokens") or default_max_tokens)}
    sampling = gen.get("do_sample")
    temperature = gen.get("temperature")
    if sampling is False:
        body["temperature"] = 0.0
    elif temperature is not None:
        body["temperature"] = float(temperature)
    else:
        body["temperature"] = 1.0 if sampling else 0.0
    if sampling is not False and gen.get("top_p") is not None:
        body["top_p"] = float(gen["top_p"])
    if sampling is not False and gen.get("top_k"):
        body["top_k"] = int(gen["top_k"])  # not OpenAI's; vLLM, llama.cpp and TGI take it
    stop = gen.get("stop")
    if stop:
        body["stop"] = [stop] if isinstance(stop, str) else list(stop)
    seed = gen.get("seed", run_seed)
    if seed is not None:
        body["seed"] = int(seed)
    return body


def cut_at_stop(text: str, stop: Sequence[str] | None) -> str:
    """Servers stop at ``stop`` strings themselves; some include them in the text."""
    return _cut_at_stop(text, stop)[0]


# -- messages ------------------------------------------------------------------

def media_url(url: str, resize: Any = None) -> str:
    """An image reference as OpenAI takes it: http(s) and data URLs as they are, a local file as a data URL.

    With ``resize`` (:class:`~gage_plugins_builtin.multimodal.media.ImageResize`), a local or data
    image goes resized (a data URL; PNG when its size changed); http(s) URLs still go as they are."""
    if url.startswith(("http://", "https://")) or (url.startswith("data:") and resize is None):
        return url
    from gage_plugins_builtin.multimodal.media import data_url, image_bytes, resized_image_url

    try:
        if resize is not None:
            return resized_image_url(url, resize)
        return data_url(image_bytes(url))
    except OSError as exc:
        raise ValueError(f"cannot read the image {url!r}: {exc.strerror or exc}") from None
    except ValueError as exc:  # not found, unreadable
        raise ValueError(f"cannot read the image {url!r}: {exc}") from None


def chat_messages(messages: Sequence[Mapping[str, Any]], vision: bool, resize: Any = None,
                  default_prompt: str | None = None) -> list[dict]:
    """Sample v1 messages as the chat endpoint takes them.

    Text-only content goes as a plain string (every server takes that); with
    images, a list of ``text`` and ``image_url`` parts (local and data images resized by
    ``resize`` when given, :func:`media_url`). Other media are refused. A last user turn
    with images and no text gets ``default_prompt`` as a text part after them.
    """
    if default_prompt and vision:
        from gage_plugins_builtin.multimodal.media import with_default_prompt

        messages = with_default_prompt(messages, default_prompt)
    out = []
    for message in messages:
        role = message.get("role", "user")
        content = message.get("content")
        media = set() if isinstance(content, str) or content is None else \
            {seg.get("type", "text") for seg in content if isinstance(seg, Mapping)} & _MEDIA
        if not media:
            turn = {"role": role, "content": content_text(content)}
            # a trajectory's tool turns: the assistant's calls and each result's call id go as they are
            turn.update({k: message[k] for k in _TOOL_KEYS if message.get(k) is not None})
            out.append(turn)
            continue
        if media - {"image_url"}:
            raise ValueError(f"the openai backend sends text and images only, not {', '.join(sorted(media))}")
        if not vision:
            raise ValueError("this request has images but the model was not declared a vision model "
                             "(add vision=true to --model-args if it is)")
        parts: list[dict] = []
        for seg in content:
            if isinstance(seg, str):
                parts.append({"type": "text", "text": seg})
            elif seg.get("type", "text") == "text":
                parts.append({"type": "text", "text": str(seg.get("text", ""))})
            elif seg.get("type") == "image_url":
                ref = seg.get("image_url")
                url = ref.get("url") if isinstance(ref, Mapping) else ref
                if not url:
                    raise ValueError("an image_url segment has no url")
                image: dict[str, Any] = {"url": media_url(str(url), resize)}
                if isinstance(ref, Mapping) and ref.get("detail"):
                    image["detail"] = ref["detail"]
                parts.append({"type": "image_url", "image_url": image})
        out.append({"role": role, "content": parts})
    return out


def prompt_messages(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt}]


# -- replies -------------------------------------------------------------------

def first_choice(reply: Any) -> dict:
    if not isinstance(reply, Mapping):
        raise BadReply(f"expected a JSON object, got {type(reply).__name__}")
    if "error" in reply and not reply.get("choices"):
        raise BadReply(f"error object in a 200 reply: {str(reply['error'])[:10000]}")  # the poster cuts it
    choices = reply.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        raise BadReply("no choices in the reply")
    return choices[0]


def reply_text(reply: Any, chat: bool) -> str:
    choice = first_choice(reply)
    if chat:
        message = choice.get("message")
        if not isinstance(message, Mapping):
            raise BadReply("no message in the reply's first choice")
        text = message.get("content")
        if text is None and message.get("refusal"):
            text = ""
        if text is not None and not isinstance(text, str):
            text = content_text(text)
    else:
        text = choice.get("text")
    if text is None:
        text = ""
    if not isinstance(text, str):
        raise BadReply("the reply's text is not a string")
    return text


_TOOL_KEYS = ("tool_calls", "tool_call_id", "name")


def reply_tool_calls(choice: Mapping[str, Any]) -> list[dict] | None:
    """The first choice's ``message.tool_calls`` in Sample v1's shape (``arguments`` kept as the JSON
    text the server sent: a malformed one is the metric's to judge); None when there is none. A
    ``tool_calls`` that is not a list, or a call without a ``function`` object, is a call with no
    name whose arguments are what the server sent: a scored failure, never silently no call."""
    message = choice.get("message")
    calls = message.get("tool_calls") if isinstance(message, Mapping) else None
    if calls is None or calls == []:
        return None
    if not isinstance(calls, list):  # (a server's malformed tool_calls: one call without a name, kept as sent)
        calls = [calls]
    out = []
    for i, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping):  # nothing to call: no name, what was sent kept as the arguments
            sent = json.dumps(call, ensure_ascii=False, default=str)
            out.append({"id": f"call_{i}", "type": "function", "function": {"name": None, "arguments": sent}})
            continue
        args = fn.get("arguments")
        out.append({"id": str(call.get("id") or f"call_{i}"), "type": str(call.get("type") or "function"),
                    "function": {"name": fn.get("name"),
                                 "arguments": args if isinstance(args, str) else json.dumps(args)}})
    return out


def usage(reply: Mapping[str, Any]) -> tuple[int | None, int | None]:
    u = reply.get("usage") if isinstance(reply, Mapping) else None
    if not isinstance(u, Mapping):
        return None, None
    i, o = u.get("prompt_tokens"), u.get("completion_tokens")
    return (i if isinstance(i, int) else None), (o if isinstance(o, int) else None)


def continuation_logprob(reply: Any, context: str, continuation: str) -> tuple[float, bool | None]:
    """The continuation's log-probability from a ``/completions`` reply with ``echo: true``.

    The echoed tokens carry ``text_offset`` (character offsets into the prompt).
    As the shared rule (:mod:`gage_eval.api.loglikelihood`), the context's trailing whitespace
    belongs to the continuation: the continuation's tokens are those from the one holding
    the first character after the stripped context up to the end of the prompt; a token
    that straddles the boundary counts for the continuation. ``is_greedy`` is whether each
    of those tokens was the most likely one (None when the server gives no
    ``top_logprobs``).
    """
    choice = first_choice(reply)
    lp = choice.get("logprobs")
    if not isinstance(lp, Mapping) or not lp.get("token_logprobs"):
        raise Unsupported("the server returned no token log-probabilities for an echo=true completion")
    tokens, values, offsets = lp.get("tokens"), lp.get("token_logprobs"), lp.get("text_offset")
    if not isinstance(offsets, list) or not isinstance(values, list) or len(offsets) != len(values):
        raise Unsupported("the server's logprobs have no text_offset matching token_logprobs")
    full = len(context) + len(continuation)
    start_char = len(context.rstrip())
    echoed = [i for i, off in enumerate(offsets) if isinstance(off, int) and off < full]
    if not continuation:
        raise Unscorable("an empty continuation has no log-probability to score")
    if not echoed:
        raise Unsupported("the server did not echo the prompt's tokens (echo=true is not supported)")
    first = max((i for i in echoed if offsets[i] <= start_char), default=None)
    if first is None:
        raise BadReply("text_offset does not cover the start of the prompt")
    picked = list(range(first, echoed[-1] + 1))
    total = 0.0
    for i in picked:
        value = values[i]
        if value is None:
            raise Unscorable("the server gave no log-probability for the continuation's first token "
                             "(an empty context: give tokenizer=MODEL to condition it on the start token)")
        if not isinstance(value, (int, float)):
            raise BadReply(f"token_logprobs[{i}] is not a number")
        total += float(value)
    greedy: bool | None = None
    top = lp.get("top_logprobs")
    if isinstance(top, list) and isinstance(tokens, list) and len(top) == len(values):
        greedy = True
        for i in picked:
            alternatives = top[i]
            if not isinstance(alternatives, Mapping) or not alternatives:
                greedy = None
                break
            best = max(alternatives, key=lambda t: alternatives[t])
            if best != tokens[i] and alternatives[best] > float(values[i]) + 1e-6:
                greedy = False
    return total, greedy


def token_logprob(reply: Any, n_tokens: int, scored: range) -> tuple[float, bool | None]:
    """The sum of the echoed log-probabilities at the ``scored`` positions of a token-id prompt.

    For ``/completions`` with ``echo: true`` and the prompt sent as ``n_tokens`` token ids
    (split by :func:`gage_eval.api.loglikelihood.encode_pair`): position ``k`` of the echo is
    prompt token ``k``'s log-probability given the tokens before it.
    """
    choice = first_choice(reply)
    lp = choice.get("logprobs")
    if not isinstance(lp, Mapping) or not lp.get("token_logprobs"):
        raise Unsupported("the server returned no token log-probabilities for an echo=true completion")
    values = lp.get("token_logprobs")
    if not isinstance(values, list) or len(values) < n_tokens:
        raise Unsupported(f"the server echoed {len(values) if isinstance(values, list) else 0} token "
                          f"log-probabilities for a prompt of {n_tokens} tokens (echo=true is not supported)")
    total = 0.0
    for k in scored:
        if not isinstance(values[k], (int, float)):
            raise BadReply(f"token_logprobs[{k}] is not a number")
        total += float(values[k])
    greedy: bool | None = None
    top = lp.get("top_logprobs")
    if isinstance(top, list) and len(top) >= n_tokens:
        greedy = True
        for k in scored:
            alternatives = top[k]
            if not isinstance(alternatives, Mapping) or not alternatives:
                return total, None
            if max(alternatives.values()) > float(values[k]) + 1e-6:
                greedy = False
    return total, greedy
