"""Which builtin loader reads a local file or folder given with ``--data TASK=PATH`` (or a task's
``fewshot.path``), and with what arguments: the ``for_path`` each loader's factory declares.

JSON (``.jsonl``, ``.json``) is read by the strict jsonl loader, the reader ``validate`` uses;
csv and parquet by the hf loader. In a folder of Hugging Face shards
(``validation-00000-of-00001.parquet``) only the shards of ``split`` (the task's own split) are
read. Local files are streamed, so memory does not grow with the file."""
from __future__ import annotations

import re
from pathlib import Path

from gage_eval.api import GageError

_SHARD = re.compile(r"^(?P<split>[A-Za-z0-9_.]+)-\d{5}-of-\d{5}\.")
JSONL_SUFFIXES = (".jsonl", ".json")
DATA_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")  # what the hf loader reads in a folder


def _saved_dataset(p: Path) -> bool:
    """A ``save_to_disk`` folder: state.json beside arrow files, here or in its sub-folders."""
    return any((d / "state.json").is_file() and any(d.glob("*.arrow")) for d in (p, *p.iterdir()) if d.is_dir())


def _data_files(p: Path) -> list[Path]:
    return sorted(f for f in p.rglob("*") if f.suffix in DATA_SUFFIXES and f.is_file())


def jsonl_for_path(p: Path, split: str | None) -> dict | None:
    """A JSON file, or a folder of only .jsonl (or only .json) files that are no hub shards: read
    strictly, as validate does."""
    if p.is_file():
        return {"path": str(p.resolve())} if p.suffix in JSONL_SUFFIXES else None
    if _saved_dataset(p):
        return None
    files = _data_files(p)
    if not files or any(_SHARD.match(f.name) for f in files):
        return None
    if all(f.suffix == ".jsonl" for f in files) or all(f.suffix == ".json" for f in files):
        return {"path": str(p.resolve())}
    return None


def hf_for_path(p: Path, split: str | None) -> dict | None:
    """A ``save_to_disk`` folder, a folder of data files (only ``split``'s shards of a hub
    folder), or a csv, parquet or JSON file."""
    if p.is_dir() and _saved_dataset(p):  # (or a folder of them, one per split)
        return {"path": str(p.resolve()), "split": split or "train"}
    if p.is_dir():
        files = _data_files(p)
        if not files:
            return None
        shards = [f for f in files if _SHARD.match(f.name)]
        if shards:
            splits = sorted({_SHARD.match(f.name)["split"] for f in shards})
            want = split if split in splits else (splits[0] if len(splits) == 1 else None)
            if want is None:
                raise GageError(f"--data: {p} holds shards of splits {', '.join(splits)} but the task "
                                f"reads split {split!r}; point at one file or folder")
            files = [f for f in shards if _SHARD.match(f.name)["split"] == want]
        kinds = {f.suffix for f in files}
        if len(kinds) > 1:
            raise GageError(f"--data: {p} mixes file types {sorted(kinds)}; point at one kind")
        fmt = files[0].suffix.lstrip(".")
        return {"path": "json" if fmt == "jsonl" else fmt, "data_files": [str(f.resolve()) for f in files],
                "split": "train", "streaming": True}
    fmt = {".json": "json", ".csv": "csv", ".parquet": "parquet"}.get(p.suffix)
    if fmt is None:
        return None
    return {"path": fmt, "data_files": [str(p.resolve())], "split": "train", "streaming": True}
