"""Writing a page beside runs (report.html, compare --html): never inside a run folder other than
as that run's own report.html, nor over a file that is not a page gage-eval wrote. The report and
compare commands and the report writer share it."""
from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Iterable

from gage_eval.api import GageError, OutputError, RunFolder, jsonio

# The page's mark: a file that has it in its head is a page gage-eval wrote, and may be replaced.
PAGE_GENERATOR = '<meta name="generator" content="gage-eval">'
_HEAD_BYTES = 4096

def check_page_output(out: Path, run_dirs: list[Path], option: str, own_report: Path | None = None) -> None:
    """Refuse to write a page at ``out`` inside a run folder (a given one, or any folder above
    ``out`` holding a summary.json or config.json) unless ``out`` is ``own_report`` (the one
    run's report.html), or over a file that is not a page gage-eval wrote (its generator mark)."""
    target = out.parent.resolve() / out.name
    if own_report is None or target != own_report.parent.resolve() / own_report.name:
        roots = {d.resolve() for d in run_dirs}
        for folder in target.parents:
            if folder in roots or RunFolder(folder).is_run():
                raise GageError(f"{option} {out}: inside the run folder {folder}; gage-eval never writes into "
                                f"a run folder (its files are the record of the run): write the page elsewhere")
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise GageError(f"{option} {out}: cannot check it ({exc.strerror or exc})") from None
    if stat.S_ISREG(st.st_mode) and _is_page(target):
        return
    what = jsonio.file_kind(st.st_mode) if not stat.S_ISREG(st.st_mode) else "a file gage-eval did not write as a page"
    raise GageError(f"{option} {out}: it exists and is {what}; gage-eval replaces only a report or compare "
                    f"page it wrote: choose a new file name")


def _is_page(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            head = fh.read(_HEAD_BYTES)
    except OSError:
        return False
    return PAGE_GENERATOR.encode() in head or bool(_OLD_PAGE.search(head))


# the pages of gage-eval versions before the generator mark: their title
_OLD_PAGE = re.compile(rb"<head>\s*<meta charset=\"utf-8\">[^<]*(?:<meta [^>]*>\s*)*<title>gage-eval (?:report|compare): ")


def write_page(out: Path, chunks: Iterable[str | bytes], make_folder: bool = True) -> None:
    """The page written whole or not at all: a new temporary file beside ``out``, renamed over it
    (its folder made first when ``make_folder``). ``chunks``: text, or bytes already UTF-8 (the
    report's samples, copied as they are from its spool); written as they are (no newline
    translation)."""
    import secrets

    tmp = out.with_name(f".{out.name}.{secrets.token_hex(6)}.tmp")
    try:
        if make_folder:
            out.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    except OSError as exc:
        raise OutputError(f"{out}: cannot write the page ({exc.strerror or exc})") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            for chunk in chunks:
                fh.write(chunk.encode("utf-8") if isinstance(chunk, str) else chunk)
        os.replace(tmp, out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OutputError(f"{out}: cannot write the page ({exc.strerror or exc})") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
