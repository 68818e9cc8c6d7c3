"""The ViT family's layers: patches, the patch encoder with its prefix tokens and position
embeddings, multi-head self-attention, the Transformer block and the token pooling.

Each layer stores its constructor arguments under `# === Config ===`, builds
its sublayers with `dtype=self.dtype_policy` (so mixed precision needs no
special cases) and returns every argument from `get_config`.
"""

import math

import keras
from keras import ops

from keras_vit.model.checks import check_positive_int, check_rate
from keras_vit.model.layers import Block, DropPath, attention_output_spec, patch_grid, weight_initializer
from keras_vit.model.relative_position import relative_log_coords, relative_position_index
from keras_vit.model.vit.stems import ResNetV2Stem, StdConv2D, build_stem  # noqa: F401 (keras_vit.layers)


@keras.saving.register_keras_serializable(package="keras_vit")
def gelu_tanh(x):
    """GELU with the tanh approximation (timm's `gelu_tanh`, PyTorch's `approximate="tanh"`)."""
    return keras.activations.gelu(x, approximate=True)


@keras.saving.register_keras_serializable(package="keras_vit")
def quick_gelu(x):
    """OpenAI CLIP's `x * sigmoid(1.702 x)` (timm's `quick_gelu`)."""
    return x * ops.sigmoid(ops.cast(1.702, x.dtype) * x)


# The MLP's activation by its name (`ViT(activation=...)`): exact (erf) GELU, as timm and the
# original JAX code use, unless a model's says otherwise.
ACTIVATIONS = {
    "gelu": keras.activations.gelu,
    "gelu_tanh": gelu_tanh,
    "quick_gelu": quick_gelu,
    "silu": keras.activations.silu,
}


def activation_named(name):
    if name not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {', '.join(map(repr, ACTIVATIONS))}, got {name!r}.")
    return ACTIVATIONS[name]


# The norms by their kind (`ViT(norm=...)`, timm's `norm_layer`): LayerNorm or RmsNorm (AIMv2's).
NORMS = ("layernorm", "rmsnorm")


def norm_named(kind, epsilon, dtype, name, gamma_initializer="ones"):
    """A norm of the kind named: LayerNorm (scale and offset) or RmsNorm (scale only)."""
    if kind not in NORMS:
        raise ValueError(f"norm must be one of {', '.join(map(repr, NORMS))}, got {kind!r}.")
    if kind == "rmsnorm":
        return keras.layers.RMSNormalization(epsilon=epsilon, dtype=dtype, name=name)
    return keras.layers.LayerNormalization(
        epsilon=epsilon, gamma_initializer=gamma_initializer, dtype=dtype, name=name
    )


@keras.saving.register_keras_serializable(package="keras_vit")
class Patches(keras.layers.Layer):
    """Splits images into non-overlapping, flattened square patches.

    `(batch, height, width, channels)` becomes
    `(batch, num_patches, patch_size * patch_size * channels)`. Patches are in
    row-major order over the grid, and each patch is flattened as
    (row, column, channel), the order of a `Conv2D` kernel. Pixels past the last whole patch are
    not read, as by the convolution (`patch_grid`).

    Args:
        patch_size: int. Side of each square patch, in pixels.
    """

    def __init__(self, patch_size, **kwargs):
        super().__init__(**kwargs)
        check_positive_int(patch_size, "patch_size")
        # === Config ===
        self.patch_size = patch_size

    def compute_output_shape(self, input_shape):
        batch, height, width, channels = input_shape
        p = self.patch_size
        if height is None or width is None:
            return (batch, None, p * p * channels)
        rows, cols = patch_grid(height, width, p)
        return (batch, rows * cols, p * p * channels)

    def call(self, images):
        p = self.patch_size
        height, width, channels = images.shape[1], images.shape[2], images.shape[3]
        if height is not None and width is not None:
            rows, cols = patch_grid(height, width, p)
        else:
            dynamic = ops.shape(images)
            rows, cols = dynamic[1] // p, dynamic[2] // p
        images = images[:, : rows * p, : cols * p]  # the rows and columns no patch covers: unread
        x = ops.reshape(images, (-1, rows, p, cols, p, channels))
        x = ops.transpose(x, (0, 1, 3, 2, 4, 5))
        return ops.reshape(x, (-1, rows * cols, p * p * channels))

    def get_config(self):
        config = super().get_config()
        config.update({"patch_size": self.patch_size})
        return config


@keras.saving.register_keras_serializable(package="keras_vit")
class PatchEncoder(keras.layers.Layer):
    """Embeds patches, prepends the [cls] token and adds position embeddings.

    The linear projection of flattened patches is a `Conv2D` with
    kernel = stride = `patch_size`: the same map as `Patches` + `Dense`, and
    faster. The patch grid, and so the number of position embeddings, is
    fixed by the image size the layer is built with. To run a model at
    another resolution, resize it with `keras_vit.resize_model`, which
    resamples these embeddings as timm's `resample_abs_pos_embed` does.

    Args:
        patch_size: int. Side of each square patch, in pixels.
        hidden_dim: int. Width of the token embeddings.
        dropout: float, default 0. Dropout after adding position embeddings.
        cls_position_embedding: bool, default True. Whether the [cls] token gets a position
            embedding too (ViT, DeiT); DeiT III adds them to the patches only (timm's
            `no_embed_class`).
        distillation_token: bool, default False. A second prefix token after [cls], DeiT's
            distillation token.
        class_token: bool, default True. False: no [cls] token (models pooled by averaging).
        register_tokens: int, default 0. Learned register tokens after the other prefix
            tokens ("Vision Transformers Need Registers", Darcet et al. 2024).
        projection_bias: bool, default True. Whether the patch projection has a bias (CLIP's,
            followed by a LayerNorm, has none).
        position_embedding: bool, default True. False: no absolute position embeddings (a ViT
            whose attention has relative position biases instead, timm's
            `VisionTransformerRelPos`).
        stem: None (default) or the name of a convolutional stem (`keras_vit.model.vit.stems`:
            `"resnetv2"`) whose feature map the projection turns into tokens instead of the
            pixels (timm's `HybridEmbed`); its weights are the layer's `backbone`.
        stem_depths: list of ints, default (). The stem's stage depths (`ResNetV2Stem`).
        norm: None (default), "layernorm" or "rmsnorm". A norm on the patch tokens before the
            prefix tokens and position embeddings join them (timm's `PatchEmbed` with
            `embed_norm_layer`, AIMv2's), as `norm`.
        norm_epsilon: float, default 1e-6. That norm's epsilon.
    """

    def __init__(
        self,
        patch_size,
        hidden_dim,
        dropout=0.0,
        cls_position_embedding=True,
        distillation_token=False,
        class_token=True,
        register_tokens=0,
        projection_bias=True,
        position_embedding=True,
        stem=None,
        stem_depths=(),
        norm=None,
        norm_epsilon=1e-6,
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_positive_int(patch_size, "patch_size")
        if register_tokens:
            check_positive_int(register_tokens, "register_tokens")
        if distillation_token and not class_token:
            raise ValueError("A distillation token follows the [cls] token: set class_token=True.")
        check_positive_int(hidden_dim, "hidden_dim")
        check_rate(dropout, "dropout")
        # === Config ===
        self.patch_size = patch_size
        self.hidden_dim = hidden_dim
        self.dropout = dropout
        self.cls_position_embedding = bool(cls_position_embedding)
        self.distillation_token = bool(distillation_token)
        self.class_token = bool(class_token)
        self.register_tokens = int(register_tokens)
        self.projection_bias = bool(projection_bias)
        self.has_position_embedding = bool(position_embedding)
        self.stem = stem
        self.stem_depths = [int(depth) for depth in stem_depths]
        self.norm_kind = norm
        self.norm_epsilon = norm_epsilon
        # Tokens before the patch tokens: [cls], DeiT's distillation token, the registers.
        self.num_prefix_tokens = self.class_token + self.distillation_token + self.register_tokens
        # Prefix tokens that have a position embedding (before the grid's embeddings).
        self.position_prefix_tokens = self.num_prefix_tokens if self.cls_position_embedding else 0

        self.backbone = None
        if stem is not None:
            self.backbone = build_stem(
                stem, self.stem_depths, hidden_dim, dtype=self.dtype_policy, name="backbone"
            )
        # A stem that ends in the tokens' width has no projection after it (timm's proj=False).
        self.projection = None
        if self.backbone is None or not self.backbone.projects:
            self.projection = keras.layers.Conv2D(
                hidden_dim,
                kernel_size=patch_size,
                strides=patch_size,
                padding="valid",
                use_bias=self.projection_bias,
                kernel_initializer=weight_initializer(),
                dtype=self.dtype_policy,
                name="projection",
            )
        self.norm = None
        if norm is not None:
            self.norm = norm_named(norm, norm_epsilon, self.dtype_policy, "norm")
        self.dropout_layer = keras.layers.Dropout(dropout, dtype=self.dtype_policy, name="dropout")

    def build(self, input_shape):
        _, height, width, channels = input_shape
        if height is None or width is None:
            raise ValueError(
                "PatchEncoder needs a fixed image size to size its position "
                f"embeddings, got input shape {tuple(input_shape)}."
            )
        self.image_size = (height, width)
        features = input_shape
        if self.backbone is not None:
            self.backbone.build(input_shape)
            features = self.backbone.compute_output_shape(input_shape)
        self.grid_size = patch_grid(features[1], features[2], self.patch_size)
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        if self.projection is not None:
            self.projection.build(features)
        if self.norm is not None:
            self.norm.build((None, self.num_patches, self.hidden_dim))
        if self.class_token:
            self.cls_token = self.add_weight(
                shape=(1, 1, self.hidden_dim),
                initializer=keras.initializers.RandomNormal(stddev=1e-6),
                name="cls_token",
            )
        if self.register_tokens:
            self.reg_token = self.add_weight(
                shape=(1, self.register_tokens, self.hidden_dim),
                initializer=keras.initializers.RandomNormal(stddev=1e-6),
                name="reg_token",
            )
        if self.distillation_token:
            self.dist_token = self.add_weight(
                shape=(1, 1, self.hidden_dim),
                initializer=keras.initializers.RandomNormal(stddev=1e-6),
                name="dist_token",
            )
        self.position_embedding = None
        if self.has_position_embedding:
            self.position_embedding = self.add_weight(
                shape=(1, self.num_patches + self.position_prefix_tokens, self.hidden_dim),
                initializer=weight_initializer(),
                name="position_embedding",
            )

    def call(self, images, training=None):
        if tuple(images.shape[1:3]) != self.image_size:
            raise ValueError(
                f"This model takes {self.image_size[0]}x{self.image_size[1]} images but got "
                f"{images.shape[1]}x{images.shape[2]}. Resize the images to "
                f"{self.image_size[0]}x{self.image_size[1]}, or make a model for the new size "
                f"with keras_vit.resize_model(model, image_size)."
            )
        x = images if self.backbone is None else self.backbone(images, training=training)
        x = x if self.projection is None else self.projection(x)
        x = ops.reshape(x, (-1, self.num_patches, self.hidden_dim))
        if self.norm is not None:
            x = self.norm(x)
        tokens = [self.cls_token] if self.class_token else []
        tokens += [self.dist_token] if self.distillation_token else []
        tokens += [self.reg_token] if self.register_tokens else []
        batch = ops.shape(x)[0]
        prefix = [
            ops.broadcast_to(ops.cast(token, x.dtype), (batch, token.shape[1], self.hidden_dim))
            for token in tokens
        ]
        if self.position_embedding is None:
            x = ops.concatenate([*prefix, x], axis=1) if prefix else x
            return self.dropout_layer(x, training=training)
        position_embedding = ops.cast(self.position_embedding, x.dtype)
        if self.cls_position_embedding:
            x = ops.concatenate([*prefix, x], axis=1) + position_embedding
        else:
            x = ops.concatenate([*prefix, x + position_embedding], axis=1)
        return self.dropout_layer(x, training=training)

    def compute_output_shape(self, input_shape):
        if self.backbone is not None:
            input_shape = self.backbone.compute_output_shape(input_shape)
        rows, cols = patch_grid(input_shape[1], input_shape[2], self.patch_size)
        return (input_shape[0], rows * cols + self.num_prefix_tokens, self.hidden_dim)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "patch_size": self.patch_size,
                "hidden_dim": self.hidden_dim,
                "dropout": self.dropout,
                "cls_position_embedding": self.cls_position_embedding,
                "distillation_token": self.distillation_token,
                "class_token": self.class_token,
                "register_tokens": self.register_tokens,
                "projection_bias": self.projection_bias,
                "position_embedding": self.has_position_embedding,
                "stem": self.stem,
                "stem_depths": list(self.stem_depths),
                "norm": self.norm_kind,
                "norm_epsilon": self.norm_epsilon,
            }
        )
        return config


def fused_attention_applies(attention_dropout, training, return_attention_scores):
    """Whether attention may run as one fused kernel: on JAX (cuDNN's flash attention on a GPU,
    XLA's fused softmax elsewhere), when nobody asks for the weights and no dropout falls on them.
    TensorFlow keeps the explicit matmuls, softmax and matmul: the TFLite and ONNX exports and
    their integer recipes are written against those ops."""
    if return_attention_scores or training:
        return False
    return keras.backend.backend() == "jax"


def fused_attention(q, k, v, num_heads, scale, bias=None):
    """softmax(q k^T * scale + bias) v over `(batch, tokens, width)` projections, heads split from
    the width as timm splits them; returns `(batch, tokens, width)`."""
    heads = [ops.reshape(t, (-1, _tokens(t), num_heads, t.shape[-1] // num_heads)) for t in (q, k, v)]
    if bias is not None:
        bias = ops.cast(bias, q.dtype)
    out = ops.dot_product_attention(*heads, bias=bias, scale=scale, flash_attention=False)
    return ops.reshape(out, ops.shape(q))


def _tokens(x):
    """The token count of `(batch, tokens, ...)`: static where known."""
    return x.shape[1] if x.shape[1] is not None else ops.shape(x)[1]


# The attention's kind (`ViT(attention=...)`, timm's `attn_layer`).
ATTENTIONS = ("standard", "diff")


def _choices(names):
    return ", ".join(map(repr, names))


# The kinds of relative position bias (`ViT(position_bias=...)`, timm's `rel_pos_type`): "mlp",
# timm's `RelPosMlp` (an MLP of the log-spaced offsets, its "cr" mode), and "table", timm's
# `RelPosBias` (a learned table indexed by the offsets, BEiT's and the Swin's).
POSITION_BIASES = ("mlp", "table")


@keras.saving.register_keras_serializable(package="keras_vit")
class RelativePositionBias(keras.layers.Layer):
    """A relative position bias over a grid of patch tokens, added to every head's attention
    scores before the softmax (timm's `RelPosMlp` and `RelPosBias`, `vision_transformer_relpos`).

    Called on the tokens (for its place in the graph; their values are not read), it returns the
    `(1, heads, tokens, tokens)` float32 bias of each pair of tokens: a function of the pair's
    offset on the grid `(dy, dx)`, computed from the weights alone, so that it is the same for
    every image. Kinds:

    - `"mlp"` (timm's `RelPosMlp`, its default "cr" mode): `sign(d) log(1 + |d|)` of each offset
      through `bias_fc1` (ReLU, dropout 0.125 in training, as timm's) and `bias_fc2`; the prefix
      tokens' pairs get no bias. Its weights fit any grid.
    - `"table"` (timm's `RelPosBias`): a learned `relative_position_bias_table` of
      `(2 rows - 1)(2 cols - 1)` offsets, plus BEiT's three entries for a [cls] token (its row,
      its column, itself); a checkpoint's table is resized to another grid as timm resizes it.

    Args:
        kind: `"mlp"` or `"table"`.
        grid_size: (rows, cols) of the patch grid.
        num_heads: int. One bias per head.
        num_prefix_tokens: int, default 0. Tokens before the patches ([cls]; at most one for
            `"table"`, as timm's).
        hidden_dim: int, default 128. The MLP's width (timm's `rel_pos_dim`).
    """

    def __init__(self, kind, grid_size, num_heads, num_prefix_tokens=0, hidden_dim=128, **kwargs):
        super().__init__(**kwargs)
        if kind not in POSITION_BIASES:
            choices = ", ".join(map(repr, POSITION_BIASES))
            raise ValueError(f"position_bias must be one of {choices}, got {kind!r}.")
        check_positive_int(num_heads, "num_heads")
        check_positive_int(hidden_dim, "hidden_dim")
        if kind == "table" and num_prefix_tokens > 1:
            raise ValueError(
                f"A bias table has entries for one [cls] token, not {num_prefix_tokens} prefix tokens."
            )
        # === Config ===
        self.kind = kind
        self.grid_size = tuple(int(side) for side in grid_size)
        self.num_heads = num_heads
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.hidden_dim = hidden_dim

        rows, cols = self.grid_size
        self.num_offsets = (2 * rows - 1) * (2 * cols - 1)
        self.tokens = rows * cols + self.num_prefix_tokens
        if kind == "mlp":
            self.index = relative_position_index(self.grid_size).reshape(-1)
            self.coords = relative_log_coords(self.grid_size).reshape(-1, 2)
            self.bias_fc1 = keras.layers.Dense(
                hidden_dim, activation="relu", dtype=self.dtype_policy, name="bias_fc1"
            )
            self.bias_dropout = keras.layers.Dropout(0.125, dtype=self.dtype_policy, name="bias_dropout")
            self.bias_fc2 = keras.layers.Dense(num_heads, dtype=self.dtype_policy, name="bias_fc2")
        else:
            self.index = relative_position_index(self.grid_size, class_token=self.num_prefix_tokens > 0)
            self.index = self.index.reshape(-1)

    def build(self, input_shape):
        if self.kind == "mlp":
            self.bias_fc1.build((self.num_offsets, 2))
            self.bias_fc2.build((self.num_offsets, self.hidden_dim))
        else:
            self.relative_position_bias_table = self.add_weight(
                shape=(self.num_offsets + 3 * self.num_prefix_tokens, self.num_heads),
                initializer=keras.initializers.TruncatedNormal(stddev=0.02),
                name="relative_position_bias_table",
                autocast=False,  # added to the float32 scores: never rounded to float16 first
            )

    def call(self, x, training=None):
        if self.kind == "mlp":
            hidden = self.bias_dropout(self.bias_fc1(ops.convert_to_tensor(self.coords)), training=training)
            table = ops.cast(self.bias_fc2(hidden), "float32")
            patches = self.tokens - self.num_prefix_tokens
        else:
            table, patches = self.relative_position_bias_table, self.tokens
        bias = ops.take(table, ops.convert_to_tensor(self.index), axis=0)
        bias = ops.transpose(ops.reshape(bias, (patches, patches, self.num_heads)), (2, 0, 1))
        if patches != self.tokens:  # the MLP's: no bias for the prefix tokens' pairs
            prefix = self.num_prefix_tokens
            bias = ops.pad(bias, ((0, 0), (prefix, 0), (prefix, 0)))
        return ops.expand_dims(bias, 0)

    def compute_output_shape(self, input_shape):
        return (1, self.num_heads, self.tokens, self.tokens)

    def compute_output_spec(self, x, training=None):
        return keras.KerasTensor(self.compute_output_shape(x.shape), dtype="float32")

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "kind": self.kind,
                "grid_size": list(self.grid_size),
                "num_heads": self.num_heads,
                "num_prefix_tokens": self.num_prefix_tokens,
                "hidden_dim": self.hidden_dim,
            }
        )
        return config


@keras.saving.register_keras_serializable(package="keras_vit")
class MultiHeadSelfAttention(keras.layers.Layer):
    """Multi-head self-attention with one fused query/key/value projection.

    Weights are laid out as timm's `Attention`: `qkv` maps width D to 3D
    (queries, keys, values, each head-major), `proj` maps D back to D.

    Args:
        hidden_dim: int. Width of the tokens.
        num_heads: int. Number of heads; must divide `hidden_dim`.
        attention_dropout: float, default 0. Dropout on the attention weights.
        dropout: float, default 0. Dropout after the output projection.
        qkv_bias: bool, default True. Whether `qkv` has a bias.
        proj_bias: bool, default True. Whether `proj` has a bias.
        position_bias: None (default) or a dict of `RelativePositionBias`'s arguments (`kind`,
            `grid_size`, `num_prefix_tokens`, `hidden_dim`): the attention's own relative position
            bias (timm's `rel_pos`), added to the scores. A bias computed elsewhere (timm's shared
            one) is given to `call` instead.
        scale_norm: bool, default False. A LayerNorm on the heads' output before `proj`
            (BEiT-3's sub-LayerNorm; timm's `scale_norm`, its `norm`).
        layer_norm_epsilon: float, default 1e-6. That LayerNorm's.
    """

    def __init__(
        self,
        hidden_dim,
        num_heads,
        attention_dropout=0.0,
        dropout=0.0,
        qkv_bias=True,
        proj_bias=True,
        position_bias=None,
        scale_norm=False,
        layer_norm_epsilon=1e-6,
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_positive_int(hidden_dim, "hidden_dim")
        check_positive_int(num_heads, "num_heads")
        if hidden_dim % num_heads:
            raise ValueError(
                f"num_heads={num_heads} does not divide hidden_dim={hidden_dim}: "
                f"each head gets hidden_dim / num_heads channels. Pick a head count that divides "
                f"{hidden_dim}."
            )
        check_rate(attention_dropout, "attention_dropout")
        check_rate(dropout, "dropout")
        # === Config ===
        self.hidden_dim = hidden_dim
        self.num_heads = num_heads
        self.attention_dropout = attention_dropout
        self.dropout = dropout
        self.qkv_bias = bool(qkv_bias)
        self.proj_bias = bool(proj_bias)
        self.position_bias = None if position_bias is None else dict(position_bias)
        self.scale_norm = bool(scale_norm)
        self.layer_norm_epsilon = layer_norm_epsilon

        self.head_dim = hidden_dim // num_heads
        self.scale = self.head_dim**-0.5
        self.norm = None
        if self.scale_norm:
            self.norm = keras.layers.LayerNormalization(
                epsilon=layer_norm_epsilon, dtype=self.dtype_policy, name="norm"
            )
        self.rel_pos = None
        if self.position_bias is not None:
            self.rel_pos = RelativePositionBias(
                num_heads=num_heads, **self.position_bias, dtype=self.dtype_policy, name="rel_pos"
            )
        self.qkv = keras.layers.Dense(
            3 * hidden_dim,
            use_bias=self.qkv_bias,
            kernel_initializer=weight_initializer(),
            dtype=self.dtype_policy,
            name="qkv",
        )
        self.proj = keras.layers.Dense(
            hidden_dim,
            use_bias=self.proj_bias,
            kernel_initializer=weight_initializer(),
            dtype=self.dtype_policy,
            name="proj",
        )
        self.attention_dropout_layer = keras.layers.Dropout(
            attention_dropout, dtype=self.dtype_policy, name="attention_dropout"
        )
        self.dropout_layer = keras.layers.Dropout(dropout, dtype=self.dtype_policy, name="dropout")

    def build(self, input_shape):
        self.qkv.build(input_shape)
        self.proj.build(input_shape)
        if self.rel_pos is not None:
            self.rel_pos.build(input_shape)
        if self.norm is not None:
            self.norm.build(input_shape)

    def _split_heads(self, x, num_tokens):
        x = ops.reshape(x, (-1, num_tokens, self.num_heads, self.head_dim))
        return ops.transpose(x, (0, 2, 1, 3))

    def call(self, x, training=None, return_attention_scores=False, position_bias=None, queries=None):
        """`position_bias`: a `(1, heads, tokens, tokens)` bias computed elsewhere (timm's shared
        relative position bias), for an attention without its own. `queries`: only the first
        `queries` tokens attend (to every token), and the output has that many: what a head
        that reads the [cls] token needs from the last block."""
        num_tokens = _tokens(x)
        q, k, v = ops.split(self.qkv(x), 3, axis=-1)
        if self.rel_pos is not None:
            position_bias = self.rel_pos(x, training=training)
        if queries is not None:
            q = q[:, :queries]  # [:, :n], not [:, 0]: XNNPACK refuses a shrinking STRIDED_SLICE
            position_bias = None if position_bias is None else position_bias[:, :, :queries]
        if fused_attention_applies(self.attention_dropout, training, return_attention_scores):
            out = fused_attention(q, k, v, self.num_heads, self.scale, bias=position_bias)
            return self.dropout_layer(self.proj(self._scale_norm(out)), training=training)
        num_queries = num_tokens if queries is None else queries
        q = self._split_heads(q, num_queries) * ops.cast(self.scale, x.dtype)
        k = self._split_heads(k, num_tokens)
        v = self._split_heads(v, num_tokens)
        scores = ops.cast(ops.matmul(q, ops.transpose(k, (0, 1, 3, 2))), "float32")
        if position_bias is not None:
            scores = scores + ops.cast(position_bias, "float32")
        # Softmax in float32: float16 logits overflow on long sequences.
        weights = ops.cast(ops.softmax(scores, axis=-1), x.dtype)
        out = ops.matmul(self.attention_dropout_layer(weights, training=training), v)
        out = ops.reshape(ops.transpose(out, (0, 2, 1, 3)), (-1, num_queries, self.hidden_dim))
        out = self.dropout_layer(self.proj(self._scale_norm(out)), training=training)
        if return_attention_scores:
            return out, weights
        return out

    def _scale_norm(self, x):
        return x if self.norm is None else self.norm(x)

    def compute_output_shape(self, input_shape):
        return input_shape

    def compute_output_spec(
        self, x, training=None, return_attention_scores=False, position_bias=None, queries=None
    ):
        return attention_output_spec(self, x, return_attention_scores, queries)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "hidden_dim": self.hidden_dim,
                "num_heads": self.num_heads,
                "attention_dropout": self.attention_dropout,
                "dropout": self.dropout,
                "qkv_bias": self.qkv_bias,
                "proj_bias": self.proj_bias,
                "position_bias": self.position_bias,
                "scale_norm": self.scale_norm,
                "layer_norm_epsilon": self.layer_norm_epsilon,
            }
        )
        return config


@keras.saving.register_keras_serializable(package="keras_vit")
class DifferentialAttentionCore(keras.layers.Layer):
    """Differential attention over projected queries, keys and values (Ye et al. 2024, timm's
    `DiffAttention` and `DiffParallelScalingBlock`), without the projections around it.

    Each head's queries and keys are split in two halves of `head_dim / 2`, each pair gives a
    softmax map, and the head attends with the first map minus `lambda` times the second
    (`lambda = exp(lambda_q1 . lambda_k1) - exp(lambda_q2 . lambda_k2) + lambda_init`,
    `lambda_init = 0.8 - 0.6 exp(-0.3 depth)`); each head's output is RMS-normalised
    (`sub_norm`, epsilon 1e-5) and scaled by `1 - lambda_init`. Called on `(q, k, v)`, each
    `(batch, tokens, width)`, it returns `(batch, tokens, width)` (and the `(batch, heads, tokens,
    tokens)` differential maps when asked). Weights as timm's: `lambda_q1`, `lambda_k1`,
    `lambda_q2`, `lambda_k2`, `sub_norm`.

    Args:
        hidden_dim: int. Width of the tokens.
        num_heads: int. Heads; `2 * num_heads` must divide `hidden_dim`.
        depth: int, default 0. The block's index, which sets `lambda_init` (timm's `depth`).
        attention_dropout: float, default 0. Dropout on both softmax maps.
    """

    def __init__(self, hidden_dim, num_heads, depth=0, attention_dropout=0.0, **kwargs):
        super().__init__(**kwargs)
        check_positive_int(hidden_dim, "hidden_dim")
        check_positive_int(num_heads, "num_heads")
        if hidden_dim % (2 * num_heads):
            raise ValueError(
                f"Differential attention halves each of the {num_heads} heads: 2 x num_heads must divide "
                f"hidden_dim={hidden_dim}."
            )
        check_rate(attention_dropout, "attention_dropout")
        # === Config ===
        self.hidden_dim = hidden_dim
        self.num_heads = num_heads
        self.depth = int(depth)
        self.attention_dropout = attention_dropout

        self.head_dim = hidden_dim // num_heads // 2
        self.scale = self.head_dim**-0.5
        self.lambda_init = 0.8 - 0.6 * math.exp(-0.3 * self.depth)
        self.attention_dropout_layer = keras.layers.Dropout(
            attention_dropout, dtype=self.dtype_policy, name="attention_dropout"
        )

    def build(self, input_shape):
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            setattr(
                self,
                name,
                self.add_weight(
                    shape=(self.head_dim,),
                    initializer=keras.initializers.RandomNormal(stddev=0.1),
                    name=name,
                    autocast=False,  # timm computes lambda in float32
                ),
            )
        self.sub_norm = self.add_weight(shape=(2 * self.head_dim,), initializer="ones", name="sub_norm")

    def _lambda(self):
        first = ops.exp(ops.sum(self.lambda_q1 * self.lambda_k1))
        second = ops.exp(ops.sum(self.lambda_q2 * self.lambda_k2))
        return first - second + self.lambda_init

    def call(self, q, k, v, training=None, return_attention_scores=False):
        num_tokens = q.shape[1] if q.shape[1] is not None else ops.shape(q)[1]

        def heads(x, count, width):
            return ops.transpose(ops.reshape(x, (-1, num_tokens, count, width)), (0, 2, 1, 3))

        q = heads(q, 2 * self.num_heads, self.head_dim) * ops.cast(self.scale, q.dtype)
        k = heads(k, 2 * self.num_heads, self.head_dim)
        v = heads(v, self.num_heads, 2 * self.head_dim)
        scores = ops.cast(ops.matmul(q, ops.transpose(k, (0, 1, 3, 2))), "float32")
        weights = self.attention_dropout_layer(ops.softmax(scores, axis=-1), training=training)
        # Heads 2h and 2h + 1 are head h's two maps (timm's view(B, H, 2, N, N)): as (B, H, 2N, N),
        # an even split gives them. Not `weights[:, 0::2]`: XNNPACK refuses a slice with a step.
        pairs = ops.reshape(weights, (-1, self.num_heads, 2 * num_tokens, num_tokens))
        first, second = ops.split(pairs, 2, axis=2)
        differential = first - self._lambda() * second
        out = ops.matmul(ops.cast(differential, v.dtype), v)
        variance = ops.mean(ops.square(ops.cast(out, "float32")), axis=-1, keepdims=True)
        out = ops.cast(ops.cast(out, "float32") * ops.rsqrt(variance + 1e-5), v.dtype)
        out = out * ops.cast(self.sub_norm * (1 - self.lambda_init), v.dtype)
        out = ops.reshape(ops.transpose(out, (0, 2, 1, 3)), (-1, num_tokens, self.hidden_dim))
        if return_attention_scores:
            return out, ops.cast(differential, v.dtype)
        return out

    def compute_output_spec(self, q, k, v, training=None, return_attention_scores=False):
        return attention_output_spec(self, q, return_attention_scores)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "hidden_dim": self.hidden_dim,
                "num_heads": self.num_heads,
                "depth": self.depth,
                "attention_dropout": self.attention_dropout,
            }
        )
        return config


@keras.saving.register_keras_serializable(package="keras_vit")
class DifferentialAttention(keras.layers.Layer):
    """Multi-head differential attention (timm's `DiffAttention`, `attn_layer="diff"`: the "wee"
    ViTs): `qkv`, `DifferentialAttentionCore` (its weights under `diff`), `proj`.

    Args:
        hidden_dim, num_heads, attention_dropout, dropout, qkv_bias, proj_bias: as
            `MultiHeadSelfAttention`'s.
        depth: int, default 0. The block's index (`DifferentialAttentionCore`).
    """

    def __init__(
        self,
        hidden_dim,
        num_heads,
        attention_dropout=0.0,
        dropout=0.0,
        qkv_bias=True,
        proj_bias=True,
        depth=0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_rate(dropout, "dropout")
        # === Config ===
        self.hidden_dim = hidden_dim
        self.num_heads = num_heads
        self.attention_dropout = attention_dropout
        self.dropout = dropout
        self.qkv_bias = bool(qkv_bias)
        self.proj_bias = bool(proj_bias)
        self.depth = int(depth)
        self.rel_pos = None  # none: it takes no relative position bias

        self.diff = DifferentialAttentionCore(
            hidden_dim, num_heads, depth, attention_dropout, dtype=self.dtype_policy, name="diff"
        )
        self.qkv = keras.layers.Dense(
            3 * hidden_dim,
            use_bias=self.qkv_bias,
            kernel_initializer=weight_initializer(),
            dtype=self.dtype_policy,
            name="qkv",
        )
        self.proj = keras.layers.Dense(
            hidden_dim,
            use_bias=self.proj_bias,
            kernel_initializer=weight_initializer(),
            dtype=self.dtype_policy,
            name="proj",
        )
        self.dropout_layer = keras.layers.Dropout(dropout, dtype=self.dtype_policy, name="dropout")

    def build(self, input_shape):
        self.qkv.build(input_shape)
        self.diff.build(input_shape)
        self.proj.build(input_shape)

    def call(self, x, training=None, return_attention_scores=False, position_bias=None):
        if position_bias is not None:
            raise ValueError("Differential attention takes no relative position bias.")
        q, k, v = ops.split(self.qkv(x), 3, axis=-1)
        out = self.diff(q, k, v, training=training, return_attention_scores=return_attention_scores)
        out, scores = out if return_attention_scores else (out, None)
        out = self.dropout_layer(self.proj(out), training=training)
        return (out, scores) if return_attention_scores else out

    def compute_output_shape(self, input_shape):
        return input_shape

    def compute_output_spec(self, x, training=None, return_attention_scores=False, position_bias=None):
        return attention_output_spec(self, x, return_attention_scores)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "hidden_dim": self.hidden_dim,
                "num_heads": self.num_heads,
                "attention_dropout": self.attention_dropout,
                "dropout": self.dropout,
                "qkv_bias": self.qkv_bias,
                "proj_bias": self.proj_bias,
                "depth": self.depth,
            }
        )
        return config


class _Mlp:
    """timm's `Mlp`: fc1, the activation, fc2 (the activation fused into fc1's Dense)."""

    hidden_layers = ("fc1",)
    fused_activation = True

    def widths(self, mlp_dim):
        """The widths of the layers before the activation, and fc2's input width."""
        return (mlp_dim,), mlp_dim

    def hidden(self, outputs, activation):
        return outputs[0]


class _SwiGLU:
    """timm's `SwiGLU`: `activation(fc1_g(x)) * fc1_x(x)`, then fc2."""

    hidden_layers = ("fc1_g", "fc1_x")
    fused_activation = False

    def widths(self, mlp_dim):
        return (mlp_dim, mlp_dim), mlp_dim

    def hidden(self, outputs, activation):
        gate, x = outputs
        return activation(gate) * x


class _SwiGLUPacked:
    """timm's `SwiGLUPacked` (`GluMlp`, gate first): fc1's outputs split in halves `(a, b)`,
    `activation(a) * b`, then fc2 (DINOv2-g)."""

    hidden_layers = ("fc1",)
    fused_activation = False

    def widths(self, mlp_dim):
        return (mlp_dim,), mlp_dim // 2

    def hidden(self, outputs, activation):
        gate, x = ops.split(outputs[0], 2, axis=-1)
        return activation(gate) * x


# The MLP of a block by its kind (`ViT(mlp=...)`, timm's `mlp_layer`).
MLPS = {"mlp": _Mlp(), "swiglu": _SwiGLU(), "swiglu_packed": _SwiGLUPacked()}


class _ViTBlock(Block):
    """What every ViT block shares: `TransformerBlock`'s arguments, kept as its attributes (the
    kinds take the same ones, so `ViT(block=...)` swaps them), their common checks and the config.
    A kind refuses what it cannot be; its layers read the attributes."""

    def __init__(
        self,
        hidden_dim,
        num_heads,
        mlp_dim,
        dropout=0.0,
        attention_dropout=0.0,
        drop_path_rate=0.0,
        layer_norm_epsilon=1e-6,
        layer_scale=None,
        qkv_bias=True,
        proj_bias=True,
        activation="gelu",
        mlp="mlp",
        position_bias=None,
        attention="standard",
        depth=0,
        scale_attention_norm=False,
        scale_mlp_norm=False,
        norm="layernorm",
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_positive_int(hidden_dim, "hidden_dim")
        check_positive_int(num_heads, "num_heads")
        check_positive_int(mlp_dim, "mlp_dim")
        if attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {_choices(ATTENTIONS)}, got {attention!r}.")
        # === Config ===
        self.hidden_dim = hidden_dim
        self.num_heads = num_heads
        self.mlp_dim = mlp_dim
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.drop_path_rate = drop_path_rate
        self.layer_norm_epsilon = layer_norm_epsilon
        self.layer_scale = None if layer_scale is None else float(layer_scale)
        self.qkv_bias = bool(qkv_bias)
        self.proj_bias = bool(proj_bias)
        self.activation = activation
        self.mlp = mlp
        self.position_bias = None if position_bias is None else dict(position_bias)
        self.attention_kind = attention
        self.depth = int(depth)
        self.scale_attention_norm = bool(scale_attention_norm)
        self.scale_mlp_norm = bool(scale_mlp_norm)
        self.norm_kind = norm
        self.activation_function = activation_named(activation)
        self._make_layers()

    def _make_layers(self):
        """The kind's checks of the arguments it cannot take, then its layers."""
        raise NotImplementedError

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "hidden_dim": self.hidden_dim,
                "num_heads": self.num_heads,
                "mlp_dim": self.mlp_dim,
                "dropout": self.dropout,
                "attention_dropout": self.attention_dropout,
                "drop_path_rate": self.drop_path_rate,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "layer_scale": self.layer_scale,
                "qkv_bias": self.qkv_bias,
                "proj_bias": self.proj_bias,
                "activation": self.activation,
                "mlp": self.mlp,
                "position_bias": self.position_bias,
                "attention": self.attention_kind,
                "depth": self.depth,
                "scale_attention_norm": self.scale_attention_norm,
                "scale_mlp_norm": self.scale_mlp_norm,
                "norm": self.norm_kind,
            }
        )
        return config


@keras.saving.register_keras_serializable(package="keras_vit")
class TransformerBlock(_ViTBlock):
    """A pre-LayerNorm Transformer encoder block.

    `x + DropPath(Attention(LN(x)))`, then `x + DropPath(MLP(LN(x)))`, where
    the MLP is Dense, GELU, Dropout, Dense, Dropout (or the `mlp` and `activation` chosen).

    Args:
        hidden_dim: int. Width of the tokens.
        num_heads: int. Attention heads; must divide `hidden_dim`.
        mlp_dim: int. Hidden width of the MLP.
        dropout: float, default 0. Dropout after the attention projection and in the MLP.
        attention_dropout: float, default 0. Dropout on the attention weights.
        drop_path_rate: float, default 0. Stochastic depth rate of both branches.
        layer_norm_epsilon: float, default 1e-6.
        layer_scale: float or None. LayerScale (CaiT, DeiT III): each branch's output is
            multiplied by a learned per-channel scale that starts at this value.
        qkv_bias: bool, default True. Whether the attention's `qkv` has a bias.
        proj_bias: bool, default True. Whether the attention's output projection and the MLP's
            layers have biases (timm's `proj_bias`).
        activation: str, default "gelu". The MLP's activation: "gelu" (exact), "gelu_tanh",
            "quick_gelu" (OpenAI CLIP's) or "silu".
        mlp: str, default "mlp". The MLP's kind (timm's `mlp_layer`): "mlp" (fc1, activation,
            fc2), "swiglu" (`activation(fc1_g(x)) * fc1_x(x)`, fc2) or "swiglu_packed" (fc1's
            outputs halved into gate and value, fc2 on `mlp_dim / 2`).
        position_bias: None or a dict of `RelativePositionBias`'s arguments: the attention's own
            relative position bias (timm's `RelPosBlock`); a shared one is given to `call`.
        attention: str, default "standard". The attention's kind (timm's `attn_layer`):
            "standard" (`MultiHeadSelfAttention`) or "diff" (`DifferentialAttention`).
        depth: int, default 0. The block's index, which differential attention reads.
        scale_attention_norm: bool, default False. A LayerNorm on the attention's heads before its
            output projection (BEiT-3's sub-LayerNorm; timm's `scale_attn_norm`).
        scale_mlp_norm: bool, default False. A LayerNorm on the MLP's hidden units before `fc2`
            (timm's `scale_mlp_norm`: `mlp_norm`).
        norm: str, default "layernorm". The kind of the block's norms: "layernorm" or
            "rmsnorm" (timm's `norm_layer=RmsNorm`, AIMv2's).
    """

    def _make_layers(self):
        if self.mlp not in MLPS:
            raise ValueError(f"mlp must be one of {', '.join(map(repr, MLPS))}, got {self.mlp!r}.")
        if self.attention_kind == "diff" and (self.position_bias is not None or self.scale_attention_norm):
            raise ValueError("Differential attention takes no relative position bias and no scale norm.")
        self.mlp_part = MLPS[self.mlp]

        def dense(units, name, activation=None):
            return keras.layers.Dense(
                units,
                activation=activation,
                use_bias=self.proj_bias,
                kernel_initializer=weight_initializer(),
                dtype=self.dtype_policy,
                name=name,
            )

        def layer_norm(name):
            return norm_named(
                self.norm_kind,
                self.layer_norm_epsilon,
                self.dtype_policy,
                name,
                gamma_initializer=self._norm_scale_initializer(),
            )

        self.norm1 = layer_norm("norm1")
        common = dict(
            attention_dropout=self.attention_dropout,
            dropout=self.dropout,
            qkv_bias=self.qkv_bias,
            proj_bias=self.proj_bias,
            dtype=self.dtype_policy,
            name="attention",
        )
        if self.attention_kind == "diff":
            self.attention = DifferentialAttention(
                self.hidden_dim, self.num_heads, depth=self.depth, **common
            )
        else:
            self.attention = MultiHeadSelfAttention(
                self.hidden_dim,
                self.num_heads,
                position_bias=self.position_bias,
                scale_norm=self.scale_attention_norm,
                layer_norm_epsilon=self.layer_norm_epsilon,
                **common,
            )
        self.drop_path1 = DropPath(self.drop_path_rate, dtype=self.dtype_policy, name="drop_path1")
        self.norm2 = layer_norm("norm2")
        widths, self.mlp_hidden_dim = self.mlp_part.widths(self.mlp_dim)
        fused = self.activation_function if self.mlp_part.fused_activation else None
        for name, units in zip(self.mlp_part.hidden_layers, widths, strict=True):
            setattr(self, name, dense(units, name, activation=fused))
        self.mlp_dropout1 = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy, name="mlp_dropout1")
        self.mlp_norm = None
        if self.scale_mlp_norm:
            self.mlp_norm = norm_named(self.norm_kind, self.layer_norm_epsilon, self.dtype_policy, "mlp_norm")
        self.fc2 = dense(self.hidden_dim, "fc2")
        self.mlp_dropout2 = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy, name="mlp_dropout2")
        self.drop_path2 = DropPath(self.drop_path_rate, dtype=self.dtype_policy, name="drop_path2")

    def build(self, input_shape):
        if input_shape[-1] != self.hidden_dim:
            raise ValueError(
                f"TransformerBlock has hidden_dim={self.hidden_dim} but its input has "
                f"{input_shape[-1]} channels (input shape {tuple(input_shape)})."
            )
        self.norm1.build(input_shape)
        self.attention.build(input_shape)
        self.norm2.build(input_shape)
        for layer in self.mlp_hidden_layers:
            layer.build(input_shape)
        self.fc2.build(tuple(input_shape[:-1]) + (self.mlp_hidden_dim,))
        if self.mlp_norm is not None:
            self.mlp_norm.build(tuple(input_shape[:-1]) + (self.mlp_hidden_dim,))
        if self.has_layer_scale:
            scale = keras.initializers.Constant(self.layer_scale)
            self.ls1 = self.add_weight(shape=(self.hidden_dim,), initializer=scale, name="ls1")
            self.ls2 = self.add_weight(shape=(self.hidden_dim,), initializer=scale, name="ls2")

    @property
    def has_layer_scale(self):
        """Whether the block has LayerScale's `ls1` and `ls2`."""
        return self.layer_scale is not None

    def _norm_scale_initializer(self):
        return "ones"

    @property
    def mlp_hidden_layers(self):
        """The MLP's Dense layers before its activation (fc1, or SwiGLU's fc1_g and fc1_x)."""
        return [getattr(self, name) for name in self.mlp_part.hidden_layers]

    def _mlp(self, x, training=None):
        hidden = [layer(x) for layer in self.mlp_hidden_layers]
        # SwiGLU's gate (its split, activation and product) gets a name of its own in a converted
        # graph, which its quantisation op group selects; a plain MLP adds no op here (fc1 fuses
        # its activation).
        with keras.name_scope("swiglu"):
            y = self.mlp_part.hidden(hidden, self.activation_function)
        y = self.mlp_dropout1(y, training=training)
        if self.mlp_norm is not None:
            y = self.mlp_norm(y)
        return self.mlp_dropout2(self.fc2(y), training=training)

    def _layer_scaled(self, branch, which):
        """`branch` times LayerScale's `ls1` or `ls2`, when the block has LayerScale."""
        if not self.has_layer_scale:
            return branch
        return branch * ops.cast(getattr(self, which), branch.dtype)

    def call(self, x, training=None, return_attention_scores=False, position_bias=None, queries=None):
        """`position_bias`: a shared relative position bias (`RelativePositionBias`' output).
        `queries`: only the first `queries` tokens go through the block, attending to every
        token, and only they come out (`vit.classify`: the last block of a model whose head
        reads the [cls] token). Standard attention only."""
        arguments = dict(position_bias=position_bias)
        if queries is not None:
            if not isinstance(self.attention, MultiHeadSelfAttention):
                raise ValueError(f"{self.name}: only standard attention computes some tokens' queries alone.")
            arguments["queries"] = queries
        if return_attention_scores:  # inference only: nothing to recompute
            return self._forward(x, training, return_attention_scores=True, **arguments)
        return self.forward_of(self._forward, x, training=training, **arguments)

    def _attend(self, x, training, return_attention_scores, position_bias, queries=None):
        """The attention's output, and its weights when asked for (else None)."""
        arguments = dict(training=training, return_attention_scores=return_attention_scores)
        if queries is not None:  # standard attention only (`call` checks)
            arguments["queries"] = queries
        attended = self.attention(x, position_bias=position_bias, **arguments)
        return attended if return_attention_scores else (attended, None)

    def _forward(self, x, training=None, return_attention_scores=False, position_bias=None, queries=None):
        normed = self.norm1(x)
        attended, scores = self._attend(normed, training, return_attention_scores, position_bias, queries)
        if queries is not None:  # the residual stream of the tokens that attended
            x = x[:, :queries]
        x = x + self.drop_path1(self._layer_scaled(attended, "ls1"), training=training)
        y = self._mlp(self.norm2(x), training=training)
        x = x + self.drop_path2(self._layer_scaled(y, "ls2"), training=training)
        if return_attention_scores:
            return x, scores
        return x

    def compute_output_shape(self, input_shape):
        return input_shape

    def compute_output_spec(
        self, x, training=None, return_attention_scores=False, position_bias=None, queries=None
    ):
        return attention_output_spec(self, x, return_attention_scores, queries)


@keras.saving.register_keras_serializable(package="keras_vit")
class ResPostBlock(TransformerBlock):
    """A post-LayerNorm Transformer block (timm's `ResPostBlock` and `ResPostRelPosBlock`, the
    "rpn" ViTs): `x + DropPath(LN(Attention(x)))`, then `x + DropPath(LN(MLP(x)))`.

    It takes `TransformerBlock`'s arguments, with timm's meaning of `layer_scale` here: no
    LayerScale weights, but the initial scale of both LayerNorms (timm's `init_values`).
    """

    @property
    def has_layer_scale(self):
        return False

    def _norm_scale_initializer(self):
        return "ones" if self.layer_scale is None else keras.initializers.Constant(self.layer_scale)

    def _forward(self, x, training=None, return_attention_scores=False, position_bias=None, queries=None):
        attended, scores = self._attend(x, training, return_attention_scores, position_bias, queries)
        if queries is not None:
            x = x[:, :queries]
        x = x + self.drop_path1(self.norm1(attended), training=training)
        x = x + self.drop_path2(self.norm2(self._mlp(x, training=training)), training=training)
        if return_attention_scores:
            return x, scores
        return x


@keras.saving.register_keras_serializable(package="keras_vit")
class ParallelScalingBlock(_ViTBlock):
    """Attention and MLP in parallel from one LayerNorm and one input projection (ViT-22B's,
    timm's `ParallelScalingBlock`; with `attention="diff"`, its `DiffParallelScalingBlock`):
    `x + DropPath(LayerScale(attn_out_proj(Attention(q, k, v)) + mlp_out_proj(act(h))))`, where
    `in_proj(in_norm(x))` gives `h` (the MLP's hidden units, with `mlp_bias` when there is no
    `qkv_bias`), then the queries, keys and values. Weights as timm's: `in_norm`, `in_proj`,
    `mlp_bias`, `attn_out_proj`, `mlp_out_proj`, `ls`, and differential attention's under `diff`;
    with differential attention one `out_proj` on both, concatenated (timm's
    `DiffParallelScalingBlock` fuses them).

    Args: `TransformerBlock`'s (`mlp` must be "mlp" and `position_bias` None, as timm's).
    """

    def _make_layers(self):
        if self.scale_attention_norm or self.scale_mlp_norm:
            raise ValueError("A parallel block has no scale norms (timm's neither).")
        if self.mlp != "mlp" or self.position_bias is not None:
            raise ValueError("A parallel block has timm's plain MLP and no relative position bias.")
        if self.hidden_dim % self.num_heads:
            raise ValueError(f"num_heads={self.num_heads} does not divide hidden_dim={self.hidden_dim}.")

        self.head_dim = self.hidden_dim // self.num_heads
        self.scale = self.head_dim**-0.5

        def dense(units, name, use_bias):
            return keras.layers.Dense(
                units,
                use_bias=use_bias,
                kernel_initializer=weight_initializer(),
                dtype=self.dtype_policy,
                name=name,
            )

        self.in_norm = norm_named(self.norm_kind, self.layer_norm_epsilon, self.dtype_policy, "in_norm")
        self.in_proj = dense(self.mlp_dim + 3 * self.hidden_dim, "in_proj", self.qkv_bias)
        self.diff = None
        if self.attention_kind == "diff":
            self.diff = DifferentialAttentionCore(
                self.hidden_dim,
                self.num_heads,
                self.depth,
                self.attention_dropout,
                dtype=self.dtype_policy,
                name="diff",
            )
        self.attention_dropout_layer = keras.layers.Dropout(
            self.attention_dropout, dtype=self.dtype_policy, name="attention_dropout"
        )
        self.mlp_dropout = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy, name="mlp_dropout")
        self.out_proj = self.attn_out_proj = self.mlp_out_proj = None
        if self.diff is not None:
            self.out_proj = dense(self.hidden_dim, "out_proj", self.proj_bias)
        else:
            self.attn_out_proj = dense(self.hidden_dim, "attn_out_proj", self.proj_bias)
            self.mlp_out_proj = dense(self.hidden_dim, "mlp_out_proj", self.proj_bias)
        self.drop_path = DropPath(self.drop_path_rate, dtype=self.dtype_policy, name="drop_path")

    def build(self, input_shape):
        self.in_norm.build(input_shape)
        self.in_proj.build(input_shape)
        if not self.qkv_bias:
            self.mlp_bias = self.add_weight(shape=(self.mlp_dim,), initializer="zeros", name="mlp_bias")
        if self.diff is not None:
            self.diff.build(input_shape)
        if self.out_proj is not None:
            self.out_proj.build(tuple(input_shape[:-1]) + (self.hidden_dim + self.mlp_dim,))
        else:
            self.attn_out_proj.build(input_shape)
            self.mlp_out_proj.build(tuple(input_shape[:-1]) + (self.mlp_dim,))
        if self.layer_scale is not None:
            scale = keras.initializers.Constant(self.layer_scale)
            self.ls = self.add_weight(shape=(self.hidden_dim,), initializer=scale, name="ls")

    def call(self, x, training=None, return_attention_scores=False, position_bias=None):
        if return_attention_scores:
            return self._forward(x, training, return_attention_scores=True)
        return self.forward_of(self._forward, x, training=training)

    def _attend(self, q, k, v, training, return_attention_scores):
        if self.diff is not None:
            out = self.diff(q, k, v, training=training, return_attention_scores=return_attention_scores)
            return out if return_attention_scores else (out, None)
        num_tokens = q.shape[1] if q.shape[1] is not None else ops.shape(q)[1]
        if fused_attention_applies(self.attention_dropout, training, return_attention_scores):
            return fused_attention(q, k, v, self.num_heads, self.scale), None

        def heads(t):
            t = ops.reshape(t, (-1, num_tokens, self.num_heads, self.head_dim))
            return ops.transpose(t, (0, 2, 1, 3))

        q, k, v = heads(q) * ops.cast(self.scale, q.dtype), heads(k), heads(v)
        scores = ops.cast(ops.matmul(q, ops.transpose(k, (0, 1, 3, 2))), "float32")
        weights = ops.cast(ops.softmax(scores, axis=-1), v.dtype)
        out = ops.matmul(self.attention_dropout_layer(weights, training=training), v)
        out = ops.reshape(ops.transpose(out, (0, 2, 1, 3)), (-1, num_tokens, self.hidden_dim))
        return out, weights

    def _forward(self, x, training=None, return_attention_scores=False):
        projected = self.in_proj(self.in_norm(x))
        m, d = self.mlp_dim, self.hidden_dim
        # Slices, not an uneven split: that converts to SPLIT_V, which XNNPACK refuses.
        hidden, q, k, v = (
            projected[:, :, a:b] for a, b in ((0, m), (m, m + d), (m + d, m + 2 * d), (m + 2 * d, None))
        )
        if not self.qkv_bias:
            hidden = hidden + ops.cast(self.mlp_bias, hidden.dtype)
        attended, scores = self._attend(q, k, v, training, return_attention_scores)
        hidden = self.mlp_dropout(self.activation_function(hidden), training=training)
        if self.out_proj is not None:
            y = self.out_proj(ops.concatenate([attended, hidden], axis=-1))
        else:
            y = self.attn_out_proj(attended) + self.mlp_out_proj(hidden)
        if self.layer_scale is not None:
            y = y * ops.cast(self.ls, y.dtype)
        x = x + self.drop_path(y, training=training)
        return (x, scores) if return_attention_scores else x

    def compute_output_shape(self, input_shape):
        return input_shape

    def compute_output_spec(self, x, training=None, return_attention_scores=False, position_bias=None):
        return attention_output_spec(self, x, return_attention_scores)


# The block by its kind (`ViT(block=...)`, timm's `block_fn`).
BLOCKS = {"pre_norm": TransformerBlock, "res_post": ResPostBlock, "parallel": ParallelScalingBlock}
# Every kind of block, for the code that walks a ViT's blocks (features, attention maps).
BLOCK_CLASSES = (TransformerBlock, ParallelScalingBlock)


def blocks_of(model):
    """A ViT's Transformer blocks, first to last."""
    return [layer for layer in model.layers if isinstance(layer, BLOCK_CLASSES)]


@keras.saving.register_keras_serializable(package="keras_vit")
class TokenPooling(keras.layers.Layer):
    """Pools the token sequence into one vector per image.

    Args:
        mode: `"token"` takes the [cls] token; `"distillation"` the token after it
            (DeiT's); `"gap"` averages the patch tokens (the prefix tokens excluded, as in timm);
            `"none"` keeps every token (timm's `global_pool=""`).
        num_prefix_tokens: int, default 1. Tokens before the patch tokens.
    """

    MODES = ("token", "distillation", "gap", "none")

    def __init__(self, mode="token", num_prefix_tokens=1, **kwargs):
        super().__init__(**kwargs)
        if mode not in self.MODES:
            raise ValueError(f"pooling must be one of {self.MODES}, got {mode!r}.")
        # === Config ===
        self.mode = mode
        self.num_prefix_tokens = num_prefix_tokens

    def call(self, x):
        # A slice and a squeeze, not `x[:, 0]`: its shrinking STRIDED_SLICE is the one fp32 op
        # XNNPACK refuses, and it cut the TFLite graph in two partitions.
        if self.mode == "token":
            return ops.squeeze(x[:, :1], axis=1)
        if self.mode == "distillation":
            return ops.squeeze(x[:, 1:2], axis=1)
        if self.mode == "none":
            return x
        return ops.mean(x[:, self.num_prefix_tokens :], axis=1)

    def compute_output_shape(self, input_shape):
        if self.mode == "none":
            return input_shape
        return (input_shape[0], input_shape[-1])

    def get_config(self):
        config = super().get_config()
        config.update({"mode": self.mode, "num_prefix_tokens": self.num_prefix_tokens})
        return config


@keras.saving.register_keras_serializable(package="keras_vit")
class AttentionPoolLatent(keras.layers.Layer):
    """Multi-head attention pooling with a learned latent query (timm's `AttentionPoolLatent`,
    `global_pool="map"`: SigLIP's head).

    A learned latent token queries the patch tokens (the prefix tokens left out, as timm's
    `pool_include_prefix=False`) in one cross-attention (`q` from the latent, `kv` from the
    tokens), projected (`proj`); then `x + MLP(LayerNorm(x))`, and the latent's vector is the
    pooled one. Weights are laid out as timm's: `latent`, `q`, `kv` (keys, then values), `proj`,
    `norm`, `fc1` and `fc2` (its `mlp`).

    Args:
        hidden_dim: int. Width of the tokens.
        num_heads: int. Attention heads; must divide `hidden_dim`.
        mlp_dim: int. Hidden width of the MLP.
        num_prefix_tokens: int, default 0. Tokens before the patch tokens, left out.
        activation: str, default "gelu". The MLP's activation (`TransformerBlock`'s names).
        layer_norm_epsilon: float, default 1e-6.
    """

    def __init__(
        self,
        hidden_dim,
        num_heads,
        mlp_dim,
        num_prefix_tokens=0,
        activation="gelu",
        layer_norm_epsilon=1e-6,
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_positive_int(hidden_dim, "hidden_dim")
        check_positive_int(num_heads, "num_heads")
        check_positive_int(mlp_dim, "mlp_dim")
        if hidden_dim % num_heads:
            raise ValueError(
                f"num_heads={num_heads} does not divide hidden_dim={hidden_dim}: pick a head count "
                f"that divides {hidden_dim}."
            )
        # === Config ===
        self.hidden_dim = hidden_dim
        self.num_heads = num_heads
        self.mlp_dim = mlp_dim
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.activation = activation
        self.layer_norm_epsilon = layer_norm_epsilon

        self.head_dim = hidden_dim // num_heads
        self.scale = self.head_dim**-0.5

        def dense(units, name, activation=None):
            return keras.layers.Dense(
                units,
                activation=activation,
                kernel_initializer=weight_initializer(),
                dtype=self.dtype_policy,
                name=name,
            )

        self.q = dense(hidden_dim, "q")
        self.kv = dense(2 * hidden_dim, "kv")
        self.proj = dense(hidden_dim, "proj")
        self.norm = keras.layers.LayerNormalization(
            epsilon=layer_norm_epsilon, dtype=self.dtype_policy, name="norm"
        )
        self.fc1 = dense(mlp_dim, "fc1", activation=activation_named(activation))
        self.fc2 = dense(hidden_dim, "fc2")

    def build(self, input_shape):
        if input_shape[-1] != self.hidden_dim:
            raise ValueError(
                f"AttentionPoolLatent has hidden_dim={self.hidden_dim} but its input has "
                f"{input_shape[-1]} channels (input shape {tuple(input_shape)})."
            )
        vector = (None, 1, self.hidden_dim)
        self.latent = self.add_weight(
            shape=(1, 1, self.hidden_dim),
            initializer=keras.initializers.TruncatedNormal(stddev=self.hidden_dim**-0.5),
            name="latent",
        )
        self.q.build(vector)
        self.kv.build(input_shape)
        self.proj.build(vector)
        self.norm.build(vector)
        self.fc1.build(vector)
        self.fc2.build((None, 1, self.mlp_dim))

    def _heads(self, x, num_tokens):
        x = ops.reshape(x, (-1, num_tokens, self.num_heads, self.head_dim))
        return ops.transpose(x, (0, 2, 1, 3))

    def call(self, x, return_attention_scores=False):
        """The pooled vector; with `return_attention_scores`, also the probe's attention weights
        over the tokens it reads, `(batch, heads, 1, tokens)` (what attention maps follow)."""
        x = x[:, self.num_prefix_tokens :]
        num_tokens = x.shape[1] if x.shape[1] is not None else ops.shape(x)[1]
        latent = ops.broadcast_to(ops.cast(self.latent, x.dtype), (ops.shape(x)[0], 1, self.hidden_dim))
        q = self._heads(self.q(latent), 1) * ops.cast(self.scale, x.dtype)
        k, v = (self._heads(t, num_tokens) for t in ops.split(self.kv(x), 2, axis=-1))
        scores = ops.matmul(q, ops.transpose(k, (0, 1, 3, 2)))
        weights = ops.cast(ops.softmax(ops.cast(scores, "float32"), axis=-1), x.dtype)
        out = ops.reshape(ops.transpose(ops.matmul(weights, v), (0, 2, 1, 3)), (-1, 1, self.hidden_dim))
        out = self.proj(out)
        out = out + self.fc2(self.fc1(self.norm(out)))
        out = ops.reshape(out, (-1, self.hidden_dim))
        return (out, weights) if return_attention_scores else out

    def compute_output_shape(self, input_shape):
        return (input_shape[0], self.hidden_dim)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "hidden_dim": self.hidden_dim,
                "num_heads": self.num_heads,
                "mlp_dim": self.mlp_dim,
                "num_prefix_tokens": self.num_prefix_tokens,
                "activation": self.activation,
                "layer_norm_epsilon": self.layer_norm_epsilon,
            }
        )
        return config
