"""Issue 25: the group numbers gage-eval's outputs show, against lm-evaluation-harness 0.4.13's own
aggregation of the same per-task figures.

Run it with lm-eval's Python (it imports lm_eval, not gage_eval), on a gage-eval run A of a group
(with ``--eee-version 0.3.0``) and ``gage-eval compare A B --json`` (B: another run) saved to a file::

    python benchmarks/group_outputs_vs_lm_eval.py RUN_A COMPARE_JSON

For each group of run A's summary.json (``--tasks mmlu``: mmlu and its four categories), lm-eval's
TaskManager gives the group's leaf tasks from lm-eval's own group and tag definitions, and
``lm_eval.api.metrics`` aggregates the run's per-task value, stderr and row count as lm-eval's
``Group.aggregate`` does (``aggregate_subtask_metrics``; ``pooled_sample_stderr`` for a size-weighted
group, ``unweighted_mean_stderr`` otherwise). The table then puts beside it what summary.json, the
console's source, report.html (its data-key cells), compare (``mean_a``/``mean_b``) and the EEE
aggregate (``eee_aggregate.json``) hold for the same group, and the largest difference of each.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path


def lm_eval_leaves(tm, name: str) -> list[str]:
    entry = tm.task_index[name]
    kind = entry.kind.name
    if kind == "TAG":
        return sorted(entry.tags)
    if kind != "GROUP":
        return [name]
    out: list[str] = []
    for member in entry.cfg["task"]:
        out.extend(lm_eval_leaves(tm, member))
    return out


def lm_eval_group(tm, name: str, tasks: dict) -> dict:
    from lm_eval.api.metrics import aggregate_subtask_metrics, pooled_sample_stderr, unweighted_mean_stderr

    cfg = tm.task_index[name].cfg
    leaves = lm_eval_leaves(tm, name)
    out = {"leaves": leaves}
    for agg in cfg.get("aggregate_metric_list") or []:
        metric, by_size = agg["metric"], agg.get("weight_by_size", True)
        values = [tasks[t]["metrics"][metric]["value"] for t in leaves]
        sizes = [tasks[t]["metrics"][metric]["n"] for t in leaves]
        stderrs = [tasks[t]["metrics"][metric]["stderr"] for t in leaves]
        stderr = pooled_sample_stderr(stderrs, sizes) if by_size else unweighted_mean_stderr(stderrs)
        out[metric] = {"value": aggregate_subtask_metrics(values, sizes, by_size), "stderr": stderr, "n": sum(sizes)}
    return out


def main(run_a: Path, compare_json: Path) -> int:
    from lm_eval.tasks import TaskManager

    for need in (run_a / "summary.json", run_a / "report.html", run_a / "eee_aggregate.json", compare_json):
        if not need.is_file():
            print(f"{need}: missing (run A with --eee-version 0.3.0, compare's --json saved to a file)", file=sys.stderr)
            return 2
    tm = TaskManager()
    summary = json.loads((run_a / "summary.json").read_text())
    html = (run_a / "report.html").read_text()
    cells = dict(re.findall(r'data-key="0/group/([^"]+)" data-value="([^"]*)"', html))
    compared = json.loads(compare_json.read_text())["groups"]
    eee = {r["evaluation_result_id"]: r for r in json.loads((run_a / "eee_aggregate.json").read_text())
           ["evaluation_results"]}
    print("| group | metric | leaves equal | lm-eval value | lm-eval stderr | n | max abs diff: summary.json | "
          "report.html | compare | EEE aggregate |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    worst = 0.0
    for name, group in summary["groups"].items():
        lm = lm_eval_group(tm, name, summary["tasks"])
        for metric, ours in group["metrics"].items():
            ref = lm[metric]
            diffs = {
                "summary": max(abs(ours["value"] - ref["value"]), abs(ours["stderr"] - ref["stderr"]),
                               abs(ours["n"] - ref["n"])),
                "report": max(abs(float(cells[f"{name}/{metric}/{f}"]) - ref[f]) for f in ("value", "stderr", "n")),
                "compare": abs(compared[name]["metrics"][metric]["mean_a"] - ref["value"]),
                "eee": max(abs(eee[f"{name}:{metric}"]["score_details"]["score"] - ref["value"]),
                           abs(eee[f"{name}:{metric}"]["score_details"]["uncertainty"]["standard_error"]["value"]
                               - ref["stderr"])),
            }
            worst = max(worst, *diffs.values())
            same = sorted(lm["leaves"]) == sorted(group["tasks"])
            print(f"| {name} | {metric} | {'yes' if same else 'NO'} ({len(lm['leaves'])}) | {ref['value']:.6f} | "
                  f"{ref['stderr']:.6f} | {ref['n']} | " + " | ".join(f"{d:.1e}" for d in diffs.values()) + " |")
            worst = worst if same else float("inf")
    print(f"\nlargest difference: {worst:.1e}")
    return 0 if worst <= 1e-12 else 1


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) != 2:
        sys.exit(__doc__)
    sys.exit(main(Path(args[0]), Path(args[1])))
