"""BFCL's own multi-turn checker on recorded trajectories, run in a venv that has bfcl-eval
(benchmarks/bfcl_multi_vs_checker.py calls it there). Reads JSON lines {key, entry, ground_truth,
steps} on stdin (``entry``: the BFCL row; ``steps``: per user turn, the text of each of the
model's replies, as BFCL's prompting inference records them) and writes {key, valid, error_type}
lines: BFCL's eval runner's steps for a multi-turn entry (the force-terminated check, each reply
decoded by its prompting decoder and the undecodable or empty ones skipped, then
multi_turn_checker). Its model registry is replaced as in bfcl_checker_side.py."""
from __future__ import annotations

from bfcl_side_common import MODEL, answer  # (first: it replaces BFCL's model registry)

from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import is_empty_execute_response
from bfcl_eval.model_handler.utils import default_decode_execute_prompting


def verdict(row: dict, n: int) -> tuple[bool, str]:
    steps, truth = row["steps"], row["ground_truth"]
    if len(steps) != len(truth):
        return False, "multi_turn:force_terminated"
    decoded = []
    for turn in steps:
        kept = []
        for text in turn:
            try:
                calls = default_decode_execute_prompting(text)
            except Exception:
                continue
            if not is_empty_execute_response(calls):
                kept.append(calls)
        decoded.append(kept)
    # a name of its own per row: the executor keeps instances in globals by model name and row id
    result = multi_turn_checker(decoded, truth, row["entry"], "multi_turn_base", f"{MODEL}_{n}")
    return bool(result["valid"]), result.get("error_type", "")


answer(verdict)
