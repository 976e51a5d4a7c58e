"""`gage-eval merge` given an incomplete, damaged or tampered set of shards: refused with one line
naming the shard, file and line (exit 2), nothing left behind, and the retry after the fix merges
exactly as the good set does."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from harness import OK, USAGE, Gage, check

ROWS, SHARDS = 95, 3


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    """The unsharded run ``full`` and its three shards ``s0``..``s2``, run once for the module."""
    gage = Gage(tmp_path_factory.mktemp("made"))
    data = gage.tmp / "rows.jsonl"
    data.write_text("".join(json.dumps({"goal": f"Question {i}?", "sol1": f"yes {i}", "sol2": "no", "label": i % 2})
                            + "\n" for i in range(ROWS)))
    args = ("--tasks", "piqa", "--model", "dummy", "--data", f"piqa={data}", "-q", "--no-report")
    check(gage(*args, run_id="full"), OK)
    for i in range(SHARDS):
        check(gage(*args, "--shard", f"{i}/{SHARDS}", run_id=f"s{i}"), OK)
    return gage.tmp / "runs"


@pytest.fixture
def runs(gage, made) -> Path:
    """A copy of the made runs for one test to damage."""
    shutil.copytree(made, gage.tmp / "runs")
    return gage.tmp / "runs"


def merge(gage: Gage, runs: Path, out: str = "merged", shards=None):
    dirs = shards or [runs / f"s{i}" for i in range(SHARDS)]
    o = gage("merge", *dirs, "-o", runs / out, run_id=None)
    o.run_dir = runs / out if (runs / out).is_dir() else None  # (check() then verifies the merged run)
    return o


def tree(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (hidden ones too) by its sha256: what a refusal must leave as it was."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(folder.rglob("*"))}


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines(keepends=True)


def records(run_dir: Path) -> list[dict]:
    out = []
    for line in lines(run_dir / "samples" / "piqa.jsonl"):
        record = json.loads(line)
        for pred in record.get("predict_result") or []:
            pred.pop("latency_ms", None)
        out.append(record)
    return sorted(out, key=lambda r: r["id"])


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))


def refused(gage: Gage, runs: Path, *messages: str, shards=None) -> None:
    before = tree(runs)
    o = merge(gage, runs, shards=shards)
    check(o, USAGE, *messages)
    assert len((o.out + o.err).strip().splitlines()) == 1, o.text
    assert tree(runs) == before, "a refusal left something behind or changed a shard"


def test_a_good_set_merges_as_the_unsharded_run(gage, runs):
    o = merge(gage, runs)
    check(o, OK, f"piqa: {ROWS} rows, {ROWS} scored, 0 errored")
    full, merged = summary(runs / "full"), summary(runs / "merged")
    assert {k: v for k, v in merged["tasks"]["piqa"].items() if k != "timings"} == \
        {k: v for k, v in full["tasks"]["piqa"].items() if k != "timings"}
    assert records(runs / "merged") == records(runs / "full")
    assert merged["run"]["id"] == "merged" and merged["run"]["settings"]["shard"] is None
    assert sorted(p.name for p in runs.iterdir()) == ["full", "merged", "s0", "s1", "s2"]  # no temporary folder


def test_a_shard_that_lost_lines_is_refused(gage, runs):
    path = runs / "s1" / "samples" / "piqa.jsonl"
    kept = lines(path)
    n = len(kept)
    path.write_text("".join(kept[:-5]), encoding="utf-8")
    assert summary(runs / "s1")["tasks"]["piqa"]["counts"]["total"] == n
    refused(gage, runs, f"merge: {runs / 's1'}: task 'piqa': samples/piqa.jsonl holds {n - 5} records (total)",
            f"summary.json counts {n}")


def test_a_record_moved_into_another_shard_is_refused(gage, runs):
    """Moved whole: its own shard's file and summary lose it, the other's gain it (counts agree)."""
    src, dst = runs / "s0", runs / "s2"
    moved, *rest = lines(src / "samples" / "piqa.jsonl")
    (src / "samples" / "piqa.jsonl").write_text("".join(rest), encoding="utf-8")
    target = lines(dst / "samples" / "piqa.jsonl")
    (dst / "samples" / "piqa.jsonl").write_text("".join(target) + moved, encoding="utf-8")
    for run_dir, step in ((src, -1), (dst, 1)):
        s = summary(run_dir)
        for key in ("total", "scored"):
            s["tasks"]["piqa"]["counts"][key] += step
        (run_dir / "summary.json").write_text(json.dumps(s), encoding="utf-8")
    sid = json.loads(moved)["id"]
    refused(gage, runs, f"{dst / 'samples' / 'piqa.jsonl'}:{len(target) + 1}: sample {sid!r} belongs to shard "
            f"0/3 ({src}), not to this shard, 2/3")


def test_overlapping_ids_are_refused_leave_nothing_and_the_retry_merges(gage, runs):
    path = runs / "s1" / "samples" / "piqa.jsonl"
    good = path.read_bytes()
    copied = lines(runs / "s0" / "samples" / "piqa.jsonl")[3]
    path.write_bytes(good + copied.encode())
    sid = json.loads(copied)["id"]
    refused(gage, runs, f"{path}:{len(lines(path))}: sample {sid!r} belongs to shard 0/3")
    path.write_bytes(good + lines(path)[0].encode())  # the same id twice in its own shard
    refused(gage, runs, f"{path}:{len(lines(path))}: sample {json.loads(lines(path)[0])['id']!r} is written twice")
    path.write_bytes(good)
    check(merge(gage, runs), OK)
    assert records(runs / "merged") == records(runs / "full")


@pytest.mark.parametrize("damage, message", [
    ("torn", "samples/piqa.jsonl:{n}: torn (no end of line: the run was stopped mid-write)"),
    ("link", "samples/piqa.jsonl: resolves to {outside}, outside the run folder"),  # (read through the shard's folder)
    ("fifo", "samples/piqa.jsonl: a FIFO, not a regular file"),  # (it blocked the merge)
    ("unfinished", "s1: no readable summary.json/inputs.json"),
    ("interrupted", "did not finish (killed); finish it first: gage-eval --resume"),
    ("counts", "s1/summary.json: key 'tasks.piqa.counts' is not an object of whole numbers"),
    ("tasks", "s1/summary.json: expected an object with objects 'run' and 'tasks'"),
    ("no id", "samples/piqa.jsonl:1: key 'id': expected a string or an integer, got null"),  # (the record check)
])
def test_a_damaged_shard_is_one_line(gage, runs, damage, message):
    s1 = runs / "s1"
    path, s = s1 / "samples" / "piqa.jsonl", summary(s1)
    n = len(lines(path))
    outside = runs.parent / "elsewhere.jsonl"
    if damage == "torn":
        path.write_bytes(path.read_bytes()[:-40])
    elif damage == "link":
        path.rename(outside)
        path.symlink_to(outside)
    elif damage == "fifo":
        path.unlink()
        os.mkfifo(path)
    elif damage == "unfinished":
        (s1 / "summary.json").unlink()
    elif damage == "interrupted":
        s["run"]["interrupted"] = "killed"
    elif damage == "counts":
        s["tasks"]["piqa"]["counts"]["total"] = str(n)
    elif damage == "tasks":
        s["tasks"] = ["piqa"]
    elif damage == "no id":
        first, *rest = lines(path)
        path.write_text("".join([json.dumps({**json.loads(first), "id": None}) + "\n", *rest]), encoding="utf-8")
    if (s1 / "summary.json").exists():
        (s1 / "summary.json").write_text(json.dumps(s), encoding="utf-8")
    refused(gage, runs, message.format(n=n, outside=outside))


def test_the_output_folder_is_checked_before_anything_is_written(gage, runs):
    (runs / "merged").mkdir()
    refused(gage, runs, f"merge: {runs / 'merged'} already exists; give a new folder")
    (runs / "merged").rmdir()
    before = tree(runs)
    o = gage("merge", runs / "s0", runs / "s1", runs / "s2", "-o", runs / "s1" / "merged", run_id=None)
    check(o, USAGE, f"-o {runs / 's1' / 'merged'} is inside the shard {runs / 's1'}")
    assert tree(runs) == before
    refused(gage, runs, f"merge: {runs / 's1'} is given twice", shards=[runs / f"s{i}" for i in (0, 1, 1, 2)])
    o = gage("merge", runs / "s0", runs / "s1", runs / "s2", "-o", runs / "new" / "deeper" / "merged", run_id=None)
    check(o, OK)
    assert records(runs / "new" / "deeper" / "merged") == records(runs / "full")


def test_a_refusal_removes_the_parent_folders_it_made(gage, runs):
    path = runs / "s2" / "samples" / "piqa.jsonl"
    path.write_text("".join(lines(path)[1:]), encoding="utf-8")
    before = tree(runs)
    o = gage("merge", *(runs / f"s{i}" for i in range(SHARDS)), "-o", runs / "a" / "b" / "merged", run_id=None)
    check(o, USAGE, "holds")
    assert tree(runs) == before and not (runs / "a").exists()
