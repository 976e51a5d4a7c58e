"""legal_eval_v1 attachments under the file access policy: read from the data file's folder
(and the task's document roots), never from outside them unless --allow-path says so; the
real CLI in a subprocess, with a canary file the rows try to reach."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from gage_eval.tasks.rows import RowChecker
from gage_eval.api.sample import RowContext
from gage_plugins_builtin.legal.preprocess import LegalEvalV1

ROOT = Path(__file__).resolve().parents[2]


JUDGE = ("--judge-model", "dummy", "--judge-args", 'response=fixed,text={"score": 1}')


def row(sid: str, *paths: str) -> dict:
    """A reference_qa row whose prompt (no policy) carries the attachments' text."""
    row = {"schema_version": "legal_eval_v1", "id": sid, "dataset": "t", "task_type": "reference_qa",
           "prompt": "Which article applies?", "reference_answers": ["Art. 1"], "metadata": {}}
    if paths:
        row["attachments"] = [{"path": p, "kind": "text"} for p in paths]
    return row


@pytest.fixture
def layout(tmp_path):
    canary = f"CANARY-{uuid.uuid4().hex}"
    data = tmp_path / "data"
    (data / "notes").mkdir(parents=True)
    (data / "notes" / "ok.txt").write_text("The tenancy note says Art. 1.")
    (tmp_path / "secret.txt").write_text(canary)
    (data / "notes" / "link.txt").symlink_to(tmp_path / "secret.txt")
    cases = [
        (row("ok", "notes/ok.txt"), None),
        (row("up", "../secret.txt"), ["attachments[0].path", "'../secret.txt'", "--allow-path"]),
        (row("abs", str(tmp_path / "secret.txt")), ["attachments[0].path", "secret.txt'", "--allow-path"]),
        (row("passwd", "/etc/passwd"), ["attachments[0].path", "'/etc/passwd'", "--allow-path"]),
        (row("link", "notes/link.txt"), ["attachments[0].path", "'notes/link.txt'", "outside"]),
        (row("second", "notes/ok.txt", "../../secret.txt"), ["attachments[1].path", "'../../secret.txt'"]),
        (row("missing", "notes/nope.txt"), ["attachments[0].path", "'notes/nope.txt' not found"]),
        (row("plain"), None),
    ]
    rows = data / "rows.jsonl"
    rows.write_text("\n".join(json.dumps(r) for r, _ in cases) + "\n")
    return {"root": tmp_path, "rows": rows, "canary": canary,
            "expected": {line: words for line, (_, words) in enumerate(cases, 1)}}


def gage(*args, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "gage_eval.cli", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_attachments_stay_inside_the_data_folder(layout):
    root, rows = layout["root"], layout["rows"]
    proc = gage("--tasks", "legal_eval_v1", "--data", f"legal_eval_v1={rows}", "--model", "dummy", *JUDGE,
                "-o", root / "runs", "--run-id", "r", cwd=root)
    assert "Traceback" not in proc.stderr and proc.returncode == 1, proc.stderr
    run = root / "runs" / "r"
    records = [json.loads(line) for line in (run / "samples" / "legal_eval_v1.jsonl").read_text().splitlines()]
    assert len(records) == len(layout["expected"])
    errors = {}
    for record in records:
        error = record["eval_result"].get("error")
        if error:
            errors[int(error["locator"].rsplit(":", 1)[1])] = error["message"]
    assert set(errors) == {line for line, words in layout["expected"].items() if words}
    for line, message in errors.items():
        assert all(w in message for w in layout["expected"][line]), (line, message)
    ok = next(r for r in records if r["id"] == "ok")
    assert "The tenancy note says Art. 1." in ok["predict_result"][0]["prompt"]  # an allowed attachment is read

    vproc = gage("validate", rows, "--schema", "legal_eval_v1", cwd=root)
    invalid = {int(line.split(":")[1]) for line in vproc.stdout.splitlines()
               if line.startswith(f"{rows}:") and " rows, " not in line}
    assert invalid == set(errors), vproc.stdout  # validate and the run agree

    outputs = [proc.stdout, proc.stderr, vproc.stdout, vproc.stderr]
    outputs += [p.read_text(errors="replace") for p in run.rglob("*") if p.is_file()]
    assert not any(layout["canary"] in text for text in outputs)
    assert not any("root:x:0:0" in text for text in outputs)


def test_allow_path_lets_an_outside_attachment_in(layout):
    root, rows = layout["root"], layout["rows"]
    proc = gage("--tasks", "legal_eval_v1", "--data", f"legal_eval_v1={rows}", "--model", "dummy", *JUDGE,
                "--allow-path", root, "-o", root / "runs", "--run-id", "r", cwd=root)
    records = {r["id"]: r for r in map(json.loads, (root / "runs" / "r" / "samples" / "legal_eval_v1.jsonl").open())}
    assert "error" not in records["up"]["eval_result"], records["up"]["eval_result"]
    assert layout["canary"] in records["up"]["predict_result"][0]["prompt"]
    assert "passwd" not in records and "Traceback" not in proc.stderr  # /etc/passwd stays refused (an error stub)
    assert any("'/etc/passwd'" in (r["eval_result"].get("error") or {}).get("message", "") for r in records.values())


def test_preprocessor_confines_and_names_the_field(tmp_path):
    (tmp_path / "secret.txt").write_text("s")
    data = tmp_path / "data"
    data.mkdir()
    ctx = RowContext("t", "f:1", 0, base_dir=data)
    with pytest.raises(ValueError, match=r"^attachments\[0\]\.path: path '\.\./secret\.txt' is outside"):
        LegalEvalV1()(row("x", "../secret.txt"), ctx)
    allowed = RowContext("t", "f:1", 0, base_dir=data, allowed_dirs=(tmp_path.resolve(),))
    sample = LegalEvalV1()(row("x", "../secret.txt"), allowed)
    assert sample["metadata"]["attachment_texts"][0]["text"] == "s"


def test_document_roots_reach_the_curated_folder_only(tmp_path):
    """The repository layout: data/for_eval/rows.jsonl names documents/... kept in data/curated/."""
    (tmp_path / "data" / "for_eval").mkdir(parents=True)
    (tmp_path / "data" / "curated" / "documents").mkdir(parents=True)
    (tmp_path / "data" / "curated" / "documents" / "d.txt").write_text("doc")
    (tmp_path / "data" / "other.txt").write_text("not a document")
    base = tmp_path / "data" / "for_eval"
    pre = LegalEvalV1()
    checker = RowChecker("legal_eval_v1", pre, base_dir=base)
    assert checker.check("f:1", 0, row("a", "documents/d.txt")).ok
    refused = checker.check("f:2", 1, row("b", "../other.txt"))
    assert refused.stage == "preprocess" and "outside" in refused.message
    file_mode = RowChecker("legal_eval_v1", LegalEvalV1(attachments="file"), base_dir=base)
    result = file_mode.check("f:1", 0, row("a", "documents/d.txt"))
    assert result.ok and result.sample["messages"][-1]["content"][0]["file_url"]["url"].startswith("file://")


def test_shipped_task_and_its_documents_still_run(tmp_path):
    proc = gage("--tasks", "legal_eval_v1", "--model", "dummy", *JUDGE, "-o", tmp_path, "--run-id", "r", "-q", cwd=tmp_path)
    assert "Traceback" not in proc.stderr
    records = [json.loads(line) for line in (tmp_path / "r" / "samples" / "legal_eval_v1.jsonl").open()]
    assert all("error" not in r["eval_result"] for r in records), [r["eval_result"] for r in records]
    with_doc = [r for r in records if r["metadata"].get("attachments")]
    assert with_doc and all(Path(a["resolved_path"]).is_relative_to(ROOT / "tasks" / "legal_eval_v1")
                            for r in with_doc for a in r["metadata"]["attachments"])
