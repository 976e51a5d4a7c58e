"""Peak memory of an MMMU run does not grow with the dataset: 1,000 samples vs 100.

Builds parquet files of N rows cycled from the shared MMMU validation shards (images
embedded, ids made unique), runs `gage-eval --tasks mmmu --model dummy` on each in a
fresh process, and reports each run's peak RSS. Passes when the 1,000-sample peak is
within 1.5x of the 100-sample peak.

    HF_HUB_OFFLINE=1 python benchmarks/mmmu_memory.py [--shared ../shared/data]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUBJECTS = ("Accounting", "Economics", "Finance")
MEASURE = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
           "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(r.returncode)")


def build(shared: Path, n: int, out: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = [pq.read_table(shared / "mmmu" / s / "validation-00000-of-00001.parquet") for s in SUBJECTS]
    table = pa.concat_tables(tables)
    rows = table.num_rows
    picks = [i % rows for i in range(n)]
    cycled = table.take(pa.array(picks))
    ids = cycled.column("id").to_pylist()
    new_ids = [f"{i.rsplit('_', 1)[0]}_{k + 1}" for k, i in enumerate(ids)]
    cycled = cycled.set_column(cycled.schema.get_field_index("id"), "id", pa.array(new_ids))
    path = out / f"mmmu_{n}.parquet"
    pq.write_table(cycled.replace_schema_metadata(tables[0].schema.metadata), path)
    return path


def peak_rss_mb(data: Path, work: Path) -> tuple[float, dict]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               HF_DATASETS_CACHE=str(work / f"cache_{data.stem}"))
    cmd = [sys.executable, "-c", MEASURE, sys.executable, "-m", "gage_eval.cli", "--tasks", "mmmu",
           "--model", "dummy", "--data", f"mmmu={data}", "-o", str(work / "runs"), "--run-id", data.stem, "-q"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"run failed:\n{proc.stdout}\n{proc.stderr}")
    kb = int(proc.stdout.strip().splitlines()[-1])
    summary = json.loads((work / "runs" / data.stem / "summary.json").read_text())
    return kb / 1024, summary["tasks"]["mmmu"]["counts"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--small", type=int, default=100)
    parser.add_argument("--large", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        results = {}
        for n in (args.small, args.large):
            mb, counts = peak_rss_mb(build(args.shared, n, work), work)
            assert counts["total"] == n and counts["errored"] == 0, counts
            results[n] = mb
            print(f"{n:>6} samples: peak RSS {mb:7.1f} MiB  ({counts['scored']} scored)")
    ratio = results[args.large] / results[args.small]
    print(f"ratio {ratio:.2f} (limit 1.50): {'PASS' if ratio <= 1.5 else 'FAIL'}")
    return 0 if ratio <= 1.5 else 1


if __name__ == "__main__":
    sys.exit(main())
