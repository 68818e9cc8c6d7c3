"""Reading the images people actually open: modes, orientation, size, corruption."""

import io

import numpy as np
import pytest
from PIL import Image

from keras_vit.data.images import MAX_SIDE, load_image, resize
from keras_vit.inference.predict import read_image


def _encode(image, fmt="PNG", **options):
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def _gradient(height=24, width=40):
    y, x = np.mgrid[0:height, 0:width]
    return np.stack([x * 255 // (width - 1), y * 255 // (height - 1), np.full_like(x, 90)], -1).astype(
        np.uint8
    )


def test_rgb_png_reads_exactly():
    pixels = _gradient()
    assert np.array_equal(load_image(_encode(Image.fromarray(pixels))), pixels)


def test_grayscale_becomes_three_equal_channels():
    gray = _gradient()[..., 0]
    image = load_image(_encode(Image.fromarray(gray)))
    assert image.shape == gray.shape + (3,)
    assert np.array_equal(image[..., 0], gray) and np.array_equal(image[..., 2], gray)


def test_transparent_pixels_are_white_and_opaque_ones_kept():
    rgba = np.zeros((10, 10, 4), np.uint8)
    rgba[:5] = (200, 10, 10, 255)  # opaque red top half, fully transparent black bottom half
    image = load_image(_encode(Image.fromarray(rgba)))
    assert tuple(image[0, 0]) == (200, 10, 10)
    assert tuple(image[9, 9]) == (255, 255, 255)


def test_palette_png_with_transparency():
    palette = Image.new("P", (8, 8), 0)
    palette.putpalette([0, 0, 0, 0, 128, 255] + [0] * 762)
    palette.paste(1, (0, 0, 4, 8))
    encoded = _encode(palette, transparency=0)
    image = load_image(encoded)
    assert tuple(image[0, 0]) == (0, 128, 255)
    assert tuple(image[0, 7]) == (255, 255, 255)  # the transparent index


def test_16_bit_png_is_scaled_not_clipped():
    deep = (np.linspace(0, 65535, 64).reshape(8, 8)).astype(np.uint16)
    image = load_image(_encode(Image.fromarray(deep)))
    expected = np.round(deep / 257.0).astype(np.uint8)
    assert np.abs(image[..., 0].astype(int) - expected).max() <= 1
    assert image.max() == 255 and image.min() == 0  # clipping would make most of it white


def test_cmyk_jpeg_becomes_rgb():
    rgb = Image.new("RGB", (16, 16), (20, 120, 220))
    image = load_image(_encode(rgb.convert("CMYK"), "JPEG", quality=95))
    assert image.shape == (16, 16, 3)
    assert np.abs(image[8, 8].astype(int) - (20, 120, 220)).max() <= 12


def test_exif_rotated_photo_is_upright():
    pixels = _gradient(24, 40)  # wide
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 degrees clockwise to display
    image = load_image(_encode(Image.fromarray(pixels), "JPEG", quality=95, exif=exif.tobytes()))
    assert image.shape == (40, 24, 3)  # shown tall, as the phone meant


def test_very_large_images_are_shrunk_on_decode():
    huge = Image.fromarray(_gradient(300, 400)).resize((6000, 4500))
    image = load_image(_encode(huge, "JPEG", quality=80))
    assert max(image.shape[:2]) == MAX_SIDE
    assert abs(image.shape[1] / image.shape[0] - 6000 / 4500) < 0.01


def test_read_image_resizes_what_load_image_reads(tmp_path):
    path = tmp_path / "photo.png"
    Image.fromarray(_gradient(64, 64)).save(path)
    pixels = read_image(path, (32, 32))
    assert pixels.shape == (32, 32, 3) and pixels.dtype == np.float32


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
@pytest.mark.parametrize(
    "size, new_size",
    [
        ((500, 375), (224, 224)),  # a photo to a ViT's input
        ((32, 32), (224, 224)),  # enlarge
        ((224, 224), (248, 248)),  # timm's ViT: the shorter side to 248 before its crop
        ((1, 1), (8, 8)),
        ((224, 224), (224, 224)),  # already fits
    ],
)
def test_the_numpy_resize_is_pillows_as_timm_reads_images(size, new_size, interpolation):
    """What `keras-vit predict` and the apps run (and, equal to it, TensorFlow in training and
    the served model) is Pillow's resize to the bit, which timm's evaluation reads photos with:
    the same filters, fixed-point weights and 8-bit passes. (Pillow filters the height first on
    some shrinks, and then differs by a few steps at some pixels: not a case here.)"""
    from keras_vit.model.transform import Transform

    pixels = np.random.default_rng(sum(size)).integers(0, 256, size + (3,), dtype=np.uint8)
    filters = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC}
    expected = np.asarray(Image.fromarray(pixels).resize(new_size[::-1], filters[interpolation]))
    resized = resize(pixels, new_size, Transform(interpolation=interpolation))
    assert resized.shape == new_size + (3,) and resized.dtype == np.float32
    np.testing.assert_array_equal(resized, expected)


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "is empty"),
        (b"certainly not an image", "not an image format we can read"),
        (None, "corrupt or truncated"),
    ],
)
def test_bad_files_get_clear_errors(tmp_path, content, message):
    path = tmp_path / "bad.jpg"
    if content is None:  # a JPEG cut in half
        content = _encode(Image.fromarray(_gradient(200, 200)), "JPEG")[:400]
    path.write_bytes(content)
    with pytest.raises(ValueError, match=message) as error:
        load_image(path)
    assert "bad.jpg" in str(error.value)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="Image not found"):
        load_image(tmp_path / "nowhere.png")
    with pytest.raises(ValueError, match="is a directory"):
        load_image(tmp_path)
