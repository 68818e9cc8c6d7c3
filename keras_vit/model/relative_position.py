"""Relative positions on a grid of tokens, in NumPy, as timm computes them: the index of each pair
of tokens into a bias table (`relative_position_index`), the log-spaced coordinates timm's
`RelPosMlp` reads (`relative_log_coords`), and the resizing of a bias table to another window, as
timm's `resize_rel_pos_bias_table` does by default (its own linear interpolation on BEiT's
geometric grid, not scipy's): a checkpoint trained with one window fine-tunes or runs with
another. Shared by the Swin's window attention and the ViT's relative position biases."""

import numpy as np


def relative_position_index(window, class_token=False):
    """`(N, N)` indices into the `(2h - 1)(2w - 1)` bias table, for the N = h * w tokens of a
    window (timm's `gen_relative_position_index`). With `class_token`, one more token first, as
    BEiT's: its row, its column and its own pair index the table's last three entries."""
    h, w = window
    coords = np.stack(np.meshgrid(np.arange(h), np.arange(w), indexing="ij")).reshape(2, -1)
    relative = (coords[:, :, None] - coords[:, None, :]).transpose(1, 2, 0)
    relative[:, :, 0] += h - 1
    relative[:, :, 1] += w - 1
    relative[:, :, 0] *= 2 * w - 1
    index = relative.sum(-1)
    if class_token:
        distances = (2 * h - 1) * (2 * w - 1)
        index = np.pad(index, ((1, 0), (1, 0)))
        index[0, :] = distances
        index[:, 0] = distances + 1
        index[0, 0] = distances + 2
    return index.astype("int32")


def relative_log_coords(window):
    """`(2h - 1, 2w - 1, 2)`: each relative offset `(dy, dx)` as `sign(d) log(1 + |d|)` (timm's
    `gen_relative_log_coords`, its "cr" mode, in float32 as timm's)."""
    h, w = window
    rows, cols = np.meshgrid(
        np.arange(-(h - 1), h, dtype=np.float32), np.arange(-(w - 1), w, dtype=np.float32), indexing="ij"
    )
    coords = np.stack([rows, cols], axis=-1)
    return (np.sign(coords) * np.log1p(np.abs(coords))).astype(np.float32)


def resize_bias_table(table, new_window, old_window=None, extra_entries=0):
    """`table` ((2h - 1)(2w - 1), heads) for `old_window` (by default the square its size
    implies) resampled for `new_window` (h, w). Its last `extra_entries` rows (a [cls] token's,
    `relative_position_index(class_token=True)`) are kept as they are."""
    table = np.asarray(table, dtype=np.float32)
    if extra_entries:
        resized = resize_bias_table(table[:-extra_entries], new_window, old_window)
        return np.concatenate([resized, table[-extra_entries:]], axis=0)
    new_size = (2 * new_window[0] - 1, 2 * new_window[1] - 1)
    if old_window is not None:
        old_size = (2 * old_window[0] - 1, 2 * old_window[1] - 1)
    else:
        side = int(round(table.shape[0] ** 0.5))
        if side * side == table.shape[0]:
            old_size = (side, side)
        elif table.shape[0] == new_size[0] * new_size[1]:
            old_size = new_size
        else:
            raise ValueError(
                f"A bias table of {table.shape[0]} positions is no square window's: give its window."
            )
    if old_size == new_size:
        return table
    rows = _geometric_positions(old_size[0], new_size[0])
    cols = _geometric_positions(old_size[1], new_size[1])
    target_rows = np.arange(-(new_size[0] // 2), new_size[0] // 2 + 0.1, 1.0, dtype=np.float32)
    target_cols = np.arange(-(new_size[1] // 2), new_size[1] // 2 + 0.1, 1.0, dtype=np.float32)
    heads = [
        _interpolate(rows, cols, table[:, head].reshape(old_size), target_rows, target_cols).reshape(-1)
        for head in range(table.shape[1])
    ]
    return np.stack(heads, axis=-1).astype(np.float32)


def _geometric_positions(source, target):
    """BEiT's source positions: spaced by a geometric progression whose ratio stretches the
    source's half-width over the target's."""
    left, right = 1.01, 1.5
    while right - left > 1e-6:
        ratio = (left + right) / 2.0
        if (1.0 - ratio ** (source // 2)) / (1.0 - ratio) > target // 2:  # the progression's sum
            right = ratio
        else:
            left = ratio
    distances, current = [], 1.0
    for i in range(source // 2):
        distances.append(current)
        current += ratio ** (i + 1)
    # float32, as timm's torch.tensor of them
    return np.array([-d for d in reversed(distances)] + [0.0] + distances, dtype=np.float32)


def _interpolate(rows, cols, values, target_rows, target_cols):
    """timm's `RegularGridInterpolator` (linear, clamped at the edges) at the grid of targets."""
    grid_rows, grid_cols = np.meshgrid(target_rows, target_cols, indexing="ij")
    (row_left, row_right), (row_dl, row_dr) = _brackets(rows, grid_rows.reshape(-1))
    (col_left, col_right), (col_dl, col_dr) = _brackets(cols, grid_cols.reshape(-1))
    result = (
        values[row_left, col_left] * row_dr * col_dr
        + values[row_left, col_right] * row_dr * col_dl
        + values[row_right, col_left] * row_dl * col_dr
        + values[row_right, col_right] * row_dl * col_dl
    ) / ((row_dl + row_dr) * (col_dl + col_dr))
    return result.reshape(grid_rows.shape)


def _brackets(points, x):
    right = np.searchsorted(points, x, side="left")
    right[right >= len(points)] = len(points) - 1
    left = np.clip(right - 1, 0, len(points) - 1)
    distance_left = np.maximum(x - points[left], 0.0).astype(np.float32)
    distance_right = np.maximum(points[right] - x, 0.0).astype(np.float32)
    both_zero = (distance_left == 0) & (distance_right == 0)
    distance_left[both_zero] = distance_right[both_zero] = 1.0
    return (left, right), (distance_left, distance_right)
