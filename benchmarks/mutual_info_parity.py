"""acc_mutual_info parity: gage-eval against lm-evaluation-harness 0.4.13 on the first N piqa rows.

Both harnesses score the same rows with the same weights (the bundled SmolLM2-135M-Instruct GGUF,
float32, CPU) and list acc, acc_norm and acc_mutual_info. gage-eval runs the task folder
tests/data/piqa_mi (piqa plus acc_mutual_info; the rows carry no unconditioned_input, so each
choice is also scored after the empty context, as lm-eval does); lm-eval runs a local task YAML
with lm-eval's piqa prompt in its own venv (default /work/venv-lmeval, or $LMEVAL_VENV), offline.

    python benchmarks/mutual_info_parity.py [--data ../shared/data/piqa/derived/validation.jsonl]
        [--limit 200] [--skip-lm-eval] [--skip-gage | --gage-run RUN_FOLDER]

Prints the three metrics of both harnesses, the largest per-row difference of the conditional and
the unconditioned log-likelihoods, and the rows whose acc_mutual_info differs; writes
benchmarks/out/mutual_info_parity.json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = HERE / "out" / "mutual_info"
sys.path.insert(0, str(HERE))
from piqa_vs_lm_eval import DEFAULT_DATA, LMEVAL_VENV, bundled_gguf, lm_eval_task_yaml  # noqa: E402
METRICS = ("acc", "acc_norm", "acc_mutual_info")

def timed_run(cmd: list[str], cwd: Path) -> float:
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    print("$", " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, cwd=cwd)
    return time.perf_counter() - t0


def run_lm_eval(gguf: Path, data: Path, limit: int, batch: str) -> dict:
    py = LMEVAL_VENV / "bin" / "python"
    if not py.is_file():
        sys.exit(f"no lm-eval venv at {LMEVAL_VENV} (set LMEVAL_VENV; lm-eval==0.4.13 with torch CPU)")
    tasks_dir = OUT / "lm_eval_tasks"
    tasks_dir.mkdir(parents=True, exist_ok=True)
    (tasks_dir / "piqa_mi_local.yaml").write_text(lm_eval_task_yaml("piqa_mi_local", data, METRICS))
    out = OUT / "lm_eval"
    cmd = [str(py), "-m", "lm_eval", "--model", "hf",
           "--model_args", f"pretrained={gguf.parent},gguf_file={gguf.name},dtype=float32",
           "--device", "cpu", "--tasks", "piqa_mi_local", "--include_path", str(tasks_dir),
           "--batch_size", batch, "--limit", str(limit), "--output_path", str(out), "--log_samples"]
    wall = timed_run(cmd, cwd=OUT)
    results = sorted(out.rglob("results_*.json"), key=lambda p: p.stat().st_mtime)[-1]
    res = json.loads(results.read_text())["results"]["piqa_mi_local"]
    samples = sorted(results.parent.glob("samples_piqa_mi_local_*.jsonl"), key=lambda p: p.stat().st_mtime)[-1]
    rows = {}
    for line in samples.open():
        doc = json.loads(line)
        lls = [float(r[0]) for r in doc["filtered_resps"]]
        half = len(lls) // 2  # conditional requests first, then the unconditioned ones
        rows[int(doc["doc_id"])] = {"lls": lls[:half], "uncond": lls[half:],
                                    **{m: float(doc[m]) for m in METRICS}}
    return {"metrics": {m: res[f"{m},none"] for m in METRICS}, "wall_s": round(wall, 1), "rows": rows}


def run_gage(data: Path, limit: int) -> dict:
    out = OUT / "gage"
    run_id = time.strftime("%Y%m%d-%H%M%S")
    cmd = [str(Path(sys.executable).parent / "gage-eval"), "--tasks", "piqa_mi",
           "--include-path", str(ROOT / "tests" / "data" / "piqa_mi"), "--data", f"piqa_mi={data}",
           "--model", "smollm2", "--limit", str(limit), "-o", str(out), "--run-id", run_id, "--quiet"]
    wall = timed_run(cmd, cwd=ROOT)
    return read_gage(out / run_id, wall)


def read_gage(run: Path, wall: float | None = None) -> dict:
    """A gage-eval run folder's metrics and rows (by row index)."""
    task = json.loads((run / "summary.json").read_text())["tasks"]["piqa_mi"]
    rows = {}
    for line in (run / "samples" / "piqa_mi.jsonl").open():  # written as rows finish: any order
        rec = json.loads(line)
        i = int(str(rec["id"]).rsplit("-", 1)[1])  # the legacy preprocessor's id: TASK-ROWINDEX
        pr = (rec.get("predict_result") or [{}])[0]
        got = (rec.get("eval_result") or {}).get("metrics") or {}
        rows[i] = {"lls": pr.get("loglikelihoods"), "uncond": pr.get("unconditioned_loglikelihoods"),
                   **{m: (got.get(m) or {}).get("value") for m in METRICS},
                   "error": (rec.get("eval_result") or {}).get("error")}
    return {"metrics": {m: (task["metrics"].get(m) or {}).get("value") for m in METRICS},
            "wall_s": None if wall is None else round(wall, 1), "rows": rows, "run_dir": str(run)}


def compare(gage: dict, lm: dict) -> dict:
    def worst(key: str) -> float | None:
        diffs = [abs(a - b) for i, r in lm["rows"].items() if gage["rows"].get(i, {}).get(key)
                 for a, b in zip(r[key], gage["rows"][i][key])]
        return max(diffs) if diffs else None

    differ = {m: sorted(i for i, r in lm["rows"].items() if gage["rows"].get(i, {}).get(m) != r[m]) for m in METRICS}
    return {"metric_diff": {m: None if gage["metrics"][m] is None else round(gage["metrics"][m] - lm["metrics"][m], 6)
                            for m in METRICS},
            "max_abs_ll_diff": worst("lls"), "max_abs_unconditioned_ll_diff": worst("uncond"),
            "rows_differing": differ}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--limit", type=int, default=200)
    ap.add_argument("--lm-eval-batch", default="16")
    ap.add_argument("--skip-lm-eval", action="store_true")
    ap.add_argument("--skip-gage", action="store_true")
    ap.add_argument("--gage-run", type=Path, help="read this gage-eval run folder instead of running")
    args = ap.parse_args()
    data = args.data.resolve()
    if not data.is_file():
        sys.exit(f"no data file {data} (the piqa rows with labels: ../shared/data/piqa/derived/validation.jsonl)")
    OUT.mkdir(parents=True, exist_ok=True)
    saved = OUT / "parity.json"
    report = json.loads(saved.read_text()) if saved.is_file() else {}
    report.update({"data": str(data), "limit": args.limit})
    gguf = bundled_gguf()
    if not args.skip_lm_eval:
        report["lm_eval"] = run_lm_eval(gguf, data, args.limit, args.lm_eval_batch)
    if args.gage_run:
        report["gage_eval"] = read_gage(args.gage_run.resolve())
    elif not args.skip_gage:
        report["gage_eval"] = run_gage(data, args.limit)
    for who in ("lm_eval", "gage_eval"):
        if who in report:
            m, w = report[who]["metrics"], report[who]["wall_s"]
            print(f"{who:9s} " + "  ".join(f"{k} {v:.4f}" for k, v in m.items() if v is not None)
                  + ("" if w is None else f"  wall {w}s"))
    if "lm_eval" in report and "gage_eval" in report:
        # json keys are strings once saved; compare on ints
        for who in ("lm_eval", "gage_eval"):
            report[who]["rows"] = {int(k): v for k, v in report[who]["rows"].items()}
        report["diff"] = compare(report["gage_eval"], report["lm_eval"])
        print(json.dumps(report["diff"]))
    saved.write_text(json.dumps(report, indent=1))
    (HERE / "out" / "mutual_info_parity.json").write_text(
        json.dumps({k: v for k, v in report.items() if k not in ("lm_eval", "gage_eval")} | {
            who: {k: v for k, v in report[who].items() if k != "rows"} for who in ("lm_eval", "gage_eval")
            if who in report}, indent=1))


if __name__ == "__main__":
    main()
