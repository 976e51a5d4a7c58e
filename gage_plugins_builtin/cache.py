"""The response cache (``--cache DIR``): model outputs kept in ``DIR/responses.sqlite`` and reused
by any later run that asks the same model the same thing. :class:`CachedBackend` wraps the
model's backend and the judge's (``gage_wrap_backend``): the one place where requests are
looked up and replies stored.

The key of a response is the sha256 of

- the model's identity: the backend's registered name, its ``model_id`` and its ``settings()``
  (redacted by ``gage_eval.api.secrets.redact``, without the settings that only change how
  requests are sent: those the backend declares as ``transport_args``), the run's seed, and for a weights path on this machine
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
nor a malformed one, nor one that quoted a secret (the core's ``BackendUse.keeps`` says which): a
hit must return what the model said, not its masked copy. The file holds hashes, outputs and, per model identity, its
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
from typing import Any, Iterable, Iterator, Mapping, Sequence

try:
    import orjson as _orjson
except ImportError:  # pragma: no cover - orjson is a dependency; json stands in without it
    _orjson = None

from gage_eval.api import Backend, FatalBackendError, GageError, ModelOutput, OutputError, Request, running
from gage_eval.api import secrets as secret_rules

from gage_plugins_builtin.backends.gguf_cache import file_sha256

FILE_NAME = "responses.sqlite"
FORMAT = "1"  # the stored format; another value in a file's meta table is refused
BUSY_TIMEOUT_MS = 60_000
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


class CacheError(OutputError):
    """The cache file became unreadable or unwritable during the run: the run stops, as for any
    output it cannot write (the rows written so far are kept), with the exit status of an
    unreadable cache at the start, 2."""

    exit_code = GageError.exit_code


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
        return ModelCache(self, identity)

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

    def __init__(self, cache: ResponseCache, identity: str):
        self.cache = cache
        self.identity = identity
        self._media: dict[tuple, str] = {}

    def key(self, request: Request) -> str:
        body = {"kind": request.kind, "prompt": request.prompt, "messages": request.messages,
                "continuations": list(request.continuations), "chat": request.chat, "gen": request.gen,
                "modalities": sorted(request.modalities)}
        if request.tools:  # (a request without tools keeps the key it had before tools existed)
            body["tools"], body["tool_choice"] = request.tools, request.tool_choice
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

    def row(self, key: str, out: ModelOutput) -> tuple[str, str]:
        """What :meth:`put` stores for an output the backend gave (serialized at once, before a
        later stage can touch it)."""
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
                self._media[memo] = file_sha256(Path(path))
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
    transport = set(getattr(backend, "transport_args", ()) or ())  # how requests travel, not what is answered
    settings = {k: v for k, v in settings.items() if k not in transport}
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
    return secret_rules.redact(description, tuple(secrets))


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


class CachedBackend(Backend):
    """A backend seen through the cache: each request is looked up first, hits are answered at
    once, only misses reach the backend, and the misses' replies the run may keep
    (``use.keeps``) are stored. Counts hits and misses per task (``cache`` in summary.json; the
    judge's as ``judge_hits``, ``judge_misses``)."""

    def __init__(self, backend: Backend, use: running.BackendUse):
        self.inner, self.use = backend, use
        self.max_batch = getattr(backend, "max_batch", 64)  # (the engine sizes judge chunks by these)
        self.concurrency = getattr(backend, "concurrency", None)
        self.cache = ResponseCache(use.options["cache"])  # a bad cache file stops the run here (exit 2)
        self.view: ModelCache | None = None
        self.prefix = "" if use.role == "model" else f"{use.role}_"
        use.tally.declare("cache", ("hits", "misses") if use.role == "model" else (),
                          {"path": str(self.cache.path)})

    def _bound(self) -> ModelCache:
        if self.view is None:  # keyed by the settings after open(): bound at the first request
            self.view = self.cache.bind(self.inner, self.use.name, self.use.seed, self.use.secrets)
        return self.view

    def _lookup(self, requests: Sequence[Request]) -> tuple[list[str], dict[str, ModelOutput], list[int]]:
        view = self._bound()
        keys = [view.key(r) for r in requests]
        stored = view.lookup(keys)
        misses = [j for j, key in enumerate(keys) if key not in stored]
        self.use.tally.add("cache", self.prefix + "hits", len(requests) - len(misses))
        self.use.tally.add("cache", self.prefix + "misses", len(misses))
        return keys, stored, misses

    def _kept(self, request: Request, key: str, out: Any) -> tuple[str, str] | None:
        return self._bound().row(key, out) if self.use.keeps(request, out) else None

    def stream(self, requests: Sequence[Request]) -> Iterator[tuple[int, ModelOutput]]:
        keys, stored, misses = self._lookup(requests)
        for j, key in enumerate(keys):
            if key in stored:
                yield j, stored[key]
        answered: list[tuple[str, str]] = []  # (key, stored text) of the replies to keep
        seen: set[int] = set()
        done = False
        try:
            if misses:
                inner = getattr(self.inner, "stream", None)
                part = [requests[j] for j in misses]
                for m, out in (inner(part) if inner is not None else enumerate(self.inner.run(part))):
                    if not isinstance(m, int) or not 0 <= m < len(misses) or m in seen:
                        continue  # (the engine would drop it: a reply to no request, or a second one)
                    seen.add(m)
                    row = self._kept(requests[misses[m]], keys[misses[m]], out)
                    if row is not None:
                        answered.append(row)
                    yield misses[m], out
            done = True
        finally:
            self._put(answered, done)

    def run(self, requests: Sequence[Request]) -> list[ModelOutput]:
        keys, stored, misses = self._lookup(requests)
        replies: list[Any] = [stored.get(key) for key in keys]
        if misses:
            part = [requests[j] for j in misses]
            try:
                outs = _safe_run(self.inner, part)
            except FatalBackendError as exc:
                exc.outputs = replies  # the hits stand; the engine gives the rest the stop's message
                raise
            answered = []
            for j, out in zip(misses, outs):
                replies[j] = out
                row = self._kept(requests[j], keys[j], out)
                if row is not None:
                    answered.append(row)
            self._put(answered, True)
        return replies

    def _put(self, rows: list[tuple[str, str]], done: bool) -> None:
        """Store ``rows``; when the stream did not finish (an interrupt, a stop) the exception
        under way wins over a failing write."""
        try:
            self._bound().put(rows)
        except GageError:
            if done:
                raise

    def close(self) -> None:
        self.cache.close()


def _safe_run(backend: Any, requests: list) -> list[ModelOutput]:
    """The misses' replies as the engine's judge path takes a backend's: an exception other than
    a GageError, or a wrong count, becomes every request's error."""
    try:
        outputs = backend.run(requests)
    except GageError:
        raise
    except Exception as exc:
        return [ModelOutput(error=f"{type(exc).__name__}: {exc}") for _ in requests]
    if len(outputs) != len(requests):
        msg = f"backend returned {len(outputs)} outputs for {len(requests)} requests"
        return [ModelOutput(error=msg) for _ in requests]
    return list(outputs)
