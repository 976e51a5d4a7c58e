"""Images resized by Qwen2.5-VL's rule (min_pixels, max_pixels, image_factor), per model arguments,
in each backend that takes images; and the default prompt of an image-only user turn."""
from __future__ import annotations

import pytest

from gage_eval.api.errors import GageError
from gage_plugins_builtin.multimodal.media import (DEFAULT_PROMPT, MAX_PIXELS, MIN_PIXELS, ImageResize, data_url,
                                                   smart_size, with_default_prompt)

PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402
from mm_images import decoded_size, png  # noqa: E402


# -- the rule ---------------------------------------------------------------------------------

@pytest.mark.parametrize("height, width, expected", [
    # (height, width) -> (height, width), Qwen2.5-VL's defaults: factor 28, 3136 .. 12845056 pixels
    (500, 1000, (504, 1008)),     # each side to its nearest multiple of 28 (17.86 -> 18, 35.71 -> 36)
    (28, 28, (56, 56)),           # 784 < 3136: scaled up by sqrt(3136 / 784) = 2
    (10, 10, (56, 56)),           # sqrt(3136 / 100) = 5.6: 56 / 28 = 2 exactly
    (15, 40, (56, 112)),          # 28 x 28 after rounding < 3136: x2.286 -> 34.3 -> 56, 91.4 -> 112
    (8000, 10000, (3192, 4004)),  # 80 Mpx: /2.4956 -> floor(114.5) x 28, floor(143.1) x 28
    (1, 100, (28, 112)),          # a thin line: its short side becomes one factor; 28 x 112 = 3136 fits
])
def test_smart_size_known_values(height, width, expected):
    h, w = smart_size(height, width)
    assert (h, w) == expected
    assert h % 28 == 0 and w % 28 == 0 and MIN_PIXELS <= h * w <= MAX_PIXELS


def test_smart_size_other_bounds_and_factor():
    # transformers' Qwen2-VL processor defaults: 56*56 .. 14*14*4*1280 (1003520) pixels
    assert smart_size(2000, 3000, 28, 56 * 56, 1003520) == (812, 1204)
    assert 812 * 1204 <= 1003520
    # factor 32 (e.g. a patch 16 x merge 2 model): multiples of 32
    h, w = smart_size(700, 1300, 32, 1024, 4_000_000)
    assert (h, w) == (704, 1312)
    with pytest.raises(ValueError, match="aspect ratio 250.0 is above 200"):
        smart_size(4, 1000)


def test_smart_size_matches_transformers_qwen2_vl_processor():
    """The rule agrees with transformers' Qwen2-VL image processor wherever both sides are more than
    half a factor (from half down, transformers rounds a side to 0 and Qwen's qwen_vl_utils, which we
    follow, to one factor)."""
    mod = pytest.importorskip("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")
    checked = 0
    for height in (15, 27, 28, 99, 333, 500, 1023, 2048, 4321):
        for width in (20, 56, 640, 999, 1920, 5000):
            if max(height, width) / min(height, width) > 200:
                continue
            for bounds in ((MIN_PIXELS, MAX_PIXELS), (56 * 56, 1003520), (200_000, 300_000)):
                assert smart_size(height, width, 28, *bounds) == mod.smart_resize(height, width, 28, *bounds), \
                    (height, width, bounds)
                checked += 1
    assert checked > 100


def test_image_resize_from_model_args():
    assert ImageResize.from_args({}, "b") is None
    assert ImageResize.from_args({"min_pixels": "", "other": 1}, "b") is None
    r = ImageResize.from_args({"max_pixels": "1280*28*28"}, "b")
    assert r.settings() == {"min_pixels": MIN_PIXELS, "max_pixels": 1003520, "image_factor": 28}
    r = ImageResize.from_args({"min_pixels": 100, "max_pixels": "5000", "image_factor": "10"}, "b")
    assert r.settings() == {"min_pixels": 100, "max_pixels": 5000, "image_factor": 10}
    assert r.size(1000, 500) == (100, 50)  # (width, height): 500000 px > 5000, /10 -> floor to tens
    with pytest.raises(GageError, match=r"vllm backend: max_pixels='lots' is not a whole number"):
        ImageResize.from_args({"max_pixels": "lots"}, "vllm backend")
    with pytest.raises(GageError, match="min_pixels=9000 is above max_pixels=5000"):
        ImageResize.from_args({"min_pixels": 9000, "max_pixels": 5000}, "b")
    with pytest.raises(GageError, match="image_factor='0' must be at least 1"):
        ImageResize.from_args({"image_factor": "0"}, "b")


def test_apply_resizes_pil_images_and_keeps_fitting_ones():
    r = ImageResize()
    big = Image.new("RGB", (1000, 500))
    assert r.apply(big).size == (1008, 504)
    fits = Image.new("RGB", (56, 84))
    assert r.apply(fits) is fits
    assert r.apply(Image.new("RGB", (10, 10))).size == (56, 56)


# -- default prompt ----------------------------------------------------------------------------

IMG = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}


def test_default_prompt_only_for_an_image_only_last_user_turn():
    only = [{"role": "user", "content": [IMG]}]
    out = with_default_prompt(only, DEFAULT_PROMPT)
    assert out[0]["content"] == [IMG, {"type": "text", "text": DEFAULT_PROMPT}]
    assert only[0]["content"] == [IMG]  # the sample's messages are not changed
    blank = [{"role": "user", "content": [IMG, {"type": "text", "text": "  "}]}]
    assert with_default_prompt(blank, "Describe.")[0]["content"][-1] == {"type": "text", "text": "Describe."}
    asked = [{"role": "user", "content": [IMG, {"type": "text", "text": "What is it?"}]}]
    assert with_default_prompt(asked, DEFAULT_PROMPT) == asked
    text_only = [{"role": "user", "content": "hi"}]
    assert with_default_prompt(text_only, DEFAULT_PROMPT) == text_only
    # a system prompt does not count as the question; an earlier turn is left alone
    convo = [{"role": "system", "content": "be brief"}, {"role": "user", "content": [IMG]},
             {"role": "assistant", "content": "ok"}, {"role": "user", "content": [IMG]}]
    out = with_default_prompt(convo, "P")
    assert out[1]["content"] == [IMG] and out[3]["content"][-1]["text"] == "P"
    assert with_default_prompt(only, "") == only and with_default_prompt(only, None) == only


# -- openai: data URLs of the resized images -----------------------------------------------------

def test_openai_payload_sends_resized_images(tmp_path):
    from gage_plugins_builtin.backends import openai_payload as payload

    local = tmp_path / "wide.png"
    local.write_bytes(png(1000, 500))
    tiny = data_url(png(10, 10))
    fitting = data_url(png(56, 84))
    messages = [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": str(local)}},
        {"type": "image_url", "image_url": {"url": tiny, "detail": "low"}},
        {"type": "image_url", "image_url": {"url": fitting}},
        {"type": "image_url", "image_url": {"url": "https://x.org/a.jpg"}},
        {"type": "text", "text": "Compare"}]}]
    parts = payload.chat_messages(messages, vision=True, resize=ImageResize())[0]["content"]
    assert decoded_size(parts[0]["image_url"]["url"]) == (1008, 504)
    assert decoded_size(parts[1]["image_url"]["url"]) == (56, 56) and parts[1]["image_url"]["detail"] == "low"
    assert parts[2]["image_url"]["url"] == fitting  # already fits: the same bytes
    assert parts[3]["image_url"]["url"] == "https://x.org/a.jpg"  # the server fetches http(s) images
    # no resize: as before (the local file's bytes, data URLs as they are)
    plain = payload.chat_messages(messages, vision=True)[0]["content"]
    assert decoded_size(plain[0]["image_url"]["url"]) == (1000, 500) and plain[1]["image_url"]["url"] == tiny
    smaller = ImageResize(max_pixels=28 * 28 * 4)
    assert decoded_size(payload.media_url(str(local), smaller)) == (56, 28)  # /12.6: 1.41 -> 1, 2.83 -> 2


def test_openai_payload_default_prompt(tmp_path):
    from gage_plugins_builtin.backends import openai_payload as payload

    url = data_url(png(56, 56))
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]
    parts = payload.chat_messages(messages, vision=True, default_prompt=DEFAULT_PROMPT)[0]["content"]
    assert parts == [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": DEFAULT_PROMPT}]
    assert payload.chat_messages(messages, vision=True)[0]["content"] == parts[:1]


# -- transformers vision and vllm: the images the processor and the engine get ------------------

def test_processor_messages_resized_with_default_prompt():
    from gage_plugins_builtin.backends.hf_vision import to_processor_messages

    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(png(1000, 500))}},
                                             {"type": "image_url", "image_url": {"url": data_url(png(10, 10))}}]}]
    chat, images = to_processor_messages(messages, ImageResize(), DEFAULT_PROMPT)
    assert [im.size for im in images] == [(1008, 504), (56, 56)]
    assert chat == [{"role": "user", "content": [{"type": "image"}, {"type": "image"},
                                                 {"type": "text", "text": DEFAULT_PROMPT}]}]
    chat, images = to_processor_messages(messages)
    assert [im.size for im in images] == [(1000, 500), (10, 10)] and len(chat[0]["content"]) == 2


def test_transformers_vision_backend_args_and_settings():
    from gage_plugins_builtin.backends.hf_vision import VisionTransformersBackend

    plain = VisionTransformersBackend(pretrained="m")
    assert plain.resize is None and not {"min_pixels", "default_prompt"} & set(plain.settings())
    sized = VisionTransformersBackend(pretrained="m", min_pixels="256*28*28", max_pixels="1280*28*28",
                                      default_prompt="")
    assert sized.settings()["min_pixels"] == 200704 and sized.settings()["max_pixels"] == 1003520
    assert sized.settings()["default_prompt"] == "" and sized.default_prompt == ""
    with pytest.raises(GageError, match="unknown argument"):
        VisionTransformersBackend(pretrained="m", max_pixel=5)


@pytest.mark.slow
def test_transformers_vision_backend_processor_gets_resized_images(tiny_vlm, monkeypatch):
    """The tiny LLaVA's processor is called with the resized images, and answers."""
    from gage_eval.api.backend import Request
    from gage_plugins_builtin.backends.hf_vision import VisionTransformersBackend

    backend = VisionTransformersBackend(pretrained=str(tiny_vlm), dtype="float32", device="cpu",
                                        max_pixels="4*28*28")
    backend.open()
    seen = []
    real = backend.processor.__class__.__call__

    def spy(self, *args, **kwargs):
        seen.append(([im.size for im in kwargs.get("images") or []], kwargs.get("text")))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(backend.processor.__class__, "__call__", spy)
    req = Request(kind="generate", sample_id="a", chat=True, modalities=frozenset({"image_url"}),
                  gen={"max_new_tokens": 2},
                  messages=({"role": "user", "content": [{"type": "image_url",
                                                          "image_url": {"url": data_url(png(300, 200))}}]},))
    out, = backend.run([req])
    backend.close()
    assert out.error is None, out.error
    sizes, texts = seen[0]
    assert sizes == [(56, 28)]  # 300x200 in at most 4 patches of 28x28: /4.37 -> 2.45 -> 2, 1.63 -> 1
    assert DEFAULT_PROMPT in texts[0]


@pytest.fixture(scope="module")
def tiny_vlm(smollm2_gguf, tmp_path_factory):
    pytest.importorskip("transformers")
    import sys
    from pathlib import Path

    here = str(Path(__file__).resolve().parent)
    sys.path.insert(0, here)
    try:
        from tiny_vlm import build_tiny_llava
    finally:
        sys.path.remove(here)
    return build_tiny_llava(smollm2_gguf, tmp_path_factory.mktemp("tiny_vlm_resize"))
