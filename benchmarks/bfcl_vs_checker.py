"""gage-eval's bfcl_ast verdicts against BFCL's own checker, row by row, on the same replies.

Replies: the records of gage-eval runs of the bfcl_* tasks (prompting mode: the text the model
wrote, e.g. the bundled SmolLM2) and the replies written with known verdicts in
tests/tools/data/bfcl_known.jsonl. BFCL's side runs benchmarks/bfcl_checker_side.py with the
python of a separate venv that has bfcl-eval (see that file for its packages).

    nice -n 19 gage-eval --tasks bfcl_simple,...,bfcl_live_irrelevance --model smollm2 --limit 10 \\
        -o runs --run-id bfcl_smollm2
    python benchmarks/bfcl_vs_checker.py --run runs/bfcl_smollm2 --bfcl-python /tmp/bfclvenv/bin/python

Prints a Markdown table (rows, gage-eval's and BFCL's accuracy, rows whose verdicts differ) and
exits 1 when any verdict differs.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
KNOWN = HERE.parent / "tests" / "tools" / "data" / "bfcl_known.jsonl"


def run_rows(run: Path) -> list[dict]:
    rows = []
    for path in sorted((run / "samples").glob("bfcl_*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            metric = ((record.get("eval_result") or {}).get("metrics") or {}).get("bfcl_ast")
            if metric is None:  # an errored row has no verdict to compare
                continue
            bfcl = record["metadata"]["bfcl"]
            content = record["predict_result"][0]["message"]["content"]
            text = "".join(s.get("text", "") for s in content) if isinstance(content, list) else str(content)
            rows.append({"key": f"{path.stem}/{record['id']}", "group": path.stem, "category": bfcl["category"],
                         "function": bfcl["functions"], "ground_truth": bfcl["ground_truth"], "text": text,
                         "ours": metric["value"] == 1.0})
    return rows


def known_rows() -> list[dict]:
    from gage_eval.api import MetricContext, ModelOutput, RowContext
    from gage_plugins_builtin.tools import prompting
    from gage_plugins_builtin.tools.bfcl import BFCLAst, BFCLRow
    from gage_plugins_builtin.tools.calls import PythonicParser

    rows = []
    for line in KNOWN.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        sample = BFCLRow()(row, RowContext(task="known", locator=f"{KNOWN.name}:{row['id']}", index=0))
        out = prompting.read_calls(ModelOutput(text=row["reply"]), PythonicParser())
        value = BFCLAst().compute(MetricContext(sample=sample, model_output=out.to_dict()))["value"]
        rows.append({"key": f"known/{row['id']}", "group": "written (known verdicts)", "category": row["category"],
                     "function": row["function"], "ground_truth": row["ground_truth"] or [], "text": row["reply"],
                     "ours": value == 1.0, "expected": row["expected"]})
    return rows


def bfcl_verdicts(python: str, rows: list[dict]) -> dict[str, dict]:
    feed = "".join(json.dumps({k: r[k] for k in ("key", "category", "function", "ground_truth", "text")}) + "\n"
                   for r in rows)
    done = subprocess.run([python, str(HERE / "bfcl_checker_side.py")], input=feed, capture_output=True, text=True,
                          check=True)
    return {v["key"]: v for v in map(json.loads, done.stdout.splitlines())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", type=Path, action="append", default=[], help="a gage-eval run folder (repeatable)")
    parser.add_argument("--bfcl-python", default="/tmp/bfclvenv/bin/python", help="python of a venv with bfcl-eval")
    args = parser.parse_args()
    rows = [r for run in args.run for r in run_rows(run)] + known_rows()
    theirs = bfcl_verdicts(args.bfcl_python, rows)
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        groups[r["group"]].append(r)
    differ_all = []
    print("| rows | n | gage-eval bfcl_ast | BFCL checker | verdicts equal | differ |")
    print("|---|---:|---:|---:|---:|---|")
    for group, members in groups.items():
        ours = sum(r["ours"] for r in members)
        bfcl = sum(theirs[r["key"]]["valid"] for r in members)
        differ = [r["key"].split("/", 1)[1] for r in members if r["ours"] != theirs[r["key"]]["valid"]]
        differ_all += differ
        n = len(members)
        print(f"| {group} | {n} | {ours / n:.3f} | {bfcl / n:.3f} | {n - len(differ)}/{n} | {', '.join(differ) or '-'} |")
    wrong = [r["key"] for r in rows if "expected" in r and r["expected"] != theirs[r["key"]]["valid"]]
    if wrong:
        print(f"\nknown verdicts BFCL disagrees with: {', '.join(wrong)}")
    return 1 if differ_all or wrong else 0


if __name__ == "__main__":
    sys.exit(main())
