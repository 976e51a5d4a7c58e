"""--executor ray on a local Ray instance: model replicas as actors give the single-process run's
results; a replica killed mid-run loses no row and writes none twice; a Ray run whose driver is
killed with SIGKILL resumes; what cannot run is refused with one line (exit 2)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="needs Ray: pip install 'gage-eval[ray]'")

from gage_eval.engine.executor import split_args as _split  # noqa: E402
from gage_eval.plugins import load_plugins  # noqa: E402
from gage_plugins_builtin.ray_executor import Plan  # noqa: E402
from gage_eval.api.errors import GageError  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def records(run_dir: Path, task: str = "piqa") -> dict[str, dict]:
    """The task's records by id, without the measured latencies; no id may appear twice."""
    out: dict[str, dict] = {}
    for line in (run_dir / "samples" / f"{task}.jsonl").read_text().splitlines():
        record = json.loads(line)
        for pred in record.get("predict_result") or []:
            pred.pop("latency_ms", None)
        assert record["id"] not in out, f"{record['id']} written twice"
        out[record["id"]] = record
    return out


def metrics(run_dir: Path, task: str = "piqa") -> dict:
    return json.loads((run_dir / "summary.json").read_text())["tasks"][task]["metrics"]


def piqa_data(shared_data: Path) -> Path:
    return shared_data / "piqa" / "derived" / "validation.jsonl"


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray instance for the in-process runs of this module (2 CPUs, as CI has)."""
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    if started:
        ray.shutdown()


def split_args(args, executor):
    return _split(load_plugins()[1], args, executor)


def test_replica_args_are_taken_by_the_executor_and_checked():
    args, plan = split_args({"pretrained": "m", "replicas": 4, "num_cpus": 2, "num_gpus": 1}, "ray")
    assert args == {"pretrained": "m"} and (plan.replicas, plan.num_cpus, plan.num_gpus) == (4, 2, 1)
    assert plan.restarts == 4 and split_args({"replica_restarts": 0}, "ray")[1].restarts == 0
    # vLLM's data_parallel_size is the replica count; each replica keeps its tensor parallelism and GPUs
    args, plan = split_args({"pretrained": "m", "data_parallel_size": 2, "tensor_parallel_size": 4}, "ray")
    assert args == {"pretrained": "m", "tensor_parallel_size": 4}
    assert (plan.replicas, plan.num_gpus) == (2, 4)
    assert split_args({"pretrained": "m"}, "local") == ({"pretrained": "m"}, None)
    for bad, executor, message in [
        ({"replicas": 2}, "local", "add --executor ray"),
        ({"num_gpus": 1}, "local", "only apply with --executor ray"),
        ({"replicas": 0}, "ray", "replicas must be a whole number of at least 1"),
        ({"replicas": "two"}, "ray", "replicas must be a whole number"),
        ({"num_cpus": -1}, "ray", "num_cpus must be a number of at least 0"),
        ({"num_gpus": 1.5}, "ray", "whole number of GPUs"),
        ({"replica_restarts": -1}, "ray", "replica_restarts must be a whole number of at least 0"),
        ({"replicas": 2, "data_parallel_size": 3}, "ray", "disagree"),
        ({}, "slurm", "--executor: expected one of local, ray"),
    ]:
        with pytest.raises(GageError, match=message):
            split_args(bad, executor)
    assert Plan(2, 0.5, 1).describe() == "2 Ray replicas (0.5 CPU, 1 GPU each)"


def _run(run_cli, out: Path, run_id: str, data: Path, *extra: str, model_args: str = "", limit: str = "300"):
    args = ["--tasks", "piqa", "--data", f"piqa={data}", "--model", "dummy", "--limit", limit, "-o", out,
            "--run-id", run_id, "-q", "--no-report"]
    if model_args:
        args += ["--model-args", model_args]
    return run_cli(*args, *extra)


def test_two_replicas_give_the_single_process_results(run_cli, tmp_path, shared_data, local_ray):
    data = piqa_data(shared_data)
    one = _run(run_cli, tmp_path, "local", data)
    assert one.exit_code == 0, one.output
    two = _run(run_cli, tmp_path, "ray", data, "--executor", "ray", model_args="replicas=2,num_cpus=1")
    assert two.exit_code == 0, two.output
    assert records(tmp_path / "ray") == records(tmp_path / "local")
    assert metrics(tmp_path / "ray") == metrics(tmp_path / "local")
    summary = json.loads((tmp_path / "ray" / "summary.json").read_text())
    assert summary["run"]["settings"]["executor"] == "ray"
    assert summary["run"]["model"]["settings"] == json.loads((tmp_path / "local" / "summary.json").read_text())["run"][
        "model"]["settings"]  # replicas are where it ran, not what it computed


def kill_replicas_after(samples: Path, rows: int, which=lambda name: "-replica-" in name, every: bool = False
                        ) -> tuple[threading.Thread, list[str]]:
    """A watcher that kills the first replica ``which`` picks (every one with ``every``) once the
    run has written ``rows`` records; returns it, started, and the names it killed."""
    killed: list[str] = []

    def watch() -> None:
        deadline = time.time() + 120
        while time.time() < deadline:
            if samples.exists() and len(samples.read_text().splitlines()) >= rows:
                for actor in ray.util.list_named_actors(all_namespaces=True):
                    if which(actor["name"]):
                        ray.kill(ray.get_actor(actor["name"], namespace=actor["namespace"]))
                        killed.append(actor["name"])
                        if not every:
                            return
                return
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    return watcher, killed


def test_a_replica_killed_mid_run_loses_no_row(run_cli, tmp_path, shared_data, local_ray):
    data = piqa_data(shared_data)
    run_dir = tmp_path / "killed"
    samples = run_dir / "samples" / "piqa.jsonl"
    watcher, killed = kill_replicas_after(samples, 100)  # a quarter of the rows written: a replica goes
    result = _run(run_cli, tmp_path, "killed", data, "--executor", "ray", limit="400",
                  model_args="replicas=2,num_cpus=1,batch_size=8,delay_ms=10")
    watcher.join(timeout=5)
    assert killed, "no replica was killed: the run ended before 100 rows were written?"
    assert result.exit_code == 0, result.output
    assert "a Ray replica is gone" in result.output and "starting a replacement" in result.output
    expected = _run(run_cli, tmp_path, "local", data, limit="400")
    assert expected.exit_code == 0
    got = records(run_dir)
    assert len(got) == 400 and got == records(tmp_path / "local")
    assert metrics(run_dir) == metrics(tmp_path / "local")


def test_every_replica_gone_stops_the_run_and_resume_finishes_it(run_cli, tmp_path, shared_data, local_ray):
    data = piqa_data(shared_data)
    run_dir = tmp_path / "gone"
    samples = run_dir / "samples" / "piqa.jsonl"

    watcher, _ = kill_replicas_after(samples, 40, every=True)
    result = _run(run_cli, tmp_path, "gone", data, "--executor", "ray", limit="200",
                  model_args="replicas=2,num_cpus=1,batch_size=8,delay_ms=10,replica_restarts=0")
    watcher.join(timeout=5)
    assert result.exit_code != 0
    assert "every Ray replica of the model is gone" in result.output
    written = records(run_dir)
    assert len(written) == 200  # every row written: the unanswered ones carry the reason
    assert any((r["eval_result"].get("error") or {}).get("stage") == "inference" for r in written.values())
    resumed = run_cli("--resume", run_dir, "-q")
    assert resumed.exit_code == 0, resumed.output
    expected = _run(run_cli, tmp_path, "local", data, limit="200")
    assert expected.exit_code == 0
    assert records(run_dir) == records(tmp_path / "local")


def test_a_plan_the_cluster_cannot_place_is_refused(run_cli, tmp_path, shared_data, local_ray):
    result = _run(run_cli, tmp_path, "big", piqa_data(shared_data), "--executor", "ray",
                  model_args="replicas=3,num_cpus=1")
    assert result.exit_code == 2, result.output
    assert "3 Ray replicas (1 CPU each) need 3 CPU in all, and the Ray cluster has 2" in result.output
    gpu = _run(run_cli, tmp_path, "gpu", piqa_data(shared_data), "--executor", "ray", model_args="num_gpus=1")
    assert gpu.exit_code == 2 and "need 1 GPU in all, and the Ray cluster has 0" in gpu.output, gpu.output


@pytest.mark.parametrize("extra, message", [
    (("--model-args", "replicas=2"), "replicas=2 runs the model as 2 replicas on a Ray cluster: add --executor ray"),
    (("--ray-address", "auto"), "--ray-address joins a Ray cluster for --executor ray; add --executor ray"),
    (("--executor", "ray", "--model-args", "replicas=0"), "replicas must be a whole number of at least 1"),
])
def test_usage_errors_leave_no_run_folder(run_cli, tmp_path, extra, message):
    result = run_cli("--tasks", "piqa", "--model", "dummy", "-o", tmp_path, "--run-id", "x", *extra)
    assert result.exit_code == 2 and message in result.output, result.output
    assert not (tmp_path / "x").exists()


def test_dry_run_names_the_replicas(run_cli):
    result = run_cli("--tasks", "piqa", "--model", "dummy", "--executor", "ray", "--model-args",
                     "replicas=2,num_cpus=1", "--dry-run", "1")
    assert result.exit_code == 0, result.output
    assert "model: dummy (gage-eval/dummy), as 2 Ray replicas (1 CPU each)" in result.output


def test_a_ray_run_resumes_after_its_driver_is_killed(tmp_path, shared_data, run_cli):
    """The driver (the gage-eval process) gets SIGKILL part way; --resume finishes the run with
    the single-process run's records. Its local Ray instance is cleaned up afterwards."""
    data = piqa_data(shared_data)
    run_dir = tmp_path / "driver"
    cmd = [sys.executable, "-m", "gage_eval.cli", "--tasks", "piqa", "--data", f"piqa={data}", "--model", "dummy",
           "--model-args", "replicas=2,num_cpus=1,batch_size=8,delay_ms=10", "--executor", "ray", "--limit", "300",
           "-o", str(tmp_path), "--run-id", "driver", "-q", "--no-report"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    samples = run_dir / "samples" / "piqa.jsonl"
    try:
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            if samples.exists() and len(samples.read_text().splitlines()) >= 60:
                break
            time.sleep(0.02)
        assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        before = len(samples.read_text().splitlines())
        assert 60 <= before < 300
        resumed = subprocess.run([sys.executable, "-m", "gage_eval.cli", "--resume", str(run_dir), "-q"], env=env,
                                 capture_output=True, text=True, timeout=300)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    finally:
        try:  # what the killed driver's Ray instance left behind
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    expected = _run(run_cli, tmp_path, "local", data)
    assert expected.exit_code == 0
    assert records(run_dir) == records(tmp_path / "local")
    assert metrics(run_dir) == metrics(tmp_path / "local")


def _cut(run_dir: Path, keep: int) -> None:
    """The run as if stopped after ``keep`` rows (the samples file is the record of truth)."""
    samples = run_dir / "samples" / "piqa.jsonl"
    samples.write_text("\n".join(samples.read_text().splitlines()[:keep]) + "\n")


def test_where_the_model_runs_may_change_on_resume(run_cli, tmp_path, shared_data, local_ray):
    data = piqa_data(shared_data)
    assert _run(run_cli, tmp_path, "local", data, limit="120").exit_code == 0
    # a Ray run resumed in one process: the stored replica arguments are dropped
    assert _run(run_cli, tmp_path, "r", data, "--executor", "ray", limit="120",
                model_args="replicas=2,num_cpus=1").exit_code == 0
    _cut(tmp_path / "r", 50)
    resumed = run_cli("--resume", tmp_path / "r", "--executor", "local", "-q")
    assert resumed.exit_code == 0, resumed.output
    config = json.loads((tmp_path / "r" / "config.json").read_text())
    assert config["executor"] == "local" and config["model_args"] == {}
    assert records(tmp_path / "r") == records(tmp_path / "local")
    # a one-process run resumed on Ray replicas, given with the model arguments
    assert _run(run_cli, tmp_path, "l", data, limit="120").exit_code == 0
    _cut(tmp_path / "l", 30)
    resumed = run_cli("--resume", tmp_path / "l", "--executor", "ray", "--model-args", "replicas=2,num_cpus=1", "-q")
    assert resumed.exit_code == 0, resumed.output
    config = json.loads((tmp_path / "l" / "config.json").read_text())
    assert config["executor"] == "ray" and config["model_args"] == {"replicas": 2, "num_cpus": 1}
    assert records(tmp_path / "l") == records(tmp_path / "local")
    # what the model computes still may not change
    changed = run_cli("--resume", tmp_path / "l", "--model-args", "replicas=2,num_cpus=1,response=echo", "-q")
    assert changed.exit_code == 2 and "model_args" in changed.output, changed.output



def test_a_lost_replica_is_replaced_and_the_run_stays_exact(run_cli, tmp_path, shared_data, local_ray):
    data = piqa_data(shared_data)
    run_dir = tmp_path / "replaced"
    samples = run_dir / "samples" / "piqa.jsonl"
    watcher, killed = kill_replicas_after(samples, 60, which=lambda name: name.endswith("-replica-0"))
    # about 8 s of work left on one replica when it is killed: the replacement opens in 2 to 4 s
    result = _run(run_cli, tmp_path, "replaced", data, "--executor", "ray", limit="900",
                  model_args="replicas=2,num_cpus=1,batch_size=8,delay_ms=20")
    watcher.join(timeout=5)
    assert killed and result.exit_code == 0, result.output
    assert "starting a replacement (1 more allowed)" in result.output
    assert "a replacement Ray replica is ready (2 replicas)" in result.output
    stats = json.loads((run_dir / "summary.json").read_text())["run"]["model"]["stats"]
    assert (stats["replicas"], stats["lost"], stats["replaced"]) == (2, 1, 1), stats
    assert _run(run_cli, tmp_path, "local", data, limit="900").exit_code == 0
    got = records(run_dir)
    assert len(got) == 900 and got == records(tmp_path / "local")


def test_the_response_cache_is_shared_with_one_process_runs(run_cli, tmp_path, shared_data, local_ray):
    """Replicas compute what one process computes: a run on Ray finds every answer a one-process
    run stored in the same --cache (and asks no replica)."""
    data = piqa_data(shared_data)
    cache = tmp_path / "cache"
    assert _run(run_cli, tmp_path, "local", data, "--cache", cache, limit="50").exit_code == 0
    result = _run(run_cli, tmp_path, "ray", data, "--cache", cache, "--executor", "ray", limit="50",
                  model_args="replicas=2,num_cpus=1")
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "ray" / "summary.json").read_text())
    assert (summary["run"]["cache"]["hits"], summary["run"]["cache"]["misses"]) == (50, 0)
    assert records(tmp_path / "ray") == records(tmp_path / "local")
