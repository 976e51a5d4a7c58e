"""How a (context, continuation) pair becomes tokens for log-likelihood scoring: one rule for every backend.

The rule is lm-evaluation-harness 0.4's, so scores compare with it token for token:

- A non-empty context's trailing whitespace (``str.rstrip``: spaces, newlines, tabs) moves
  to the front of the continuation: "Answer: " + "Paris" is scored as "Answer:" + " Paris".
- The whole text is encoded once with the tokenizer's own special tokens (a BOS where the
  tokenizer adds one); the context tokens are the (stripped) context encoded alone, and the
  continuation tokens are what the whole encoding holds after that many tokens.
- An empty context (or one of whitespace only, whose whitespace has moved) is the model's
  prefix token: its BOS token, or its EOS token where it has none. The continuation is then
  encoded without special tokens; if it already starts with the prefix token, that token is
  the context instead.
- The scored positions are the continuation's: token ``k`` of ``context + continuation`` is
  scored by its log-probability given tokens ``0..k-1``, for every ``k >= len(context)``.

Backends call :func:`encode_pair` (or :func:`encode_choices` for the choices of one question,
which share their context) with an ``encode(text, add_special_tokens)`` function;
:func:`tokenizer_encoder` makes one from a Hugging Face tokenizer.

A whole text scored for perplexity (a ``loglikelihood_rolling`` request) is encoded once
(``encode(text, None)``) and cut by :func:`rolling_windows` into windows of at most
``max_seq_len`` scored tokens, lm-eval 0.4.13's rolling windows with one token of context.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

Encode = Callable[[str, "bool | None"], list]
"""``encode(text, add_special_tokens)`` -> token ids; ``None`` means the tokenizer's default."""


@dataclass(frozen=True)
class TokenPair:
    """A pair split into tokens: ``context`` is never empty, ``continuation`` is what is scored."""

    context: list[int]
    continuation: list[int]

    @property
    def tokens(self) -> list[int]:
        return self.context + self.continuation

    @property
    def scored(self) -> range:
        """Positions in :attr:`tokens` whose log-probability (given the tokens before) is summed."""
        return range(len(self.context), len(self.context) + len(self.continuation))

    def window(self, limit: int | None) -> tuple[list[int], int]:
        """(the last ``limit`` tokens, the index of the first scored one among them).

        Left truncation as lm-eval's vLLM and API models do; at least one token is kept before
        the first scored one, so a continuation longer than the window loses its first tokens.
        """
        tokens = self.tokens
        if limit is None or len(tokens) <= limit:
            return tokens, len(self.context)
        kept = tokens[-limit:]
        return kept, max(1, len(self.context) - (len(tokens) - limit))


def split_whitespace(context: str, continuation: str) -> tuple[str, str]:
    """The context's trailing whitespace moved to the front of the continuation."""
    head = context.rstrip()
    return head, context[len(head):] + continuation


def encode_pair(context: str, continuation: str, encode: Encode, prefix_token_id: int | None) -> TokenPair:
    """Split one pair into tokens by the module's rule.

    Raises ValueError for a continuation that adds no token, or an empty context without a
    prefix token (a tokenizer with neither BOS nor EOS).
    """
    head, cont = split_whitespace(context, continuation)
    if head:
        ctx = list(encode(head, None))
        whole = list(encode(head + cont, None))
        pair = TokenPair(ctx, whole[len(ctx):])
    else:
        tokens = list(encode(cont, False))
        if prefix_token_id is None:
            raise ValueError("an empty context needs the model's BOS or EOS token, and this tokenizer has neither")
        pair = TokenPair(tokens[:1], tokens[1:]) if tokens and tokens[0] == prefix_token_id \
            else TokenPair([prefix_token_id], tokens)
    if not pair.continuation:
        raise ValueError(f"the continuation {continuation!r} adds no token to the context")
    if not pair.context:
        raise ValueError(f"the context {context!r} encodes to no token")
    return pair


def encode_choices(context: str, continuations: Sequence[str], encode: Encode,
                   prefix_token_id: int | None) -> tuple[list[int], list[list[int]]]:
    """The choices of one question: (their shared context tokens, each continuation's tokens).

    The same tokens as :func:`encode_pair` for each choice, with the context encoded once.
    """
    head = context.rstrip()
    if head:
        ctx = list(encode(head, None))
        conts = [list(encode(head + split_whitespace(context, c)[1], None))[len(ctx):] for c in continuations]
        for c, tokens in zip(continuations, conts):
            if not tokens:
                raise ValueError(f"the continuation {c!r} adds no token to the context")
        if not ctx:
            raise ValueError(f"the context {context!r} encodes to no token")
        return ctx, conts
    pairs = [encode_pair(context, c, encode, prefix_token_id) for c in continuations]
    return pairs[0].context if pairs else [], [p.continuation for p in pairs]  # each context is [prefix]


def rolling_windows(tokens: Sequence[int], prefix_token_id: int | None, max_seq_len: int) -> list[TokenPair]:
    """A text's tokens as the windows that score each of them exactly once (lm-eval's
    ``get_rolling_token_windows`` with ``context_len=1``, made disjoint).

    The first window scores the first ``max_seq_len`` tokens after the prefix token; each
    later one scores the next ``max_seq_len`` tokens after the one token before them; the
    last, shorter one is given as many tokens before it as fill ``max_seq_len`` inputs. Every
    window is at most ``max_seq_len + 1`` tokens, its last one only predicted. The summed
    log-probabilities of the windows' continuations are the text's log-likelihood.
    """
    if max_seq_len < 1:
        raise ValueError(f"a rolling window needs max_seq_len >= 1, not {max_seq_len}")
    tokens = list(tokens)
    if not tokens:
        return []
    if prefix_token_id is None:
        raise ValueError("a rolling log-likelihood starts from the model's BOS or EOS token, and this tokenizer "
                         "has neither")
    first = min(max_seq_len, len(tokens))
    windows = [TokenPair([prefix_token_id], tokens[:first])]
    done = first
    while done < len(tokens):
        n = min(len(tokens) - done, max_seq_len)
        end = done + n
        start = max(end - max_seq_len - 1, 0)
        windows.append(TokenPair(tokens[start:done], tokens[done:end]))
        done = end
    return windows


def prefix_token_id(tokenizer: Any) -> int | None:
    """The token an empty context is conditioned on: BOS, else EOS (None when there is neither)."""
    bos = getattr(tokenizer, "bos_token_id", None)
    return bos if bos is not None else getattr(tokenizer, "eos_token_id", None)


def tokenizer_encoder(tokenizer: Any, add_bos_token: bool | None = None) -> Encode:
    """``encode(text, add_special_tokens)`` for a Hugging Face tokenizer, as lm-eval encodes.

    ``add_special_tokens=None`` keeps the tokenizer's default unless ``add_bos_token`` says
    otherwise, and adds none to a text that already starts with the prefix token's text.
    """
    prefix = prefix_token_id(tokenizer)
    prefix_text = tokenizer.decode(prefix) if prefix is not None else ""

    def encode(text: str, add_special_tokens: bool | None = None) -> list[int]:
        if not text:
            return []
        kwargs: dict[str, Any] = {}
        if add_special_tokens is not None:
            kwargs["add_special_tokens"] = add_special_tokens
        else:
            if add_bos_token is not None:
                kwargs["add_special_tokens"] = add_bos_token
            if prefix_text and text.startswith(prefix_text):
                kwargs["add_special_tokens"] = False
        return list(tokenizer.encode(text, **kwargs))

    return encode


def chat_context(messages: Sequence[Any], tokenizer: Any) -> str:
    """A conversation as the context of a log-likelihood request: the tokenizer's chat template
    with the generation prompt added (lm-eval's ``--apply_chat_template`` for multiple-choice
    tasks); the choices are then scored as what the assistant says first."""
    from gage_eval.api.sample import text_chat

    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise ValueError("this log-likelihood request goes through the chat template (--apply-chat-template "
                         "or request.chat), and the model's tokenizer has none")
    return tokenizer.apply_chat_template(text_chat(messages), tokenize=False, add_generation_prompt=True)


def request_context(request: Any, tokenizer: Any = None) -> str:
    """The context text of a log-likelihood :class:`~gage_eval.api.backend.Request`: its ``prompt``, or
    for a chat request (``chat`` true, the conversation in ``messages``) :func:`chat_context`.
    Every backend scores this string with :func:`encode_pair` / :func:`encode_choices`."""
    if getattr(request, "chat", False):
        return chat_context(request.messages or (), tokenizer)
    return request.prompt or ""
