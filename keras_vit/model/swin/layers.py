"""The Swin Transformer's layers, weight-compatible with timm's `swin_transformer.py`: the patch
embedding, window attention with its relative-position bias, the (shifted-)window block and
patch merging. Tokens stay channels-last grids, (batch, H, W, C), as timm keeps them.

Each layer stores its constructor arguments under `# === Config ===` and returns them from
`get_config`; the grid a block works on is part of its config, so the window, shift, mask and
bias index are constants of the layer (`keras_vit.model.swin.windows`).
"""

import warnings

import keras
from keras import ops

from keras_vit.model.checks import check_positive_int, check_rate, pair
from keras_vit.model.layers import Block, DropPath, weight_initializer
from keras_vit.model.relative_position import relative_position_index
from keras_vit.model.swin import windows


def _layer_norm(layer, epsilon, name):
    return keras.layers.LayerNormalization(epsilon=epsilon, dtype=layer.dtype_policy, name=name)


def _dense(layer, units, name, use_bias=True, activation=None):
    return keras.layers.Dense(
        units,
        use_bias=use_bias,
        activation=activation,
        kernel_initializer=weight_initializer(),
        dtype=layer.dtype_policy,
        name=name,
    )


# The tensor ops that move windows are TFLite builtins: the cyclic shift is two slices and a
# concatenation (there is no ROLL builtin), and no transpose has more than 5 dimensions (the
# GPU delegate and LiteRT.js refuse 6-D ones).


def _roll(x, shifts):
    """`x` (batch, H, W, C) rolled by `shifts` (rows, columns) as `torch.roll`, by two slices and
    a concatenation per axis. Slices, not an uneven `ops.split`: that converts to SPLIT_V, which
    XNNPACK does not take, so each shift cut the fp32 graph into another XNNPACK partition."""
    for axis, shift in ((1, shifts[0]), (2, shifts[1])):
        size = x.shape[axis]
        shift %= size
        if shift:
            head = x[:, : size - shift] if axis == 1 else x[:, :, : size - shift]
            tail = x[:, size - shift :] if axis == 1 else x[:, :, size - shift :]
            x = ops.concatenate([tail, head], axis=axis)
    return x


def _partition(x, window):
    """(batch, H, W, C) -> (batch * windows, h * w, C), row-major windows (timm's order)."""
    _, height, width, channels = x.shape
    h, w = window
    x = ops.reshape(x, (-1, h, width // w, w, channels))  # (batch * H/h, h, W/w, w, C)
    x = ops.transpose(x, (0, 2, 1, 3, 4))  # (batch * H/h, W/w, h, w, C)
    return ops.reshape(x, (-1, h * w, channels))


def _merge(windows, window, grid):
    """The inverse of `partition`: (batch * windows, h * w, C) -> (batch, H, W, C)."""
    height, width = grid
    h, w = window
    channels = windows.shape[-1]
    x = ops.reshape(windows, (-1, width // w, h, w, channels))
    x = ops.transpose(x, (0, 2, 1, 3, 4))  # (batch * H/h, h, W/w, w, C)
    return ops.reshape(x, (-1, height, width, channels))


@keras.saving.register_keras_serializable(package="keras_vit")
class SwinPatchEmbedding(keras.layers.Layer):
    """Pixels to a grid of tokens: a `patch_size` convolution with stride `patch_size`, then
    LayerNorm (timm's `PatchEmbed` with `norm_layer`, NHWC out).

    Args:
        patch_size: int. Side of the square patches.
        embed_dim: int. Width of the tokens.
        layer_norm_epsilon: float, default 1e-5 (PyTorch's, which Swin uses).
    """

    def __init__(self, patch_size, embed_dim, layer_norm_epsilon=1e-5, **kwargs):
        super().__init__(**kwargs)
        check_positive_int(patch_size, "patch_size")
        check_positive_int(embed_dim, "embed_dim")
        # === Config ===
        self.patch_size = patch_size
        self.embed_dim = embed_dim
        self.layer_norm_epsilon = layer_norm_epsilon

        self.projection = keras.layers.Conv2D(
            embed_dim,
            patch_size,
            strides=patch_size,
            kernel_initializer=weight_initializer(),
            dtype=self.dtype_policy,
            name="projection",
        )
        self.norm = _layer_norm(self, layer_norm_epsilon, "norm")

    def build(self, input_shape):
        height, width = input_shape[1], input_shape[2]
        if height % self.patch_size or width % self.patch_size:
            raise ValueError(
                f"Image size {height}x{width} (height x width) is not divisible by the patch size "
                f"{self.patch_size}: both sides must be multiples of {self.patch_size}."
            )
        self.projection.build(input_shape)
        self.norm.build((None, None, None, self.embed_dim))

    def call(self, images):
        return self.norm(self.projection(images))

    def compute_output_shape(self, input_shape):
        p = self.patch_size
        rows = None if input_shape[1] is None else input_shape[1] // p
        cols = None if input_shape[2] is None else input_shape[2] // p
        return (input_shape[0], rows, cols, self.embed_dim)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "patch_size": self.patch_size,
                "embed_dim": self.embed_dim,
                "layer_norm_epsilon": self.layer_norm_epsilon,
            }
        )
        return config


@keras.saving.register_keras_serializable(package="keras_vit")
class WindowAttention(keras.layers.Layer):
    """Multi-head self-attention inside each window, with a learned bias per head for each
    relative position (timm's `WindowAttention`): `qkv` maps C to 3C (queries, keys, values,
    each head-major), `proj` maps C back to C, and `relative_position_bias_table` holds
    `(2h - 1)(2w - 1)` biases per head.

    Args:
        dim: int. Width of the tokens.
        num_heads: int. Must divide `dim`.
        window: int or (h, w). The window's size in tokens.
        attention_dropout: float, default 0. Dropout on the attention weights.
        dropout: float, default 0. Dropout after the output projection.
    """

    def __init__(self, dim, num_heads, window, attention_dropout=0.0, dropout=0.0, **kwargs):
        super().__init__(**kwargs)
        check_positive_int(dim, "dim")
        check_positive_int(num_heads, "num_heads")
        if dim % num_heads:
            raise ValueError(
                f"num_heads={num_heads} does not divide the width {dim}: pick a head count that does."
            )
        check_rate(attention_dropout, "attention_dropout")
        check_rate(dropout, "dropout")
        # === Config ===
        self.dim = dim
        self.num_heads = num_heads
        self.window = pair(window, "window")
        self.attention_dropout = attention_dropout
        self.dropout = dropout

        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.tokens = self.window[0] * self.window[1]
        self.position_index = relative_position_index(self.window).reshape(-1)
        self.qkv = _dense(self, 3 * dim, "qkv")
        self.proj = _dense(self, dim, "proj")
        self.attention_dropout_layer = keras.layers.Dropout(
            attention_dropout, dtype=self.dtype_policy, name="attention_dropout"
        )
        self.dropout_layer = keras.layers.Dropout(dropout, dtype=self.dtype_policy, name="dropout")

    def build(self, input_shape):
        self.qkv.build(input_shape)
        self.proj.build(input_shape)
        h, w = self.window
        self.relative_position_bias_table = self.add_weight(
            shape=((2 * h - 1) * (2 * w - 1), self.num_heads),
            initializer=weight_initializer(),
            name="relative_position_bias_table",
            autocast=False,  # added to the float32 scores: never rounded to float16 first
        )

    def position_bias(self):
        """`(heads, N, N)`: each head's bias for each pair of the window's tokens."""
        bias = ops.take(self.relative_position_bias_table, self.position_index, axis=0)
        bias = ops.reshape(bias, (self.tokens, self.tokens, self.num_heads))
        return ops.transpose(bias, (2, 0, 1))

    def _split_heads(self, x):
        x = ops.reshape(x, (-1, self.tokens, self.num_heads, self.head_dim))
        return ops.transpose(x, (0, 2, 1, 3))

    def call(self, x, region_mask=None, training=None):
        """`x`: (batch * windows, N, C); `region_mask`: None or a constant (windows, N, N) of 0 and -100."""
        q, k, v = ops.split(self.qkv(x), 3, axis=-1)
        q = self._split_heads(q) * ops.cast(self.scale, x.dtype)
        k, v = self._split_heads(k), self._split_heads(v)
        scores = ops.matmul(q, ops.transpose(k, (0, 1, 3, 2)))
        # Softmax in float32: float16 logits overflow.
        scores = ops.cast(scores, "float32") + ops.expand_dims(ops.cast(self.position_bias(), "float32"), 0)
        if region_mask is not None:
            count = region_mask.shape[0]
            scores = ops.reshape(scores, (-1, count, self.num_heads, self.tokens, self.tokens))
            scores = scores + ops.expand_dims(
                ops.expand_dims(ops.convert_to_tensor(region_mask, "float32"), 1), 0
            )
            scores = ops.reshape(scores, (-1, self.num_heads, self.tokens, self.tokens))
        with warnings.catch_warnings():
            # A one-token window (a 1x1 grid) attends to itself alone, as timm computes it.
            warnings.filterwarnings("ignore", message="You are using a softmax over axis -1")
            weights = ops.cast(ops.softmax(scores, axis=-1), x.dtype)
        out = ops.matmul(self.attention_dropout_layer(weights, training=training), v)
        out = ops.reshape(ops.transpose(out, (0, 2, 1, 3)), (-1, self.tokens, self.dim))
        return self.dropout_layer(self.proj(out), training=training)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "dim": self.dim,
                "num_heads": self.num_heads,
                "window": list(self.window),
                "attention_dropout": self.attention_dropout,
                "dropout": self.dropout,
            }
        )
        return config


@keras.saving.register_keras_serializable(package="keras_vit")
class SwinBlock(Block):
    """A Swin Transformer block on a (batch, H, W, C) grid: `x + DropPath(W-MSA(LN(x)))`, then
    `x + DropPath(MLP(LN(x)))`, as timm's `SwinTransformerBlock`.

    The attention runs in windows of the grid, shifted by `shift` (rows, columns) with the
    regions the shift brings together masked apart. A grid that the window does not tile is
    padded with zeros on the bottom and right for the attention, as timm pads it.

    Args:
        dim: int. Width of the tokens.
        num_heads: int.
        grid: (H, W). The grid the block works on.
        window: int or (h, w). The stage's window; a side of the grid no larger than it is one
            window, with no shift (timm's `_calc_window_shift`).
        shift: int or (rows, cols), default 0. timm shifts every second block by window // 2.
        mlp_ratio: float, default 4. The MLP's hidden width over `dim`.
        dropout, attention_dropout, drop_path_rate: float, default 0.
        layer_norm_epsilon: float, default 1e-5.
    """

    def __init__(
        self,
        dim,
        num_heads,
        grid,
        window,
        shift=0,
        mlp_ratio=4.0,
        dropout=0.0,
        attention_dropout=0.0,
        drop_path_rate=0.0,
        layer_norm_epsilon=1e-5,
        **kwargs,
    ):
        super().__init__(**kwargs)
        # === Config ===
        self.dim = dim
        self.num_heads = num_heads
        self.grid = pair(grid, "grid")
        self.window = pair(window, "window")
        self.shift = (shift, shift) if isinstance(shift, int) else tuple(shift)  # 0 allowed
        self.mlp_ratio = float(mlp_ratio)
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.drop_path_rate = drop_path_rate
        self.layer_norm_epsilon = layer_norm_epsilon

        self.effective_window, self.effective_shift = windows.stage_window(self.grid, self.window, self.shift)
        self.padded_grid = windows.padded(self.grid, self.effective_window)
        self.mask = (
            windows.shift_mask(self.grid, self.effective_window, self.effective_shift)
            if any(self.effective_shift)
            else None
        )
        self.norm1 = _layer_norm(self, layer_norm_epsilon, "norm1")
        self.attention = WindowAttention(
            dim,
            num_heads,
            self.effective_window,
            attention_dropout=attention_dropout,
            dropout=dropout,
            dtype=self.dtype_policy,
            name="attention",
        )
        self.drop_path1 = DropPath(drop_path_rate, dtype=self.dtype_policy, name="drop_path1")
        self.norm2 = _layer_norm(self, layer_norm_epsilon, "norm2")
        # Exact (erf) GELU, as timm uses.
        self.fc1 = _dense(self, int(dim * self.mlp_ratio), "fc1", activation=keras.activations.gelu)
        self.mlp_dropout1 = keras.layers.Dropout(dropout, dtype=self.dtype_policy, name="mlp_dropout1")
        self.fc2 = _dense(self, dim, "fc2")
        self.mlp_dropout2 = keras.layers.Dropout(dropout, dtype=self.dtype_policy, name="mlp_dropout2")
        self.drop_path2 = DropPath(drop_path_rate, dtype=self.dtype_policy, name="drop_path2")

    def build(self, input_shape):
        if tuple(input_shape[1:]) != (*self.grid, self.dim):
            raise ValueError(
                f"SwinBlock works on a {self.grid[0]}x{self.grid[1]} grid of width {self.dim}, "
                f"got input shape {tuple(input_shape)}."
            )
        self.norm1.build(input_shape)
        self.attention.build((None, self.effective_window[0] * self.effective_window[1], self.dim))
        self.norm2.build(input_shape)
        self.fc1.build(input_shape)
        self.fc2.build((*input_shape[:-1], int(self.dim * self.mlp_ratio)))

    def _attend(self, x, training):
        """timm's `_attn`: shift, pad, attend in windows, merge, crop, shift back."""
        if any(self.effective_shift):
            x = _roll(x, (-self.effective_shift[0], -self.effective_shift[1]))
        pad_rows, pad_cols = (p - g for p, g in zip(self.padded_grid, self.grid, strict=True))
        if pad_rows or pad_cols:
            x = ops.pad(x, ((0, 0), (0, pad_rows), (0, pad_cols), (0, 0)))
        attended = self.attention(
            _partition(x, self.effective_window), region_mask=self.mask, training=training
        )
        x = _merge(attended, self.effective_window, self.padded_grid)
        if pad_rows or pad_cols:
            x = x[:, : self.grid[0], : self.grid[1], :]
        if any(self.effective_shift):
            x = _roll(x, self.effective_shift)
        return x

    def call(self, x, training=None):
        return self.forward_of(self._forward, x, training=training)

    def _forward(self, x, training=None):
        x = x + self.drop_path1(self._attend(self.norm1(x), training), training=training)
        y = self.mlp_dropout1(self.fc1(self.norm2(x)), training=training)
        y = self.mlp_dropout2(self.fc2(y), training=training)
        return x + self.drop_path2(y, training=training)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "dim": self.dim,
                "num_heads": self.num_heads,
                "grid": list(self.grid),
                "window": list(self.window),
                "shift": list(self.shift),
                "mlp_ratio": self.mlp_ratio,
                "dropout": self.dropout,
                "attention_dropout": self.attention_dropout,
                "drop_path_rate": self.drop_path_rate,
                "layer_norm_epsilon": self.layer_norm_epsilon,
            }
        )
        return config


@keras.saving.register_keras_serializable(package="keras_vit")
class PatchMerging(keras.layers.Layer):
    """Halves the grid and doubles the width (timm's `PatchMerging`): each 2x2 group of tokens
    concatenated in timm's order ((0, 0), (1, 0), (0, 1), (1, 1) as (row, column)), then
    LayerNorm over 4C and a bias-free projection to `out_dim`. An odd side is padded first.

    Args:
        dim: int. Width of the input tokens.
        out_dim: int or None. Width of the output (default 2 * dim).
        layer_norm_epsilon: float, default 1e-5.
    """

    def __init__(self, dim, out_dim=None, layer_norm_epsilon=1e-5, **kwargs):
        super().__init__(**kwargs)
        # === Config ===
        self.dim = dim
        self.out_dim = out_dim or 2 * dim
        self.layer_norm_epsilon = layer_norm_epsilon

        self.norm = _layer_norm(self, layer_norm_epsilon, "norm")
        self.reduction = _dense(self, self.out_dim, "reduction", use_bias=False)

    def build(self, input_shape):
        self.norm.build((None, None, None, 4 * self.dim))
        self.reduction.build((None, None, None, 4 * self.dim))

    def call(self, x):
        _, height, width, channels = x.shape
        if height % 2 or width % 2:
            x = ops.pad(x, ((0, 0), (0, height % 2), (0, width % 2), (0, 0)))
            height, width = height + height % 2, width + width % 2
        # (batch * H/2, 2 rows, W/2, 2 columns, C) -> (batch * H/2, W/2, columns, rows, C): 5-D at most.
        x = ops.reshape(x, (-1, 2, width // 2, 2, channels))
        x = ops.transpose(x, (0, 2, 3, 1, 4))
        x = ops.reshape(x, (-1, height // 2, width // 2, 4 * channels))
        return self.reduction(self.norm(x))

    def compute_output_shape(self, input_shape):
        def half(side):
            return None if side is None else (side + 1) // 2

        return (input_shape[0], half(input_shape[1]), half(input_shape[2]), self.out_dim)

    def get_config(self):
        config = super().get_config()
        config.update(
            {"dim": self.dim, "out_dim": self.out_dim, "layer_norm_epsilon": self.layer_norm_epsilon}
        )
        return config
