from __future__ import annotations

import pytest

from gage_eval import plugins
@pytest.fixture
def fresh_plugins(monkeypatch):
    """A clean plugin manager for the test; the process-wide one is restored after."""
    plugins.reset_plugins()
    yield plugins
    plugins.reset_plugins()
