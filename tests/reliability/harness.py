"""The real CLI as a subprocess, watched: no traceback, the documented exit status, every row
accounted for, no watched file opened, no network touched."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

GUARD = Path(__file__).resolve().parent / "guard"
ROOT = Path(__file__).resolve().parents[2]

# the documented exit statuses (README, "Exit status")
OK, ROW_ERRORS, USAGE, TASK_FAILED, OUTPUT, INTERRUPTED = 0, 1, 2, 3, 4, 130


@dataclass
class Outcome:
    args: list[str]
    rc: int
    out: str
    err: str
    run_dir: Path | None
    violations: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return self.out + self.err

    @property
    def summary(self) -> dict:
        return json.loads((self.run_dir / "summary.json").read_text(encoding="utf-8"))

    def records(self, task: str) -> list[dict]:
        path = self.run_dir / "samples" / f"{task}.jsonl"
        # split at "\n" only: str.splitlines() also splits inside strings holding U+2028 (valid JSON)
        lines = path.read_text(encoding="utf-8").split("\n") if path.exists() else []
        return [json.loads(line) for line in lines if line]

    def errors(self, task: str) -> dict[str, dict]:
        """Each errored record's error, by its locator."""
        out = {}
        for r in self.records(task):
            err = (r.get("eval_result") or {}).get("error")
            if err:
                out[err.get("locator") or r["id"]] = err
        return out


class Gage:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.log = tmp / "guard.log"
        self.watch: list[Path] = []
        self.outside = tmp / "outside"  # a folder no data row may read from
        self.outside.mkdir()
        (self.outside / "secret.txt").write_text("CANARY-OUTSIDE-FILE\n")
        self.watch += [self.outside, Path("/etc/passwd"), Path("/etc/shadow"), Path("/etc/hostname")]

    def __call__(self, *args, run_id: str | None = "r", out: Path | None = None, timeout: float = 120,
                 env: dict | None = None, cwd: Path | None = None, preexec=None) -> Outcome:
        out = out or self.tmp / "runs"
        argv = [str(a) for a in args]
        is_run = argv and argv[0] not in ("validate", "tasks", "plugins", "report", "compare", "rescore") \
            and "--resume" not in argv
        if is_run and "-o" not in argv and "--output-dir" not in argv:
            argv += ["-o", str(out)]
        if is_run and run_id and "--run-id" not in argv:
            argv += ["--run-id", run_id]
        full_env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(GUARD), str(ROOT)]),
                    "GAGE_GUARD_LOG": str(self.log),
                    "GAGE_GUARD_WATCH": os.pathsep.join(str(p.resolve()) for p in self.watch),
                    "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", **(env or {})}
        self.log.unlink(missing_ok=True)
        proc = subprocess.run([sys.executable, "-m", "gage_eval.cli", *argv], capture_output=True, text=True,
                              timeout=timeout, env=full_env, cwd=cwd or self.tmp, preexec_fn=preexec)
        run_dir = None
        if "--resume" in argv:
            run_dir = Path(argv[argv.index("--resume") + 1])
        elif is_run and run_id:
            o = Path(argv[argv.index("-o") + 1]) if "-o" in argv else out
            run_dir = o / run_id
        violations = self.log.read_text().splitlines() if self.log.exists() else []
        return Outcome(argv, proc.returncode, proc.stdout, proc.stderr, run_dir, violations)


def check(o: Outcome, rc: int, *messages: str) -> None:
    """The invariants every case keeps, then its own exit status and messages."""
    assert "Traceback" not in o.text, o.text
    assert o.rc == rc, f"exit {o.rc}, expected {rc}: {o.args}\n{o.text}"
    for m in messages:
        assert m in o.text, f"{m!r} not in the output:\n{o.text}"
    assert not o.violations, f"watched file opened or network touched: {o.violations}"
    assert "CANARY-OUTSIDE-FILE" not in o.text
    if o.run_dir is not None and (o.run_dir / "summary.json").exists() and rc != USAGE:
        assert o.summary["run"]["exit_status"] == o.rc, "summary.json's exit_status is not the process's"
    if o.run_dir is not None and (o.run_dir / "summary.json").exists() and rc != OUTPUT:
        # (a write that failed part way leaves a half line, which --resume removes)
        for name, task in o.summary["tasks"].items():
            c = task["counts"]
            assert c["total"] == c["scored"] + c["errored"] + c["skipped"], (name, c)
            records = o.records(name)
            assert len(records) == c["total"], (name, len(records), c)
            assert len({r["id"] for r in records}) == len(records), "an id written twice"
        for path in o.run_dir.rglob("*"):
            if path.is_file() and path.name != ".lock":
                data = path.read_bytes()
                assert b"CANARY-OUTSIDE-FILE" not in data, path
                assert b"root:x:0:0" not in data, path
                if path.suffix in (".json", ".jsonl"):
                    _strict_json(path)


def _strict_json(path: Path) -> None:
    def refuse(token):
        raise AssertionError(f"{path}: non-strict JSON constant {token}")

    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        json.loads(text, parse_constant=refuse)
    else:
        for line in filter(None, text.split("\n")):
            json.loads(line, parse_constant=refuse)
