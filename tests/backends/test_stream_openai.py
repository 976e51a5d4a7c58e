"""``stream()`` of the openai backend against the fake server: each reply is handed over the
moment it is in, every index exactly once, with what ``run()`` returns; a fatal answer ends the
stream after the outputs already given; stopping early or Ctrl-C cancels what is in flight."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gage_eval.api.backend import GENERATE, LOGLIKELIHOOD, Request
from gage_eval.api.errors import FatalBackendError
from gage_plugins_builtin.backends.openai_backend import openai_backend
from openai_fake_server import FakeServer

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
FAST = dict(model="fake-model", timeout=20, read_timeout=20, connect_timeout=2, max_retries=1, backoff=0.01,
            backoff_max=0.05)


def gen(prompt: str, chat: bool = False) -> Request:
    if chat:
        return Request(kind=GENERATE, sample_id=prompt, chat=True,
                       messages=({"role": "user", "content": [{"type": "text", "text": prompt}]},))
    return Request(kind=GENERATE, sample_id=prompt, prompt=prompt)


def ll(context: str, *choices: str) -> Request:
    return Request(kind=LOGLIKELIHOOD, sample_id=context, prompt=context, continuations=choices)


MIXED = [
    gen("q\nfirst answer"),
    ll("The capital of France is", " Paris", " London"),
    gen("[[faults:400]]\nrefused"),
    gen("chat\nsecond answer", chat=True),
    ll("", " nothing to condition on"),
    gen("[[delay:0.3]]q\nlate answer"),
    ll("Question: why?\nAnswer:", " because", " the sky is blue"),
]


def _pending(backend) -> int:
    """Tasks left on the backend's loop."""
    async def count() -> int:
        return sum(1 for t in asyncio.all_tasks() if t is not asyncio.current_task())

    return asyncio.run_coroutine_threadsafe(count(), backend._loop).result(5)


def _fields(out) -> tuple:
    return (out.text, out.loglikelihoods, out.is_greedy, out.error, out.finish_reason, out.input_tokens,
            out.output_tokens)


def test_stream_yields_every_index_once_with_run_outputs():
    with FakeServer() as one, FakeServer() as other:  # a fault directive is spent on its first try: two servers
        streamer = openai_backend(base_url=one.url, concurrency=3, **FAST)
        runner = openai_backend(base_url=other.url, concurrency=3, **FAST)
        try:
            got = {}
            for i, out in streamer.stream(MIXED):
                assert i not in got
                got[i] = out
            ran = runner.run(MIXED)
        finally:
            streamer.close()
            runner.close()
    assert sorted(got) == list(range(len(MIXED)))
    for i, out in got.items():
        expected = _fields(ran[i])
        if ran[i].error:  # the message names the server
            expected = _fields(ran[i])[:3] + (ran[i].error.replace(other.url, one.url),) + _fields(ran[i])[4:]
        assert _fields(out) == expected, i
    assert got[0].text == "first answer" and got[3].text == "second answer" and got[5].text == "late answer"
    assert "400" in got[2].error and "tokenizer=" in got[4].error
    assert got[1].loglikelihoods and got[6].loglikelihoods


def test_replies_are_handed_over_before_the_slowest_is_in():
    reqs = [gen("[[delay:3]]q\nslow")] + [gen(f"q\nfast {k}") for k in range(5)]
    with FakeServer() as server:
        backend = openai_backend(base_url=server.url, concurrency=8, **FAST)
        try:
            order, still_out = [], []
            for i, out in backend.stream(reqs):
                order.append(i)
                still_out.append(server.inflight)
                assert out.error is None and out.text == ("slow" if i == 0 else f"fast {i - 1}")
        finally:
            backend.close()
    assert sorted(order) == list(range(6)) and order[-1] == 0
    assert still_out[0] >= 1  # the first output came while the slow request was still at the server


def test_fatal_answer_mid_stream_after_some_outputs():
    reqs = [gen(f"q\nok {k}") for k in range(4)] + [gen("[[delay:0.5]][[faults:401]]\nno")] + \
        [gen(f"[[delay:30]]q\nnever {k}") for k in range(5)]
    with FakeServer() as server:
        backend = openai_backend(base_url=server.url, concurrency=10, **FAST)
        try:
            got = []
            with pytest.raises(FatalBackendError, match="401 Unauthorized"):
                for i, out in backend.stream(reqs):
                    got.append((i, out.text))
            assert sorted(got) == [(k, f"ok {k}") for k in range(4)]  # given before the fatal answer, kept
            assert _pending(backend) == 0  # the requests still out were cancelled and have ended
            sent = len(server.log)
            with pytest.raises(FatalBackendError, match="401"):  # and every later call, unsent
                next(backend.stream([gen("q\nagain")]))
            assert len(server.log) == sent == 10
        finally:
            backend.close()


def test_stopping_early_cancels_the_requests_in_flight():
    reqs = [gen("q\nquick")] + [gen(f"[[delay:30]]q\nslow {k}") for k in range(4)]
    with FakeServer() as server:
        backend = openai_backend(base_url=server.url, concurrency=8, **FAST)
        try:
            stream = backend.stream(reqs)
            i, out = next(stream)
            assert (i, out.text) == (0, "quick")
            assert _pending(backend) == 4
            stream.close()
            assert _pending(backend) == 0
            assert [o.text for o in backend.run([gen("q\nafter")])] == ["after"]  # the backend goes on
        finally:
            backend.close()


def test_a_judge_call_while_a_stream_is_suspended():
    """The engine may judge finished rows with this same backend between two outputs."""
    reqs = [gen("q\nfirst"), gen("[[delay:1]]q\nsecond"), gen("[[delay:1]]q\nthird")]
    with FakeServer() as server:
        backend = openai_backend(base_url=server.url, concurrency=4, **FAST)
        try:
            stream = backend.stream(reqs)
            first = next(stream)
            assert first[0] == 0
            judged = backend.run([gen("judge\nverdict"), ll("The answer is", " right", " wrong")])
            assert judged[0].text == "verdict" and len(judged[1].loglikelihoods) == 2
            rest = dict(stream)
            assert {k: o.text for k, o in rest.items()} == {1: "second", 2: "third"}
            assert _pending(backend) == 0
        finally:
            backend.close()


INTERRUPT = r"""
import asyncio, signal, sys, threading
sys.path.insert(0, sys.argv[1])
# Ctrl-C raises KeyboardInterrupt here even when this test runs in a background job, whose shell
# starts its children with SIGINT ignored (Python then installs no handler for it)
signal.signal(signal.SIGINT, signal.default_int_handler)
from gage_eval.api.backend import Request
from gage_plugins_builtin.backends.openai_backend import openai_backend
from openai_fake_server import FakeServer

reqs = [Request(kind="generate", sample_id="a", prompt="q\nquick")] + [
    Request(kind="generate", sample_id=str(k), prompt=f"[[delay:30]]q\nslow {k}") for k in range(6)]
with FakeServer() as server:
    backend = openai_backend(base_url=server.url, model="fake-model", concurrency=8)
    stream = backend.stream(reqs)
    print("first", next(stream)[0], flush=True)
    main = threading.main_thread().ident
    threading.Timer(0.5, signal.pthread_kill, (main, signal.SIGINT)).start()
    try:
        next(stream)
    except KeyboardInterrupt:
        async def count():
            return sum(1 for t in asyncio.all_tasks() if t is not asyncio.current_task())
        left = asyncio.run_coroutine_threadsafe(count(), backend._loop).result(5)
        print("interrupted", left, stream.gi_frame is None, flush=True)
    backend.close()
    print("closed", backend._loop is None, flush=True)
"""


@pytest.mark.skipif(not hasattr(__import__("signal"), "pthread_kill"), reason="needs signal.pthread_kill")
def test_ctrl_c_cancels_the_requests_in_flight_cleanly():
    proc = subprocess.run([sys.executable, "-X", "dev", "-c", INTERRUPT, str(HERE)], capture_output=True,
                          text=True, timeout=60, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONASYNCIODEBUG": "0"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.split("\n")[:3] == ["first 0", "interrupted 0 True", "closed True"], proc.stdout
    for noise in ("Task was destroyed", "Unclosed", "never retrieved", "Traceback"):
        assert noise not in proc.stderr, proc.stderr


def test_settings_still_say_whether_replies_are_streamed():
    backend = openai_backend(base_url="http://127.0.0.1:9/v1", model="m", stream="true")
    assert backend.settings()["stream"] is True and callable(backend.stream)
    assert json.dumps(backend.settings())
