"""One context/continuation rule for every backend (gage_eval.api.loglikelihood), checked on a toy
tokenizer and on the real SmolLM2 against a direct computation with the model."""
from __future__ import annotations

import math

import pytest

from gage_eval.api.backend import LOGLIKELIHOOD, Request
from gage_eval.api.loglikelihood import (TokenPair, encode_choices, encode_pair, prefix_token_id, split_whitespace,
                                     tokenizer_encoder)


class WordTokenizer:
    """Greedy longest match over a small vocabulary, a leading space merging into a word as in BPE.

    ``bos`` is added in front when ``add_special_tokens`` is true (the default here), so the
    rule's "tokenizer's own special tokens" is visible.
    """

    VOCAB = ["<s>", "</s>", "Answer", ":", " x", " y", "x", "y", " ", "\n", "Q", " yes", "yes", "z"]
    bos_token_id = 0
    eos_token_id = 1

    def __init__(self, add_bos: bool = True):
        self.add_bos = add_bos

    def encode(self, text: str, add_special_tokens: bool | None = None) -> list[int]:
        ids = [0] if (self.add_bos if add_special_tokens is None else add_special_tokens) else []
        at = 0
        while at < len(text):
            best = max((w for w in self.VOCAB if text.startswith(w, at)), key=len)
            ids.append(self.VOCAB.index(best))
            at += len(best)
        return ids

    def decode(self, ids) -> str:
        return "".join(self.VOCAB[i] for i in ([ids] if isinstance(ids, int) else ids))


V = WordTokenizer.VOCAB.index


def _plain(text, add_special_tokens=None):
    return WordTokenizer(add_bos=False).encode(text, add_special_tokens)


# -- the rule on a toy tokenizer -------------------------------------------------------------

def test_trailing_space_moves_to_the_continuation():
    pair = encode_pair("Answer: ", "x", _plain, 0)
    # "Answer: x" encodes as Answer : " x"; the context is "Answer:" and " x" is scored whole
    assert pair == TokenPair([V("Answer"), V(":")], [V(" x")])
    assert pair.tokens == _plain("Answer: x") and list(pair.scored) == [2]
    # the naive split (context encoded with its space) would score nothing of the answer here
    assert len(_plain("Answer: ")) == len(_plain("Answer: x"))


def test_trailing_newline_and_several_spaces_move_too():
    assert split_whitespace("Q:\n", "yes") == ("Q:", "\nyes")
    assert encode_pair("Q:\n", "yes", _plain, 0) == TokenPair([V("Q"), V(":")], [V("\n"), V("yes")])
    assert split_whitespace("Answer:  ", "x") == ("Answer:", "  x")
    assert encode_pair("Answer:  ", "x", _plain, 0).continuation == [V(" "), V(" x")]


def test_context_without_trailing_whitespace_is_split_at_its_token_count():
    pair = encode_pair("Answer:", " yes", _plain, 0)
    assert pair == TokenPair([V("Answer"), V(":")], [V(" yes")])


def test_tokenizer_default_bos_is_kept_on_both_encodings():
    tok = WordTokenizer(add_bos=True)
    pair = encode_pair("Answer: ", "x", tokenizer_encoder(tok), prefix_token_id(tok))
    assert pair == TokenPair([0, V("Answer"), V(":")], [V(" x")])
    assert list(pair.scored) == [3]


def test_empty_context_is_the_prefix_token():
    tok = WordTokenizer(add_bos=True)
    encode = tokenizer_encoder(tok)
    # the continuation is encoded without special tokens, after the BOS as its context
    assert encode_pair("", "x", encode, 0) == TokenPair([0], [V("x")])
    assert encode_pair("", " x y", encode, 0) == TokenPair([0], [V(" x"), V(" y")])
    # no BOS: EOS is the prefix
    assert prefix_token_id(type("T", (), {"bos_token_id": None, "eos_token_id": 7})()) == 7
    assert encode_pair("", "x", encode, 7) == TokenPair([7], [V("x")])
    # a continuation that starts with the prefix token: that token is the context
    assert encode_pair("", "<s>x", encode, 0) == TokenPair([0], [V("x")])
    # a whitespace-only context has nothing left once its whitespace moves: the prefix is the context
    assert encode_pair("  ", "x", encode, 0) == TokenPair([0], [V(" "), V(" x")])


def test_pairs_that_cannot_be_scored_are_value_errors():
    with pytest.raises(ValueError, match="adds no token"):
        encode_pair("Answer:", "", _plain, 0)
    with pytest.raises(ValueError, match="neither"):
        encode_pair("", "x", _plain, None)


def test_choices_share_the_context_and_equal_single_pairs():
    for context in ("Answer: ", "Q:\n", "Answer:", "", " "):
        conts = ["x", " y", "yes", "\nz"]
        ctx, tokens = encode_choices(context, conts, _plain, 0)
        for cont, toks in zip(conts, tokens):
            assert encode_pair(context, cont, _plain, 0) == TokenPair(ctx, toks), (context, cont)
    # an empty context: the prefix token, whether or not a choice starts with it
    assert encode_choices("", ["<s>x", "x"], _plain, 0) == ([0], [[V("x")], [V("x")]])


def test_window_truncates_from_the_left_keeping_a_token_before_the_scored_ones():
    pair = TokenPair([1, 2, 3, 4], [5, 6])
    assert pair.window(None) == ([1, 2, 3, 4, 5, 6], 4)
    assert pair.window(6) == ([1, 2, 3, 4, 5, 6], 4)
    assert pair.window(4) == ([3, 4, 5, 6], 2)
    assert pair.window(2) == ([5, 6], 1)  # the continuation loses its first token: never none kept before


def test_tokenizer_encoder_follows_add_bos_and_a_text_already_starting_with_bos():
    tok = WordTokenizer(add_bos=True)
    assert tokenizer_encoder(tok)("x", None) == [0, V("x")]
    assert tokenizer_encoder(tok)("<s>x", None) == [0, V("x")]  # no second BOS
    assert tokenizer_encoder(tok, add_bos_token=False)("x", None) == [V("x")]
    assert tokenizer_encoder(tok)("x", False) == [V("x")]
    assert tokenizer_encoder(tok)("", None) == []


# -- the real SmolLM2: transformers backend equals a direct computation ------------------------

CASES = [
    ("Answer: ", ("Provide", "Provide the guinea pig with a cage full of bedding.")),  # trailing space
    ("Question: Is the sky blue?\nAnswer:\n", ("Yes", "No, it is green today.")),  # trailing newline
    ("", ("The", " A quick brown fox jumps")),  # empty context; one- and multi-token answers
    ("The capital of France is", (" Paris", " a city in Europe with many museums")),
    ("Say it twice:  ", ("hello", "hello hello")),  # two trailing spaces
]


def _direct(backend, context: str, continuation: str) -> float:
    """log p(continuation | context) straight from the model: the tokens are built here by the
    rule's definition, and the model sees them whole (no packing, no cache)."""
    import torch

    tok = backend.tokenizer
    head = context.rstrip()
    cont_text = context[len(head):] + continuation
    if head:
        ctx = tok.encode(head)
        tokens = tok.encode(head + cont_text)
    else:
        ctx = [tok.bos_token_id]
        tokens = ctx + tok.encode(cont_text, add_special_tokens=False)
    assert tokens[:len(ctx)] == ctx
    with torch.inference_mode():
        logits = backend.model(torch.tensor([tokens])).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    return sum(float(logp[k - 1, tokens[k]]) for k in range(len(ctx), len(tokens)))


@pytest.mark.slow
def test_transformers_loglikelihoods_equal_a_direct_computation(smollm2):
    reqs = [Request(kind=LOGLIKELIHOOD, sample_id=str(i), prompt=c, continuations=conts)
            for i, (c, conts) in enumerate(CASES)]
    outs = smollm2.run(reqs)
    for (context, conts), out in zip(CASES, outs):
        assert out.error is None, out.error
        for cont, value in zip(conts, out.loglikelihoods):
            expected = _direct(smollm2, context, cont)
            assert abs(value - expected) < 1e-4, (context, cont, value, expected)
            assert math.isfinite(value) and value < 0


@pytest.mark.slow
def test_smollm2_pairs_keep_every_answer_token(smollm2):
    tok = smollm2.tokenizer
    encode, prefix = tokenizer_encoder(tok), prefix_token_id(tok)
    pair = encode_pair("Answer: ", "Provide", encode, prefix)
    assert tok.decode(pair.continuation) == " Provide" and len(pair.continuation) == 1  # a one-token answer
    pair = encode_pair("Answer:\n", "Yes", encode, prefix)
    assert tok.decode(pair.continuation) == "\nYes"
    pair = encode_pair("", "The", encode, prefix)
    assert pair.context == [tok.bos_token_id] and tok.decode(pair.continuation) == "The"
    # "Answer: " + "x" and "Answer:" + " x" are the same tokens, so the same score
    a, b = smollm2.run([Request(kind=LOGLIKELIHOOD, sample_id="a", prompt="Answer: ", continuations=("Provide",)),
                        Request(kind=LOGLIKELIHOOD, sample_id="b", prompt="Answer:", continuations=(" Provide",))])
    assert a.loglikelihoods == pytest.approx(b.loglikelihoods, abs=1e-5)
    # an empty context conditions a one-token answer on BOS: a real log-probability, not 0
    (empty,) = smollm2.run([Request(kind=LOGLIKELIHOOD, sample_id="e", prompt="", continuations=("The",))])
    assert empty.loglikelihoods[0] < -0.01


# -- the openai backend's echo path (no network: the poster is replaced) ----------------------

def _echo(prompt_tokens: list[int], values: list) -> dict:
    """A vLLM-style /completions echo reply: one entry per prompt token, then the generated one."""
    vals = list(values) + [-0.5]
    return {"choices": [{"index": 0, "text": "", "logprobs": {
        "tokens": [str(t) for t in prompt_tokens] + ["g"], "token_logprobs": vals,
        "top_logprobs": [None if v is None else {"best": max(v, -0.05)} for v in vals],
        "text_offset": list(range(len(vals)))}}], "usage": {"prompt_tokens": len(prompt_tokens)}}


def echo_poster(backend, values) -> list[dict]:
    """Replace the openai backend's poster: each body posted is kept (the list returned) and answered
    with an _echo reply of its prompt tokens, ``values(prompt)`` their log-probabilities."""
    sent = []

    class Reply:
        attempts = 1

        def __init__(self, value):
            self.value = value

    async def post(slots, url, body, parse, gate=None):
        sent.append(body)
        return Reply(parse(_echo(body["prompt"], values(body["prompt"]))))

    backend.poster.post = post
    return sent


def test_token_logprob_sums_the_scored_positions():
    from gage_plugins_builtin.backends import openai_payload as payload

    reply = _echo([0, 1, 2, 3], [None, -1.0, -2.0, -0.01])
    assert payload.token_logprob(reply, 4, range(2, 4)) == (pytest.approx(-2.01), False)
    assert payload.token_logprob(reply, 4, range(3, 4)) == (pytest.approx(-0.01), True)
    with pytest.raises(payload.Unsupported, match="echoed 5 token"):
        payload.token_logprob(reply, 7, range(2, 7))


def test_continuation_logprob_text_path_moves_trailing_whitespace():
    from gage_plugins_builtin.backends import openai_payload as payload

    # "Q:\nyes" as Q : \n yes; the context "Q:\n" keeps its newline for the continuation
    reply = {"choices": [{"logprobs": {"tokens": ["Q", ":", "\n", "yes"], "token_logprobs": [None, -1.0, -2.0, -3.0],
                                       "text_offset": [0, 1, 2, 3]}}]}
    assert payload.continuation_logprob(reply, "Q:\n", "yes")[0] == pytest.approx(-5.0)
    assert payload.continuation_logprob(reply, "Q:", "\nyes")[0] == pytest.approx(-5.0)


@pytest.mark.parametrize("context,continuation,tokens,scored", [
    ("Answer: ", "x", [V("Answer"), V(":"), V(" x")], [2]),
    ("", "x y", [0, V("x"), V(" y")], [1, 2]),
])
def test_openai_backend_with_tokenizer_sends_the_shared_split_as_token_ids(context, continuation, tokens, scored):
    pytest.importorskip("aiohttp")
    from gage_plugins_builtin.backends.openai_backend import openai_backend

    backend = openai_backend(base_url="http://127.0.0.1:9/v1", model="m", tokenizer="toy", max_retries=0)
    backend._encoder = (tokenizer_encoder(WordTokenizer(add_bos=False)), 0)
    sent = echo_poster(backend, lambda prompt: [None] + [-(k + 1) / 10 for k in range(1, len(prompt))])
    try:
        (out,) = backend.run([Request(kind=LOGLIKELIHOOD, sample_id="s", prompt=context,
                                      continuations=(continuation,))])
    finally:
        backend.close()
    assert out.error is None, out.error
    assert sent[0]["prompt"] == tokens and sent[0]["echo"] is True
    assert out.loglikelihoods == pytest.approx([sum(-(k + 1) / 10 for k in scored)])
    assert backend.settings()["tokenizer"] == "toy"
