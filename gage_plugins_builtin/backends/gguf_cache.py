"""A cache of GGUF checkpoints converted to plain float32 Hugging Face folders.

transformers converts a GGUF file on every load (for SmolLM2-135M about 20-30 s: it parses
the file three times and dequantizes every tensor); the same weights load from safetensors
in well under a second. So the transformers backend converts a GGUF once and keeps the
result here:

    $GAGE_EVAL_CACHE, else $XDG_CACHE_HOME/gage-eval, else ~/.cache/gage-eval
      gguf/<sha256 of the GGUF, 16 hex>-tf<transformers>-gguf<gguf>/   one converted model
          model.safetensors, config.json, generation_config.json,
          tokenizer.json, tokenizer_config.json, chat_template.jinja, ...
          gage-cache.json     the manifest: the GGUF's full sha256 and size, the package
                              versions, and every file's size and sha256
      gguf/.locks/<entry>.lock one writer at a time per entry
      gguf-hashes.json        memo of GGUF hashes by (path, device, inode, size, mtime, ctime)

Contract:

- An entry is used only when its manifest names the same GGUF (full sha256) and every file
  it lists is present with the listed size and sha256, and no unlisted file is there.
  Anything else (a missing, truncated, altered or extra file, a bad manifest) is reported
  as a warning and the entry is rebuilt; a wrong model is never loaded.
- An entry is written in a temporary folder beside it and renamed into place whole, the
  manifest last. The backend holds the entry's lock (``Slot.locked``: ``fcntl.flock``,
  released by the kernel if the process dies) from before it converts until the entry is
  written, so two runs starting together convert once: the second waits, then loads what
  the first wrote. Without the lock (no ``fcntl``, or after waiting too long) the first
  rename wins and a loser's folder is thrown away.
- A cache folder that cannot be written degrades to loading the GGUF directly, with one
  warning; a valid entry in a read-only cache is still used.
- The entry is keyed by the GGUF's content and the transformers and gguf versions that
  converted it, so an upgrade converts again (old entries stay until removed by hand).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

ENV = "GAGE_EVAL_CACHE"
FORMAT = 1
MANIFEST = "gage-cache.json"
HASH_MEMO = "gguf-hashes.json"
LOCK_WAIT_S = 600.0  # longer than any conversion; after that, write without the lock
_CHUNK = 1 << 22


def cache_root(environ: Any = None) -> Path:
    """The user's cache folder for gage-eval (see the module docstring)."""
    env = os.environ if environ is None else environ
    if env.get(ENV):
        return Path(env[ENV]).expanduser()
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]).expanduser() / "gage-eval"
    return Path.home() / ".cache" / "gage-eval"


def warn(message: str) -> None:
    print(f"gage-eval: warning: {message}", file=sys.stderr, flush=True)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while True:
            block = fh.read(_CHUNK)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


def _file_identity(path: Path) -> list:
    st = path.stat()
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def gguf_sha256(path: Path, root: Path) -> str:
    """The GGUF's sha256, remembered in ``root/gguf-hashes.json`` by the file's identity
    (device, inode, size, mtime, ctime: ctime changes whenever the file does)."""
    path = path.resolve()
    memo_path = root / HASH_MEMO
    ident = _file_identity(path)
    try:
        memo = json.loads(memo_path.read_text())
        if not isinstance(memo, dict):
            memo = {}
    except (OSError, ValueError):
        memo = {}
    known = memo.get(str(path))
    if isinstance(known, dict) and known.get("id") == ident and isinstance(known.get("sha256"), str):
        return known["sha256"]
    digest = file_sha256(path)
    memo[str(path)] = {"id": ident, "sha256": digest}
    try:  # a memo only: not being able to write it costs a re-hash next time, nothing else
        root.mkdir(parents=True, exist_ok=True)
        _write_atomic(memo_path, json.dumps(memo, indent=1, sort_keys=True))
    except OSError:
        pass
    return digest


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for dist in ("transformers", "gguf", "torch", "safetensors"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = None
    return out


def entry_name(sha256: str, versions: dict) -> str:
    return f"{sha256[:16]}-tf{versions.get('transformers')}-gguf{versions.get('gguf')}"


def check_folder(folder: Path, sha256: str) -> str | None:
    """None when ``folder`` is a complete entry for the GGUF with this sha256, else what is wrong."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except FileNotFoundError:
        return f"no {MANIFEST}"
    except (OSError, ValueError) as exc:
        return f"unreadable {MANIFEST}: {exc}"
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        return f"{MANIFEST} is not format {FORMAT}"
    if (manifest.get("gguf") or {}).get("sha256") != sha256:
        return f"{MANIFEST} names another GGUF"
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        return f"{MANIFEST} lists no files"
    try:
        present = {p.name for p in folder.iterdir()} - {MANIFEST}
    except OSError as exc:
        return f"cannot list the folder: {exc}"
    if present - set(files):
        return f"unexpected file(s): {', '.join(sorted(present - set(files)))}"
    for name, meta in sorted(files.items()):
        path = folder / name
        if "/" in name or name.startswith(".") or not isinstance(meta, dict):
            return f"{MANIFEST} has a bad entry {name!r}"
        try:
            size = path.stat().st_size
        except OSError:
            return f"{name} is missing"
        if size != meta.get("size"):
            return f"{name} has {size} bytes, expected {meta.get('size')}"
        try:
            if file_sha256(path) != meta.get("sha256"):
                return f"{name} does not match its sha256"
        except OSError as exc:
            return f"cannot read {name}: {exc}"
    return None


def write_manifest(folder: Path, gguf: Path, sha256: str, versions: dict) -> None:
    files = {}
    for path in sorted(folder.iterdir()):
        if path.name == MANIFEST:
            continue
        if not path.is_file():
            raise OSError(f"{path} is not a plain file")
        files[path.name] = {"size": path.stat().st_size, "sha256": file_sha256(path)}
    manifest = {"format": FORMAT, "gguf": {"name": gguf.name, "sha256": sha256, "size": gguf.stat().st_size},
                "versions": versions, "dtype": "float32", "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "files": files}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))


def _fingerprint(folder: Path) -> tuple | None:
    """What a re-check compares: the folder's and its files' identities (None: no folder)."""
    try:
        files = sorted((p.name, st.st_ino, st.st_size, st.st_mtime_ns)
                       for p in folder.iterdir() for st in (p.stat(),))
        return (folder.stat().st_ino, tuple(files))
    except OSError:
        return None


def publish(tmp: Path, final: Path, sha256: str) -> Path:
    """Rename the finished folder ``tmp`` to ``final``. When ``final`` is already a valid entry
    (another writer was first) ``tmp`` is thrown away; a damaged ``final`` is moved aside first."""
    for _ in range(3):
        try:
            os.rename(tmp, final)
            return final
        except OSError:
            if not final.exists():
                raise
        if check_folder(final, sha256) is None:
            shutil.rmtree(tmp, ignore_errors=True)
            return final
        trash = final.with_name(f".trash-{final.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        try:
            os.rename(final, trash)
        except FileNotFoundError:
            continue
        shutil.rmtree(trash, ignore_errors=True)
    raise OSError(f"could not move {tmp} to {final}")


@dataclass
class Slot:
    """One GGUF's place in the cache, found by :func:`lookup`."""

    root: Path
    gguf: Path
    sha256: str
    versions: dict
    folder: Path
    problem: str | None  # why the existing folder cannot be used; None when it is absent or valid
    exists: bool
    _checked: tuple | None = None  # the folder's fingerprint when problem/exists were found
    _held: bool = False

    @property
    def ready(self) -> bool:
        return self.exists and self.problem is None

    def refresh(self) -> bool:
        """Check the folder again if it changed since the last check; whether it is ready now."""
        fingerprint = _fingerprint(self.folder)
        if fingerprint != self._checked:
            self.exists = fingerprint is not None
            self.problem = check_folder(self.folder, self.sha256) if self.exists else None
            self._checked = fingerprint
        return self.ready

    @contextmanager
    def locked(self) -> Iterator[bool]:
        """Hold the entry's writer lock (True), waiting while another process holds it (it is
        converting the same GGUF). Goes on without it (False) where the lock cannot be taken:
        no ``fcntl``, a cache folder that cannot be written, a holder past LOCK_WAIT_S.
        Re-entrant within this slot."""
        if self._held:
            yield True
            return
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX
            yield False
            return
        try:
            (self.folder.parent / ".locks").mkdir(parents=True, exist_ok=True)
            fh = open(self.folder.parent / ".locks" / f"{self.folder.name}.lock", "a+b")
        except OSError:
            yield False  # the write that follows fails and says why, once
            return
        try:
            deadline = time.monotonic() + LOCK_WAIT_S
            while True:
                try:
                    fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    self._held = True
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.2)
            yield self._held
        finally:
            self._held = False
            fh.close()  # closing releases the lock

    def discard(self) -> None:
        """Move the entry out of the way (it passed its check but would not load)."""
        trash = self.folder.with_name(f".trash-{self.folder.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        try:
            os.rename(self.folder, trash)
        except OSError:
            return
        shutil.rmtree(trash, ignore_errors=True)
        self.refresh()

    def build(self, write: Callable[[Path], None]) -> Path | None:
        """Fill the entry: under the entry's lock, ``write(tmp_folder)`` saves the model there,
        the manifest is added and the folder renamed into place. Returns the entry's folder,
        or None (after one warning) when the cache cannot be written; the caller's model is
        then used as it is. When the entry is valid by then (another process filled it),
        ``write`` is not called."""
        parent = self.folder.parent
        tmp = None
        try:
            with self.locked() as held:
                if self.refresh():
                    return self.folder
                if held:
                    for old in parent.glob(f".tmp-{self.folder.name}-*"):
                        shutil.rmtree(old, ignore_errors=True)  # left by a writer that died
                tmp = parent / f".tmp-{self.folder.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
                tmp.mkdir(parents=True)
                write(tmp)
                write_manifest(tmp, self.gguf, self.sha256, self.versions)
                publish(tmp, self.folder, self.sha256)
                self.refresh()
                return self.folder
        except Exception as exc:  # noqa: BLE001 - any failure to write leaves the caller's model in use
            warn(f"could not write the GGUF cache in {parent} ({type(exc).__name__}: {exc}); the model "
                 f"is converted from the GGUF again next time (gguf_cache=false turns the cache off)")
            return None
        finally:
            if tmp is not None and tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)


def lookup(gguf: Path, root: Path | None = None) -> Slot:
    """The cache slot of ``gguf``: its entry folder, checked (sizes and sha256 of every file)."""
    root = cache_root() if root is None else root
    sha = gguf_sha256(gguf, root)
    versions = _versions()
    slot = Slot(root=root, gguf=gguf.resolve(), sha256=sha, versions=versions,
                folder=root / "gguf" / entry_name(sha, versions), problem=None, exists=False)
    slot.refresh()
    return slot


def lookup_in_background(gguf: Path, root: Path | None = None) -> Callable[[], Slot]:
    """Run :func:`lookup` on a daemon thread; the returned function waits for its slot (or raises
    its error)."""
    import threading

    result: list = []

    def work() -> None:
        try:
            result.append((lookup(gguf, root), None))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            result.append((None, exc))

    thread = threading.Thread(target=work, name="gguf-cache-check", daemon=True)
    thread.start()

    def wait() -> Slot:
        thread.join()
        slot, exc = result[0]
        if exc is not None:
            raise exc
        return slot

    return wait


def save_converted(model: Any, tokenizer: Any, folder: Path) -> None:
    """Save a model transformers converted from a GGUF (and its tokenizer) as a plain folder.

    The GGUF loader leaves its quantizer on the model and its quantization_config on the
    config although the weights are already dequantized; they are lifted off for the save
    (transformers refuses to save a "quantized" model) and put back after."""
    from transformers.utils import logging as hf_logging

    lifted = []
    for obj, names in ((model, ("hf_quantizer", "is_quantized", "quantization_method")),
                       (model.config, ("quantization_config", "_is_quantized"))):
        for name in names:
            if name in obj.__dict__:
                lifted.append((obj, name, obj.__dict__.pop(name)))
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(folder, safe_serialization=True)
        tokenizer.save_pretrained(folder)
    finally:
        for obj, name, value in lifted:
            obj.__dict__[name] = value
        if bars:
            hf_logging.enable_progress_bar()
    config = json.loads((folder / "config.json").read_text())
    if "quantization_config" in config:
        raise ValueError("the saved config still has a quantization_config")
