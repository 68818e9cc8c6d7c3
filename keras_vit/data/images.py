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

from keras_vit.model.transform import DEFAULT

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


def resize(pixels, image_size, transform=DEFAULT):
    """Brings `(height, width, channels)` pixels to `image_size` by `transform` (a
    `keras_vit.model.transform.Transform`: resize, then centre crop) as float32 in [0, 255], as
    `keras_vit.data.pipeline.resize` does in TensorFlow for training and the served model:
    `keras-vit predict` and the apps need no TensorFlow to run a `.tflite` or `.onnx`.

    The resize is Pillow's (timm's reader), to the bit: its filters and fixed-point weights, the
    width first, then the height, each pass stored in 8 bits; a side that keeps its size is not
    filtered. Integer arithmetic in float64 is exact in any order, so every port agrees."""
    pixels = np.asarray(pixels, dtype=np.float32)
    (new_height, new_width), (top, left) = transform.plan(pixels.shape[:2], image_size)
    height, width = int(image_size[0]), int(image_size[1])
    kernel = KERNELS[transform.interpolation]
    if new_width != pixels.shape[1]:
        pixels = _filter_pass(pixels, 1, filter_band(pixels.shape[1], new_width, kernel, left, width))
    else:
        pixels = pixels[:, left : left + width]
    if new_height != pixels.shape[0]:
        return _filter_pass(pixels, 0, filter_band(pixels.shape[0], new_height, kernel, top, height))
    return pixels[top : top + height]


# Pillow's fixed point: weights in units of 2**-22 (`PRECISION_BITS`), sums rounded half up.
PRECISION = 2.0**22


def to_8_bits(sums):
    """A pass's sums of pixels times fixed-point weights as Pillow stores them: rounded half up
    and clipped to [0, 255] (the bicubic filter overshoots at edges), as float32."""
    return np.clip(np.floor((sums + PRECISION / 2) / PRECISION), 0.0, 255.0).astype(np.float32)


def _triangle(x):
    x = np.abs(x)
    return np.where(x < 1.0, 1.0 - x, 0.0)


def _keys_cubic(x):
    """Keys' cubic with a = -0.5, in Pillow's operation order (its `bicubic_filter`)."""
    x = np.abs(x)
    near = ((-0.5 + 2.0) * x - (-0.5 + 3.0)) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * -0.5
    return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))


# The resize filters by the transform's interpolation, with the distance each reaches (Pillow's
# BILINEAR and BICUBIC, which TensorFlow's antialiased triangle and keyscubic equal).
KERNELS = {"bilinear": (_triangle, 1.0), "bicubic": (_keys_cubic, 2.0)}


def filter_band(size, new_size, kernel, start=0, length=None):
    """Pillow's resize from `size` to `new_size` as a band: `(sources, weights)`, each
    `(length, taps)`, the source index and fixed-point weight (a whole number, in float64) of every
    tap of outputs `start` to `start + length`: half-pixel centres, the kernel widened by the shrink
    factor (antialiasing), each output's weights normalised in order, then rounded away from zero
    to 2**-22. A few taps an output, whatever the photo's size."""
    function, radius = kernel
    length = new_size - start if length is None else length
    scale = size / new_size
    kernel_scale = max(scale, 1.0)
    centres = (np.arange(start, start + length) + 0.5) * scale
    first = np.maximum(np.floor(centres - radius * kernel_scale), 0).astype(int)
    sources = first[:, None] + np.arange(int(np.ceil(2 * radius * kernel_scale)) + 2)
    weights = np.where(
        sources < size, function((sources - centres[:, None] + 0.5) * (1.0 / kernel_scale)), 0.0
    )
    totals = np.cumsum(weights, axis=1)[:, -1:]  # Pillow adds them up in order
    weights = weights / np.where(totals == 0.0, 1.0, totals)
    weights = np.trunc(weights * PRECISION + np.where(weights < 0, -0.5, 0.5))
    return np.minimum(sources, size - 1), weights  # the taps past the edge weigh nothing


def filter_weights(size, new_size, kernel, start=0, length=None):
    """`filter_band` as a dense `(length, size)` matrix of fixed-point weights."""
    sources, weights = filter_band(size, new_size, kernel, start, length)
    matrix = np.zeros((len(sources), size))
    np.add.at(matrix, (np.arange(len(sources))[:, None], sources), weights)
    return matrix


def _filter_pass(pixels, axis, band):
    """One pass of `resize` along `axis` (0: height, 1: width), stored in 8 bits."""
    sources, weights = band
    moved = np.ascontiguousarray(np.moveaxis(pixels, axis, 0), dtype=np.float64)
    sums = sum(weights[:, k, None, None] * moved[sources[:, k]] for k in range(weights.shape[1]))
    return np.moveaxis(to_8_bits(sums), 0, axis)


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


def image_files(folder, recursive=False):
    """The image files in `folder`, sorted by name; with `recursive`, those in its subfolders too
    (a dataset's class folders), each folder's images before its subfolders', in name order.

    Raises:
        FileNotFoundError: no such folder.
        ValueError: `folder` is a file, or holds no images.
    """
    folder = os.fspath(folder)
    if not os.path.exists(folder):
        raise FileNotFoundError(f"Folder not found: {folder}")
    if not os.path.isdir(folder):
        raise ValueError(f"{folder} is a file, not a folder.")
    files = []
    for parent, folders, names in os.walk(folder):
        folders.sort()  # os.walk descends in this order
        files += sorted(
            os.path.join(parent, name) for name in names if name.lower().endswith(IMAGE_EXTENSIONS)
        )
        if not recursive:
            break
    if not files:
        where = " or its subfolders" if recursive else ""
        raise ValueError(f"{folder}{where} holds no images ({', '.join(IMAGE_EXTENSIONS)}).")
    return files
