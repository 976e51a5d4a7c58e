"""Issue 25, groups in the outputs: report.html shows each group's aggregate rows (summary.json's
figures as they are) with its members; ``gage-eval compare`` compares the groups, the paired part
pooled over their tasks' paired rows (checked against a plainly written stratified bootstrap); the
EEE 0.3.0 aggregate has a result per group and metric, valid under EEE's shipped schema.

The runs: a task file with three tasks (7, 12 and 5 rows) and two groups, ``gtop`` (size-weighted
acc, unweighted acc_norm) over the subgroup ``gfirst`` (two tasks, by their tag) and a third task,
run by the dummy model with two seeds."""
from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from gage_eval.api import stats
from gage_eval.cli import cli

SIZES = {"a": 7, "b": 12, "c": 5}
TASK_YAML = """name: gt_{x}
variants: [{x: a, kind: k1}, {x: b, kind: k1}, {x: c, kind: k2}]
tags: ['gtag_{kind}']
dataset: {loader: jsonl, args: {path: '{x}.jsonl'}}
preprocessor: {name: legacy, args: {question: goal, choices: [sol1, sol2], answer: label, task_type: multiple-choice}}
request: {kind: loglikelihood, prompt: prompt.jinja, choice: "{{ option.content }}", target_delimiter: " "}
metrics: [acc, acc_norm]
groups:
  gtop: {tasks: [gfirst, gt_c], aggregate: [{metric: acc}, {metric: acc_norm, weight_by_size: false}]}
  gfirst: {alias: first two, tasks: [gtag_k1], aggregate: [{metric: acc}]}
"""
TASKS = ["gt_a", "gt_b", "gt_c"]


def _cli(*args) -> str:
    result = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two runs of the group gtop: A (seed 1234, EEE 0.3.0) and B (seed 7)."""
    work = tmp_path_factory.mktemp("groups")
    folder = work / "tasks" / "grp"
    folder.mkdir(parents=True)
    (folder / "task.yaml").write_text(TASK_YAML)
    (folder / "prompt.jinja").write_text("Question: {{ question }}\nAnswer:")
    rng = random.Random(5)
    for x, n in SIZES.items():
        (folder / f"{x}.jsonl").write_text("".join(json.dumps({
            "goal": f"q {x} {i} " + "w" * rng.randint(1, 9), "sol1": "s" * rng.randint(1, 12),
            "sol2": "t" * rng.randint(1, 12), "label": rng.randint(0, 1)}) + "\n" for i in range(n)))
    common = ["--tasks", "gtop", "--include-path", work / "tasks", "--model", "dummy", "-o", work / "runs", "-q"]
    _cli(*common, "--run-id", "a", "--eee-version", "0.3.0")
    _cli(*common, "--run-id", "b", "--model-args", "seed=7")
    return work / "runs" / "a", work / "runs" / "b"


def _summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def _keys(html: str) -> dict[str, str]:
    return dict(re.findall(r'data-key="([^"]+)" data-value="([^"]*)"', html))


# ---------------------------------------------------------------- report.html

def test_the_report_shows_each_groups_rows_as_summary_json_has_them(runs):
    a, _ = runs
    html = (a / "report.html").read_text()  # the writer's page at the end of the run
    groups = _summary(a)["groups"]
    assert list(groups) == ["gtop", "gfirst"]
    keys = _keys(html)
    for name, group in groups.items():
        for metric, entry in group["metrics"].items():
            for field in ("value", "stderr", "n", "tasks"):
                assert keys[f"0/group/{name}/{metric}/{field}"] == str(entry[field]), (name, metric, field)
        section = html[html.index(f'id="group-0-{name}"'):]
        section = section[:section.index("</details>")]
        assert re.findall(r'data-member="([^"]+)"', section) == group["tasks"]
    assert groups["gfirst"]["alias"] == "first two" and "first two" in html
    assert html.index('id="groups-0"') < html.index('id="task-0-gt_a"')  # the groups come before their tasks


def test_a_report_of_two_runs_puts_their_groups_side_by_side(runs, tmp_path):
    a, b = runs
    _cli("report", a, b, "-o", tmp_path / "both.html")
    html = (tmp_path / "both.html").read_text()
    assert "Groups by run" in html
    keys = _keys(html)
    for i, run in enumerate(runs):
        for name, group in _summary(run)["groups"].items():
            for metric, entry in group["metrics"].items():
                assert keys[f"{i}/group/{name}/{metric}/value"] == str(entry["value"])
    assert 'id="groups-1"' in html


def test_a_run_without_groups_shows_no_groups_section(runs, tmp_path):
    a, _ = runs
    copy = tmp_path / "nogroups"
    shutil.copytree(a, copy)
    summary = _summary(copy)
    del summary["groups"]
    (copy / "summary.json").write_text(json.dumps(summary))
    _cli("report", copy, "-o", tmp_path / "r.html")
    html = (tmp_path / "r.html").read_text()
    assert 'id="groups-0"' not in html and "/group/" not in html


# ---------------------------------------------------------------- compare

def _rows(run: Path, task: str) -> dict[str, dict]:
    out = {}
    for line in (run / "samples" / f"{task}.jsonl").read_text().splitlines():
        rec = json.loads(line)
        out[rec["id"]] = rec["eval_result"]
    return out


def _natural(sid: str):
    return int(sid.rsplit("-", 1)[1])


def _plain_stratified_ci(diffs: dict[str, dict[str, list[float]]], resamples: int, seed: int) -> dict:
    """The documented group bootstrap written out plainly: one random.Random(seed); per resample,
    task after task (gt_a, gt_b, gt_c), n indices int(random() * n); each group's statistic from
    the same draws; 2.5/97.5 percentiles (numpy's linear interpolation)."""
    rng = random.Random(seed)
    stats_ = {"gtop/acc": [], "gtop/acc_norm": [], "gfirst/acc": []}
    for _ in range(resamples):
        mean = {}
        for t in TASKS:
            n = len(diffs[t]["acc"])
            idx = [int(rng.random() * n) for _ in range(n)]
            mean[t] = {m: sum(diffs[t][m][i] for i in idx) for m in ("acc", "acc_norm")}
        sizes = {t: len(diffs[t]["acc"]) for t in TASKS}
        stats_["gtop/acc"].append(sum(mean[t]["acc"] for t in TASKS) / sum(sizes.values()))
        stats_["gtop/acc_norm"].append(sum(mean[t]["acc_norm"] / sizes[t] for t in TASKS) / 3)
        stats_["gfirst/acc"].append((mean["gt_a"]["acc"] + mean["gt_b"]["acc"]) / (sizes["gt_a"] + sizes["gt_b"]))
    out = {}
    for key, values in stats_.items():
        values.sort()
        out[key] = [stats.quantile(values, 0.025), stats.quantile(values, 0.975)]
    return out


def test_compare_gives_the_groups_values_and_their_paired_difference(runs):
    a, b = runs
    out = CliRunner().invoke(cli, ["compare", str(a), str(b), "--json", "--samples", "200"])
    assert out.exit_code == 0, out.output
    result = json.loads(out.stdout)
    assert list(result["groups"]) == ["gtop", "gfirst"]
    sa, sb = _summary(a)["groups"], _summary(b)["groups"]
    diffs, pooled = {}, {"up": 0, "down": 0}
    rows_a, rows_b = {t: _rows(a, t) for t in TASKS}, {t: _rows(b, t) for t in TASKS}
    for t in TASKS:
        ids = sorted(rows_a[t], key=_natural)
        diffs[t] = {m: [rows_b[t][i]["metrics"][m]["value"] - rows_a[t][i]["metrics"][m]["value"] for i in ids]
                    for m in ("acc", "acc_norm")}
        pooled["up"] += sum(1 for d in diffs[t]["acc"] if d == 1)
        pooled["down"] += sum(1 for d in diffs[t]["acc"] if d == -1)
    cis = _plain_stratified_ci(diffs, 200, 1234)
    for name, group in result["groups"].items():
        for metric, m in group["metrics"].items():
            va, vb = sa[name]["metrics"][metric]["value"], sb[name]["metrics"][metric]["value"]
            assert (m["mean_a"], m["mean_b"], m["diff"]) == (va, vb, vb - va)  # summary.json's, not recomputed
            p = m["paired"]
            assert m["unpaired"] is None and p["n"] == sa[name]["metrics"][metric]["n"]
            assert p["mean_a"] == pytest.approx(va, abs=1e-12) and p["mean_b"] == pytest.approx(vb, abs=1e-12)
            assert p["ci"] == pytest.approx(cis[f"{name}/{metric}"], abs=1e-12)
    top = result["groups"]["gtop"]["metrics"]
    mcnemar = top["acc"]["paired"]["mcnemar"]
    assert (mcnemar["c"], mcnemar["b"]) == (pooled["up"], pooled["down"])
    assert top["acc_norm"]["weight_by_size"] is False and top["acc_norm"]["paired"]["mcnemar"] is None


def test_compare_without_all_of_a_groups_tasks_gives_only_the_difference_and_says_why(runs):
    a, b = runs
    out = CliRunner().invoke(cli, ["compare", str(a), str(b), "--task", "gt_a", "--task", "gt_b", "--json"])
    result = json.loads(out.stdout)
    top, first = result["groups"]["gtop"]["metrics"]["acc"], result["groups"]["gfirst"]["metrics"]["acc"]
    assert top["paired"] is None and "gt_c" in top["unpaired"] and top["diff"] is not None
    assert first["paired"] is not None and first["paired"]["ci"] is not None
    text = CliRunner().invoke(cli, ["compare", str(a), str(b), "--task", "gt_a", "--task", "gt_b"]).output
    assert "gtop acc: no paired interval, 1 of its 3 tasks not compared (gt_c)" in text


def test_compare_over_fewer_paired_rows_says_so_on_the_console_and_the_page(runs, tmp_path):
    a, b = runs
    b2 = tmp_path / "b2"
    shutil.copytree(b, b2)
    lines = (b2 / "samples" / "gt_b.jsonl").read_text().splitlines()
    rec = json.loads(lines[0])
    rec["eval_result"] = {"error": {"stage": "model", "message": "boom"}}
    (b2 / "samples" / "gt_b.jsonl").write_text("\n".join([json.dumps(rec)] + lines[1:]) + "\n")
    html = tmp_path / "cmp.html"
    text = _cli("compare", a, b2, "--html", html)
    header = next(line for line in text.splitlines() if line.strip().startswith("group "))
    assert header.split()[:5] == ["group", "metric", "weighting", "tasks", "n"]
    assert re.search(r"^  gtop +acc +size +3 +24 ", text, re.M)
    assert re.search(r"^    - first two +acc +size +2 +19 ", text, re.M)
    assert "gtop acc: the interval is over the 23 paired rows (n A 24, B 24)" in text
    page = html.read_text()
    assert 'id="groups"' in page and "the interval is over the 23 paired rows" in page
    assert page.index('id="groups"') < page.index('id="task-gt_a"')  # the groups first, as in the report
    assert page.count('class="group-row"') == 3 and 'data-group="gfirst"' in page


# ---------------------------------------------------------------- the EEE aggregate

def test_the_eee_aggregate_has_a_result_per_group_and_metric(runs):
    a, _ = runs
    record = json.loads((a / "eee_aggregate.json").read_text())
    groups = _summary(a)["groups"]
    by_id = {r["evaluation_result_id"]: r for r in record["evaluation_results"]}
    for name, group in groups.items():
        for metric, entry in group["metrics"].items():
            res = by_id[f"{name}:{metric}"]
            details = res["score_details"]
            assert details["score"] == entry["value"]
            assert details["uncertainty"]["standard_error"]["value"] == entry["stderr"]
            assert details["uncertainty"]["num_samples"] == entry["n"]
            extra = res["metric_config"]["additional_details"]
            assert extra["level"] == "group" and json.loads(extra["tasks"]) == group["tasks"]
            assert json.loads(extra["weight_by_size"]) == entry["weight_by_size"]
            assert res["metric_config"]["min_score"] == 0.0 and res["metric_config"]["max_score"] == 1.0
    assert json.loads(by_id["gt_a:acc"]["metric_config"]["additional_details"]["in_groups"]) == ["gtop", "gfirst"]
    assert json.loads(by_id["gt_c:acc"]["metric_config"]["additional_details"]["in_groups"]) == ["gtop"]
    ids = [r["evaluation_result_id"] for r in record["evaluation_results"]]
    assert ids[-3:] == ["gtop:acc", "gtop:acc_norm", "gfirst:acc"]


def test_the_eee_aggregate_with_groups_validates_against_the_shipped_schema(runs):
    jsonschema = pytest.importorskip("jsonschema")
    shipped = (Path(__file__).resolve().parents[3] / "shared" / "data" / "every_eval_ever" / "schemas"
               / "v0.3.0_HEAD_9bce413" / "eval.schema.json")
    if not shipped.is_file():
        pytest.skip(f"needs EEE's 0.3.0 schema at {shipped}")
    schema = json.loads(shipped.read_text())
    record = json.loads((runs[0] / "eee_aggregate.json").read_text())
    errors = [e.message for e in jsonschema.validators.validator_for(schema)(schema).iter_errors(record)]
    assert errors == []
    assert _cli("validate", runs[0] / "eee_aggregate.json", "--schema", "aggregate_0.3.0").count("1 valid") == 1
