"""Attention maps drawn over images: a heat map of where the [cls] token looked."""

import numpy as np

OPACITY = 0.5


def upsample(attention, size):
    """A `(rows, cols)` map in [0, 1] smoothed up to `size` (height, width), bicubic, so
    patches blend as in the papers' figures rather than show as blocks."""
    from PIL import Image

    height, width = size
    values = Image.fromarray(np.clip(np.asarray(attention, np.float32), 0.0, 1.0))
    return np.clip(np.asarray(values.resize((width, height), Image.Resampling.BICUBIC)), 0.0, 1.0)


def blend(image, attention, opacity=OPACITY):
    """RGB uint8 `image` under the attention heat map (inferno: dark where the [cls] token
    attended least, bright yellow where most)."""
    from matplotlib import colormaps

    attention = np.asarray(attention, np.float32)
    # Rollout maps of small models are flat (the skip connections dominate): stretch the
    # range so the image shows where attention is highest, not that it is everywhere.
    spread = attention.max() - attention.min()
    attention = (attention - attention.min()) / spread if spread > 1e-6 else np.zeros_like(attention)
    weight = upsample(attention, image.shape[:2])
    colours = 255 * colormaps["inferno"](weight)[..., :3]
    mixed = (1 - opacity) * image.astype(np.float32) + opacity * colours
    return np.clip(np.round(mixed), 0, 255).astype(np.uint8)
