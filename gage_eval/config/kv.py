"""``k=v,k2=v2`` arguments as the command line and run configs give them."""
from __future__ import annotations

from typing import Any

from gage_eval.api.errors import GageError
from gage_eval.api.secrets import strip_credentials


def parse_value(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def parse_kv(text: str | None, option: str) -> dict:
    """``k=v,k2=v2`` as a dict; numbers and booleans converted."""
    out: dict[str, Any] = {}
    if not text:
        return out
    for part in text.split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        if not sep or not key.strip():  # name the bad part only: the rest may hold a secret
            raise GageError(f"{option}: expected key=value pairs separated by commas, got "
                            f"{strip_credentials(part)!r}")
        out[key.strip()] = parse_value(value.strip())
    return out
