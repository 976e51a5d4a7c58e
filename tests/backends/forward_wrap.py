"""A model's ``forward`` wrapped for the length of a ``with`` block (tests/backends' HF tests)."""
from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator


@contextlib.contextmanager
def wrapped_forward(model: Any, wrapper: Callable[..., Any]) -> Iterator[None]:
    """``model.forward`` replaced by ``wrapper(forward, *args, **kwargs)`` (``forward``: the model's own,
    for the wrapper to call or not); the model's own again after the block."""
    model.forward = functools.partial(wrapper, model.forward)
    try:
        yield
    finally:
        del model.forward
