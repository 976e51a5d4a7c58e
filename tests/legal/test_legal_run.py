"""legal_eval_v1 end to end with the dummy backend: every shared row scored or errored, judge errors counted."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gage_eval.api.judge import Verdict
from gage_eval.api.backend import ModelOutput
from gage_eval.api.sample import RowContext
from gage_plugins_builtin.judges import LLMJudge, parse_reply, ReplyError
from gage_plugins_builtin.legal.metrics import parse_choice_ids
from gage_plugins_builtin.legal.preprocess import LegalEvalV1

MERGED = "legal_eval_v1/data/for_eval/merged_legal_eval_v1.jsonl"
TASK_DIR = Path(__file__).resolve().parents[2] / "tasks" / "legal_eval_v1"


def _summary(out: Path) -> dict:
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    return json.loads((run / "summary.json").read_text()), run


@pytest.mark.slow  # (seconds on two cores: left out of the README's quick subset)
def test_full_shared_file_with_garbage_judge_counts_judge_errors(shared_data, tmp_path, run_cli):
    result = run_cli("--tasks", "legal_eval_v1", "--model", "dummy", "--judge-model", "dummy",
                     "--judge-args", "response=fixed,text=blah", "--data", f"legal_eval_v1={shared_data / MERGED}",
                     "-o", tmp_path, "-q")
    assert result.exit_code == 1, result.output  # judge errors are errored rows
    summary, run = _summary(tmp_path)
    task = summary["tasks"]["legal_eval_v1"]
    counts = task["counts"]
    assert counts["total"] == 108
    assert counts["scored"] + counts["errored"] + counts["skipped"] == counts["total"]
    assert counts["judge_errors"] == 48 and counts["errored"] == 48  # 10 reference_qa + 38 rubric_qa
    assert task["metrics"]["score"]["n"] == 60  # mcq rows only: no judge score became a silent 0
    assert "judge_score" not in task["metrics"]
    records = [json.loads(l) for l in (run / "samples" / "legal_eval_v1.jsonl").open()]
    assert len(records) == 108 and len({r["id"] for r in records}) == 108
    judged = [r for r in records if r["task_type"] != "mcq"]
    assert all(r["eval_result"]["error"]["stage"] == "judge" and "blah" in r["eval_result"]["error"]["message"]
               for r in judged)
    assert all("judge" not in r["eval_result"] for r in records if r["task_type"] == "mcq")


def test_full_shared_file_scores_every_row(shared_data, tmp_path, run_cli):
    result = run_cli("--tasks", "legal_eval_v1", "--model", "dummy", "--judge-model", "dummy",
                     "--judge-args", "response=fixed,text=Verdict: correct",
                     "--data", f"legal_eval_v1={shared_data / MERGED}", "-o", tmp_path, "-q")
    assert result.exit_code == 0, result.output
    summary, run = _summary(tmp_path)
    task = summary["tasks"]["legal_eval_v1"]
    assert task["counts"]["total"] == task["counts"]["scored"] == 108
    assert task["metrics"]["score"]["n"] == 108
    assert task["metrics"]["choice_set_match"]["n"] == 60 and task["metrics"]["judge_score"]["n"] == 48
    slices = task["slices"]
    assert {k: v["score"]["n"] for k, v in slices["task_type"].items()} == {"mcq": 60, "reference_qa": 10, "rubric_qa": 38}
    assert {k: v["score"]["n"] for k, v in slices["dataset"].items()} == {
        "apexv1": 1, "includebase": 20, "lexam": 50, "prbench": 37}
    # a judge that finds every criterion met: 1.0 minus the share of the (negative) pitfall weights
    assert slices["task_type"]["reference_qa"]["score"]["value"] == 1.0
    assert 0.8 < slices["task_type"]["rubric_qa"]["score"]["value"] < 1.0
    records = {r["id"]: r for r in map(json.loads, (run / "samples" / "legal_eval_v1.jsonl").open())}
    apex = records["apexv1:1382"]
    assert "North Atlantic" in apex["predict_result"][0]["prompt"]  # the PDF's text went into the prompt
    instances = [json.loads(l) for l in (run / "instances" / "legal_eval_v1.jsonl").open()]
    judged = [i for i in instances if i["metadata"]["task_type"] != "mcq"]
    assert all(a["extraction_method"] == "llm_judge" for i in judged for a in i["answer_attribution"][1:])
    assert all(len(i["answer_attribution"]) == 1 for i in instances if i["metadata"]["task_type"] == "mcq")


def test_preprocessor_maps_rows_and_ids_are_stable(shared_data):
    path = shared_data / MERGED
    rows = [json.loads(l) for l in path.read_text().splitlines()]
    pre = LegalEvalV1(attachments="file")
    ctx = lambda i: RowContext(task="legal_eval_v1", locator=f"{path}:{i + 1}", index=i, base_dir=path.parent)
    samples = [pre(r, ctx(i)) for i, r in enumerate(rows)]
    assert [s["id"] for s in samples] == [r["id"] for r in rows] == [pre(r, ctx(i))["id"] for i, r in enumerate(rows)]
    for row, s in zip(rows, samples):
        assert s["task_type"] == row["task_type"] and s["metadata"]["policy_id"] == row["metadata"]["policy_id"]
        assert s["data_tag"] == {"task_type": row["task_type"], "dataset": row["dataset"]}
        if row["task_type"] == "mcq":
            assert [o["id"] for o in s["options"]] == [c["id"] for c in row["choices"]]
            assert s["label"] == ",".join(row["correct_choice_ids"])
        if row["task_type"] == "rubric_qa":
            assert len(s["eval_config"]["rubric"]) == len(row["rubric"])
            assert all(isinstance(c["weight"], float) for c in s["eval_config"]["rubric"])
        if row.get("messages"):
            assert [m["role"] for m in s["messages"]] == [m["role"] for m in row["messages"]]
    apex = next(s for s in samples if s["id"] == "apexv1:1382")
    seg = apex["messages"][-1]["content"][0]
    assert seg["type"] == "file_url" and seg["file_url"]["url"].startswith("file://")
    assert seg["file_url"]["url"].endswith(".pdf")


def test_preprocessor_refuses_missing_attachment_and_invalid_row(tmp_path):
    row = {"schema_version": "legal_eval_v1", "id": "x", "dataset": "d", "task_type": "reference_qa",
           "prompt": "p", "reference_answers": ["a"], "attachments": [{"path": "nope.pdf"}]}
    ctx = RowContext(task="t", locator="f:1", index=0, base_dir=tmp_path)
    with pytest.raises(ValueError, match="nope.pdf.*not found"):
        LegalEvalV1()(row, ctx)
    with pytest.raises(ValueError, match=r"\$.reference_answers"):
        LegalEvalV1(validate=True)(dict(row, reference_answers=[], attachments=[]), ctx)


@pytest.mark.parametrize("reply,score", [
    ('{"score": 0.7, "reason": "ok"}', 0.7), ('Some words {"result": 1, "reason": "fine"}', 1.0),
    ('{"criteria_met": false}', 0.0), ("SCORE: 8/10", 0.8), ("Score = 7", 0.7), ("score: 45%", 0.45),
    ("Correct", 1.0), ("incorrect.", 0.0), ("Yes, the response names the court.", 1.0), ("No", 0.0),
    ("PASS", 1.0), ("Verdict: fail", 0.0), ("<think>hmm {\"score\": 0}</think>\n{\"score\": 1}", 1.0),
])
def test_judge_reply_parsing(reply, score):
    assert parse_reply(reply)[0] == pytest.approx(score)


@pytest.mark.parametrize("reply", ["blah", "", "A", '{"score": 42}', "SCORE: 12/10", "maybe partially"])
def test_unparseable_judge_reply_is_an_error(reply):
    with pytest.raises(ReplyError):
        parse_reply(reply)


def test_rubric_verdict_weights_and_errors():
    judge = LLMJudge(base_dir=str(TASK_DIR), reference_template="judge_reference.jinja",
                     rubric_template="judge_rubric.jinja")
    sample = {"id": "s", "task_type": "rubric_qa", "messages": [{"role": "user", "content": [{"type": "text", "text": "q"}]}],
              "references": [], "metadata": {"policy_id": "prbench_v1"},
              "eval_config": {"rubric": [{"id": "a", "title": "A", "weight": 6.0}, {"id": "b", "title": "B", "weight": 4.0},
                                         {"id": "c", "title": "C", "weight": -5.0}]}}
    reqs = judge.requests(sample, {"text": "answer"})
    assert len(reqs) == 3 and "<<rubric_item>>\nB" in reqs[1].prompt and "answer" in reqs[0].prompt
    met = lambda *flags: [ModelOutput(text=json.dumps({"criteria_met": f})) for f in flags]
    assert judge.verdict(sample, {}, met(True, False, False)).score == pytest.approx(0.6)
    assert judge.verdict(sample, {}, met(True, True, True)).score == pytest.approx(0.5)
    assert judge.verdict(sample, {}, met(False, False, True)).score == 0.0
    bad = judge.verdict(sample, {}, met(True, True)[:1] + [ModelOutput(text="hmm"), ModelOutput(error="timeout")])
    assert isinstance(bad, Verdict) and bad.score is None and "2 of 3" in bad.error
    assert judge.requests(dict(sample, task_type="mcq"), {"text": "A"}) == []


@pytest.mark.parametrize("text,found", [
    ("A", ["A"]), ("C. ii und iii", ["C"]), ("The answer is B and D.", ["B", "D"]), ("Answer: a good one", None),
    ('{"answer": ["C", "A"]}', ["A", "C"]), ("\\boxed{B}", ["B"]), ("Die richtige Antwort ist C", ["C"]), ("blah", None),
])
def test_choice_id_parsing(text, found):
    got = parse_choice_ids(text, ["A", "B", "C", "D"])
    assert (got[0] if got else None) == found
