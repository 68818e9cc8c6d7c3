"""Reading the image files people actually have: any mode, any orientation, any size.

Phones write EXIF-rotated JPEGs, print workflows write CMYK, scanners write
16-bit PNGs, screenshots carry an alpha channel and GIFs a palette. Every
reader of user images here (`keras-vit predict`, the apps) goes through
`load_image`, so they all see the same upright RGB pixels.
"""

import io
import os
import warnings

import numpy as np

# The image files keras-vit reads: datasets for training, `predict`, the apps.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".gif", ".bmp", ".webp", ".tif", ".tiff")
# Images are shrunk to at most this many pixels on the long side on decode: a
# classifier sees 224 px at most, and a 100-megapixel photo would otherwise
# cost 300 MB and seconds of resizing.
MAX_SIDE = 2048
# Transparent pixels are shown on white, as image viewers and browsers do.
BACKGROUND = (255, 255, 255)


def load_image(source, max_side=MAX_SIDE):
    """Decodes an image file (path or bytes) to upright RGB uint8 `(height, width, 3)`.

    Handles grayscale, RGBA and palette images (alpha composited on white),
    16-bit PNGs, CMYK JPEGs, EXIF orientation and the first frame of animations.

    Raises:
        FileNotFoundError: no file at the path.
        ValueError: a directory, an empty file, or bytes that are not an image
            Pillow can decode (the message names the file and the problem).
    """
    from PIL import Image, ImageOps, UnidentifiedImageError

    name = "The image" if isinstance(source, (bytes, bytearray)) else os.fspath(source)
    if not isinstance(source, (bytes, bytearray)):
        if not os.path.exists(name):
            raise FileNotFoundError(f"Image not found: {name}")
        if os.path.isdir(name):
            raise ValueError(f"Expected an image file but {name} is a directory.")
        with open(name, "rb") as f:
            source = f.read()
    if not source:
        raise ValueError(f"{name} is empty (0 bytes), not an image.")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(source))
            # JPEG decodes at 1/2, 1/4 or 1/8 scale directly: fast for huge photos.
            image.draft("RGB", (max_side, max_side))
            image = ImageOps.exif_transpose(image)
            image.load()
    except Image.DecompressionBombError as error:
        raise ValueError(f"{name} is too large to decode safely ({error}).") from None
    except UnidentifiedImageError:
        raise ValueError(
            f"{name} is not an image format we can read (JPEG, PNG, GIF, BMP, WebP, TIFF, ...)."
        ) from None
    except (OSError, SyntaxError, ValueError) as error:  # truncated or corrupt data
        raise ValueError(f"{name} is corrupt or truncated ({error}).") from None
    image = _to_rgb(image)
    if max(image.size) > max_side:
        image.thumbnail((max_side, max_side), Image.Resampling.BILINEAR, reducing_gap=2.0)
    return np.asarray(image, dtype=np.uint8)


def resize(pixels, image_size):
    """Resizes `(height, width, channels)` pixels to `image_size` as float32 in [0, 255], as
    `keras_vit.data.pipeline.resize` does in TensorFlow (antialiased bilinear) for training and the
    served model, equal to float32 rounding: `keras-vit predict` and the apps need no
    TensorFlow to run a `.tflite` or `.onnx`. Skipped when the image already fits."""
    pixels = np.asarray(pixels, dtype=np.float32)
    height, width = int(image_size[0]), int(image_size[1])
    if pixels.shape[:2] == (height, width):
        return pixels
    rows = np.tensordot(_triangle_weights(pixels.shape[0], height), pixels, axes=(1, 0))
    return np.matmul(_triangle_weights(pixels.shape[1], width), rows)  # (height, width, channels)


def _triangle_weights(size, new_size):
    """`(new_size, size)` weights of TensorFlow's `scale_and_translate` with the triangle kernel
    and antialiasing: half-pixel centres, the kernel widened by the shrink factor, each row of
    weights summing to 1."""
    inverse_scale = size / new_size
    kernel_scale = max(inverse_scale, 1.0)  # antialiasing: a shrink averages all it covers
    centres = (np.arange(new_size) + 0.5) * inverse_scale - 0.5
    weights = np.maximum(0.0, 1.0 - np.abs(centres[:, None] - np.arange(size)) / kernel_scale)
    return (weights / weights.sum(axis=1, keepdims=True)).astype(np.float32)


def _to_rgb(image):
    from PIL import Image

    if image.mode in ("I", "I;16", "I;16B", "I;16L", "I;16N", "F"):
        # 16-bit (or 32-bit) grayscale: scale to 8 bits instead of clipping at 255.
        values = np.asarray(image, dtype=np.float64)
        top = 65535.0 if values.max() > 255 else 255.0
        gray = np.clip(np.round(values * (255.0 / top)), 0, 255).astype(np.uint8)
        return Image.fromarray(gray).convert("RGB")
    if image.mode == "P":
        image = image.convert("RGBA" if "transparency" in image.info else "RGB")
    if image.mode in ("RGBA", "LA", "PA", "La", "RGBa"):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, BACKGROUND + (255,))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")  # L, 1, CMYK, YCbCr, LAB, HSV, RGB


def image_files(folder):
    """The image files directly in `folder`, sorted by name.

    Raises:
        FileNotFoundError: no such folder.
        ValueError: `folder` is a file, or holds no images.
    """
    folder = os.fspath(folder)
    if not os.path.exists(folder):
        raise FileNotFoundError(f"Folder not found: {folder}")
    if not os.path.isdir(folder):
        raise ValueError(f"{folder} is a file, not a folder.")
    files = sorted(
        os.path.join(folder, name)
        for name in os.listdir(folder)
        if name.lower().endswith(IMAGE_EXTENSIONS) and os.path.isfile(os.path.join(folder, name))
    )
    if not files:
        raise ValueError(f"{folder} holds no images ({', '.join(IMAGE_EXTENSIONS)}).")
    return files
