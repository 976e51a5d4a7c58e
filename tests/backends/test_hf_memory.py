"""Generation batches sized by memory (gage_plugins_builtin/backends/hf_memory.py), the split of a
batch that runs out of memory, and prompts over the model's length (hf.py).

The SmolLM2 tests compare tokens (greedy) against the same prompts run without any plan: a plan
that admits fewer rows, and a batch split after an out-of-memory error raised by a wrapper around
the model's forward, must change which rows run together and nothing in any row's answer.
"""
from __future__ import annotations

import contextlib

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from forward_wrap import wrapped_forward  # noqa: E402
from gage_eval.api.backend import GENERATE, Request  # noqa: E402
from gage_plugins_builtin.backends import hf_memory  # noqa: E402
from gage_plugins_builtin.backends.hf_memory import MemoryPlan, ModelShape  # noqa: E402

# SmolLM2-135M's shape in float32
SMOL = ModelShape(layers=30, heads=9, kv_heads=3, head_dim=64, hidden=576, intermediate=1536, vocab=49152,
                  dtype_bytes=4)


def test_the_estimates_follow_the_model_shape():
    assert SMOL.kv_bytes_per_token == 46080  # 30 layers x (keys, values) x 3 heads x 64 x 4 bytes
    one = SMOL.forward_bytes(1, 1000, 1000)
    # scores and their softmax dominate a long prefill: 4 times the rows and the square of the width
    assert SMOL.forward_bytes(4, 1000, 1000) == 4 * one
    assert SMOL.forward_bytes(1, 2000, 2000) > 3 * one
    assert SMOL.forward_bytes(64, 5000, 5000) > 2 * 14 << 30  # the prefill that stopped the lent H100
    bf16 = ModelShape(**{**SMOL.__dict__, "dtype_bytes": 2})
    assert bf16.kv_bytes_per_token == SMOL.kv_bytes_per_token // 2


def test_a_plan_admits_rows_while_they_fit_and_never_refuses_a_lone_first_row():
    kv = SMOL.kv_bytes_per_token
    plan = MemoryPlan(SMOL, budget=6 << 30, rows=64, max_new_tokens=256)
    long_rows = [(0, 5000)] * 64
    take = plan.admit(0, 0, long_rows)
    assert 1 <= take < 64
    need = plan.kv_bytes(take, 5000) + SMOL.forward_bytes(take, 5000, 5000)
    assert need <= 6 << 30 < plan.kv_bytes(take + 1, 5000) + SMOL.forward_bytes(take + 1, 5000, 5000)
    assert plan.admit(0, 0, [(0, 200)] * 64) == 64  # short prompts: the row cap decides
    assert MemoryPlan(SMOL, budget=6 << 30, rows=8, max_new_tokens=256).admit(0, 0, [(0, 200)] * 64) == 8
    tiny = MemoryPlan(SMOL, budget=1, rows=64, max_new_tokens=256)
    assert tiny.admit(0, 0, long_rows) == 1  # the device says whether it fits
    assert tiny.admit(3, 100, long_rows) == 0  # rows are running: they decode on first
    # a reused prefix is counted in the keys and values, not prefilled again
    reuse = MemoryPlan(SMOL, budget=plan.kv_bytes(8, 5000) + SMOL.forward_bytes(8, 100, 5000), rows=64,
                       max_new_tokens=256)
    assert reuse.admit(0, 0, [(4900, 100)] * 16) == 8 and reuse.admit(0, 0, long_rows) < 8
    read = []

    def lazily():  # the prompts' prefix lookups cost time: only those the plan needs are read
        for k in range(64):
            read.append(k)
            yield 0, 5000
    assert plan.admit(0, 0, lazily()) == take and len(read) == take + 1
    assert plan.static_rows([5000] * 64) == take and plan.static_rows([]) == 0
    assert tiny.static_rows([5000, 10]) == 1
    assert kv * 5256 * 2 == plan.kv_bytes(2, 5000)


def test_the_prefix_store_default_is_sized_by_the_model_and_the_free_memory(monkeypatch):
    monkeypatch.setattr(hf_memory, "free_bytes", lambda device: 64 << 30)
    assert hf_memory.default_store_bytes(SMOL, "cpu", 16, 8192) == 16 * 8192 * 46080  # 6 GB: 16 rows of 8,192
    monkeypatch.setattr(hf_memory, "free_bytes", lambda device: 8 << 30)
    assert hf_memory.default_store_bytes(SMOL, "cpu", 16, 8192) == 2 << 30  # a quarter of what is free


def test_free_bytes_on_the_cpu_is_bytes_within_the_machine():
    import os

    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert 64 << 20 < hf_memory.free_bytes("cpu") <= total  # (kB read as bytes would be far below)


# -- the backend on the real SmolLM2 ---------------------------------------------------------------

QUESTIONS = ["What is the capital of France?",
             "Write a haiku about autumn leaves falling on a quiet pond in the evening light.",
             "List three prime numbers.",
             "Explain photosynthesis in one sentence for a child of seven who likes plants and asks why. " * 4,
             "Name a colour.",
             "Translate 'good morning' into French and say where the phrase is used and by whom. " * 2]


def _requests(max_new_tokens=12):
    return [Request(kind=GENERATE, sample_id=f"row{i}", messages=({"role": "user", "content": q},), chat=True,
                    gen={"max_new_tokens": max_new_tokens}) for i, q in enumerate(QUESTIONS)]


@contextlib.contextmanager
def failing_forward(model, too_big):
    """``model.forward`` raising torch's out-of-memory error where ``too_big(input_ids, attention_mask)``,
    as CUDA does for a batch over the card; the calls' (rows, width) are recorded (the list yielded)."""
    calls = []

    def guarded(forward, *args, **kwargs):
        ids = kwargs["input_ids"]
        calls.append(tuple(ids.shape))
        if too_big(ids, kwargs["attention_mask"]):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 14.12 GiB. GPU 0 has a total "
                                         "capacity of 79.18 GiB of which 8.68 GiB is free.")
        return forward(*args, **kwargs)

    with wrapped_forward(model, guarded):
        yield calls


@pytest.fixture
def smol(smollm2, monkeypatch):
    """The session's SmolLM2 with no prefix store (each test's prompts are run from scratch), a fresh
    out-of-memory scale and room for all six rows."""
    monkeypatch.setattr(smollm2, "prefix_store", None)
    monkeypatch.setattr(smollm2, "_oom_scale", 1.0)
    monkeypatch.setattr(smollm2, "batch_size", 6)
    return smollm2


def _prompt_tokens(backend, req):
    return len(backend.tokenizer(backend._prompt_text(req), add_special_tokens=False).input_ids)


def _texts(outs):
    assert all(o.error is None for o in outs), [o.error for o in outs]
    return [o.text for o in outs]


@pytest.mark.slow
def test_a_tight_memory_budget_prefills_fewer_rows_and_changes_no_token(smol, monkeypatch):
    with failing_forward(smol.model, lambda ids, mask: False) as calls:
        whole = smol.run(_requests())
    assert max(rows for rows, width in calls if width > 1) == 6  # the six prompts prefilled together
    monkeypatch.setattr(hf_memory, "free_bytes", lambda device: 40 << 20)  # a plan for 32 MB
    with failing_forward(smol.model, lambda ids, mask: False) as calls:
        tight = smol.run(_requests())
    shared, *prefills = [rows for rows, width in calls if width > 1]  # (the chat template's common start first)
    assert shared == 1 and max(prefills) < 6 and sum(prefills) == 6, prefills
    assert _texts(tight) == _texts(whole)
    assert [o.output_tokens for o in tight] == [o.output_tokens for o in whole]


@pytest.mark.slow
@pytest.mark.parametrize("continuous", [True, False])
def test_a_batch_out_of_memory_is_split_in_halves_with_the_same_tokens(smol, monkeypatch, continuous):
    monkeypatch.setattr(smol, "_continuous", continuous)
    whole = _texts(smol.run(_requests()))
    # any forward of more than two rows "runs out of memory"
    with failing_forward(smol.model, lambda ids, mask: ids.shape[0] > 2) as calls:
        split = smol.run(_requests())
    assert _texts(split) == whole
    assert any(rows > 2 for rows, _ in calls)  # it did run out, and went on in smaller batches
    assert smol._oom_scale < 1.0  # later calls plan for less


@pytest.mark.slow
def test_only_the_row_that_cannot_fit_alone_fails_with_one_line(smol):
    whole = _texts(smol.run(_requests()))
    reqs = _requests()
    longest = max(range(len(reqs)), key=lambda i: len(QUESTIONS[i]))
    width = _prompt_tokens(smol, reqs[longest])
    # a prefill as wide as that prompt (its own tokens after a shared prefix or not) fails; nothing else
    with failing_forward(smol.model, lambda ids, mask: ids.shape[1] > 1 and mask.shape[1] >= width):
        outs = smol.run(reqs)
    error = outs[longest].error
    assert error and "\n" not in error and "out of memory for this row alone" in error
    assert f"prompt {width:,} tokens + 12 new" in error and "Tried to allocate 14.12 GiB" in error
    assert "capacity" not in error  # torch's own advice is left out
    assert [o.text for k, o in enumerate(outs) if k != longest] == [t for k, t in enumerate(whole) if k != longest]


@pytest.mark.slow
def test_a_prompt_over_the_model_length_is_that_rows_error_not_a_silent_cut(smol, monkeypatch):
    whole = _texts(smol.run(_requests(max_new_tokens=8)))
    lengths = [_prompt_tokens(smol, req) for req in _requests()]
    limit = sorted(lengths)[-2]  # the longest prompt is one past what fits
    monkeypatch.setattr(smol, "max_length", limit + 8)
    outs = smol.run(_requests(max_new_tokens=8))
    longest = lengths.index(max(lengths))
    error = outs[longest].error
    assert error == (f"transformers backend: row row{longest}: the prompt is {max(lengths):,} tokens, over the "
                     f"{limit:,} that {smol.model_id} takes with 8 new tokens (max_length {limit + 8}); shorten "
                     f"the prompt, lower max_new_tokens, or cut it from the left as lm-eval does "
                     f"(--model-args truncate_prompts=left)")
    assert outs[longest].formatted_prompt  # the row keeps what it would have been sent
    assert [o.text for k, o in enumerate(outs) if k != longest] == [t for k, t in enumerate(whole) if k != longest]
    # opted in: cut from the left as lm-eval's generate_until, counted
    monkeypatch.setattr(smol, "truncate_prompts", "left")
    monkeypatch.setattr(smol, "truncated", 0, raising=False)
    cut = smol.run(_requests(max_new_tokens=8))
    assert cut[longest].error is None and cut[longest].input_tokens == limit and smol.truncated == 1
    assert smol.settings()["truncate_prompts"] == "left"


def test_truncate_prompts_is_checked(smollm2_gguf):
    from gage_eval.api.errors import GageError
    from gage_plugins_builtin.backends.hf import smollm2_backend

    with pytest.raises(GageError, match="truncate_prompts must be one of no, left"):
        smollm2_backend(truncate_prompts="right")
    assert "truncate_prompts" not in smollm2_backend().settings()
