"""gage-eval: an evaluation harness built on pluggy plugins and task folders."""
from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["hookimpl", "__version__"]


def __getattr__(name: str):
    # imported on first use: the console script's Ctrl-C handling (gage_eval.cli) must come before
    # anything heavy, and every import of a submodule runs this file first
    if name == "hookimpl":
        from gage_eval.api.hookspecs import hookimpl

        return hookimpl
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
