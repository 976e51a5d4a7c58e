"""What the loaded plugins registered, as the API reads it (schemas, data packages, sandboxes,
tools, tool-call parsers): the plugin manager (:mod:`gage_eval.plugins`) hands its registry here
when it is imported, so the API imports nothing above it."""
from __future__ import annotations

from typing import Any, Callable, Mapping

_registry: Callable[[], Any] | None = None


def use_registry(source: Callable[[], Any]) -> None:
    """Set by the plugin manager: ``source()`` is the loaded plugins' registry (loaded on first use)."""
    global _registry
    _registry = source


def table(kind: str) -> Mapping[str, Any]:
    """The entries of ``kind`` (``schemas``, ``sandboxes``, ``tools``, ...) by name; none in a
    process that never imported the plugin manager."""
    return getattr(_registry(), kind) if _registry is not None else {}
