"""--shard I/N and `gage-eval merge`: the shards of a run, merged, give the unsharded run's
summary (metrics, stderr, intervals, slices, counts) and its records; what cannot be merged is
refused naming the folder and the reason."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gage_eval.config.options import in_shard
from gage_eval.api.schemas import validation_errors


def summary_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def records(run_dir: Path, task: str = "piqa") -> list[dict]:
    """The task's records by id, without the measured latencies."""
    out = []
    for line in (run_dir / "samples" / f"{task}.jsonl").read_text().splitlines():
        record = json.loads(line)
        for pred in record.get("predict_result") or []:
            pred.pop("latency_ms", None)
        out.append(record)
    return sorted(out, key=lambda r: r["id"])


def untimed(task: dict) -> dict:
    return {k: v for k, v in task.items() if k != "timings"}


def run(run_cli, tmp_path, run_id, *args):
    result = run_cli("--tasks", "piqa", "--model", "dummy", "-o", tmp_path, "--run-id", run_id, "-q", "--no-report",
                     *args)
    assert result.exit_code in (0, 1), result.output
    return tmp_path / run_id


@pytest.mark.parametrize("count, extra", [(2, ()), (3, ("--limit", "0.75"))])
def test_merged_shards_equal_the_unsharded_run(run_cli, tmp_path, count, extra):
    full = run(run_cli, tmp_path, "full", *extra)
    shards = [run(run_cli, tmp_path, f"s{i}", "--shard", f"{i}/{count}", *extra) for i in range(count)]
    sizes = [summary_of(s)["tasks"]["piqa"]["counts"]["total"] for s in shards]
    assert sum(sizes) == summary_of(full)["tasks"]["piqa"]["counts"]["total"] and all(sizes)
    result = run_cli("merge", *reversed(shards), "-o", tmp_path / "merged")  # any order
    merged = tmp_path / "merged"
    assert result.exit_code == summary_of(full)["run"]["exit_status"], result.output
    a, b = summary_of(full), summary_of(merged)
    assert untimed(b["tasks"]["piqa"]) == untimed(a["tasks"]["piqa"])
    assert b["run"]["exit_status"] == a["run"]["exit_status"] and b["run"]["settings"]["shard"] is None
    assert validation_errors(b, "summary") == []
    assert records(merged) == records(full)
    assert len((merged / "instances" / "piqa.jsonl").read_text().splitlines()) == len(records(full))


def test_the_shards_partition_the_rows_by_sample_id():
    ids = [f"piqa-{i}" for i in range(1000)]
    owners = [[i for i in range(4) if in_shard(sid, f"{i}/4")] for sid in ids]
    assert all(len(o) == 1 for o in owners)
    sizes = [sum(o == [i] for o in owners) for i in range(4)]
    assert min(sizes) > 200, sizes  # a hash, not a range: every shard gets about a quarter


@pytest.mark.parametrize("shard", ["2/2", "1", "a/b", "-1/2", "0/0"])
def test_a_bad_shard_is_a_usage_error(run_cli, tmp_path, shard):
    result = run_cli("--tasks", "piqa", "--model", "dummy", "-o", tmp_path, "--run-id", "x", "--shard", shard)
    assert result.exit_code == 2 and "--shard: expected I/N" in result.output, result.output
    assert not (tmp_path / "x").exists()


def test_merge_refuses_what_is_not_one_runs_complete_set(run_cli, tmp_path):
    s0 = run(run_cli, tmp_path, "s0", "--shard", "0/2")
    s1 = run(run_cli, tmp_path, "s1", "--shard", "1/2")
    other = run(run_cli, tmp_path, "o1", "--shard", "1/2", "--seed", "7")
    third = run(run_cli, tmp_path, "t1", "--shard", "1/3")
    full = run(run_cli, tmp_path, "full")
    cases = [
        ((s0,), "shard(s) 1/2 missing"),
        ((s0, other), "differ in seed"),
        ((s0, s1, s1), "given twice"),
        ((s0, third), "is shard 1/3"),
        ((s0, full), "is not a shard"),
        ((s0, tmp_path), "is not a gage-eval run folder"),
    ]
    for i, (dirs, words) in enumerate(cases):
        result = run_cli("merge", *dirs, "-o", tmp_path / f"m{i}")
        assert result.exit_code == 2 and words in result.output, (words, result.output)
        assert "Traceback" not in result.output and not (tmp_path / f"m{i}").exists()
    summary = summary_of(s1)
    summary["run"]["interrupted"] = "interrupted by the user (Ctrl-C)"
    (s1 / "summary.json").write_text(json.dumps(summary))
    result = run_cli("merge", s0, s1, "-o", tmp_path / "mi")
    assert result.exit_code == 2 and "did not finish" in result.output and f"--resume {s1}" in result.output
    (tmp_path / "exists").mkdir()
    summary["run"]["interrupted"] = None
    (s1 / "summary.json").write_text(json.dumps(summary))
    result = run_cli("merge", s0, s1, "-o", tmp_path / "exists")
    assert result.exit_code == 2 and "already exists" in result.output


def test_a_shard_resumes_as_itself_only(run_cli, tmp_path):
    s0 = run(run_cli, tmp_path, "s0", "--shard", "0/2")
    result = run_cli("--resume", s0, "--shard", "1/2", "-q")
    assert result.exit_code == 2 and "shard" in result.output, result.output
    assert run_cli("--resume", s0, "-q").exit_code == 0


def test_every_builtin_task_merged_from_shards_equals_the_unsharded_run(run_cli, tmp_path):
    """piqa, MMMU, DocVQA and legal_eval_v1 (the golden slices of the shared data, the dummy
    backend and the dummy judge) in 3 shards, merged: the unsharded run's summary and records."""
    import sys

    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "tests" / "golden"))
    import golden

    if not golden.SHARED_DATA.is_dir():
        pytest.skip(f"needs the shared data at {golden.SHARED_DATA}")
    pytest.importorskip("pyarrow", reason="the MMMU slice is written as parquet")
    data = golden.write_slices(golden.SHARED_DATA, tmp_path / "slices")
    args = ["--tasks", ",".join(golden.TASKS), "--model", "dummy", "--judge-model", "dummy", "--judge-args",
            golden.JUDGE_ARGS, "--limit", golden.PIQA_ROWS, "-o", tmp_path, "-q", "--no-report"]
    for task, path in data.items():
        args += ["--data", f"{task}={path}"]
    assert run_cli(*args, "--run-id", "full").exit_code == 0
    for i in range(3):
        result = run_cli(*args, "--run-id", f"s{i}", "--shard", f"{i}/3")
        assert result.exit_code in (0, 3), result.output  # a shard may hold no row of a small task
    result = run_cli("merge", *(tmp_path / f"s{i}" for i in range(3)), "-o", tmp_path / "merged")
    assert result.exit_code == 0, result.output
    full, merged = summary_of(tmp_path / "full"), summary_of(tmp_path / "merged")
    assert list(merged["tasks"]) == list(golden.TASKS)
    for task in golden.TASKS:
        assert untimed(merged["tasks"][task]) == untimed(full["tasks"][task]), task
        assert records(tmp_path / "merged", task) == records(tmp_path / "full", task), task


def test_merge_keeps_what_each_shards_backend_counted(run_cli, tmp_path):
    """run.model.stats (Backend.stats: requests per endpoint, replicas lost) of every shard, in
    shard order, not the first shard's alone."""
    shards = [run(run_cli, tmp_path, f"s{i}", "--shard", f"{i}/2") for i in range(2)]
    for i, s in enumerate(shards):
        summary = summary_of(s)
        summary["run"]["model"]["stats"] = {"endpoints": [{"url": "http://h/v1", "requests": 10 + i, "failures": i}]}
        (s / "summary.json").write_text(json.dumps(summary))
    result = run_cli("merge", shards[1], shards[0], "-o", tmp_path / "merged")
    assert result.exit_code in (0, 1), result.output
    stats = summary_of(tmp_path / "merged")["run"]["model"]["stats"]
    assert [e["endpoints"][0]["requests"] for e in stats["shards"]] == [10, 11]
    assert validation_errors(summary_of(tmp_path / "merged"), "summary") == []


@pytest.mark.parametrize("fails", ["summary", "rename", "ctrl-c"])
def test_a_merge_that_cannot_write_keeps_nothing(run_cli, tmp_path, monkeypatch, fails):
    """A write that fails part way (a full disk), the final rename, or Ctrl-C part way: exit 4
    (130), and neither the output, its temporary folder nor the parent folders the merge made are
    left; shards unchanged."""
    import os

    from gage_eval.runfolder import writers
    from gage_eval.api.runfolder import output_error

    shards = [run(run_cli, tmp_path, f"s{i}", "--shard", f"{i}/2") for i in range(2)]
    before = sorted(str(p) for p in tmp_path.rglob("*"))

    def full(self, summary):
        raise output_error(self.path, OSError(28, "No space left on device"))

    def rename(src, dst):
        raise OSError(18, "Invalid cross-device link")

    def ctrl_c(self, task, record):
        raise KeyboardInterrupt

    if fails == "summary":
        monkeypatch.setattr(writers.SummaryWriter, "end", full)
    elif fails == "rename":
        monkeypatch.setattr(os, "rename", rename)
    else:
        from gage_plugins_builtin.eee.writer import InstancesWriter

        monkeypatch.setattr(InstancesWriter, "write", ctrl_c)
    result = run_cli("merge", *shards, "-o", tmp_path / "new" / "merged")
    if fails == "ctrl-c":
        assert result.exit_code == 130 and "merge: interrupted; nothing of" in result.output, result.output
    else:
        assert result.exit_code == 4, result.output
        assert "merge: cannot write" in result.output and "merge again" in result.output
    assert "--resume" not in result.output and "Traceback" not in result.output
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before
    monkeypatch.undo()
    assert run_cli("merge", *shards, "-o", tmp_path / "new" / "merged").exit_code in (0, 1)
    assert len(records(tmp_path / "new" / "merged")) == sum(len(records(s)) for s in shards)
