"""Layers every family shares: the in-model image normalisation, stochastic depth, the kernel
initialiser and the base of the transformer blocks (`Block`, which can recompute its
activations). Each family's own layers are in its folder (`vit/layers.py`, ...).

Each layer stores its constructor arguments under `# === Config ===`, builds
its sublayers with `dtype=self.dtype_policy` (so mixed precision needs no
special cases) and returns every argument from `get_config`.
"""

import keras
from keras import ops

from keras_vit.model.checks import check_rate
from keras_vit.model.remat import recomputed

# timm's and the paper's initialisation: truncated normal, std 0.02.
_WEIGHT_INIT = {"class_name": "TruncatedNormal", "config": {"stddev": 0.02}}


def weight_initializer():
    """The initialiser of every dense and projection kernel (a fresh one per call)."""
    return keras.initializers.get(_WEIGHT_INIT)


class Block(keras.layers.Layer):
    """A transformer block whose activations can be recomputed in the backward pass instead of
    kept (`--remat`): set `rematerialise` to True before the model is traced. It is a training
    setting, not part of the model: a saved model does not keep it.

    A block's `call` runs its `forward` through `self.forward_of`, which recomputes a pure
    function of the input and the block's float weights (`remat.recomputed`: JAX's checkpoint
    with the backward pass's order fixed). Keras' `RematScope` would pass the layer's keyword
    arguments through too, which TensorFlow's `recompute_grad` refuses in a graph and JAX traces
    (`training` included, which no Python branch can then read), and the dropout draws' seed
    states, updated inside, would leak out of JAX's checkpoint. Here they are updated outside
    it.
    """

    rematerialise = False

    def forward_of(self, forward, x, *inputs, **arguments):
        """`forward(x, *inputs, **arguments)`, recomputed in the backward pass when set: `inputs`
        are tensors the block takes beside `x` (an Eva's rotary table), differentiated as `x` is."""
        if not self.rematerialise:
            return forward(x, *inputs, **arguments)
        variables = self.variables
        values = [v.value for v in variables]
        # What trains is differentiated; frozen weights (LoRA's base kernels, a frozen backbone)
        # stay constants, so the backward pass computes no gradient for them.
        weights = [i for i, v in enumerate(variables) if _is_float(v) and v.trainable]

        def pure(x, *tensors):
            extra, weight_values = tensors[: len(inputs)], tensors[len(inputs) :]
            current = list(values)
            for i, value in zip(weights, weight_values, strict=True):
                current[i] = value
            with keras.StatelessScope(state_mapping=list(zip(variables, current, strict=True))) as scope:
                y = forward(x, *extra, **arguments)
            return y, [scope.get_current_value(v) for v in variables if not _is_float(v)]

        y, states = recomputed(pure)(x, *inputs, *(values[i] for i in weights))
        for variable, state in zip([v for v in variables if not _is_float(v)], states, strict=True):
            variable.assign(state)
        return y


def patch_grid(height, width, patch_size):
    """(rows, columns) of whole patches, as timm's `PatchEmbed` sees them: its convolution of
    stride P reads `H // P` x `W // P` patches and never the last `H % P` rows and `W % P` columns
    (SigLIP-So400m/14 at 384: 27 x 27 patches, its last 6 rows and columns of pixels unread).

    Raises:
        ValueError: a side shorter than one patch.
    """
    if height < patch_size or width < patch_size:
        raise ValueError(
            f"Image size {height}x{width} (height x width) is smaller than one {patch_size}x{patch_size} "
            f"patch. Give images of at least {patch_size} pixels a side, or a smaller patch size."
        )
    return height // patch_size, width // patch_size


def attention_output_spec(layer, x, return_attention_scores, queries=None):
    """Symbolic outputs of attention layers and blocks: tokens (the first `queries` when given),
    plus `(batch, heads, queries, tokens)` scores."""
    rows = x.shape[1] if queries is None else queries
    out = keras.KerasTensor((x.shape[0], rows, *x.shape[2:]), dtype=layer.compute_dtype)
    if not return_attention_scores:
        return out
    scores = (x.shape[0], layer.num_heads, rows, x.shape[1])
    return out, keras.KerasTensor(scores, dtype=layer.compute_dtype)


def _is_float(variable):
    return "float" in str(variable.dtype)


@keras.saving.register_keras_serializable(package="keras_vit")
class ImageNormalization(keras.layers.Layer):
    """Maps pixel values in [0, 255] to `(x / 255 - mean) / std`, per channel.

    One multiply and one add, so it stays two builtin ops in TFLite. The
    mean and std live in the config, so every saved or exported model
    carries its own normalisation.

    Args:
        mean: list of floats, one per channel, on the [0, 1] scale.
        std: list of floats, one per channel, on the [0, 1] scale.
    """

    def __init__(self, mean, std, **kwargs):
        super().__init__(**kwargs)
        mean, std = [float(m) for m in mean], [float(s) for s in std]
        if len(mean) != len(std) or not mean:
            raise ValueError(f"mean and std need one value per channel, got mean={mean}, std={std}.")
        if min(std) <= 0:
            raise ValueError(f"std values must be positive, got {std}.")
        # === Config ===
        self.mean = mean
        self.std = std

    def build(self, input_shape):
        if input_shape[-1] != len(self.mean):
            raise ValueError(
                f"ImageNormalization has {len(self.mean)} channel values but the images have "
                f"{input_shape[-1]} channels."
            )

    def call(self, images):
        scale = [1.0 / (255.0 * s) for s in self.std]
        offset = [-m / s for m, s in zip(self.mean, self.std, strict=True)]
        images = ops.cast(images, self.compute_dtype)
        return images * ops.cast(scale, images.dtype) + ops.cast(offset, images.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update({"mean": self.mean, "std": self.std})
        return config


@keras.saving.register_keras_serializable(package="keras_vit")
class DropPath(keras.layers.Layer):
    """Stochastic depth: drops a whole residual branch per sample while training.

    Kept samples are scaled by `1 / (1 - rate)`, so inference is the identity.

    Args:
        rate: float. Probability of dropping the branch for a sample.
        seed: int or None. Seed of the random draws.
    """

    def __init__(self, rate, seed=None, **kwargs):
        super().__init__(**kwargs)
        check_rate(rate, "drop path rate")
        # === Config ===
        self.rate = rate
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)

    def call(self, x, training=None):
        if not training or self.rate == 0:
            return x
        noise_shape = (ops.shape(x)[0],) + (1,) * (len(x.shape) - 1)
        return keras.random.dropout(x, self.rate, noise_shape=noise_shape, seed=self.seed_generator)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update({"rate": self.rate, "seed": self.seed})
        return config
