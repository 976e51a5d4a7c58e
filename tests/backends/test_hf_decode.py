"""Continuous batching (gage_plugins_builtin/backends/hf_decode.py) on a tiny random Llama.

The cache surgery (left-padding a joining row, dropping finished rows, trimming columns
that are padding everywhere) must leave every row's tokens exactly what it would be on
its own; these tests compare against each prompt decoded alone and against
``model.generate``.
"""
from __future__ import annotations

import contextlib

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from forward_wrap import wrapped_forward  # noqa: E402
from gage_plugins_builtin.backends import hf_decode  # noqa: E402


@pytest.fixture(scope="module")
def tiny_llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                      bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = transformers.LlamaForCausalLM(config).eval()
    # a sharper output layer, so greedy choices are not near-ties between float orderings
    with torch.no_grad():
        model.lm_head.weight.mul_(8)
    return model


PROMPTS = [[1, 5, 9, 13], [1, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49], [1, 7], [1, 60, 61, 62, 63, 64],
           [1, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34], [1, 88]]


def settings(max_new_tokens=12, **over):
    out = {"max_new_tokens": max_new_tokens, "stop": (), "do_sample": False, "temperature": None, "top_p": None,
           "top_k": None, "seed": 1234}
    out.update(over)
    return out


def run(model, prompts, slots, eos=(), **over):
    return hf_decode.decode(model, prompts, settings(**over), slots=slots, pad_id=0, eos_ids=set(eos),
                            decode_text=lambda t: " ".join(map(str, t)), device="cpu")


def test_tiny_llama_qualifies(tiny_llama):
    assert hf_decode.supported(tiny_llama)


def test_rows_joining_and_leaving_give_each_prompt_its_own_tokens(tiny_llama):
    alone = [run(tiny_llama, [p], slots=1)[0].tokens for p in PROMPTS]
    # prompts of different lengths and budgets: rows finish at different steps, others join
    for slots in (2, 3, 6):
        rows = run(tiny_llama, PROMPTS, slots=slots)
        assert [r.tokens for r in rows] == alone, slots
        assert all(r.reason == "length" and len(r.tokens) == 12 for r in rows)


def test_equals_model_generate_greedy(tiny_llama):
    for prompt in PROMPTS[:3]:
        ids = torch.tensor([prompt])
        ref = tiny_llama.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=9,
                                  do_sample=False, pad_token_id=0, eos_token_id=None)[0, len(prompt):].tolist()
        assert run(tiny_llama, [prompt], slots=1, max_new_tokens=9)[0].tokens == ref


def test_end_of_sequence_and_stop_strings_free_the_slot(tiny_llama):
    alone = [run(tiny_llama, [p], slots=1)[0].tokens for p in PROMPTS]
    eos = alone[1][3]  # the fourth token of the second prompt's answer ends it
    rows = run(tiny_llama, PROMPTS, slots=2, eos=(eos,))
    second = rows[1]
    assert second.reason == "stop" and second.tokens == alone[1][:alone[1].index(eos)]
    stop = str(alone[0][2])  # a stop string: the third token's text
    rows = run(tiny_llama, PROMPTS, slots=2, stop=(stop,))
    assert rows[0].reason == "stop" and str(rows[0].tokens[-1]) == stop
    assert len(rows[0].tokens) == alone[0].index(int(stop)) + 1


def test_seeded_sampling_is_reproducible(tiny_llama):
    kwargs = dict(do_sample=True, temperature=1.5, top_p=0.9, top_k=20, seed=7)
    first = [r.tokens for r in run(tiny_llama, PROMPTS, slots=3, **kwargs)]
    again = [r.tokens for r in run(tiny_llama, PROMPTS, slots=3, **kwargs)]
    other = [r.tokens for r in run(tiny_llama, PROMPTS, slots=3, **{**kwargs, "seed": 8})]
    assert first == again and first != other
    assert all(0 <= t < 97 for row in first for t in row)


SHARED = [1, 70, 71, 72, 73, 74, 75]  # a "system prompt" all of these start with
WITH_PREFIX = [SHARED + [5, 9], SHARED + [40, 41, 42, 43, 44], SHARED + [7], SHARED + [60, 61, 62]]


@contextlib.contextmanager
def forward_lengths(model):
    """``model.forward`` counting each call's input length (the list yielded); the model's own after."""
    calls = []

    def counting(forward, *args, **kwargs):
        calls.append(kwargs["input_ids"].shape[1])
        return forward(*args, **kwargs)

    with wrapped_forward(model, counting):
        yield calls


def test_common_prefix_is_run_once_and_changes_nothing(tiny_llama):
    assert hf_decode.common_prefix_length(WITH_PREFIX) == len(SHARED)
    assert hf_decode.common_prefix_length([SHARED, SHARED]) == len(SHARED) - 1  # each keeps a token of its own
    assert hf_decode.common_prefix_length([[1, 2, 3], [1, 2, 4]]) == 0  # too short to be worth a pass
    alone = [run(tiny_llama, [p], slots=1)[0].tokens for p in WITH_PREFIX]  # a single prompt: no prefix pass
    with forward_lengths(tiny_llama) as calls:
        for slots in (1, 2, 4):
            calls.clear()
            assert [r.tokens for r in run(tiny_llama, WITH_PREFIX, slots=slots)] == alone, slots
            assert calls[0] == len(SHARED)  # the shared beginning, once
            prefills = [n for n in calls[1:] if n > 1]
            assert prefills and max(prefills) <= 5  # then only each prompt's own tokens


def test_the_cache_goes_by_the_name_forward_declares(tiny_llama):
    """transformers 5.x renamed ``past_key_values`` to ``cache`` (the old name still works there, with a
    deprecation line on every run): the loop passes the name the installed version declares, and only it."""
    import inspect

    params = inspect.signature(type(tiny_llama).forward).parameters
    name = hf_decode.cache_keyword(tiny_llama)
    assert name == ("cache" if "cache" in params else "past_key_values")
    seen: set[str] = set()
    forward = tiny_llama.forward

    def recording(*args, **kwargs):
        seen.update(kwargs)
        return forward(*args, **kwargs)

    tiny_llama.forward = recording
    try:
        run(tiny_llama, WITH_PREFIX, slots=2, max_new_tokens=3)  # prefix pass, prefill, refill and steps
    finally:
        del tiny_llama.forward
    assert name in seen and not ({"cache", "past_key_values"} - {name}) & seen


def _fake(config=None, forward=None):
    class Model:
        pass

    if forward is not None:
        Model.forward = forward
    model = Model()
    model.config = config
    return model


def test_a_model_it_cannot_drive_is_named_with_the_reason():
    from types import SimpleNamespace as NS

    def full(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None):
        pass

    def no_cache(self, input_ids=None, attention_mask=None):
        pass

    llama = NS(model_type="llama")
    assert hf_decode.unsupported_reason(_fake(llama, full)) is None
    cases = {
        "the model has no config": _fake(None, full),
        "an encoder-decoder model": _fake(NS(is_encoder_decoder=True), full),
        "sliding-window attention": _fake(NS(model_type="mistral", sliding_window=4096), full),
        "layers that are not full attention (sliding_attention)":
            _fake(NS(model_type="gemma2", layer_types=["full_attention", "sliding_attention"]), full),
        "recurrent layers (mamba)": _fake(NS(model_type="mamba"), full),
        "its forward() takes no position_ids, cache (or past_key_values) argument": _fake(llama, no_cache),
    }
    for reason, model in cases.items():
        assert hf_decode.unsupported_reason(model) == reason
        assert not hf_decode.supported(model)
    # a text model inside a multimodal config is judged by its text part
    assert "sliding" in hf_decode.unsupported_reason(
        _fake(NS(text_config=NS(model_type="mistral", sliding_window=8)), full))


def test_the_watcher_sees_every_token_and_each_row_gets_its_share_of_the_time(tiny_llama):
    """``on_tokens`` counts each token as its model call ends (a batch whose rows all finish at
    the last step still moves); a row's share of the model's time is at most its wall time and
    the shares together at most the whole decode's (issue 28: latency_ms means the row)."""
    import time

    told: list[int] = []
    t0 = time.perf_counter()
    rows = list(hf_decode.decode_rows(tiny_llama, PROMPTS, settings(), slots=3, pad_id=0, eos_ids=set(),
                                      decode_text=lambda t: " ".join(map(str, t)), device="cpu",
                                      on_tokens=told.append))
    whole = time.perf_counter() - t0
    assert sum(told) == sum(len(r.tokens) for r in rows) == 12 * len(PROMPTS)
    assert len(told) > 12  # once per model call, not once per finished batch
    for row in rows:
        assert 0 < row.share <= row.ended - row.started
    assert sum(r.share for r in rows) <= whole


def test_a_prefix_store_carries_keys_and_values_to_the_next_call(tiny_llama):
    """A tool loop's next step sends the last prompt with the answer and the tool results added: with a
    store, only the added tokens are run, and every row's tokens are what it would get without one."""
    first_prompts = [SHARED + [5, 9], [1, 40, 41, 42, 43, 44], [1, 88]]
    store = hf_decode.PrefixStore(1 << 30)
    first = hf_decode.decode(tiny_llama, first_prompts, settings(max_new_tokens=6), slots=2, pad_id=0,
                             eos_ids=set(), decode_text=str, device="cpu", store=store)
    assert [r.tokens for r in first] == [run(tiny_llama, [p], slots=1, max_new_tokens=6)[0].tokens
                                         for p in first_prompts]
    assert len(store.entries) == 3 and store.hits == 0
    # the next step: each prompt goes on from its answer (all of it, or only part of it), plus a new row
    follow = [first_prompts[0] + first[0].tokens + [30, 31, 32], first_prompts[1] + first[1].tokens[:2] + [33],
              first_prompts[2] + first[2].tokens + [34, 35], [1, 60, 61, 62, 63, 64]]
    alone = [run(tiny_llama, [p], slots=1)[0].tokens for p in follow]
    with forward_lengths(tiny_llama) as calls:
        for slots in (1, 2, 4):
            calls.clear()
            again = hf_decode.PrefixStore(1 << 30)
            again.entries = list(store.entries)
            rows = hf_decode.decode(tiny_llama, follow, settings(), slots=slots, pad_id=0, eos_ids=set(),
                                    decode_text=str, device="cpu", store=again)
            assert [r.tokens for r in rows] == alone, slots
            assert again.hits == 3  # the new row had nothing to reuse
            prefills = [n for n in calls if n > 1]
            # only what the store lacks is run: the last answer token (never fed back) and the added tokens,
            # 4, 1 and 3 of them, and the new row's 6 (without a store: up to 17 tokens a row)
            assert max(prefills) == 6, (slots, prefills)
            if slots == 1:
                assert prefills == [4, 3, 6]


def test_the_prefix_store_keeps_to_its_budget_and_drops_what_a_longer_entry_covers(tiny_llama):
    probe = hf_decode.PrefixStore(1 << 30)
    hf_decode.decode(tiny_llama, [PROMPTS[1]], settings(max_new_tokens=2), slots=1, pad_id=0, eos_ids=set(),
                     decode_text=str, device="cpu", store=probe)
    size = probe.entries[0][2]  # 12 tokens (11 of the prompt, the first answer token)
    assert len(probe.entries[0][0]) == 12 and size > 0
    store = hf_decode.PrefixStore(2 * size)
    for prompt in (PROMPTS[1], PROMPTS[1] + [50, 51], PROMPTS[4], SHARED + [1, 2, 3, 4, 5, 6]):
        hf_decode.decode(tiny_llama, [prompt], settings(max_new_tokens=2), slots=1, pad_id=0, eos_ids=set(),
                         decode_text=str, device="cpu", store=store)
    kept = [entry[0] for entry in store.entries]
    # the second entry extends the first (which goes), the budget holds about two 12-token entries
    assert sum(e[2] for e in store.entries) <= 2 * size
    assert kept[-1][:len(SHARED)] == SHARED and not any(k[:11] == PROMPTS[1] and len(k) == 12 for k in kept)
    assert store.lookup([1, 40, 41])[0] == 0  # too short a beginning to reuse
    assert hf_decode.PrefixStore(10).entries == []
