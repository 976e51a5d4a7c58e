"""What report.html says beyond summary.json's numbers (issue 28): intervals inside the metric's
range (bootstrap, else Wilson for a proportion, else a clipped normal), the small-n mark, errors
grouped by their masked message, counters in words, log-likelihood rows with every choice's
score, samples in the order of their rows in the data; checked on the page's data and on real
dummy runs (samples files shuffled as a concurrent run leaves them)."""
from __future__ import annotations

import json
import random
import re
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from gage_plugins_builtin.report.command import report_command
from gage_plugins_builtin.report.intervals import RowRange, interval, wilson
from gage_plugins_builtin.report.wording import ErrorGroups, describe_counters, mask

ROOT = Path(__file__).resolve().parents[2]


def embedded(path: Path) -> dict:
    m = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', path.read_text(), re.S)
    assert m, "no embedded data"
    return json.loads(m.group(1))


def rows(*values: float) -> RowRange:
    r = RowRange()
    for v in values:
        r.add(v)
    return r


# -- intervals -----------------------------------------------------------------
def test_wilson_matches_the_textbook_values():
    # p = 0.2, n = 10 (the case: value - 1.96 stderr went to -0.061): Wilson [0.0567, 0.5098]
    lo, hi = wilson(0.2, 10)
    assert lo == pytest.approx(0.05668, abs=5e-5) and hi == pytest.approx(0.50983, abs=5e-5)
    assert wilson(0.0, 3) == (0.0, pytest.approx(0.56151, abs=5e-5))
    assert wilson(1.0, 3) == (pytest.approx(0.43849, abs=5e-5), 1.0)


def test_interval_prefers_the_bootstrap_then_wilson_then_a_clipped_normal():
    boot = {"value": 0.2, "stderr": 0.133, "n": 10, "ci95": {"normal": [-0.061, 0.461], "bootstrap": [0.0, 0.5]}}
    view = interval(boot, rows(*[1.0] * 2 + [0.0] * 8))
    assert (view["lo"], view["hi"], view["how"], view["small"]) == (0.0, 0.5, "bootstrap", True)
    no_boot = {"value": 0.2, "stderr": 0.133, "n": 10}  # an older summary: no ci95
    view = interval(no_boot, rows(*[1.0] * 2 + [0.0] * 8))
    assert view["how"] == "Wilson" and 0.0 < view["lo"] < 0.2 < view["hi"] < 1.0
    # a slice where every row agrees: the bootstrap is a point; a proportion gets Wilson's interval
    point = {"value": 0.0, "stderr": 0.0, "n": 3, "ci95": {"bootstrap": [0.0, 0.0]}}
    assert interval(point, rows(0.0, 0.0, 0.0))["how"] == "Wilson"
    assert interval(point, rows(0.0, 0.0, 0.0))["hi"] == pytest.approx(0.5615, abs=1e-4)
    # a score in [0, 1] that is no proportion: value +/- 1.96 stderr, clipped to [0, 1]
    anls = {"value": 0.95, "stderr": 0.05, "n": 40}
    view = interval(anls, rows(0.9, 1.0, 0.95, 1.0))
    assert view["how"] == "normal, clipped to [0, 1]" and view["hi"] == 1.0 and view["small"] is False
    # a metric with no range (a latency): the normal interval as it is
    latency = {"value": 120.0, "stderr": 10.0, "n": 50}
    view = interval(latency, rows(100.0, 140.0))
    assert view["how"] == "normal" and view["lo"] == pytest.approx(120 - 19.6, abs=0.01)


# -- errors and counters ---------------------------------------------------------
def test_judge_errors_with_a_uuid_each_make_one_group():
    groups = ErrorGroups()
    for i in range(48):
        groups.add("judge", f"judge model: http://127.0.0.1:8000/v1: HTTP 500: request {uuid.uuid4()} failed "
                            f"after {i % 3 + 1} tries (/tmp/run-{i}/cache.db)", f"units-{i}")
    groups.add("inference", "dummy backend: injected failure", "units-99")
    out = groups.sorted(lambda sid: -int(sid.split("-")[1]))  # (a data order: the last rows first)
    assert [(g["stage"], g["count"]) for g in out] == [("judge", 48), ("inference", 1)]
    judge = out[0]
    assert judge["pattern"] == "judge model: ‹url›: HTTP ‹n›: request ‹uuid› failed after ‹n› tries (‹path›)"
    assert judge["ids"] == [f"units-{i}" for i in range(47, 27, -1)]  # the first 20 in the data's order
    assert "request " in judge["example"] and "‹" not in judge["example"]  # one message in full
    assert mask("row 12 of abcdef0123456789abcd, sha deadbeef99") == "row ‹n› of ‹hex›, sha ‹hex›"


def test_counters_in_words():
    said = {c["key"]: c["text"] for c in describe_counters(
        {"mmmu_acc.fallback": 7, "score.no_choice": 1, "acc.missing_field": 2, "my_metric.odd": 3})}
    assert said["mmmu_acc.fallback"] == "7 answers could not be parsed; a random choice was scored"
    assert said["acc.missing_field"] == "2 rows lacked a field the metric reads; each was scored 0"
    assert said["my_metric.odd"] == "3 rows counted as “odd” by the metric my_metric"  # no declared words
    # legal_eval_v1 counts judge_score under the name `score` (task.yaml `as:`): its words still found
    legal = describe_counters({"score.no_choice": 50}, str(ROOT / "tasks" / "legal_eval_v1"))
    assert legal[0]["text"] == "50 answers named no choice; each was scored 0"


# -- on real runs ---------------------------------------------------------------
def _run(run_cli, out: Path, run_id: str, *extra) -> Path:
    result = run_cli("--tasks", "piqa", "--model", "dummy", "--limit", "24", "-o", out, "--run-id", run_id, "-q",
                     *extra)
    assert result.exit_code in (0, 1), result.output
    return out / run_id


def _rewrite(path: Path, edit) -> list[dict]:
    records = [json.loads(line) for line in path.read_text().splitlines()]
    records = edit(records)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return records


def test_samples_are_listed_in_data_order_and_log_likelihood_rows_show_every_choice(run_cli, tmp_path):
    run_dir = _run(run_cli, tmp_path / "runs", "r")
    data_order = [json.loads(line)["id"] for line in (run_dir / "samples" / "piqa.jsonl").read_text().splitlines()]
    # a concurrent run writes rows as they finish: shuffle the file, the page lists them as the data has them
    _rewrite(run_dir / "samples" / "piqa.jsonl", lambda rs: random.Random(5).sample(rs, len(rs)))
    page = tmp_path / "page.html"
    res = CliRunner().invoke(report_command, [str(run_dir), "-o", str(page)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    data = embedded(page)
    assert [s["id"] for s in data["samples"]] == data_order == [f"piqa-{i}" for i in range(24)]
    assert [s["p"] for s in data["samples"]] == list(range(24))
    assert "each task's in the order of its rows in the data" in page.read_text()
    records = {r["id"]: r for r in map(json.loads, (run_dir / "samples" / "piqa.jsonl").read_text().splitlines())}
    for s in data["samples"]:
        pr = records[s["id"]]["predict_result"][0]
        assert "o" not in s  # the argmax choice is not shown as a model output
        ll = s["ll"]
        assert ll["ctx"] == pr["prompt"] and ll["gold"] == records[s["id"]]["label"]
        assert [c[0] for c in ll["ch"]] == ["A", "B"] and [c[2] for c in ll["ch"]] == pr["loglikelihoods"]
        assert [c[3] for c in ll["ch"]] == [x / len(c) for x, c in zip(pr["loglikelihoods"], pr["choices"])]
        metrics = records[s["id"]]["eval_result"]["metrics"]
        assert ll["taken"] == {"acc": metrics["acc"]["extracted"], "acc_norm": metrics["acc_norm"]["extracted"]}
        best = max(range(2), key=lambda i: pr["loglikelihoods"][i])
        assert ll["taken"]["acc"] == "AB"[best]


def test_errors_with_ids_group_into_one_and_intervals_stay_in_range(run_cli, tmp_path):
    run_dir = _run(run_cli, tmp_path / "runs", "e", "--model-args", "fail_every=2", "--max-error-rate", "1")

    def uuids(records):
        for r in records:
            err = r["eval_result"].get("error")
            if err:
                err["message"] = f"judge model: HTTP 429: request {uuid.uuid4()} was rate limited"
        return random.Random(3).sample(records, len(records))  # in the order rows finished

    errored = [r["id"] for r in _rewrite(run_dir / "samples" / "piqa.jsonl", uuids) if r["eval_result"].get("error")]
    assert len(errored) == 12
    page = tmp_path / "page.html"
    res = CliRunner().invoke(report_command, [str(run_dir), "-o", str(page)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    text = page.read_text()
    groups = re.findall(r'<tr class="error-group"><td class="num">(\d+)</td><td>(\w+)</td><td><pre>([^<]*)</pre>',
                        text)
    assert groups == [("12", "inference", "judge model: HTTP ‹n›: request ‹uuid› was rate limited")]
    shown_ids = re.search(r'<td class="small ids">([^<]*)</td>', text).group(1).split(", ")
    assert shown_ids == sorted(errored, key=lambda i: int(i.split("-")[1]))  # in data order, ids kept
    summary = json.loads((run_dir / "summary.json").read_text())
    for name, m in summary["tasks"]["piqa"]["metrics"].items():
        lo = float(re.search(rf'data-key="0/piqa/{name}/lo" data-value="([^"]+)"', text).group(1))
        hi = float(re.search(rf'data-key="0/piqa/{name}/hi" data-value="([^"]+)"', text).group(1))
        assert 0.0 <= lo <= m["value"] <= hi <= 1.0
        assert (lo, hi) == tuple(m["ci95"]["bootstrap"])
    assert 'class="smalln"' in text  # 12 scored rows: the small-n mark
