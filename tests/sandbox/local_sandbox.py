"""Whether the builtin `local` sandbox (bubblewrap + prlimit) runs here, asked once: the skip marker
of the tests that run code in it (tests/sandbox/test_sandbox.py, tests/tools/test_code_tools.py)."""
from __future__ import annotations

import shutil

import pytest

from gage_eval.api import execution
from gage_eval.api.errors import GageError


def why_unusable() -> str:
    """'' when the local sandbox opens here, else why not."""
    if shutil.which("bwrap") is None or shutil.which("prlimit") is None:
        return "bubblewrap (bwrap) or prlimit is not installed: apt-get install bubblewrap util-linux"
    from gage_eval.plugins import load_plugins

    load_plugins()
    try:
        execution.open_sandbox("local")
    except GageError as exc:
        return f"the local sandbox cannot run here: {exc}"
    return ""


_WHY = why_unusable()
needs_local_sandbox = pytest.mark.skipif(bool(_WHY), reason=_WHY or "sandbox usable")
