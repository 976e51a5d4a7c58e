"""Throughput of the openai backend against a local server that answers after a fixed latency.

    python benchmarks/http_concurrency.py                 # 500 requests at 16 and 64, 100 at 1, median of 3
    python benchmarks/http_concurrency.py --n1 500        # the full 500 at concurrency 1 (50 s)
    python benchmarks/http_concurrency.py --engine        # also 500 and 5000 rows through the gage-eval CLI

The server (benchmarks/latency_server.py) runs in its own process on 127.0.0.1 and answers
each request ``--latency`` seconds (100 ms) after reading it, so the ideal throughput at
concurrency c is c / latency requests per second. Reports achieved / ideal per level, and
also against the best any client can do with n requests: ceil(n / c) rounds of the latency
(500 requests at 64 need 8 rounds, 0.8 s, not 500 / 640 = 0.78 s).
"""
from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERVER = ROOT / "benchmarks" / "latency_server.py"


def start_server(latency: float) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, str(SERVER), "--port", "0", "--latency", str(latency)],
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if "http://" not in line:
        proc.kill()
        raise SystemExit(f"the fake server did not start: {line!r}")
    return proc, line.strip().split()[-1]


def backend_run(url: str, concurrency: int, n: int) -> tuple[float, int]:
    from gage_eval.api.backend import Request
    from gage_plugins_builtin.backends.openai_backend import openai_backend

    backend = openai_backend(base_url=url, model="fake-model", concurrency=concurrency, max_retries=0)
    try:
        backend.run([Request(kind="generate", sample_id=f"w{i}", prompt=f"warm {i}") for i in range(concurrency)])
        requests = [Request(kind="generate", sample_id=str(i), prompt=f"Question {i}\nanswer {i}",
                            gen={"max_new_tokens": 8}) for i in range(n)]
        t0 = time.perf_counter()
        outputs = backend.run(requests)
        wall = time.perf_counter() - t0
    finally:
        backend.close()
    errors = sum(1 for o in outputs if o.error)
    return wall, errors


def engine_run(url: str, concurrency: int, n: int) -> dict:
    """The same requests as rows of a task run by the CLI: the engine's windows included."""
    with tempfile.TemporaryDirectory() as tmp:
        task = Path(tmp) / "tasks" / "http_bench"
        task.mkdir(parents=True)
        (task / "task.yaml").write_text(
            "dataset: {loader: jsonl, args: {path: rows.jsonl}}\npreprocessor: {name: identity}\n"
            "request: {kind: generate, generation: {max_new_tokens: 8}}\nmetrics: [exact_match]\n")
        with (task / "rows.jsonl").open("w") as f:
            for i in range(n):
                f.write(json.dumps({"schema_version": "v1", "id": f"r{i}", "messages": [{"role": "user", "content": [
                    {"type": "text", "text": f"Question {i}\nanswer {i}"}]}], "references": [f"answer {i}"]}) + "\n")
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "gage_eval.cli", "--tasks", "http_bench", "--include-path",
                        str(task.parent), "--model", "openai", "--model-args",
                        f"base_url={url},model=fake-model,concurrency={concurrency},max_retries=0",
                        "-o", tmp, "--run-id", "run", "-q"], check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
        summary = json.loads((Path(tmp) / "run" / "summary.json").read_text())
    task_summary = summary["tasks"]["http_bench"]
    return {"wall_s": wall, "inference_s": task_summary["timings"]["inference_s"],
            "counts": task_summary["counts"], "score": task_summary["metrics"]["exact_match"]["value"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=500, help="requests per level (default 500)")
    parser.add_argument("--n1", type=int, default=100, help="requests at concurrency 1 (default 100: 10 s)")
    parser.add_argument("--levels", default="1,16,64")
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--repeat", type=int, default=3, help="runs per level; the median is reported (default 3)")
    parser.add_argument("--engine", action="store_true", help="also run rows through the CLI at the top level")
    parser.add_argument("--engine-rows", default="500,5000", help="row counts for --engine (default 500,5000)")
    args = parser.parse_args()
    proc, url = start_server(args.latency)
    try:
        print(f"server {url}, latency {args.latency * 1000:.0f} ms")
        print(f"{'concurrency':>11} {'requests':>8} {'wall s':>7} {'req/s':>7} {'ideal':>7} {'of ideal':>8} "
              f"{'floor s':>7} {'of floor':>8} errors")
        levels = [int(x) for x in args.levels.split(",")]
        for c in levels:
            n = args.n1 if c == 1 else args.n
            runs = sorted(backend_run(url, c, n) for _ in range(max(1, args.repeat)))
            wall, errors = runs[len(runs) // 2]
            rate, ideal = n / wall, c / args.latency
            floor = math.ceil(n / c) * args.latency
            spread = f"  (walls {', '.join(f'{w:.3f}' for w, _ in runs)})" if len(runs) > 1 else ""
            print(f"{c:>11} {n:>8} {wall:>7.3f} {rate:>7.1f} {ideal:>7.1f} {rate / ideal:>8.1%} "
                  f"{floor:>7.3f} {floor / wall:>8.1%} {errors}{spread}")
        if args.engine:
            c = levels[-1]
            ideal = c / args.latency
            for rows in (int(x) for x in args.engine_rows.split(",")):
                result = engine_run(url, c, rows)
                print(f"engine (CLI) at concurrency {c}: {rows} rows, inference {result['inference_s']:.2f} s = "
                      f"{rows / result['inference_s'] / ideal:.1%} of ideal; whole command {result['wall_s']:.2f} s "
                      f"(start-up and writing included) = {rows / result['wall_s'] / ideal:.1%}; "
                      f"counts {result['counts']}; exact_match {result['score']:.3f}")
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    main()
