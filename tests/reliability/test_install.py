"""What a fresh install gets from the transformers backend, through the real CLI: continuous
batching on the installed transformers (5.x renamed its cache argument; the fall-back to
``model.generate`` was silent), the same answers as ``model.generate``, a fall-back said once
with its reason, and no deprecation line from transformers."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import OK, check

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

WORDS = ("the a sea sky blue red green one two three four five six seven eight nine ten say what is how why "
         "who cat dog bird fish tree leaf rock sand wave wind rain sun moon star yes no maybe ok").split()

TASK = """\
name: gen
dataset: {loader: jsonl, args: {path: rows.jsonl}}
preprocessor: {name: identity}
request: {kind: generate, generation: {max_new_tokens: 8}}
metrics: [exact_match]
"""

# a log-likelihood task beside it: reading a forward pass's outputs printed transformers 5.x's deprecation line
MC_TASK = """\
name: mc
dataset: {loader: jsonl, args: {path: rows.jsonl}}
preprocessor: {name: legacy, args: {question: goal, choices: [sol1, sol2], answer: label}}
request: {kind: loglikelihood, prompt: prompt.jinja}
metrics: [acc]
"""

FALLBACK = "no continuous batching ("


def build_model(out: Path, sliding_window: int | None = None) -> Path:
    """A tiny random Llama (or Mistral, whose sliding window rules continuous batching out) with a word-level
    tokenizer, saved as a local model folder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(["<pad>", "<s>", "</s>", "<unk>", *WORDS, *"0123456789", "?", ".", ","])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                                     pad_token="<pad>", unk_token="<unk>")
    shape = dict(vocab_size=len(vocab), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1,
                 eos_token_id=2, pad_token_id=0)
    if sliding_window:
        model = transformers.MistralForCausalLM(transformers.MistralConfig(sliding_window=sliding_window, **shape))
    else:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**shape))
    with torch.no_grad():  # a sharper output layer: greedy choices are no near-ties between float orderings
        model.lm_head.weight.mul_(8)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    torch.manual_seed(0)
    base = tmp_path_factory.mktemp("tiny-models")
    return {"llama": build_model(base / "llama"), "mistral": build_model(base / "mistral", sliding_window=16)}


def run_gen(gage, model: Path, *args: str, run_id: str, tasks: str = "gen"):
    folder = gage.tmp / "tasks" / "gen"
    if not folder.exists():
        (gage.tmp / "tasks" / "mc").mkdir(parents=True)
        (gage.tmp / "tasks" / "mc" / "task.yaml").write_text(MC_TASK)
        (gage.tmp / "tasks" / "mc" / "prompt.jinja").write_text("Question: {{ question }}\nAnswer:")
        (gage.tmp / "tasks" / "mc" / "rows.jsonl").write_text("".join(
            json.dumps({"goal": f"{WORDS[i]} {WORDS[i + 1]} ?", "sol1": WORDS[i + 2], "sol2": "one two",
                        "label": i % 2}) + "\n" for i in range(4)))
        folder.mkdir(parents=True)
        (folder / "task.yaml").write_text(TASK)
        # prompts of 1 to 11 words: rows finish and join at different steps
        rows = [{"schema_version": "v1", "id": f"g{i}", "references": ["one"],
                 "messages": [{"role": "user", "content": " ".join(WORDS[(3 * i + j) % 20]
                                                                   for j in range(1 + 5 * i % 11))}]}
                for i in range(12)]
        (folder / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    o = gage("--tasks", tasks, "--include-path", gage.tmp / "tasks", "--model", "transformers", "--model-args",
             ",".join([f"pretrained={model}", *args]), "-b", "4", run_id=run_id)
    check(o, OK)
    assert o.summary["tasks"]["gen"]["counts"]["scored"] == 12
    # transformers' own deprecation lines ("`past_key_values`/`cache_params` are deprecated", ...)
    assert "deprecat" not in o.err.lower(), o.err
    return o


def answers(o) -> dict[str, str]:
    return {r["id"]: r["predict_result"][0]["message"]["content"][0]["text"] for r in o.records("gen")}


def test_generation_batches_continuously_and_answers_as_model_generate(gage, models):
    fast = run_gen(gage, models["llama"], run_id="continuous", tasks="gen,mc")
    assert fast.summary["tasks"]["mc"]["counts"]["scored"] == 4
    assert fast.summary["run"]["model"]["settings"]["continuous_batching"] is True
    assert FALLBACK not in fast.err, fast.err
    assert all(r["predict_result"][0]["raw"]["batch_size"] == 4 for r in fast.records("gen"))
    static = run_gen(gage, models["llama"], "continuous_batching=false", run_id="static")
    assert static.summary["run"]["model"]["settings"]["continuous_batching"] is False
    assert FALLBACK not in static.err  # asked for: nothing to say
    assert answers(fast) == answers(static) and len(set(answers(fast).values())) > 1


def test_a_model_it_cannot_batch_continuously_is_said_once_with_the_reason(gage, models):
    o = run_gen(gage, models["mistral"], run_id="sliding")
    lines = [line for line in o.err.splitlines() if FALLBACK in line]
    assert len(lines) == 1 and "sliding" in lines[0] and "model.generate" in lines[0], o.err
    assert lines[0].startswith("gage-eval: warning: ")
    assert o.summary["run"]["model"]["settings"]["continuous_batching"] is False
