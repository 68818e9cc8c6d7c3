"""The serving signature's decoding: every format it accepts, and images too large to decode."""

import io
import struct
import types
import zlib

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from keras_vit.export.serving import MAX_PIXELS, _declared_size, _decode_batch

CLASSIFIER = types.SimpleNamespace(image_size=(32, 32), channels=3)


def _encode(image, format, **options):
    buffer = io.BytesIO()
    image.save(buffer, format, **options)
    return buffer.getvalue()


def _png_header(width, height):
    """A PNG whose header declares `width` x `height`, with one tiny (wrong) data chunk."""

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"\0" * 64))
        + chunk(b"IEND", b"")
    )


RGB = Image.fromarray(np.random.default_rng(0).integers(0, 256, (23, 37, 3), np.uint8))
RGBA = RGB.convert("RGBA")


@pytest.mark.parametrize(
    "encoded",
    [
        _encode(RGB, "PNG"),
        _encode(RGB.convert("L"), "PNG"),
        _encode(RGB, "JPEG"),
        _encode(RGB, "JPEG", progressive=True),
        _encode(RGB, "GIF"),
        _encode(RGB, "BMP"),
        _encode(RGB, "WEBP"),  # lossy: VP8
        _encode(RGB, "WEBP", lossless=True),  # VP8L
        _encode(RGBA, "WEBP"),  # with alpha: VP8X
    ],
    ids=["png", "png-gray", "jpeg", "jpeg-progressive", "gif", "bmp", "webp", "webp-lossless", "webp-alpha"],
)
def test_the_header_size_is_read_without_decoding_and_the_image_decodes(encoded):
    width, height = (int(v) for v in _declared_size(tf.constant(encoded)))
    assert (width, height) == (37, 23)
    pixels = _decode_batch(CLASSIFIER, tf.constant([encoded]))
    assert pixels.shape == (1, 32, 32, 3)


def test_a_top_down_bmp_declares_a_positive_height():
    encoded = bytearray(_encode(RGB, "BMP"))
    encoded[22:26] = struct.pack("<i", -23)  # top-down rows: the height is stored negative
    assert [int(v) for v in _declared_size(tf.constant(bytes(encoded)))] == [37, 23]


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_a_decompression_bomb_is_refused_before_decoding(graph):
    decode = lambda batch: _decode_batch(CLASSIFIER, batch)  # noqa: E731
    decode = tf.function(decode) if graph else decode  # a SavedModel signature runs as a graph
    bomb = _png_header(60_000, 60_000)  # 3.6 billion pixels declared in 100 bytes
    message = r"image_bytes\[1\] declares 60000 x 60000 pixels"
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        decode(tf.constant([_encode(RGB, "PNG"), bomb]))
    assert 60_000 * 60_000 > MAX_PIXELS
    assert decode(tf.constant([_encode(RGBA, "WEBP"), _encode(RGB, "JPEG")])).shape == (2, 32, 32, 3)


@pytest.mark.parametrize("encoded", [b"", b"\x89PNG", b"GIF8", b"BM", b"RIFF\0\0\0\0WEBP"])
def test_short_headers_give_an_error_not_a_crash(encoded):
    with pytest.raises(tf.errors.InvalidArgumentError):
        _decode_batch(CLASSIFIER, tf.constant([encoded]))


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_exif_orientation_is_applied_as_pillow_does(orientation, graph):
    from keras_vit.data.images import load_image
    from keras_vit.data.pipeline import decode_upright

    exif = Image.Exif()
    exif[0x0112] = orientation
    encoded = _encode(RGB, "JPEG", quality=95, exif=exif)
    decode = tf.function(decode_upright) if graph else decode_upright
    upright = decode(tf.constant(encoded)).numpy()
    expected = load_image(encoded)  # Pillow: ImageOps.exif_transpose
    assert upright.shape == expected.shape
    assert np.abs(upright.astype(int) - expected).mean() < 1.0  # both decode with the accurate DCT
    if orientation != 1:  # and the comparison can tell orientations apart
        unturned = decode(tf.constant(_encode(RGB, "JPEG", quality=95))).numpy()
        assert unturned.shape != expected.shape or np.abs(unturned.astype(int) - expected).mean() > 20


def test_transparent_pixels_are_white_as_in_the_apps():
    from keras_vit.data.images import load_image
    from keras_vit.data.pipeline import decode_upright

    rgba = np.asarray(RGBA).copy()
    rgba[..., 3] = np.linspace(0, 255, rgba.shape[1], dtype=np.uint8)
    for format in ("PNG", "WEBP", "BMP"):
        options = {"lossless": True} if format == "WEBP" else {}
        encoded = _encode(Image.fromarray(rgba), format, **options)
        decoded = decode_upright(tf.constant(encoded)).numpy().astype(int)
        assert np.abs(decoded - load_image(encoded)).max() <= 1, format


@pytest.mark.parametrize("format", ["JPEG", "PNG"])
def test_a_truncated_file_is_named_by_its_index(format):
    encoded = _encode(RGB, format)
    truncated = encoded[: len(encoded) * 2 // 3]
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"image_bytes\[1\] is truncated"):
        _decode_batch(CLASSIFIER, tf.constant([encoded, truncated]))
