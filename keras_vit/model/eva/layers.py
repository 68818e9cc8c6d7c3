"""The Eva family's layers: the patch embedding with its prefix tokens and optional absolute
position embeddings, the rotary embedding, the attention with rotary positions, and the EVA block
(SwiGLU, sub-LN, LayerScale, post-norm), as timm's `eva.py` builds them.

The rotation is builtin-friendly: constant sin/cos tables for the model's grid, the rotated
pairs swapped by a product with a constant permutation matrix on TensorFlow, whose graphs the
exports convert, or flipped in place on JAX (interleaved, EVA02's `rot()`), or two slices and a
concatenation (halves, `rope_rotate_half`); never a gather or a roll, at most 5-D.

Each layer stores its constructor arguments under `# === Config ===`, builds its sublayers with
`dtype=self.dtype_policy` and returns every argument from `get_config`.
"""

import keras
import numpy as np
from keras import ops

from keras_vit.model.checks import check_positive_int, check_rate
from keras_vit.model.eva import rope as tables
from keras_vit.model.layers import Block, DropPath, attention_output_spec, patch_grid, weight_initializer


def norm_layer(kind, epsilon, name, dtype):
    """timm's `norm_layer` of an Eva: LayerNorm or RmsNorm."""
    if kind == "rmsnorm":
        return keras.layers.RMSNormalization(epsilon=epsilon, dtype=dtype, name=name)
    return keras.layers.LayerNormalization(epsilon=epsilon, dtype=dtype, name=name)


def _dense(units, name, dtype, use_bias=True, activation=None):
    return keras.layers.Dense(
        units,
        use_bias=use_bias,
        activation=activation,
        kernel_initializer=weight_initializer(),
        dtype=dtype,
        name=name,
    )


@keras.saving.register_keras_serializable(package="keras_vit")
class EvaPatchEmbed(keras.layers.Layer):
    """Patches to tokens: the projection, [cls] and register tokens, and absolute position
    embeddings when the model has them (timm's `patch_embed`, `cls_token`, `reg_token`, `pos_embed`).

    Args:
        patch_size: int.
        embed_dim: int. Token width.
        class_token: bool, default True.
        num_reg_tokens: int, default 0. Register tokens after [cls].
        use_abs_pos_emb: bool, default True. Learned absolute position embeddings.
        no_embed_class: bool, default False. Position embeddings for the patches only.
        projection_bias: bool, default True (False before a pre-norm, as timm).
    """

    def __init__(
        self,
        patch_size,
        embed_dim,
        class_token=True,
        num_reg_tokens=0,
        use_abs_pos_emb=True,
        no_embed_class=False,
        projection_bias=True,
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_positive_int(patch_size, "patch_size")
        check_positive_int(embed_dim, "embed_dim")
        # === Config ===
        self.patch_size = patch_size
        self.embed_dim = embed_dim
        self.class_token = bool(class_token)
        self.num_reg_tokens = int(num_reg_tokens)
        self.use_abs_pos_emb = bool(use_abs_pos_emb)
        self.no_embed_class = bool(no_embed_class)
        self.projection_bias = bool(projection_bias)
        self.num_prefix_tokens = int(self.class_token) + self.num_reg_tokens
        self.projection = keras.layers.Conv2D(
            embed_dim,
            patch_size,
            strides=patch_size,
            use_bias=self.projection_bias,
            kernel_initializer=weight_initializer(),
            dtype=self.dtype_policy,
            name="projection",
        )

    def build(self, input_shape):
        _, height, width, _ = input_shape
        self.grid_size = patch_grid(height, width, self.patch_size)
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        self.projection.build(input_shape)
        init = keras.initializers.TruncatedNormal(stddev=0.02)
        if self.class_token:
            self.cls_token = self.add_weight(shape=(1, 1, self.embed_dim), initializer=init, name="cls_token")
        if self.num_reg_tokens:
            self.reg_token = self.add_weight(
                shape=(1, self.num_reg_tokens, self.embed_dim), initializer=init, name="reg_token"
            )
        if self.use_abs_pos_emb:
            tokens = self.num_patches + (0 if self.no_embed_class else self.num_prefix_tokens)
            self.pos_embed = self.add_weight(
                shape=(1, tokens, self.embed_dim), initializer=init, name="pos_embed"
            )

    @property
    def position_prefix_tokens(self):
        """The prefix tokens that have a position embedding."""
        return 0 if self.no_embed_class else self.num_prefix_tokens

    def call(self, images):
        x = ops.reshape(self.projection(images), (-1, self.num_patches, self.embed_dim))
        batch = ops.shape(x)[0]
        prefix = [self.cls_token] if self.class_token else []
        prefix += [self.reg_token] if self.num_reg_tokens else []
        prefix = [ops.broadcast_to(ops.cast(t, x.dtype), (batch, t.shape[1], self.embed_dim)) for t in prefix]
        pos_embed = ops.cast(self.pos_embed, x.dtype) if self.use_abs_pos_emb else None
        if self.no_embed_class and pos_embed is not None:
            x = x + pos_embed
            pos_embed = None
        x = ops.concatenate([*prefix, x], axis=1) if prefix else x
        return x if pos_embed is None else x + pos_embed

    def compute_output_shape(self, input_shape):
        rows, cols = input_shape[1] // self.patch_size, input_shape[2] // self.patch_size
        return (input_shape[0], rows * cols + self.num_prefix_tokens, self.embed_dim)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "patch_size": self.patch_size,
                "embed_dim": self.embed_dim,
                "class_token": self.class_token,
                "num_reg_tokens": self.num_reg_tokens,
                "use_abs_pos_emb": self.use_abs_pos_emb,
                "no_embed_class": self.no_embed_class,
                "projection_bias": self.projection_bias,
            }
        )
        return config


@keras.saving.register_keras_serializable(package="keras_vit")
class RotaryEmbedding(keras.layers.Layer):
    """The rotary position embedding of a patch grid: `(2, 1, tokens, head_dim)` (sin, then cos),
    or, for the `"mixed"` kind, `(2, depth, heads, tokens, head_dim)` (each block takes its own).

    `"cat"` (EVA02's `RotaryEmbeddingCat`) and `"dinov3"` (`RotaryEmbeddingDinoV3`) are constant
    tables computed from the grid; `"mixed"` (ROPE-ViT's `RotaryEmbeddingMixed`) has learned
    frequencies `freqs` (timm's `rope.freqs`), turned into angles over the grid's constant positions
    with elementwise ops. In training, timm's coordinate augmentations, when given, move the
    positions once per batch (`shift_coords`: uniform in [-s, s] per axis; `jitter_coords`: a
    log-uniform scale in [1/J, J] per axis; `rescale_coords`: one in [1/R, R]); at inference they
    do nothing, as in timm.

    Args:
        kind: "cat", "mixed" or "dinov3".
        grid: (rows, columns) of the patch grid.
        head_dim: int. Each head's width.
        num_heads, depth: ints (the mixed kind's frequencies are per block and head).
        temperature: float. timm's `rope_temperature`.
        grid_offset: float, default 0. timm's `rope_grid_offset`.
        grid_indexing: "ij" (default) or "xy". timm's `rope_grid_indexing`.
        rotate_half: bool, default False. Halves (DINOv3's) rather than interleaved pairs.
        ref_feat_shape: (rows, columns) or None. The grid the cat kind's positions are rescaled to.
        shift_coords, jitter_coords, rescale_coords: floats or None. timm's `rope_*_coords`.
        seed: int or None. Seed of the augmentations' draws.
    """

    def __init__(
        self,
        kind,
        grid,
        head_dim,
        num_heads=1,
        depth=1,
        temperature=10000.0,
        grid_offset=0.0,
        grid_indexing="ij",
        rotate_half=False,
        ref_feat_shape=None,
        shift_coords=None,
        jitter_coords=None,
        rescale_coords=None,
        seed=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if kind not in ("cat", "mixed", "dinov3"):
            raise ValueError(f"kind must be 'cat', 'mixed' or 'dinov3', got {kind!r}.")
        # === Config ===
        self.kind = kind
        self.grid = tuple(int(side) for side in grid)
        self.head_dim = int(head_dim)
        self.num_heads = int(num_heads)
        self.depth = int(depth)
        self.temperature = float(temperature)
        self.grid_offset = float(grid_offset)
        self.grid_indexing = grid_indexing
        self.rotate_half = bool(rotate_half)
        self.ref_feat_shape = None if ref_feat_shape is None else tuple(ref_feat_shape)
        self.shift_coords = shift_coords
        self.jitter_coords = jitter_coords
        self.rescale_coords = rescale_coords
        self.seed = seed
        self.augments = any(value is not None for value in (shift_coords, jitter_coords, rescale_coords))
        self.seed_generator = keras.random.SeedGenerator(seed) if self.augments else None

    def build(self, input_shape):
        if self.kind == "mixed":
            self.freqs = self.add_weight(
                shape=(2, self.depth, self.num_heads, self.head_dim // 2), initializer="zeros", name="freqs"
            )
            self.freqs.assign(
                tables.mixed_frequencies(self.head_dim, self.depth, self.num_heads, self.temperature)
            )
            self.positions = tables.mixed_positions(self.grid, self.grid_indexing)
            return
        if self.kind == "cat":
            angles = tables.cat_angles(
                self.grid,
                self.head_dim,
                self.temperature,
                self.grid_offset,
                self.grid_indexing,
                self.ref_feat_shape,
            )
        else:
            angles = tables.dinov3_angles(
                self.grid, self.head_dim, self.temperature, self.grid_offset, self.grid_indexing
            )
        angles = tables.layout(angles, self.rotate_half)
        self.table = np.stack([np.sin(angles), np.cos(angles)])[:, None].astype(np.float32)
        self.coords, self.scales = tables.positions_and_scales(
            self.kind, self.grid, self.head_dim, self.temperature, self.grid_offset, self.grid_indexing,
            self.ref_feat_shape,
        )  # fmt: skip

    def _augmented(self, coords):
        """timm's `_apply_coord_augs`: one shift, per-axis jitter and shared rescale for all positions."""
        coords = ops.convert_to_tensor(coords)
        if self.shift_coords is not None:
            s = float(self.shift_coords)
            coords = coords + keras.random.uniform((1, 2), -s, s, seed=self.seed_generator)
        if self.jitter_coords is not None:
            j = float(np.log(self.jitter_coords))
            coords = coords * ops.exp(keras.random.uniform((1, 2), -j, j, seed=self.seed_generator))
        if self.rescale_coords is not None:
            r = float(np.log(self.rescale_coords))
            coords = coords * ops.exp(keras.random.uniform((1, 1), -r, r, seed=self.seed_generator))
        return coords

    def call(self, tokens, training=None):
        augment = bool(training) and self.augments
        if self.kind != "mixed":
            if not augment:
                return ops.cast(ops.convert_to_tensor(self.table), self.compute_dtype)
            coords = self._augmented(self.coords)
            angles = ops.reshape(ops.expand_dims(coords, -1) * self.scales, (-1, self.head_dim // 2))
            sin, cos = (self._layout(f(angles)) for f in (ops.sin, ops.cos))
            return ops.cast(ops.expand_dims(ops.stack([sin, cos]), 1), self.compute_dtype)
        positions = np.stack(self.positions, axis=-1)
        positions = self._augmented(positions) if augment else ops.convert_to_tensor(positions)
        t_x, t_y = positions[:, :1], positions[:, 1:]
        freqs = ops.cast(self.freqs, "float32")
        # (depth, heads, tokens, head_dim / 2): the angle of each pair at each position.
        angles = t_x * ops.expand_dims(freqs[0], 2) + t_y * ops.expand_dims(freqs[1], 2)
        sin, cos = (self._interleaved(f(angles)) for f in (ops.sin, ops.cos))
        return ops.cast(ops.stack([sin, cos]), self.compute_dtype)

    def _layout(self, angles):
        """Per-pair values `(tokens, head_dim / 2)` in the rotation's layout `(tokens, head_dim)`."""
        if self.rotate_half:
            return ops.concatenate([angles, angles], axis=-1)
        return ops.reshape(ops.stack([angles, angles], axis=-1), (-1, self.head_dim))

    def _interleaved(self, x):
        """`[a0, a0, a1, a1, ...]` along the last axis: a stack and a reshape (5-D at most)."""
        shape = (self.depth, self.num_heads, self.grid[0] * self.grid[1], self.head_dim)
        return ops.reshape(ops.stack([x, x], axis=-1), shape)

    def compute_output_shape(self, input_shape):
        tokens = self.grid[0] * self.grid[1]
        if self.kind == "mixed":
            return (2, self.depth, self.num_heads, tokens, self.head_dim)
        return (2, 1, tokens, self.head_dim)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "kind": self.kind,
                "grid": list(self.grid),
                "head_dim": self.head_dim,
                "num_heads": self.num_heads,
                "depth": self.depth,
                "temperature": self.temperature,
                "grid_offset": self.grid_offset,
                "grid_indexing": self.grid_indexing,
                "rotate_half": self.rotate_half,
                "ref_feat_shape": None if self.ref_feat_shape is None else list(self.ref_feat_shape),
                "shift_coords": self.shift_coords,
                "jitter_coords": self.jitter_coords,
                "rescale_coords": self.rescale_coords,
                "seed": self.seed,
            }
        )
        return config


def swaps_pairs_by_product():
    """Whether `rotate` swaps interleaved pairs by a product with a permutation matrix: on
    TensorFlow, whose graphs the TFLite and ONNX exports convert (LiteRT runs a split and a
    concatenation over an axis of 2 element by element: 11% of a ROPE-ViT-S's time). JAX, which
    trains on GPUs, flips each pair instead: no product to pay for in every step, and none to
    round where float32 products take TF32."""
    return keras.backend.backend() == "tensorflow"


def rotate(x, sin, cos, rotate_half):
    """`x * cos + rot(x) * sin` over the last axis: `rot` swaps each pair `(a, b)` to `(-b, a)`,
    pairs being neighbours (interleaved) or the two halves (`rotate_half`). The minus goes into
    the sine table (`(-b) * s == b * (-s)` exactly), which export folds into a constant: no NEG
    op, which TFLite's 16-bit integer kernels lack."""
    width = x.shape[-1]
    if rotate_half:
        first, second = x[..., : width // 2], x[..., width // 2 :]
        swapped = ops.concatenate([second, first], axis=-1)
        signs = np.repeat([-1.0, 1.0], width // 2)
    else:
        if swaps_pairs_by_product():
            # Row i of the permutation is e_{i xor 1}. Exact: each output is one input times 1, plus zeros.
            permutation = np.eye(width, dtype=np.float32)[np.arange(width) ^ 1]
            with keras.name_scope("rotary_swap"):  # the family's "rotary embedding" op group finds it
                swapped = ops.matmul(x, ops.cast(permutation, x.dtype))
        else:  # (..., width) as (..., width / 2, 2): each pair flipped, and back
            pairs = ops.reshape(x, (-1, x.shape[1], ops.shape(x)[2], width // 2, 2))
            swapped = ops.reshape(ops.flip(pairs, axis=-1), ops.shape(x))
        signs = np.tile([-1.0, 1.0], width // 2)
    return x * cos + swapped * (sin * ops.cast(signs, sin.dtype))


@keras.saving.register_keras_serializable(package="keras_vit")
class EvaAttention(keras.layers.Layer):
    """Self-attention with rotary positions on the patch tokens (the prefix tokens left as
    they are), as timm's `EvaAttention` (`attn_type="eva"`: a query and a value bias, no key bias)
    and `AttentionRope` (`"rope"`: all three biased; grouped-query with `num_kv_heads`).

    Args:
        embed_dim, num_heads: ints.
        num_kv_heads: int or None. Key/value heads (grouped-query attention).
        qkv_bias, qkv_fused: bools. Biases, and one `qkv` projection or `q_proj`, `k_proj`, `v_proj`.
        attn_type: "eva" or "rope".
        qk_norm: bool. A norm on each head's queries and keys.
        scale_norm: bool. A norm on the attention's output before `proj` (EVA02-CLIP's sub-LN).
        rotate_half: bool. The rotary embedding's layout.
        num_prefix_tokens: int. Tokens before the patches, not rotated.
        norm, layer_norm_epsilon: the norm's kind ("layernorm", "rmsnorm") and epsilon.
        attention_dropout, dropout: floats.
    """

    def __init__(
        self,
        embed_dim,
        num_heads,
        num_kv_heads=None,
        qkv_bias=True,
        qkv_fused=True,
        attn_type="eva",
        qk_norm=False,
        scale_norm=False,
        rotate_half=False,
        num_prefix_tokens=1,
        norm="layernorm",
        layer_norm_epsilon=1e-6,
        attention_dropout=0.0,
        dropout=0.0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_rate(attention_dropout, "attention_dropout")
        # === Config ===
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads or num_heads
        self.qkv_bias = bool(qkv_bias)
        self.qkv_fused = bool(qkv_fused)
        self.attn_type = attn_type
        self.qk_norm = bool(qk_norm)
        self.scale_norm = bool(scale_norm)
        self.rotate_half = bool(rotate_half)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.norm = norm
        self.layer_norm_epsilon = layer_norm_epsilon
        self.attention_dropout = attention_dropout
        self.dropout = dropout

        self.head_dim = embed_dim // num_heads
        self.kv_dim = self.head_dim * self.num_kv_heads
        self.scale = self.head_dim**-0.5
        dtype = self.dtype_policy
        # EvaAttention's fused qkv has no bias of its own: q_bias and v_bias (weights) and a zero k.
        self.separate_bias = self.qkv_bias and self.qkv_fused and attn_type == "eva"
        if self.qkv_fused:
            self.qkv = _dense(3 * embed_dim, "qkv", dtype, use_bias=self.qkv_bias and not self.separate_bias)
        else:
            self.q_proj = _dense(embed_dim, "q_proj", dtype, use_bias=self.qkv_bias)
            self.k_proj = _dense(self.kv_dim, "k_proj", dtype, use_bias=self.qkv_bias and attn_type == "rope")
            self.v_proj = _dense(self.kv_dim, "v_proj", dtype, use_bias=self.qkv_bias)
        if self.qk_norm:
            self.q_norm = norm_layer(norm, layer_norm_epsilon, "q_norm", dtype)
            self.k_norm = norm_layer(norm, layer_norm_epsilon, "k_norm", dtype)
        if self.scale_norm:
            self.inner_norm = norm_layer(norm, layer_norm_epsilon, "norm", dtype)
        self.proj = _dense(embed_dim, "proj", dtype)
        self.attention_dropout_layer = keras.layers.Dropout(
            attention_dropout, dtype=dtype, name="attention_dropout"
        )
        self.dropout_layer = keras.layers.Dropout(dropout, dtype=dtype, name="dropout")

    def build(self, input_shape):
        if self.qkv_fused:
            self.qkv.build(input_shape)
            if self.separate_bias:
                self.q_bias = self.add_weight(shape=(self.embed_dim,), initializer="zeros", name="q_bias")
                self.v_bias = self.add_weight(shape=(self.embed_dim,), initializer="zeros", name="v_bias")
        else:
            for layer in (self.q_proj, self.k_proj, self.v_proj):
                layer.build(input_shape)
        if self.qk_norm:
            self.q_norm.build((None, None, None, self.head_dim))
            self.k_norm.build((None, None, None, self.head_dim))
        if self.scale_norm:
            self.inner_norm.build(input_shape)
        self.proj.build(input_shape)

    def _heads(self, x, heads, tokens):
        return ops.transpose(ops.reshape(x, (-1, tokens, heads, self.head_dim)), (0, 2, 1, 3))

    def _projections(self, x, queries=None):
        """Queries (of the first `queries` tokens when given), keys and values, token-major."""
        if not self.qkv_fused:
            q = self.q_proj(x if queries is None else x[:, :queries])
            return q, self.k_proj(x), self.v_proj(x)
        qkv = self.qkv(x)
        if self.separate_bias:
            # The keys' zero bias by shape: `zeros_like` of a variable fails in JAX's eager mode.
            zeros = ops.zeros((self.embed_dim,), dtype=qkv.dtype)
            biases = [ops.cast(self.q_bias, qkv.dtype), zeros, ops.cast(self.v_bias, qkv.dtype)]
            qkv = qkv + ops.concatenate(biases)
        q, k, v = ops.split(qkv, 3, axis=-1)
        # [:, :n], not [:, 0]: XNNPACK refuses a shrinking STRIDED_SLICE
        return (q if queries is None else q[:, :queries]), k, v

    def _rotated(self, x, rope):
        """The patch tokens of `x` (batch, heads, tokens, head_dim) rotated, the prefix kept."""
        sin, cos = ops.cast(rope[0], x.dtype), ops.cast(rope[1], x.dtype)
        prefix = self.num_prefix_tokens
        patches = rotate(x[:, :, prefix:], sin, cos, self.rotate_half)
        return ops.concatenate([x[:, :, :prefix], patches], axis=2) if prefix else patches

    def call(self, x, rope=None, training=None, return_attention_scores=False, queries=None):
        """`queries`: only the first `queries` tokens attend (to every token), and the output has
        that many (`vit.classify`: the last block of a model whose head reads the [cls] token).
        They must be prefix tokens, which the rotary embedding leaves as they are."""
        if queries is not None and queries > self.num_prefix_tokens:
            raise ValueError(
                f"{self.name}: only prefix tokens attend alone (they carry no rotation); "
                f"got queries={queries} with {self.num_prefix_tokens} prefix tokens."
            )
        tokens = x.shape[1] if x.shape[1] is not None else ops.shape(x)[1]
        rows = tokens if queries is None else queries
        q, k, v = self._projections(x, queries)
        q = self._heads(q, self.num_heads, rows)
        k = self._heads(k, self.num_kv_heads, tokens)
        v = self._heads(v, self.num_kv_heads, tokens)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            k = self._rotated(k, rope)
            q = q if queries is not None else self._rotated(q, rope)
        if self.num_kv_heads != self.num_heads:
            # Each key/value head serves num_heads / num_kv_heads query heads in a row (timm's
            # repeat_interleave), as a broadcast and a reshape.
            groups = self.num_heads // self.num_kv_heads
            k, v = (
                ops.reshape(
                    ops.broadcast_to(
                        ops.expand_dims(t, 2),
                        (ops.shape(t)[0], self.num_kv_heads, groups, tokens, self.head_dim),
                    ),
                    (-1, self.num_heads, tokens, self.head_dim),
                )
                for t in (k, v)
            )
        scores = ops.matmul(q * ops.cast(self.scale, q.dtype), ops.transpose(k, (0, 1, 3, 2)))
        weights = ops.cast(ops.softmax(ops.cast(scores, "float32"), axis=-1), x.dtype)
        out = ops.matmul(self.attention_dropout_layer(weights, training=training), v)
        out = ops.reshape(ops.transpose(out, (0, 2, 1, 3)), (-1, rows, self.embed_dim))
        if self.scale_norm:
            out = self.inner_norm(out)
        out = self.dropout_layer(self.proj(out), training=training)
        return (out, weights) if return_attention_scores else out

    def compute_output_spec(self, x, rope=None, training=None, return_attention_scores=False, queries=None):
        return attention_output_spec(self, x, return_attention_scores, queries)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "embed_dim": self.embed_dim,
                "num_heads": self.num_heads,
                "num_kv_heads": self.num_kv_heads,
                "qkv_bias": self.qkv_bias,
                "qkv_fused": self.qkv_fused,
                "attn_type": self.attn_type,
                "qk_norm": self.qk_norm,
                "scale_norm": self.scale_norm,
                "rotate_half": self.rotate_half,
                "num_prefix_tokens": self.num_prefix_tokens,
                "norm": self.norm,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "attention_dropout": self.attention_dropout,
                "dropout": self.dropout,
            }
        )
        return config


@keras.saving.register_keras_serializable(package="keras_vit")
class EvaBlock(Block):
    """timm's `EvaBlock` (pre-norm: `x + ls1 * attn(norm1(x))`, `x + ls2 * mlp(norm2(x))`) or,
    with `post_norm`, `EvaBlockPostNorm` (`x + norm1(attn(x))`, `x + norm2(mlp(x))`).

    The MLP (`mlp_kind`): "mlp" (fc1, GELU, [norm], fc2), "glu" (timm's `GluMlp`: fc1's outputs
    halved, `silu(first) * second`, fc2) or "swiglu" (`silu(fc1_g(x)) * fc1_x(x)`, [norm], fc2);
    `scale_mlp` puts the sub-LN `norm` before fc2.

    Args:
        embed_dim, num_heads, mlp_hidden: ints.
        mlp_kind: "mlp", "glu" or "swiglu".
        scale_mlp: bool. The MLP's inner norm.
        init_values: float or None. LayerScale's initial value (`gamma_1`, `gamma_2`).
        attn_only_layer_scale: bool. LayerScale on the attention branch only.
        post_norm: bool. The post-norm block.
        rope_index: int or None. Which block's table of a per-block (mixed) rotary embedding.
        attention: dict. `EvaAttention`'s arguments.
        norm, layer_norm_epsilon, dropout, drop_path_rate: as the model's.
    """

    def __init__(
        self,
        embed_dim,
        num_heads,
        mlp_hidden,
        mlp_kind="mlp",
        scale_mlp=False,
        init_values=None,
        attn_only_layer_scale=False,
        post_norm=False,
        rope_index=None,
        attention=None,
        norm="layernorm",
        layer_norm_epsilon=1e-6,
        dropout=0.0,
        drop_path_rate=0.0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if mlp_kind not in ("mlp", "glu", "swiglu"):
            raise ValueError(f"mlp_kind must be 'mlp', 'glu' or 'swiglu', got {mlp_kind!r}.")
        # === Config ===
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.mlp_hidden = mlp_hidden
        self.mlp_kind = mlp_kind
        self.scale_mlp = bool(scale_mlp)
        self.init_values = None if init_values is None else float(init_values)
        self.attn_only_layer_scale = bool(attn_only_layer_scale)
        self.post_norm = bool(post_norm)
        self.rope_index = rope_index
        self.attention_arguments = dict(attention or {})
        self.norm = norm
        self.layer_norm_epsilon = layer_norm_epsilon
        self.dropout = dropout
        self.drop_path_rate = drop_path_rate

        dtype = self.dtype_policy
        self.norm1 = norm_layer(norm, layer_norm_epsilon, "norm1", dtype)
        self.attention = EvaAttention(
            embed_dim, num_heads, norm=norm, layer_norm_epsilon=layer_norm_epsilon, dropout=dropout,
            dtype=dtype, name="attention", **self.attention_arguments,
        )  # fmt: skip
        self.norm2 = norm_layer(norm, layer_norm_epsilon, "norm2", dtype)
        if mlp_kind == "swiglu":
            self.fc1_g = _dense(mlp_hidden, "fc1_g", dtype)
            self.fc1_x = _dense(mlp_hidden, "fc1_x", dtype)
        else:
            width = 2 * mlp_hidden if mlp_kind == "glu" else mlp_hidden
            self.fc1 = _dense(width, "fc1", dtype, activation="gelu" if mlp_kind == "mlp" else None)
        if self.scale_mlp:
            self.mlp_norm = norm_layer(norm, layer_norm_epsilon, "mlp_norm", dtype)
        self.fc2 = _dense(embed_dim, "fc2", dtype)
        self.mlp_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="mlp_dropout")
        self.drop_path1 = DropPath(drop_path_rate, dtype=dtype, name="drop_path1")
        self.drop_path2 = DropPath(drop_path_rate, dtype=dtype, name="drop_path2")

    def build(self, input_shape):
        self.norm1.build(input_shape)
        self.attention.build(input_shape)
        self.norm2.build(input_shape)
        hidden = tuple(input_shape[:-1]) + (self.mlp_hidden,)
        for layer in self.mlp_hidden_layers:
            layer.build(input_shape)
        if self.scale_mlp:
            self.mlp_norm.build(hidden)
        self.fc2.build(hidden)
        if self.init_values is not None and not self.post_norm:
            scale = keras.initializers.Constant(self.init_values)
            self.gamma_1 = self.add_weight(shape=(self.embed_dim,), initializer=scale, name="gamma_1")
            if not self.attn_only_layer_scale:
                self.gamma_2 = self.add_weight(shape=(self.embed_dim,), initializer=scale, name="gamma_2")

    @property
    def mlp_hidden_layers(self):
        """The MLP's Dense layers before its activation (fc1, or SwiGLU's fc1_g and fc1_x)."""
        return [self.fc1_g, self.fc1_x] if self.mlp_kind == "swiglu" else [self.fc1]

    def _mlp(self, x, training=None):
        if self.mlp_kind == "swiglu":
            hidden = keras.activations.silu(self.fc1_g(x)) * self.fc1_x(x)
        elif self.mlp_kind == "glu":
            gate, value = ops.split(self.fc1(x), 2, axis=-1)
            hidden = keras.activations.silu(gate) * value
        else:
            hidden = self.fc1(x)
        hidden = self.mlp_dropout(hidden, training=training)
        if self.scale_mlp:
            hidden = self.mlp_norm(hidden)
        return self.mlp_dropout(self.fc2(hidden), training=training)

    def _scaled(self, branch, name):
        weight = getattr(self, name, None)
        return branch if weight is None else branch * ops.cast(weight, branch.dtype)

    def call(self, x, rope=None, training=None, return_attention_scores=False, queries=None):
        """`queries`: only the first `queries` tokens (prefix tokens) go through the block,
        attending to every token, and only they come out (`vit.classify`)."""
        if rope is not None and self.rope_index is not None:
            rope = rope[:, self.rope_index]
        if return_attention_scores:  # inference only: nothing to recompute
            return self._forward(x, rope, training, return_attention_scores=True, queries=queries)
        arguments = {} if queries is None else dict(queries=queries)
        if rope is None:
            return self.forward_of(self._forward, x, training=training, **arguments)
        # The table as an input, differentiated as x is.
        return self.forward_of(self._forward, x, rope, training=training, **arguments)

    def _forward(self, x, rope=None, training=None, return_attention_scores=False, queries=None):
        scores = None
        inputs = x if self.post_norm else self.norm1(x)
        attended = self.attention(
            inputs,
            rope=rope,
            training=training,
            return_attention_scores=return_attention_scores,
            queries=queries,
        )
        if return_attention_scores:
            attended, scores = attended
        if queries is not None:  # the residual stream of the tokens that attended
            x = x[:, :queries]
        if self.post_norm:
            x = x + self.drop_path1(self.norm1(attended), training=training)
            x = x + self.drop_path2(self.norm2(self._mlp(x, training=training)), training=training)
        else:
            x = x + self.drop_path1(self._scaled(attended, "gamma_1"), training=training)
            y = self._mlp(self.norm2(x), training=training)
            x = x + self.drop_path2(self._scaled(y, "gamma_2"), training=training)
        return (x, scores) if return_attention_scores else x

    def compute_output_spec(self, x, rope=None, training=None, return_attention_scores=False, queries=None):
        return attention_output_spec(self, x, return_attention_scores, queries)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "embed_dim": self.embed_dim,
                "num_heads": self.num_heads,
                "mlp_hidden": self.mlp_hidden,
                "mlp_kind": self.mlp_kind,
                "scale_mlp": self.scale_mlp,
                "init_values": self.init_values,
                "attn_only_layer_scale": self.attn_only_layer_scale,
                "post_norm": self.post_norm,
                "rope_index": self.rope_index,
                "attention": self.attention_arguments,
                "norm": self.norm,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "dropout": self.dropout,
                "drop_path_rate": self.drop_path_rate,
            }
        )
        return config
