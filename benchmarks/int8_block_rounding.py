"""Block-wise reconstruction of the int8 rounding (BRECQ, Li et al., ICLR 2021), for
`int8_weights.py`'s `block-adaround` recipe (issue 49, sixteenth pass).

`sequential_adaround` rounds one kernel at a time against that layer's own float output: it
cannot see what attention's softmax, GELU or the next layer's int8 input make of its error. Here
all four kernels of a Transformer block (QKV, proj, fc1, fc2) learn their rounding together, as
AdaRound's continuous up-or-down choices, against the float block's output on the float model's
input, while the block itself runs on the input the already rounded blocks before it give, with
each Dense input quantised as the dynamic-range file does (a straight-through gradient). So the
rounding answers for the error upstream, for the int8 inputs inside the block, and for the ops
between the kernels. With `learn_bias`, each bias moves too (a dynamic-range FULLY_CONNECTED keeps
its bias in float: free in the file).
"""

import keras
import numpy as np
import tensorflow as tf
from int8_weights import straight_through_inputs

from keras_vit.export.adaround import GAMMA, ZETA, adaround_kernel, adaround_start
from keras_vit.export.dynamic_range import dense_layers, dynamic_inputs


def block_inputs(model, images, batch=10):
    """The first Transformer block's input for `images`: `(images, tokens, width)` float32."""
    first = model.blocks[0]
    stem = keras.Model(model.inputs, first.input)
    return np.concatenate(
        [np.asarray(stem(images[i : i + batch], training=False)) for i in range(0, len(images), batch)]
    )


def run_block(block, tokens, dynamic=None, batch=10):
    """`block` on `tokens` (numpy, by `batch` images), each Dense input it quantises under
    `dynamic_inputs(dynamic)` quantised as the file does."""
    with dynamic_inputs(dynamic):
        return np.concatenate(
            [np.asarray(block(tokens[i : i + batch], training=False)) for i in range(0, len(tokens), batch)]
        )


class _Rounding:
    """One kernel's learned rounding: the per-channel int8 grid of `round_to_nearest`, each
    weight taking its floor or the level above as `h(v)` (0..1) learns."""

    def __init__(self, layer, learn_bias):
        self.layer = layer
        self.kernel = np.asarray(layer.kernel, np.float64)
        self.scale, self.low, v = adaround_start(self.kernel)
        self.v = tf.Variable(v, dtype="float32")
        self.bias_shift = tf.Variable(np.zeros(layer.bias.shape), dtype="float32") if learn_bias else None

    @property
    def variables(self):
        return [self.v] + ([self.bias_shift] if self.bias_shift is not None else [])

    def up(self):
        return tf.clip_by_value(tf.sigmoid(self.v) * (ZETA - GAMMA) + GAMMA, 0.0, 1.0)

    def mapping(self):
        """`(variable, value)` pairs for a `keras.StatelessScope`: the soft-rounded kernel."""
        soft = (self.low.astype("float32") + self.up()) * self.scale.astype("float32")
        pairs = [(self.layer.kernel, soft)]
        if self.bias_shift is not None:
            pairs.append((self.layer.bias, tf.convert_to_tensor(self.layer.bias) + self.bias_shift))
        return pairs

    def penalty(self, beta):
        """AdaRound's regulariser: drives each `h` to 0 or 1 as `beta` falls."""
        return tf.reduce_sum(1.0 - tf.abs(2.0 * self.up() - 1.0) ** beta)

    def assign(self):
        """The hard rounding into the layer (`adaround_kernel`), and the learned bias."""
        rounded = adaround_kernel(self.kernel, self.scale, self.low, np.asarray(self.up()) >= 0.5)
        self.layer.kernel.assign(rounded.astype("float32"))
        if self.bias_shift is not None:
            self.layer.bias.assign(np.asarray(self.layer.bias) + np.asarray(self.bias_shift))


def round_block(
    block,
    rounded_inputs,
    float_outputs,
    dynamic=None,
    kept=(),
    steps=1000,
    regulariser=0.01,
    batch=4,
    learning_rate=1e-2,
    learn_bias=False,
    seed=0,
):
    """Learns the rounding of `block`'s Dense kernels (not those at `kept` paths) so that `block`
    on `rounded_inputs` gives `float_outputs` (both `(images, tokens, width)`), `batch` images a
    step, Adam; assigns the hard rounding. Returns the last steps' mean reconstruction error."""
    roundings = [_Rounding(layer, learn_bias) for layer in dense_layers(block) if layer.path not in kept]
    if not roundings:
        return None
    variables = [variable for rounding in roundings for variable in rounding.variables]
    optimizer = keras.optimizers.Adam(learning_rate)
    optimizer.build(variables)
    warmup = steps // 5

    @tf.function
    def step(tokens, target, beta, weight):
        with tf.GradientTape() as tape:
            mapping = [pair for rounding in roundings for pair in rounding.mapping()]
            with keras.StatelessScope(state_mapping=mapping), straight_through_inputs(dynamic):
                output = block(tokens, training=False)
            error = tf.reduce_mean(tf.reduce_sum(tf.square(output - target), -1))
            penalty = tf.add_n([rounding.penalty(beta) for rounding in roundings])
            loss = error + weight * regulariser * penalty
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables, strict=True))
        return error

    rng = np.random.default_rng(seed)
    errors = []
    for index in range(1, steps + 1):
        chosen = rng.choice(len(rounded_inputs), batch, replace=False)
        late = index > warmup
        beta = 20 + (2 - 20) * (index - warmup) / (steps - warmup) if late else 20.0
        error = step(
            tf.constant(rounded_inputs[chosen]),
            tf.constant(float_outputs[chosen]),
            tf.constant(beta, "float32"),
            tf.constant(1.0 if late else 0.0),
        )
        errors.append(float(error))
    for rounding in roundings:
        rounding.assign()
    return float(np.mean(errors[-max(steps // 10, 1) :]))


def block_adaround(model, calibration, dynamic=None, kept=(), log=None, **options):
    """BRECQ over `model`'s Transformer blocks in order: each block's rounding learned on the
    input of the model whose earlier blocks are rounded, against the float block's output on the
    float input (`round_block`). Kernels outside the blocks (the head) are left to the caller."""
    float_tokens = block_inputs(model, calibration)
    rounded_tokens = float_tokens
    for index, block in enumerate(model.blocks):
        float_outputs = run_block(block, float_tokens)  # before this block is rounded
        error = round_block(
            block, rounded_tokens, float_outputs, dynamic=dynamic, kept=kept, seed=index, **options
        )
        rounded_tokens = run_block(block, rounded_tokens, dynamic)
        if log:
            drift = float(np.mean(np.sum((rounded_tokens - float_outputs) ** 2, -1)))
            log({"block": index, "fit_error": error, "output_error": drift})
        float_tokens = float_outputs
