"""The Swin Transformer's window arithmetic in NumPy, as timm computes it: a block's window and
shift on its grid, the padding and the shifted windows' attention mask, each a constant computed
once per layer (the relative-position index: `keras_vit.model.relative_position`). Keras-free: the
complexity counts read it. (The tensor ops that move windows are in `layers.py`.)
"""

import math

import numpy as np

# timm's value for pairs of tokens from different regions of a shifted window.
MASKED = -100.0


def stage_window(grid, window, shift):
    """(window, shift) of a block on a `grid` of tokens, as timm's `_calc_window_shift`: a side
    the window does not fit in is one window, with no shift."""
    windows = tuple(g if g <= w else w for g, w in zip(grid, window, strict=True))
    shifts = tuple(0 if g <= w else s for g, w, s in zip(grid, windows, shift, strict=True))
    return windows, shifts


def padded(grid, window):
    """The grid padded on the bottom and right to whole windows."""
    return tuple(math.ceil(g / w) * w for g, w in zip(grid, window, strict=True))


def shift_mask(grid, window, shift):
    """`(windows, N, N)`: 0 for pairs of tokens of one region of the shifted, padded grid and
    -100 for pairs from regions the shift brought together (timm's `get_attn_mask`)."""
    height, width = padded(grid, window)
    regions = np.zeros((height, width), dtype="float32")
    count = 0
    for rows in ((0, -window[0]), (-window[0], -shift[0]), (-shift[0], None)):
        for cols in ((0, -window[1]), (-window[1], -shift[1]), (-shift[1], None)):
            regions[rows[0] : rows[1], cols[0] : cols[1]] = count
            count += 1
    windows = _partition_numpy(regions, window)
    mask = windows[:, None, :] - windows[:, :, None]
    return np.where(mask != 0, MASKED, 0.0).astype("float32")


def _partition_numpy(grid_values, window):
    h, w = window
    rows, cols = grid_values.shape[0] // h, grid_values.shape[1] // w
    return grid_values.reshape(rows, h, cols, w).transpose(0, 2, 1, 3).reshape(rows * cols, h * w)
