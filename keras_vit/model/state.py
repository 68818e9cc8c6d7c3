"""timm-style state dicts, the one form every checkpoint is turned into: keys such as
`blocks.0.attn.qkv.weight`, PyTorch layouts, NumPy arrays.

A family's `checkpoint.py` lists its targets as (timm key, Keras variable, layout), with the
helpers here; `keras_vit.model.weights` reads the files, converts each layout and assigns.
"""

import numpy as np


class CheckpointMismatchError(ValueError):
    """A checkpoint does not fit the model: a key is missing, extra, or of another shape."""


class Layout:
    """How a PyTorch tensor maps to a Keras variable, both ways."""

    def __init__(self, to_keras, to_torch):
        self.to_keras, self.to_torch = to_keras, to_torch


# A Dense kernel: (out, in) in PyTorch, (in, out) in Keras.
LINEAR = Layout(np.transpose, np.transpose)
# A convolution kernel: (out, in, kh, kw) in PyTorch, (kh, kw, in, out) in Keras.
CONV = Layout(lambda w: w.transpose(2, 3, 1, 0), lambda w: w.transpose(3, 2, 0, 1))


def linear(layer, prefix, bias=True):
    """(timm key, Keras variable, layout) of a Dense layer's kernel and bias."""
    targets = [(f"{prefix}.weight", layer.kernel, LINEAR)]
    return targets + ([(f"{prefix}.bias", layer.bias, None)] if bias else [])


def norm(layer, prefix):
    """A LayerNormalization's scale and offset, or an RMSNormalization's scale."""
    if not hasattr(layer, "gamma"):  # an RMSNormalization: a scale alone
        return [(f"{prefix}.weight", layer.scale, None)]
    return [(f"{prefix}.weight", layer.gamma, None), (f"{prefix}.bias", layer.beta, None)]


def to_keras(value, layout):
    return layout.to_keras(value) if layout is not None else value


def to_torch(value, layout):
    return layout.to_torch(value) if layout is not None else value
