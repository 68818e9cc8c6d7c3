"""Resampling of position embeddings to a new patch grid.

Matches timm's `resample_abs_pos_embed` (bicubic, antialias=True), which
calls PyTorch's antialiased bicubic interpolation: the PIL filter, a cubic
kernel with a = -0.5, widened when shrinking, with weights renormalised at
the borders. FlexiViT's and RADIO's checkpoints are resampled as timm resamples
them instead: bilinear without antialiasing ("bilinear"), RADIO-B/H v3's with
aligned corners ("bilinear_aligned"). transformers' DINOv2, SigLIP and CLIP resample theirs
with PyTorch's bicubic without antialiasing (a cubic kernel with a = -0.75, borders
replicated: "bicubic_no_antialias"). It is written in NumPy so that loading
weights needs neither PyTorch nor a TensorFlow graph.
"""

import math

import numpy as np


def _cubic(x, a=-0.5):
    x = np.abs(x)
    return np.where(
        x < 1.0,
        ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0,
        np.where(x < 2.0, (((x - 5.0) * x + 8.0) * x - 4.0) * a, 0.0),
    )


def _resize_matrix(in_size, out_size):
    """Returns the (out_size, in_size) matrix of 1-D antialiased bicubic resizing."""
    scale = in_size / out_size
    support_scale = max(scale, 1.0)
    support = 2.0 * support_scale
    matrix = np.zeros((out_size, in_size), dtype=np.float64)
    for i in range(out_size):
        center = (i + 0.5) * scale
        start = max(int(center - support + 0.5), 0)
        stop = min(int(center + support + 0.5), in_size)
        taps = np.arange(start, stop)
        weights = _cubic((taps - center + 0.5) / support_scale)
        total = weights.sum()
        matrix[i, start:stop] = weights / total if total != 0 else weights
    return matrix


def _linear_matrix(in_size, out_size, align_corners=False):
    """The (out_size, in_size) matrix of PyTorch's 1-D linear interpolation (no antialiasing)."""
    matrix = np.zeros((out_size, in_size), dtype=np.float64)
    for i in range(out_size):
        if align_corners:
            source = i * (in_size - 1) / (out_size - 1) if out_size > 1 else 0.0
        else:
            source = max((i + 0.5) * in_size / out_size - 0.5, 0.0)
        low = min(int(np.floor(source)), in_size - 1)
        high = min(low + 1, in_size - 1)
        weight = source - low
        matrix[i, low] += 1.0 - weight
        matrix[i, high] += weight
    return matrix


def _plain_cubic_matrix(in_size, out_size):
    """The (out_size, in_size) matrix of PyTorch's 1-D bicubic interpolation without
    antialiasing (`interpolate(mode="bicubic", align_corners=False)`): four taps of the a = -0.75
    kernel around each source position, the indices clamped to the borders."""
    matrix = np.zeros((out_size, in_size), dtype=np.float64)
    scale = in_size / out_size
    for i in range(out_size):
        source = (i + 0.5) * scale - 0.5
        start = math.floor(source)
        weights = _cubic(np.arange(start - 1, start + 3) - source, a=-0.75)
        for tap, weight in zip(range(start - 1, start + 3), weights, strict=True):
            matrix[i, min(max(tap, 0), in_size - 1)] += weight
    return matrix


def _matrix(in_size, out_size, interpolation):
    if interpolation == "bicubic":
        return _resize_matrix(in_size, out_size)
    if interpolation == "bicubic_no_antialias":
        return _plain_cubic_matrix(in_size, out_size)
    return _linear_matrix(in_size, out_size, align_corners=interpolation == "bilinear_aligned")


def resize_grid(grid, new_size, interpolation="bicubic"):
    """Resizes a (rows, cols, channels) array to new_size = (rows, cols)."""
    rows = _matrix(grid.shape[0], new_size[0], interpolation)
    cols = _matrix(grid.shape[1], new_size[1], interpolation)
    out = np.einsum("ir,rcd->icd", rows, grid.astype(np.float64))
    out = np.einsum("jc,icd->ijd", cols, out)
    return out.astype(grid.dtype)


def resample_position_embeddings(
    pos_embed, new_grid, old_grid=None, num_prefix_tokens=1, interpolation="bicubic"
):
    """Resamples `(1, prefix + rows * cols, dim)` position embeddings to `new_grid`.

    The prefix ([cls]) embeddings are kept; the grid part is resized with
    antialiased bicubic interpolation, or `interpolation` ("bilinear", "bilinear_aligned",
    "bicubic_no_antialias").
    `old_grid` defaults to a square grid.
    """
    pos_embed = np.asarray(pos_embed)
    if pos_embed.ndim != 3 or pos_embed.shape[0] != 1:
        raise ValueError(f"Position embeddings must have shape (1, tokens, dim), got {pos_embed.shape}.")
    prefix = pos_embed[:, :num_prefix_tokens]
    grid = pos_embed[0, num_prefix_tokens:]
    if old_grid is None:
        side = math.isqrt(grid.shape[0])
        if side * side != grid.shape[0]:
            raise ValueError(
                f"Cannot infer the patch grid of {grid.shape[0]} position embeddings "
                f"(not a square number); pass old_grid=(rows, cols)."
            )
        old_grid = (side, side)
    old_grid, new_grid = tuple(old_grid), tuple(new_grid)
    if old_grid == new_grid:
        return pos_embed
    grid = resize_grid(grid.reshape(old_grid + (-1,)), new_grid, interpolation)
    return np.concatenate([prefix, grid.reshape(1, -1, grid.shape[-1])], axis=1)
