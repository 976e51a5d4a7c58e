"""The GGUF cache (gage_plugins_builtin/backends/gguf_cache.py): the folder rules on small fake
entries, then the real SmolLM2 GGUF converted once and loaded back to equal log-likelihoods.

Every test points GAGE_EVAL_CACHE at its own temporary folder."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gage_eval.api.backend import LOGLIKELIHOOD, Request
from gage_plugins_builtin.backends import gguf_cache

ROOT = Path(__file__).resolve().parents[2]


def _fake_gguf(tmp_path: Path, content: bytes = b"GGUF fake weights " * 100) -> Path:
    path = tmp_path / "src" / "model.gguf"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


def _writer(calls: list | None = None):
    def write(folder: Path) -> None:
        if calls is not None:
            calls.append(folder)
        (folder / "model.safetensors").write_bytes(bytes(range(256)) * 64)
        (folder / "config.json").write_text('{"model_type": "fake"}')
    return write


def test_cache_root_follows_the_environment(tmp_path):
    assert gguf_cache.cache_root({"GAGE_EVAL_CACHE": str(tmp_path / "a"), "XDG_CACHE_HOME": "/x"}) == tmp_path / "a"
    assert gguf_cache.cache_root({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "gage-eval"
    assert gguf_cache.cache_root({}) == Path.home() / ".cache" / "gage-eval"


def test_gguf_hash_is_remembered_and_follows_a_change(tmp_path):
    import hashlib

    gguf = _fake_gguf(tmp_path)
    root = tmp_path / "cache"
    assert gguf_cache.gguf_sha256(gguf, root) == hashlib.sha256(gguf.read_bytes()).hexdigest()
    memo = json.loads((root / gguf_cache.HASH_MEMO).read_text())
    assert memo[str(gguf.resolve())]["sha256"] == hashlib.sha256(gguf.read_bytes()).hexdigest()
    # same size and mtime, other bytes: the ctime in the file's identity changes, so it is hashed again
    st = gguf.stat()
    gguf.write_bytes(b"X" + gguf.read_bytes()[1:])
    os.utime(gguf, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert gguf_cache.gguf_sha256(gguf, root) == hashlib.sha256(gguf.read_bytes()).hexdigest()


def test_build_then_reuse(tmp_path):
    gguf, root = _fake_gguf(tmp_path), tmp_path / "cache"
    slot = gguf_cache.lookup(gguf, root)
    assert not slot.exists and not slot.ready and slot.problem is None
    calls: list = []
    assert slot.build(_writer(calls)) == slot.folder
    assert len(calls) == 1 and not calls[0].exists()  # written in a temporary folder, renamed into place
    manifest = json.loads((slot.folder / gguf_cache.MANIFEST).read_text())
    assert manifest["gguf"]["sha256"] == slot.sha256
    assert set(manifest["files"]) == {"model.safetensors", "config.json"}
    again = gguf_cache.lookup(gguf, root)
    assert again.ready and again.folder == slot.folder
    assert not list(slot.folder.parent.glob(".tmp-*"))
    # another GGUF gets another entry
    other = gguf_cache.lookup(_fake_gguf(tmp_path / "b", b"other weights"), root)
    assert other.folder != slot.folder and not other.exists


@pytest.mark.parametrize("damage, expected", [
    ("truncate", "has .* bytes"),
    ("flip", "does not match its sha256"),
    ("remove", "is missing"),
    ("extra", "unexpected file"),
    ("manifest", "no gage-cache.json"),
    ("bad_manifest", "unreadable"),
    ("other_gguf", "names another GGUF"),
])
def test_damaged_entry_is_detected_and_rebuilt(tmp_path, damage, expected):
    gguf, root = _fake_gguf(tmp_path), tmp_path / "cache"
    folder = gguf_cache.lookup(gguf, root).build(_writer())
    weights, manifest = folder / "model.safetensors", folder / gguf_cache.MANIFEST
    if damage == "truncate":
        weights.write_bytes(weights.read_bytes()[:-10])
    elif damage == "flip":
        data = bytearray(weights.read_bytes())
        data[len(data) // 2] ^= 1
        weights.write_bytes(bytes(data))
    elif damage == "remove":
        weights.unlink()
    elif damage == "extra":
        (folder / "model.safetensors.index.json").write_text("{}")
    elif damage == "manifest":
        manifest.unlink()
    elif damage == "bad_manifest":
        manifest.write_text("{not json")
    elif damage == "other_gguf":
        data = json.loads(manifest.read_text())
        data["gguf"]["sha256"] = "0" * 64
        manifest.write_text(json.dumps(data))
    slot = gguf_cache.lookup(gguf, root)
    assert slot.exists and not slot.ready
    assert slot.problem and re.search(expected, slot.problem), slot.problem
    calls: list = []
    assert slot.build(_writer(calls)) == folder and len(calls) == 1
    assert gguf_cache.lookup(gguf, root).ready
    assert not list(folder.parent.glob(".trash-*")) and not list(folder.parent.glob(".tmp-*"))


def test_lookup_in_background_gives_the_same_slot_or_its_error(tmp_path):
    gguf, root = _fake_gguf(tmp_path), tmp_path / "cache"
    gguf_cache.lookup(gguf, root).build(_writer())
    slot = gguf_cache.lookup_in_background(gguf, root)()
    assert slot.ready and slot == gguf_cache.lookup(gguf, root)
    with pytest.raises(FileNotFoundError):
        gguf_cache.lookup_in_background(tmp_path / "missing.gguf", root)()


def test_lock_is_reentrant_and_a_discarded_entry_is_rebuilt(tmp_path):
    gguf, root = _fake_gguf(tmp_path), tmp_path / "cache"
    slot = gguf_cache.lookup(gguf, root)
    with slot.locked() as held:
        assert held
        with slot.locked() as again:  # build() inside open()'s lock must not wait for itself
            assert again
        assert slot.build(_writer()) == slot.folder and slot.ready
    slot.discard()
    assert not slot.folder.exists() and not slot.ready
    calls: list = []
    assert slot.build(_writer(calls)) == slot.folder and len(calls) == 1 and slot.ready


def test_publish_keeps_a_valid_entry_written_first(tmp_path):
    gguf, root = _fake_gguf(tmp_path), tmp_path / "cache"
    slot = gguf_cache.lookup(gguf, root)
    slot.build(_writer())
    loser = slot.folder.parent / ".tmp-loser"
    loser.mkdir()
    (loser / "config.json").write_text("{}")
    assert gguf_cache.publish(loser, slot.folder, slot.sha256) == slot.folder
    assert not loser.exists() and gguf_cache.lookup(gguf, root).ready


def test_two_processes_building_at_once_convert_once(tmp_path):
    gguf, root = _fake_gguf(tmp_path), tmp_path / "cache"
    log = tmp_path / "writes.log"
    script = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from gage_plugins_builtin.backends import gguf_cache
        slot = gguf_cache.lookup(Path({str(gguf)!r}), Path({str(root)!r}))
        def write(folder):
            with open({str(log)!r}, "a") as fh:
                fh.write("write\\n")
            (folder / "model.safetensors").write_bytes(b"w" * 4_000_000)
            time.sleep(1.0)
            (folder / "config.json").write_text("{{}}")
        print(slot.build(write))
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    slot = gguf_cache.lookup(gguf, root)
    assert slot.ready
    assert {o.strip() for o, _ in outs} == {str(slot.folder)}
    assert log.read_text().count("write") == 1
    assert not [p for p in slot.folder.parent.iterdir() if p.name.startswith((".tmp-", ".trash-"))]


def test_unwritable_cache_warns_once_and_returns_none(tmp_path, capsys):
    gguf = _fake_gguf(tmp_path)
    blocker = tmp_path / "a-file"
    blocker.write_text("in the way")
    slot = gguf_cache.lookup(gguf, blocker / "cache")  # a file where the cache folder should be
    assert not slot.exists
    assert slot.build(_writer()) is None
    err = capsys.readouterr().err
    assert err.count("warning") == 1 and "could not write the GGUF cache" in err


def test_failed_writer_leaves_nothing_behind(tmp_path, capsys):
    gguf, root = _fake_gguf(tmp_path), tmp_path / "cache"
    slot = gguf_cache.lookup(gguf, root)

    def broken(folder):
        (folder / "model.safetensors").write_bytes(b"half")
        raise OSError(28, "No space left on device")

    assert slot.build(broken) is None
    assert "No space left on device" in capsys.readouterr().err
    assert not slot.folder.exists()
    assert not [p for p in slot.folder.parent.iterdir() if p.name.startswith(".tmp-")]


# -- the real SmolLM2 GGUF --------------------------------------------------------------------


def _needs_transformers() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")


def _piqa_requests() -> list[Request]:
    rows = [json.loads(line) for line in (ROOT / "tasks" / "piqa" / "sample.jsonl").read_text().splitlines()[:4]]
    return [Request(kind=LOGLIKELIHOOD, sample_id=str(i), prompt=f"Question: {r['goal']}\nAnswer:",
                    continuations=(" " + r["sol1"], " " + r["sol2"])) for i, r in enumerate(rows)]


def _lls(backend) -> list[list[float]]:
    outs = backend.run(_piqa_requests())
    assert all(o.error is None for o in outs), [o.error for o in outs]
    return [o.loglikelihoods for o in outs]


@pytest.fixture(scope="module")
def converted(smollm2_gguf, tmp_path_factory):
    """A cold cache: the GGUF converted (and cached) once; the converted model's log-likelihoods."""
    _needs_transformers()
    from gage_plugins_builtin.backends.hf import smollm2_backend

    root = tmp_path_factory.mktemp("gguf_cache")
    mp = pytest.MonkeyPatch()
    mp.setenv(gguf_cache.ENV, str(root))
    try:
        backend = smollm2_backend()
        backend.open()
        lls = _lls(backend)
        tokenizer = backend.tokenizer
        folder = Path(backend.cached_folder)
        del backend
    finally:
        mp.undo()
    return {"root": root, "folder": folder, "lls": lls, "tokenizer": tokenizer}


@pytest.fixture
def no_conversion(monkeypatch):
    """Counts GGUF reads by transformers (config, tokenizer and weights all go through this)."""
    _needs_transformers()
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    calls = []
    real = gguf_utils.load_gguf_checkpoint

    def spy(*args, **kwargs):
        calls.append(args[0] if args else kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(gguf_utils, "load_gguf_checkpoint", spy)
    return calls


def _assert_close(a, b, tol=1e-5):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert len(x) == len(y)
        assert all(abs(p - q) <= tol for p, q in zip(x, y)), (x, y)


@pytest.mark.slow
def test_cached_model_loads_to_equal_loglikelihoods(converted, monkeypatch, no_conversion, smollm2_gguf):
    from gage_plugins_builtin.backends.hf import smollm2_backend

    folder = converted["folder"]
    assert folder.parent == converted["root"] / "gguf"
    manifest = json.loads((folder / gguf_cache.MANIFEST).read_text())
    assert manifest["gguf"]["sha256"] == gguf_cache.file_sha256(smollm2_gguf)
    assert "model.safetensors" in manifest["files"] and "tokenizer.json" in manifest["files"]
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())

    monkeypatch.setenv(gguf_cache.ENV, str(converted["root"]))
    warm = smollm2_backend()
    warm.open()
    assert no_conversion == []  # nothing read from the GGUF
    assert warm.cached_folder == str(folder)
    assert warm.settings()["gguf_cache_folder"] == str(folder)
    _assert_close(_lls(warm), converted["lls"])
    texts = ["Question: dresser\nAnswer: replace drawer with bobby pin ", "  two  spaces\n\n", "ünï 😀\t"]
    for text in texts:
        assert warm.tokenizer(text).input_ids == converted["tokenizer"](text).input_ids
    chat = [{"role": "user", "content": "hi"}]
    assert warm.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == \
        converted["tokenizer"].apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    for attr in ("bos_token_id", "eos_token_id", "pad_token_id"):
        assert getattr(warm.tokenizer, attr) == getattr(converted["tokenizer"], attr)


@pytest.mark.slow
def test_damaged_weights_warn_and_are_rebuilt(converted, monkeypatch, capfd, smollm2_gguf):
    from gage_plugins_builtin.backends.hf import smollm2_backend

    weights = converted["folder"] / "model.safetensors"
    with open(weights, "r+b") as fh:  # one flipped byte in the middle of the weights: same size
        fh.seek(weights.stat().st_size // 2)
        byte = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([byte[0] ^ 0x55]))
    monkeypatch.setenv(gguf_cache.ENV, str(converted["root"]))
    backend = smollm2_backend()
    backend.open()
    err = capfd.readouterr().err
    assert "damaged" in err and "model.safetensors does not match its sha256" in err
    _assert_close(_lls(backend), converted["lls"])
    assert backend.cached_folder == str(converted["folder"])
    assert gguf_cache.check_folder(converted["folder"], gguf_cache.file_sha256(smollm2_gguf)) is None


@pytest.mark.slow
def test_unwritable_cache_folder_falls_back_with_one_warning(tmp_path, monkeypatch, capfd, converted):
    from gage_plugins_builtin.backends.hf import smollm2_backend

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder should be")
    monkeypatch.setenv(gguf_cache.ENV, str(blocker / "cache"))
    backend = smollm2_backend()
    backend.open()
    err = capfd.readouterr().err
    assert err.count("gage-eval: warning") == 1 and "could not write the GGUF cache" in err
    assert backend.cached_folder is None
    _assert_close(_lls(backend), converted["lls"])


@pytest.mark.slow
def test_two_runs_starting_together_convert_once(smollm2_gguf, tmp_path):
    _needs_transformers()
    script = textwrap.dedent("""
        import json
        import transformers.modeling_gguf_pytorch_utils as gguf_utils
        from gage_plugins_builtin.backends.hf import smollm2_backend
        calls = []
        real = gguf_utils.load_gguf_checkpoint
        gguf_utils.load_gguf_checkpoint = lambda *a, **k: calls.append(1) or real(*a, **k)
        backend = smollm2_backend()
        backend.open()
        print(json.dumps({"gguf_reads": len(calls), "folder": backend.cached_folder}))
    """)
    env = dict(os.environ, **{gguf_cache.ENV: str(tmp_path / "cache")})
    procs = [subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    assert sorted(r["gguf_reads"] > 0 for r in results) == [False, True], results
    assert results[0]["folder"] == results[1]["folder"]
    assert gguf_cache.lookup(smollm2_gguf, tmp_path / "cache").ready


def test_gguf_cache_false_turns_the_cache_off(smollm2_gguf, tmp_path, monkeypatch):
    _needs_transformers()
    from gage_plugins_builtin.backends.hf import smollm2_backend

    monkeypatch.setenv(gguf_cache.ENV, str(tmp_path / "cache"))
    backend = smollm2_backend(gguf_cache="false")
    assert backend._gguf_slot() is None and not (tmp_path / "cache").exists()
    assert backend.settings()["gguf_cache"] is False
    with pytest.raises(Exception, match="gguf_cache"):
        smollm2_backend(gguf_cache="maybe")
