"""``stream()`` of the transformers backend and of continuous batching: each output leaves the
moment its pass (log-likelihood), row (continuous batching) or batch (``model.generate``) is done,
every index exactly once, with what ``run()`` returns. The real SmolLM2 is loaded once here;
``hf_decode.decode_rows`` is checked on a tiny random Llama."""
from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from gage_eval.api.backend import GENERATE, LOGLIKELIHOOD, Request  # noqa: E402
from gage_plugins_builtin.backends import hf_decode  # noqa: E402


def _ll(prompt: str, *choices: str) -> Request:
    return Request(kind=LOGLIKELIHOOD, sample_id=prompt[:8], prompt=prompt, continuations=tuple(choices))


def _chat(text: str, **gen) -> Request:
    return Request(kind=GENERATE, sample_id=text[:8], chat=True, gen={"max_new_tokens": 16, **gen},
                   messages=({"role": "user", "content": [{"type": "text", "text": text}]},))


PIQA_LIKE = [
    _ll("Question: How do I ready a guinea pig cage for it's new occupants?\nAnswer:",
        " Provide the guinea pig with a cage full of a few inches of bedding made of ripped paper strips.",
        " Provide the guinea pig with a cage full of a few inches of bedding made of ripped jeans material."),
    _ll("Question: dresser\nAnswer:", " replace drawer with bobby pin ", " finish, woodgrain with  bobby pin "),
    _ll("The capital of France is", " Paris", " London", " a city in Europe with many museums"),
    _ll("Hello ", "world", "there, friend"),
    _ll("Question: To clean a cast iron pan,\nAnswer:", " scrub it with salt and oil.", " soak it overnight."),
]
MIXED = [
    PIQA_LIKE[0],
    _chat("Reply with the single word yes."),
    Request(kind=GENERATE, sample_id="img", prompt="see", modalities=frozenset({"text", "image_url"})),
    PIQA_LIKE[1],
    Request(kind=GENERATE, sample_id="plain", prompt="The three primary colours are", gen={"max_new_tokens": 8}),
    Request(kind=LOGLIKELIHOOD, sample_id="none", prompt="nothing to score"),
    *PIQA_LIKE[2:],
]


def _same(streamed, ran) -> None:
    assert streamed.error == ran.error
    assert streamed.text == ran.text
    if ran.loglikelihoods is None:
        assert streamed.loglikelihoods is None
    else:
        assert streamed.loglikelihoods == pytest.approx(ran.loglikelihoods, abs=1e-6)
        assert streamed.is_greedy == ran.is_greedy


@pytest.mark.slow
def test_stream_yields_every_index_once_with_run_outputs(smollm2):
    modes = []
    got = {}
    for i, out in smollm2.stream(MIXED):
        modes.append(torch.is_inference_mode_enabled())
        assert i not in got
        got[i] = out
    assert sorted(got) == list(range(len(MIXED)))
    assert not any(modes)  # the caller never runs in the model's inference mode
    ran = smollm2.run(MIXED)
    for i, out in got.items():
        _same(out, ran[i])
    assert "text-only" in got[2].error and "without continuations" in got[5].error
    assert all(got[i].loglikelihoods and got[i].error is None for i in (0, 3, 6, 7, 8))
    assert got[1].text and got[4].text


@pytest.mark.slow
def test_loglikelihoods_leave_one_packed_pass_at_a_time(smollm2, monkeypatch):
    passes = []
    score = smollm2._score_packed

    def counted(layouts, rows):
        passes.append(len(layouts))
        return score(layouts, rows)

    monkeypatch.setattr(smollm2, "_score_packed", counted)
    monkeypatch.setattr(smollm2, "batch_size", 2)  # two choices a pass: one question each
    stream = smollm2.stream(PIQA_LIKE[:4])
    first, out = next(stream)
    assert out.loglikelihoods and passes == [1]  # the first question is out before the second pass runs
    rest = dict(stream)
    assert sorted([first, *rest]) == [0, 1, 2, 3] and len(passes) == 4


@pytest.mark.slow
def test_generation_rows_leave_as_they_finish(smollm2, monkeypatch):
    """Continuous batching: the short answer is out while the long one is still decoding."""
    assert hf_decode.supported(smollm2.model)
    monkeypatch.setattr(smollm2, "_continuous", True)
    steps = []
    forward = smollm2.model.forward

    @functools.wraps(forward)
    def counted(*args, **kwargs):
        steps.append(1)
        return forward(*args, **kwargs)

    monkeypatch.setattr(smollm2.model, "forward", counted)
    reqs = [_chat("Write a long poem about the sea.", max_new_tokens=24),
            _chat("What is 2+2? Answer with a number only.", max_new_tokens=24)]
    order, at = [], []
    for i, out in smollm2.stream(reqs):
        order.append((i, out.finish_reason, out.output_tokens))
        at.append(len(steps))
    (i0, reason0, n0), (i1, reason1, n1) = order
    assert (i0, reason0) == (1, "stop") and (i1, reason1) == (0, "length") and n0 < n1 == 24
    assert at[0] < at[1]  # decoding went on after the first row was handed over


@pytest.mark.slow
def test_static_batches_leave_one_generate_call_at_a_time(smollm2, monkeypatch):
    calls = []
    batch = smollm2._generate_batch

    def counted(chunk, seqs, settings):
        calls.append(len(chunk))
        return batch(chunk, seqs, settings)

    monkeypatch.setattr(smollm2, "_continuous", False)
    monkeypatch.setattr(smollm2, "batch_size", 1)
    monkeypatch.setattr(smollm2, "_generate_batch", counted)
    reqs = [_chat("Reply with the single word yes.", max_new_tokens=4),
            Request(kind=GENERATE, sample_id="p", prompt="The three primary colours are", gen={"max_new_tokens": 4})]
    stream = smollm2.stream(reqs)
    first = next(stream)
    assert calls == [1]
    second = next(stream)
    assert calls == [1, 1] and {first[0], second[0]} == {0, 1}
    assert list(stream) == []


# -- hf_decode.decode_rows on a tiny random Llama -------------------------------------------------

@pytest.fixture(scope="module")
def tiny_llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                      bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8)
    return model


PROMPTS = [[1, 5, 9, 13], [1, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49], [1, 7], [1, 60, 61, 62, 63, 64]]
SETTINGS = {"max_new_tokens": 12, "stop": (), "do_sample": False, "temperature": None, "top_p": None,
            "top_k": None, "seed": 1234}


def _kwargs(eos=()):
    return dict(slots=4, pad_id=0, eos_ids=set(eos), decode_text=lambda t: " ".join(map(str, t)), device="cpu")


def test_decode_rows_yields_a_row_the_step_it_ends(tiny_llama, monkeypatch):
    alone = hf_decode.decode(tiny_llama, PROMPTS, SETTINGS, **_kwargs())
    eos = alone[1].tokens[3]  # the second prompt's fourth token ends it
    assert all(eos not in row.tokens[:4] for k, row in enumerate(alone) if k != 1)
    assert eos not in alone[1].tokens[:3]
    steps = []
    forward = tiny_llama.forward

    @functools.wraps(forward)
    def counted(*args, **kwargs):
        steps.append(torch.is_inference_mode_enabled())
        return forward(*args, **kwargs)

    monkeypatch.setattr(tiny_llama, "forward", counted)
    rows = hf_decode.decode_rows(tiny_llama, PROMPTS, SETTINGS, **_kwargs([eos]))
    first = next(rows)
    assert first.index == 1 and first.reason == "stop" and first.tokens == alone[1].tokens[:3]
    assert len(steps) == 4 and all(steps)  # the prefill and three steps, under inference mode
    assert not torch.is_inference_mode_enabled()
    rest = list(rows)
    assert sorted(r.index for r in rest) == [0, 2, 3] and len(steps) > 4
    cut = [t[:t.index(eos)] if eos in t else t for t in (alone[k].tokens for k in (0, 2, 3))]
    assert [r.tokens for r in sorted(rest, key=lambda r: r.index)] == cut


def test_decode_rows_closed_early_stops_decoding(tiny_llama, monkeypatch):
    alone = hf_decode.decode(tiny_llama, PROMPTS, SETTINGS, **_kwargs())
    steps = []
    forward = tiny_llama.forward
    monkeypatch.setattr(tiny_llama, "forward",
                        functools.wraps(forward)(lambda *a, **k: steps.append(1) or forward(*a, **k)))
    rows = hf_decode.decode_rows(tiny_llama, PROMPTS, SETTINGS, **_kwargs([alone[1].tokens[3]]))
    next(rows)
    rows.close()
    assert len(steps) == 4 and not torch.is_inference_mode_enabled()


# -- the vision backend: one generate batch at a time ------------------------------------------------

@pytest.fixture(scope="module")
def tiny_vision(smollm2_gguf, tmp_path_factory):
    pytest.importorskip("PIL")
    from gage_plugins_builtin.backends.hf_vision import VisionTransformersBackend

    here = str(Path(__file__).resolve().parents[1] / "multimodal")
    sys.path.insert(0, here)
    try:
        from tiny_vlm import build_tiny_llava
    finally:
        sys.path.remove(here)
    folder = build_tiny_llava(smollm2_gguf, tmp_path_factory.mktemp("tiny_vlm"))
    backend = VisionTransformersBackend(pretrained=str(folder), dtype="float32", device="cpu", batch_size=1)
    backend.open()
    yield backend
    backend.close()


def _vision(text: str) -> Request:
    return Request(kind=GENERATE, sample_id=text, chat=True, gen={"max_new_tokens": 4},
                   messages=({"role": "user", "content": [{"type": "text", "text": text}]},))


@pytest.mark.slow
def test_vision_backend_streams_one_batch_at_a_time(tiny_vision, monkeypatch):
    reqs = [_vision("No image."), Request(kind=LOGLIKELIHOOD, sample_id="ll", prompt="Q", continuations=(" A",)),
            _vision("Another, longer question here."),
            Request(kind=GENERATE, sample_id="au", chat=True, modalities=frozenset({"audio_url"}),
                    messages=({"role": "user", "content": [{"type": "audio_url", "audio_url": {"url": "a.wav"}}]},))]
    ran = tiny_vision.run(reqs)
    calls = []
    batch = tiny_vision._generate
    monkeypatch.setattr(tiny_vision, "_generate", lambda chunk: calls.append(len(chunk)) or batch(chunk))
    got, seen = {}, []
    for i, out in tiny_vision.stream(reqs):
        assert i not in got
        got[i] = out
        seen.append(len(calls))
    assert list(got) == [1, 3, 0, 2] and seen == [0, 0, 1, 2]  # refusals at once, then batch by batch
    assert [(o.text, o.error) for o in ran] == [(got[i].text, got[i].error) for i in range(4)]
