"""The residual stream rotated offline: a ViT rewritten, weights only, so that 8-bit activations
can hold it (issue 49).

A real ViT's residual stream carries outlier channels (timm's ViT-Ti: one at -585 from block 7 on,
the others within +-40), which no per-tensor int8 scale holds. Two exact rewrites of a copy of
the model remove them before quantisation, and leave the float graph's probabilities unchanged:

- Computational invariance (SliceGPT, Ashkboos et al., ICLR 2024). Every LayerNorm's scale and
  shift are folded into the Dense layers that read it (QKV, the MLP's first layer, the head), and
  every write to the residual stream is made mean-free (the patch projection, the prefix tokens,
  the position embeddings, attention's output projection and the MLP's second layer, LayerScale
  folded in first). LayerNorm(x) = LayerNorm(x - mean(x)), so the readers see what they saw; the
  stream itself is now mean-free, and each LayerNorm only divides by the root mean square.
- Rotation (QuaRot, Ashkboos et al., NeurIPS 2024; SpinQuant, Liu et al., 2025). One orthogonal
  `Q` multiplies every writer on the right and every reader on the left (`Q.T`), so the stream
  is `x @ Q`: an outlier channel is spread over all channels. RMSNorm is invariant under `Q`, so
  every LayerNorm becomes an RMSNorm without affine (`RMSNorm`, by default), or the same as one
  L2_NORMALIZATION op in TFLite (`L2Norm`), or, with a `Q` that keeps the mean-free subspace
  (`rotation(keep_mean=True)`), stays the LayerNorm it was.

`rotated_copy` makes the rewritten model; the user's model (and `model.keras`) is not touched.
On the copy, `with_massive_tokens` carries the stream's massive tokens (found by `massive_tokens`)
at a smaller scale from a block on and splits that block's massive MLP units (`massive_units`),
and `with_per_head_attention` gives each head its own ops; both float-exact.
`keras-vit export` uses two: the ViT family's `int8` quantises a `rotated_copy` whose fc2 takes its
input through an in-graph Hadamard where a unit is massive (`rotate_inputs`, in place;
`export.rotated_int8`, docs/benchmarks/int8.md, twenty-first pass), and its `dynamic` (and the
`int8` of a ViT that rewrite does not cover) a copy of the model itself whose MLP output
projections take their input rotated that way (`with_rotated_inputs`; eighth pass).
What it buys a full-integer TFLite model, and what it does not (the ViT-Ti's outlier is also a
token outlier: four corner tokens at 40 times the others' size, which no channel rotation moves):
`benchmarks/int8_rotation.py`, docs/benchmarks/int8.md (fifth pass).
"""

import math

import keras
import numpy as np
from keras import ops

from keras_vit.model.vit.layers import MultiHeadSelfAttention, TransformerBlock
from keras_vit.model.vit.model import ViT

NORMS = ("rms", "l2", "layer")


class RMSNorm(keras.layers.LayerNormalization):
    """`x / sqrt(mean(x ** 2) + epsilon)` on the last axis, no scale or shift: what a LayerNorm of
    a mean-free input with scale 1 and shift 0 computes, without its mean. `rotated_copy` turns
    the copy's LayerNorms into this class (their weights, 1 and 0, are kept and not read). The
    square is a MUL: TFLite has no int8 SQUARE."""

    def call(self, inputs):
        square_mean = keras.ops.mean(inputs * inputs, axis=-1, keepdims=True)
        return inputs * keras.ops.rsqrt(square_mean + self.epsilon)


class L2Norm(keras.layers.LayerNormalization):
    """`x / sqrt(max(sum(x ** 2), n * epsilon))`: `RMSNorm / sqrt(n)`, the factor folded into the
    readers' kernels (`rotated_copy(norm="l2")`). TFLite converts it to one L2_NORMALIZATION op,
    whose int8 kernel sums the squares in int32: no int8 tensor has to hold the statistic, whose
    range over tokens (a LayerNorm's variance from 1 to 1,700 in the ViT-Ti's last blocks) no
    per-tensor int8 scale holds."""

    def call(self, inputs):
        import tensorflow as tf

        return tf.math.l2_normalize(inputs, axis=-1, epsilon=inputs.shape[-1] * self.epsilon)


# The name scopes of `HadamardInputDense`'s two ops, which the quantisation rules select by name:
# the rotation (kept in float) and the layer's own product (dynamic-range int8).
HADAMARD_SCOPE = "hadamard"
ROTATED_INPUT_SCOPE = "rotated_input"
# The rotation's block: 64 multiply-adds per input value, where ai-edge-quantizer's own online
# rotation spends up to 256 (its blocks); on the real ViT-Ti's fc2, 64 keeps more of fp32's answers.
HADAMARD_GROUP = 64


class HadamardInputDense(keras.layers.Dense):
    """A Dense layer whose input is multiplied in the graph by a block-diagonal Hadamard matrix
    `R = I (x) H` (blocks of `hadamard_group`, orthonormal, float) and whose kernel holds `R.T @ W`:
    the same outputs. An outlier unit of the input (the real ViT-Ti's fc2 input: one GELU unit at
    212 where the others stay under 10) is spread over its block before the layer's input is
    quantised to int8 at run time, one scale per token: QuaRot's online Hadamard, made cheap.
    `with_rotated_inputs` turns a copy's layers into this class; never the user's model."""

    hadamard_group = HADAMARD_GROUP

    def call(self, inputs, training=None):
        group = self.hadamard_group
        shape = ops.shape(inputs)
        with keras.name_scope(HADAMARD_SCOPE):
            rows = ops.reshape(inputs, (-1, group))
            matrix = ops.convert_to_tensor(hadamard(group), dtype=inputs.dtype)
            rotated = ops.reshape(ops.matmul(rows, matrix), shape)
        with keras.name_scope(ROTATED_INPUT_SCOPE):
            return super().call(rotated, training=training)


def with_rotated_inputs(model, layers, group=HADAMARD_GROUP):
    """A copy of the ViT `model` in which each block's Dense layers named in `layers` (e.g.
    `("fc2",)`) take their input rotated (`rotate_inputs`): the same probabilities in float, to
    float32 rounding. `model` is not changed."""
    copy = model.__class__.from_config(model.get_config())  # a ViT or a subclass of it
    copy.set_weights(model.get_weights())
    return rotate_inputs(copy, layers, group=group)


def rotate_inputs(copy, layers, blocks=None, group=HADAMARD_GROUP):
    """`copy` (a copy of a ViT, changed in place and returned) with each block's Dense layers
    named in `layers` taking their input rotated in the graph (`HadamardInputDense`, the kernel
    rotated to match); in the blocks of `blocks` (indices) only, when given. A layer whose input
    width has no power-of-two factor of 8 or more, a block without the layer (a parallel block's
    fused projections) and a LoRA layer are left as they are."""
    for index, block in enumerate(copy.blocks):
        if blocks is not None and index not in blocks:
            continue
        for name in layers:
            dense = getattr(block, name, None)
            if type(dense) is not keras.layers.Dense or getattr(dense, "lora_enabled", False):
                continue
            width = dense.kernel.shape[0]
            size = math.gcd(width, group)  # group is a power of two: the largest one dividing both
            if size < 8:
                continue
            rotation = np.kron(np.eye(width // size), hadamard(size))
            kernel = rotation.T @ np.asarray(dense.kernel, np.float64)
            dense.kernel.assign(kernel.astype(dense.kernel.dtype))
            dense.__class__ = HadamardInputDense
            dense.hadamard_group = size
    return copy


class UnsupportedModelError(ValueError):
    """A ViT whose residual stream the rewrite does not cover (named)."""


def _sylvester(order):
    matrix = np.ones((1, 1))
    while matrix.shape[0] < order:
        matrix = np.block([[matrix, matrix], [matrix, -matrix]])
    return matrix


def _is_prime(number):
    return number > 1 and all(number % k for k in range(2, int(number**0.5) + 1))


def _paley(order):
    """Paley's first construction, a Hadamard matrix of order q + 1 for a prime q = 3 mod 4
    (12, 20, 24, 32, 44, ...): I + S, with S the skew matrix bordering q's Jacobsthal matrix."""
    q = order - 1
    squares = {(k * k) % q for k in range(1, q)}
    jacobsthal = np.array(
        [[0 if i == j else (1 if (j - i) % q in squares else -1) for j in range(q)] for i in range(q)]
    )
    skew = np.zeros((order, order))
    skew[0, 1:], skew[1:, 0], skew[1:, 1:] = 1, -1, jacobsthal
    return np.eye(order) + skew


def hadamard(n):
    """An orthonormal `(n, n)` Hadamard matrix (entries +-1/sqrt(n)) whose first row is constant,
    or None where none is built: the Kronecker product of Sylvester's (a power of two) and
    Paley's (a prime q = 3 mod 4, order q + 1) when `n` is one times the other. ViT widths are:
    192 = 12 x 16, 384 = 12 x 32, 768 = 12 x 64, and every power of two."""
    two = n & -n  # the largest power of two dividing n
    while two >= 1:
        paley = n // two
        if paley == 1:
            matrix = _sylvester(n)
            break
        if paley % 4 == 0 and _is_prime(paley - 1):
            matrix = np.kron(_paley(paley), _sylvester(two))
            break
        two //= 2
    else:
        return None
    matrix = matrix * np.sign(matrix[0])  # columns signed so the first row is all +1
    assert np.allclose(matrix @ matrix.T, n * np.eye(n))
    return matrix / np.sqrt(n)


def rotation(n, seed=0, keep_mean=False):
    """A random orthogonal `(n, n)` Q built on `hadamard(n)` (where there is none, on a random
    orthogonal matrix with a constant first row), `s` random signs:

    - `keep_mean=False`: `diag(s) @ H`, QuaRot's randomised Hadamard. Every row is flat (+-1/sqrt(n)
      with a Hadamard): an outlier channel lands on every channel at 1/sqrt(n) of its size. The
      rotated stream is no longer mean-free, so its LayerNorms become RMSNorms (`rotated_copy`).
    - `keep_mean=True`: `H.T @ diag(1, s[1:]) @ H`, symmetric, with `Q @ 1 = 1`: mean-free rows stay
      mean-free and the LayerNorms stay exact as they are; but its rows are not flat (each entry
      a sum of n random signs over n), so an outlier lands at up to about 3/sqrt(n) of its size.
    """
    rng = np.random.default_rng(seed)
    basis = hadamard(n)
    if basis is None:
        start = rng.standard_normal((n, n))
        start[:, 0] = 1.0
        basis, _ = np.linalg.qr(start)
        basis = (basis * np.sign(basis[0, 0])).T  # first row: +1/sqrt(n)
    signs = rng.choice([-1.0, 1.0], n)
    if not keep_mean:
        return signs[:, None] * basis
    signs[0] = 1.0
    return basis.T @ (signs[:, None] * basis)


def check_rotatable(model):
    """Raises `UnsupportedModelError` for the ViTs whose stream the rewrite does not cover."""
    if not isinstance(model, ViT):
        raise UnsupportedModelError(f"The rotation rewrites keras-vit ViTs; got {type(model).__name__}.")
    reasons = {
        "pre_norm": "a LayerNorm before the blocks (CLIP's pre_norm)",
        "map": "attention pooling (MAP)",
        "no final_norm": "no final LayerNorm (the head would read the stream itself)",
        "no qkv_bias": "no QKV bias to take the first LayerNorm's shift",
        "no proj_bias": "no MLP bias to take the second LayerNorm's shift",
        "mlp": "a gated MLP",
        "include_top": "no classifier head",
    }
    found = {
        "pre_norm": model.pre_norm,
        "map": model.pooling == "map",
        "no final_norm": not model.final_norm,
        "no qkv_bias": not model.qkv_bias,
        "no proj_bias": not model.proj_bias,
        "mlp": model.mlp != "mlp",
        "include_top": not model.include_top,
    }
    unsupported = [reasons[key] for key, present in found.items() if present]
    if unsupported:
        raise UnsupportedModelError(f"The rotation does not cover a ViT with {'; '.join(unsupported)}.")


class _Weights:
    """The copy's weights by path, in float64, written back at the end."""

    def __init__(self, model):
        self.variables = {variable.path: variable for variable in model.weights}
        self.values = {path: np.asarray(v.numpy(), np.float64) for path, v in self.variables.items()}

    def __getitem__(self, path):
        return self.values[path]

    def __setitem__(self, path, value):
        assert value.shape == self.values[path].shape, path
        self.values[path] = value

    def __contains__(self, path):
        return path in self.values

    def write(self):
        for path, variable in self.variables.items():
            variable.assign(self.values[path].astype(variable.dtype))


def _write(weights, path, rotate):
    """A writer of the stream (its last axis the stream's channels): mean-free, then rotated."""
    if path in weights:
        value = weights[path]
        weights[path] = (value - value.mean(axis=-1, keepdims=True)) @ rotate


def _read(weights, norm, dense, rotate, scale):
    """`dense` reads LayerNorm `norm`'s output: the norm's scale and shift go into its kernel and
    bias, the rotation's inverse and `scale` (the new norm's factor) into its kernel; the norm
    keeps scale 1 and shift 0."""
    gamma, beta = weights[f"{norm}/gamma"], weights[f"{norm}/beta"]
    kernel = weights[f"{dense}/kernel"]
    weights[f"{dense}/bias"] = weights[f"{dense}/bias"] + beta @ kernel
    weights[f"{dense}/kernel"] = scale * rotate.T @ (gamma[:, None] * kernel)


def _fold_layer_scale(weights, block, which, writer):
    path = f"{block}/{which}"
    if path in weights:
        weights[f"{writer}/kernel"] = weights[f"{writer}/kernel"] * weights[path]
        weights[f"{writer}/bias"] = weights[f"{writer}/bias"] * weights[path]
        weights[path] = np.ones_like(weights[path])


def rotated_copy(model, seed=0, rotate=None, norm="rms"):
    """A copy of the ViT `model` with its residual stream mean-free and rotated (this module's
    docstring): the same probabilities in float, to float32 rounding, from other weights.

    Args:
        model: a keras-vit `ViT` with a head; it is not changed.
        seed: the seed of the rotation's random signs (`rotation`).
        rotate: an orthogonal `(hidden_dim, hidden_dim)` matrix to use instead (with
            `norm="layer"`, one with `rotate @ 1 = 1`); the identity gives computational
            invariance alone.
        norm: `"rms"`: a randomised Hadamard (`rotation`), the LayerNorms become `RMSNorm`s;
            `"l2"`: the same rotation, the LayerNorms become `L2Norm`s (one int8 TFLite op);
            `"layer"`: a rotation that keeps the mean (`rotation(keep_mean=True)`), the
            LayerNorms stay.

    Raises:
        UnsupportedModelError: a ViT the rewrite does not cover (CLIP's pre_norm, MAP pooling,
            no final LayerNorm, no QKV or MLP bias, a gated MLP, no head).
    """
    check_rotatable(model)
    if norm not in NORMS:
        raise ValueError(f"Unknown norm {norm!r}; choose from {', '.join(NORMS)}.")
    if rotate is None:
        rotate = rotation(model.hidden_dim, seed, keep_mean=norm == "layer")
    rotate = np.asarray(rotate, np.float64)
    if norm == "layer" and not np.allclose(rotate @ np.ones(len(rotate)), 1.0, atol=1e-9):
        raise ValueError("With norm='layer' the rotation must keep the mean: rotate @ 1 = 1.")
    copy = ViT.from_config(model.get_config())
    copy.set_weights(model.get_weights())
    scale = np.sqrt(model.hidden_dim) if norm == "l2" else 1.0
    weights = _Weights(copy)
    for writer in ("projection/kernel", "projection/bias", "cls_token", "dist_token", "reg_token"):
        _write(weights, f"patch_encoder/{writer}", rotate)
    _write(weights, "patch_encoder/position_embedding", rotate)
    for i in range(model.depth):
        block = f"block_{i}"
        _read(weights, f"{block}/norm1", f"{block}/attention/qkv", rotate, scale)
        _read(weights, f"{block}/norm2", f"{block}/fc1", rotate, scale)
        for which, writer in (("ls1", f"{block}/attention/proj"), ("ls2", f"{block}/fc2")):
            _fold_layer_scale(weights, block, which, writer)
            _write(weights, f"{writer}/kernel", rotate)
            _write(weights, f"{writer}/bias", rotate)
        for name in ("norm1", "norm2"):
            weights[f"{block}/{name}/gamma"] = np.ones(model.hidden_dim)
            weights[f"{block}/{name}/beta"] = np.zeros(model.hidden_dim)
    for head in ("pre_logits", "head", "head_dist"):
        if f"{head}/kernel" in weights:
            _read(weights, "norm", head, rotate, scale)
            if head == "pre_logits":
                break  # the heads read pre_logits' output, not the stream
    weights["norm/gamma"] = np.ones(model.hidden_dim)
    weights["norm/beta"] = np.zeros(model.hidden_dim)
    weights.write()
    if norm != "layer":
        for layer in _layer_norms(copy):
            layer.__class__ = RMSNorm if norm == "rms" else L2Norm
    return copy


def _layer_norms(model):
    found = [model.get_layer("norm")]
    for block in model.blocks:
        found += [block.norm1, block.norm2]
    return found


class TokenScaledBlock(TransformerBlock):
    """A block of a copy whose residual stream carries some tokens scaled (`with_massive_tokens`):
    the stream is `factors * x`, `factors` one constant per token, so that one per-tensor int8
    scale holds both the massive tokens and the others. Every later write is scaled the same way
    (one MUL); the norms are per token and blind to a token's scale, so the readers see what they
    saw. The first such block scales its own output, and can take its MLP's massive hidden
    `units` apart (their fc1 columns and fc2 rows), scaled per token before their own fc2, so that
    no int8 tensor but theirs holds the massive write."""

    def _forward(self, x, training=None, return_attention_scores=False, position_bias=None):
        factors = keras.ops.cast(self.token_factors, x.dtype)
        attended, scores = self._attend(self.norm1(x), training, return_attention_scores, position_bias)
        x = x + (attended if self.first_scaled else factors * attended)
        if not self.first_scaled:
            x = x + factors * self._mlp(self.norm2(x), training=training)
        elif len(self.units):
            x = factors * x + self._split_mlp(self.norm2(x), factors)
        else:
            x = factors * (x + self._mlp(self.norm2(x), training=training))
        return (x, scores) if return_attention_scores else x

    def _split_mlp(self, x, factors):
        kernel1, bias1, kernel2, bias2 = self.split_weights
        rest = np.setdiff1d(np.arange(kernel1.shape[1]), self.units)

        def hidden(columns):
            return self.fc1.activation(keras.ops.matmul(x, kernel1[:, columns]) + bias1[columns])

        kept = factors * (keras.ops.matmul(hidden(rest), kernel2[rest]) + bias2)
        return kept + keras.ops.matmul(factors * hidden(self.units), kernel2[self.units])


def massive_tokens(model, images, block, ratio=10.0):
    """The token positions whose root mean square after `block` exceeds `ratio` times the median
    token's on most of `images` (timm's ViT-Ti, block 7 on: the four corner patches, 1, 14, 183
    and 196, on 92% of Imagenette photos; docs/benchmarks/int8.md, sixth pass)."""
    stream = keras.ops.convert_to_numpy(keras.Model(model.inputs, model.blocks[block].output)([images]))
    rms = np.sqrt((stream.astype(np.float64) ** 2).mean(-1))
    massive = rms > ratio * np.median(rms, axis=1, keepdims=True)
    return np.flatnonzero(massive.mean(0) > 0.5)


def massive_units(model, images, block, limit=32.0):
    """The hidden units of `block`'s MLP whose activation exceeds `limit` on `images` (timm's
    ViT-Ti, block 7: unit 417, up to 212 at the corner tokens, at most 8.1 elsewhere)."""
    layer = model.blocks[block]
    x = keras.Model(model.inputs, model.blocks[block - 1].output)([images]) if block else None
    if x is None:
        raise ValueError("The massive units are looked for from block 1 on.")
    x = x + layer.attention(layer.norm1(x))
    hidden = keras.ops.convert_to_numpy(layer.fc1(layer.norm2(x)))  # fc1 carries the activation
    return np.flatnonzero(np.abs(hidden).max((0, 1)) > limit)


def with_massive_tokens(copy, tokens, block, scale=1 / 32, units=()):
    """`copy` (a `rotated_copy` with `norm="rms"` or `"l2"`, changed in place and returned) with
    its stream's `tokens` multiplied by `scale` from the end of `block` on, and `block`'s MLP
    `units` taken apart (`TokenScaledBlock`). The float model is unchanged (the norms do not see a
    token's scale; with `L2Norm`, to its epsilon floor)."""
    if any(
        isinstance(layer, keras.layers.LayerNormalization) and type(layer) is keras.layers.LayerNormalization
        for layer in _layer_norms(copy)
    ):
        raise ValueError("The token scales need a rotated copy whose norms are RMSNorm or L2Norm.")
    if copy.architecture.norm_after_pooling and copy.pooling != "token":
        raise UnsupportedModelError("The token scales need the final norm before an average pooling.")
    factors = np.ones((1, copy.blocks[0].input.shape[1], 1), np.float32)
    factors[0, np.asarray(tokens, int)] = scale
    for i, layer in enumerate(copy.blocks[block:], start=block):
        if type(layer) is not TransformerBlock:
            raise UnsupportedModelError(
                f"The token scales rewrite TransformerBlocks; got {type(layer).__name__}."
            )
        layer.__class__ = TokenScaledBlock
        layer.token_factors = factors
        layer.first_scaled = i == block
        layer.units = np.asarray(units if i == block else (), int)
        # read now, eagerly: the split MLP is traced into the export's graph with them as constants
        layer.split_weights = [
            keras.ops.convert_to_numpy(w) for w in (*layer.fc1.weights, *layer.fc2.weights)
        ]
    return copy


class PerHeadAttention(MultiHeadSelfAttention):
    """The same attention with each head's `q k^T`, softmax and `p v` as ops of their own, so that
    a full-integer model gives each head its own int8 scales for its logits, probabilities, keys
    and values (one per-tensor scale over every head otherwise). Float-exact: the same products."""

    def call(self, x, training=None, return_attention_scores=False, position_bias=None):
        if position_bias is not None or self.rel_pos is not None or return_attention_scores:
            return super().call(x, training, return_attention_scores, position_bias)
        q, k, v = ops.split(self.qkv(x), 3, axis=-1)
        outputs = []
        for head in range(self.num_heads):
            part = slice(head * self.head_dim, (head + 1) * self.head_dim)
            scores = ops.matmul(
                q[..., part] * ops.cast(self.scale, x.dtype), ops.transpose(k[..., part], (0, 2, 1))
            )
            outputs.append(ops.matmul(ops.softmax(scores, axis=-1), v[..., part]))
        out = ops.concatenate(outputs, axis=-1)
        return self.dropout_layer(self.proj(self._scale_norm(out)), training=training)


def with_per_head_attention(copy):
    """`copy` (changed in place and returned) with every block's attention a `PerHeadAttention`."""
    for block in copy.blocks:
        if type(block.attention) is not MultiHeadSelfAttention:
            raise UnsupportedModelError(
                f"Per-head attention rewrites MultiHeadSelfAttention; got {type(block.attention).__name__}."
            )
        block.attention.__class__ = PerHeadAttention
    return copy
