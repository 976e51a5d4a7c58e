"""Dataset loaders: jsonl files read lazily, and Hugging Face ``datasets``."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

from gage_eval.api import GageError, Loader, RowError, check_data_file, iter_json_rows, json_type


def _resolve(path: str, base_dir: str | None) -> Path:
    p = Path(path).expanduser()
    if not p.is_absolute() and base_dir:
        p = Path(base_dir) / p
    return p


class JsonlLoader(Loader):
    """Rows of a .jsonl file (or a .json array), or of every .jsonl file in a folder (sorted
    by name; a folder without one: its .json files).

    Read strictly through :func:`gage_eval.api.jsonio.iter_json_rows`, the reader
    ``gage-eval validate`` uses. Each row's locator is ``file:line``; a row that is not a
    strict JSON object is yielded as a :class:`RowError`, so it is reported and counted.
    A file that is not UTF-8 text at all (gzip, UTF-16) raises GageError before any row.
    """

    def __init__(self, path: str, base_dir: str | None = None, encoding: str = "utf-8"):
        self.path = _resolve(path, base_dir)
        if not self.path.exists():
            raise GageError(f"jsonl loader: {self.path} does not exist")
        if encoding.lower().replace("_", "-") not in ("utf-8", "utf8", "utf-8-sig"):
            raise GageError(f"jsonl loader: encoding {encoding!r}: gage-eval reads UTF-8 data; convert the file "
                            f"with iconv -f {encoding} -t UTF-8")
        self.data_dir = self.path if self.path.is_dir() else self.path.parent
        self._files = self.files()
        self._total: int | None = None
        for file in self._files:
            check_data_file(file)

    def files(self) -> list[Path]:
        if self.path.is_dir():
            files = sorted(self.path.rglob("*.jsonl")) or sorted(self.path.rglob("*.json"))
            if not files:
                raise GageError(f"jsonl loader: no .jsonl file in {self.path}")
            return files
        return [self.path]

    def total(self) -> int | None:
        """The number of rows, counted cheaply (non-blank lines of .jsonl files; a .json array is
        not counted); used for progress and fractional limits."""
        if self._total is None and all(f.suffix == ".jsonl" for f in self._files):
            self._total = sum(_count_lines(f) for f in self._files)
        return self._total

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        for file in self._files:
            name = str(file)  # (once a file, not once a row)
            for lineno, record, error in iter_json_rows(file):
                locator = f"{name}:{lineno}"
                if error is not None:
                    yield locator, RowError(error)
                elif not isinstance(record, dict):
                    yield locator, RowError(f"expected a JSON object, got {json_type(record)}")
                else:
                    yield locator, record


class HFLoader(Loader):
    """Rows of a Hugging Face dataset: a hub id, or a builder (``json``, ``csv``,
    ``parquet``) with local ``data_files``. Locators read ``hf:ID[split][i]``."""

    def __init__(self, path: str, split: str = "train", name: str | None = None, revision: str | None = None,
                 data_files: Any = None, streaming: bool = False, base_dir: str | None = None, **kwargs: Any):
        self.path = path
        self.split = split
        self.name = name
        self.revision = revision
        self.streaming = streaming
        self.kwargs = kwargs
        self._ds: Any = None
        if isinstance(data_files, (str, list)) and base_dir:
            files = [data_files] if isinstance(data_files, str) else data_files
            data_files = [str(_resolve(f, base_dir)) for f in files]
        elif isinstance(data_files, dict) and base_dir:
            data_files = {k: [str(_resolve(f, base_dir)) for f in ([v] if isinstance(v, str) else v)]
                          for k, v in data_files.items()}
        self.data_files = data_files
        first = _first_file(data_files)
        self.data_dir = Path(first).parent if first else None

    def _load(self) -> Any:
        if self._ds is not None:
            return self._ds
        try:
            import datasets
        except ImportError:
            raise GageError("the hf loader needs the 'datasets' package: pip install datasets") from None
        kwargs = dict(self.kwargs)
        if "cache_dir" not in kwargs and os.environ.get("GAGE_EVAL_DATA_CACHE", "").strip():
            kwargs["cache_dir"] = os.path.expanduser(os.environ["GAGE_EVAL_DATA_CACHE"])  # (README: environment)
        try:
            ds = datasets.load_dataset(self.path, self.name, split=self.split, revision=self.revision,
                                       data_files=self.data_files, streaming=self.streaming, **kwargs)
        except Exception as exc:  # datasets raises many kinds; the message is what the user needs
            raise GageError(f"hf loader: cannot load {self.path!r} (split {self.split!r}): "
                            f"{type(exc).__name__}: {exc}") from None
        self._ds = _undecoded_media(ds, datasets)
        return self._ds

    def total(self) -> int | None:
        """The split's length (a loaded, non-streaming dataset knows it); None when streaming."""
        if self.streaming:
            return None
        return len(self._load())

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        ds = self._load()
        label = self.path if not self.data_files else f"{self.path}:{_short(self.data_files)}"
        for i, row in enumerate(ds):
            yield f"hf:{label}[{self.split}][{i}]", dict(row)


def _count_lines(path: Path) -> int:
    """Non-blank lines (what iter_json_rows yields a row for), read in binary blocks."""
    n = 0
    tail = b""
    with path.open("rb") as fh:
        while True:
            block = fh.read(1 << 20)
            if not block:
                break
            lines = (tail + block).split(b"\n")
            tail = lines.pop()
            n += sum(1 for line in lines if line.strip())
    return n + (1 if tail.strip() else 0)


def _undecoded_media(ds: Any, datasets: Any) -> Any:
    """Image and Audio columns as their stored ``{bytes, path}``: decoding belongs to the
    backend, per sample in flight, not to the loader."""
    features = getattr(ds, "features", None) or {}
    for name, feature in features.items():
        if isinstance(feature, (datasets.Image, datasets.Audio)) and getattr(feature, "decode", False):
            ds = ds.cast_column(name, type(feature)(decode=False))
    return ds


def _first_file(files: Any) -> str | None:
    if isinstance(files, str):
        return files
    if isinstance(files, dict):
        files = [f for v in files.values() for f in v]
    return files[0] if files else None


def _short(files: Any) -> str:
    if isinstance(files, dict):
        files = [f for v in files.values() for f in v]
    return Path(files[0]).name + (f"+{len(files) - 1}" if len(files) > 1 else "")
