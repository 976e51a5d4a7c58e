"""Continuous batching for the transformers backend: a decode loop that refills finished rows.

``model.generate`` runs a batch until its longest answer ends, so a row that stops early
idles (on SmolLM2 with 32-token answers, a third of the work at batch 8). This loop keeps
up to ``slots`` sequences decoding together on one key/value cache: a finished row leaves
the batch at once, and a waiting prompt is prefilled and joins it. Rows of different
lengths share the cache left-padded; the attention mask hides the padding and each row
carries its own position ids, so a row's tokens are computed as they would be alone.

Prompts usually share a beginning (a chat template's system prompt, few-shot examples):
the tokens all of a call's prompts start with are run once, and each prompt's prefill
runs only its own tokens against a copy of that prefix's keys and values. Across calls, a
:class:`PrefixStore` keeps the keys and values of finished rows (prompt and answer): a later
prompt that starts with the same tokens (the next step of a tool loop, whose prompt is the
last one with the reply and the tool results added) prefills only what follows them.

Only for decoder-only models whose cache is a plain ``DynamicCache`` (full attention in
every layer); :func:`unsupported_reason` says why a model does not qualify, and the backend
falls back to ``model.generate`` otherwise. The cache argument goes by the name the installed
transformers declares: ``cache`` (5.x renamed it) or ``past_key_values`` (before).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

from gage_eval.api import cut_at_stop


def generation_settings(gen: Mapping[str, Any] | None, default_max_new_tokens: int, seed: int) -> dict:
    """A request's generation settings, normalised (hashable values, so requests group by them)."""
    gen = gen or {}
    stop = gen.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    temperature = float(gen.get("temperature", 0.0) or 0.0)
    do_sample = bool(gen.get("do_sample", temperature > 0))
    return {"max_new_tokens": int(gen.get("max_new_tokens") or default_max_new_tokens),
            "stop": tuple(s for s in stop if s), "do_sample": do_sample,
            "temperature": temperature if do_sample else None,
            "top_p": float(gen["top_p"]) if do_sample and gen.get("top_p") is not None else None,
            "top_k": int(gen["top_k"]) if do_sample and gen.get("top_k") is not None else None,
            "seed": int(gen.get("seed", seed))}


def generate_kwargs(settings: Mapping[str, Any]) -> dict:
    """``model.generate`` arguments for :func:`generation_settings` (stop strings are cut afterwards)."""
    kwargs: dict[str, Any] = {"max_new_tokens": settings["max_new_tokens"], "do_sample": settings["do_sample"]}
    if settings["do_sample"]:
        kwargs["temperature"] = settings["temperature"] or 1.0
        if settings["top_p"] is not None:
            kwargs["top_p"] = settings["top_p"]
        if settings["top_k"] is not None:
            kwargs["top_k"] = settings["top_k"]
    else:
        kwargs.update(temperature=None, top_p=None, top_k=None)
    return kwargs


# a common beginning shorter than this is not worth a pass of its own
MIN_SHARED_PREFIX = 4


@dataclass
class Row:
    """One sequence being decoded."""

    index: int  # the caller's index of this prompt
    prompt_len: int
    started: float
    tokens: list[int] = field(default_factory=list)
    reason: str | None = None  # "stop" or "length" once finished
    ended: float = 0.0
    share: float = 0.0  # seconds: each model call's time divided among the rows it ran for


# model types whose layers keep a recurrent state, not keys and values
RECURRENT = ("mamba", "mamba2", "rwkv", "recurrent_gemma", "falcon_mamba", "jamba", "zamba", "zamba2", "bamba",
             "lfm2")


def _forward_params(model: Any) -> Mapping[str, Any] | None:
    """The arguments of the model class's forward (a wrapper set on the instance, such as a hook
    that passes ``**kwargs`` on, would hide their names)."""
    import inspect

    try:
        return inspect.signature(getattr(type(model), "forward", None) or model.forward).parameters
    except (TypeError, ValueError, AttributeError):
        return None


def cache_keyword(model: Any) -> str | None:
    """The argument ``model.forward`` takes its key/value cache by: ``cache`` where transformers
    renamed it (5.x; the old name still works there but logs a deprecation line), else
    ``past_key_values``; None when it takes neither."""
    params = _forward_params(model) or {}
    return next((name for name in ("cache", "past_key_values") if name in params), None)


def unsupported_reason(model: Any) -> str | None:
    """Why :func:`decode` cannot drive this model (the backend then uses ``model.generate``); None if it can."""
    config = getattr(model, "config", None)
    if config is None:
        return "the model has no config"
    if getattr(config, "is_encoder_decoder", False):
        return "an encoder-decoder model"
    text = getattr(config, "text_config", None) or config
    layer_types = getattr(text, "layer_types", None)
    if layer_types is not None:
        other = sorted({str(t) for t in layer_types if t != "full_attention"})
        if other:
            return f"layers that are not full attention ({', '.join(other)})"
    elif getattr(text, "sliding_window", None) and getattr(text, "use_sliding_window", True):
        return "sliding-window attention"
    model_type = getattr(text, "model_type", "")
    if model_type in RECURRENT:
        return f"recurrent layers ({model_type})"
    params = _forward_params(model)
    if params is None:
        return "its forward() signature cannot be read"
    missing = [name for name in ("position_ids", "attention_mask") if name not in params]
    if cache_keyword(model) is None:
        missing.append("cache (or past_key_values)")
    if missing:
        return f"its forward() takes no {', '.join(missing)} argument"
    return None


def supported(model: Any) -> bool:
    """Whether :func:`decode` can drive this model (else use ``model.generate``)."""
    return unsupported_reason(model) is None


def _layers(cache: Any) -> list:
    layers = getattr(cache, "layers", None)
    if not layers or any(type(layer).__name__ != "DynamicLayer" for layer in layers):
        raise TypeError(f"continuous batching needs a DynamicCache of full-attention layers, not {type(cache)}")
    return layers


def _left_pad(cache: Any, n: int) -> None:
    import torch

    if n <= 0:
        return
    for layer in _layers(cache):
        for name in ("keys", "values"):
            t = getattr(layer, name)
            pad = torch.zeros((*t.shape[:2], n, t.shape[3]), dtype=t.dtype, device=t.device)
            setattr(layer, name, torch.cat([pad, t], dim=2))


def _append(cache: Any, other: Any) -> None:
    import torch

    for layer, extra in zip(_layers(cache), _layers(other)):
        layer.keys = torch.cat([layer.keys, extra.keys], dim=0)
        layer.values = torch.cat([layer.values, extra.values], dim=0)


def common_prefix(seqs: Sequence[list[int]]) -> list[int]:
    """The tokens all sequences start with, leaving each at least one token of its own.

    Shared by log-likelihood (a question's choices) and generation (a call's prompts).
    """
    if len(seqs) < 2:
        return []
    limit = min(len(s) for s in seqs) - 1
    first = seqs[0]
    n = 0
    while n < limit and all(s[n] == first[n] for s in seqs):
        n += 1
    return first[:n]


def common_prefix_length(prompts: Sequence[list[int]]) -> int:
    """How many tokens all prompts start with, when that is worth a pass of its own (else 0)."""
    n = len(common_prefix(prompts))
    return n if n >= MIN_SHARED_PREFIX else 0


def _expand(cache: Any, rows: int) -> Any:
    """A cache with ``rows`` copies of a one-row cache (views: the cache only ever concatenates)."""
    import copy

    out = copy.copy(cache)
    out.layers = []
    for layer in _layers(cache):
        twin = copy.copy(layer)
        twin.keys = layer.keys.expand(rows, -1, -1, -1)
        twin.values = layer.values.expand(rows, -1, -1, -1)
        out.layers.append(twin)
    return out


def _select(cache: Any, keep: Any, trim: int) -> None:
    for layer in _layers(cache):
        layer.keys = layer.keys[keep, :, trim:]
        layer.values = layer.values[keep, :, trim:]


class PrefixStore:
    """Keys and values of earlier sequences, kept for prompts that start the same way (up to
    ``budget_bytes`` of tensors; the least recently used go first).

    An entry is the tokens of one sequence and a one-row cache of exactly those tokens. A
    prompt reuses the longest beginning it shares with an entry (keys and values of a position
    depend only on the tokens up to it), always leaving itself at least one token to run. The
    tokens are compared as numpy arrays: a store of a hundred 5,000-token conversations that
    share their tool lists is searched for each of 200 prompts at every step of a tool loop.
    """

    def __init__(self, budget_bytes: int):
        self.budget = int(budget_bytes)
        # (tokens, cache, bytes, the tokens as an array), most recent last
        self.entries: list[tuple[list[int], Any, int, Any]] = []
        self.hits = self.reused_tokens = 0

    @property
    def used(self) -> int:
        """Bytes of keys and values held now."""
        return sum(e[2] for e in self.entries)

    def lookup(self, prompt: Sequence[list[int]] | list[int], use: bool = True) -> tuple[int, Any]:
        """(n, cache): the cache's first n positions are the prompt's first n tokens; (0, None) if none is
        at least :data:`MIN_SHARED_PREFIX` long. ``use=False`` only looks (for planning a batch): the
        entry is not marked as used and no hit is counted."""
        import numpy as np

        best, found = 0, None
        limit = len(prompt) - 1
        wanted = np.asarray(prompt[:limit], dtype=np.int64)
        for k, entry in enumerate(self.entries):
            top = min(limit, len(entry[0]))
            if top <= best:
                continue
            differ = np.flatnonzero(entry[3][:top] != wanted[:top])
            n = int(differ[0]) if differ.size else top
            if n > best:
                best, found = n, k
        if found is None or best < MIN_SHARED_PREFIX:
            return 0, None
        if not use:
            return best, self.entries[found][1]
        entry = self.entries.pop(found)
        self.entries.append(entry)
        self.hits, self.reused_tokens = self.hits + 1, self.reused_tokens + best
        return best, entry[1]

    def put(self, tokens: list[int], cache: Any) -> None:
        """Keep a one-row cache of ``tokens`` (an entry it extends goes: it reuses more)."""
        size = sum(t.numel() * t.element_size() for layer in _layers(cache) for t in (layer.keys, layer.values))
        if len(tokens) < MIN_SHARED_PREFIX or size > self.budget:
            return
        self.entries = [e for e in self.entries if not (len(e[0]) <= len(tokens) and tokens[:len(e[0])] == e[0])]
        import numpy as np

        self.entries.append((list(tokens), cache, size, np.asarray(tokens, dtype=np.int64)))
        while self.used > self.budget:
            self.entries.pop(0)


def _row_cache(cache: Any, row: int, columns: Any) -> Any:
    """A one-row copy of row ``row`` of a batch cache, at ``columns`` (its real tokens)."""
    import copy

    out = copy.copy(cache)
    out.layers = []
    for layer in _layers(cache):
        twin = copy.copy(layer)
        twin.keys = layer.keys[row:row + 1, :, columns].clone()
        twin.values = layer.values[row:row + 1, :, columns].clone()
        out.layers.append(twin)
    return out


def _prefix_batch(prefixes: Sequence[tuple[int, Any]]) -> tuple[int, Any]:
    """(width, cache): each row's prefix (the first n positions of a one-row cache) in one batch cache,
    left-padded to the longest; views of one cache when every row has the same prefix."""
    import copy

    import torch

    width = max(n for n, _ in prefixes)
    template = next(c for n, c in prefixes if n == width)
    same = all(n == width and c is template for n, c in prefixes)
    out = copy.copy(template)
    out.layers = []
    for i, layer in enumerate(_layers(template)):
        twin = copy.copy(layer)
        for name in ("keys", "values"):
            if same:
                t = getattr(layer, name)[:, :, :width].expand(len(prefixes), -1, -1, -1)
            else:
                ref = getattr(layer, name)
                parts = []
                for n, c in prefixes:
                    own = getattr(_layers(c)[i], name)[:, :, :n] if n else ref[:, :, :0]
                    parts.append(torch.nn.functional.pad(own, (0, 0, width - n, 0)))
                t = torch.cat(parts, dim=0)
            setattr(twin, name, t)
        out.layers.append(twin)
    return width, out


class Chooser:
    """Next token from the last position's logits: greedy, or sampled with a seeded generator."""

    def __init__(self, settings: dict, device: Any):
        import torch

        self.settings = settings
        self.generator = None
        if settings["do_sample"]:
            self.generator = torch.Generator(device=device)
            self.generator.manual_seed(int(settings["seed"]))

    def __call__(self, logits: Any) -> Any:
        import torch

        s = self.settings
        if not s["do_sample"]:
            return logits.argmax(dim=-1)
        logits = logits.float() / max(float(s["temperature"] or 1.0), 1e-6)
        if s["top_k"]:
            kth = torch.topk(logits, min(int(s["top_k"]), logits.shape[-1]), dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if s["top_p"] is not None and s["top_p"] < 1.0:
            ordered, order = torch.sort(logits, descending=True, dim=-1)
            probs = torch.softmax(ordered, dim=-1)
            drop = probs.cumsum(dim=-1) - probs > float(s["top_p"])  # keep the smallest set reaching top_p
            ordered = ordered.masked_fill(drop, float("-inf"))
            logits = torch.full_like(logits, float("-inf")).scatter(-1, order, ordered)
        probs = torch.softmax(logits, dim=-1)
        return torch.multinomial(probs, 1, generator=self.generator)[:, 0]


def decode(model: Any, prompts: Sequence[list[int]], settings: dict, *, slots: int, pad_id: int,
           eos_ids: set[int], decode_text: Callable[[list[int]], str], device: Any,
           store: PrefixStore | None = None, plan: Any = None) -> list[Row]:
    """Generate for every prompt (token ids, already cut to fit), ``slots`` rows at a time.

    Returns one finished :class:`Row` per prompt, in the prompts' order. Rows stop at an
    end-of-sequence token, at a stop string (``settings["stop"]``), or at
    ``settings["max_new_tokens"]``.
    """
    done = {row.index: row for row in decode_rows(model, prompts, settings, slots=slots, pad_id=pad_id,
                                                  eos_ids=eos_ids, decode_text=decode_text, device=device,
                                                  store=store, plan=plan)}
    return [done[i] for i in range(len(prompts))]


def decode_rows(model: Any, prompts: Sequence[list[int]], settings: dict, *, slots: int, pad_id: int,
                eos_ids: set[int], decode_text: Callable[[list[int]], str], device: Any,
                on_tokens: Callable[[int], None] | None = None, store: PrefixStore | None = None,
                plan: Any = None) -> Iterator[Row]:
    """:func:`decode`'s rows, each yielded the moment it finishes (``row.index`` names its prompt).
    ``on_tokens(n)`` is told after each model call how many tokens it chose (one per row in it),
    so a watcher sees a batch move before its rows finish; ``Row.share`` is the row's part of
    the model's time (each call's time divided by the rows in it), not the batch's wall time.
    With a ``store``, a prompt starts from the longest beginning the store holds (or the call's
    shared prefix, if longer), and each finished row's keys and values go into it. With a ``plan``
    (:class:`hf_memory.MemoryPlan`), free slots are filled only while the rows in flight and the
    joining rows' prefill fit its memory budget (else the running rows decode on first).

    The model runs under ``torch.inference_mode`` one step at a time: the mode is off while
    the caller holds a row, and a caller that stops early leaves nothing behind.
    """
    import torch

    from transformers import DynamicCache

    cache_arg = cache_keyword(model)
    if cache_arg is None:
        raise TypeError(f"continuous batching: {type(model).__name__}.forward takes no key/value cache")
    params = _forward_params(model) or {}
    max_new = int(settings["max_new_tokens"])
    stops = tuple(settings["stop"] or ())
    # the prefill needs the last position's logits only (not width x vocabulary of them)
    last_only = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
    choose = Chooser(settings, device)
    waiting = list(range(len(prompts)))
    waiting.reverse()  # pop() takes the first
    rows: list[Row] = []
    cache = None
    mask = None  # [rows, cache length + 1]: 1 where a real token is (or the coming one)
    positions = None  # [rows]: the position of each row's next input token
    last = None  # [rows]: each row's last chosen token, the next step's input

    def finished(row: Row) -> bool:
        token = row.tokens[-1]
        if token in eos_ids:
            row.tokens.pop()
            row.reason = "stop"
        elif stops and cut_at_stop(decode_text(row.tokens), stops)[1]:
            row.reason = "stop"
        elif len(row.tokens) >= max_new:
            row.reason = "length"
        if row.reason is None:
            return False
        row.ended = time.perf_counter()
        return True

    shared = common_prefix_length(prompts)
    prefix_cache = None
    if shared:
        prefix_cache = DynamicCache()
        with torch.inference_mode():
            model(input_ids=torch.tensor([prompts[0][:shared]], device=device),
                  attention_mask=torch.ones((1, shared), dtype=torch.long, device=device),
                  position_ids=torch.arange(shared, device=device)[None], use_cache=True,
                  **{cache_arg: prefix_cache}, **last_only)

    def prefix_of(i: int, use: bool = True) -> tuple[int, Any]:
        n, found = store.lookup(prompts[i], use) if store is not None else (0, None)
        return (n, found) if n > shared else (shared, prefix_cache)

    blocked = False  # the plan admitted no one: nothing changes that until a row finishes

    def joining() -> int:
        """How many waiting prompts to prefill now (0: the running rows decode first)."""
        nonlocal blocked
        count = min(slots - len(rows), len(waiting))
        if count <= 0 or blocked:
            return 0
        if plan is None:
            return count
        def sizes() -> Iterator[tuple[int, int]]:  # (looked up only as far as the plan reads)
            for j in range(count):
                n = prefix_of(waiting[-1 - j], use=False)[0]
                yield n, len(prompts[waiting[-1 - j]]) - n
        take = plan.admit(len(rows), mask.shape[1] if mask is not None else 0, sizes())
        blocked = take == 0
        return take
    while waiting or rows:
        ended: list[Row] = []
        with torch.inference_mode():
            take = joining()
            if take > 0:
                # refill: prefill waiting prompts into free slots (left-padded batch of their own)
                batch = [waiting.pop() for _ in range(take)]
                started = time.perf_counter()
                prefixes = [prefix_of(i) for i in batch]
                head, new_cache = _prefix_batch(prefixes) if any(n for n, _ in prefixes) else (0, DynamicCache())
                own = [prompts[i][n:] for i, (n, _) in zip(batch, prefixes)]
                width = max(len(t) for t in own)
                ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
                new_mask = torch.zeros((len(batch), head + width), dtype=torch.long)
                pos = torch.zeros((len(batch), width), dtype=torch.long)
                for r, (tokens, (n, _)) in enumerate(zip(own, prefixes)):  # [padding][prefix][padding][own tokens]
                    ids[r, width - len(tokens):] = torch.tensor(tokens, dtype=torch.long)
                    new_mask[r, head - n:head] = 1
                    new_mask[r, head + width - len(tokens):] = 1
                    pos[r, width - len(tokens):] = torch.arange(n, n + len(tokens))
                out = model(input_ids=ids.to(device), attention_mask=new_mask.to(device),
                            position_ids=pos.to(device), use_cache=True, **{cache_arg: new_cache}, **last_only)
                first = choose(out.logits[:, -1, :]).to("cpu")
                took, stepped = (time.perf_counter() - started) / len(batch), len(batch)
                new_rows = [Row(index=i, prompt_len=len(prompts[i]), started=started, tokens=[int(t)], share=took)
                            for i, t in zip(batch, first.tolist())]
                new_pos = new_mask.sum(dim=1)
                if cache is None:
                    cache, mask, positions, last, rows = new_cache, new_mask, new_pos, first, new_rows
                else:
                    have, come = mask.shape[1], new_mask.shape[1]
                    if come < have:
                        _left_pad(new_cache, have - come)
                        new_mask = torch.cat([torch.zeros((len(batch), have - come), dtype=torch.long), new_mask], 1)
                    elif have < come:
                        _left_pad(cache, come - have)
                        mask = torch.cat([torch.zeros((len(rows), come - have), dtype=torch.long), mask], 1)
                    _append(cache, new_cache)
                    mask = torch.cat([mask, new_mask], 0)
                    positions = torch.cat([positions, new_pos])
                    last = torch.cat([last, first])
                    rows = rows + new_rows
                keep = [r for r, row in enumerate(rows) if not finished(row)]
                ended = [row for row in rows if row.reason is not None]
            else:
                # one decoding step for every row
                t_step = time.perf_counter()
                step_mask = torch.cat([mask, torch.ones((len(rows), 1), dtype=torch.long)], dim=1)
                out = model(input_ids=last[:, None].to(device), attention_mask=step_mask.to(device),
                            position_ids=positions[:, None].to(device), use_cache=True, **{cache_arg: cache})
                chosen = choose(out.logits[:, -1, :]).to("cpu")
                mask, positions, last = step_mask, positions + 1, chosen
                took, stepped = (time.perf_counter() - t_step) / len(rows), len(rows)
                keep = []
                for r, (row, token) in enumerate(zip(rows, chosen.tolist())):
                    row.share += took
                    row.tokens.append(int(token))
                    if finished(row):
                        ended.append(row)
                    else:
                        keep.append(r)
            if store is not None:
                for r, row in enumerate(rows):
                    if row.reason is not None:  # its prompt and answer so far, for a later prompt that goes on from them
                        columns = mask[r].nonzero()[:, 0].to(_layers(cache)[0].keys.device)
                        store.put((list(prompts[row.index]) + row.tokens)[:len(columns)],
                                  _row_cache(cache, r, columns))
            if len(keep) < len(rows):
                cache, mask, positions, last, rows = _drop(cache, mask, positions, last, rows, keep)
                blocked = False
        if on_tokens is not None:
            on_tokens(stepped)
        yield from ended


def _drop(cache, mask, positions, last, rows, keep):
    """Keep only the rows ``keep``; cut the cache's leading columns that are padding in all of them."""
    import torch

    if not keep:
        return None, None, None, None, []
    index = torch.tensor(keep, dtype=torch.long)
    mask = mask[index]
    trim = int(mask.argmax(dim=1).min())  # the first real column of the row that starts earliest
    _select(cache, index.to(_layers(cache)[0].keys.device), trim)
    return cache, mask[:, trim:], positions[index], last[index], [rows[k] for k in keep]
