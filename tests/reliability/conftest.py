"""The ``gage`` fixture: the real CLI as a watched subprocess (see harness.py)."""
from __future__ import annotations

import pytest

from harness import Gage


@pytest.fixture
def gage(tmp_path) -> Gage:
    return Gage(tmp_path)
