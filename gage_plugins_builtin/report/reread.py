"""The report's images: a samples file keeps a long ``data:`` URL only as a placeholder with its
sha256, so the rows are read again from the task's data (:meth:`gage_eval.api.RunFolder.reread_samples`,
through the run's config.json, loader and preprocessor), the URLs with those hashes found and
embedded as small JPEG thumbnails (at most :data:`MAX_IMAGES` per report); a local image path
is referenced relative to the report instead; a row that cannot be read again shows a
placeholder. The same pass over the rows gives each sample's position in its data
(:class:`Reread`), the order the sample browser lists them in; where the engine wrote a task's
samples file in the data's order (``TaskDone.in_data_order``), the positions are the file's own
(:meth:`Reread.in_file`) and its rows are read again only for the images it elided."""
from __future__ import annotations

import base64
import hashlib
import io
import os
import re
from pathlib import Path
from typing import Any, Callable, Collection, Iterable, Sequence

from gage_eval.api import RunFolder

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+:")  # a URL's scheme (one letter: a Windows drive)
MAX_IMAGES = 2_000  # thumbnails embedded per report
THUMB_PX = 320  # a thumbnail's longer side

__all__ = ["Reread", "MAX_IMAGES"]


def _elided_hash(url: str) -> str | None:
    """The sha256 in an elided data URL's placeholder (``data:<mime>;elided,sha256=<hex>;...``)."""
    if url.startswith("data:") and ";elided,sha256=" in url[:80]:
        return url.split("sha256=", 1)[1].split(";", 1)[0]
    return None


def _url_digest(url: str) -> str:
    """The sha256 an elided data URL's placeholder names (:func:`gage_eval.api.sample.elide_inline_media`)."""
    return hashlib.sha256(url.encode("ascii", "replace")).hexdigest()


class Reread:
    """What the report learns from the rows read again: the images (thumbnails by key, shared by
    the samples that show them) and each sample id's position in its data. ``ordered``: the
    (run, task) pairs whose samples file is in the data's order."""

    def __init__(self, out_dir: Path, ordered: Collection[tuple[int, str]] = ()):
        self.out_dir = out_dir
        self.ordered = set(ordered)
        self.embedded: dict[str, str] = {}  # key -> data URL (a thumbnail)
        self.wanted: dict[tuple[int, str], set[str]] = {}  # (run, task) -> elided hashes to recover
        self.positions: dict[tuple[int, str], dict[str, int]] = {}  # (run, task) -> {sample id: position}
        self.listed: set[tuple[int, str]] = set()  # the tasks of ``ordered`` handed to recover()

    def in_file(self, run: int, task: str) -> bool:
        """Whether a task's samples file is in the data's order: the n-th record (from 0) is at
        position n (the engine refuses a second row with an id as an error stub, which ends that
        order, so each id is there once)."""
        return (run, task) in self.ordered

    def known(self, run: int, task: str) -> bool:
        """Whether the positions of a task's samples are known (its file's order, or its rows read again)."""
        return (run, task) in self.listed or (run, task) in self.positions

    def ref(self, url: str, run: int, task: str, run_dir: Path) -> dict:
        """The image part of a message segment: {"k": key} for an embedded thumbnail, {"src": ...}
        for a file beside the report, {"ph": why} when it cannot be shown."""
        digest = _elided_hash(url)
        if digest is not None:
            self.wanted.setdefault((run, task), set()).add(digest)
            return {"k": digest}
        if url.startswith("data:"):  # short enough to be kept in the record
            digest = _url_digest(url)
            self.embedded.setdefault(digest, url)
            return {"k": digest}
        if _SCHEME.match(url) and not url[:5].lower() == "file:":  # (HTTP:/x, ftp:, ...: a browser fetches them)
            return {"ph": "remote image (not loaded): " + url[:200]}
        path = url[7:] if url.startswith("file://") else url
        p = Path(path)
        if not p.is_absolute():
            p = run_dir / p
        try:
            rel = os.path.relpath(p, self.out_dir)
        except ValueError:  # another drive
            rel = p.as_uri()
        return {"src": Path(rel).as_posix()}

    def recover(self, run_dirs: Sequence[Path], tasks: Iterable[tuple[int, str]], warn: Callable[[str], None]) -> None:
        """Read the rows of ``tasks`` ((run, task) pairs) again: each sample's position in its data
        and the thumbnails of the images the samples file keeps only as hashes; a task whose
        samples file is in the data's order is read again only for such images."""
        budget = MAX_IMAGES - len(self.embedded)
        for run, task in tasks:
            if (run, task) in self.ordered:
                self.listed.add((run, task))  # (its positions are its file's: it is read again only for images)
                if not self.wanted.get((run, task)):
                    continue
            try:
                budget -= self._reread_task(run, run_dirs[run], task, self.wanted.get((run, task), set()), budget)
            except Exception as exc:  # a report shows what it can: the rows may have moved
                if (run, task) in self.ordered:  # (listed in the samples file's order, the data's)
                    warn(f"report: the images of task {task!r} could not be read again ({type(exc).__name__}: "
                         f"{exc}); image placeholders are shown")
                    continue
                images = "; image placeholders are shown" if self.wanted.get((run, task)) else ""
                warn(f"report: the rows of task {task!r} could not be read again ({type(exc).__name__}: {exc}); "
                     f"its samples are listed in the order they finished{images}")

    def _reread_task(self, run: int, run_dir: Path, task: str, hashes: set[str], budget: int) -> int:
        found = 0
        todo = set(hashes)
        positions: dict[str, int] = {}
        ordered = (run, task) in self.ordered  # (its positions are the samples file's: only the images are wanted)
        for position, sample in enumerate(RunFolder(run_dir).reread_samples(task)):
            if ordered:
                if not todo or found >= budget:
                    return found
            else:
                positions.setdefault(str(sample.get("id")), position)
            if not todo or found >= budget:
                continue
            for url in _data_urls(sample.get("messages")):
                digest = _url_digest(url)
                if digest in todo:
                    todo.discard(digest)
                    thumb = _thumbnail(url)
                    if thumb:
                        self.embedded[digest] = thumb
                        found += 1
        if not ordered:
            self.positions[(run, task)] = positions
        return found


def _data_urls(value: Any) -> Iterable[str]:
    if isinstance(value, dict):
        for k, v in value.items():
            if k == "url" and isinstance(v, str) and v.startswith("data:"):
                yield v
            elif isinstance(v, (dict, list)):
                yield from _data_urls(v)
    elif isinstance(value, list):
        for v in value:
            yield from _data_urls(v)


def _thumbnail(url: str) -> str | None:
    """A small JPEG data URL of the image (the image itself when Pillow is missing and it is small)."""
    try:
        head, payload = url.split(",", 1)
        raw = base64.b64decode(payload) if head.endswith(";base64") else payload.encode()
    except ValueError:
        return None
    try:
        from PIL import Image
    except ImportError:
        return url if len(url) <= 200_000 else None
    try:
        with Image.open(io.BytesIO(raw)) as img:
            img.thumbnail((THUMB_PX, THUMB_PX))
            if img.mode not in ("RGB", "L"):
                rgba = img.convert("RGBA")
                img = Image.new("RGB", rgba.size, (255, 255, 255))
                img.paste(rgba, mask=rgba.getchannel("A"))
            buf = io.BytesIO()
            img.save(buf, "JPEG", quality=75)
    except Exception:  # not an image Pillow reads
        return None
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii")
