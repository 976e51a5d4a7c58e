"""Fixtures of the tool-loop tests."""
from __future__ import annotations

import pytest

from tests.tools.example_runs import EXAMPLE


@pytest.fixture
def example_plugin(monkeypatch, fresh_plugins):
    """The example plugin (its ``pantry`` tool and ``example_pantry`` task) registered for one test."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    import gage_eval_plugin_example

    fresh_plugins.register_plugin(gage_eval_plugin_example, "example")
    return gage_eval_plugin_example
