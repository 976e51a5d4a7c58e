"""Issue 25: the group numbers gage-eval's outputs show, against lm-evaluation-harness 0.4.13's own
aggregation of the same per-task figures.

Run it with lm-eval's Python (it imports lm_eval, not gage_eval), on a gage-eval run A of a group
(with ``--eee-version 0.3.0``) and ``gage-eval compare A B --json`` (B: another run) saved to a file::

    python benchmarks/group_outputs_vs_lm_eval.py RUN_A COMPARE_JSON

For each group of run A's summary.json (``--tasks mmlu``: mmlu and its four categories), lm-eval's
task index gives the group's definition (its group config, a tag as its tasks), built into lm-eval's
own ``Group`` (stand-in leaf tasks that carry only their names: no dataset is loaded), and
``Group.aggregate`` aggregates the run's per-task value, stderr and row count as lm-eval aggregates
its own (``aggregate_subtask_metrics``; ``pooled_sample_stderr`` for a size-weighted group). The table then puts beside it what summary.json, the
console's source, report.html (its data-key cells), compare (``mean_a``/``mean_b``) and the EEE
aggregate (``eee_aggregate.json``) hold for the same group, and the largest difference of each.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path


def lm_eval_group(tm, name: str):
    """lm-eval's own Group of ``name``, built from its task index (group configs; a tag as its
    tasks), with stand-in leaf Tasks that carry only their names (no dataset is loaded)."""
    from lm_eval.api.group import Group
    from lm_eval.api.task import Task

    class Leaf(Task):
        task_name = None  # lm-eval keys a child by task_name

        def __init__(self, leaf: str):  # noqa: D107 (no dataset: only the name is read)
            self.task_name = leaf

    Leaf.__abstractmethods__ = frozenset()  # never asked for documents or requests

    entry = tm.task_index[name]
    group = Group.from_config(dict(entry.cfg))
    for member in entry.cfg["task"]:
        kind = tm.task_index[member].kind.name
        if kind == "GROUP":
            group.add(lm_eval_group(tm, member))
        elif kind == "TAG":
            for leaf in sorted(tm.task_index[member].tags):
                group.add(Leaf(leaf))
        else:
            group.add(Leaf(member))
    return group


def lm_eval_numbers(tm, name: str, tasks: dict) -> dict:
    """What lm-eval's Group.aggregate makes of the run's per-task figures, per metric."""
    group = lm_eval_group(tm, name)
    leaves = [t.task_name for t in group.get_all_tasks()]
    task_metrics = {}
    for t in leaves:
        entry = {"sample_len": None}
        for metric, m in tasks[t]["metrics"].items():
            entry[f"{metric},none"], entry[f"{metric}_stderr,none"] = m["value"], m["stderr"]
            entry["sample_len"] = m["n"]
        task_metrics[t] = entry
    out = group.aggregate(task_metrics)
    numbers = {"leaves": leaves}
    for agg in group.aggregate_metric_list or []:
        numbers[agg.metric] = {"value": out[f"{agg.metric},none"], "stderr": out[f"{agg.metric}_stderr,none"],
                               "n": out["sample_count"][f"{agg.metric},none"]}
    return numbers


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
        lm = lm_eval_numbers(tm, name, summary["tasks"])
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
