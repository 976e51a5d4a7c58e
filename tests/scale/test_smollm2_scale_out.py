"""64 piqa rows with the bundled SmolLM2: two shards merged, and two Ray replicas, each give the
single-process run's summary and records. Log-likelihoods may differ in the last float bits
(rows are batched with different neighbours: padding changes the summation order), so they
are compared to 1e-4, and the batch bookkeeping (``raw``, latency) is left out; everything
else exactly."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

ROWS = "64"  # each row costs about a CPU-second a run on two cores; the checks do not depend on the count


def records(run_dir: Path) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for line in (run_dir / "samples" / "piqa.jsonl").read_text().splitlines():
        record = json.loads(line)
        for pred in record.get("predict_result") or []:
            pred.pop("latency_ms", None)
            pred.pop("raw", None)  # the batch the row was scored in (its size): where it ran, not what
        assert record["id"] not in out
        out[record["id"]] = record
    return out


def assert_same(got: dict[str, dict], want: dict[str, dict]) -> None:
    assert set(got) == set(want) and len(want) == int(ROWS)
    worst = 0.0
    for sid, record in want.items():
        other = got[sid]
        a, b = record["predict_result"][0], other["predict_result"][0]
        la, lb = a.pop("loglikelihoods"), b.pop("loglikelihoods")
        worst = max([worst] + [abs(x - y) for x, y in zip(la, lb)])
        assert all(math.isclose(x, y, abs_tol=1e-4) for x, y in zip(la, lb)), (sid, la, lb)
        assert other == record, (sid, {k: (a.get(k), b.get(k)) for k in set(a) | set(b) if a.get(k) != b.get(k)},
                                 [k for k in record if record[k] != other.get(k)])
        a["loglikelihoods"], b["loglikelihoods"] = la, lb
    assert worst < 1e-4


def tasks_of(run_dir: Path) -> dict:
    task = json.loads((run_dir / "summary.json").read_text())["tasks"]["piqa"]
    return {k: v for k, v in task.items() if k != "timings"}


@pytest.fixture(scope="module")
def single(tmp_path_factory, shared_data, reuse_weights):
    from click.testing import CliRunner

    from gage_eval.cli import cli

    out = tmp_path_factory.mktemp("smollm2_scale")
    data = shared_data / "piqa" / "derived" / "validation.jsonl"

    def run(run_id: str, *extra: str):
        args = ["--tasks", "piqa", "--data", f"piqa={data}", "--model", "smollm2", "--limit", ROWS, "-o", str(out),
                "--run-id", run_id, "-q", "--no-report", *extra]
        with reuse_weights():  # (Ray's replicas load their own in their processes)
            result = CliRunner().invoke(cli, args, catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return out / run_id

    return run, run("single")


@pytest.mark.slow
def test_two_shards_merged_equal_the_single_run(single, run_cli):
    run, one = single
    shards = [run(f"shard{i}", "--shard", f"{i}/2") for i in range(2)]
    merged = shards[0].parent / "merged"
    result = run_cli("merge", *shards, "-o", merged)
    assert result.exit_code == 0, result.output
    assert_same(records(merged), records(one))
    assert tasks_of(merged) == tasks_of(one)


@pytest.mark.slow
def test_two_ray_replicas_equal_the_single_run(single):
    ray = pytest.importorskip("ray", reason="needs Ray: pip install 'gage-eval[ray]'")
    run, one = single
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        two = run("ray", "--executor", "ray", "--model-args", "replicas=2,num_cpus=1")
    finally:
        if started:
            ray.shutdown()
    assert_same(records(two), records(one))
    assert tasks_of(two) == tasks_of(one)
