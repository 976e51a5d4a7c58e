"""Checking backend arguments that arrive as strings from --model-args."""
from __future__ import annotations

from typing import Any

from gage_eval.api import GageError


def as_bool(value: Any, key: str, backend: str) -> bool:
    """``true/false``, ``yes/no``, ``on/off``, ``1/0`` (or a real bool)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise GageError(f"{backend}: {key} must be true or false, not {value!r}")


DEVICES = ("cpu", "cuda", "auto")  # and cuda:N


def check_device(device: Any, where: str) -> str:
    """``device`` checked when the backend is built, before any model loads: a CUDA device torch
    cannot see is refused then, not after the weights are read."""
    text = str(device)
    if not (text in DEVICES or text.startswith("cuda:")):
        raise GageError(f"{where}: device must be one of {', '.join(DEVICES)} or cuda:N, not {device!r}")
    if text.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise GageError(f"{where}: device={text} but torch sees no CUDA device; use --device cpu "
                            f"(or --device auto: CUDA when there is one)")
    return text


NO_MINIMUM = float("-inf")  # as_number's minimum for a value with no lower bound (a seed)


def as_number(value: Any, key: str, backend: str, cast: type = int, minimum: float = 1,
              maximum: float = float("inf")) -> Any:
    """``value`` as an int (or ``cast``) from ``minimum`` to ``maximum``."""
    try:
        number = cast(value)
    except (TypeError, ValueError):
        kind = "an integer" if cast is int else "a number"
        raise GageError(f"{backend}: {key} must be {kind}, not {value!r}") from None
    if number < minimum:
        raise GageError(f"{backend}: {key} must be at least {minimum}, not {value!r}")
    if number > maximum:
        raise GageError(f"{backend}: {key} must be at most {maximum}, not {value!r}")
    return number


def image_args(args: dict, default_prompt: Any, backend: str) -> tuple[Any, str, dict]:
    """The image arguments the vision backends share: ``min_pixels``/``max_pixels``/``image_factor``
    (taken out of ``args``; :class:`~gage_plugins_builtin.multimodal.media.ImageResize`, None when
    none is given) and ``default_prompt`` (``media.DEFAULT_PROMPT`` when not given).

    Returns (resize, the prompt, the settings they add): only those given, so that runs
    without them keep their cache keys."""
    from gage_plugins_builtin.multimodal.media import DEFAULT_PROMPT, RESIZE_ARGS, ImageResize

    resize = ImageResize.from_args(args, backend)
    for key in RESIZE_ARGS:
        args.pop(key, None)
    prompt = DEFAULT_PROMPT if default_prompt is None else str(default_prompt)
    settings = {**(resize.settings() if resize else {}),
                **({"default_prompt": prompt} if default_prompt is not None else {})}
    return resize, prompt, settings
