"""The file access policy for paths and URLs in data rows (gage_eval.api.paths)."""
from __future__ import annotations

from pathlib import Path

import pytest

from gage_eval.api.paths import checked_url, data_path
from gage_eval.api.sample import RowContext


@pytest.fixture
def layout(tmp_path):
    """data/ (the data file's folder) with img/a.png, and outside/b.png beside it."""
    data, outside = tmp_path / "data", tmp_path / "outside"
    (data / "img").mkdir(parents=True)
    outside.mkdir()
    (data / "img" / "a.png").write_bytes(b"png")
    (outside / "b.png").write_bytes(b"secret")
    return data, outside


def ctx(data: Path, *allowed: Path, urls: bool = False) -> RowContext:
    return RowContext("t", "rows.jsonl:1", 0, base_dir=data, allowed_dirs=tuple(p.resolve() for p in allowed),
                      allow_urls=urls)


def test_relative_paths_resolve_against_the_data_folder(layout, monkeypatch, tmp_path):
    data, _ = layout
    monkeypatch.chdir(tmp_path)  # not the working directory
    assert data_path("img/a.png", ctx(data), "f") == (data / "img" / "a.png").resolve()
    assert data_path("img/../img/a.png", ctx(data), "f") == (data / "img" / "a.png").resolve()
    assert checked_url("img/a.png", ctx(data), "f") == str((data / "img" / "a.png").resolve())


@pytest.mark.parametrize("raw", ["../outside/b.png", "img/../../outside/b.png", "/etc/passwd", "file:///etc/passwd",
                                 "file://localhost/etc/passwd"])
def test_leaving_the_data_folder_is_refused_naming_field_and_path(layout, raw):
    data, _ = layout
    with pytest.raises(ValueError) as err:
        checked_url(raw, ctx(data), "messages[0].content[0].image_url.url")
    message = str(err.value)
    assert message.startswith("messages[0].content[0].image_url.url: ")
    assert repr(raw) in message and "outside the data folder" in message and "--allow-path DIR" in message


def test_a_symlink_out_of_the_data_folder_is_refused(layout):
    data, outside = layout
    (data / "img" / "link.png").symlink_to(outside / "b.png")
    with pytest.raises(ValueError, match="outside the data folder"):
        data_path("img/link.png", ctx(data), "image")
    (data / "inner.png").symlink_to(data / "img" / "a.png")  # a link that stays inside is fine
    assert data_path("inner.png", ctx(data), "image") == (data / "img" / "a.png").resolve()


def test_allow_path_opens_a_folder(layout):
    data, outside = layout
    allowed = ctx(data, outside)
    assert data_path("../outside/b.png", allowed, "f") == (outside / "b.png").resolve()
    assert data_path(str(outside / "b.png"), allowed, "f") == (outside / "b.png").resolve()
    assert checked_url((outside / "b.png").as_uri(), allowed, "f") == (outside / "b.png").resolve().as_uri()
    with pytest.raises(ValueError, match="outside"):
        data_path("/etc/passwd", allowed, "f")


def test_absolute_path_inside_the_data_folder_is_taken(layout):
    data, _ = layout
    assert data_path(str(data / "img" / "a.png"), ctx(data), "f") == (data / "img" / "a.png").resolve()


def test_missing_file_names_field_and_path(layout):
    data, _ = layout
    with pytest.raises(ValueError, match=r"^image_1: file 'img/nope.png' not found"):
        data_path("img/nope.png", ctx(data), "image_1")
    with pytest.raises(ValueError, match="not found"):
        data_path("img", ctx(data), "f")  # a folder is not a file


def test_urls(layout):
    data, _ = layout
    with pytest.raises(ValueError, match=r"^f: 'http://127.0.0.1:9/x.png': http\(s\) URLs in data are not fetched "
                                         r"without --allow-urls"):
        checked_url("http://127.0.0.1:9/x.png", ctx(data), "f")
    with pytest.raises(ValueError, match="--allow-urls"):
        checked_url("HTTPS://example.org/x.png", ctx(data), "f")
    assert checked_url("https://example.org/x.png", ctx(data, urls=True), "f") == "https://example.org/x.png"
    inline = "data:image/png;base64,iVBORw0KGgo="
    assert checked_url(inline, ctx(data), "f") == inline
    for url in ("ftp://example.org/x.png", "s3://bucket/x.png"):
        with pytest.raises(ValueError, match="not supported"):
            checked_url(url, ctx(data), "f")
    with pytest.raises(ValueError, match="another host"):
        checked_url("file://evil.example/etc/passwd", ctx(data), "f")


@pytest.mark.parametrize("raw", ["", "   ", "a\x00b.png", 7])
def test_unusable_values_are_refused(layout, raw):
    data, _ = layout
    with pytest.raises(ValueError, match="^f: "):
        data_path(raw, ctx(data), "f")


def test_a_symlink_loop_is_an_error_not_a_crash(layout):
    data, _ = layout
    (data / "loop").symlink_to(data / "loop")
    with pytest.raises(ValueError, match="^f: "):
        data_path("loop", ctx(data), "f")
