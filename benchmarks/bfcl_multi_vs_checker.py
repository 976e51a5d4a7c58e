"""gage-eval's bfcl_multi_turn verdicts against BFCL's own multi-turn checker on the same
trajectories: the replies of a gage-eval run of bfcl_multi_turn_base (e.g. SmolLM2 in prompting
mode) and replies written from the possible answers with known outcomes (the answer itself, a
turn left without calls, a changed argument, a missing call, a turn cut by max_steps).

    nice -n 19 gage-eval --tasks bfcl_multi_turn_base --model smollm2 --limit 5 -o runs --run-id mt
    python benchmarks/bfcl_multi_vs_checker.py --run runs/mt --bfcl-python /tmp/bfclvenv/bin/python \\
        [--written 12 --fixtures tests/tools/data/bfcl_multi_known.jsonl]

Our side of a written case runs through the tool loop itself (gage_plugins_builtin.tools.loop,
each reply's calls read by the prompt-based mode's parser); BFCL's side decodes and executes the
same reply texts in its checker (benchmarks/bfcl_multi_checker_side.py, in the venv given).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import gage_eval.plugins  # noqa: E402,F401  (the registry the tool loop looks tools up in)
from gage_eval.api import Backend, ModelOutput, Request  # noqa: E402
from gage_plugins_builtin.tools import prompting  # noqa: E402
from gage_plugins_builtin.tools.bfcl import package_data  # noqa: E402
from gage_plugins_builtin.tools.bfcl_multi import BFCLMultiTurnRow, check  # noqa: E402
from gage_plugins_builtin.tools.loop import Conversation  # noqa: E402


class Replies(Backend):
    """Writes the n-th reply text of a conversation holding n-1 assistant turns; calls read from it."""

    def __init__(self, texts: Sequence[str]):
        self.texts = list(texts)

    def one(self, request: Request) -> ModelOutput:
        n = sum(1 for m in request.messages or () if m.get("role") == "assistant")
        text = self.texts[n] if n < len(self.texts) else ""
        return prompting.read_calls(ModelOutput(text=text))


def our_verdict(sample: dict, texts: Sequence[str], max_steps: int = 20) -> tuple[bool, str, list]:
    """Our verdict on replies ``texts`` (in order), carried out by the tool loop; and BFCL's steps."""
    request = Request(kind="generate", sample_id=sample["id"], messages=tuple(sample["messages"]), chat=True,
                      tools=tuple(sample["tools"]),
                      tool_loop={"tools": ["bfcl_multi_turn"], "max_steps": max_steps, "row": sample})
    conv, backend = Conversation(request), Replies(texts)
    while not conv.take(backend.one(conv.next_request())):
        pass
    out = conv.result()
    valid, error_type, _ = check(out.trajectory, out.raw["tool_loop"]["states"], sample["metadata"]["bfcl"])
    return valid, error_type, turn_texts(out.trajectory)


def turn_texts(trajectory: list) -> list[list[str]]:
    """Per user turn, the text of each assistant reply (what BFCL's inference records)."""
    turns: list[list[str]] = [[]]
    previous = None
    for m in trajectory:
        if m.get("role") == "user" and previous not in (None, "user"):
            turns.append([])
        elif m.get("role") == "assistant":
            turns[-1].append("".join(s.get("text", "") for s in m.get("content") or ()))
        previous = m.get("role")
    return turns


def rows(limit: int) -> list[dict]:
    data = package_data()
    truth = {json.loads(line)["id"]: json.loads(line)["ground_truth"]
             for line in open(data / "possible_answer/BFCL_v4_multi_turn_base.json", encoding="utf-8")}
    out = []
    for line in open(data / "BFCL_v4_multi_turn_base.json", encoding="utf-8"):
        record = json.loads(line)
        out.append({**record, "ground_truth": truth[record["id"]]})
        if len(out) == limit:
            break
    return out


def call_text(calls: list[str]) -> str:
    return "[" + ", ".join(calls) + "]"


def written_cases(limit: int) -> list[dict]:
    """Per row: the answer itself, its last turn without calls, its first call's first value
    changed, its last call left out, and the first turn's first call repeated past max_steps=1."""
    cases = []
    for record in rows(limit):
        truth = record["ground_truth"]

        def texts(turns: list[list[str]]) -> list[str]:
            return [t for turn in turns for t in ([call_text(turn)] if turn else []) + ["Done."]]

        changed = [list(t) for t in truth]
        first = changed[0][0]
        changed[0][0] = first.replace("'", "'x", 1) if "'" in first else first.replace("=", "=1+", 1)
        missing = [list(t) for t in truth]
        missing[-1] = missing[-1][:-1]
        variants = {"answer": (texts(truth), 20), "empty_last_turn": (texts(truth[:-1] + [[]]), 20),
                    "changed_value": (texts(changed), 20), "last_call_missing": (texts(missing), 20),
                    "max_steps": ([call_text(truth[0][:1])] * 3, 1)}
        for name, (replies, max_steps) in variants.items():
            cases.append({"key": f"{record['id']}:{name}", "record": record, "replies": replies,
                          "max_steps": max_steps})
    return cases


def bfcl_verdicts(items: list[dict], python: str) -> dict[str, dict]:
    side = ROOT / "benchmarks" / "bfcl_multi_checker_side.py"
    lines = "".join(json.dumps(i) + "\n" for i in items)
    proc = subprocess.run([python, str(side)], input=lines, capture_output=True, text=True, check=True)
    return {v["key"]: v for v in map(json.loads, proc.stdout.splitlines())}


def entry_of(bfcl: dict) -> dict:
    return {"id": bfcl["id"], "involved_classes": bfcl["involved_classes"], "initial_config": bfcl["initial_config"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, help="a gage-eval run of bfcl_multi_turn_base")
    ap.add_argument("--written", type=int, default=0, help="rows to write known cases for (5 a row)")
    ap.add_argument("--bfcl-python", default="/tmp/bfclvenv/bin/python")
    ap.add_argument("--fixtures", type=Path, help="write the written cases and BFCL's verdicts here")
    args = ap.parse_args()
    items, ours = [], {}
    for case in written_cases(args.written):
        sample = BFCLMultiTurnRow()(case["record"], None)
        valid, error_type, steps = our_verdict(sample, case["replies"], case["max_steps"])
        ours[case["key"]] = (valid, error_type, "written")
        items.append({"key": case["key"], "entry": entry_of(sample["metadata"]["bfcl"]),
                      "ground_truth": case["record"]["ground_truth"], "steps": steps})
    if args.run:
        for line in open(args.run / "samples" / "bfcl_multi_turn_base.jsonl", encoding="utf-8"):
            s = json.loads(line)
            if not s.get("predict_result") or "bfcl_multi_turn" not in (s.get("eval_result") or {}).get("metrics", {}):
                continue
            result = s["eval_result"]["metrics"]["bfcl_multi_turn"]
            ours[s["id"]] = (result["value"] == 1.0, result.get("error_type", ""), "SmolLM2")
            bfcl = s["metadata"]["bfcl"]
            items.append({"key": s["id"], "entry": entry_of(bfcl), "ground_truth": bfcl["ground_truth"],
                          "steps": turn_texts(s["predict_result"][0].get("trajectory") or [])})
    theirs = bfcl_verdicts(items, args.bfcl_python)
    table: dict[tuple, list[int]] = {}
    for key, (valid, error_type, source) in ours.items():
        other = theirs[key]
        same = valid == other["valid"] and (valid or error_type == other["error_type"])
        cell = table.setdefault((source, "pass" if other["valid"] else other["error_type"]), [0, 0])
        cell[0] += same
        cell[1] += 1
        if not same:
            print(f"DIFFER {key}: ours {valid} {error_type!r}, BFCL {other['valid']} {other['error_type']!r}")
    print("| replies | BFCL's verdict | rows | same verdict and error type |\n|---|---|---|---|")
    for (source, verdict), (same, n) in sorted(table.items()):
        print(f"| {source} | {verdict} | {n} | {same}/{n} |")
    if args.fixtures:
        by_key = {c["key"]: c for c in written_cases(args.written)}
        with open(args.fixtures, "w", encoding="utf-8") as fh:
            for key, case in by_key.items():
                fh.write(json.dumps({"key": key, "id": case["record"]["id"], "replies": case["replies"],
                                     "max_steps": case["max_steps"], "valid": theirs[key]["valid"],
                                     "error_type": theirs[key]["error_type"]}) + "\n")
    return 0 if all(v[0] == theirs[k]["valid"] for k, v in ours.items()) else 1


if __name__ == "__main__":
    sys.exit(main())
