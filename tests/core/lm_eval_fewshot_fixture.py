"""Writes tests/core/lm_eval_fewshot.json: the prompts lm-evaluation-harness renders for piqa-style
rows with --num_fewshot, and the log-likelihoods it computes through SmolLM2's chat template.

Run it with lm-eval's own Python (not gage-eval's), from the project root:

    HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 LMEVAL_GGUF=PATH/SmolLM2-135M-Instruct.Q4_1.gguf \\
        LMEVAL_VENV/bin/python tests/core/lm_eval_fewshot_fixture.py

The rows are the project's own tasks/piqa/sample.jsonl (24 rows): lines 1-16 serve as the
few-shot pool ("train") and lines 17-24 as the evaluated rows, or all 24 are both (the source
is the evaluated data). lm-eval's piqa prompt: "Question: {{goal}}\\nAnswer:", choices sol1/sol2,
target delimiter " ", few-shot delimiter "\\n\\n", few-shot seed 1234.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "tasks" / "piqa" / "sample.jsonl"
OUT = Path(__file__).with_name("lm_eval_fewshot.json")


def task_yaml(folder: Path, files: dict[str, Path], splits: list[str]) -> None:
    lines = ["task: piqa_fs", "dataset_path: json", "dataset_kwargs:", "  data_files:"]
    lines += [f"    {name}: {path}" for name, path in files.items()]
    lines += ["output_type: multiple_choice", *splits, 'doc_to_text: "Question: {{goal}}\\nAnswer:"',
              "doc_to_target: label", 'doc_to_choice: "{{[sol1, sol2]}}"', 'target_delimiter: " "',
              "metric_list:", "  - metric: acc"]
    (folder / "piqa_fs.yaml").write_text("\n".join(lines) + "\n")


def run(folder: Path, model: str, model_args: str | None, k: int, limit: int, **kwargs) -> list[dict]:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    res = simple_evaluate(model=model, model_args=model_args, tasks=["piqa_fs"], num_fewshot=k, limit=limit,
                          log_samples=True, fewshot_random_seed=1234, batch_size=4,
                          task_manager=TaskManager(include_path=str(folder)), **kwargs)
    out = []
    for s in sorted(res["samples"]["piqa_fs"], key=lambda s: s["doc_id"]):
        args = s["arguments"]
        pairs = [(a["arg_0"], a["arg_1"]) for a in args.values()] if isinstance(args, dict) else \
            [tuple(a) for a in args]
        row = {"doc_id": s["doc_id"], "context": pairs[0][0], "continuations": [p[1] for p in pairs]}
        if model != "dummy":
            row["loglikelihoods"] = [r[0][0] for r in s["resps"]]
        out.append(row)
    return out


def main() -> None:
    import lm_eval

    lines = SAMPLE.read_text().splitlines()
    tmp = Path(tempfile.mkdtemp())
    pool, evaluated = tmp / "pool.jsonl", tmp / "evaluated.jsonl"
    pool.write_text("\n".join(lines[:16]) + "\n")
    evaluated.write_text("\n".join(lines[16:]) + "\n")
    split_dir, same_dir = tmp / "split", tmp / "same"
    split_dir.mkdir()
    same_dir.mkdir()
    # no test_split and no fewshot_split (as lm-eval's piqa): K + 1 drawn, the evaluated doc left out
    task_yaml(split_dir, {"train": pool, "validation": evaluated},
              ["validation_split: validation", "training_split: train"])
    # the evaluated split is the few-shot split
    task_yaml(same_dir, {"validation": SAMPLE}, ["test_split: validation", "fewshot_split: validation"])
    gguf = Path(os.environ["LMEVAL_GGUF"])
    hf_args = f"pretrained={gguf.parent},gguf_file={gguf.name},dtype=float32"
    fixture = {
        "lm_eval_version": lm_eval.__version__ if hasattr(lm_eval, "__version__") else "",
        "plain_from_train": run(split_dir, "dummy", None, 3, 8),
        "plain_same_source": run(same_dir, "dummy", None, 3, 24),
        "chat_system_single_turn": run(split_dir, "hf", hf_args, 2, 3, device="cpu", apply_chat_template=True,
                                       fewshot_as_multiturn=False, system_instruction="Be brief."),
        "chat_multiturn": run(split_dir, "hf", hf_args, 2, 3, device="cpu", apply_chat_template=True,
                              fewshot_as_multiturn=True),
    }
    OUT.write_text(json.dumps(fixture, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
