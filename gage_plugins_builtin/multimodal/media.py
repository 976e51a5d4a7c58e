"""Image handling for multimodal samples: dataset values to ``image_url`` URLs, and URLs to images.

Preprocessors turn what a dataset row holds (a path relative to the data file, an
http or data URL, a Hugging Face ``Image`` value ``{"bytes", "path"}``, or an
already decoded PIL image) into the URL of an ``image_url`` segment, under the file
access policy of :mod:`gage_eval.api.paths`. Backends turn
those URLs back into PIL images, one request at a time, while the request is in flight.
PIL is imported only when an image is actually decoded or encoded.

Backends may resize images by Qwen2.5-VL's rule (:func:`smart_size`, :class:`ImageResize`: the
``min_pixels``, ``max_pixels`` and ``image_factor`` model arguments) and give an image-only user
turn a short prompt (:func:`with_default_prompt`, the ``default_prompt`` model argument).
"""
from __future__ import annotations

import base64
import binascii
import io
import math
from pathlib import Path
from typing import Any, Mapping, Sequence
from urllib.parse import unquote, urlparse

from gage_eval.api import GageError, RowContext, jsonio, paths

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
    URLs need ``--allow-urls`` (:mod:`gage_eval.api.paths`). ``ctx`` is the row's context (a
    bare folder is taken as the data folder, with nothing else allowed). Raises
    ``ValueError`` naming ``field`` when the value cannot be used as an image.
    """
    if value is None:
        return None
    ctx = paths.context_for(ctx)
    if isinstance(value, str):
        if not value.strip():
            return None
        if len(value) > 8192 and not value.startswith("data:"):  # (a path holds 4096 at most)
            raise ValueError(f"{field}: a string of {len(value)} characters is no path or URL of an image")
        return paths.checked_url(value, ctx, field)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return data_url(bytes(value))
    if isinstance(value, Mapping):
        raw, path = value.get("bytes"), value.get("path")
        if raw is not None and not isinstance(raw, (bytes, bytearray, memoryview)):  # (bytes(10**10): 10 GB)
            raise ValueError(f"{field}.bytes: expected the image's bytes, got {jsonio.json_type(raw)}")
        if path is not None and not isinstance(path, str):
            raise ValueError(f"{field}.path: expected a string, got {jsonio.json_type(path)}")
        if raw:
            return data_url(bytes(raw), sniff_mime(bytes(raw), path if isinstance(path, str) else None))
        if path:
            return to_image_url(path, ctx, f"{field}.path")
        return None
    if hasattr(value, "save") and hasattr(value, "mode"):  # a PIL image, decoded by the loader
        return data_url(_pil_bytes(value), "image/png")
    raise ValueError(f"{field}: cannot use {jsonio.json_type(value)} as an image "
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

    Backends call this with the URLs of checked samples (:mod:`gage_eval.tasks.rows`): local
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
    if scheme in paths.REMOTE_SCHEMES:
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
    return decode_image(image_bytes(url, base_dir), url, mode)


def decode_image(data: bytes, url: str = "image", mode: str = "RGB") -> Any:
    """Decode encoded image bytes (``url`` names them in errors) into a PIL image in ``mode``
    (empty: the file's own mode)."""
    try:
        from PIL import Image
    except ImportError:
        raise ValueError("decoding images needs Pillow: pip install pillow") from None
    try:
        img = Image.open(io.BytesIO(data))
        img.load()
    except Exception as exc:  # PIL raises several kinds for bad files
        raise ValueError(f"cannot decode image {_short(url)}: {_undecodable(data, exc)}") from None
    return img.convert(mode) if mode and img.mode != mode else img


def _undecodable(data: bytes, exc: Exception) -> str:
    """Why Pillow could not read ``data``, in words (its own message names a BytesIO object)."""
    if not data:
        return "the file is empty"
    if type(exc).__name__ != "UnidentifiedImageError":
        return f"{type(exc).__name__}: {exc}"
    if b"<svg" in data[:1024].lower():
        return "an SVG (vector) image, which is not read: convert it to PNG"
    return "not an image format Pillow reads (PNG, JPEG, GIF, WebP, BMP, TIFF ...)"


def _short(url: str) -> str:
    return url[:48] + "..." if url.startswith("data:") and len(url) > 48 else url



# -- resizing (Qwen2.5-VL's rule) and the prompt of an image-only turn ---------------------------

# Qwen2.5-VL's image defaults (qwen_vl_utils): sides in multiples of 28 (patch 14 x merge 2),
# 4 to 16384 patches of 28 x 28, aspect ratio at most 200
IMAGE_FACTOR = 28
MIN_PIXELS = 4 * 28 * 28
MAX_PIXELS = 16384 * 28 * 28
MAX_RATIO = 200
RESIZE_ARGS = ("min_pixels", "max_pixels", "image_factor")
# the prompt an image-only user turn gets (spec 004 section 15.2: "a simple English prompt")
DEFAULT_PROMPT = "Please describe the image and answer the question."


def smart_size(height: int, width: int, factor: int = IMAGE_FACTOR, min_pixels: int = MIN_PIXELS,
               max_pixels: int = MAX_PIXELS) -> tuple[int, int]:
    """(height, width) resized by Qwen2.5-VL's rule: both sides multiples of ``factor``, the
    area within [min_pixels, max_pixels], the aspect ratio kept as closely as that allows.

    Each side is first rounded to the nearest multiple (at least one ``factor``); an area above
    ``max_pixels`` scales both sides down by sqrt(area / max_pixels) and floors them, one below
    ``min_pixels`` scales them up by sqrt(min_pixels / area) and ceils them. Raises
    ``ValueError`` for an aspect ratio above 200, as Qwen's processor does."""
    if height < 1 or width < 1:
        raise ValueError(f"an image of {width}x{height} pixels has nothing to resize")
    ratio = max(height, width) / min(height, width)
    if ratio > MAX_RATIO:
        raise ValueError(f"image of {width}x{height} pixels: aspect ratio {ratio:.1f} is above {MAX_RATIO}, "
                         f"which Qwen2.5-VL's resizing refuses")
    new_h = max(factor, round(height / factor) * factor)
    new_w = max(factor, round(width / factor) * factor)
    if new_h * new_w > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        new_h = max(factor, math.floor(height / beta / factor) * factor)
        new_w = max(factor, math.floor(width / beta / factor) * factor)
    elif new_h * new_w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        new_h = math.ceil(height * beta / factor) * factor
        new_w = math.ceil(width * beta / factor) * factor
    return new_h, new_w


def _positive_int(name: str, value: Any, where: str) -> int:
    """An int from a model argument: ``12845056``, ``"12845056"`` or a product such as ``"1280*28*28"``."""
    text = str(value).strip()
    try:
        number = 1
        for factor in text.split("*"):
            number *= int(factor.strip())
    except ValueError:
        raise GageError(f"{where}: {name}={value!r} is not a whole number (e.g. {name}=1003520 or "
                        f"{name}=1280*28*28)") from None
    if number < 1:
        raise GageError(f"{where}: {name}={value!r} must be at least 1")
    return number


class ImageResize:
    """Resizing by area and size factor (:func:`smart_size`), as a backend's model arguments set it."""

    def __init__(self, min_pixels: int = MIN_PIXELS, max_pixels: int = MAX_PIXELS, factor: int = IMAGE_FACTOR):
        self.min_pixels, self.max_pixels, self.factor = int(min_pixels), int(max_pixels), int(factor)

    @classmethod
    def from_args(cls, args: Mapping[str, Any], where: str) -> "ImageResize | None":
        """From ``min_pixels``, ``max_pixels`` and ``image_factor`` (None when none is given: images
        go as they are); a bound not given takes Qwen2.5-VL's default. GageError naming ``where``
        for a value that is not a positive whole number, or min_pixels above max_pixels."""
        given = {k: args[k] for k in RESIZE_ARGS if args.get(k) not in (None, "")}
        if not given:
            return None
        values = {k: _positive_int(k, v, where) for k, v in given.items()}
        resize = cls(values.get("min_pixels", MIN_PIXELS), values.get("max_pixels", MAX_PIXELS),
                     values.get("image_factor", IMAGE_FACTOR))
        if resize.min_pixels > resize.max_pixels:
            raise GageError(f"{where}: min_pixels={resize.min_pixels} is above max_pixels={resize.max_pixels}")
        return resize

    def settings(self) -> dict:
        return {"min_pixels": self.min_pixels, "max_pixels": self.max_pixels, "image_factor": self.factor}

    def size(self, width: int, height: int) -> tuple[int, int]:
        """The (width, height) an image of ``width`` x ``height`` is resized to."""
        h, w = smart_size(height, width, self.factor, self.min_pixels, self.max_pixels)
        return w, h

    def apply(self, image: Any) -> Any:
        """The PIL image resized (bicubic, as Qwen's utilities); the same object when its size fits."""
        size = self.size(*image.size)
        if size == tuple(image.size):
            return image
        from PIL import Image

        return image.resize(size, Image.Resampling.BICUBIC)

    def __repr__(self) -> str:
        return f"ImageResize({self.min_pixels}, {self.max_pixels}, {self.factor})"


def resized_image_url(url: str, resize: "ImageResize | None", base_dir: Path | str | None = None) -> str:
    """A local or data image as a data URL of the resized image; http(s) URLs as they are (the
    server fetches them). An image whose size already fits keeps its bytes; a resized one is PNG."""
    if resize is None or urlparse(url).scheme.lower() in paths.REMOTE_SCHEMES:
        return url
    data = image_bytes(url, base_dir)
    img = decode_image(data, url, mode="")
    out = resize.apply(img)
    if out is img:
        return url if url.startswith("data:") else data_url(data)
    if out.mode not in ("RGB", "RGBA", "L", "LA"):
        out = out.convert("RGB")
    return data_url(_pil_bytes(out), "image/png")


def has_text(content: Any) -> bool:
    if isinstance(content, str):
        return bool(content.strip())
    for seg in content or ():
        if isinstance(seg, str) and seg.strip():
            return True
        if isinstance(seg, Mapping) and seg.get("type", "text") == "text" and str(seg.get("text") or "").strip():
            return True
    return False


def with_default_prompt(messages: Sequence[Mapping[str, Any]], prompt: str | None) -> list:
    """The messages, with ``prompt`` as a text part after the images of the last user turn when
    that turn holds images and no text (spec 004 section 15.2: an image-only turn gets a short
    prompt, so a VLM's template has text to put the images with). ``None``/empty: unchanged."""
    messages = list(messages)
    if not prompt:
        return messages
    for i in range(len(messages) - 1, -1, -1):
        message = messages[i]
        if message.get("role", "user") != "user":
            continue
        content = message.get("content")
        if isinstance(content, list) and not has_text(content) and any(
                isinstance(s, Mapping) and s.get("type") == "image_url" for s in content):
            messages[i] = {**message, "content": [*content, {"type": "text", "text": prompt}]}
        break
    return messages
