"""gage_eval.api.stats and the intervals in summary.json: the normal and bootstrap 95% intervals, the
binomial sampler behind the bootstrap, and the cluster-robust stderr (task.yaml stderr.cluster_by),
against values worked out by hand."""
from __future__ import annotations

import json
import math
import random
import shutil
from pathlib import Path

import pytest

from gage_eval.api import stats
from gage_eval.api.metric import TaskAggregate
from gage_eval.api.schemas import validation_errors

ROOT = Path(__file__).resolve().parents[2]


def test_normal_interval_is_mean_plus_minus_1_96_stderr():
    lo, hi = stats.normal_interval(0.5, 0.1)
    assert lo == pytest.approx(0.5 - 0.1959964, abs=1e-7) and hi == pytest.approx(0.5 + 0.1959964, abs=1e-7)
    assert stats.normal_interval(0.5, None) is None and stats.normal_interval(None, None) is None


def test_quantile_interpolates_linearly():
    assert stats.quantile([1.0, 2.0, 3.0, 4.0], 0.25) == 1.75  # h = 3 * 0.25 = 0.75 -> 1 + 0.75 * (2 - 1)
    assert stats.quantile([1.0, 2.0, 3.0, 4.0], 0.975) == pytest.approx(3.925)
    assert stats.quantile([7.0], 0.5) == 7.0


def test_clustered_stderr_by_hand():
    # clusters A = [1, 0], B = [1, 1, 1], C = [0]: n = 6, mean = 4/6; per-cluster deviation sums
    # A: 1 - 2 * 2/3 = -1/3, B: 3 - 3 * 2/3 = 1, C: 0 - 2/3 = -2/3; their squares sum to 14/9
    clusters = {"A": (2, 1.0), "B": (3, 3.0), "C": (1, 0.0)}
    assert stats.clustered_stderr(clusters, small_sample=False) == pytest.approx(math.sqrt(14) / 18)
    assert stats.clustered_stderr(clusters) == pytest.approx(math.sqrt(14) / 18 * math.sqrt(3 / 2))
    assert stats.clustered_stderr({"A": (3, 2.0)}) is None


def test_clusters_of_one_row_give_the_usual_stderr():
    xs = [0.2, 1.0, 0.0, 0.7, 0.4]
    mean = sum(xs) / len(xs)
    usual = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1) / len(xs))
    assert stats.clustered_stderr({i: (1, x) for i, x in enumerate(xs)}) == pytest.approx(usual)


@pytest.mark.parametrize("n,p", [(20, 0.3), (40, 0.9), (1000, 0.4), (100_000, 0.64)])
def test_binomial_draws_follow_the_binomial_distribution(n, p):
    rnd = random.Random(7)
    draws = [stats.binomial(n, p, rnd) for _ in range(50_000)]
    mean = sum(draws) / len(draws)
    var = sum((d - mean) ** 2 for d in draws) / len(draws)
    assert abs(mean - n * p) < 4 * math.sqrt(n * p * (1 - p) / len(draws))
    assert var == pytest.approx(n * p * (1 - p), rel=0.05)
    if n <= 1000:  # the whole distribution: total variation distance to the exact pmf
        freq = [0] * (n + 1)
        for d in draws:
            freq[d] += 1
        pmf = [math.comb(n, k) * p ** k * (1 - p) ** (n - k) for k in range(n + 1)]
        assert sum(abs(f / len(draws) - q) for f, q in zip(freq, pmf)) / 2 < 0.02


def test_binomial_edges():
    rnd = random.Random(0)
    assert stats.binomial(0, 0.5, rnd) == 0 and stats.binomial(9, 0.0, rnd) == 0 and stats.binomial(9, 1.0, rnd) == 9
    assert sum(stats.multinomial(50, [3, 0, 5, 2], rnd)) == 50
    assert stats.multinomial(50, [3, 0, 5, 2], rnd)[1] == 0


def test_bootstrap_by_hand():
    # two rows 0 and 1: a resample's mean is 0, 0.5 or 1 with probability 1/4, 1/2, 1/4, so with
    # 1000 resamples the 2.5% and 97.5% quantiles are 0 and 1
    assert stats.bootstrap_interval([0, 1], seed=1) == [0.0, 1.0]
    assert stats.bootstrap_interval([0.3] * 50, seed=1) == [pytest.approx(0.3), pytest.approx(0.3)]
    assert stats.bootstrap_interval([1.0], seed=1) is None


def test_bootstrap_is_seeded_and_order_free():
    xs = [1.0] * 64 + [0.0] * 36
    a = stats.bootstrap_interval(xs, seed="1234:piqa:acc")
    assert a == stats.bootstrap_interval(list(reversed(xs)), seed="1234:piqa:acc")
    assert a != stats.bootstrap_interval(xs, seed="1235:piqa:acc")
    # close to the normal interval for a binary mean of 100 rows (p = 0.64, stderr 0.048)
    assert a[0] == pytest.approx(0.64 - 0.094, abs=0.02) and a[1] == pytest.approx(0.64 + 0.094, abs=0.02)


@pytest.mark.parametrize("with_numpy", [True, False])
def test_bootstrap_past_many_distinct_values_keeps_an_array(with_numpy, monkeypatch):
    if not with_numpy:
        monkeypatch.setattr(stats, "_numpy", lambda: None)
    elif stats._numpy() is None:
        pytest.skip("numpy is not installed")
    rnd = random.Random(3)
    store = stats.ValueCounts()
    xs = [rnd.random() for _ in range(2000)]
    for x in xs:
        store.add(x)
    assert store.counts is None and len(store.values) == 2000 and store.values.typecode == "d"
    lo, hi = store.bootstrap_interval(seed=5, resamples=400)
    mean = sum(xs) / len(xs)
    se = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1) / len(xs))
    assert lo == pytest.approx(mean - 1.96 * se, abs=0.3 * se) and hi == pytest.approx(mean + 1.96 * se, abs=0.3 * se)
    assert store.bootstrap_interval(seed=5, resamples=400) == [lo, hi]


def test_task_aggregate_intervals_and_clusters():
    agg = TaskAggregate(cluster_by="sample.metadata.subject")
    rows = [("A", 1.0), ("A", 0.0), ("B", 1.0), ("B", 1.0), ("B", 1.0), ("C", 0.0)]
    for subject, x in rows:
        agg.add({"acc": x}, {"subject": subject}, {"metadata": {"subject": subject}})
    out = agg.result(seed="1234:t")
    acc = out["metrics"]["acc"]
    assert acc["stderr_clustered"] == pytest.approx(math.sqrt(21) / 18) and acc["clusters"] == 3
    assert acc["cluster_by"] == "sample.metadata.subject"
    assert acc["ci95"]["normal"] == pytest.approx([acc["value"] - stats.Z95 * acc["stderr"],
                                                   acc["value"] + stats.Z95 * acc["stderr"]])
    assert out["slices"]["subject"]["B"]["acc"]["ci95"] == {"normal": [1.0, 1.0], "bootstrap": [1.0, 1.0]}
    assert out["slices"]["subject"]["C"]["acc"]["ci95"] == {"normal": None, "bootstrap": None}  # one row
    # a row without the field is a cluster of its own
    agg.add({"acc": 1.0}, None, {"metadata": {}})
    assert agg.result()["metrics"]["acc"]["clusters"] == 4
    assert "ci95" not in agg.result()["metrics"]["acc"]  # no seed, no intervals


def test_task_schema_takes_stderr_cluster_by():
    base = {"dataset": {"loader": "jsonl", "args": {"path": "x.jsonl"}}, "request": {"kind": "generate"},
            "metrics": ["exact_match"]}
    assert validation_errors({**base, "stderr": {"cluster_by": "sample.metadata.subject"}}, "task") == []
    assert validation_errors({**base, "stderr": {"cluster_by": "model_output.text"}}, "task")
    assert validation_errors({**base, "stderr": {"cluster": "sample.id"}}, "task")


def test_run_summary_has_intervals_and_clustered_stderr(tmp_path):
    """A dummy run of piqa clustered by sample.id (clusters of one row): stderr_clustered equals the
    stderr, and the summary, with its intervals, validates against summary.schema.json."""
    from gage_eval.engine.loop import Engine, RunOptions

    folder = tmp_path / "tasks" / "piqa_clustered"
    shutil.copytree(ROOT / "tasks" / "piqa", folder)
    text = (folder / "task.yaml").read_text().replace("name: piqa\n", "name: piqa_clustered\n")
    (folder / "task.yaml").write_text(text + "stderr:\n  cluster_by: sample.id\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    Engine(RunOptions(tasks=["piqa_clustered"], model="dummy", quiet=True, include_paths=[str(folder)]),
           run_dir).run()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert validation_errors(summary, "summary") == []
    acc = summary["tasks"]["piqa_clustered"]["metrics"]["acc"]
    assert acc["clusters"] == acc["n"] and acc["stderr_clustered"] == pytest.approx(acc["stderr"])
    lo, hi = acc["ci95"]["bootstrap"]
    assert lo <= acc["value"] <= hi
    again = tmp_path / "run2"
    again.mkdir()
    Engine(RunOptions(tasks=["piqa_clustered"], model="dummy", quiet=True, include_paths=[str(folder)]),
           again).run()
    assert json.loads((again / "summary.json").read_text())["tasks"]["piqa_clustered"]["metrics"] == \
        summary["tasks"]["piqa_clustered"]["metrics"]


def test_the_mean_and_stderr_do_not_depend_on_row_order():
    """A resume, a cached rerun and a run in completion order add the same rows in other orders:
    the aggregate is the same to the last bit (a running mean is not: 0.4499999999999999 for 9/20)."""
    import random as _random

    from gage_eval.api.stats import MeanAccumulator

    rows = [1.0] * 9 + [0.0] * 11 + [0.1, 0.2, 0.7] * 5
    results = set()
    for seed in range(5):
        order = rows[:]
        _random.Random(seed).shuffle(order)
        acc = MeanAccumulator()
        for x in order:
            acc.add(x)
        r = acc.result()
        results.add((r["value"], r["stderr"]))
    assert len(results) == 1
    acc = MeanAccumulator()
    for x in [1.0] * 9 + [0.0] * 11:
        acc.add(x)
    assert acc.result()["value"] == 9 / 20 == 0.45
