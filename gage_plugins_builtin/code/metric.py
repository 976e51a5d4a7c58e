"""``code_exec``: run the model's code in a sandbox against the row's tests.

A row's tests are Sample v1's ``metadata.execution`` (``type: code_exec``): ``test_cases`` of
``input``/``output`` (function calls when it names an ``entry_point``, stdin/stdout when it does
not), or a HumanEval-style ``test`` program with its ``entry_point`` (the check passes when the
program, the test and ``check(entry_point)`` run to the end). ``timeout_ms`` is each test's time.
The row's ``sandbox`` (``files``, ``setup``, ``env``, ``image``) goes to the sandbox as it is; a row
file named as one the metric writes there (``harness.py``, ``program.py``) is the
row's error, never replaced.

The value is 1 when every test passed, else 0; ``eval_result.metrics.code_exec.tests`` keeps each
test's status (pass, fail, timeout, error) with a short reason. When the sandbox could not prepare
the row (an ``image`` it does not run, a ``setup`` that failed, the sandbox's own failure) no answer
was tested: the row's error, not a 0. One answer is scored at a time, so
N answers per row are N calls. Jobs run on a pool of threads (one sandbox process each), started
by :meth:`CodeExec.submit` as rows finish, so execution overlaps generation and uses every core.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import Any, Mapping

from gage_eval.api import GageError, Metric, MetricContext, execution

HARNESS = (Path(__file__).with_name("harness.py")).read_text(encoding="utf-8")
FENCE = re.compile(r"```[ \t]*(?:(?:python3?|py)[ \t]*)?\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)  # (one
# [ \t]* where no language is named: two backtracked over a run of spaces, growing with its square)
STARTUP_S = 5.0  # the wall time a job gets beyond its tests' own: the sandbox and the interpreter starting
MAX_TIMEOUT_MS = 600_000  # a row's timeout_ms for each test (1e12 ran a looping program for 31 years)
OWN_FILES = ("harness.py", "program.py")  # what the metric writes in the job's working folder (the job: on stdin)


def extract_code(text: str, how: str) -> str:
    """``auto``: the first fenced code block when the answer has one, else the whole answer; ``none``:
    the answer as it is."""
    if how == "auto":
        m = FENCE.search(text)
        if m:
            return m.group(1)
    return text


class CodeExec(Metric):
    """Arguments: ``sandbox`` (a registered sandbox, default ``local``) and ``sandbox_args``;
    ``prefix``: a field path whose text goes before the answer (humaneval: the prompt, as lm-eval
    builds its predictions); ``extract`` (``auto`` or ``none``); ``timeout_s`` per test (default
    the row's ``timeout_ms``, else 3 s, OpenAI's reference); ``guard``: disable in the program what
    OpenAI's reference disables (os.system, subprocess, ...); ``limits`` over the sandbox's
    defaults (``memory_mb``, ``processes``, ...); ``workers`` (default: the machine's cores)."""

    name = "code_exec"

    def __init__(self, sandbox: str = "local", sandbox_args: Mapping[str, Any] | None = None,
                 prefix: str | None = None, extract: str = "auto", timeout_s: float | None = None,
                 guard: bool = False, limits: Mapping[str, Any] | None = None, workers: int | None = None):
        if extract not in ("auto", "none"):
            raise ValueError(f"extract: expected auto or none, not {extract!r}")
        self.sandbox = execution.open_sandbox(sandbox, **dict(sandbox_args or {}))
        self.prefix, self.extract, self.timeout_s, self.guard = prefix, extract, timeout_s, bool(guard)
        self.limits = execution.Limits().replace(**dict(limits or {}))
        self.pool = ThreadPoolExecutor(max_workers=int(workers or os.cpu_count() or 1),
                                       thread_name_prefix="gage-code-exec")
        self.pending: dict[tuple, list] = {}  # key -> [its future, the computes still to come, the sample held]
        self.lock = threading.Lock()

    def submit(self, ctx: MetricContext) -> Future:
        """Start this answer's tests in the background; :meth:`compute` for the same row then
        returns their result."""
        key = _key(ctx)
        with self.lock:
            entry = self.pending.get(key)
            if entry is None:  # (a row's repeats that gave the same answer run it once)
                entry = self.pending[key] = [self.pool.submit(self._score, ctx), 0, ctx.sample]  # (its id not reused)
            entry[1] += 1
        return entry[0]

    def compute(self, ctx: MetricContext) -> dict:
        key = _key(ctx)
        with self.lock:
            entry = self.pending.get(key)
            if entry is not None:
                entry[1] -= 1
                if not entry[1]:
                    del self.pending[key]
        return entry[0].result() if entry is not None else self._score(ctx)

    def _score(self, ctx: MetricContext) -> dict:
        row_exec = ctx.get("sample.metadata.execution")
        if not isinstance(row_exec, Mapping):
            raise ValueError("sample.metadata.execution must be an object (type: code_exec)")
        code = extract_code(str(ctx.get("model_output.text", "") or ""), self.extract)
        why = _not_text(code)
        if self.prefix:
            code = str(ctx.get(self.prefix)) + code
        job, nonce, n_tests = self._job(ctx, row_exec, code)
        if why:  # (a server's "\ud800": exec cannot compile it, a failure in OpenAI's reference too) nothing to run
            result = execution.JobResult(execution.Status.EXITED)
            tests = [{"status": "error", "reason": f"the answer is {why}"} for _ in range(n_tests)]
        else:
            result = self.sandbox.run(job)
            if result.status == execution.Status.ERROR:  # the row's setting could not be prepared: no answer was tested
                raise GageError(f"sandbox {self.sandbox.name}: {result.reason}"[:400])
            tests = _verdicts(result, nonce, n_tests)
        passed = sum(t["status"] == "pass" for t in tests)
        return {"value": float(bool(tests) and passed == len(tests)), "passed_tests": passed,
                "total_tests": len(tests), "tests": tests, "sandbox": self.sandbox.name,
                "wall_s": round(result.wall_s, 3)}

    def _job(self, ctx: MetricContext, row_exec: Mapping[str, Any], code: str) -> tuple[execution.Job, str, int]:
        given = row_exec.get("timeout_ms")
        if self.timeout_s is None and given is not None and (
                isinstance(given, bool) or not isinstance(given, (int, float)) or not 0 < given <= MAX_TIMEOUT_MS):
            raise ValueError(f"sample.metadata.execution.timeout_ms: expected milliseconds above 0 and at most "
                             f"{MAX_TIMEOUT_MS} (each test's time), got {given!r}")
        timeout = self.timeout_s if self.timeout_s is not None else (given / 1000 if given is not None else 3.0)
        entry = row_exec.get("entry_point")
        tests = row_exec.get("test_cases")
        if row_exec.get("test") is not None:
            if not entry:
                raise ValueError("sample.metadata.execution: a 'test' program needs its 'entry_point'")
            if why := _not_text(str(row_exec["test"])):
                raise ValueError(f"sample.metadata.execution.test: {why}")
            mode, program, tests = "check", f"{code}\n{row_exec['test']}\ncheck({entry})", [{}]
        elif isinstance(tests, list) and tests:
            for i, t in enumerate(tests):
                if not isinstance(t, Mapping) or not isinstance(t.get("input"), str) or not isinstance(
                        t.get("output"), str):
                    raise ValueError(f"sample.metadata.execution.test_cases.{i}: expected input and output strings")
                if why := _not_text(t["input"] + t["output"]):
                    raise ValueError(f"sample.metadata.execution.test_cases.{i}: {why}")
            mode, program = ("function" if entry else "stdio"), code
            tests = [{"input": t["input"], "output": t["output"]} for t in tests]
        else:
            raise ValueError("sample.metadata.execution needs test_cases (input/output) or a test program "
                             "with its entry_point")
        box = ctx.get("sample.sandbox", None)
        _refuse_clashes((box or {}).get("files") if isinstance(box, Mapping) else None)
        nonce = secrets.token_hex(8)
        spec = {"mode": mode, "program": "program.py", "timeout": timeout, "entry_point": entry,
                "tests": tests, "guard": self.guard, "nonce": nonce}
        limits = self.limits.replace(wall_s=STARTUP_S + timeout * (len(tests) + 1),
                                     cpu_s=max(self.limits.cpu_s, timeout * (len(tests) + 1)))
        own = dict(zip(OWN_FILES, (HARNESS, program)))
        job = execution.Job.for_row(box, (execution.Job.PYTHON, "harness.py"), own, stdin=json.dumps(spec),
                                    limits=limits)
        return job, nonce, len(tests)


def _not_text(text: str) -> str:
    """Why ``text`` cannot be a program's (or a test's) text: "" when it is UTF-8 text."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "not UTF-8 text (it holds a lone surrogate)"
    return ""


def _refuse_clashes(files: Any) -> None:
    """A row file named as one the metric writes (or inside one: ``harness.py/x``) would be replaced
    by it, or could not be written: the row's error, naming the file."""
    for name in files or ():
        path = PurePosixPath(str(name))
        if any(str(p) in OWN_FILES for p in (path, *path.parents)):
            raise GageError(f"sandbox.files: {str(name)!r} is in the way of a file code_exec writes in the "
                             f"working folder ({', '.join(OWN_FILES)}): rename it")


def _key(ctx: MetricContext) -> tuple:
    return id(ctx.sample), ctx.get("model_output.text", None)


def _verdicts(result: execution.JobResult, nonce: str, n_tests: int) -> list[dict]:
    """Each test's verdict from the harness's line; when the job never printed one, every test gets
    the job's fate (timed out, too much output, killed, the sandbox's own error)."""
    if result.status == execution.Status.EXITED:
        for line in reversed(result.stdout.splitlines()):
            if line.startswith(nonce + " "):
                return json.loads(line[len(nonce) + 1:])
    if result.status == execution.Status.TIMEOUT:
        fate = {"status": "timeout", "reason": result.reason}
    elif result.status == execution.Status.OUTPUT_LIMIT:
        fate = {"status": "error", "reason": result.reason}
    else:  # EXITED (a sandbox's own ERROR is the row's error: CodeExec._score)
        tail = (result.stderr.strip().splitlines() or [""])[-1][:200]
        how = (f"killed by signal {-result.exit_code}" if (result.exit_code or 0) < 0 else
               f"exit status {result.exit_code}")
        fate = {"status": "error", "reason": f"the program ended the test harness ({how})" + (
            f": {tail}" if tail else "")}
    return [dict(fate) for _ in range(n_tests)]
