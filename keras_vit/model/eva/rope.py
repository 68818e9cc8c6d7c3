"""The rotary embeddings' tables, in NumPy (keras-free), as timm computes them
(`timm/layers/pos_embed_sincos.py`): for a fixed patch grid they are constants, so the exported
model holds them as tables and applies them with elementwise ops.

Each kind gives per-position angles `(tokens, head_dim / 2)` (one per rotated pair); the layout
(`interleaved`, EVA02's `rot()`, or `half`, `rope_rotate_half`) repeats them to `head_dim`.
"""

import numpy as np


def _axes(grid, indexing, values):
    """`values(size)` of each axis, in the channel order timm's meshgrid gives (`xy`: x first),
    spread over the grid: `(rows * cols, 2)`, positions row-major."""
    rows, cols = grid
    row_values, col_values = values(rows, 0), values(cols, 1)
    y, x = np.meshgrid(row_values, col_values, indexing="ij")
    coords = np.stack([x, y] if indexing == "xy" else [y, x], axis=-1)
    return coords.reshape(-1, 2)


def cat_angles(grid, head_dim, temperature, grid_offset=0.0, indexing="ij", ref_feat_shape=None):
    """EVA02's `RotaryEmbeddingCat` (in_pixels=False): integer positions (plus `grid_offset`),
    rescaled to `ref_feat_shape` when given, times `1 / temperature ** (i / bands)`."""
    bands = head_dim // 4
    frequencies = 1.0 / temperature ** (np.arange(bands, dtype=np.float32) / bands)

    def positions(size, axis):
        t = np.arange(size, dtype=np.float32) + np.float32(grid_offset)
        if ref_feat_shape is not None:
            t = t / size * ref_feat_shape[axis]
        return t

    coords = _axes(grid, indexing, positions)
    return (coords[:, :, None] * frequencies).reshape(len(coords), -1)


def dinov3_angles(grid, head_dim, temperature, grid_offset=0.0, indexing="ij"):
    """DINOv3's `RotaryEmbeddingDinoV3` at inference: 0.5-centred positions over each side,
    mapped to [-1, 1], over periods `temperature ** (2 i / (head_dim / 2))`."""
    bands = head_dim // 4
    periods = np.float32(temperature) ** (2.0 * np.arange(bands, dtype=np.float32) / (head_dim // 2))

    def positions(size, axis):
        return 2.0 * ((np.arange(0.5, size, dtype=np.float32) + np.float32(grid_offset)) / size) - 1.0

    coords = _axes(grid, indexing, positions).astype(np.float32)
    return (2 * np.pi * coords[:, :, None] / periods).reshape(len(coords), -1)


def mixed_positions(grid, indexing="xy"):
    """ROPE-ViT mixed's `(t_x, t_y)`: integer positions, `(tokens,)` each."""
    coords = _axes(grid, indexing, lambda size, axis: np.arange(size, dtype=np.float32))
    return coords[:, 0], coords[:, 1]


def mixed_frequencies(head_dim, depth, num_heads, temperature, seed=None):
    """timm's `init_random_2d_freqs`: `(2, depth, heads, head_dim / 2)`, a random rotation of the
    axial frequencies per block and head (the initial value of the learned frequencies)."""
    magnitude = 1.0 / temperature ** (np.arange(0, head_dim, 4, dtype=np.float32) / head_dim)
    angles = np.random.default_rng(seed).uniform(0, 2 * np.pi, (depth, num_heads, 1)).astype(np.float32)
    fx = np.concatenate([magnitude * np.cos(angles), magnitude * np.cos(angles + np.pi / 2)], axis=-1)
    fy = np.concatenate([magnitude * np.sin(angles), magnitude * np.sin(angles + np.pi / 2)], axis=-1)
    return np.stack([fx, fy]).astype(np.float32)


def layout(angles, rotate_half):
    """Per-pair values repeated to the head's width: `[a, a]` (half) or `[a0, a0, a1, a1, ...]`."""
    if rotate_half:
        return np.concatenate([angles, angles], axis=-1)
    return np.repeat(angles, 2, axis=-1)


def positions_and_scales(
    kind, grid, head_dim, temperature, grid_offset=0.0, indexing="ij", ref_feat_shape=None
):
    """`(coords (tokens, 2), scales (head_dim / 4,))` with `angles = coords[:, :, None] * scales`:
    the cat and dinov3 kinds' coordinates before timm's train-time augmentation moves them."""
    bands = head_dim // 4
    if kind == "cat":

        def positions(size, axis):
            t = np.arange(size, dtype=np.float32) + np.float32(grid_offset)
            return t / size * ref_feat_shape[axis] if ref_feat_shape is not None else t

        scales = 1.0 / temperature ** (np.arange(bands, dtype=np.float32) / bands)
    else:

        def positions(size, axis):
            return 2.0 * ((np.arange(0.5, size, dtype=np.float32) + np.float32(grid_offset)) / size) - 1.0

        scales = (
            2
            * np.pi
            / np.float32(temperature) ** (2.0 * np.arange(bands, dtype=np.float32) / (head_dim // 2))
        )
    return _axes(grid, indexing, positions).astype(np.float32), scales.astype(np.float32)
