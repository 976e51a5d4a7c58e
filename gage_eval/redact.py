"""Secrets never reach an output file or a log."""
from __future__ import annotations

import re
from typing import Any

SECRET_KEY = re.compile(r"(api[_-]?key|token(?!s)|secret|password|authorization|bearer|credential)", re.I)
REDACTED = "***"


def redact(value: Any, secrets: tuple[str, ...] = ()) -> Any:
    """A copy of ``value`` with secret-looking keys masked and known secret strings removed."""
    if isinstance(value, dict):
        return {k: (REDACTED if SECRET_KEY.search(str(k)) and not str(k).endswith("_env") and v not in (None, "")
                    else redact(v, secrets)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v, secrets) for v in value]
    if isinstance(value, str):
        return scrub(value, secrets)
    return value


def scrub(text: str, secrets: tuple[str, ...], min_len: int = 6) -> str:
    """``text`` with each known secret of at least ``min_len`` characters masked."""
    for secret in secrets:
        if secret and len(secret) >= min_len:
            text = text.replace(secret, REDACTED)
    return text
