"""Schemas: every example of spec 000/001 validates, the spec's invalid shapes are refused,
and the instance records in ../shared/data/every_eval_ever that claim 0.2.0 validate."""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from gage_eval.api.schemas import validation_errors

SPEC = Path(__file__).resolve().parents[3] / "shared" / "spec"


def spec_json_blocks(name: str) -> list[dict]:
    if not SPEC.is_dir():
        pytest.skip("needs ../shared/spec beside the checkout")
    text = next(SPEC.glob(f"{name}_*.txt")).read_text(encoding="utf-8")
    return [json.loads(b) for b in re.findall(r"```json\n(.*?)```", text, re.S)]


def minimal() -> dict:
    return {"schema_version": "v1", "id": "x", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            "references": ["ok"]}


@pytest.mark.parametrize("spec", ["000", "001"])
def test_spec_examples_validate(spec):
    blocks = spec_json_blocks(spec)
    full = [b for b in blocks if "schema_version" in b]
    fragments = [b for b in blocks if "schema_version" not in b]
    assert len(full) == 13
    for block in full:
        assert validation_errors(block, "sample") == [], block["id"]
    # 001 also shows predict_result / eval_result / unconditioned_input fragments
    for fragment in fragments:
        sample = {**minimal(), **fragment}
        assert validation_errors(sample, "sample") == [], fragment


INVALID = {
    "missing id": lambda s: s.pop("id"),
    "missing messages": lambda s: s.pop("messages"),
    "missing references": lambda s: s.pop("references"),
    "wrong schema_version": lambda s: s.update(schema_version="v2"),
    "content segment of unknown type": lambda s: s["messages"][0]["content"].append({"type": "pdf", "pdf": "x"}),
    "image segment without url": lambda s: s["messages"][0]["content"].append({"type": "image_url", "image_url": {}}),
    "text segment without text": lambda s: s["messages"][0]["content"].append({"type": "text"}),
    "message with unknown role": lambda s: s["messages"].append({"role": "robot", "content": "x"}),
    "option without content": lambda s: s.update(options=[{"id": "A"}]),
    "option id not a string": lambda s: s.update(options=[{"id": 1, "content": "x"}]),
    "reference without answer": lambda s: s.update(references=[{"meta": {}}]),
    "label not a string": lambda s: s.update(label=1),
    "nested few_shot_examples": lambda s: s.update(few_shot_examples=[{**minimal_shot(), "few_shot_examples": []}]),
    "few-shot with predict_result": lambda s: s.update(few_shot_examples=[{**minimal_shot(), "predict_result": []}]),
    "few-shot with sandbox": lambda s: s.update(few_shot_examples=[{**minimal_shot(), "sandbox": {}}]),
    "few-shot without references": lambda s: s.update(few_shot_examples=[{"messages": minimal()["messages"]}]),
    "sandbox env not strings": lambda s: s.update(sandbox={"env": {"A": 1}}),
    "tool without function name": lambda s: s.update(tools=[{"type": "function", "function": {}}]),
    "tool_choice unknown string": lambda s: s.update(tool_choice="sometimes"),
    "golden trajectory not a list of messages": lambda s: s.update(golden_trajectories=[{"role": "assistant"}]),
    "tool message without tool_call_id": lambda s: s["messages"].append({"role": "tool", "content": "r"}),
    "unconditioned_input a number": lambda s: s.update(unconditioned_input=3),
    "predict_result without index": lambda s: s.update(predict_result=[{"message": {"role": "assistant", "content": "x"}}]),
    "eval_result error without message": lambda s: s.update(eval_result={"error": {"stage": "x"}}),
}


def minimal_shot() -> dict:
    return {"messages": minimal()["messages"], "references": ["a"]}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_invalid_shapes_refused(case):
    sample = copy.deepcopy(minimal())
    INVALID[case](sample)
    problems = validation_errors(sample, "sample")
    assert problems, f"{case} was accepted"
    assert all(where.startswith("$") for where, _ in problems)


def test_eee_examples_claiming_0_2_0_validate(shared_data):
    files = sorted((shared_data / "every_eval_ever" / "examples").glob("*.jsonl"))
    checked = 0
    for file in files:
        for line in file.read_text().splitlines():
            row = json.loads(line)
            if row.get("schema_version") == "instance_level_eval_0.2.0":
                assert validation_errors(row, "instance") == [], file.name
                checked += 1
    assert checked == 10


def test_eee_negative_example_refused(shared_data):
    # the t2i example uses a `modality` field from an unmerged branch and an old shape
    row = json.loads((shared_data / "every_eval_ever" / "examples" /
                      "v0.2.2_t2i_geneval_sdxl_example_samples.jsonl").read_text().splitlines()[0])
    row["schema_version"] = "instance_level_eval_0.2.0"
    assert validation_errors(row, "instance")


def test_instance_single_turn_needs_output():
    row = {"schema_version": "instance_level_eval_0.2.0", "evaluation_id": "e", "model_id": "m",
           "evaluation_name": "t", "sample_id": "1", "interaction_type": "single_turn",
           "input": {"raw": "q", "reference": "a"}, "answer_attribution": [],
           "evaluation": {"score": 1, "is_correct": True}}
    assert any("output" in msg for _, msg in validation_errors(row, "instance"))
    row["output"] = {"raw": "a"}
    assert validation_errors(row, "instance") == []


@pytest.mark.parametrize("case", sorted(INVALID))
def test_fast_validator_agrees_on_invalid_shapes(case):
    from gage_eval.api.schemas import fast_validator

    fast = fast_validator("sample")
    if fast is None:
        pytest.skip("jsonschema-rs not installed")
    sample = copy.deepcopy(minimal())
    INVALID[case](sample)
    assert not fast.is_valid(sample)


@pytest.mark.parametrize("name", ["sample", "instance", "task", "legal_eval_v1"])
def test_fast_validator_compiles_every_schema(name):
    from gage_eval.api.schemas import fast_validator

    pytest.importorskip("jsonschema_rs")
    assert fast_validator(name) is not None


def test_validate_help_names_every_core_schema():
    from click.testing import CliRunner

    from gage_eval.cli.validate import validate_command
    from gage_eval.plugins import CORE_SCHEMAS

    text = " ".join(CliRunner().invoke(validate_command, ["--help"]).stdout.split())
    assert [name for name in CORE_SCHEMAS if name not in text] == []
