"""Property-based tests (hypothesis): any bytes give a prediction or the clear error; any
valid architecture gives a model of the right output shape."""

import io

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

import keras_vit
from keras_vit.data.images import load_image
from keras_vit.export.serving import _decode_batch

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _encoded(format, seed, width, height):
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format)
    return buffer.getvalue()


@st.composite
def damaged_images(draw):
    """Real PNG/JPEG/GIF/BMP/WebP files with bytes overwritten, cut off, or both."""
    format = draw(st.sampled_from(["PNG", "JPEG", "GIF", "BMP", "WEBP"]))
    data = bytearray(
        _encoded(format, draw(st.integers(0, 9)), draw(st.integers(1, 40)), draw(st.integers(1, 40)))
    )
    for _ in range(draw(st.integers(0, 4))):
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    if draw(st.booleans()):
        data = data[: draw(st.integers(0, len(data)))]
    return bytes(data)


ANY_BYTES = st.one_of(st.binary(max_size=2048), damaged_images())


@SETTINGS
@given(ANY_BYTES)
def test_reading_any_bytes_gives_an_image_or_a_clear_error(data):
    try:
        image = load_image(data)
    except ValueError as error:
        assert str(error).startswith("The image ")  # names what it read, says what is wrong
        return
    assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3 and min(image.shape) >= 1


_CLASSIFIER = type("Classifier", (), {"image_size": (32, 32), "channels": 3})()
_serve_decode = tf.function(lambda batch: _decode_batch(_CLASSIFIER, batch))  # as a SavedModel runs it


@SETTINGS
@given(ANY_BYTES)
def test_the_serving_signature_decodes_any_bytes_or_answers_invalid_argument(data):
    try:
        pixels = _serve_decode(tf.constant([data])).numpy()
    except tf.errors.InvalidArgumentError as error:
        # That request's INVALID_ARGUMENT: our checks name image_bytes[i]; a decoder that finds
        # damage deeper in a file says what it found ("Invalid PNG data", "Incomplete bmp content").
        assert error.message.strip()
        return
    assert pixels.shape == (1, 32, 32, 3) and np.isfinite(pixels).all()
    # [0, 255] up to float32 rounding in the resize's normalised weights (measured 2e-5).
    assert pixels.min() >= -1e-3 and pixels.max() <= 255 + 1e-3


@st.composite
def architectures(draw):
    patch = draw(st.sampled_from([2, 4, 8]))
    heads = draw(st.sampled_from([1, 2, 4]))
    return dict(
        image_size=(patch * draw(st.integers(1, 4)), patch * draw(st.integers(1, 4))),
        patch_size=patch,
        hidden_dim=heads * draw(st.sampled_from([4, 8])),
        depth=draw(st.integers(1, 2)),
        num_heads=heads,
        mlp_dim=draw(st.sampled_from([8, 16])),
        num_classes=draw(st.integers(1, 12)),
        pooling=draw(st.sampled_from(["token", "gap"])),
    )


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(architectures(), st.integers(1, 3))
def test_any_valid_architecture_gives_the_right_output_shape(config, batch):
    model = keras_vit.ViT(**config)
    height, width = config["image_size"]
    images = np.random.default_rng(0).uniform(0, 255, (batch, height, width, 3)).astype("float32")
    outputs = np.asarray(model(images))
    assert outputs.shape == (batch, config["num_classes"])
    assert np.isfinite(outputs).all()


def test_the_strategies_reach_both_outcomes():
    """The byte strategy is not vacuous: it makes images that decode and ones that do not."""
    assert load_image(_encoded("PNG", 0, 5, 7)).shape == (7, 5, 3)
    with pytest.raises(ValueError):
        load_image(b"\x89PNG\r\n\x1a\n" + b"\0" * 30)
