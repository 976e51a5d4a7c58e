"""gage-eval: an evaluation harness built on pluggy plugins and task folders."""
from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__"]
