"""Perplexity (issue 25 part 4): the ``loglikelihood_rolling`` request kind, its rolling windows, the
corpus metrics word_perplexity / byte_perplexity / bits_per_byte, the perplexity and wikitext tasks.

lm-evaluation-harness 0.4.13's values on the perplexity task's five shipped documents (SmolLM2 float32,
max_length 64: 15 windows) are in fixtures/perplexity_lm_eval.json, written by
``benchmarks/perplexity_vs_lm_eval.py --limit 5 --max-length 64 --fixture ...``; the slow tests score
the same documents with the real model and compare, so CI checks parity without lm-eval."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from gage_eval.api import LOGLIKELIHOOD_ROLLING, MetricContext, Request, RowContext, loglikelihood
from gage_eval.api.backend import ModelOutput, checked_output
from gage_plugins_builtin.metrics.perplexity import BitsPerByte, BytePerplexity, WordPerplexity
from gage_plugins_builtin.perplexity import Document, Wikitext, count_bytes, count_words, wikitext_detokenize

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "perplexity_lm_eval.json").read_text(encoding="utf-8"))
SHIPPED = [json.loads(line) for line in (ROOT / "tasks" / "perplexity" / "sample.jsonl").open(encoding="utf-8")]


def windows_as_lists(tokens, max_len, prefix=-1):
    return [[w.context, w.continuation] for w in loglikelihood.rolling_windows(tokens, prefix, max_len)]


# -- windows -------------------------------------------------------------------------------

def test_windows_by_hand():
    t = list(range(10))
    assert windows_as_lists(t, 4) == [[[-1], [0, 1, 2, 3]], [[3], [4, 5, 6, 7]], [[5, 6, 7], [8, 9]]]
    assert windows_as_lists(t, 10) == [[[-1], t]]
    assert windows_as_lists(t, 5) == [[[-1], [0, 1, 2, 3, 4]], [[4], [5, 6, 7, 8, 9]]]
    assert windows_as_lists(t[:3], 1) == [[[-1], [0]], [[0], [1]], [[1], [2]]]
    assert windows_as_lists([], 4) == []


@pytest.mark.parametrize("n,max_len", [(n, m) for n in (1, 2, 7, 16, 33) for m in (1, 2, 3, 8, 16, 40)])
def test_windows_score_every_token_once_within_the_length(n, max_len):
    tokens = list(range(100, 100 + n))
    scored = []
    for ctx, cont in windows_as_lists(tokens, max_len):
        inputs = (ctx + cont)[:-1]
        assert 1 <= len(cont) <= max_len and len(inputs) <= max_len
        full = [-1] + tokens  # the context is what precedes the continuation in the prefixed text
        at = full.index(cont[0])
        assert full[at - len(ctx):at] == ctx
        scored += cont
    assert scored == tokens


def test_windows_refuse_a_zero_length_and_a_missing_prefix():
    with pytest.raises(ValueError, match="max_seq_len"):
        loglikelihood.rolling_windows([1, 2], 0, 0)
    with pytest.raises(ValueError, match="BOS or EOS"):
        loglikelihood.rolling_windows([1, 2], None, 4)


def test_a_rolling_output_is_one_finite_number():
    req = Request(kind=LOGLIKELIHOOD_ROLLING, sample_id="s", continuations=("some text",))
    assert checked_output(req, ModelOutput(loglikelihoods=[-3.5])).error is None
    assert "1 continuations" in checked_output(req, ModelOutput(loglikelihoods=[-1.0, -2.0])).error
    assert "finite" in checked_output(req, ModelOutput(loglikelihoods=[float("nan")])).error


# -- metrics and counts ------------------------------------------------------------------------

def _ctx(ll: float, words: int, n_bytes: int) -> MetricContext:
    return MetricContext(sample={"metadata": {"words": words, "bytes": n_bytes}},
                         model_output={"loglikelihoods": [ll]})


def test_metrics_by_hand():
    docs = [(-10.0, 5, 20), (-20.0, 10, 40), (-30.0, 15, 60)]
    for metric, expected in ((WordPerplexity(), math.e ** 2), (BytePerplexity(), math.e ** 0.5),
                             (BitsPerByte(), 0.5 / math.log(2))):
        items = [metric.compute(_ctx(*d))["item"] for d in docs]
        assert metric.aggregate(items) == pytest.approx(expected, rel=1e-12)
        assert metric.corpus and not metric.higher_is_better
    # a document's own figure: -10 nats over 5 words is e^2; over 20 bytes 0.5 / ln 2 bits a byte
    assert WordPerplexity().compute(_ctx(-10.0, 5, 20))["document"] == pytest.approx(7.389056098930650)
    assert BitsPerByte().compute(_ctx(-10.0, 5, 20))["document"] == pytest.approx(0.7213475204444817)
    with pytest.raises(ValueError, match="count of at least 1"):
        WordPerplexity().compute(_ctx(-1.0, 0, 3))


def test_counts_as_lm_eval_counts():
    assert count_words("a b") == 2 and count_words(" a  b\n") == 4  # empty pieces at both ends, as re.split gives
    assert count_bytes("caf\u00e9") == 5


def test_lm_eval_fixture_through_our_metrics_and_counts():
    """lm-eval's per-document values and counts give its three figures through our metrics, and our
    preprocessor counts the same words and bytes in the shipped documents."""
    docs = FIXTURE["documents"]
    assert [d["text"] for d in docs] == [r["text"] for r in SHIPPED]
    pre = Document()
    for i, d in enumerate(docs):
        meta = pre({"text": d["text"]}, RowContext(task="perplexity", locator=f"f:{i}", index=i))["metadata"]
        assert (meta["words"], meta["bytes"]) == (d["words"], d["bytes"])
    for metric in (WordPerplexity(), BytePerplexity(), BitsPerByte()):
        key = "words" if metric.name == "word_perplexity" else "bytes"
        items = [metric.compute(_ctx(d["loglikelihood"], d["words"], d["bytes"]))["item"] for d in docs]
        assert items == [[d["loglikelihood"], d[key]] for d in docs]
        assert metric.aggregate(items) == pytest.approx(FIXTURE["metrics"][metric.name], rel=1e-12)


def test_wikitext_scores_detokenized_and_counts_as_written():
    page = (" = = Gameplay = = \n The game 's 1 @,@ 000 units and 3 @.@ 5 km , \" quoted text \" and ' single ' ; "
            "it 's 20 \u00b0 cold ! Is N it ? [ note ] { x } \n = = = = Deep = = = = \n")
    # lm-eval 0.4.13's wikitext_detokenizer gives exactly this (its quirks kept: "and' single '")
    expected = (" == Gameplay ==\nThe game's 1,000 units and 3.5 km, \"quoted text\" and' single '; it's "
                "20\u00b0cold! Is 1 it? [note] {x}\n==== Deep ====\n")
    assert wikitext_detokenize(page) == expected
    assert wikitext_detokenize("role @-@ playing ( Japanese : x , lit . y )") == "role-playing (Japanese: x, lit. y)"
    sample = Wikitext()({"page": page}, RowContext(task="wikitext", locator="w:0", index=0))
    assert sample["messages"][0]["content"][0]["text"] == expected
    assert sample["metadata"]["words"] == count_words(page) and sample["metadata"]["bytes"] == count_bytes(page)


def test_an_empty_document_is_a_row_error():
    with pytest.raises(ValueError, match="empty"):
        Document()({"text": ""}, RowContext(task="perplexity", locator="x:1", index=0))
    with pytest.raises(KeyError):
        Document()({"page": "x"}, RowContext(task="perplexity", locator="x:1", index=0))


# -- the task through the engine (dummy backend) --------------------------------------------------

def _summary_and_rows(out: Path, task: str) -> tuple[dict, list[dict]]:
    summary_path = next(out.rglob("summary.json"))
    rows = [json.loads(line) for line in (summary_path.parent / "samples" / f"{task}.jsonl").open()]
    return json.loads(summary_path.read_text()), rows


def test_perplexity_task_over_txt_files_equals_the_figures_from_its_rows(run_cli, tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    for i, row in enumerate(SHIPPED[:3]):
        (folder / f"doc{i}.txt").write_text(row["text"] + "\n", encoding="utf-8")
    (folder / "latin1.txt").write_bytes("caf\u00e9".encode("latin-1"))
    result = run_cli("--tasks", "perplexity", "--data", f"perplexity={folder}", "--model", "dummy",
                     "-o", tmp_path / "runs", "--quiet")
    summary, rows = _summary_and_rows(tmp_path / "runs", "perplexity")
    assert result.exit_code == 1, result.output  # one row errored (not UTF-8), reported and counted
    errored = [r for r in rows if r.get("eval_result", {}).get("error")]
    assert len(errored) == 1 and "latin1.txt" in json.dumps(errored[0]) and "UTF-8" in json.dumps(errored[0])
    scored = [r for r in rows if not r.get("eval_result", {}).get("error")]
    assert len(scored) == 3
    lls = [r["predict_result"][0]["loglikelihoods"][0] for r in scored]
    words = [r["metadata"]["words"] for r in scored]
    n_bytes = [r["metadata"]["bytes"] for r in scored]
    assert words == [count_words(row["text"] + "\n") for row in SHIPPED[:3]]
    metrics = summary["tasks"]["perplexity"]["metrics"]
    assert metrics["word_perplexity"]["value"] == pytest.approx(math.exp(-sum(lls) / sum(words)), rel=1e-12)
    assert metrics["byte_perplexity"]["value"] == pytest.approx(math.exp(-sum(lls) / sum(n_bytes)), rel=1e-12)
    assert metrics["bits_per_byte"]["value"] == pytest.approx(-sum(lls) / sum(n_bytes) / math.log(2), rel=1e-12)
    assert metrics["bits_per_byte"]["stderr"] is None and metrics["bits_per_byte"]["n"] == 3


def test_perplexity_task_refuses_few_shot(run_cli, tmp_path):
    result = run_cli("--tasks", "perplexity", "--model", "dummy", "--num-fewshot", "2", "-o", tmp_path / "r")
    assert result.exit_code != 0 and "takes no few-shot examples" in result.output
    assert "Traceback" not in result.output


# -- backends on fakes: vllm's engine, an OpenAI-compatible server ----------------------------------

def test_vllm_scores_each_window_and_sums(monkeypatch):
    import types

    from tests.backends import test_stream_vllm as fake

    mod = types.ModuleType("vllm")
    mod.LLM = lambda **kwargs: fake.SteppedLLM(kwargs)
    mod.SamplingParams = lambda **kw: dict(kw)
    monkeypatch.setitem(__import__("sys").modules, "vllm", mod)
    from gage_plugins_builtin.backends.vllm_backend import vllm_backend

    backend = vllm_backend(pretrained="m", vision=False)
    backend.open()
    backend.llm.llm_engine.model_config = types.SimpleNamespace(max_model_len=6)  # windows of 4 scored tokens
    text = "abcdefghij"
    (out,) = backend.run([Request(kind=LOGLIKELIHOOD_ROLLING, sample_id="t", continuations=(text,))])
    assert out.error is None, out.error
    # the fake gives prompt position k the log-probability -k/10: sum the scored positions of each window
    expected = sum(-(len(w.context) + k) / 10 for w in loglikelihood.rolling_windows([ord(c) for c in text], 1, 4)
                   for k in range(len(w.continuation)))
    assert out.loglikelihoods == pytest.approx([expected])
    assert LOGLIKELIHOOD_ROLLING in backend.capabilities


def test_openai_sends_each_window_as_token_ids():
    pytest.importorskip("aiohttp")
    from gage_plugins_builtin.backends.openai_backend import openai_backend
    from tests.backends.test_context_split import WordTokenizer, echo_poster

    backend = openai_backend(base_url="http://127.0.0.1:9/v1", model="m", tokenizer="toy", max_length=5,
                             max_retries=0)
    assert LOGLIKELIHOOD_ROLLING in backend.capabilities
    assert LOGLIKELIHOOD_ROLLING not in openai_backend(base_url="http://127.0.0.1:9/v1", model="m").capabilities
    backend._encoder = (loglikelihood.tokenizer_encoder(WordTokenizer(add_bos=False)), 0)
    sent = echo_poster(backend, lambda prompt: [None] + [-k / 10 for k in range(1, len(prompt))])
    try:
        (out,) = backend.run([Request(kind=LOGLIKELIHOOD_ROLLING, sample_id="s",
                                      continuations=("x y x y yes x z",))])
    finally:
        backend.close()
    assert out.error is None, out.error
    tokens = loglikelihood.tokenizer_encoder(WordTokenizer(add_bos=False))("x y x y yes x z", None)
    windows = loglikelihood.rolling_windows(tokens, 0, 3)  # max_length 5 - 2
    assert sorted(body["prompt"] for body in sent) == sorted(w.tokens for w in windows) and len(windows) == 3
    expected = sum(-(len(w.context) + k) / 10 for w in windows for k in range(len(w.continuation)))
    assert out.loglikelihoods == pytest.approx([expected]) and out.raw["windows"] == 3


# -- the real model -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def smollm2_64(smollm2_gguf):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from gage_plugins_builtin.backends.hf import smollm2_backend

    backend = smollm2_backend(max_length=64, batch_size=4)
    backend.open()
    return backend


def _direct(backend, text: str, max_len: int) -> tuple[float, int]:
    """The text's log-likelihood straight from the model: windows cut here by the definition (the first
    max_len tokens after BOS; then each next max_len after the one token before them; the last ones
    after as many earlier tokens as fill max_len inputs), each run whole, unpadded."""
    import torch

    tok = backend.tokenizer
    ids = tok.encode(text)
    total, windows, done = 0.0, 0, 0
    while done < len(ids):
        n = min(max_len, len(ids) - done)
        if done == 0:
            seq, first = [tok.bos_token_id] + ids[:n], 1
        else:
            start = max(0, done + n - max_len - 1)
            seq, first = ids[start:done + n], done - start
        with torch.inference_mode():
            logp = torch.log_softmax(backend.model(torch.tensor([seq[:-1]])).logits[0].float(), dim=-1)
        total += sum(float(logp[k - 1, seq[k]]) for k in range(first, len(seq)))
        windows += 1
        done += n
    return total, windows


@pytest.mark.slow
def test_smollm2_rolling_equals_a_direct_computation(smollm2_64):
    texts = [SHIPPED[2]["text"], SHIPPED[4]["text"], "Short text.", "Line one.\nLine two, after a newline.\n"]
    outs = smollm2_64.run([Request(kind=LOGLIKELIHOOD_ROLLING, sample_id=str(i), continuations=(t,))
                           for i, t in enumerate(texts)])
    assert sum(out.raw["windows"] for out in outs) > len(texts)  # several windows are used
    for text, out in zip(texts, outs):
        assert out.error is None, out.error
        expected, windows = _direct(smollm2_64, text, 64)
        assert out.raw["windows"] == windows
        assert out.loglikelihoods[0] == pytest.approx(expected, abs=1e-4), text[:40]


@pytest.mark.slow
def test_smollm2_equals_lm_eval_per_document(smollm2_64):
    assert FIXTURE["max_length"] == 64
    outs = smollm2_64.run([Request(kind=LOGLIKELIHOOD_ROLLING, sample_id=str(i), continuations=(d["text"],))
                           for i, d in enumerate(FIXTURE["documents"])])
    for doc, out in zip(FIXTURE["documents"], outs):
        assert out.error is None, out.error
        assert abs(out.loglikelihoods[0] - doc["loglikelihood"]) <= 1e-4 * abs(doc["loglikelihood"])
    metric = WordPerplexity()
    items = [metric.compute(_ctx(o.loglikelihoods[0], d["words"], d["bytes"]))["item"]
             for o, d in zip(outs, FIXTURE["documents"])]
    assert metric.aggregate(items) == pytest.approx(FIXTURE["metrics"]["word_perplexity"], rel=1e-4)
