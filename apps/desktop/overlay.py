"""Attention maps drawn over images: a heat map of where the [cls] token looked."""

import numpy as np

OPACITY = 0.6


def upsample(attention, size):
    """A `(rows, cols)` map in [0, 1] smoothed up to `size` (height, width), bicubic, so
    patches blend as in the papers' figures rather than show as blocks."""
    from PIL import Image

    height, width = size
    values = Image.fromarray(np.clip(np.asarray(attention, np.float32), 0.0, 1.0))
    return np.clip(np.asarray(values.resize((width, height), Image.Resampling.BICUBIC)), 0.0, 1.0)


def blend(image, attention, opacity=OPACITY):
    """RGB uint8 `image` with the attention heat map (inferno) over it, weighted by the
    attention itself: where the model did not look, the image shows through."""
    from matplotlib import colormaps

    weight = upsample(attention, image.shape[:2])
    colours = 255 * colormaps["inferno"](weight)[..., :3]
    alpha = opacity * np.clip(weight, 0.2, 1.0)[..., None]
    mixed = (1 - alpha) * image.astype(np.float32) + alpha * colours
    return np.clip(np.round(mixed), 0, 255).astype(np.uint8)
