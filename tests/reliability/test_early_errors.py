"""Every check that needs no model runs before the model loads (issue 28): each case is the real CLI
with the default model (SmolLM2, a 20-30 s load) answering at once with its one line, no "loading
model" line, and (for a usage error) no run folder left behind."""
from __future__ import annotations

import socket

from harness import TASK_FAILED, USAGE, Outcome, check

HUB_TASK = """\
name: hubtask
dataset: {loader: hf, args: {path: nobody/no-such-dataset, split: test}}
preprocessor: {name: legacy, args: {question: goal, choices: [sol1, sol2], answer: label}}
request: {kind: loglikelihood, prompt: prompt.jinja}
metrics: [acc]
"""

LOCAL_TASK = HUB_TASK.replace("{loader: hf, args: {path: nobody/no-such-dataset, split: test}}",
                              "{loader: jsonl, args: {path: rows.jsonl}}")


def early(o: Outcome, rc: int, *messages: str) -> None:
    check(o, rc, *messages)
    assert "loading model" not in o.err, o.err
    if rc == USAGE:
        assert not o.run_dir.exists(), "a refused run left its folder behind"
        assert len(o.err.strip().splitlines()) == 1 and not o.out, o.text


def task_folder(gage, text: str = HUB_TASK) -> str:
    folder = gage.tmp / "tasks" / "hubtask"
    folder.mkdir(parents=True)
    (folder / "task.yaml").write_text(text)
    (folder / "prompt.jinja").write_text("Question: {{ question }}\nAnswer:")
    (folder / "rows.jsonl").write_text('{"goal": "g", "sol1": "a", "sol2": "b", "label": 0}\n')
    return str(gage.tmp / "tasks")


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_cuda_without_a_gpu_says_use_cpu(gage):
    early(gage("--tasks", "piqa", "--device", "cuda", env={"CUDA_VISIBLE_DEVICES": ""}), USAGE, "use --device cpu")


def test_mps_is_not_offered_and_refused_before_the_load(gage):
    assert "mps" not in gage("--help").out
    early(gage("--tasks", "piqa", "--device", "mps"), USAGE, "device must be one of cpu, cuda, auto or cuda:N")


def test_missing_data_file_is_a_usage_error(gage):
    early(gage("--tasks", "piqa", "--data", f"piqa={gage.tmp / 'nope.jsonl'}"), USAGE, "nope.jsonl does not exist")


def test_task_without_data_offline_names_data(gage):
    early(gage("--tasks", "hubtask", "--include-path", task_folder(gage)), TASK_FAILED, "offline", "--data TASK=PATH")


def test_unreachable_hub_fails_fast_naming_data_and_offline(gage):
    env = {"HF_HUB_OFFLINE": "", "HF_DATASETS_OFFLINE": "", "HF_ENDPOINT": f"http://127.0.0.1:{closed_port()}",
           **{v: "" for v in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")}}
    early(gage("--tasks", "hubtask", "--include-path", task_folder(gage), env=env, timeout=30), TASK_FAILED,
          "cannot reach http://127.0.0.1:", "--data TASK=PATH", "HF_HUB_OFFLINE=1")


def test_use_cache_points_at_cache(gage):
    early(gage("--tasks", "piqa", "--use_cache", "lm_cache"), USAGE, "--use_cache (lm-evaluation-harness): use --cache DIR")


def test_no_task_is_a_usage_error_naming_tasks(gage):
    early(gage("--model", "dummy"), USAGE, "no task to run: name them with --tasks")


def test_unknown_task_did_you_mean(gage):
    early(gage("--tasks", "piqaa"), USAGE, "unknown task(s): piqaa (did you mean 'piqa'?)")


def test_a_name_in_the_wrong_case_is_named(gage):
    early(gage("--tasks", "PIQA"), USAGE, "unknown task(s): PIQA (did you mean 'piqa'?)")
    early(gage("--tasks", "piqa", "--model", "DUMMY"), USAGE, "unknown backend 'DUMMY' (did you mean 'dummy'?)")


def test_unknown_backend_did_you_mean(gage):
    early(gage("--tasks", "piqa", "--model", "dumy"), USAGE, "unknown backend 'dumy' (did you mean 'dummy'?)")


def test_unknown_metric_did_you_mean(gage):
    early(gage("--tasks", "hubtask", "--include-path", task_folder(gage, LOCAL_TASK.replace("[acc]", "[acc_nrm]"))),
          TASK_FAILED, "unknown metric 'acc_nrm' (did you mean 'acc_norm'?)")


def test_unknown_loader_did_you_mean(gage):
    early(gage("--tasks", "hubtask", "--include-path", task_folder(gage, LOCAL_TASK.replace("jsonl,", "jsnl,"))),
          TASK_FAILED, "unknown loader 'jsnl' (did you mean 'jsonl'?)")
