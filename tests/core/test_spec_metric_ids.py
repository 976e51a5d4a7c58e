"""The metric ids of spec 004 section 8 (multi_choice_accuracy, judge_threshold, mmmu_accuracy,
docvqa_anls, and the spec's argument names on exact_match & co): unit tests, and the spec's ids
used unchanged in a task.yaml giving the numbers of gage-eval's own metrics on the shared data."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from gage_eval.api import MetricContext
from gage_eval.plugins import load_plugins
from gage_plugins_builtin.metrics.spec import (DocVQAANLS, JudgeThreshold, MMMUAccuracySpec,
                                               MultiChoiceAccuracy)
from gage_plugins_builtin.metrics.stats import Latency, TextLength
from gage_plugins_builtin.metrics.text import Contains, ExactMatch, NumericMatch, RegexMatch
from gage_plugins_builtin.multimodal.metrics import ANLS, MMMUAccuracy

ROOT = Path(__file__).resolve().parents[2]
SPEC_IDS = {"exact_match": "score", "contains": "score", "numeric_match": "score", "regex_match": "score",
            "judge_threshold": "score", "text_length": "length", "latency": "latency_ms",
            "multi_choice_accuracy": "acc", "mmmu_accuracy": "acc", "docvqa_anls": "anls"}

OPTIONS = [{"id": "A", "content": "Pour the water into the glass."},
           {"id": "B", "content": "Pour the glass into the water."},
           {"id": "C", "content": "Freeze it"}, {"id": "D", "content": "Freeze it solid first"}]


def mc_sample(label="B", **extra):
    """A gage-eval multiple-choice Sample, as the legacy preprocessor writes it."""
    return {"id": "s1", "options": OPTIONS, "label": label,
            "references": [{"answer": [{"type": "text", "text": label}]}],
            "metadata": {"option_map": {o["id"]: o["content"] for o in OPTIONS}}, **extra}


def mca(text, sample=None, **args):
    ctx = MetricContext(sample=sample or mc_sample(), model_output={"text": text})
    return MultiChoiceAccuracy(**args).compute(ctx)


def test_every_spec_id_is_registered_with_its_value_key():
    registry = load_plugins()[1]
    for name, value_key in SPEC_IDS.items():
        metric = registry.build("metrics", name, "test", **({"pattern": "x"} if name == "regex_match" else {}))
        assert metric.name == name and metric.value_key == value_key, name


@pytest.mark.parametrize("text, extracted, method", [
    ("B", "B", "id"), ("(B)", "B", "id"), (" b) ", "B", "id"), ("B.", "B", "id"),
    ("The answer is (B).", "B", "regex"), ("Answer: B", "B", "regex"), ("I pick option B because", "B", "regex"),
    ("The answer is A, no wait. The answer is B", "A", "regex"),          # take-first, as lm-eval
    ("You should pour the glass into the water, obviously.", "B", "option_text"),
    ("POUR THE GLASS INTO THE WATER", "B", "option_text"),
    ("freeze it solid first, then", "D", "option_text"),                    # the longest option wins
    ("My pick would be this one: B", "B", "colon"),
    ("<think>The answer is A? Or</think>The answer is B", "B", "regex"),   # reasoning dropped
])
def test_multi_choice_reads_a_letter_an_option_text_or_a_lead_in(text, extracted, method):
    result = mca(text)
    assert (result["extracted"], result["method"]) == (extracted, method)
    assert result["value"] == result["acc"] == float(extracted == "B")


def test_multi_choice_without_an_answer_scores_zero_and_is_counted():
    result = mca("I do not know.")
    assert result["value"] == 0.0 and result["counters"] == ["invalid_format"] and result["extracted"] == ""
    # a lower-case article is not an option id: "a" only counts as the whole answer
    assert mca("The answer is a mystery")["method"] == "invalid"


def test_multi_choice_label_may_be_an_id_a_text_or_an_index():
    for label in ("B", "Pour the glass into the water.", 1, ["B", "C"]):
        sample = mc_sample()
        sample["metadata"]["correct_choice"] = label
        assert mca("(B)", sample)["value"] == 1.0, label
        assert mca("(A)", sample)["value"] == 0.0, label


def test_multi_choice_mapped_option_ids():
    sample = {"id": "x", "metadata": {"option_map": {"yes": "It rains", "no": "It is dry"},
                                      "correct_choice": "no"}}
    assert mca("no", sample)["value"] == 1.0
    assert mca("The answer is: yes", sample)["extracted"] == "yes"
    assert mca("I think it is dry today", sample)["extracted"] == "no"
    # spec option lists ({label, text}) and plain text lists are option maps too
    listed = {"id": "x", "choices": [{"label": "1", "text": "red"}, {"label": "2", "text": "blue"}], "label": "2"}
    assert mca("blue", listed, option_map_field="sample.choices")["value"] == 1.0
    plain = {"id": "x", "opts": ["red", "blue"], "label": "B"}
    assert mca("Answer: (B)", plain, option_map_field="opts")["value"] == 1.0


def test_multi_choice_without_options_reads_letters():
    sample = {"id": "x", "label": "c"}
    assert mca("The answer is (C).", sample, option_map_field="sample.nothing")["value"] == 1.0
    assert mca("E", {"id": "x", "label": 4})["value"] == 1.0          # an index: the fifth letter
    assert mca("(K)", {"id": "x", "label": "K"})["method"] == "invalid"  # A-J only
    assert mca("pour the glass", sample, ignore_punctuation=True)["method"] == "invalid"


def test_multi_choice_ignore_punctuation_and_regexes_to_ignore():
    sample = mc_sample("D")
    assert mca("Freeze, it... solid first!", sample, ignore_punctuation=True)["extracted"] == "D"
    assert mca("Freeze, it... solid first!", sample)["extracted"] == ""
    assert mca("[[Freeze it solid]] first", sample, regexes_to_ignore=[r"\[\[|\]\]"])["extracted"] == "D"


def test_multi_choice_custom_regex_and_group_select():
    assert mca("Final: [B] ... [A]", regex_pattern=r"\[([A-D])\]")["extracted"] == "B"
    assert mca("Final: [B] ... [A]", regex_pattern=r"\[([A-D])\]", group_select=-1)["extracted"] == "A"
    with pytest.raises(ValueError, match="bad regular expression"):
        MultiChoiceAccuracy(regex_pattern="(")


def test_multi_choice_reads_the_field_it_is_given_not_the_default():
    """The seed's multi_choice_accuracy ignored prediction_field and read an unfilled field: this
    fails for any metric that reads anything but the configured prediction and label fields."""
    sample = mc_sample(label="A")                       # the default label field says A...
    sample["metadata"]["correct_choice"] = "A"
    sample["metadata"]["gold"] = "C"                    # ...the configured one says C
    out = {"text": "A", "answer": "A"}                  # the default prediction fields say A
    judge = {"answer": "(C)"}                           # the configured prediction says C
    ctx = MetricContext(sample=sample, model_output=out, judge_output=judge)
    metric = MultiChoiceAccuracy(prediction_field="judge_output.answer", label_field="sample.metadata.gold")
    result = metric.compute(ctx)
    assert result["extracted"] == "C" and result["reference"] == "C" and result["value"] == 1.0
    # and a wrong configured answer scores 0 even though the default fields agree with each other
    ctx = MetricContext(sample=sample, model_output=out, judge_output={"answer": "B"})
    assert metric.compute(ctx)["value"] == 0.0
    # the default prediction field, model_output.answer, is read when present (before .text)
    ctx = MetricContext(sample=mc_sample("B"), model_output={"text": "B", "answer": "D"})
    assert MultiChoiceAccuracy().compute(ctx)["extracted"] == "D"
    # a configured field that is absent is an error, never a silent 0 from another field
    with pytest.raises(ValueError, match="judge_output.answer"):
        metric.compute(MetricContext(sample=sample, model_output=out, judge_output={}))


def test_judge_threshold():
    def run(verdict, **args):
        return JudgeThreshold(**args).compute(MetricContext(sample={"id": "x"}, model_output={"text": ""},
                                                            judge_output=verdict))

    assert run({"score": 0.5})["value"] == 1.0 and run({"score": 0.49})["value"] == 0.0
    assert run({"score": 0.7, "label": "pass"}, threshold=0.8) == {
        "value": 0.0, "score": 0.0, "correct": False, "judge_score": 0.7, "threshold": 0.8,
        "method": "judge_threshold", "extracted": "pass"}
    assert run({"score": 7, "details": {"raw_score": 0.9}}, judge_field="judge_output.details.raw_score",
               threshold=0.95)["value"] == 0.0
    assert run({"score": 0.1, "details": {"s": 0.9}}, score_field="judge_output.details.s")["value"] == 1.0
    assert run(None) == {"value": None}                       # not graded: no value
    assert run({"error": "no score in reply"}) == {"value": None}  # a judge error: the engine counts it
    with pytest.raises(ValueError, match="not a number"):
        run({"score": "high"})
    with pytest.raises(ValueError, match="not both"):
        JudgeThreshold(judge_field="judge_output.score", score_field="judge_output.x")


def test_mmmu_accuracy_and_docvqa_anls_equal_their_gage_eval_metrics():
    mmmu = {"id": "validation_x_1", "options": [{"id": "A", "content": "$6"}, {"id": "B", "content": "$7"}],
            "references": [{"answer": [{"type": "text", "text": "B"}]}], "label": "B"}
    for text in ("(B)", "A", "The answer is $7 as computed here", "no idea", "C"):
        ctx = MetricContext(sample=mmmu, model_output={"text": text})
        ours, theirs = MMMUAccuracySpec().compute(ctx), MMMUAccuracy().compute(ctx)
        assert ours.pop("acc") == theirs["value"] and ours == theirs, text
    docs = {"id": "d", "references": [{"answer": "San Diego"}, {"answer": "san diego, ca"}]}
    for text in ("San Diego", "sandiego", "Los Angeles", ""):
        ctx = MetricContext(sample=docs, model_output={"text": text})
        ours, theirs = DocVQAANLS().compute(ctx), ANLS().compute(ctx)
        assert ours.pop("anls") == theirs["value"] and ours == theirs, text
    # the spec's own canonical fields, when a record has them, are what is read
    spec_row = {"id": "d", "metadata": {"answers": ["university of california"]}, "references": ["nothing"]}
    ctx = MetricContext(sample=spec_row, model_output={"text": "x", "answer": "University of California"})
    assert DocVQAANLS().compute(ctx)["anls"] == 1.0
    seed_mmmu = {"id": "m", "choices": [{"message": {"content": [{"type": "text", "text": "B"}]}}],
                 "options": mmmu["options"], "references": ["A"]}
    ctx = MetricContext(sample=seed_mmmu, model_output={"answer": "(B)"})
    assert MMMUAccuracySpec().compute(ctx)["acc"] == 1.0
    with pytest.raises(ValueError, match="threshold"):
        DocVQAANLS(threshold=0)


def test_text_metrics_take_the_spec_argument_names():
    sample = {"id": "x", "label": "Paris", "references": ["Lyon"], "metadata": {"n": "3.0"}}
    ctx = MetricContext(sample=sample, model_output={"text": "paris", "answer": "Paris", "latency_ms": 12.5})
    # spec default label path `label` (no root: sample.label); model_output.answer is read when present
    assert ExactMatch(label_field="label", prediction_field="model_output.answer").compute(ctx)["value"] == 1.0
    assert ExactMatch(label_field="label", case_sensitive=True).compute(ctx)["value"] == 0.0
    assert ExactMatch(label_field="label").compute(ctx)["value"] == 1.0            # case-insensitive default
    assert ExactMatch().compute(ctx)["value"] == 0.0                               # gage-eval defaults unchanged
    assert Contains(label_field="sample.label").compute(ctx)["value"] == 1.0
    assert NumericMatch(prediction_field="metadata.n", label_field="metadata.n").compute(ctx)["value"] == 1.0
    assert RegexMatch(pattern="^P", target_field="model_output.answer").compute(ctx)["value"] == 1.0
    assert TextLength(target_field="model_output.answer", unit="char").compute(ctx) == 5.0
    assert Latency(target_field="model_output.latency_ms").compute(ctx) == 12.5
    # model_output.answer falls back to gage-eval's model_output.text when the output has none
    plain = MetricContext(sample=sample, model_output={"text": "Paris"})
    assert ExactMatch(label_field="label", prediction_field="model_output.answer").compute(plain)["value"] == 1.0
    with pytest.raises(ValueError, match="not both"):
        ExactMatch(prediction="model_output.text", prediction_field="model_output.answer")
    with pytest.raises(ValueError, match="not both"):
        ExactMatch(ignore_case=True, case_sensitive=True)


# -- the spec's ids in a task.yaml, through the real CLI --------------------------------------

def _task_copy(tmp_path: Path, name: str, metrics: list, prompt: str | None = None) -> Path:
    folder = tmp_path / "tasks" / name
    shutil.copytree(ROOT / "tasks" / name, folder)
    spec = yaml.safe_load((folder / "task.yaml").read_text())
    spec["metrics"] = metrics
    if prompt is not None:
        (folder / "prompt.jinja").write_text(prompt)
        spec["request"]["prompt"] = "prompt.jinja"
    spec.pop("primary_metric", None)
    (folder / "task.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return folder.parent


def _run(run_cli, tmp_path: Path, include: Path, task: str, data: Path, *model_args: str) -> tuple[dict, list]:
    out = tmp_path / "runs"
    args = ["--tasks", task, "--include-path", include, "--model", "dummy", "--data", f"{task}={data}",
            "-o", out, "--run-id", "r", "--quiet"]
    for a in model_args:
        args += ["--model-args", a]
    result = run_cli(*args)
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "r" / "summary.json").read_text())["tasks"][task]
    records = [json.loads(line) for line in (out / "r" / "samples" / f"{task}.jsonl").read_text().splitlines()]
    return summary, records


def _same(summary: dict, a: str, b: str) -> None:
    ma, mb = summary["metrics"][a], summary["metrics"][b]
    assert (ma["value"], ma["stderr"], ma["n"]) == (mb["value"], mb["stderr"], mb["n"])
    for key, by_value in summary["slices"].items():
        for value, metrics in by_value.items():
            assert metrics[a]["value"] == metrics[b]["value"], (key, value)


def test_spec_ids_in_a_task_yaml_give_gage_eval_numbers_on_mmmu(run_cli, shared_data, tmp_path):
    vals = tmp_path / "mmmu_val"
    vals.mkdir()
    for subject in ("Accounting", "Economics", "Finance"):
        (vals / f"{subject}.parquet").symlink_to(shared_data / "mmmu" / subject / "validation-00000-of-00001.parquet")
    # the spec's entry verbatim as section 16.1.4 writes it, the bare spec id, and gage-eval's own metric
    spec_entry = yaml.safe_load("""
      metric_id: mmmu_acc
      implementation: mmmu_accuracy
      params:
        label_field: sample.choices.0.message.content.0.text
        prediction_field: model_output.answer
    """)
    include = _task_copy(tmp_path, "mmmu", [spec_entry, "mmmu_accuracy",
                                            {"name": "mmmu_acc", "as": "gage_mmmu_acc", "args": {"seed": 0}}])
    summary, records = _run(run_cli, tmp_path, include, "mmmu", vals)
    assert summary["metrics"]["gage_mmmu_acc"]["n"] == 90
    _same(summary, "mmmu_acc", "gage_mmmu_acc")
    _same(summary, "mmmu_accuracy", "gage_mmmu_acc")
    assert 0 < summary["metrics"]["gage_mmmu_acc"]["value"] < 1
    assert all(r["eval_result"]["metrics"]["mmmu_acc"]["acc"] == r["eval_result"]["metrics"]["gage_mmmu_acc"]["value"]
               for r in records)
    counters = summary["counts"]["by_counter"]
    assert counters["mmmu_accuracy.fallback"] == counters["mmmu_acc.fallback"] == counters["gage_mmmu_acc.fallback"] > 0


def test_spec_ids_in_a_task_yaml_give_gage_eval_numbers_on_docvqa(run_cli, shared_data, tmp_path):
    data = shared_data / "docvqa" / "derived" / "DocVQA" / "validation-00000-of-00001.parquet"
    include = _task_copy(tmp_path, "docvqa", [
        {"metric_id": "docvqa_anls", "params": {"answers_field": "sample.metadata.answers",
                                                "prediction_field": "model_output.answer", "threshold": 0.5}},
        {"name": "anls", "args": {"threshold": 0.5}}],
        # echo answers the prompt's last line: the gold answer less its last character, so the
        # rows score between 0 and 1 (a one-character answer echoes the question: 0)
        prompt="{{ question }}\n{{ sample.label[:-1] }}")
    for mode in ("echo", "letter"):
        summary, records = _run(run_cli, tmp_path / mode, include, "docvqa", data, f"response={mode}")
        assert summary["metrics"]["anls"]["n"] == 15
        _same(summary, "docvqa_anls", "anls")
        if mode == "echo":
            values = {r["eval_result"]["metrics"]["anls"]["value"] for r in records}
            assert 0.0 in values and len(values) > 3 and 0.5 < summary["metrics"]["anls"]["value"] < 1
        assert [r["eval_result"]["metrics"]["docvqa_anls"]["anls"] for r in records] == \
               [r["eval_result"]["metrics"]["anls"]["value"] for r in records]


PIQA_GENERATE = """\
name: piqa_gen
version: 1
dataset:
  loader: jsonl
  args: {{path: {data}}}
preprocessor:
  name: legacy
  args: {{question: goal, choices: [sol1, sol2], answer: label, task_type: multiple-choice}}
request:
  kind: generate
  prompt: prompt.jinja
metrics: {metrics}
"""


def _piqa_task(tmp_path: Path, data: Path, prompt: str, metrics: list) -> Path:
    folder = tmp_path / "tasks" / "piqa_gen"
    folder.mkdir(parents=True)
    (folder / "task.yaml").write_text(PIQA_GENERATE.format(data=json.dumps(str(data)), metrics=json.dumps(metrics)))
    (folder / "prompt.jinja").write_text(prompt)
    return folder.parent


def test_multi_choice_accuracy_on_piqa_generative_rows(run_cli, shared_data, tmp_path):
    data = shared_data / "piqa" / "derived" / "validation.jsonl"
    rows = [json.loads(line) for line in data.read_text().splitlines()][:200]
    small = tmp_path / "piqa200.jsonl"
    small.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # 1. the dummy answers a bare letter A-D: the spec metric equals exact match of that letter
    #    with the gold option id (the letter-scoring of the choice), row by row
    include = _piqa_task(tmp_path / "letter", small, "Question: {{ question }}\nA. {{ options[0].content }}\n"
                         "B. {{ options[1].content }}\nAnswer:",
                         ["multi_choice_accuracy", {"name": "exact_match", "args": {"reference": "sample.label"}}])
    summary, records = _run(run_cli, tmp_path / "letter", include, "piqa_gen", small, "response=letter")
    _same(summary, "multi_choice_accuracy", "exact_match")
    letters = [r["predict_result"][0]["message"]["content"][0]["text"] for r in records]
    by_counter = summary["counts"].get("by_counter", {})
    assert by_counter.get("multi_choice_accuracy.invalid_format", 0) == sum(t in "CD" for t in letters) > 0
    # 2. the dummy echoes a whole option's text (the first option's): read by its text, so the
    #    accuracy is the share of rows whose gold option is the first, as choice scoring counts it
    include = _piqa_task(tmp_path / "echo", small, "Question: {{ question }}\n{{ options[0].content }}",
                         ["multi_choice_accuracy"])
    summary, records = _run(run_cli, tmp_path / "echo", include, "piqa_gen", small, "response=echo")
    first_is_gold = sum(1 for r in rows if r["label"] == 0) / len(rows)
    assert summary["metrics"]["multi_choice_accuracy"]["value"] == pytest.approx(first_is_gold)
    methods = {r["eval_result"]["metrics"]["multi_choice_accuracy"]["method"] for r in records}
    assert methods == {"option_text"}


def test_judge_threshold_reads_the_judges_score_in_a_run(run_cli, tmp_path):
    """legal_eval_v1 with a dummy judge that answers "Score: 0.8" (rubric rows: the weighted share
    of criteria met): judge_threshold is 1 exactly where the judge's own score passes 0.7, and its
    mean is the pass rate judge_score's pass_threshold reports."""
    include = _task_copy(tmp_path, "legal_eval_v1", [
        {"metric_id": "judge_threshold", "params": {"judge_field": "judge_output.score", "threshold": 0.7}},
        {"name": "judge_score", "args": {"pass_threshold": 0.7}}])
    out = tmp_path / "runs"
    result = run_cli("--tasks", "legal_eval_v1", "--include-path", include, "--model", "dummy",
                     "--judge-model", "dummy", "--judge-args", "response=fixed,text=Score: 0.8",
                     "-o", out, "--run-id", "r", "--quiet")
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in (out / "r" / "samples" / "legal_eval_v1.jsonl").read_text().splitlines()]
    graded = [r for r in records if r["eval_result"].get("judge", {}).get("score") is not None]
    assert len(graded) >= 2
    passes = []
    for r in records:
        metrics, judge = r["eval_result"]["metrics"], r["eval_result"].get("judge", {})
        if judge.get("score") is None:
            assert metrics["judge_threshold"] == {"value": None}
            continue
        ours = metrics["judge_threshold"]
        assert ours["judge_score"] == judge["score"]
        assert ours["value"] == ours["score"] == float(judge["score"] >= 0.7) == float(metrics["judge_score"]["correct"])
        passes.append(ours["value"])
    assert 0 < sum(passes) < len(passes)          # both outcomes occur
    summary = json.loads((out / "r" / "summary.json").read_text())["tasks"]["legal_eval_v1"]
    assert summary["metrics"]["judge_threshold"]["value"] == pytest.approx(sum(passes) / len(passes))
    assert summary["metrics"]["judge_threshold"]["n"] == len(passes)


def test_a_spec_metric_entry_is_read_as_gage_eval_entry(tmp_path):
    from gage_eval.api.schemas import validation_errors
    from gage_eval.tasks.spec import metric_entry

    assert metric_entry({"metric_id": "acc1", "implementation": "multi_choice_accuracy",
                         "params": {"label_field": "label"}}) == {
        "name": "multi_choice_accuracy", "as": "acc1", "args": {"label_field": "label"}}
    assert metric_entry({"metric_id": "docvqa_anls"}) == {"name": "docvqa_anls"}
    assert metric_entry("acc") == "acc" and metric_entry({"name": "acc", "as": "a"}) == {"name": "acc", "as": "a"}
    task = {"dataset": {"loader": "jsonl"}, "request": {"kind": "generate"}}
    assert not validation_errors({**task, "metrics": [{"metric_id": "m", "implementation": "x", "params": {}}]}, "task")
    # the two forms do not mix: a mixed entry is refused by the schema
    assert validation_errors({**task, "metrics": [{"metric_id": "m", "name": "x"}]}, "task")
    # spec section 7.5's shorthands: a call string and {metric: {params}}
    assert metric_entry("regex_match(pattern='\\d+', compare_group=0)") == {
        "name": "regex_match", "args": {"pattern": "\\d+", "compare_group": 0}}
    assert metric_entry({"numeric_match": {"tolerance": 0.1}}) == {"name": "numeric_match", "args": {"tolerance": 0.1}}
    assert metric_entry({"contains": None}) == {"name": "contains"}
    for bad in ("regex_match(1)", "regex_match(pattern=x)", "os.system('x')", "f(**k)", "acc("):
        with pytest.raises(ValueError, match="neither a metric name nor a call"):
            metric_entry(bad)
    for ok in ({"numeric_match": {"tolerance": 0.1}}, "regex_match(pattern='x')"):
        assert not validation_errors({**task, "metrics": [ok]}, "task"), ok
    assert validation_errors({**task, "metrics": [{"numeric_match": 3}]}, "task")
    assert validation_errors({**task, "metrics": [{"a": {}, "b": {}}]}, "task")


def test_spec_shorthand_entries_in_a_task_yaml(run_cli, tmp_path):
    include = _task_copy(tmp_path, "piqa", [
        "acc", {"acc_norm": {"gold": "sample.label"}},
        "multi_choice_accuracy(prediction_field='model_output.text', label_field='sample.label')"])
    result = run_cli("--tasks", "piqa", "--include-path", include, "--model", "dummy", "-o", tmp_path / "runs",
                     "--run-id", "r", "--quiet")
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "runs" / "r" / "summary.json").read_text())["tasks"]["piqa"]
    assert set(summary["metrics"]) == {"acc", "acc_norm", "multi_choice_accuracy"}
    _same(summary, "multi_choice_accuracy", "acc")
    (include / "piqa" / "task.yaml").write_text((include / "piqa" / "task.yaml").read_text().replace(
        "multi_choice_accuracy(prediction_field=", "multi_choice_accuracy(prediction_field=open("))
    result = run_cli("--tasks", "piqa", "--include-path", include, "--model", "dummy", "-o", tmp_path / "runs")
    assert result.exit_code == 3, result.output  # the task cannot run, as with any invalid task.yaml
    assert "task.yaml: key 'metrics.2': " in result.output and "Traceback" not in result.output


def test_a_run_config_may_override_metrics_with_spec_entries(run_cli, tmp_path):
    """A run config's per-task metrics in spec 004's form (tasks/piqa scored by log-likelihood, so
    multi_choice_accuracy reads the chosen continuation's text: equal to acc on every row)."""
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({
        "models": {"dut": {"backend": "dummy"}}, "limit": 40,
        "tasks": [{"name": "piqa", "metrics": [
            "acc", {"metric_id": "mc", "implementation": "multi_choice_accuracy",
                    "params": {"prediction_field": "model_output.text", "label_field": "sample.label"}}]}]}))
    result = run_cli("--config", cfg, "-o", tmp_path, "--run-id", "r", "-q")
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())["tasks"]["piqa"]
    assert set(summary["metrics"]) == {"acc", "mc"}
    _same(summary, "mc", "acc")
    records = [json.loads(line) for line in (tmp_path / "r" / "samples" / "piqa.jsonl").read_text().splitlines()]
    assert {r["eval_result"]["metrics"]["mc"]["method"] for r in records} == {"option_text"}


def test_the_spec_judge_multi_choice_entry_reads_the_judges_reply():
    """Spec 004 section 6.4.3: multi_choice_accuracy on the judge's answer. gage-eval's judges keep
    their reply as judge_output.raw, read for the spec's judge_output.answer when it is absent."""
    entry = {"prediction_field": "judge_output.answer", "label_field": "sample.metadata.correct_choice"}
    sample = mc_sample("A")
    sample["metadata"]["correct_choice"] = "C"
    verdict = {"score": 1.0, "label": "pass", "raw": "CORRECT: C\nSCORE: 1.0"}
    ctx = MetricContext(sample=sample, model_output={"text": "A"}, judge_output=verdict)
    result = MultiChoiceAccuracy(**entry).compute(ctx)
    assert (result["extracted"], result["value"]) == ("C", 1.0)
    ctx = MetricContext(sample=sample, model_output={"text": "C"}, judge_output={**verdict, "answer": "B"})
    assert MultiChoiceAccuracy(**entry).compute(ctx)["extracted"] == "B"   # present: read as given
