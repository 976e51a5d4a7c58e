"""How much generation the transformers backend runs at once: batches sized by memory, not rows.

A prompt of 5,000 tokens costs far more than one of 200: its keys and values stay for every
decoding step, and while it is prefilled with others under a padding mask, sdpa materialises
the attention scores, ``rows x heads x new tokens x key positions`` floats a layer (the 14 GiB
allocation that stopped 64 BFCL multi-turn prompts on an 80 GB card). :class:`MemoryPlan`
estimates both from the model's shape and admits rows while they fit a budget taken from the
device's free memory (``torch.cuda.mem_get_info`` on CUDA, ``MemAvailable`` on the CPU); a
fixed ``batch_size`` only caps the rows. What the estimate misses is caught where it happens:
a batch that runs out of memory is split in halves and run again (``hf.py``), and the plan's
budget halves for the rest of the run.

Measured on the CPU (SmolLM2-135M, float32, torch 2.13, peak RSS of one prefill with a padding
mask, benchmarks/README.md): torch's CPU sdpa does not materialise the scores there (1 row of 4,096
tokens: 320 MiB against 180 MiB of keys and values), so the estimate is 2 to 5 times too high on
the CPU; it keeps the scores everywhere: CUDA's path did materialise them (the 14.12 GiB request was
64 rows' scores of one layer), and a CPU process out of memory is killed, not told.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

# share of the free memory a generation call may plan to use (the rest: the allocator's slack,
# other tensors, the estimate's error)
FREE_SHARE = 0.8
# the prefix store's default share of the free memory when the model opens (CUDA and CPU alike)
STORE_SHARE = 0.25
# rows decoding together when batch_size is auto (memory decides below this)
AUTO_ROWS_CPU = 16
AUTO_ROWS_GPU = 128


@dataclass(frozen=True)
class ModelShape:
    """What the estimates need from a decoder's config."""

    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    intermediate: int
    vocab: int
    dtype_bytes: int

    @classmethod
    def of(cls, model: Any) -> "ModelShape":
        config = getattr(model, "config", None)
        text = getattr(config, "text_config", None) or config
        hidden = int(getattr(text, "hidden_size", 0) or getattr(text, "n_embd", 0) or 1024)
        heads = int(getattr(text, "num_attention_heads", 0) or getattr(text, "n_head", 0) or 16)
        kv_heads = int(getattr(text, "num_key_value_heads", 0) or heads)
        head_dim = int(getattr(text, "head_dim", 0) or hidden // heads)
        try:
            dtype_bytes = next(model.parameters()).element_size()
        except (AttributeError, StopIteration, TypeError):
            dtype_bytes = 4
        return cls(layers=int(getattr(text, "num_hidden_layers", 0) or getattr(text, "n_layer", 0) or 24),
                   heads=heads, kv_heads=kv_heads, head_dim=head_dim, hidden=hidden,
                   intermediate=int(getattr(text, "intermediate_size", 0) or 4 * hidden),
                   vocab=int(getattr(text, "vocab_size", 0) or 32000), dtype_bytes=dtype_bytes)

    @property
    def kv_bytes_per_token(self) -> int:
        """Keys and values of one token in every layer."""
        return self.layers * 2 * self.kv_heads * self.head_dim * self.dtype_bytes

    def forward_bytes(self, rows: int, width: int, keys: int) -> int:
        """The passing peak of one forward of ``rows`` x ``width`` new tokens that attend to ``keys``
        positions (prefix and padding included), besides the keys and values it leaves: the scores
        and their softmax in one layer (float32 at least), the mask, the MLP's activations and the
        last position's logits."""
        score_bytes = max(self.dtype_bytes, 4)
        scores = 2 * rows * self.heads * width * keys * score_bytes
        mask = rows * width * keys * 4
        activations = rows * width * (3 * self.intermediate + 4 * self.hidden) * self.dtype_bytes
        return scores + mask + activations + rows * self.vocab * 4


def free_bytes(device: Any) -> int:
    """Memory generation may still take on ``device``: CUDA's free memory plus what torch's allocator
    holds unused; on the CPU, the kernel's MemAvailable (8 GiB when it cannot be read)."""
    text = str(device)
    if text.startswith("cuda"):
        import torch

        dev = torch.device(text)
        free, _ = torch.cuda.mem_get_info(dev)
        return int(free + torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev))
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30


def default_store_bytes(shape: ModelShape, device: Any, rows: int, max_length: int) -> int:
    """The prefix store's size when ``prefix_cache_mb`` is not given: room for the keys and values of
    ``rows`` conversations of ``max_length`` tokens, at most a quarter of the free memory."""
    return int(min(rows * max_length * shape.kv_bytes_per_token, STORE_SHARE * free_bytes(device)))


class MemoryPlan:
    """Which waiting prompts join a generation batch: rows (at most ``rows``) are admitted while the
    keys and values of every row in flight, at its full length, and the joining rows' prefill fit
    ``budget`` bytes. The first prompt always goes in alone if nothing else runs: whether it fits is
    for the device to say (an out-of-memory error, which the backend reports for that row)."""

    def __init__(self, shape: ModelShape, budget: int, rows: int, max_new_tokens: int):
        self.shape, self.budget, self.rows, self.max_new = shape, int(budget), int(rows), int(max_new_tokens)

    def kv_bytes(self, rows: int, width: int) -> int:
        """Keys and values of ``rows`` rows of ``width`` positions once each has its answer."""
        return rows * (width + self.max_new) * self.shape.kv_bytes_per_token

    def admit(self, running: int, width: int, joining: Iterable[tuple[int, int]]) -> int:
        """How many of ``joining`` (each (prefix tokens reused, own tokens), in order) to prefill now,
        next to ``running`` rows whose batch cache is ``width`` positions wide; ``joining`` is read
        only up to the first that does not fit."""
        take = 0
        head = own = 0
        for n, (prefix, tokens) in enumerate(joining, start=1):
            if running + n > self.rows:
                break
            head, own = max(head, prefix), max(own, tokens)
            rows_after = running + n
            cache_width = max(width, head + own)
            need = self.kv_bytes(rows_after, cache_width) + self.shape.forward_bytes(n, own, head + own)
            if need > self.budget and (running or n > 1):
                break
            take = n
        return take

    def static_rows(self, lengths: Sequence[int]) -> int:
        """How many of ``lengths`` (prompt tokens, longest first) ``model.generate`` takes in one batch:
        left-padded to the first, each row's prefill and its keys and values to the end (one at least)."""
        if not lengths:
            return 0
        width = lengths[0]
        take = 1
        for n in range(2, min(len(lengths), self.rows) + 1):
            need = self.kv_bytes(n, width) + self.shape.forward_bytes(n, width, width)
            if need > self.budget:
                break
            take = n
        return take
