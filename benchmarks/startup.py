"""Start-up time of the default model (SmolLM2 from its GGUF): command to first forward pass.

Each measurement is a new process running the real command line,

    gage-eval --tasks piqa --limit 20 -o DIR --quiet [--model-args gguf_cache=false]

through a thin wrapper (``--child``) that only adds timestamps: when the backend starts to
open the model, when it is open, and when the model's first forward pass begins (a forward
pre-hook on the input embedding). Times are from just before the process is started (wall clock, passed in).

    python benchmarks/startup.py [--warm-runs 3] [--no-cache-run] [--data FILE]

Measured, in order: a cold start (an empty GAGE_EVAL_CACHE in a temp folder: the GGUF is
converted and cached), ``--warm-runs`` warm starts from that cache, then the same command
without the wrapper (``gage-eval`` itself) ``--warm-runs`` times for the whole-process wall
time, and with ``--no-cache-run`` one start with ``gguf_cache=false`` (the old path). Writes
benchmarks/out/startup.json. The temp cache is removed at the end; the user's cache is not touched.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = HERE / "out"


def child(argv: list[str]) -> None:
    """Run gage-eval in this process with timestamps written to $STARTUP_MARKS."""
    marks_path = os.environ["STARTUP_MARKS"]
    marks: dict[str, float] = {}

    def mark(name: str) -> None:
        if name not in marks:
            marks[name] = time.time()
            with open(marks_path, "w") as fh:
                json.dump(marks, fh)

    mark("python_started")
    from gage_plugins_builtin.backends import hf

    real_open = hf.TransformersBackend.open

    def open_with_marks(self):
        mark("open_start")
        real_open(self)
        mark("open_end")
        handle = None

        def first_forward(module, args):
            mark("first_forward")
            handle.remove()

        # the embedding runs first in every pass (the log-likelihood path calls the decoder, not the model)
        handle = self.model.get_input_embeddings().register_forward_pre_hook(first_forward)

    hf.TransformersBackend.open = open_with_marks
    from gage_eval.cli import main

    sys.argv = ["gage-eval", *argv]
    main()


def run_once(args: list[str], env: dict, wrapped: bool) -> dict:
    runs = Path(args[args.index("-o") + 1])
    seen = set(runs.rglob("summary.json"))
    with tempfile.TemporaryDirectory() as tmp:
        marks_path = Path(tmp) / "marks.json"
        env = dict(env, STARTUP_MARKS=str(marks_path))
        cmd = ([sys.executable, str(Path(__file__).resolve()), "--child", *args] if wrapped
               else [str(Path(sys.executable).with_name("gage-eval")), *args])
        t0 = time.time()
        proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
        wall = time.time() - t0
        if proc.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        out = {"wall_s": round(wall, 2)}
        if wrapped:
            marks = json.loads(marks_path.read_text())
            out.update({k: round(v - t0, 2) for k, v in marks.items()})
            out["open_s"] = round(marks["open_end"] - marks["open_start"], 2)
        summary = next(p for p in runs.rglob("summary.json") if p not in seen)
        timings = json.loads(summary.read_text())["run"]["timings"]
        out.update({k: round(timings[k], 2) for k in ("model_load_s", "inference_s")})
        warnings = [line for line in proc.stderr.splitlines() if "warning" in line]
        if warnings:
            out["warnings"] = warnings
        return out


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--warm-runs", type=int, default=3)
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--data", help="piqa rows (default: the task's shipped sample.jsonl)")
    ap.add_argument("--no-cache-run", action="store_true", help="also time one start with gguf_cache=false")
    args = ap.parse_args()

    cache = Path(tempfile.mkdtemp(prefix="gage-eval-startup-cache-"))
    runs = Path(tempfile.mkdtemp(prefix="gage-eval-startup-runs-"))
    env = dict(os.environ, GAGE_EVAL_CACHE=str(cache), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    cli = ["--tasks", "piqa", "--limit", str(args.limit), "-o", str(runs), "--quiet"]
    if args.data:
        cli += ["--data", f"piqa={Path(args.data).resolve()}"]
    report: dict = {"command": "gage-eval " + " ".join(cli), "load_before": os.getloadavg()}
    try:
        report["cold"] = run_once(cli, env, wrapped=True)
        print("cold      ", json.dumps(report["cold"]), flush=True)
        report["warm"] = []
        for _ in range(args.warm_runs):
            report["warm"].append(run_once(cli, env, wrapped=True))
            print("warm      ", json.dumps(report["warm"][-1]), flush=True)
        report["warm_plain"] = []
        for _ in range(args.warm_runs):
            report["warm_plain"].append(run_once(cli, env, wrapped=False))
            print("warm plain", json.dumps(report["warm_plain"][-1]), flush=True)
        if args.no_cache_run:
            report["no_cache"] = run_once(cli + ["--model-args", "gguf_cache=false"], env, wrapped=True)
            print("no cache  ", json.dumps(report["no_cache"]), flush=True)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(runs, ignore_errors=True)
    report["load_after"] = os.getloadavg()
    med = statistics.median
    summary = {
        "cold_first_forward_s": report["cold"]["first_forward"],
        "warm_first_forward_s": round(med(r["first_forward"] for r in report["warm"]), 2),
        "warm_open_s": round(med(r["open_s"] for r in report["warm"]), 2),
        "warm_wall_s": round(med(r["wall_s"] for r in report["warm_plain"]), 2),
    }
    if "no_cache" in report:
        summary["no_cache_first_forward_s"] = report["no_cache"]["first_forward"]
    report["summary"] = summary
    print(json.dumps(summary, indent=1))
    print(f"load average before {report['load_before']}, after {report['load_after']}")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "startup.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
