"""The run's prompt controls take effect: system prompt, gen_kwargs, the chat-template switch (for
log-likelihood tasks too, checked against lm-evaluation-harness on the real SmolLM2), multi-turn
few-shot, and the reasoning strip."""
from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from gage_eval.api.backend import GENERATE, LOGLIKELIHOOD, Request
from gage_eval.engine.loop import Engine, RunOptions, TaskRun
from gage_eval.api.errors import GageError
from gage_eval.api.loglikelihood import chat_context, request_context
from gage_eval.plugins import load_plugins
from gage_eval.engine.reasoning import strip_output, strip_reasoning
from gage_eval.tasks.requests import RequestBuilder
from gage_eval.tasks.rows import RowChecker
from gage_eval.tasks.spec import read_task_file

ROOT = Path(__file__).resolve().parents[2]
PIQA = ROOT / "tasks" / "piqa"
SAMPLE_LINES = (PIQA / "sample.jsonl").read_text().splitlines()
LM_EVAL = json.loads(Path(__file__).with_name("lm_eval_fewshot.json").read_text())

PIQA_ROW = {"schema_version": "v1", "id": "p1", "messages": [{"role": "user", "content": "Open a jar."}],
            "options": [{"id": "A", "content": "Twist the lid."}, {"id": "B", "content": "Freeze it."}],
            "references": ["A"], "label": "A"}


def options(**kw) -> RunOptions:
    return RunOptions(tasks=["t"], **kw)


def generate_task(tmp_path: Path, request: str = "{kind: generate}", extra: str = "") -> Path:
    folder = tmp_path / "gen"
    folder.mkdir(exist_ok=True)
    (folder / "prompt.jinja").write_text("Q: {{ question }}")
    (folder / "task.yaml").write_text(f"dataset: {{loader: jsonl, args: {{path: rows.jsonl}}}}\n"
                                      f"request: {request}\n{extra}metrics: [exact_match]\n")
    return folder


def gen_row(**extra) -> dict:
    return {"schema_version": "v1", "id": "g1", "messages": [{"role": "user", "content": "Capital of France?"}],
            "references": ["Paris"], **extra}


# --- system prompt ------------------------------------------------------------------------------

def test_system_prompt_goes_right_before_a_plain_prompt_as_lm_eval_does():
    builder = RequestBuilder(read_task_file(PIQA), options(system_prompt="Pick the sensible one.\n"))
    request, rendered = builder.build(PIQA_ROW)
    assert request.prompt == "Pick the sensible one.\nQuestion: Open a jar.\nAnswer:"
    assert rendered["prompt"] == request.prompt
    assert request.continuations == (" Twist the lid.", " Freeze it.")
    bare = RequestBuilder(read_task_file(PIQA), options(system_prompt="Be brief."))
    assert bare.build(PIQA_ROW)[0].prompt == "Be brief.Question: Open a jar.\nAnswer:"  # nothing added


def test_system_prompt_is_a_system_message_in_chat_merged_with_the_samples(tmp_path):
    spec = read_task_file(generate_task(tmp_path, "{kind: generate, chat: true, prompt: prompt.jinja}"))
    request, _ = RequestBuilder(spec, options(system_prompt="Be brief.")).build(gen_row())
    assert request.chat and [m["role"] for m in request.messages] == ["system", "user"]
    assert request.messages[0]["content"] == [{"type": "text", "text": "Be brief."}]
    assert request.messages[1]["content"] == [{"type": "text", "text": "Q: Capital of France?"}]
    own = gen_row(messages=[{"role": "system", "content": "You know geography."},
                            {"role": "user", "content": "Capital of France?"}])
    request, _ = RequestBuilder(spec, options(system_prompt="Be brief.")).build(own)
    assert [m["role"] for m in request.messages] == ["system", "user"]
    assert request.messages[0]["content"][0]["text"] == "Be brief.\n\nYou know geography."
    request, _ = RequestBuilder(spec, options()).build(own)
    assert request.messages[0]["content"] == "You know geography."  # without the flag: untouched


# --- gen_kwargs ---------------------------------------------------------------------------------

def test_gen_kwargs_over_the_sample_over_the_task(tmp_path):
    spec = read_task_file(generate_task(
        tmp_path, "{kind: generate, generation: {max_new_tokens: 8, temperature: 0, do_sample: false, "
                  "top_p: 0.5, stop: [END]}}"))
    row = gen_row(generation_params={"max_new_tokens": 16, "top_p": 0.9})
    assert RequestBuilder(spec, options()).build(row)[0].gen == \
        {"max_new_tokens": 16, "temperature": 0, "do_sample": False, "top_p": 0.9, "stop": ["END"]}
    gen = RequestBuilder(spec, options(gen_kwargs={"max_new_tokens": 4, "temperature": 0.7})).build(row)[0].gen
    # the run's temperature decides sampling by itself: the task's do_sample: false is dropped
    assert gen == {"max_new_tokens": 4, "temperature": 0.7, "top_p": 0.9, "stop": ["END"]}
    gen = RequestBuilder(spec, options(gen_kwargs={"until": "STOP", "max_gen_toks": 3, "do_sample": False,
                                                   "temperature": 0.5})).build(row)[0].gen
    assert gen["stop"] == ["STOP"] and gen["max_new_tokens"] == 3 and gen["do_sample"] is False


def test_gen_kwargs_leave_log_likelihood_requests_alone():
    request, _ = RequestBuilder(read_task_file(PIQA), options(gen_kwargs={"temperature": 1.0})).build(PIQA_ROW)
    assert request.kind == LOGLIKELIHOOD and request.gen == {}


# --- the chat-template switch -------------------------------------------------------------------

def test_apply_chat_template_on_a_log_likelihood_task():
    request, rendered = RequestBuilder(read_task_file(PIQA), options(apply_chat_template=True)).build(PIQA_ROW)
    assert request.kind == LOGLIKELIHOOD and request.chat and request.prompt is None
    assert request.messages == ({"role": "user",
                                 "content": [{"type": "text", "text": "Question: Open a jar.\nAnswer:"}]},)
    assert request.continuations == ("Twist the lid.", "Freeze it.")  # no target delimiter, as lm-eval
    assert rendered["prompt"] == "Question: Open a jar.\nAnswer:"
    plain, _ = RequestBuilder(read_task_file(PIQA), options(apply_chat_template=False)).build(PIQA_ROW)
    assert not plain.chat and plain.prompt == "Question: Open a jar.\nAnswer:"


def test_apply_chat_template_overrides_a_generate_tasks_chat_setting(tmp_path):
    spec = read_task_file(generate_task(tmp_path, "{kind: generate, chat: true, prompt: prompt.jinja}"))
    assert RequestBuilder(spec, options()).build(gen_row())[0].chat
    request, _ = RequestBuilder(spec, options(apply_chat_template=False)).build(gen_row())
    assert request.kind == GENERATE and not request.chat and request.prompt == "Q: Capital of France?"
    plain = read_task_file(generate_task(tmp_path, "{kind: generate, prompt: prompt.jinja}"))
    assert RequestBuilder(plain, options(apply_chat_template=True)).build(gen_row())[0].chat


def test_multiturn_few_shot_needs_the_chat_template():
    with pytest.raises(GageError, match="--fewshot-as-multiturn .*needs the chat template.*--apply-chat-template"):
        RequestBuilder(read_task_file(PIQA), options(fewshot_as_multiturn=True))
    RequestBuilder(read_task_file(PIQA), options(fewshot_as_multiturn=True, apply_chat_template=True))
    assert not RequestBuilder(read_task_file(PIQA), options(fewshot_as_multiturn=None)).multiturn
    assert RequestBuilder(read_task_file(PIQA), options(fewshot_as_multiturn=None, apply_chat_template=True)).multiturn


class _Template:
    chat_template = "x"

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        assert tokenize is False and add_generation_prompt is True
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"


def test_request_context_formats_chat_requests_only():
    chat = Request(kind=LOGLIKELIHOOD, sample_id="x", messages=(
        {"role": "system", "content": "S"}, {"role": "user", "content": [{"type": "text", "text": "Q"}]}),
        continuations=("a",), chat=True)
    assert request_context(chat, _Template()) == "<system>S<user>Q<assistant>"
    plain = Request(kind=LOGLIKELIHOOD, sample_id="x", prompt="Q:", continuations=(" a",))
    assert request_context(plain, None) == "Q:"
    with pytest.raises(ValueError, match="chat template .* has none"):
        request_context(chat, object())
    with pytest.raises(ValueError, match="has none"):
        chat_context(chat.messages, None)


def test_openai_backend_without_a_tokenizer_refuses_chat_log_likelihoods():
    from gage_plugins_builtin.backends.openai_backend import OpenAIBackend

    backend = OpenAIBackend(base_url="http://127.0.0.1:9/v1", model="m")
    request = Request(kind=LOGLIKELIHOOD, sample_id="x", messages=({"role": "user", "content": "Q"},),
                      continuations=("a",), chat=True)
    out = asyncio.run(backend._loglikelihood(None, request))
    assert "chat template" in out.error and "tokenizer=" in out.error


# --- against lm-eval on the real SmolLM2 ----------------------------------------------------------

def built(folder: Path, **controls) -> list:
    """(request, rendered) for each data row of a task folder, built as a run builds them."""
    spec = read_task_file(folder)
    tr = TaskRun(spec, load_plugins()[1], RunOptions(tasks=[spec.name], **controls))
    assert tr.failure is None, tr.failure
    checker = RowChecker(tr.name, tr.preprocess, base_dir=tr.data_dir)
    return [tr.builder.build(checker.check(loc, i, rec).sample, i) for i, loc, rec in tr.rows()]



def piqa_on_sample_rows(task_yaml: Path) -> None:
    """The copied piqa reads its folder's sample.jsonl (the invented rows, or those the test wrote)
    and draws few-shot examples from it, as the shipped task did before it read real PIQA."""
    text = task_yaml.read_text()
    start, end = text.index("dataset:"), text.index("preprocessor:")
    text = text[:start] + "dataset:\n  loader: jsonl\n  args:\n    path: sample.jsonl\n" + text[end:]
    task_yaml.write_text(text.replace("  split: train\n", "  path: sample.jsonl\n", 1))


def _split_pool_task(tmp_path: Path) -> Path:
    folder = tmp_path / "piqa"
    shutil.copytree(PIQA, folder)
    piqa_on_sample_rows(folder / "task.yaml")
    (folder / "sample.jsonl").write_text("\n".join(SAMPLE_LINES[16:]) + "\n")
    (folder / "pool.jsonl").write_text("\n".join(SAMPLE_LINES[:16]) + "\n")
    text = (folder / "task.yaml").read_text()
    (folder / "task.yaml").write_text(text.replace("  path: sample.jsonl\n  sampler", "  path: pool.jsonl\n  sampler"))
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("case, controls", [
    ("chat_system_single_turn", {"system_prompt": "Be brief.", "fewshot_as_multiturn": False}),
    ("chat_multiturn", {"fewshot_as_multiturn": True}),
])
def test_chat_log_likelihoods_equal_lm_evals(tmp_path, smollm2, case, controls):
    """--apply-chat-template --num-fewshot 2 on piqa rows: the context SmolLM2's template makes, the
    continuations and their log-likelihoods are lm-eval 0.4.13's (tests/core/lm_eval_fewshot.json)."""
    expected = LM_EVAL[case]
    got = built(_split_pool_task(tmp_path), num_fewshot=2, apply_chat_template=True, **controls)[:len(expected)]
    requests = [r for r, _ in got]
    for request, lm in zip(requests, expected):
        assert request_context(request, smollm2.tokenizer) == lm["context"]
        assert list(request.continuations) == lm["continuations"]
    outputs = smollm2.run(requests)
    for out, lm in zip(outputs, expected):
        assert out.error is None, out.error
        assert out.loglikelihoods == pytest.approx(lm["loglikelihoods"], abs=1e-3)  # measured: 2e-5
    plain = smollm2.run([r for r, _ in built(_split_pool_task(tmp_path / "plain"), num_fewshot=2,
                                                **controls if "system_prompt" in controls else {})[:1]])
    assert plain[0].loglikelihoods != pytest.approx(outputs[0].loglikelihoods, abs=0.5)  # the switch matters


# --- reasoning strip ----------------------------------------------------------------------------

@pytest.mark.parametrize("text, answer", [
    ("<think>A or B? B.</think>\n\nB", "B"),
    ("<think>first</think> A <think>again</think> B", "B"),  # after the last end tag
    ("reasoning without an opening tag</think>B", "B"),  # templates that open the block in the prompt
    ("<think>still thinking when max_new_tokens ran out", ""),  # no answer
    ("Just B", "Just B"),
    ("", ""),
])
def test_strip_reasoning(text, answer):
    assert strip_reasoning(text) == answer
    out = strip_output({"text": text})
    assert out["text"] == answer
    assert out.get("raw_text") == (text if answer != text else None)


def test_a_run_scores_the_answer_and_keeps_the_raw_text(tmp_path):
    folder = generate_task(tmp_path, "{kind: generate}", extra="")
    (folder / "rows.jsonl").write_text(json.dumps(gen_row()) + "\n")
    (folder / "task.yaml").write_text("name: reasoned\n" + (folder / "task.yaml").read_text())
    raw = "<think>Lyon? No: Paris.</think>\nParis"

    def run(strip: bool, run_id: str) -> dict:
        run_dir = tmp_path / "runs" / run_id
        run_dir.mkdir(parents=True)
        Engine(RunOptions(tasks=["reasoned"], model="dummy", model_args={"response": "fixed", "text": raw},
                          include_paths=[str(folder)], strip_reasoning=strip, quiet=True), run_dir).run()
        return json.loads((run_dir / "samples" / "reasoned.jsonl").read_text())

    stripped = run(True, "a")
    assert stripped["eval_result"]["metrics"]["exact_match"]["value"] == 1.0
    entry = stripped["predict_result"][0]
    assert entry["message"]["content"][0]["text"] == "Paris" and entry["raw_text"] == raw
    kept = run(False, "b")
    assert kept["eval_result"]["metrics"]["exact_match"]["value"] == 0.0
    assert kept["predict_result"][0]["message"]["content"][0]["text"] == raw
    assert "raw_text" not in kept["predict_result"][0]
