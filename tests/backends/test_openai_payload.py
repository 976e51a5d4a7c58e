"""The openai backend's pure parts: request bodies, reply parsing, arguments, retry timing."""
from __future__ import annotations

import base64
import sys
import time

import pytest

from gage_eval.api.errors import GageError
from gage_plugins_builtin.backends import openai_payload as payload
from gage_plugins_builtin.backends.openai_backend import normalize_base_url, openai_backend
from gage_plugins_builtin.backends.openai_http import Poster, merge_stream, retry_after_seconds


def test_sampling_params_greedy_by_default_and_maps_task_settings():
    assert payload.sampling_params({}, 256, None) == {"max_tokens": 256, "temperature": 0.0}
    body = payload.sampling_params({"max_new_tokens": 12, "stop": "\n", "temperature": 0.7, "top_p": 0.9,
                                    "top_k": 40, "seed": 7}, 256, 1234)
    assert body == {"max_tokens": 12, "temperature": 0.7, "top_p": 0.9, "top_k": 40, "stop": ["\n"], "seed": 7}
    greedy = payload.sampling_params({"do_sample": False, "temperature": 0.9, "top_p": 0.5}, 5, 3)
    assert greedy == {"max_tokens": 5, "temperature": 0.0, "seed": 3}
    assert payload.sampling_params({"do_sample": True}, 5, None)["temperature"] == 1.0


def test_cut_at_stop():
    assert payload.cut_at_stop("Paris\nRome", ["\n"]) == "Paris"
    assert payload.cut_at_stop("Paris", ["###"]) == "Paris"


def test_chat_messages_text_and_images(tmp_path):
    png = tmp_path / "dot.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\nfake")
    messages = [{"role": "system", "content": [{"type": "text", "text": "be brief"}]},
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": str(png)}},
                                             {"type": "image_url", "image_url": {"url": "https://x.org/a.jpg"}},
                                             {"type": "text", "text": "What is it?"}]}]
    out = payload.chat_messages(messages, vision=True)
    assert out[0] == {"role": "system", "content": "be brief"}
    parts = out[1]["content"]
    assert parts[0]["image_url"]["url"] == "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode()
    assert parts[1]["image_url"]["url"] == "https://x.org/a.jpg"
    assert parts[2] == {"type": "text", "text": "What is it?"}
    with pytest.raises(ValueError, match="vision=true"):
        payload.chat_messages(messages, vision=False)
    with pytest.raises(ValueError, match="cannot read the image"):
        payload.chat_messages([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "nope.png"}}]}],
                              vision=True)
    with pytest.raises(ValueError, match="audio_url"):
        payload.chat_messages([{"role": "user", "content": [{"type": "audio_url", "audio_url": {"url": "a.wav"}}]}],
                              vision=True)


def _echo_reply(tokens, values, offsets, top=None):
    lp = {"tokens": tokens, "token_logprobs": values, "text_offset": offsets}
    if top is not None:
        lp["top_logprobs"] = top
    return {"choices": [{"text": "".join(tokens), "logprobs": lp}]}


def test_continuation_logprob_uses_text_offsets():
    # "Answer:" | " yes" | " sir" | generated "!"
    tokens = ["Answer", ":", " yes", " sir", "!"]
    offsets = [0, 6, 7, 11, 15]
    values = [None, -1.0, -2.0, -3.0, -9.0]
    top = [None, {":": -1.0}, {" no": -0.1}, {" sir": -3.0}, {"!": -9.0}]
    total, greedy = payload.continuation_logprob(_echo_reply(tokens, values, offsets, top), "Answer:", " yes sir")
    assert total == pytest.approx(-5.0)  # the generated token is not part of it
    assert greedy is False
    total, greedy = payload.continuation_logprob(_echo_reply(tokens, values, offsets, top), "Answer: yes", " sir")
    assert (total, greedy) == (pytest.approx(-3.0), True)


def test_continuation_logprob_token_straddling_the_boundary_counts_for_the_continuation():
    # the context ends inside the token " yes" (context "Answer: y", continuation "es")
    tokens, offsets, values = ["Answer", ":", " yes"], [0, 6, 7], [None, -1.0, -2.5]
    total, greedy = payload.continuation_logprob(_echo_reply(tokens, values, offsets), "Answer: y", "es")
    assert total == pytest.approx(-2.5) and greedy is None


def test_continuation_logprob_refuses_servers_without_echo_and_empty_contexts():
    no_echo = {"choices": [{"text": "!", "logprobs": {"tokens": ["!"], "token_logprobs": [-1.0],
                                                       "text_offset": [12]}}]}
    with pytest.raises(payload.Unsupported, match="echo"):
        payload.continuation_logprob(no_echo, "Answer:", " yes")
    with pytest.raises(payload.Unsupported):
        payload.continuation_logprob({"choices": [{"text": "x", "logprobs": None}]}, "a", " b")
    with pytest.raises(payload.Unscorable, match="first token"):
        payload.continuation_logprob(_echo_reply(["yes"], [None], [0]), "", "yes")
    with pytest.raises(payload.BadReply):
        payload.continuation_logprob({"choices": []}, "a", " b")


def test_reply_text_and_usage():
    chat = {"choices": [{"message": {"role": "assistant", "content": "hi"}}], "usage": {"prompt_tokens": 3,
                                                                                       "completion_tokens": 1}}
    assert payload.reply_text(chat, chat=True) == "hi"
    assert payload.usage(chat) == (3, 1)
    assert payload.reply_text({"choices": [{"text": "yo"}]}, chat=False) == "yo"
    for bad in ([], {"choices": "x"}, {"error": {"message": "overloaded"}}, {"choices": [{"text": 3}]}):
        with pytest.raises(payload.BadReply):
            payload.reply_text(bad, chat=False)


def test_merge_stream_rebuilds_a_reply():
    chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant"}}]},
              {"choices": [{"index": 0, "delta": {"content": "Par"}}]},
              {"choices": [{"index": 0, "delta": {"content": "is"}, "finish_reason": "stop"}]},
              {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}}]
    reply = merge_stream(chunks)
    assert payload.reply_text(reply, chat=True) == "Paris"
    assert reply["choices"][0]["finish_reason"] == "stop" and payload.usage(reply) == (5, 2)


def test_retry_after_and_backoff():
    assert retry_after_seconds("3") == 3.0
    assert retry_after_seconds("0.5") == 0.5
    assert retry_after_seconds(None) is None and retry_after_seconds("soon") is None
    date = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 30))
    assert 25 <= retry_after_seconds(date) <= 31
    poster = Poster(timeout=1, max_retries=3, backoff=1.0, backoff_max=8.0, retry_after_max=60)
    assert poster.connect_timeout == 1 and poster.read_timeout == 1  # never past the attempt's deadline
    for attempt, cap in ((1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (9, 8.0)):
        waits = [poster.delay(attempt, None) for _ in range(50)]
        assert all(cap / 2 <= w <= cap for w in waits)
        assert len(set(waits)) > 1  # jitter
    assert poster.delay(1, 5.0) >= 5.0
    assert poster.delay(1, 500.0) == 60  # a Retry-After beyond retry_after_max is capped


def test_arguments(monkeypatch):
    assert normalize_base_url("http://h:8000") == "http://h:8000/v1"
    assert normalize_base_url("http://h:8000/v1/") == "http://h:8000/v1"
    assert normalize_base_url("https://h/openai/v1") == "https://h/openai/v1"
    with pytest.raises(GageError, match="base_url"):
        openai_backend(base_url="h:8000")
    with pytest.raises(GageError, match="api_key_env"):
        openai_backend(base_url="http://h", api_key="sk-123456")
    with pytest.raises(GageError, match="unknown argument.*bogus"):
        openai_backend(base_url="http://h", bogus=1)
    monkeypatch.delenv("GAGE_TEST_MISSING_KEY", raising=False)
    with pytest.raises(GageError, match="GAGE_TEST_MISSING_KEY.*not set"):
        openai_backend(base_url="http://h", api_key_env="GAGE_TEST_MISSING_KEY")
    with pytest.raises(GageError, match="concurrency"):
        openai_backend(base_url="http://h", concurrency=0)
    with pytest.raises(GageError, match="stream"):
        openai_backend(base_url="http://h", stream="maybe")
    monkeypatch.setenv("GAGE_TEST_KEY", "sk-gage-test-0000")
    b = openai_backend(base_url="http://h", model="m", api_key_env="GAGE_TEST_KEY", concurrency=8,
                       header_X_Team="eval", **{"header_api-key": "azure-secret-1"}, vision=True,
                       loglikelihood=False)
    assert set(b.secrets) == {"sk-gage-test-0000", "azure-secret-1", "eval"}  # every header value is secret
    assert b.capabilities == {"generate", "chat", "vision", "tools"}
    assert b.max_batch == 128  # 16 rounds of 8 a window
    assert openai_backend(base_url="http://h", model="m", concurrency=2).max_batch == 64
    assert openai_backend(base_url="http://h", model="m", concurrency=64, batch_size=300).max_batch == 300
    settings = repr(b.settings())
    assert "sk-gage-test-0000" not in settings and "azure-secret-1" not in settings
    assert b._headers()["X_Team"] == "eval" and b._headers()["Authorization"] == "Bearer sk-gage-test-0000"


def test_missing_aiohttp_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "aiohttp", None)
    with pytest.raises(GageError, match=r"pip install 'gage-eval\[openai\]'"):
        openai_backend(base_url="http://h", model="m")


def test_proxy_from_the_environment_is_looked_up_once(monkeypatch):
    from gage_plugins_builtin.backends.openai_backend import env_proxy

    for name in ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY",
                 "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    assert env_proxy("http://127.0.0.1:8000/v1") is None
    monkeypatch.setenv("HTTP_PROXY", "http://user:pw-secret-9@proxy.internal:3128")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    assert env_proxy("http://api.example.com/v1") == "http://user:pw-secret-9@proxy.internal:3128"
    assert env_proxy("http://127.0.0.1:8000/v1") is None  # NO_PROXY
    backend = openai_backend(base_url="http://api.example.com/v1", model="m")
    assert backend.poster.proxy.endswith("@proxy.internal:3128")
    assert "pw-secret-9" in backend.poster.secrets  # scrubbed from any error message
    assert "pw-secret-9" not in repr(backend.settings()) and backend.settings()["proxy"] is True


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="the eager body-writer shim exists for Python 3.11 only")
def test_eager_factory_starts_only_the_chosen_coroutine_and_keeps_task_semantics():
    import asyncio

    from gage_plugins_builtin.backends.openai_http import eager_body_writes, eager_factory

    steps: list[str] = []

    async def chosen(tag, gate=None, fail=False):
        steps.append(f"{tag} started")
        if fail:
            raise OSError(f"{tag} failed")
        if gate is not None:
            try:
                await gate
            except asyncio.CancelledError:
                steps.append(f"{tag} cancelled")
                raise
        steps.append(f"{tag} finished")
        return tag

    async def other():
        steps.append("other started")
        return "other"

    async def main():
        loop = asyncio.get_running_loop()
        loop.set_task_factory(eager_factory(chosen.__code__))
        done_now = loop.create_task(chosen("a"))
        assert steps == ["a started", "a finished"] and done_now.done() and done_now.result() == "a"
        plain = loop.create_task(other())
        assert steps[-1] == "a finished"  # an ordinary task: not run yet
        gate = loop.create_future()
        waiting = loop.create_task(chosen("b", gate))
        assert steps[-1] == "b started" and not waiting.done()
        gate.set_result(None)
        assert await waiting == "b" and await plain == "other"
        failing = loop.create_task(chosen("c", fail=True))
        assert failing.done() and isinstance(failing.exception(), OSError)
        cancelled = loop.create_task(chosen("d", loop.create_future()))
        await asyncio.sleep(0)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert steps[-1] == "d cancelled"

    asyncio.run(main())
    loop = asyncio.new_event_loop()
    try:
        eager_body_writes(loop)  # aiohttp's body writer on this Python: the shim is installed
        assert loop.get_task_factory() is not None
    finally:
        loop.close()


def test_backend_run_inside_a_running_event_loop(monkeypatch):
    """Called from async code, the backend runs its own loop in a thread and hands errors back."""
    import asyncio

    backend = openai_backend(base_url="http://127.0.0.1:9/v1", max_retries=0, timeout=2)

    async def caller():
        return backend.run([])

    with pytest.raises(GageError, match="cannot reach"):
        asyncio.run(caller())  # no model given: the /models lookup fails in the thread
