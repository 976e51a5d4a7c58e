"""What BFCL's two checker sides (bfcl_checker_side.py, bfcl_multi_checker_side.py) share, run in
the venv that has bfcl-eval; import it before bfcl_eval. BFCL's model registry (which imports every
provider's SDK) is replaced by one entry for a prompting model, whose function names are not
rewritten (underscore_to_dot false), as BFCL treats its prompt models."""
from __future__ import annotations

import json
import sys
import types
from dataclasses import dataclass
from typing import Callable

MODEL = "gage-eval/prompting"


@dataclass
class _Config:
    underscore_to_dot: bool = False


registry = types.ModuleType("bfcl_eval.constants.model_config")
registry.MODEL_CONFIG_MAPPING = {MODEL: _Config()}
sys.modules["bfcl_eval.constants.model_config"] = registry


def answer(verdict: Callable[[dict, int], tuple[bool, str]]) -> None:
    """``verdict(row, n)`` of the n-th JSON line on stdin, written as a {key, valid, error_type} line."""
    for n, line in enumerate(sys.stdin):
        if line.strip():
            row = json.loads(line)
            try:
                valid, kind = verdict(row, n)
            except Exception as exc:  # the checker itself failing on a row is a finding, not a crash here
                valid, kind = False, f"checker raised {type(exc).__name__}: {exc}"
            print(json.dumps({"key": row["key"], "valid": valid, "error_type": kind}), flush=True)
