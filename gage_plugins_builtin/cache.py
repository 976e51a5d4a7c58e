"""The response cache (``--cache DIR``): model outputs kept in ``DIR/responses.sqlite`` and reused
by any later run that asks the same model the same thing.

The key of a response is the sha256 of

- the model's identity: the backend's registered name, its ``model_id`` and its ``settings()``
  (redacted by :func:`gage_eval.api.secrets.redact`, without the settings that only change how
  requests are sent: :data:`TRANSPORT`), the run's seed, and for a weights path on this machine
  the names, sizes and modification times of its files;
- the request: kind, prompt or messages, continuations, chat, generation settings and
  modalities, and for each local media file in the messages the sha256 of its content (a URL by
  its string). The sample id is not part of it: another task, or another metric, with the same
  prompts reuses the responses.

The backend's secrets (its key, every header value, URL user-info: what routes a request through
a gateway may choose the model, ``header_X-Model=gpt-big``) are part of the identity too, but
only as a slow salted hash (:func:`_secrets_digest`) mixed into the identity's sha256: never in
clear, and the stored description is redacted.

The value is the :class:`~gage_eval.api.backend.ModelOutput` as JSON (its fields, latency included:
a reused row is written as it was first written). An output with ``error`` set is never stored,
nor one that quoted a secret (:func:`gage_eval.engine.replies.scrub_output`): a hit must return what
the model said, not its masked copy. The file holds hashes, outputs and, per model identity, its
redacted description (table ``models``): never a secret in clear. It runs in WAL mode with a
busy timeout, so several runs may share one cache at once. A file that is no readable cache, or
an SQLite file holding tables of its own, is a usage error naming it (exit 2), left unchanged; a
cache that becomes unreadable during a run stops it the same way (:class:`CacheError`), the rows
written so far kept for ``--resume``.
"""
from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

try:
    import orjson as _orjson
except ImportError:  # pragma: no cover - orjson is a dependency; json stands in without it
    _orjson = None

from gage_eval.api.backend import ModelOutput, Request
from gage_eval.api.errors import EXIT_USAGE, GageError
from gage_eval.api.secrets import redact
from gage_eval.engine.replies import scrub_output
from gage_eval.runfolder.rundir import file_digest

FILE_NAME = "responses.sqlite"
FORMAT = "1"  # the stored format; another value in a file's meta table is refused
BUSY_TIMEOUT_MS = 60_000
# settings that change how requests travel, not what the model answers: left out of the key
TRANSPORT = frozenset({
    "batch_size", "concurrency", "timeout_s", "connect_timeout_s", "read_timeout_s", "max_retries", "backoff_s",
    "backoff_max_s", "max_response_bytes", "max_consecutive_failures", "breaker_seconds", "stream", "proxy",
    "api_key_env", "authenticated", "auth_scheme", "extra_headers", "gguf_cache", "gguf_cache_folder",
    "endpoint_backoff_s", "endpoint_backoff_max_s",
})
WEIGHT_KEYS = ("pretrained", "gguf_file", "tokenizer")  # settings that may name local weights
_OUTPUT_FIELDS = tuple(ModelOutput.__dataclass_fields__)
_COLUMNS = {"meta": {"name", "value"}, "models": {"identity", "description"},
            "responses": {"key", "identity", "output", "created"}}
SECRET_ROUNDS = 100_000  # pbkdf2 rounds of the secrets' digest: a guessed header value costs that much to test
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS models (identity TEXT PRIMARY KEY, description TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS responses (key TEXT PRIMARY KEY, identity TEXT NOT NULL, output TEXT NOT NULL,"
    " created REAL NOT NULL)",
)


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_plain)


def _value_json(value: Any) -> str:
    """A stored output as JSON (orjson when installed: any valid JSON will do, unlike a key)."""
    if _orjson is not None:
        try:
            return _orjson.dumps(value).decode("utf-8")
        except TypeError:  # (a raw payload orjson cannot write: the general writer below)
            pass
    return json.dumps(value, ensure_ascii=False, default=_plain)


def _plain(value: Any) -> Any:
    if isinstance(value, (set, frozenset)):
        return sorted(map(str, value))
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, (tuple, list)):
        return list(value)
    return repr(value)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class CacheError(GageError):
    """The cache file became unreadable or unwritable during the run: the run stops (the rows
    written so far are kept) with the exit status of an unreadable cache at the start, 2."""

    exit_code = EXIT_USAGE


def _check_tables(path: Path, folder: Path) -> None:
    """Refuse, before anything is written to it, an SQLite file that holds anything but the
    cache's own tables (another program's database), read through a read-only connection so that
    not even a journal checkpoint touches it. Not an SQLite file: sqlite3.DatabaseError."""
    db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_MS / 1000)
    try:
        objects = db.execute("SELECT type, name FROM sqlite_master").fetchall()
        others = sorted({name for kind, name in objects
                         if not name.startswith("sqlite_") and not (kind == "table" and name in _COLUMNS)})
        if others:
            raise GageError(f"--cache {folder}: {path} is not a gage-eval response cache: it holds other tables "
                            f"({', '.join(others)}); it was left unchanged: give another folder")
        for kind, name in objects:
            if kind == "table" and name in _COLUMNS:
                columns = {row[1] for row in db.execute(f"PRAGMA table_info({name})")}
                if columns != _COLUMNS[name]:
                    raise sqlite3.DatabaseError(f"its table {name} has the columns {', '.join(sorted(columns))}")
    finally:
        db.close()


class ResponseCache:
    """One cache file, opened once per run; :meth:`bind` gives the view of one model."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        self.path = self.folder / FILE_NAME
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise GageError(f"--cache {self.folder}: cannot create the folder ({exc.strerror or exc})") from None
        self.db: sqlite3.Connection | None = None
        try:
            if self.path.is_file() and self.path.stat().st_size:
                _check_tables(self.path, self.folder)
            self.db = sqlite3.connect(str(self.path), timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None,
                                      check_same_thread=False)
            self.db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            self._setup_when_free()
        except (sqlite3.Error, OSError) as exc:
            self.close()
            raise GageError(f"--cache {self.folder}: {self.path} is not a readable response cache ({exc}); "
                            f"delete it or give another folder") from None
        except BaseException:
            self.close()
            raise

    def _setup_when_free(self) -> None:
        """:meth:`_setup`, tried again while another process holds the file: SQLite answers a
        change of journal mode (two runs creating one cache at once) with "database is locked"
        at once, without waiting the busy timeout."""
        import random
        import time

        deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
        while True:
            try:
                return self._setup()
            except sqlite3.OperationalError as exc:
                busy = "locked" in str(exc) or "busy" in str(exc)
                if not busy or time.monotonic() > deadline:
                    raise
                time.sleep(0.02 + random.random() * 0.08)

    def _setup(self) -> None:
        db = self.db
        assert db is not None
        if str(db.execute("PRAGMA journal_mode=WAL").fetchone()[0]).lower() != "wal":
            raise sqlite3.DatabaseError("it cannot be put in WAL mode")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("BEGIN IMMEDIATE")
        try:
            for statement in _SCHEMA:
                db.execute(statement)
            db.execute("INSERT OR IGNORE INTO meta (name, value) VALUES ('format', ?)", (FORMAT,))
            found = db.execute("SELECT value FROM meta WHERE name = 'format'").fetchone()[0]
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        if found != FORMAT:
            raise sqlite3.DatabaseError(f"its format is {found!r}, this gage-eval writes {FORMAT!r}")
        db.execute("SELECT key FROM responses LIMIT 1").fetchall()  # a damaged table fails here, not mid-run

    def bind(self, backend: Any, name: str, seed: int, secrets: Sequence[str] = ()) -> "ModelCache":
        """The cache of one model: ``backend`` as opened (its settings after ``open()``), its
        registered ``name`` (``--model``) and the run's ``seed``."""
        description = model_identity(backend, name, seed, secrets)
        own = tuple(getattr(backend, "secrets", ()) or ())  # (not the judge's, nor a writer's)
        identity = _sha(_canonical(description) + (f"\n{_secrets_digest(own)}" if any(own) else ""))
        self._write([("INSERT OR IGNORE INTO models (identity, description) VALUES (?, ?)",
                      [(identity, _canonical(description))])])
        return ModelCache(self, identity, tuple(s for s in secrets if s))

    def get(self, keys: Sequence[str]) -> dict[str, str]:
        found: dict[str, str] = {}
        try:
            for start in range(0, len(keys), 500):
                part = keys[start:start + 500]
                marks = ",".join("?" * len(part))
                found.update(self.db.execute(f"SELECT key, output FROM responses WHERE key IN ({marks})", part))
        except sqlite3.Error as exc:
            raise self._broken("reading", exc) from None
        return found

    def _broken(self, doing: str, exc: Exception) -> CacheError:
        return CacheError(f"--cache {self.folder}: {doing} {self.path} failed during the run ({exc}); the rows "
                          f"written so far are kept: delete the file or give another --cache folder, then continue "
                          f"with --resume")

    def put(self, identity: str, rows: Iterable[tuple[str, str]]) -> None:
        now = time.time()
        rows = [(key, identity, output, now) for key, output in rows]
        if rows:
            self._write([("INSERT OR REPLACE INTO responses (key, identity, output, created) VALUES (?, ?, ?, ?)",
                          rows)])

    def _write(self, statements: list[tuple[str, list[tuple]]]) -> None:
        """One transaction; BEGIN IMMEDIATE takes the write lock first, so a second run waits
        (busy timeout) instead of failing on a read lock it cannot upgrade."""
        db = self.db
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                for sql, rows in statements:
                    db.executemany(sql, rows)
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise self._broken("writing", exc) from None

    def close(self) -> None:
        if self.db is not None:
            try:
                self.db.close()
            except sqlite3.Error:
                pass
            self.db = None


class ModelCache:
    """The responses of one model identity: :meth:`lookup` before the backend; :meth:`row` of
    each output as it arrives, :meth:`put` of those rows after."""

    def __init__(self, cache: ResponseCache, identity: str, secrets: tuple[str, ...]):
        self.cache = cache
        self.identity = identity
        self.secrets = secrets
        self._media: dict[tuple, str] = {}

    def key(self, request: Request) -> str:
        body = {"kind": request.kind, "prompt": request.prompt, "messages": request.messages,
                "continuations": list(request.continuations), "chat": request.chat, "gen": request.gen,
                "modalities": sorted(request.modalities)}
        media = self._media_digests(request.messages) if request.messages else None
        if media:
            body["media"] = media
        return _sha(self.identity + "\n" + _canonical(body))

    def lookup(self, keys: Sequence[str]) -> dict[str, ModelOutput]:
        """The stored outputs of those ``keys`` that have one."""
        out = {}
        for key, text in self.cache.get(list(dict.fromkeys(keys))).items():
            try:
                data = json.loads(text)
                out[key] = ModelOutput(**{k: v for k, v in data.items() if k in _OUTPUT_FIELDS})
            except (ValueError, TypeError):  # a damaged entry is a miss; the new answer replaces it
                continue
        return out

    def row(self, key: str, out: ModelOutput) -> tuple[str, str] | None:
        """What :meth:`put` stores for an output as the backend gave it; None for one that is not
        kept: an error, no ModelOutput, or one quoting a secret (written masked, so a hit would
        return the mask, not the answer)."""
        if not isinstance(out, ModelOutput) or out.error or scrub_output(out, self.secrets)[1]:
            return None
        return key, _value_json(out.to_dict())

    def put(self, rows: Iterable[tuple[str, str]]) -> None:
        self.cache.put(self.identity, rows)

    def _media_digests(self, messages: Any) -> list[str]:
        """sha256 of each local file a ``url``/``path`` in the messages names (in order)."""
        found: list[str] = []

        def walk(value: Any) -> None:
            if isinstance(value, Mapping):
                for k, v in value.items():
                    if k in ("url", "path") and isinstance(v, str) and not v.startswith(("data:", "http://",
                                                                                           "https://")):
                        digest = self._file_digest(v[7:] if v.startswith("file://") else v)
                        if digest:
                            found.append(digest)
                    else:
                        walk(v)
            elif isinstance(value, (list, tuple)):
                for v in value:
                    walk(v)

        walk(messages)
        return found

    def _file_digest(self, path: str) -> str | None:
        try:
            st = os.stat(path)
        except (OSError, ValueError):
            return None
        memo = (path, st.st_size, st.st_mtime_ns)
        if memo not in self._media:
            try:
                self._media[memo] = file_digest(Path(path))
            except OSError:
                return None
        return self._media[memo]


def _secrets_digest(secrets: Sequence[str]) -> str:
    """The backend's secrets as part of its identity: pbkdf2 (slow, so the stored identity hash is
    no cheap test of a guessed header value), over each distinct value, in a fixed order."""
    material = _canonical(sorted({str(s) for s in secrets if s})).encode("utf-8")
    return hashlib.pbkdf2_hmac("sha256", material, b"gage-eval response cache", SECRET_ROUNDS).hex()


def model_identity(backend: Any, name: str, seed: int, secrets: Sequence[str] = ()) -> dict:
    """What decides a model's answers, as far as gage-eval can tell, with no secret in it."""
    try:
        settings = dict(backend.settings() or {})
    except Exception:  # a backend whose settings fail: its name and model id still key it
        settings = {}
    settings = {k: v for k, v in settings.items() if k not in TRANSPORT}
    weights = {}
    for k in WEIGHT_KEYS:
        value = settings.get(k)
        if isinstance(value, str) and value:
            stamp = _weights_stamp(Path(value).expanduser())
            if stamp:
                weights[k] = stamp
    cls = type(getattr(backend, "wrapped", None) or backend)  # a replicated backend is keyed as the one it runs
    description = {"backend": name, "class": f"{cls.__module__}.{cls.__qualname__}",
                   "model_id": str(getattr(backend, "model_id", "unknown")), "settings": settings, "seed": seed}
    if weights:
        description["weights"] = weights
    return redact(description, tuple(secrets))


def _weights_stamp(path: Path, most: int = 5000) -> list | None:
    """Names, sizes and modification times of a local weights file or folder (None: not local)."""
    try:
        if path.is_file():
            st = path.stat()
            return [[path.name, st.st_size, st.st_mtime_ns]]
        if path.is_dir():
            out = []
            for p in sorted(path.rglob("*"))[:most]:
                if p.is_file():
                    st = p.stat()
                    out.append([str(p.relative_to(path)), st.st_size, st.st_mtime_ns])
            return out
    except OSError:
        return None
    return None
