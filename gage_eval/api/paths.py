"""Which files and URLs a data row may make the harness read.

Policy (README, "File access"): a path in a data row (an image, an attachment, a
document, an ``image_url``/``file_url`` segment, a ``file://`` URL) resolves against the
data file's folder (``RowContext.base_dir``) and, symlinks resolved, must stay inside it
or inside a folder the user allows with ``--allow-path DIR``; a task may name further
folders of its own (the legal task's document roots). An absolute path or ``file://``
URL is taken only when it lands inside one of those folders. http(s) URLs in data are
refused unless ``--allow-urls``: the harness would fetch them, or hand them to a server
that does. ``data:`` URLs are inline and always allowed. Every refusal is a
``ValueError`` naming the field and the path, and saying how to allow it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Sequence
from urllib.parse import unquote, urlparse

from gage_eval.api.sample import RowContext

REMOTE_SCHEMES = ("http", "https")
ALLOW_PATH_HINT = "pass --allow-path DIR to read files under DIR"
ALLOW_URLS_HINT = "http(s) URLs in data are not fetched without --allow-urls"


def context_for(base_dir: Path | str | RowContext | None) -> RowContext:
    """A context for code that has only a folder (tests, helpers): no extra folders, no URLs."""
    if isinstance(base_dir, RowContext):
        return base_dir
    return RowContext(task="", locator="", index=0, base_dir=Path(base_dir) if base_dir is not None else None)


def base_folder(ctx: RowContext) -> Path:
    return Path(ctx.base_dir if ctx.base_dir is not None else Path.cwd()).resolve()


def _inside(path: Path, roots: Iterable[Path]) -> bool:
    return any(path == root or path.is_relative_to(root) for root in roots)


def _show(raw: str) -> str:
    return repr(raw if len(raw) <= 200 else raw[:200] + "...")


def data_path(raw: str, ctx: RowContext, field: str, search: Sequence[Path] | None = None,
              roots: Sequence[Path] | None = None) -> Path:
    """The file a data row names in ``field``: resolved (symlinks too) and confined.

    A relative path is looked up in each folder of ``search`` in turn (default: the data
    file's folder); the file must lie inside ``roots`` (default: the data file's folder)
    or a ``ctx.allowed_dirs`` folder, and exist. ``raw`` may be a ``file://`` URL.
    Raises ``ValueError`` naming ``field`` and ``raw``.
    """
    if not isinstance(raw, str) or not raw.strip():
        raise ValueError(f"{field}: expected a file path, got {raw!r}")
    base = base_folder(ctx)
    search = list(search) if search is not None else [base]
    allowed = [*(roots if roots is not None else [base]), *ctx.allowed_dirs]
    text = raw
    is_url = raw[:5].lower() == "file:"
    if is_url:
        parsed = urlparse(raw)
        if parsed.netloc not in ("", "localhost"):
            raise ValueError(f"{field}: {_show(raw)}: a file URL on another host ({parsed.netloc}) is not read")
        text = unquote(parsed.path)
    if "\x00" in text:
        raise ValueError(f"{field}: {_show(raw)} is not a usable path (it holds a NUL character)")
    given = Path(text)
    candidates = [given] if given.is_absolute() else [folder / given for folder in search]
    escaped = False
    for candidate in candidates:
        try:
            real = candidate.resolve()
        except (OSError, RuntimeError) as exc:  # a symlink loop, a name too long
            raise ValueError(f"{field}: {_show(raw)} is not a usable path: {exc}") from None
        if not _inside(real, allowed):
            escaped = True
            continue
        try:
            if real.is_file():
                return real
        except OSError:
            pass
    if escaped:
        where = "file URL" if is_url else "absolute path" if given.is_absolute() else "path"
        also = " and the allowed folders" if len(allowed) > 1 else ""
        raise ValueError(f"{field}: {where} {_show(raw)} is outside the data folder {base}{also}; {ALLOW_PATH_HINT}")
    looked = ", ".join(dict.fromkeys(str(c) for c in candidates))
    raise ValueError(f"{field}: file {_show(raw)} not found (looked at {looked})")


def url_scheme(url: str) -> str:
    """The scheme of a media URL in lower case; ``""`` for a plain path."""
    head = url[:16].lower()
    for scheme in ("data:", "http://", "https://", "file:"):
        if head.startswith(scheme):
            return scheme.split(":")[0]
    try:
        scheme = urlparse(url).scheme.lower()
    except ValueError:
        return ""
    return scheme if len(scheme) > 1 else ""  # "C:" is a drive, not a scheme


def checked_url(url: str, ctx: RowContext, field: str, roots: Sequence[Path] | None = None,
                search: Sequence[Path] | None = None) -> str:
    """A media URL from data made safe to use: a local path or ``file://`` URL becomes the
    confined absolute path (a ``file://`` URL stays one); a ``data:`` URL is returned as it
    is; http(s) only with ``ctx.allow_urls``. Raises ``ValueError`` naming ``field``."""
    scheme = url_scheme(url)
    if scheme == "data":
        return url
    if scheme in REMOTE_SCHEMES:
        if not ctx.allow_urls:
            raise ValueError(f"{field}: {_show(url)}: {ALLOW_URLS_HINT}")
        return url
    if scheme == "file":
        return data_path(url, ctx, field, search=search, roots=roots).as_uri()
    if scheme:
        raise ValueError(f"{field}: {_show(url)}: URL scheme {scheme!r} is not supported "
                         f"(use a path in the data folder, a data: URL, or http(s) with --allow-urls)")
    return str(data_path(url, ctx, field, search=search, roots=roots))
