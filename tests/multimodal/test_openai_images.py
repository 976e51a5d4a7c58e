"""The openai backend's image model arguments: min_pixels, max_pixels, image_factor (images resized
by Qwen2.5-VL's rule before they are encoded as data URLs) and default_prompt, in its settings and
in the body it posts."""
from __future__ import annotations

import pytest

from gage_eval.api.errors import GageError
from gage_plugins_builtin.multimodal.media import DEFAULT_PROMPT, MAX_PIXELS, MIN_PIXELS, data_url, smart_size

pytest.importorskip("PIL")
pytest.importorskip("aiohttp")
from mm_images import decoded_size, png  # noqa: E402


def test_openai_backend_model_args_and_settings():
    from gage_plugins_builtin.backends.openai_backend import openai_backend

    plain = openai_backend(base_url="http://127.0.0.1:9/v1", model="m", vision="true")
    settings = plain.settings()
    assert plain.resize is None and plain.default_prompt == DEFAULT_PROMPT
    assert not {"min_pixels", "max_pixels", "image_factor", "default_prompt"} & set(settings)  # cache keys kept
    sized = openai_backend(base_url="http://127.0.0.1:9/v1", model="m", vision="true", max_pixels="1003520",
                           default_prompt="Describe.")
    assert sized.settings()["max_pixels"] == 1003520 and sized.settings()["min_pixels"] == MIN_PIXELS
    assert sized.settings()["image_factor"] == 28 and sized.settings()["default_prompt"] == "Describe."
    with pytest.raises(GageError, match="openai backend: min_pixels='x'"):
        openai_backend(base_url="http://127.0.0.1:9/v1", model="m", min_pixels="x")
    with pytest.raises(GageError, match="unknown argument"):
        openai_backend(base_url="http://127.0.0.1:9/v1", model="m", max_pixel="5")


def test_openai_backend_request_body_has_resized_image(tmp_path):
    """The body the backend posts: the image as a data URL of the resized image, the default prompt."""
    import asyncio

    from gage_eval.api.backend import Request
    from gage_plugins_builtin.backends.openai_backend import openai_backend

    backend = openai_backend(base_url="http://127.0.0.1:9/v1", model="m", vision="true", min_pixels="200000")
    sent = []

    class Reply:
        value = ({"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}]}, "ok")
        latency_ms, ttft_ms, attempts = 1.0, None, 1

    async def post(slots, url, body, parse, stream=False):
        sent.append(body)
        return Reply()

    backend.poster.post = post
    req = Request(kind="generate", sample_id="a", chat=True, modalities=frozenset({"image_url"}),
                  messages=({"role": "user", "content": [{"type": "image_url",
                                                          "image_url": {"url": data_url(png(100, 50))}}]},))
    out = asyncio.run(backend._generate(None, req))
    assert out.text == "ok"
    parts = sent[0]["messages"][0]["content"]
    w, h = decoded_size(parts[0]["image_url"]["url"])
    assert (w, h) == smart_size(50, 100, 28, 200000, MAX_PIXELS)[::-1] and w * h >= 200000
    assert parts[1] == {"type": "text", "text": DEFAULT_PROMPT}
