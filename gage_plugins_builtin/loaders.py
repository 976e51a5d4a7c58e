"""Dataset loaders: jsonl files read lazily, plain text files, and Hugging Face ``datasets``."""
from __future__ import annotations

import itertools
import os
import re
import stat
from pathlib import Path
from typing import Any, Iterator

from gage_eval.api import GageError, Loader, RowError, jsonio


def _resolve(path: str, base_dir: str | None) -> Path:
    p = Path(path).expanduser()
    if not p.is_absolute() and base_dir:
        p = Path(base_dir) / p
    return p


def _data_file(path: str, base_dir: str | None) -> str:
    """A ``data_files`` entry read from the task folder; a URL is left whole (joined to the folder,
    ``https:/bob:PW@host`` no longer looked like a URL and its password was written in messages)."""
    return str(path) if "://" in str(path) else str(_resolve(path, base_dir))


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
            jsonio.check_data_file(file)

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
            for lineno, record, error in jsonio.iter_json_rows(file):
                locator = f"{name}:{lineno}"
                if error is not None:
                    yield locator, RowError(error)
                elif not isinstance(record, dict):
                    yield locator, RowError(f"expected a JSON object, got {jsonio.json_type(record)}")
                else:
                    yield locator, record


class TextLoader(Loader):
    """Plain text: a ``.txt`` file is one row, ``{"text": its whole content, "file": its name}``;
    a folder gives one such row per ``.txt`` file in it (sorted by path, sub-folders included).

    The text is kept exactly as written (line ends included; a UTF-8 byte-order mark dropped). A
    file that is not UTF-8, or not a regular file, is a row error naming it, reported and counted.
    """

    def __init__(self, path: str, base_dir: str | None = None):
        self.path = _resolve(path, base_dir)
        if not self.path.exists():
            raise GageError(f"text loader: {self.path} does not exist")
        self.data_dir = self.path if self.path.is_dir() else self.path.parent
        self._files = sorted(self.path.rglob("*.txt")) if self.path.is_dir() else [self.path]
        if not self._files:
            raise GageError(f"text loader: no .txt file in {self.path}")

    def files(self) -> list[Path]:
        return list(self._files)

    def total(self) -> int | None:
        return len(self._files)

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        for file in self._files:
            name = str(file.relative_to(self.data_dir)) if self.path.is_dir() else file.name
            try:
                if not stat.S_ISREG(file.stat().st_mode):  # a FIFO or device would block or never end
                    yield str(file), RowError("not a regular file")
                    continue
                text = file.read_bytes().removeprefix(b"\xef\xbb\xbf").decode("utf-8")
            except UnicodeDecodeError as exc:
                yield str(file), RowError(f"not UTF-8 text (byte {exc.start}); convert it with iconv -t UTF-8")
                continue
            except OSError as exc:
                yield str(file), RowError(f"cannot read: {exc.strerror or exc}")
                continue
            yield str(file), {"text": text, "file": name}


class HFLoader(Loader):
    """Rows of a Hugging Face dataset: a hub id, a builder (``json``, ``csv``, ``parquet``) with
    local ``data_files``, or a local ``save_to_disk`` folder. A hub id is read from the hub when
    reachable and not offline, else from an installed data package (the order and lookup rule:
    :mod:`gage_plugins_builtin.datasources`). Locators read ``hf:ID[split][i]`` (the hub),
    ``PACKAGE:ID-PATH/CONFIG/SPLIT[i]`` (a package's copy) or ``FOLDER[i]`` (a saved folder)."""

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
            data_files = [_data_file(f, base_dir) for f in files]
        elif isinstance(data_files, dict) and base_dir:
            data_files = {k: [_data_file(f, base_dir) for f in ([v] if isinstance(v, str) else v)]
                          for k, v in data_files.items()}
        self.data_files = data_files
        first = _first_file(data_files)
        self.data_dir = Path(first).parent if first else None
        self.source: dict | None = None  # where the rows come from (summary.json), once known
        self.source_note: str | None = None  # the same in words, said once on the console
        self._folder: Any = None  # a datasources.SplitFolder: a package's copy or a saved folder
        if data_files is None:
            self._resolve(base_dir)

    def _resolve(self, base_dir: str | None) -> None:
        """Pick the source of a dataset named by id, or of a local ``save_to_disk`` folder
        (``gage_plugins_builtin.datasources`` has the order and the lookup rule)."""
        from gage_plugins_builtin import datasources as ds

        local = _resolve(self.path, base_dir)
        if local.is_dir():
            saved = ds.saved_folder(local, self.split)
            if saved is not None:
                self._folder = ds.SplitFolder(saved, str(saved))
                self.data_dir = saved
                self._set_source({"from": "folder", "path": str(saved)})
            return  # another local folder: the datasets builder of that folder (as before)
        if self.path in BUILDERS or not _looks_like_id(self.path):
            return
        hub_error = None
        if not ds.offline():
            unreachable = ds.hub_unreachable()
            try:
                if unreachable:
                    raise GageError(f"cannot reach {unreachable}")
                self._load()
                self._set_source({"from": "hub"})
                return
            except GageError as exc:
                hub_error = str(exc).splitlines()[0][:300]
        found = ds.find(self.path, self.name, self.split)
        if found is not None:
            package, root, folder = found
            self._folder = ds.SplitFolder(folder, f"{package}:{folder.relative_to(root).as_posix()}")
            self.data_dir = folder
            self._set_source({"from": "package", "package": package, "path": str(folder)})
            return
        if ds.offline():
            try:  # a copy the datasets library downloaded before
                self._load()
                self._set_source({"from": "hf_cache"})
                return
            except GageError:
                pass
            why = (f"offline ({', '.join(v for v in ds.OFFLINE_VARS if os.environ.get(v))} set) and no "
                   f"installed data package holds it")
        else:
            why = f"the hub failed ({hub_error}) and no installed data package holds it"
        raise ds.not_found(self.path, self.name, self.split, why)

    def _set_source(self, source: dict) -> None:
        from gage_plugins_builtin import datasources as ds

        if source["from"] != "folder":
            source = {"from": source.pop("from"), "id": self.path, "config": self.name, "split": self.split,
                      **({"revision": self.revision} if self.revision else {}), **source}
        self.source = source
        self.source_note = ds.describe(source)

    def files(self) -> list[Path] | None:
        """The arrow or jsonl files of a package copy or saved folder; None otherwise."""
        return list(self._folder.paths) if self._folder is not None else None

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
        if self._folder is not None:
            return self._folder.total()
        if self.streaming:
            return None
        return len(self._load())

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        if self._folder is not None:  # (the folder's own rows, with no generator of ours around them)
            return iter(self._folder)
        return self._hub_rows()

    def _hub_rows(self) -> Iterator[tuple[str, Any]]:
        ds = self._load()
        label = self.path if not self.data_files else f"{self.path}:{_short(self.data_files)}"
        rows = iter(ds)
        for i in itertools.count():
            try:
                row = next(rows)
            except StopIteration:
                return
            except Exception as exc:  # a reader giving up part way (a CSV's unterminated quote)
                problem = _not_text(self.data_files) if isinstance(exc, UnicodeDecodeError) else None
                raise GageError(problem or f"hf loader: cannot read {label} (split {self.split!r}) after {i} "
                                f"row(s): {type(exc).__name__}: {exc}") from None
            yield f"hf:{label}[{self.split}][{i}]", dict(row)


# datasets' packaged builders: a path naming one reads local data_files, never the hub
BUILDERS = frozenset({"json", "csv", "parquet", "arrow", "text", "pandas", "imagefolder", "audiofolder",
                      "videofolder", "webdataset", "xml", "sql", "generator", "cache", "pdffolder", "niftifolder"})
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


def _looks_like_id(path: str) -> bool:
    """A hub dataset id (``piqa``, ``allenai/ai2_arc``), not a file path or URL."""
    return bool(_ID.match(path)) and not path.endswith((".json", ".jsonl", ".csv", ".parquet", ".arrow", ".py"))


def _count_lines(path: Path) -> int:
    """Non-blank lines (what iter_json_rows yields a row for), read in binary blocks; a long
    line is never held whole (only whether the unfinished one has text so far)."""
    n = 0
    text = False  # the line not yet ended has a non-blank byte
    with path.open("rb") as fh:
        while block := fh.read(1 << 20):
            first, *ended = block.split(b"\n")
            text = text or bool(first.strip())
            for part in ended:  # each part starts a new line, once the one before has ended
                n += text
                text = bool(part.strip())
    return n + text


def _undecoded_media(ds: Any, datasets: Any) -> Any:
    """Image and Audio columns as their stored ``{bytes, path}``: decoding belongs to the
    backend, per sample in flight, not to the loader."""
    features = getattr(ds, "features", None) or {}
    for name, feature in features.items():
        if isinstance(feature, (datasets.Image, datasets.Audio)) and getattr(feature, "decode", False):
            ds = ds.cast_column(name, type(feature)(decode=False))
    return ds


def _files(files: Any) -> list:
    """``data_files`` as a list of its files: one, a list, or a mapping of split -> one or a list."""
    if isinstance(files, dict):
        return [f for v in files.values() for f in (v if isinstance(v, (list, tuple)) else [v])]
    return [files] if isinstance(files, str) else list(files or ())


def _first_file(files: Any) -> str | None:
    return next(iter(_files(files)), None)


def _not_text(files: Any) -> str | None:
    """``PATH[:LINE]: why`` for the first local data file that is not UTF-8 text (UTF-16, gzip,
    Latin-1), as the jsonl reader says it; None when each one is (or cannot be read here)."""
    for name in _files(files):
        try:
            data = Path(name).read_bytes()
            problem = jsonio.file_problem(data[:4], Path(name).suffix.lstrip(".") or "text")
            if problem:
                return f"{name}: {problem}"
            jsonio.decode_file(Path(name), data)
        except OSError:
            continue
        except GageError as exc:
            return str(exc)
    return None


def _short(files: Any) -> str:
    if isinstance(files, dict):
        files = [f for v in files.values() for f in v]
    return Path(files[0]).name + (f"+{len(files) - 1}" if len(files) > 1 else "")
