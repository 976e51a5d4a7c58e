"""MMMU and DocVQA image values under the file access policy: errors name the row's field."""
from __future__ import annotations

import base64

import pytest

from gage_eval.tasks.rows import RowChecker
from gage_eval.api.sample import RowContext
from gage_plugins_builtin.multimodal.media import image_bytes, to_image_url
from gage_plugins_builtin.multimodal.preprocess import MMMU, DocVQA

PNG_1PX = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")


def mmmu_row(image) -> dict:
    return {"id": "validation_Art_1", "question": "What is shown? <image 1>", "options": "['a cat', 'a dog']",
            "answer": "A", "question_type": "multiple-choice", "image_1": image}


def docvqa_row(image) -> dict:
    return {"questionId": "q1", "question": "Name?", "answers": ["x"], "image": image}


@pytest.fixture
def data(tmp_path):
    (tmp_path / "data" / "images").mkdir(parents=True)
    (tmp_path / "data" / "images" / "a.png").write_bytes(PNG_1PX)
    (tmp_path / "secret.png").write_bytes(PNG_1PX)
    return tmp_path / "data"


@pytest.mark.parametrize("value, words", [
    ("../secret.png", ["image_1: path '../secret.png' is outside the data folder", "--allow-path DIR"]),
    ("/etc/passwd", ["image_1: absolute path '/etc/passwd' is outside", "--allow-path"]),
    ("file:///etc/passwd", ["image_1: file URL 'file:///etc/passwd' is outside"]),
    ({"bytes": None, "path": "/etc/passwd"}, ["image_1.path: absolute path '/etc/passwd'"]),
    ("http://127.0.0.1:9/x.png", ["image_1: 'http://127.0.0.1:9/x.png': http(s) URLs in data are not fetched "
                                  "without --allow-urls"]),
    ("images/missing.png", ["image_1: file 'images/missing.png' not found"]),
])
def test_mmmu_image_refusals_name_the_field(data, value, words):
    checker = RowChecker("mmmu", MMMU(), base_dir=data)
    result = checker.check("f:1", 0, mmmu_row(value))
    assert result.stage == "preprocess"
    assert all(w in result.message for w in words), result.message


def test_mmmu_image_inside_the_data_folder(data):
    result = RowChecker("mmmu", MMMU(), base_dir=data).check("f:1", 0, mmmu_row("images/a.png"))
    assert result.ok
    url = result.sample["messages"][0]["content"][1]["image_url"]["url"]
    assert url == str((data / "images" / "a.png").resolve()) and image_bytes(url) == PNG_1PX


def test_allowed_folder_and_url(data):
    allowed = RowChecker("mmmu", MMMU(), base_dir=data, allowed_dirs=[data.parent], allow_urls=True)
    assert allowed.check("f:1", 0, mmmu_row("../secret.png")).ok
    assert allowed.check("f:2", 1, dict(mmmu_row("http://127.0.0.1:9/x.png"), id="validation_Art_2")).ok


def test_docvqa_image_field_is_named(data):
    checker = RowChecker("docvqa", DocVQA(), base_dir=data)
    assert checker.check("f:1", 0, docvqa_row({"bytes": PNG_1PX, "path": "/etc/passwd"})).ok  # bytes: the path is a name
    refused = checker.check("f:2", 1, dict(docvqa_row("../secret.png"), questionId="q2"))
    assert refused.message.startswith("image: path '../secret.png' is outside")


def test_image_bytes_never_reads_relative_paths_from_the_working_directory(data, monkeypatch):
    monkeypatch.chdir(data)
    with pytest.raises(ValueError, match="relative"):
        image_bytes("images/a.png")
    assert image_bytes("images/a.png", data) == PNG_1PX


def test_to_image_url_takes_a_context(data):
    ctx = RowContext("t", "f:1", 0, base_dir=data)
    assert to_image_url("images/a.png", ctx) == str((data / "images" / "a.png").resolve())
    with pytest.raises(ValueError, match="outside"):
        to_image_url("../secret.png", ctx)
