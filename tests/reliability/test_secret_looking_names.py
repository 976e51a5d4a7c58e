"""A task, a data_tag value or a --data key that merely looks like a secret's name ("auth",
"password", "token") is a name, not a setting: the run's results under it are kept, and resume
finds its data again. Secrets under such a name are still masked."""
from __future__ import annotations

import json

from harness import OK, check

from gage_eval.api.secrets import REDACTED, redact

TASK = """\
name: auth
dataset: {loader: jsonl, args: {path: rows.jsonl}}
preprocessor: {name: legacy, args: {question: goal, choices: [sol1, sol2], answer: label, data_tag: [cat]}}
request: {kind: loglikelihood, prompt: prompt.jinja}
metrics: [acc]
"""


def test_a_task_named_auth_with_a_password_slice(gage):
    folder = gage.tmp / "tasks" / "auth"
    folder.mkdir(parents=True)
    (folder / "task.yaml").write_text(TASK)
    (folder / "prompt.jinja").write_text("Question: {{ question }}\nAnswer:")
    rows = [{"goal": f"Q{i}?", "sol1": "yes", "sol2": "no", "label": i % 2, "cat": ["password", "token"][i % 2]}
            for i in range(4)]
    data = gage.tmp / "mine.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    o = gage("--tasks", "auth", "--model", "dummy", "--include-path", gage.tmp / "tasks", "--data", f"auth={data}")
    check(o, OK, "auth  acc")
    task = o.summary["tasks"]["auth"]
    assert task["counts"]["scored"] == 4
    assert set(task["slices"]["cat"]) == {"password", "token"}
    assert task["slices"]["cat"]["password"]["acc"]["n"] == 2
    config = json.loads((o.run_dir / "config.json").read_text())
    assert config["data"] == {"auth": str(data)}
    resumed = gage("--resume", o.run_dir)
    check(resumed, OK, "auth  acc")


def test_secrets_under_a_name_are_still_masked():
    out = redact({"task_overrides": {"auth": {"model_args": {"api_key": "sk-1234567"}}},
                  "tasks": {"token": {"headers": {"X": "v"}, "source": "http://u:pw@host/x"}},
                  "api_key": "sk-1234567", "auth": "Bearer x"})
    assert out["task_overrides"]["auth"]["model_args"]["api_key"] == REDACTED
    assert out["tasks"]["token"]["headers"]["X"] == REDACTED
    assert "pw" not in out["tasks"]["token"]["source"]
    assert out["api_key"] == REDACTED and out["auth"] == REDACTED
