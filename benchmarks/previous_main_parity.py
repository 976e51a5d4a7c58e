"""Real-model parity between two extracted trees: piqa acc/acc_norm and per-choice log-likelihoods.

    git -C /work/main archive c9e0496 | tar -x -C /tmp/oldmain2     # the previous main
    git -C /work/main archive HEAD | tar -x -C /tmp/newmain         # this main
    HF_HUB_OFFLINE=1 python benchmarks/previous_main_parity.py --old /tmp/oldmain2 --new /tmp/newmain --rows 200

Runs ``gage-eval --tasks piqa --data piqa=FILE --limit N -q`` with the default model (SmolLM2 from
its GGUF through transformers) once under each tree (``PYTHONPATH=DIR``, same interpreter, from a
neutral working directory so that DIR's ``gage_eval`` and ``gage_plugins_builtin`` are the ones
imported; checked before running), then compares:

- ``acc`` and ``acc_norm`` in summary.json (value, stderr and n), exactly;
- every sample's id (same set, same order) and every choice's log-likelihood in
  ``samples/piqa.jsonl`` (``predict_result[*].loglikelihoods``), exactly.

Prints the figures and the largest absolute difference; exit status 1 on any difference.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_DATA = "/work/shared/data/piqa/derived/validation.jsonl"
METRICS = ("acc", "acc_norm")


def tree_env(tree: Path) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(tree))
    return env


def check_imports(tree: Path, cwd: Path) -> None:
    code = "import gage_eval, gage_plugins_builtin; print(gage_eval.__file__); print(gage_plugins_builtin.__file__)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=tree_env(tree), cwd=cwd)
    if done.returncode != 0:
        raise SystemExit(f"{tree}: gage_eval does not import: {done.stderr.strip().splitlines()[-1:]}")
    for line in done.stdout.split():
        if not Path(line).resolve().is_relative_to(tree):
            raise SystemExit(f"{tree}: imports {line}, not the tree's own copy")


def run_tree(tree: Path, data: Path, rows: int, work: Path, tag: str) -> dict:
    check_imports(tree, work)
    out = work / f"out_{tag}"
    cmd = [sys.executable, "-m", "gage_eval.cli", "--tasks", "piqa", "--data", f"piqa={data}", "--limit", str(rows),
           "-q", "-o", str(out), "--run-id", tag]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=tree_env(tree), cwd=work)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{tag} ({tree}) failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    run_dir = out / tag
    summary = json.loads((run_dir / "summary.json").read_text())
    metrics = summary["tasks"]["piqa"]["metrics"]
    samples = []
    with (run_dir / "samples" / "piqa.jsonl").open(encoding="utf-8") as fh:
        for line in fh:
            rec = json.loads(line)
            lls = [list(pr["loglikelihoods"]) for pr in rec["predict_result"]]
            samples.append((rec["id"], lls))
    return {"tree": str(tree), "wall_s": wall, "metrics": {m: metrics[m] for m in METRICS}, "samples": samples,
            "model": summary["run"]["model"].get("model_id")}


def compare(old: dict, new: dict) -> tuple[list[str], dict]:
    diffs: list[str] = []
    for m in METRICS:
        for key in ("value", "stderr", "n"):
            a, b = old["metrics"][m].get(key), new["metrics"][m].get(key)
            if a != b:
                diffs.append(f"{m}.{key}: old {a!r} new {b!r}")
    old_ids = [i for i, _ in old["samples"]]
    new_ids = [i for i, _ in new["samples"]]
    if old_ids != new_ids:
        diffs.append(f"sample ids differ (old {len(old_ids)}, new {len(new_ids)}; same set: {set(old_ids) == set(new_ids)})")
    new_by_id = dict(new["samples"])
    compared = 0
    max_abs = 0.0
    for sid, lls in old["samples"]:
        other = new_by_id.get(sid)
        if other is None:
            continue
        if [len(x) for x in lls] != [len(x) for x in other]:
            diffs.append(f"{sid}: choice counts differ {[len(x) for x in lls]} vs {[len(x) for x in other]}")
            continue
        for a_list, b_list in zip(lls, other):
            for a, b in zip(a_list, b_list):
                compared += 1
                max_abs = max(max_abs, abs(a - b))
                if a != b:
                    diffs.append(f"{sid}: log-likelihood {a!r} vs {b!r}")
    return diffs, {"loglikelihoods_compared": compared, "max_abs_diff": max_abs, "rows": len(old_ids)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="extracted tree of the previous main")
    ap.add_argument("--new", required=True, help="extracted tree of the new main")
    ap.add_argument("--rows", type=int, default=200, help="first N rows of the piqa file (--limit)")
    ap.add_argument("--data", default=DEFAULT_DATA, help=f"piqa jsonl (default {DEFAULT_DATA})")
    ap.add_argument("--work", help="folder for the runs' outputs (default: a new temporary folder)")
    args = ap.parse_args(argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="parity_")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    data = Path(args.data).resolve()
    results = {}
    for tag, tree in (("old", args.old), ("new", args.new)):
        path = Path(tree).resolve()
        if not (path / "gage_eval").is_dir():
            raise SystemExit(f"--{tag} {tree}: no gage_eval folder there")
        results[tag] = run_tree(path, data, args.rows, work, tag)
    old, new = results["old"], results["new"]
    diffs, stats = compare(old, new)
    for tag in ("old", "new"):
        if len(results[tag]["samples"]) != args.rows:
            diffs.append(f"{tag}: {len(results[tag]['samples'])} samples written, expected {args.rows}")
    print(f"data {data}, --limit {args.rows}, model {new['model']}; outputs in {work}")
    print(f"{'tree':<5} {'acc':>8} {'acc_norm':>9} {'rows':>5} {'wall s':>7}  path")
    for tag in ("old", "new"):
        r = results[tag]
        print(f"{tag:<5} {r['metrics']['acc']['value']:>8.4f} {r['metrics']['acc_norm']['value']:>9.4f} "
              f"{len(r['samples']):>5} {r['wall_s']:>7.1f}  {r['tree']}")
    print(f"rows compared {stats['rows']}, log-likelihoods compared {stats['loglikelihoods_compared']}, "
          f"max abs difference {stats['max_abs_diff']!r}")
    if diffs:
        print(f"DIFFERENT ({len(diffs)}):")
        for d in diffs[:20]:
            print("  " + d)
        return 1
    print("IDENTICAL: acc, acc_norm (value, stderr, n), sample ids and every log-likelihood")
    return 0


if __name__ == "__main__":
    sys.exit(main())
