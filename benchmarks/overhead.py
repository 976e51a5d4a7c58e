"""Harness overhead: the dummy backend through the whole pipeline, via the real CLI.

Generates synthetic PIQA-format rows (goal/sol1/sol2/label), runs

    gage-eval --tasks piqa --model dummy --data piqa=FILE -q -o DIR

in a subprocess for each size, and reports samples/s and the subprocess's peak
RSS (sampled with psutil when installed, else ru_maxrss of the child). The
streaming contract says memory is bounded by the samples in flight, so peak RSS
at the largest size must stay within ``--rss-ratio`` (1.2x) of the smallest.

    python benchmarks/overhead.py                      # 10,000 and 100,000 rows
    python benchmarks/overhead.py --sizes 1000,10000 --profile
    python benchmarks/overhead.py --baseline /tmp/oldmain   # old code vs this checkout

``--baseline DIR`` runs the same rows a second time with ``PYTHONPATH=DIR`` (an
extracted older commit, e.g. ``git archive <rev> | tar -x -C DIR``) in the same
venv, from a neutral working directory so that DIR's ``gage_eval`` wins, and
prints the speed-up of this checkout over it. ``--repeat N`` runs N rounds, old and new in turn
(the order swapped every other round, so a load that drifts weighs on both), and compares the
median of the rounds: on a machine shared with other work one pair of runs is mostly noise. Each
run's CPU seconds (user + system, from the reaped child's rusage) are compared too: a busy machine
stretches the wall far more than the CPU time.

``--profile`` also runs the smallest size under cProfile and prints the top
entries by cumulative time. Exit status 1 when the RSS ratio is exceeded.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

WORDS = ("cup jar lid towel water soap knife spoon bottle paper plate string tape glue cloth brush oven "
         "fridge door window shelf box bag ice salt sugar oil bread rice candle magnet nail screw").split()
VERBS = ("keep open clean dry fix hang store cool warm seal stack fold cut carry light remove").split()


def make_rows(n: int, path: Path, seed: int = 0) -> Path:
    """Write ``n`` synthetic PIQA rows; lengths vary like the real set (goal 4-14 words, solutions 5-25)."""
    rng = random.Random(seed)

    def phrase(lo: int, hi: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))

    with path.open("w", encoding="utf-8") as fh:
        for i in range(n):
            row = {"goal": f"{rng.choice(VERBS).capitalize()} the {phrase(3, 13)} (row {i}).",
                   "sol1": f"Use the {phrase(5, 25)}.", "sol2": f"Put the {phrase(5, 25)} away.",
                   "label": rng.randint(0, 1)}
            fh.write(json.dumps(row) + "\n")
    return path


def gage_eval_command() -> list[str]:
    exe = Path(sys.executable).with_name("gage-eval")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "gage_eval.cli"]


def measure(cmd: list[str], env: dict | None = None, poll_s: float = 0.02, cwd: Path | None = None) -> dict:
    """Run ``cmd``; return wall seconds, peak RSS in MiB and the exit status."""
    try:
        import psutil
    except ImportError:
        psutil = None
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True, cwd=cwd)
    peak = 0
    if psutil is not None:
        p = psutil.Process(proc.pid)
        while proc.poll() is None:
            try:
                peak = max(peak, p.memory_info().rss)
            except psutil.Error:
                break
            time.sleep(poll_s)
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # (this child's CPU: it is the one reaped since)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    # ru_maxrss of reaped children (KiB on Linux): a maximum over every child so
    # far, so it is exact only for the first or largest run; psutil is per run.
    children_max = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    return {"rc": proc.returncode, "wall_s": wall, "cpu_s": cpu, "peak_rss_mib": (peak or children_max) / 2**20,
            "source": "psutil" if peak else "ru_maxrss", "stdout": out, "stderr": err}


def code_env(pythonpath: str | None = None) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    env.pop("PYTHONPATH", None)
    if pythonpath:
        env["PYTHONPATH"] = str(Path(pythonpath).resolve())
    return env


def run_size(n: int, work: Path, extra: list[str], pythonpath: str | None = None, tag: str = "new") -> dict:
    data = work / f"piqa_{n}.jsonl"
    if not data.exists():
        make_rows(n, data)
    out = work / f"run_{tag}_{n}"
    shutil.rmtree(out, ignore_errors=True)
    cmd = gage_eval_command() + ["--tasks", "piqa", "--model", "dummy", "--data", f"piqa={data}", "-q",
                                 "-o", str(out), "--run-id", "bench"] + extra
    res = measure(cmd, env=code_env(pythonpath), cwd=work)
    if res["rc"] != 0:
        raise SystemExit(f"gage-eval failed on {n} rows (exit {res['rc']}):\n{res['stderr'][-3000:]}")
    summary = json.loads((out / "bench" / "summary.json").read_text())
    task = summary["tasks"]["piqa"]
    if task["counts"]["total"] != n or task["counts"]["errored"]:
        raise SystemExit(f"{n} rows: unexpected counts {task['counts']}")
    timings = summary["run"]["timings"]
    res.update(code=tag, rows=n, samples_per_s=n / res["wall_s"], engine_wall_s=timings["wall_runtime_s"],
               engine_samples_per_s=timings.get("throughput_total_samples_per_s"),
               stage_s={k: round(task["timings"][k], 2) for k in
                        ("dataset_materialization_s", "inference_s", "evaluation_s", "writing_s")})
    return res


def profile(n: int, work: Path, top: int, pythonpath: str | None = None) -> str:
    data = work / f"piqa_{n}.jsonl"
    if not data.exists():
        make_rows(n, data)
    stats_file = work / "profile.pstats"
    cmd = [sys.executable, "-m", "cProfile", "-o", str(stats_file), "-m", "gage_eval.cli", "--tasks", "piqa", "--model",
           "dummy", "--data", f"piqa={data}", "-q", "-o", str(work / "profile_run"), "--run-id", "prof"]
    shutil.rmtree(work / "profile_run", ignore_errors=True)
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, env=code_env(pythonpath), cwd=work)
    if done.returncode != 0:
        raise SystemExit(f"profiled run failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    import io
    import pstats

    buf = io.StringIO()
    stats = pstats.Stats(str(stats_file), stream=buf)
    stats.sort_stats("cumulative").print_stats(top)
    stats.sort_stats("tottime").print_stats(top)
    return buf.getvalue()


def _round(k: int, sizes: list[int], work: Path, args: argparse.Namespace) -> tuple[list[dict], list[dict]]:
    """One round: every size with the old code (when --baseline) and with the new, old first in
    even rounds and new first in odd ones; each result marked with its round and its place in it."""
    def old() -> list[dict]:
        return [run_size(n, work, args.extra, args.baseline, "old") for n in sizes] if args.baseline else []

    def new() -> list[dict]:
        return [run_size(n, work, args.extra + args.new_extra, args.code) for n in sizes]

    if k % 2:
        results, base = new(), old()
    else:
        base, results = old(), new()
    for r in base + results:
        r.update(round=k + 1, order=(r["code"] == "old") == bool(k % 2))  # (False: ran first)
    return base, results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,100000", help="comma-separated row counts")
    ap.add_argument("--rows", type=int, help="one size only (same as --sizes N)")
    ap.add_argument("--baseline", metavar="DIR",
                    help="also run the code in DIR (PYTHONPATH=DIR, same venv) and compare")
    ap.add_argument("--code", metavar="DIR", help="run the code in DIR (PYTHONPATH=DIR) instead of this checkout")
    ap.add_argument("--repeat", type=int, default=1, metavar="N",
                    help="rounds of old and new in turn (order swapped every other round); the median is compared")
    ap.add_argument("--profile-rows", type=int, help="rows for --profile (default: the smallest size)")
    ap.add_argument("--rss-ratio", type=float, default=1.2, help="allowed peak RSS, largest / smallest")
    ap.add_argument("--profile", action="store_true", help="cProfile the smallest size, top entries")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--keep", metavar="DIR", help="write data and runs here (default: a temp dir, removed)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--new-extra", action="append", default=[], metavar="ARG",
                    help="an argument for the new code only (repeatable), e.g. --new-extra=--no-report to leave "
                         "out the end-of-run report.html, which the old code does not write")
    ap.add_argument("extra", nargs="*", help="extra gage-eval arguments after --")
    args = ap.parse_args(argv)
    sizes = [args.rows] if args.rows else [int(s) for s in args.sizes.split(",") if s.strip()]
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="gage-overhead-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        rounds = [_round(k, sizes, work, args) for k in range(max(1, args.repeat))]
        base = [r for rb, _ in rounds for r in rb]
        every = base + [r for _, rn in rounds for r in rn]
        if not args.json:
            print(f"{'round':>5}  {'code':>4}  {'rows':>8}  {'wall s':>7}  {'CPU s':>6}  {'samples/s':>9}  "
                  f"{'engine/s':>8}  {'peak RSS MiB':>12}  stages (s)")
        for r in sorted(every, key=lambda r: (r["round"], r["order"])):
            if not args.json:
                print(f"{r['round']:>5}  {r['code']:>4}  {r['rows']:>8}  {r['wall_s']:>7.1f}  {r['cpu_s']:>6.1f}  "
                      f"{r['samples_per_s']:>9.0f}  {r['engine_samples_per_s'] or 0:>8.0f}  "
                      f"{r['peak_rss_mib']:>12.1f}  {r['stage_s']}")
        for n in sizes if base and not args.json else ():
            old = statistics.median(r["samples_per_s"] for r in base if r["rows"] == n)
            new = statistics.median(r["samples_per_s"] for r in every if r["rows"] == n and r["code"] == "new")
            ratios = [rn[i]["samples_per_s"] / rb[i]["samples_per_s"] for rb, rn in rounds for i in range(len(sizes))
                      if sizes[i] == n]
            print(f"{n:>8} rows: new/old samples/s {new / old:.2f}x (medians over {len(ratios)} round(s): "
                  f"old {old:.0f}, new {new:.0f}; each round {', '.join(f'{x:.2f}x' for x in ratios)})")
            cpu_old = statistics.median(r["cpu_s"] for r in base if r["rows"] == n)
            cpu_new = statistics.median(r["cpu_s"] for r in every if r["rows"] == n and r["code"] == "new")
            print(f"{n:>8} rows: new/old samples per CPU second {cpu_old / cpu_new:.2f}x (median CPU s of the "
                  f"process: old {cpu_old:.2f}, new {cpu_new:.2f}; less swayed by other work than the wall)")
        results = rounds[-1][1]
        ratio = results[-1]["peak_rss_mib"] / results[0]["peak_rss_mib"]
        ok = ratio <= args.rss_ratio
        if args.json:
            print(json.dumps({"results": [{k: v for k, v in r.items() if k not in ("stdout", "stderr")}
                                          for r in every], "rss_ratio": ratio, "ok": ok}, indent=2))
        else:
            print(f"peak RSS {results[-1]['rows']} / {results[0]['rows']} rows: {ratio:.2f}x "
                  f"(limit {args.rss_ratio}x): {'ok' if ok else 'EXCEEDED'} [{results[0]['source']}]")
        if args.profile:
            print(profile(args.profile_rows or sizes[0], work, args.top, args.code))
        return 0 if ok else 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
