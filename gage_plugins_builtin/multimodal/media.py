"""Image handling for multimodal samples: dataset values to ``image_url`` URLs, and URLs to images.

Preprocessors turn what a dataset row holds (a path relative to the data file, an
http or data URL, a Hugging Face ``Image`` value ``{"bytes", "path"}``, or an
already decoded PIL image) into the URL of an ``image_url`` segment, under the file
access policy of :mod:`gage_eval.paths`. Backends turn
those URLs back into PIL images, one request at a time, while the request is in flight.
PIL is imported only when an image is actually decoded or encoded.
"""
from __future__ import annotations

import base64
import binascii
import io
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import unquote, urlparse

from gage_eval.api import REMOTE_SCHEMES, RowContext, checked_url, context_for
_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"BM", "image/bmp"),
    (b"II*\x00", "image/tiff"),
    (b"MM\x00*", "image/tiff"),
)


def sniff_mime(data: bytes, path: str | None = None) -> str:
    """The image MIME type from the file's first bytes (then its name); ``image/png`` if unknown."""
    for magic, mime in _MAGIC:
        if data.startswith(magic):
            return mime
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    suffix = Path(path).suffix.lower() if path else ""
    return {".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif", ".webp": "image/webp",
            ".bmp": "image/bmp", ".tif": "image/tiff", ".tiff": "image/tiff"}.get(suffix, "image/png")


def data_url(data: bytes, mime: str | None = None) -> str:
    return f"data:{mime or sniff_mime(data)};base64,{base64.b64encode(data).decode('ascii')}"


def _pil_bytes(image: Any) -> bytes:
    """Encode a PIL image losslessly (PNG), for rows a loader has already decoded."""
    buf = io.BytesIO()
    img = image if image.mode in ("RGB", "RGBA", "L", "LA", "P", "I", "I;16", "1") else image.convert("RGB")
    img.save(buf, format="PNG")
    return buf.getvalue()


def to_image_url(value: Any, ctx: RowContext | Path | str | None = None, field: str = "image") -> str | None:
    """The URL for an ``image_url`` segment from a dataset value; ``None`` for a missing image.

    Accepts a string (a local path or ``file://`` URL, a ``data:`` URL, an http(s) URL), a
    Hugging Face ``Image`` value ``{"bytes": ..., "path": ...}`` (bytes become a data URL,
    a path alone is taken like a string), raw bytes, or a PIL image. Paths resolve against
    the data file's folder and must stay in it (or in an ``--allow-path`` folder); http(s)
    URLs need ``--allow-urls`` (:mod:`gage_eval.paths`). ``ctx`` is the row's context (a
    bare folder is taken as the data folder, with nothing else allowed). Raises
    ``ValueError`` naming ``field`` when the value cannot be used as an image.
    """
    if value is None:
        return None
    ctx = context_for(ctx)
    if isinstance(value, str):
        if not value.strip():
            return None
        return checked_url(value, ctx, field)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return data_url(bytes(value))
    if isinstance(value, Mapping):
        raw, path = value.get("bytes"), value.get("path")
        if raw:
            return data_url(bytes(raw), sniff_mime(bytes(raw), path if isinstance(path, str) else None))
        if path:
            return to_image_url(str(path), ctx, f"{field}.path")
        return None
    if hasattr(value, "save") and hasattr(value, "mode"):  # a PIL image, decoded by the loader
        return data_url(_pil_bytes(value), "image/png")
    raise ValueError(f"{field}: cannot use a {type(value).__name__} as an image "
                     f"(expected a path, a URL, {{bytes, path}} or a PIL image)")


def image_segment(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def segment_url(segment: Mapping[str, Any]) -> str:
    """The URL of a media segment (``image_url``, ``audio_url``, ...); also accepts a bare string."""
    kind = segment.get("type", "")
    ref = segment.get(kind)
    url = ref.get("url") if isinstance(ref, Mapping) else ref
    if not isinstance(url, str) or not url:
        raise ValueError(f"{kind} segment without a url")
    return url


def image_bytes(url: str, base_dir: Path | str | None = None, timeout: float = 30.0) -> bytes:
    """The encoded bytes behind an image URL: a data URL, http(s), ``file://`` or a local path.

    Backends call this with the URLs of checked samples (:mod:`gage_eval.rows`): local
    paths are already absolute and confined, and an http(s) URL is there only when the
    user gave ``--allow-urls``. A relative path with no ``base_dir`` is refused rather than
    taken from the working directory."""
    parsed = urlparse(url)
    scheme = parsed.scheme.lower()
    if scheme == "data":
        header, sep, payload = url.partition(",")
        if not sep:
            raise ValueError("malformed data URL (no comma)")
        if header.endswith(";base64"):
            try:
                return base64.b64decode(payload, validate=False)
            except (binascii.Error, ValueError) as exc:
                raise ValueError(f"data URL is not valid base64: {exc}") from None
        return unquote(payload).encode("latin-1")
    if scheme in REMOTE_SCHEMES:
        import urllib.request

        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - http(s) only
            return resp.read()
    path = Path(unquote(parsed.path) if scheme == "file" else url)
    if not path.is_absolute():
        if base_dir is None:
            raise ValueError(f"image path {url!r} is relative and there is no data folder to resolve it against")
        path = Path(base_dir) / path
    if not path.is_file():
        raise ValueError(f"image file {url!r} not found (looked at {path})")
    return path.read_bytes()


def load_image(url: str, base_dir: Path | str | None = None, mode: str = "RGB") -> Any:
    """Decode the image behind ``url`` into a PIL image in ``mode``."""
    try:
        from PIL import Image
    except ImportError:
        raise ValueError("decoding images needs Pillow: pip install pillow") from None
    data = image_bytes(url, base_dir)
    try:
        img = Image.open(io.BytesIO(data))
        img.load()
    except Exception as exc:  # PIL raises several kinds for bad files
        raise ValueError(f"cannot decode image {_short(url)}: {type(exc).__name__}: {exc}") from None
    return img.convert(mode) if mode and img.mode != mode else img


def _short(url: str) -> str:
    return url[:48] + "..." if url.startswith("data:") and len(url) > 48 else url

