"""Whole texts scored for perplexity (``loglikelihood_rolling``) on the transformers backend.

Each text is encoded once and cut into lm-eval 0.4.13's rolling windows of the model's
``max_length`` (:func:`gage_eval.api.loglikelihood.rolling_windows`: as lm-eval's ``hf`` model,
a window is at most ``max_length`` inputs). Windows of every text of the batch are scored
together: sorted by length, right-padded into passes of at most the backend's token budget
(``batch_size`` windows a pass when it is fixed, as lm-eval counts its batch), and a text's
log-likelihood is the sum over its windows once the last of them is scored.
"""
from __future__ import annotations

import time
from typing import Any, Iterator, Sequence

from gage_eval.api import ModelOutput, Request, loglikelihood


def text_windows(backend: Any, text: str) -> list[loglikelihood.TokenPair]:
    """The windows of one text for this backend's tokenizer and ``max_length``."""
    tokens = backend._encoder()(text, None)
    return loglikelihood.rolling_windows(tokens, backend.prefix_token_id(), backend.max_length)


def passes(widths: Sequence[int], budget: int, batch_size: int | None) -> list[list[int]]:
    """Window indexes in passes, longest first: each pass at most ``batch_size`` windows, or
    (``batch_size`` None) as many as fit ``budget`` tokens at the pass's widest (one at least)."""
    order = sorted(range(len(widths)), key=lambda i: -widths[i])
    out: list[list[int]] = []
    for i in order:
        if out:
            size = len(out[-1]) + 1
            fits = size <= batch_size if batch_size is not None else size * widths[out[-1][0]] <= budget
            if fits:
                out[-1].append(i)
                continue
        out.append([i])
    return out


def score_windows(backend: Any, windows: Sequence[loglikelihood.TokenPair]) -> list[tuple[float, bool]]:
    """(summed log-probability, all greedy) of each window's continuation, in one right-padded pass."""
    import torch

    seqs = [w.tokens[:-1] for w in windows]  # the last token is only predicted
    width = max(map(len, seqs))
    pad = backend.tokenizer.pad_token_id or 0
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    pick, targets, owner = [], [], []
    for r, (seq, w) in enumerate(zip(seqs, windows)):
        ids[r, :len(seq)] = torch.tensor(seq)
        mask[r, :len(seq)] = 1
        first = len(w.context) - 1  # position whose next-token distribution scores the first continuation token
        pick.extend(r * width + first + k for k in range(len(w.continuation)))
        targets.extend(w.continuation)
        owner.extend([r] * len(w.continuation))
    dev = backend.device
    states, is_hidden = backend._hidden_or_logits(input_ids=ids.to(dev), attention_mask=mask.to(dev),
                                                  use_cache=False)
    flat = states.reshape(len(seqs) * width, states.shape[-1])
    lps, hits = backend._token_scores(flat[torch.tensor(pick, device=dev)], torch.tensor(targets, device=dev),
                                      is_hidden)
    sums, greedy = [0.0] * len(seqs), [True] * len(seqs)
    for r, lp, hit in zip(owner, lps, hits):
        sums[r] += lp
        greedy[r] = greedy[r] and hit
    return list(zip(sums, greedy))


def rolling(backend: Any, requests: Sequence[Request]) -> Iterator[tuple[int, ModelOutput]]:
    """(index, output) per request: failures first, then each text as soon as its last window is scored."""
    import torch

    windows: list[loglikelihood.TokenPair] = []
    owner: list[int] = []
    left: dict[int, int] = {}
    for i, req in enumerate(requests):
        try:
            mine = text_windows(backend, req.continuations[0] if req.continuations else "")
        except Exception as exc:  # noqa: BLE001 - a tokenizer failure belongs to this request
            yield i, ModelOutput(error=f"transformers backend: tokenization failed: {exc}")
            continue
        if not mine:
            yield i, ModelOutput(error="transformers backend: the text encodes to no tokens")
            continue
        windows.extend(mine)
        owner.extend([i] * len(mine))
        left[i] = len(mine)
    totals = {i: [0.0, True, 0, 0.0, n] for i, n in left.items()}  # ll, greedy, tokens, ms, windows
    for group in passes([len(w.tokens) - 1 for w in windows], backend._tokens_budget(), backend.batch_size):
        t0 = time.perf_counter()
        with torch.inference_mode():
            scored = score_windows(backend, [windows[k] for k in group])
        ms = (time.perf_counter() - t0) * 1000
        for k, (ll, greedy) in zip(group, scored):
            i = owner[k]
            total = totals[i]
            total[0] += ll
            total[1] = total[1] and greedy
            total[2] += len(windows[k].continuation)
            total[3] += ms
            left[i] -= 1
            if not left[i]:
                yield i, ModelOutput(loglikelihoods=[total[0]], is_greedy=[total[1]], input_tokens=total[2],
                                     latency_ms=total[3], raw={"windows": total[4]})
