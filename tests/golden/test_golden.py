"""The written outputs of piqa, MMMU, DocVQA and legal_eval_v1 on slices of the shared data with the
dummy backend (and dummy judge) equal, after parsing, the stored ones in tests/golden/expected/.
An intended change is regenerated with `python tests/golden/make_golden.py` (see README.md)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import golden  # noqa: E402

REGENERATE = "if the change is intended: python tests/golden/make_golden.py, and say why in the commit message"


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    if not golden.SHARED_DATA.is_dir():
        pytest.skip(f"needs the shared data at {golden.SHARED_DATA} (../shared/data beside the checkout)")
    pytest.importorskip("pyarrow", reason="the MMMU slice is written as parquet")
    work = tmp_path_factory.mktemp("golden")
    return golden.collect(golden.run(golden.SHARED_DATA, work), golden.SHARED_DATA, work)


def _compare(task: str, kind: str, expected: list, got: list) -> None:
    key = golden.ID_KEY[kind]
    want_ids, got_ids = [r.get(key) for r in expected], [r.get(key) for r in got]
    if want_ids != got_ids:
        missing = sorted(set(map(str, want_ids)) - set(map(str, got_ids)))
        extra = sorted(set(map(str, got_ids)) - set(map(str, want_ids)))
        pytest.fail(f"{task} {kind}: ids differ; missing {missing[:5]}, unexpected {extra[:5]} "
                    f"({len(want_ids)} expected, {len(got_ids)} written)\n{REGENERATE}")
    for want, have in zip(expected, got):
        diff = golden.first_difference(want, have)
        if diff:
            pytest.fail(f"{task} {kind}.jsonl, record {key}={want.get(key)!r}: {diff}\n{REGENERATE}")


@pytest.mark.parametrize("task", golden.TASKS)
def test_outputs_equal_the_stored_ones(outputs, task):
    expected = golden.load_expected(task)
    for kind in golden.FILES:
        _compare(task, kind, expected[kind], outputs[task][kind])
    diff = golden.first_difference(expected["summary"], outputs[task]["summary"])
    if diff:
        pytest.fail(f"{task} summary.json tasks.{task}: {diff}\n{REGENERATE}")


def test_first_difference_names_the_field():
    a = {"id": "x", "eval_result": {"metrics": {"acc": {"value": 1.0}}}, "l": [1, 2]}
    assert golden.first_difference(a, a) is None
    b = {"id": "x", "eval_result": {"metrics": {"acc": {"value": 0.0}}}, "l": [1, 2]}
    assert golden.first_difference(a, b) == ".eval_result.metrics.acc.value: expected 1.0, got 0.0"
    assert golden.first_difference(a, dict(a, l=[1])) == ".l: expected 2 items, got 1"
    assert "unexpected new field" in golden.first_difference(a, dict(a, new=1))
    assert golden.first_difference({"v": 1}, {"v": 1.0}) is not None  # an int that became a float is a change


def test_normalise_drops_volatile_fields_and_relativises_paths():
    record = {"latency_ms": 3.2, "x": {"timings": {}, "path": "/data/shared/a.jsonl:3"}, "evaluation_id": "r"}
    assert golden.normalise(record, [("/data/shared", "<shared>")]) == {"x": {"path": "<shared>/a.jsonl:3"}}
