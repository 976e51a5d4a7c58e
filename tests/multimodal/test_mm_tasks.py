"""MMMU and DocVQA preprocessing on the real shared rows, the written outputs of a dummy run,
inline-image elision, and the capability check for text-only backends."""
from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest

from gage_eval.api.sample import RowContext, elide_inline_media
from gage_plugins_builtin.multimodal.media import image_bytes, to_image_url
from gage_plugins_builtin.multimodal.preprocess import MMMU, DocVQA, interleave

SUBJECTS = ("Accounting", "Economics", "Finance")
PNG_1PX = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")


@pytest.fixture(scope="session")
def mmmu_val(shared_data, tmp_path_factory) -> Path:
    """A folder holding only the three validation shards (the shared folder also holds dev shards)."""
    folder = tmp_path_factory.mktemp("mmmu_val")
    for subject in SUBJECTS:
        (folder / f"{subject}-validation.parquet").symlink_to(
            shared_data / "mmmu" / subject / "validation-00000-of-00001.parquet")
    return folder


def _rows(path: Path):
    from gage_plugins_builtin.loaders import HFLoader

    return list(HFLoader("parquet", data_files=[str(path)]))


def test_interleave_places_images_at_markers():
    segs = interleave("Look <image 2> then <image 1>, and <image 2> again.", {1: "u1", 2: "u2"})
    assert [s["type"] for s in segs] == ["text", "image_url", "text", "image_url", "text"]
    assert segs[1]["image_url"]["url"] == "u2" and segs[3]["image_url"]["url"] == "u1"
    assert segs[-1]["text"] == ", and <image 2> again."
    with pytest.raises(ValueError, match="image_3"):
        interleave("<image 3>", {1: "u1"})


def test_mmmu_rows_match_the_official_answer_key(shared_data):
    key = json.loads((shared_data / "mmmu" / "answer_dict_val.json").read_text())
    pre = MMMU()
    seen = 0
    for subject in SUBJECTS:
        path = shared_data / "mmmu" / subject / "validation-00000-of-00001.parquet"
        for i, (loc, row) in enumerate(_rows(path)):
            sample = pre(row, RowContext("mmmu", loc, i, path.parent))
            assert sample["label"] == key[sample["id"]]["ground_truth"]
            assert sample["data_tag"]["subject"] == subject
            content = sample["messages"][0]["content"]
            n_markers = len({m for m in re.findall(r"<image \d+>", row["question"] + row["options"])})
            images = [s for s in content if s["type"] == "image_url"]
            assert len(images) == n_markers >= 1
            assert all(s["image_url"]["url"].startswith("data:image/png;base64,") for s in images)
            last = content[-1]["text"]
            if row["question_type"] == "multiple-choice":
                assert last.endswith("Answer with the option's letter from the given choices directly.")
                listed = "\n".join(f"{o['id']}. {o['content']}" for o in sample["options"])
                assert listed.replace("\n", " ")[:40] in " ".join(
                    s["text"].replace("\n", " ") for s in content if s["type"] == "text")
            else:
                assert last.endswith("Answer the question using a single word or phrase.")
                assert "options" not in sample
            seen += 1
    assert seen == 90


def test_mmmu_two_image_row_is_interleaved(shared_data):
    path = shared_data / "mmmu" / "Economics" / "validation-00000-of-00001.parquet"
    row = next(r for _, r in _rows(path) if r["id"] == "validation_Economics_14")
    sample = MMMU()(row, RowContext("mmmu", "x", 0, path.parent))
    types = [s["type"] for s in sample["messages"][0]["content"]]
    assert types.count("image_url") == 2
    first_text_before = row["question"].split("<image 1>")[0].strip()
    if first_text_before:
        assert sample["messages"][0]["content"][0]["text"] == first_text_before


def test_local_paths_resolve_from_the_data_file(shared_data):
    folder = shared_data / "mmmu" / "derived_jsonl" / "Accounting_validation"
    row = json.loads((folder / "validation.jsonl").read_text().splitlines()[0])
    sample = MMMU()(row, RowContext("mmmu", "x", 0, folder))
    url = sample["messages"][0]["content"][0]["image_url"]["url"]
    assert url == str((folder / row["image_1"]).resolve())
    assert image_bytes(url).startswith(b"\x89PNG")
    with pytest.raises(ValueError, match="not found"):
        MMMU()(dict(row, image_1="images/missing.png"), RowContext("mmmu", "x", 0, folder))


def test_image_values(tmp_path):
    assert to_image_url({"bytes": PNG_1PX, "path": "a.png"}).startswith("data:image/png;base64,")
    with pytest.raises(ValueError, match="--allow-urls"):
        to_image_url("https://example.org/a.jpg")
    allow_urls = RowContext("t", "x", 0, tmp_path, allow_urls=True)
    assert to_image_url("https://example.org/a.jpg", allow_urls) == "https://example.org/a.jpg"
    assert to_image_url(None) is None
    (tmp_path / "p.png").write_bytes(PNG_1PX)
    assert to_image_url("p.png", tmp_path) == str(tmp_path / "p.png")
    assert image_bytes(to_image_url({"bytes": PNG_1PX, "path": None})) == PNG_1PX
    with pytest.raises(ValueError):
        to_image_url(3.5)


def test_docvqa_rows(shared_data):
    path = shared_data / "docvqa" / "derived" / "DocVQA" / "validation-00000-of-00001.parquet"
    rows = _rows(path)
    assert len(rows) == 15
    sample = DocVQA()(rows[0][1], RowContext("docvqa", rows[0][0], 0, path.parent))
    assert sample["id"] == "24580"
    seg_image, seg_text = sample["messages"][0]["content"]
    assert seg_image["type"] == "image_url" and seg_image["image_url"]["url"].startswith("data:image/png")
    assert seg_text["text"] == "What is name of university?\nAnswer the question using a single word or phrase."
    assert [r["answer"][0]["text"] for r in sample["references"]] == [
        "university of california", "University of California", "university of california, san diego"]
    assert sample["data_tag"] == {"question_type": ["others"]}


def test_elide_inline_media_keeps_short_and_leaves_input_alone():
    big = "data:image/png;base64," + "A" * 5000
    record = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": big}},
                                                       {"type": "text", "text": big}]}],
              "small": {"url": "data:text/plain,hi"}}
    out = elide_inline_media(record)
    url = out["messages"][0]["content"][0]["image_url"]["url"]
    assert url.startswith("data:image/png;elided,sha256=") and url.endswith(f";chars={len(big)}")
    assert out["messages"][0]["content"][1]["text"] == big      # only url values
    assert out["small"] is record["small"]
    assert record["messages"][0]["content"][0]["image_url"]["url"] == big


def _validate(run_cli, path: Path, schema: str):
    result = run_cli("validate", path, "--schema", schema)
    assert result.exit_code == 0, result.output
    assert " 0 invalid" in result.output


def test_dummy_run_on_shared_data(run_cli, mmmu_val, shared_data, tmp_path):
    docvqa = shared_data / "docvqa" / "derived" / "DocVQA" / "validation-00000-of-00001.parquet"
    result = run_cli("--tasks", "mmmu,docvqa", "--model", "dummy", "--data", f"mmmu={mmmu_val}",
                     "--data", f"docvqa={docvqa}", "-o", tmp_path, "--run-id", "r", "--quiet")
    assert result.exit_code == 0, result.output
    run = tmp_path / "r"
    summary = json.loads((run / "summary.json").read_text())
    mmmu = summary["tasks"]["mmmu"]
    assert mmmu["counts"]["total"] == 90 and mmmu["counts"]["scored"] == 90
    assert set(mmmu["slices"]["subject"]) == set(SUBJECTS)
    assert all(v["mmmu_acc"]["n"] == 30 for v in mmmu["slices"]["subject"].values())
    assert mmmu["slices"]["question_type"]["open"]["mmmu_acc"]["n"] == 9
    assert "Managerial Accounting" in mmmu["slices"]["subfield"]
    # the dummy answers a letter A-D: questions with fewer options fall back, and are counted
    records = [json.loads(line) for line in (run / "samples" / "mmmu.jsonl").read_text().splitlines()]
    fallbacks = sum(1 for r in records if r["eval_result"]["metrics"]["mmmu_acc"].get("method") == "fallback")
    assert fallbacks == mmmu["counts"].get("by_counter", {}).get("mmmu_acc.fallback", 0)
    accuracy = sum(r["eval_result"]["metrics"]["mmmu_acc"]["value"] for r in records) / 90
    assert mmmu["metrics"]["mmmu_acc"]["value"] == pytest.approx(accuracy)
    docs = summary["tasks"]["docvqa"]
    assert docs["counts"]["scored"] == 15 and "question_type" in docs["slices"]
    for task in ("mmmu", "docvqa"):
        text = (run / "samples" / f"{task}.jsonl").read_text()
        assert ";base64," not in text                       # inline images elided in the written samples
        assert len(text) < 4000 * (90 if task == "mmmu" else 15)
        _validate(run_cli, run / "instances" / f"{task}.jsonl", "instance")
        _validate(run_cli, run / "samples" / f"{task}.jsonl", "sample")


def test_text_only_model_is_refused_up_front(run_cli, mmmu_val, tmp_path):
    result = run_cli("--tasks", "mmmu", "--model", "dummy", "--model-args", "vision=false",
                     "--data", f"mmmu={mmmu_val}", "-o", tmp_path)
    assert result.exit_code != 0
    assert "mmmu" in result.output and "vision" in result.output and "dummy" in result.output
    assert "Traceback" not in result.output
    assert not list(tmp_path.iterdir())                     # nothing run, nothing written


def test_default_text_model_is_refused(run_cli, mmmu_val, tmp_path):
    result = run_cli("--tasks", "mmmu", "--data", f"mmmu={mmmu_val}", "-o", tmp_path)
    assert result.exit_code != 0
    assert "'mmmu'" in result.output and "vision" in result.output and "smollm2" in result.output
    assert "Traceback" not in result.output
