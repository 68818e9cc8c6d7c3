"""A float-exact rewrite of a ViT that makes its linear layers' inputs easier to hold in int8.

Done on an export-time copy of the model, before conversion; the original is untouched. Two
rewrites, both exact in real arithmetic (the copy's outputs equal the original's to float
rounding):

- LayerNorm folding (RepQ-ViT, SmoothQuant): each LayerNorm's scale `gamma` and offset `beta`
  move into the linear layer it feeds: `kernel' = diag(gamma) @ kernel`, `bias' = bias + beta @
  kernel`, and the LayerNorm keeps scale 1 and offset 0. Its output is then the plain
  normalised token, whose channels no longer carry `gamma`'s spread.
- SmoothQuant smoothing: each input channel `j` of the layer is divided by `s_j` and the
  kernel's row `j` multiplied by it, `s_j = max|x_j|^alpha / max|w_j|^(1 - alpha)`, from the
  channels' ranges over calibration images. The division lands in the LayerNorm's scale
  (`1 / s`) for the QKV and first MLP projections, and in the value columns of the QKV
  projection for the attention's output projection (attention mixes tokens, not channels).

The second MLP projection reads GELU's output, which no linear rewrite reaches, and the residual
stream is read by LayerNorm, which a per-channel scale would change: both stay as they are.
"""

import dataclasses

import keras
import numpy as np

# Smoothing strength: 0 leaves the activations alone, 1 moves all their spread into the weights.
ALPHA = 0.5


def smoothed_classifier(classifier, images, alpha=ALPHA, batch_size=16):
    """`classifier` (an `export.classifier.Classifier`) with a rewritten copy of its model;
    `images`: calibration pixels `(n, h, w, c)` in [0, 255]."""
    return dataclasses.replace(classifier, model=smoothed_model(classifier.model, images, alpha, batch_size))


def smoothed_model(model, images, alpha=ALPHA, batch_size=16):
    """A copy of the keras-vit `model` with every LayerNorm folded and every QKV, first MLP and
    attention output projection smoothed (see the module docstring)."""
    copy = model.__class__.from_config(model.get_config())
    copy.set_weights(model.get_weights())
    pairs = _foldable(copy)
    linear = [dense for _, dense, _ in pairs]
    ranges = _input_ranges(copy, linear, images, batch_size)
    for norm, dense, values_of in pairs:
        low, high = ranges[id(dense)]
        if norm is not None:
            _fold_and_smooth(norm, dense, low, high, alpha)
        else:
            _smooth_values(values_of, dense, low, high, alpha)
    return copy


def _foldable(model):
    """`(layer norm, dense, None)` for each LayerNorm feeding a Dense, and `(None, proj, qkv)`
    for each attention output projection, whose input channels are the QKV's value columns."""
    pairs = []
    for block in getattr(model, "blocks", []):
        if getattr(block, "layer_scale", None) is not None:
            continue  # nothing to fold past LayerScale's multiply: leave such a block alone
        pairs.append((block.norm1, block.attention.qkv, None))
        pairs.append((None, block.attention.proj, block.attention.qkv))
        pairs.append((block.norm2, block.fc1, None))
    return pairs


def _input_ranges(model, layers, images, batch_size):
    """Each layer's per-channel input minimum and maximum over `images`, by id."""
    ranges = {}

    def recording(layer, call):
        def record(x, *args, **kwargs):
            values = keras.ops.convert_to_numpy(x).reshape(-1, x.shape[-1])
            low, high = ranges.get(id(layer), (np.inf, -np.inf))
            ranges[id(layer)] = (np.minimum(low, values.min(0)), np.maximum(high, values.max(0)))
            return call(x, *args, **kwargs)

        return record

    for layer in layers:
        layer.call = recording(layer, layer.call)
    try:
        for start in range(0, len(images), batch_size):
            model(np.asarray(images[start : start + batch_size], np.float32), training=False)
    finally:
        for layer in layers:
            del layer.call  # back to the class's method
    return ranges


def _factors(activation_max, kernel, alpha):
    weight_max = np.abs(kernel).max(axis=1)
    factors = np.maximum(activation_max, 1e-5) ** alpha / np.maximum(weight_max, 1e-5) ** (1 - alpha)
    return np.clip(factors, 1e-3, 1e3)


def _fold_and_smooth(norm, dense, low, high, alpha):
    """LayerNorm `y = n * gamma + beta` into `dense`, then input channel j divided by `s_j`."""
    gamma = keras.ops.convert_to_numpy(norm.gamma).astype(np.float64)
    beta = keras.ops.convert_to_numpy(norm.beta).astype(np.float64)
    kernel = keras.ops.convert_to_numpy(dense.kernel).astype(np.float64)
    bias = keras.ops.convert_to_numpy(dense.bias).astype(np.float64)
    # The normalised input n = (y - beta) / gamma over the images, from y's channel ranges.
    normalised = np.maximum(np.abs(low - beta), np.abs(high - beta)) / np.maximum(np.abs(gamma), 1e-12)
    kernel, bias = gamma[:, None] * kernel, bias + beta @ kernel
    factors = _factors(normalised, kernel, alpha)
    norm.gamma.assign((1 / factors).astype(np.float32))
    norm.beta.assign(np.zeros_like(beta, np.float32))
    dense.kernel.assign((factors[:, None] * kernel).astype(np.float32))
    dense.bias.assign(bias.astype(np.float32))


def _smooth_values(qkv, proj, low, high, alpha):
    """The attention output's channel j (value channel j) divided by `s_j` in the QKV
    projection's value columns, and `proj`'s kernel row j multiplied by it."""
    kernel = keras.ops.convert_to_numpy(proj.kernel).astype(np.float64)
    factors = _factors(np.maximum(np.abs(low), np.abs(high)), kernel, alpha)
    width = kernel.shape[0]
    qkv_kernel = keras.ops.convert_to_numpy(qkv.kernel).astype(np.float64)
    qkv_bias = keras.ops.convert_to_numpy(qkv.bias).astype(np.float64)
    qkv_kernel[:, 2 * width :] /= factors
    qkv_bias[2 * width :] /= factors
    qkv.kernel.assign(qkv_kernel.astype(np.float32))
    qkv.bias.assign(qkv_bias.astype(np.float32))
    proj.kernel.assign((factors[:, None] * kernel).astype(np.float32))
