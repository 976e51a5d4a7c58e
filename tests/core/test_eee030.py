"""--eee-version 0.3.0: the instance records and the aggregate record validate against Every Eval
Ever's 0.3.0 schemas as shipped in ../shared/data/every_eval_ever (which `validate` reads too;
gage-eval ships no copy); the aggregate's numbers are summary.json's; each instance links
to the result it counts in; 0.2.0 stays the default; a resume switches instances/ between them."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gage_plugins_builtin.eee.v030 import AGGREGATE_FILE, result_id
from gage_eval.api.schemas import EEE_SCHEMA_FILES, eee_schema_path, validation_errors

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "golden"))

import golden  # noqa: E402

EEE = golden.SHARED_DATA / "every_eval_ever"
SHIPPED = EEE / "schemas" / "v0.3.0_HEAD_9bce413"
OURS = {"instance_0.3.0": "instance_level_eval.schema.json", "aggregate_0.3.0": "eval.schema.json"}


def _strict(text: str):
    """EEE's reader: no NaN or Infinity constants, no duplicate keys."""
    def pairs(items):
        keys = [k for k, _ in items]
        assert len(keys) == len(set(keys)), f"duplicate keys in {keys}"
        return dict(items)

    def refuse(name):
        raise AssertionError(f"non-strict JSON constant {name}")

    return json.loads(text, object_pairs_hook=pairs, parse_constant=refuse)


@pytest.fixture(scope="module")
def shipped():
    """Validators of the 0.3.0 schemas as EEE ships them (../shared)."""
    if not SHIPPED.is_dir():
        pytest.skip(f"needs EEE's 0.3.0 schemas at {SHIPPED} (../shared/data beside the checkout)")
    import jsonschema

    out = {}
    for name, file in OURS.items():
        schema = json.loads((SHIPPED / file).read_text(encoding="utf-8"))
        cls = jsonschema.validators.validator_for(schema)
        cls.check_schema(schema)
        out[name] = cls(schema)
    return out


def _check(record: dict, name: str, shipped) -> None:
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in shipped[name].iter_errors(record)]
    assert errors == [], errors
    assert validation_errors(record, name) == []


def _run(run_cli, tmp_path: Path, *args) -> Path:
    result = run_cli(*args, "-o", tmp_path / "runs", "--run-id", "r", "-q")
    assert result.exit_code in (0, 1), result.output
    return tmp_path / "runs" / "r"


def _instances(run_dir: Path, task: str) -> list[dict]:
    text = (run_dir / "instances" / f"{task}.jsonl").read_text(encoding="utf-8")
    return [_strict(line) for line in text.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def judged_run(tmp_path_factory, shipped):
    """piqa (20 rows) and legal_eval_v1 (the golden slice: mcq, reference_qa and rubric_qa rows,
    the dummy judge) with --eee-version 0.3.0."""
    from click.testing import CliRunner

    from gage_eval.cli import cli

    work = tmp_path_factory.mktemp("eee030")
    lines = {json.loads(line)["id"]: line for line in
             (golden.SHARED_DATA / golden.LEGAL).read_text(encoding="utf-8").splitlines()}
    legal = work / "legal.jsonl"
    legal.write_text("".join(lines[i] + "\n" for i in golden.LEGAL_IDS), encoding="utf-8")
    args = ["--tasks", "piqa,legal_eval_v1", "--model", "dummy", "--judge-model", "dummy",
            "--judge-args", golden.JUDGE_ARGS, "--limit", "20", "--data", f"piqa={golden.SHARED_DATA / golden.PIQA}",
            "--data", f"legal_eval_v1={legal}", "--eee-version", "0.3.0", "-o", str(work), "--run-id", "r", "-q"]
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return work / "r"


def test_the_schemas_are_read_from_shared_data_or_the_environment(shipped, tmp_path, run_cli, monkeypatch):
    """EEE's schema files are not part of gage-eval: validate reads them from ../shared/data
    beside the checkout, or from $GAGE_EVAL_EEE_SCHEMAS; without them it says how to give them."""
    for name, file in OURS.items():
        assert EEE_SCHEMA_FILES[name] == file and eee_schema_path(name) == SHIPPED / file
    row = tmp_path / "row.json"
    row.write_text("{}")
    monkeypatch.setenv("GAGE_EVAL_EEE_SCHEMAS", str(tmp_path / "none"))
    result = run_cli("validate", row, "--schema", "aggregate_0.3.0")
    assert result.exit_code == 2 and "GAGE_EVAL_EEE_SCHEMAS" in result.output and "Traceback" not in result.output
    monkeypatch.setenv("GAGE_EVAL_EEE_SCHEMAS", str(SHIPPED))
    assert eee_schema_path("instance_0.3.0") == SHIPPED / OURS["instance_0.3.0"]


def test_every_record_validates(judged_run, shipped):
    aggregate = _strict((judged_run / AGGREGATE_FILE).read_text(encoding="utf-8"))
    _check(aggregate, "aggregate_0.3.0", shipped)
    assert aggregate["schema_version"] == "0.3.0"
    for task in ("piqa", "legal_eval_v1"):
        records = _instances(judged_run, task)
        assert records
        for record in records:
            _check(record, "instance_0.3.0", shipped)
            # EEE's cross-file rules (RULES.md): the same evaluation_id, model and schema version
            assert record["evaluation_id"] == aggregate["evaluation_id"] == "r"
            assert record["model_id"] == aggregate["model_info"]["id"]
            assert record["schema_version"] == aggregate["schema_version"]


def test_aggregate_numbers_are_the_summarys(judged_run):
    summary = json.loads((judged_run / "summary.json").read_text(encoding="utf-8"))
    aggregate = json.loads((judged_run / AGGREGATE_FILE).read_text(encoding="utf-8"))
    results = {r["evaluation_result_id"]: r for r in aggregate["evaluation_results"]}
    expected = []
    for task, entry in summary["tasks"].items():
        for metric, stats in entry["metrics"].items():
            expected.append((result_id(task, metric), task, stats, metric))
        for key, by_value in entry["slices"].items():
            for value, metrics in by_value.items():
                for metric, stats in metrics.items():
                    expected.append((result_id(task, metric, (key, value)), f"{task}/{key}={value}", stats, metric))
    assert len(results) == len(aggregate["evaluation_results"]) == len(expected)
    for rid, name, stats, metric in expected:
        got = results[rid]
        assert got["evaluation_name"] == name
        assert got["metric_config"]["metric_name"] == metric
        details = got["score_details"]
        assert details["score"] == stats["value"]
        assert details["uncertainty"]["num_samples"] == stats["n"]
        if stats["stderr"] is None:
            assert "standard_error" not in details["uncertainty"]
        else:
            assert details["uncertainty"]["standard_error"]["value"] == stats["stderr"]
        normal = (stats.get("ci95") or {}).get("normal")
        if normal is not None:  # summary.json's normal 95% interval; the bootstrap one in details
            ci = details["uncertainty"]["confidence_interval"]
            assert [ci["lower"], ci["upper"], ci["confidence_level"]] == [*normal, 0.95]
        config = got["metric_config"]
        if config.get("metric_unit") == "proportion":  # the bounds contain the score (EEE's semantic check)
            assert 0.0 <= details["score"] <= 1.0
    primary = summary["tasks"]["legal_eval_v1"]["metrics"]["score"]
    assert primary["higher_is_better"] is True and results["legal_eval_v1:score"]["metric_config"]["lower_is_better"] is False
    assert aggregate["eval_library"]["name"] == "gage-eval"
    assert aggregate["eval_library"]["version"] == summary["run"]["versions"]["gage_eval"]


def test_instances_link_to_the_result_they_count_in(judged_run):
    summary = json.loads((judged_run / "summary.json").read_text(encoding="utf-8"))
    for task, entry in summary["tasks"].items():
        records = _instances(judged_run, task)
        samples = {json.loads(line)["id"] for line in
                   (judged_run / "samples" / f"{task}.jsonl").read_text(encoding="utf-8").splitlines()}
        assert {r["sample_id"] for r in records} == samples
        for metric, stats in entry["metrics"].items():
            linked = [r["evaluation"]["score"] for r in records if r.get("evaluation_result_id") == result_id(task, metric)]
            assert len(linked) == stats["n"], (task, metric)
            assert sum(linked) / len(linked) == pytest.approx(stats["value"], rel=1e-12, abs=1e-12)
        # the primary metric's record comes first for each sample
        first = {}
        for r in records:
            first.setdefault(r["sample_id"], r)
        assert all(r["evaluation_result_id"] == result_id(task, entry["primary_metric"]) for r in first.values())


def test_judged_metrics_name_the_judge_and_its_prompt(judged_run):
    aggregate = json.loads((judged_run / AGGREGATE_FILE).read_text(encoding="utf-8"))
    results = {r["evaluation_result_id"]: r for r in aggregate["evaluation_results"]}
    scoring = results["legal_eval_v1:judge_score"]["metric_config"]["llm_scoring"]
    assert scoring["judges"][0]["model_info"]["id"] == "gage-eval/dummy"
    folder = golden.ROOT / "tasks" / "legal_eval_v1"
    for template in ("judge_reference.jinja", "judge_rubric.jinja"):
        assert (folder / template).read_text(encoding="utf-8") in scoring["input_prompt"]
    assert "llm_scoring" not in results["legal_eval_v1:choice_set_match"]["metric_config"]
    assert "llm_scoring" not in results["piqa:acc"]["metric_config"]
    rubric = [r for r in _instances(judged_run, "legal_eval_v1") if r["sample_id"].startswith("prbench:")]
    assert rubric and all(r["answer_attribution"][-1]["extraction_method"] == "llm_judge" for r in rubric)


def test_errored_rows_link_to_no_result(tmp_path, run_cli, shipped):
    run_dir = _run(run_cli, tmp_path, "--tasks", "piqa", "--model", "dummy", "--model-args", "fail_every=3",
                   "--limit", "9", "--data", f"piqa={golden.SHARED_DATA / golden.PIQA}", "--eee-version", "0.3.0")
    summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    records = _instances(run_dir, "piqa")
    errored = [r for r in records if r.get("error")]
    assert len(errored) == summary["tasks"]["piqa"]["counts"]["errored"] == 3
    assert all("evaluation_result_id" not in r and r["error"].startswith("inference:") for r in errored)
    for metric, stats in summary["tasks"]["piqa"]["metrics"].items():
        assert sum(r.get("evaluation_result_id") == f"piqa:{metric}" for r in records) == stats["n"] == 6
    for record in records:
        _check(record, "instance_0.3.0", shipped)
    _check(json.loads((run_dir / AGGREGATE_FILE).read_text(encoding="utf-8")), "aggregate_0.3.0", shipped)


def test_0_2_0_stays_the_default(tmp_path, run_cli):
    run_dir = _run(run_cli, tmp_path, "--tasks", "piqa", "--model", "dummy", "--limit", "3")
    records = _instances(run_dir, "piqa")
    assert len(records) == 3
    assert all(r["schema_version"] == "instance_level_eval_0.2.0" and validation_errors(r, "instance") == []
               for r in records)
    assert not (run_dir / AGGREGATE_FILE).exists()


def test_resume_rebuilds_instances_in_the_version_it_names(tmp_path, run_cli, shipped):
    run_dir = _run(run_cli, tmp_path, "--tasks", "piqa", "--model", "dummy", "--limit", "4",
                   "--data", f"piqa={golden.SHARED_DATA / golden.PIQA}")
    assert {r["schema_version"] for r in _instances(run_dir, "piqa")} == {"instance_level_eval_0.2.0"}
    result = run_cli("--resume", run_dir, "--eee-version", "0.3.0", "-q")
    assert result.exit_code == 0, result.output
    records = _instances(run_dir, "piqa")
    assert len(records) == 8 and {r["schema_version"] for r in records} == {"0.3.0"}  # acc and acc_norm
    for record in records:
        _check(record, "instance_0.3.0", shipped)
    _check(json.loads((run_dir / AGGREGATE_FILE).read_text(encoding="utf-8")), "aggregate_0.3.0", shipped)
    assert json.loads((run_dir / "config.json").read_text())["eee_version"] == "0.3.0"
    result = run_cli("--resume", run_dir, "--eee-version", "0.2.0", "-q")  # and back: the aggregate goes
    assert result.exit_code == 0, result.output
    assert {r["schema_version"] for r in _instances(run_dir, "piqa")} == {"instance_level_eval_0.2.0"}
    assert not (run_dir / AGGREGATE_FILE).exists()


def test_validate_command_knows_the_0_3_0_schemas(judged_run, run_cli, shipped):
    for path, name in ((judged_run / "instances" / "legal_eval_v1.jsonl", "instance_0.3.0"),
                       (judged_run / AGGREGATE_FILE, "aggregate_0.3.0")):
        result = run_cli("validate", path, "--schema", name)
        assert result.exit_code == 0, result.output
        assert "0 invalid" in result.output
    examples = EEE / "examples"
    demo = examples / "v0.3.0_demo_f3a1c0de-4b2e-4c1a-9f6d-1b7e5a2c8d40"
    assert run_cli("validate", f"{demo}.json", "--schema", "aggregate_0.3.0").exit_code == 0
    assert run_cli("validate", f"{demo}_samples.jsonl", "--schema", "instance_0.3.0").exit_code == 0
    # a 0.2.0 record is not a 0.3.0 one (closed object, reference a string): refused, naming the field
    result = run_cli("validate", examples / "v0.2.2_t2i_geneval_sdxl_example_samples.jsonl", "--schema",
                     "instance_0.3.0")
    assert result.exit_code == 1 and "1 invalid" in result.output
