"""legal_eval_v1 with the bundled SmolLM2 as both the model and the judge, on one real row of each type (the shortest)."""
from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest

MERGED = "legal_eval_v1/data/for_eval/merged_legal_eval_v1.jsonl"


@pytest.mark.slow
def test_smollm2_model_and_judge_end_to_end(shared_data, reuse_weights, tmp_path, run_cli):
    rows = [json.loads(l) for l in (shared_data / MERGED).read_text().splitlines()]
    picked = []
    for kind in ("mcq", "reference_qa", "rubric_qa"):
        of_kind = [r for r in rows if r["task_type"] == kind and not r.get("attachments")]
        of_kind.sort(key=lambda r: (len(r.get("rubric") or []), len(r["prompt"])))  # the cheapest to judge
        picked += of_kind[:1]
    data = tmp_path / "few.jsonl"
    data.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in picked) + "\n", encoding="utf-8")
    # the task folder with short judge replies, so the 135M judge stays quick on 2 CPU cores
    folder = tmp_path / "tasks" / "legal_eval_v1"
    shutil.copytree(Path(__file__).resolve().parents[2] / "tasks" / "legal_eval_v1", folder)
    spec = (folder / "task.yaml").read_text()
    (folder / "task.yaml").write_text(spec.replace("max_new_tokens: 200", "max_new_tokens: 16"))
    cfg = tmp_path / "run.yaml"
    cfg.write_text(textwrap.dedent(f"""\
        models:
          dut: {{backend: smollm2}}
          judge: {{backend: smollm2}}
        include_paths: [{folder}]
        tasks:
          - name: legal_eval_v1
            data: {data}
            generation: {{max_new_tokens: 24}}
        """))
    with reuse_weights():
        result = run_cli("--config", cfg, "-o", tmp_path / "runs", "--run-id", "s", "-q")
    summary = json.loads((tmp_path / "runs" / "s" / "summary.json").read_text())
    task = summary["tasks"]["legal_eval_v1"]
    counts = task["counts"]
    # a 135M judge often answers in prose: those rows are judge errors, and the exit status says so
    assert result.exit_code == (1 if counts["errored"] else 0), result.output
    assert counts["total"] == 3 and counts["scored"] + counts["errored"] + counts["skipped"] == 3
    records = [json.loads(l) for l in (tmp_path / "runs" / "s" / "samples" / "legal_eval_v1.jsonl").open()]
    errors = [r["eval_result"].get("error") for r in records]
    # the model ran on every row; only the judge may fail
    assert counts["errored"] == counts["judge_errors"], errors
    assert task["metrics"]["choice_set_match"]["n"] == 1
    assert {r["id"] for r in records} == {r["id"] for r in picked}
    for r in records:
        assert r["predict_result"][0]["message"]["content"][0]["text"] is not None
        if r["task_type"] != "mcq":
            judge = r["eval_result"].get("judge") or {}
            assert judge.get("score") is not None or r["eval_result"]["error"]["stage"] == "judge"
