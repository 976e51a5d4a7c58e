"""``stream()`` of the dummy backend (the engine tests' workhorse): one output per request, in
order, each after its ``delay_ms``, equal to what ``run()`` returns."""
from __future__ import annotations

from gage_eval.api.backend import GENERATE, LOGLIKELIHOOD, Request
from gage_plugins_builtin.backends.dummy import DummyBackend

REQUESTS = [Request(kind=GENERATE, sample_id=str(k), prompt=f"question {k}") for k in range(5)] + \
    [Request(kind=LOGLIKELIHOOD, sample_id="ll", prompt="ctx", continuations=(" a", " bb"))]


def test_stream_gives_each_request_in_order_and_equals_run():
    streamed = list(DummyBackend(fail_every=3).stream(REQUESTS))
    ran = DummyBackend(fail_every=3).run(REQUESTS)
    assert [i for i, _ in streamed] == list(range(len(REQUESTS)))
    assert [(o.text, o.loglikelihoods, o.error) for _, o in streamed] == \
        [(o.text, o.loglikelihoods, o.error) for o in ran]
    assert [o.error is not None for o in ran] == [False, False, True, False, False, True]


def test_each_output_leaves_after_its_own_delay(monkeypatch):
    slept = []
    monkeypatch.setattr("gage_plugins_builtin.backends.dummy.time.sleep", slept.append)
    stream = DummyBackend(delay_ms=40).stream(REQUESTS)
    next(stream)
    assert slept == [0.04]  # one request's delay, not the whole batch's
    assert len(list(stream)) == len(REQUESTS) - 1 and slept == [0.04] * len(REQUESTS)


def test_fixed_text_given_as_a_number_is_text():
    """--model-args response=fixed,text=7 arrives as the int 7: the answer is still the text "7"."""
    from gage_eval.api import Request
    from gage_plugins_builtin.backends.dummy import DummyBackend

    out, = DummyBackend(response="fixed", text=7).run([Request(kind="generate", sample_id="a", prompt="q")])
    assert out.error is None and out.text == "7"


def test_a_delay_that_cannot_be_slept_is_refused_when_built():
    # delay_ms=-5 or 1e999 was taken, then every row errored at inference ('sleep length must be
    # non-negative', 'timestamp out of range'): one usage line instead, before any row
    import pytest

    from gage_eval.api.errors import GageError

    for value in ("-5", "1e999", "nan"):
        with pytest.raises(GageError, match="dummy backend: delay_ms must be"):
            DummyBackend(delay_ms=value)
    assert DummyBackend(delay_ms="0").delay_s == 0
