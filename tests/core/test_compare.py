"""gage-eval compare (the builtin plugin's gage_plugins_builtin/compare/): paired statistics checked by hand and by an
independent bootstrap loop, alignment refusals and warnings, the JSON and HTML outputs, and
real dummy runs of piqa."""
from __future__ import annotations

import json
import math
import random
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest
from click.testing import CliRunner

from gage_plugins_builtin.compare.command import compare_command
from gage_eval.api import stats
from gage_plugins_builtin.compare.paired import mcnemar_exact_p

ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------- synthetic run folders

def write_run(folder: Path, task: str, rows: dict[str, dict | None], *, metrics=("acc",), run_id="r",
              model_args=None, versions=None, primary=None, data_sha="d" * 64, extra_run=None) -> Path:
    """A run folder written by hand: samples/<task>.jsonl, summary.json, config.json, inputs.json.
    ``rows``: sample id -> {metric: value} (None: an errored row)."""
    (folder / "samples").mkdir(parents=True)
    with (folder / "samples" / f"{task}.jsonl").open("w") as fh:
        for sid, values in rows.items():
            if values is None:
                result = {"error": {"stage": "model", "message": "boom"}}
            else:
                p = values[primary or metrics[0]]
                result = {"metrics": {m: {"value": v} for m, v in values.items()},
                          "overall": {"score": p, "metric": primary or metrics[0], "passed": p >= 1.0}}
            fh.write(json.dumps({"schema_version": "v1", "id": sid, "eval_result": result}) + "\n")
    settings = {"tasks": [task], "model": "dummy", "model_args": model_args or {}, "seed": 1234,
                "limit": None, "output_dir": str(folder.parent), "run_id": run_id}
    run = {"id": run_id, "versions": versions or {"gage_eval": "0.1.0", "python": "3.11.7",
                                                   "plugins": {"builtin": "0.1.0"}},
           "model": {"name": "dummy", "model_id": "gage-eval/dummy", "args": model_args or {}},
           "judge": None, "settings": settings, **(extra_run or {})}
    summary = {"run": run, "tasks": {task: {
        "task": task, "status": "ok", "primary_metric": primary or metrics[0],
        "metrics": {m: {"value": None, "stderr": None, "n": len(rows)} for m in metrics}}}}
    (folder / "summary.json").write_text(json.dumps(summary))
    (folder / "config.json").write_text(json.dumps(settings))
    (folder / "inputs.json").write_text(json.dumps({task: {
        "task_folder": {"path": f"/tasks/{task}", "sha256": "f" * 64},
        "data": {f"/tasks/{task}/rows.jsonl": data_sha}}}))
    return folder


def invoke(*args):
    return CliRunner().invoke(compare_command, [str(a) for a in args])


def compare_json(a: Path, b: Path, *extra) -> dict:
    result = invoke(a, b, "--json", *extra)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def independent_bootstrap(diffs: list[float], resamples: int, seed: int) -> tuple[float, float]:
    """The documented algorithm written out plainly: resample indices int(random() * n), take the
    mean difference, the 2.5/97.5 percentiles with linear interpolation."""
    rng = random.Random(seed)
    n = len(diffs)
    means = []
    for _ in range(resamples):
        total = 0.0
        for _ in range(n):
            total += diffs[int(rng.random() * n)]
        means.append(total / n)
    means.sort()

    def q(p):
        pos = p * (len(means) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(means) - 1)
        return means[lo] + (means[hi] - means[lo]) * (pos - lo)

    return q(0.025), q(0.975)


# 30 samples s0..s29. A: acc 1 on s0..s14. B: s0 dropped to 0 (1->0), s15..s19 rose to 1 (0->1).
IDS = [f"s{i}" for i in range(30)]
A_ACC = {sid: (1.0 if i < 15 else 0.0) for i, sid in enumerate(IDS)}
B_ACC = {sid: (1.0 if (1 <= i < 20) else 0.0) for i, sid in enumerate(IDS)}
SCORE_A = {sid: i / 29 for i, sid in enumerate(IDS)}  # a non-binary metric
SCORE_B = {sid: (i / 29) ** 2 for i, sid in enumerate(IDS)}


@pytest.fixture
def flipped_pair(tmp_path):
    a = write_run(tmp_path / "a", "toy", {s: {"acc": A_ACC[s], "score": SCORE_A[s]} for s in IDS},
                  metrics=("acc", "score"), run_id="a")
    b = write_run(tmp_path / "b", "toy", {s: {"acc": B_ACC[s], "score": SCORE_B[s]} for s in IDS},
                  metrics=("acc", "score"), run_id="b", model_args={"temperature": 0.5})
    return a, b


# ---------------------------------------------------------------- statistics

def test_mcnemar_hand_computed():
    # b=1, c=5: n=6, sum_{k<=1} C(6,k) = 1+6 = 7 -> p = 2*7/64 = 0.21875
    assert mcnemar_exact_p(1, 5) == 0.21875
    assert mcnemar_exact_p(5, 1) == 0.21875
    # b=0, c=4: 2*C(4,0)/16 = 2/16 = 0.125
    assert mcnemar_exact_p(0, 4) == 0.125
    # b=2, c=10: n=12, 1+12+66 = 79 -> 2*79/4096 = 0.03857421875
    assert mcnemar_exact_p(2, 10) == 0.03857421875
    # b=3, c=3: n=6, 1+6+15+20 = 42 -> 2*42/64 = 1.3125 -> capped at 1
    assert mcnemar_exact_p(3, 3) == 1.0
    # no discordant pair: p = 1
    assert mcnemar_exact_p(0, 0) == 1.0
    # the recurrence equals the textbook sum of math.comb terms
    for b, c in [(7, 19), (120, 150), (333, 300), (0, 45)]:
        n = b + c
        assert mcnemar_exact_p(b, c) == min(1.0, 2 * sum(math.comb(n, k) for k in range(min(b, c) + 1)) / 2 ** n)
    # large n stays finite and tiny: b=0, c=2000 -> 2/2^2000 underflows to 0
    assert mcnemar_exact_p(0, 2000) == 0.0
    assert 0 < mcnemar_exact_p(400, 600) < 1e-9


def test_percentile_interpolates():
    values = [0.0, 1.0, 2.0, 3.0, 4.0]
    assert stats.quantile(values, 0.0) == 0.0
    assert stats.quantile(values, 0.5) == 2.0
    assert stats.quantile(values, 0.975) == pytest.approx(3.9)
    assert stats.quantile([7.0], 0.025) == 7.0


def test_known_flips_mcnemar_and_bootstrap(flipped_pair):
    a, b = flipped_pair
    out = compare_json(a, b)
    toy = out["tasks"]["toy"]
    assert toy["paired"] == 30 and toy["errored"] == {"a": 0, "b": 0, "left_out": 0}
    acc = toy["metrics"]["acc"]
    assert acc["binary"] is True
    assert acc["mean_a"] == pytest.approx(15 / 30) and acc["mean_b"] == pytest.approx(19 / 30)
    assert acc["diff"] == pytest.approx(4 / 30)
    assert acc["flips"] == {"0->1": ["s15", "s16", "s17", "s18", "s19"], "1->0": ["s0"]}
    # b (1->0) = 1, c (0->1) = 5: p = 2*(C(6,0)+C(6,1))/2^6 = 2*(1+6)/64 = 0.21875
    assert acc["mcnemar"] == {"b": 1, "c": 5, "p": 0.21875}
    # the interval equals an independent run of the documented algorithm (ids in natural order)
    diffs = [B_ACC[s] - A_ACC[s] for s in IDS]
    lo, hi = independent_bootstrap(diffs, 1000, 1234)
    assert acc["ci"] == pytest.approx([lo, hi], abs=1e-12)
    assert lo < 4 / 30 < hi
    # the non-binary metric: no McNemar, no flips, its own interval from the same resampled ids
    score = toy["metrics"]["score"]
    assert score["binary"] is False and score["mcnemar"] is None and score["flips"] is None
    sdiffs = [SCORE_B[s] - SCORE_A[s] for s in IDS]
    assert score["diff"] == pytest.approx(sum(sdiffs) / 30)
    assert score["ci"] == pytest.approx(list(independent_bootstrap(sdiffs, 1000, 1234)), abs=1e-12)
    # another seed and resample count: still the independent loop's numbers, and the seed matters
    other = compare_json(a, b, "--seed", 7, "--samples", 200)["tasks"]["toy"]["metrics"]["acc"]["ci"]
    assert other == pytest.approx(list(independent_bootstrap(diffs, 200, 7)), abs=1e-12)
    assert compare_json(a, b, "--samples", 0)["tasks"]["toy"]["metrics"]["acc"]["ci"] is None
    # the settings diff names the model argument that differs, and nothing else
    differ = {r["key"]: (r["a"], r["b"]) for r in out["settings"] if not r["same"]}
    assert differ == {"model.args.temperature": (None, 0.5)}


def test_console_table(flipped_pair):
    a, b = flipped_pair
    result = invoke(a, b)
    assert result.exit_code == 0, result.stderr
    text = result.stdout
    assert "toy: 30 sample ids in both" in text
    acc_line = next(line for line in text.splitlines() if line.strip().startswith("acc "))
    assert "0.5000" in acc_line and "0.6333" in acc_line and "+0.1333" in acc_line and "0.2188" in acc_line
    assert "acc 0->1 (5): s15, s16, s17, s18, s19" in text
    assert "acc 1->0 (1): s0" in text
    assert "model.args.temperature" in text


def test_identical_runs(tmp_path):
    rows = {s: {"acc": A_ACC[s]} for s in IDS}
    a = write_run(tmp_path / "a", "toy", rows, run_id="a")
    b = write_run(tmp_path / "b", "toy", rows, run_id="b")
    acc = compare_json(a, b)["tasks"]["toy"]["metrics"]["acc"]
    assert acc["diff"] == 0.0 and acc["ci"] == [0.0, 0.0]
    assert acc["mcnemar"] == {"b": 0, "c": 0, "p": 1.0}
    assert acc["flips"] == {"0->1": [], "1->0": []}


def test_errored_rows_counted_and_left_out(tmp_path):
    rows_a = {s: {"acc": A_ACC[s]} for s in IDS}
    rows_b = dict(rows_a)
    rows_a["s3"] = rows_a["s4"] = None  # errored in A
    rows_b["s4"] = rows_b["s20"] = rows_b["s21"] = None  # errored in B (s4 on both sides)
    rows_b["s0"] = {"acc": 0.0}  # a flip among the rows that remain
    a = write_run(tmp_path / "a", "toy", rows_a, run_id="a")
    b = write_run(tmp_path / "b", "toy", rows_b, run_id="b")
    result = invoke(a, b, "--json")
    out = json.loads(result.stdout)["tasks"]["toy"]
    assert out["errored"] == {"a": 2, "b": 3, "left_out": 4}  # s3, s4, s20, s21
    assert out["paired"] == 26
    acc = out["metrics"]["acc"]
    assert acc["n"] == 26 and acc["flips"] == {"0->1": [], "1->0": ["s0"]}
    assert acc["mcnemar"]["p"] == 1.0  # b=1, c=0: 2*C(1,0)/2 = 1
    text = invoke(a, b).stdout
    assert "errored rows: A 2, B 3 (4 common id(s) left out); 26 paired" in text


def test_overall_passed_when_primary_not_binary(tmp_path):
    a = write_run(tmp_path / "a", "toy", {s: {"score": SCORE_A[s]} for s in IDS}, metrics=("score",), run_id="a")
    b = write_run(tmp_path / "b", "toy", {s: {"score": 1.0 if s == "s3" else SCORE_A[s]} for s in IDS},
                  metrics=("score",), run_id="b")
    metrics = compare_json(a, b)["tasks"]["toy"]["metrics"]
    assert metrics["score"]["mcnemar"] is None
    # passed = score >= 1: only s29 in A; s3 and s29 in B
    assert metrics["overall.passed"]["flips"] == {"0->1": ["s3"], "1->0": []}


# ---------------------------------------------------------------- alignment and refusals

def test_disjoint_ids_refused(tmp_path):
    a = write_run(tmp_path / "a", "toy", {f"x{i}": {"acc": 1.0} for i in range(5)}, run_id="a")
    b = write_run(tmp_path / "b", "toy", {f"y{i}": {"acc": 1.0} for i in range(5)}, run_id="b")
    result = invoke(a, b)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(a) in lines[0] and str(b) in lines[0] and "'toy'" in lines[0]
    assert "Traceback" not in result.output


def test_partial_overlap_warns(tmp_path):
    a = write_run(tmp_path / "a", "toy", {s: {"acc": A_ACC[s]} for s in IDS[:20]}, run_id="a")
    b = write_run(tmp_path / "b", "toy", {s: {"acc": B_ACC[s]} for s in IDS[10:]}, run_id="b")
    result = invoke(a, b, "--json")
    assert result.exit_code == 0
    assert "warning" in result.stderr and "20 in" in result.stderr and "10 in both" in result.stderr
    out = json.loads(result.stdout)["tasks"]["toy"]
    assert out["ids"] == {"a": 20, "b": 20, "common": 10, "only_in_a": 10, "only_in_b": 10}
    assert out["metrics"]["acc"]["n"] == 10
    # s10..s14: 1 in both; s15..s19: 0 -> 1
    assert out["metrics"]["acc"]["flips"]["0->1"] == ["s15", "s16", "s17", "s18", "s19"]


def test_not_a_run_folder(tmp_path):
    a = write_run(tmp_path / "a", "toy", {"s0": {"acc": 1.0}}, run_id="a")
    empty = tmp_path / "empty"
    empty.mkdir()
    result = invoke(a, empty)
    assert result.exit_code == 2
    assert str(empty) in result.stderr and "summary.json" in result.stderr
    result = invoke(tmp_path / "missing", a)
    assert result.exit_code == 2 and str(tmp_path / "missing") in result.stderr


def test_task_selection(tmp_path):
    a = write_run(tmp_path / "a", "toy", {"s0": {"acc": 1.0}}, run_id="a")
    b = write_run(tmp_path / "b", "toy", {"s0": {"acc": 1.0}}, run_id="b")
    assert compare_json(a, b, "--task", "toy")["tasks"].keys() == {"toy"}
    result = invoke(a, b, "--task", "nope")
    assert result.exit_code == 2 and "--task nope" in result.stderr
    c = write_run(tmp_path / "c", "other", {"s0": {"acc": 1.0}}, run_id="c")
    result = invoke(a, c)
    assert result.exit_code == 2 and "no task in common" in result.stderr


def test_versions_and_reproducibility_diff(tmp_path):
    rows = {"s0": {"acc": 1.0}, "s1": {"acc": 0.0}}
    a = write_run(tmp_path / "a", "toy", rows, run_id="a")
    b = write_run(tmp_path / "b", "toy", rows, run_id="b", data_sha="e" * 64,
                  versions={"gage_eval": "0.2.0", "python": "3.11.7", "plugins": {"builtin": "0.2.0"}},
                  extra_run={"reproducibility": {"python": "3.11.7", "libraries": {"torch": "2.4.0"}}})
    differ = {r["key"]: r for r in compare_json(a, b)["settings"] if not r["same"]}
    assert differ["versions.gage_eval"]["a"] == "0.1.0" and differ["versions.gage_eval"]["b"] == "0.2.0"
    assert "versions.plugins.builtin" in differ
    assert differ["task.toy.data_sha256"]["b"] == ["e" * 64]
    # reproducibility only in B (A from before it was recorded): one row, not one per leaf
    assert differ["reproducibility"]["in_a"] is False and differ["reproducibility"]["b"] == "(recorded)"
    assert not any(key.startswith("reproducibility.") for key in differ)
    # in both: leaf by leaf, only the compared tasks' entries
    c = write_run(tmp_path / "c", "toy", rows, run_id="c", extra_run={"reproducibility": {
        "python": "3.11.7", "libraries": {"torch": "2.5.1", "vllm": "0.6.0"},
        "tasks": {"toy": {"sha256": "1" * 64, "git_commit": "abc"}, "other": {"sha256": "2" * 64}}}})
    differ = {r["key"]: r for r in compare_json(b, c)["settings"] if not r["same"]}
    assert differ["reproducibility.libraries.torch"]["a"] == "2.4.0"
    assert differ["reproducibility.libraries.torch"]["b"] == "2.5.1"
    assert differ["reproducibility.libraries.vllm"]["in_a"] is False
    assert differ["reproducibility.tasks.toy.git_commit"]["b"] == "abc"
    assert not any(key.startswith("reproducibility.tasks.other") for key in differ)


# ---------------------------------------------------------------- HTML

class _Text(HTMLParser):
    def __init__(self):
        super().__init__()
        self.text, self.tags, self.urls = [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.urls += [v for k, v in attrs if k in ("src", "href") and v]

    def handle_data(self, data):
        self.text.append(data)


def test_html_page(flipped_pair, tmp_path):
    a, b = flipped_pair
    page = tmp_path / "cmp.html"
    result = invoke(a, b, "--html", page)
    assert result.exit_code == 0, result.stderr
    html = page.read_text()
    parser = _Text()
    parser.feed(html)
    parser.close()
    text = " ".join(parser.text)
    assert html.count('<table class="metrics">') == 1 and html.count('<table class="settings') == 1
    assert "style" in parser.tags and ".sbs {" in html  # the report's stylesheet
    # every flipped id opens both runs' record side by side: s0 went 1->0, s15..s19 0->1
    flips = re.findall(r'<details class="flip" data-id="([^"]+)">(.*?)</details>', html, re.S)
    assert sorted(sid for sid, _ in flips) == sorted(["s0", "s15", "s16", "s17", "s18", "s19"])
    for sid, body in flips:
        assert body.count('<div class="side side-a">') == 1 and body.count('<div class="side side-b">') == 1
        want = ("A 1 → B 0" if sid == "s0" else "A 0 → B 1")
        assert want in body, (sid, body[:300])
        a_side, b_side = body.split('<div class="side side-b">')
        assert re.search(r"<td>acc</td><td class=\"num\">" + ("1.0000" if sid == "s0" else "0.0000"), a_side)
        assert re.search(r"<td>acc</td><td class=\"num\">" + ("0.0000" if sid == "s0" else "1.0000"), b_side)
    assert parser.urls == [] and "script" not in parser.tags  # self-contained: nothing to fetch
    result = invoke(a, b, "--html", tmp_path / "no" / "such" / "cmp.html")  # (its folder made, as report's -o)
    assert result.exit_code == 0 and (tmp_path / "no" / "such" / "cmp.html").is_file()
    for figure in ("0.5000", "0.6333", "+0.1333", "0.2188", "s15, s16, s17, s18, s19", "model.args.temperature"):
        assert figure in text, figure


# ---------------------------------------------------------------- real dummy runs of piqa

def test_real_dummy_runs_identical(run_cli, tmp_path):
    for run_id in ("a", "b"):
        assert run_cli("--tasks", "piqa", "--model", "dummy", "--limit", 20, "-o", tmp_path,
                       "--run-id", run_id, "-q").exit_code == 0
    out = compare_json(tmp_path / "a", tmp_path / "b")
    piqa = out["tasks"]["piqa"]
    assert piqa["paired"] == 20
    assert set(piqa["metrics"]) == {"acc", "acc_norm"}
    for m in piqa["metrics"].values():
        assert m["diff"] == 0.0 and m["ci"] == [0.0, 0.0] and m["mcnemar"]["p"] == 1.0
        assert m["flips"] == {"0->1": [], "1->0": []}
    assert [r["key"] for r in out["settings"] if not r["same"]] == []
    keys = {r["key"] for r in out["settings"]}
    assert {"model.name", "model.model_id", "task.piqa.folder_sha256", "task.piqa.data_sha256",
            "versions.gage_eval", "versions.plugins.builtin"} <= keys
    # the summary's means are the compared means
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert piqa["metrics"]["acc"]["mean_a"] == pytest.approx(summary["tasks"]["piqa"]["metrics"]["acc"]["value"])


def test_real_dummy_runs_metric_set_differs(run_cli, tmp_path):
    tasks = tmp_path / "tasks"
    shutil.copytree(ROOT / "tasks" / "piqa", tasks / "piqa")
    task_yaml = tasks / "piqa" / "task.yaml"
    text = task_yaml.read_text()
    assert "  - acc_norm\n" in text
    task_yaml.write_text(text.replace("  - acc_norm\n", ""))
    assert run_cli("--tasks", "piqa", "--model", "dummy", "--limit", 20, "-o", tmp_path,
                   "--run-id", "a", "-q").exit_code == 0
    assert run_cli("--tasks", "piqa", "--model", "dummy", "--model-args", "seed=7", "--limit", 20,
                   "--include-path", tasks, "-o", tmp_path, "--run-id", "b", "-q").exit_code == 0
    out = compare_json(tmp_path / "a", tmp_path / "b")
    piqa = out["tasks"]["piqa"]
    assert list(piqa["metrics"]) == ["acc"]
    assert piqa["metrics_only_in_a"] == ["acc_norm"] and piqa["metrics_only_in_b"] == []
    acc = piqa["metrics"]["acc"]
    flips = acc["flips"]
    assert acc["mcnemar"]["b"] == len(flips["1->0"]) and acc["mcnemar"]["c"] == len(flips["0->1"])
    assert acc["diff"] == pytest.approx((len(flips["0->1"]) - len(flips["1->0"])) / 20)
    differ = {r["key"] for r in out["settings"] if not r["same"]}
    assert {"task.piqa.folder_sha256", "model.args.seed"} <= differ
    text = CliRunner().invoke(compare_command, [str(tmp_path / "a"), str(tmp_path / "b")]).stdout
    assert "metrics only in A (not compared): acc_norm" in text


def test_repeated_id_warns_and_keeps_the_last(tmp_path):
    a = write_run(tmp_path / "a", "toy", {"s0": {"acc": 1.0}, "s1": {"acc": 0.0}}, run_id="a")
    b = write_run(tmp_path / "b", "toy", {"s0": {"acc": 1.0}, "s1": {"acc": 0.0}}, run_id="b")
    with (b / "samples" / "toy.jsonl").open("a") as fh:  # s1 again, now right
        fh.write(json.dumps({"id": "s1", "eval_result": {"metrics": {"acc": {"value": 1.0}},
                                                         "overall": {"score": 1.0, "passed": True}}}) + "\n")
    result = invoke(a, b, "--json")
    assert result.exit_code == 0 and "more than once" in result.stderr
    assert json.loads(result.stdout)["tasks"]["toy"]["metrics"]["acc"]["flips"]["0->1"] == ["s1"]


def test_docs_example_is_true(run_cli, tmp_path):
    """docs/compare.md's example output: piqa's 24 shipped rows, dummy seed 1234 vs seed 7."""
    assert run_cli("--tasks", "piqa", "--model", "dummy", "-o", tmp_path, "--run-id", "base", "-q").exit_code == 0
    assert run_cli("--tasks", "piqa", "--model", "dummy", "--model-args", "seed=7", "-o", tmp_path,
                   "--run-id", "seed7", "-q").exit_code == 0
    result = invoke(tmp_path / "base", tmp_path / "seed7")
    assert result.exit_code == 0, result.stderr
    doc = (ROOT / "docs" / "compare.md").read_text()
    shown = result.stdout.splitlines()[2:]  # the lines after the two run paths
    assert len(shown) > 10
    for line in shown:
        if line.startswith("settings: "):  # "2 differ, N the same": N counts this machine's library versions
            assert line.startswith("settings: 2 differ, ") and "settings: 2 differ, " in doc
            continue
        assert line in doc, line
