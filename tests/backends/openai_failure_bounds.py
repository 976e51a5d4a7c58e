"""How long the openai backend's default settings take against a broken server, through the CLI.

    python tests/backends/openai_failure_bounds.py [--faults hang,500,dead,drip,401] [--rows 20,500]

Each case starts tests/backends/openai_fake_server.py with that fault on every completion
request (``dead``: a port nothing listens on), runs ``gage-eval --tasks http_rows`` (20
rows; 500 are written to a temporary file and passed with ``--data``) with only
``base_url`` and ``model`` as model arguments, and prints the wall time, the requests the
server saw, the exit status and the rows written and errored. Figures: benchmarks/README.md,
"HTTP failure bounds".
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from openai_fake_server import FakeServer  # noqa: E402

ROOT = HERE.parents[1]


def rows_file(folder: Path, n: int) -> Path:
    path = folder / f"rows{n}.jsonl"
    with path.open("w", encoding="utf-8") as f:
        for i in range(n):
            f.write(json.dumps({"schema_version": "v1", "id": f"row-{i:03d}", "references": [f"word{i}"],
                                "messages": [{"role": "user", "content": [
                                    {"type": "text", "text": f"Repeat the word.\nword{i}"}]}]}) + "\n")
    return path


def measure(fault: str, rows: int, tmp: Path) -> str:
    server = FakeServer(fault=None if fault == "dead" else fault).start()
    if fault == "dead":
        server.stop()
    out = tmp / f"{fault}-{rows}"
    data = [] if rows == 20 else ["--data", f"http_rows={rows_file(tmp, rows)}"]
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "gage_eval.cli", "--tasks", "http_rows", "--include-path",
                           str(HERE / "openai_fault_tasks"), *data, "--model", "openai", "--model-args",
                           f"base_url={server.url},model=fake-model", "-o", str(out), "--run-id", "r", "-q"],
                          capture_output=True, text=True, cwd=ROOT)
    wall = time.monotonic() - t0
    if fault != "dead":
        server.stop()
    written = [json.loads(line) for line in (out / "r" / "samples" / "http_rows.jsonl").read_text().splitlines()]
    errored = sum(1 for r in written if r["eval_result"].get("error"))
    why = next((line for line in proc.stdout.splitlines() if "FAILED" in line), "").partition("FAILED: ")[2]
    return (f"{fault:>5} {rows:>4} rows: {wall:6.1f} s, {len(server.log):>5} requests, exit {proc.returncode}, "
            f"{len(written)} written, {errored} errored; {why[:300]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--faults", default="hang,500,dead,drip,401")
    parser.add_argument("--rows", default="20,500")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for fault in args.faults.split(","):
            for rows in map(int, args.rows.split(",")):
                print(measure(fault, rows, Path(tmp)), flush=True)


if __name__ == "__main__":
    main()
