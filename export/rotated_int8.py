"""The ViT family's `int8`: the residual stream rotated offline, the dearest layers in float, every
other projection dynamic-range int8 with AdaRound kernels (issue 49; docs/benchmarks/int8.md,
nineteenth and twentieth passes).

On a copy of the model (never the user's), from the calibration images:
1. `rotate.rotated_copy(norm="rms")`: LayerNorms folded, the stream mean-free and rotated by a
   randomised Hadamard (the real ViT-Ti's outlier channel, -585 where the others stay within
   +-40, spread over every channel); RMSNorms without affine. Float-exact.
2. fc2's input rotated in the graph by a Hadamard of 64 (`rotate.rotate_inputs`) in the blocks
   whose MLP has a unit above `MASSIVE_UNIT` (the ViT-Ti's block 7 alone: unit 417 at 212, no
   other above 13). Float-exact; the rotation stays a float op.
3. The `FLOAT_SHARE` of the Dense layers that cost time whose int8 input alone moves the
   calibration images' probabilities most (`dynamic_range.input_sensitivity`), and the
   last block's layers that the export runs on the [cls] row alone (near free) keep float inputs
   and kernels.
4. Every other kernel rounded by `adaround.sequential_adaround`, under the dynamic-range inputs.
5. Each block's MLP takes the [cls] row apart and quantises it twice (`ClsTwiceMlpBlock`).

The file: every FULLY_CONNECTED dynamic-range int8 (XNNPACK's int8 kernels) but the float layers
and the Hadamard; every other op float. On the real ViT-Ti through the export's own path (100
calibration photos, 3,825 held-out Imagenette photos): 99.11% top-1 agreement with fp32 (the
family's rules: 98.33%), no accuracy lost, 0.59x fp32's batch-1 time on a Zen 5
(`benchmarks/int8_shipped.py`, twenty-first pass); three rotations of the recipe average 99.04%.
"""

import contextlib
import dataclasses
import logging

import keras
import numpy as np
from keras import ops

from keras_vit.export import adaround, dynamic_range, quantize, rotate
from keras_vit.model.vit.layers import MultiHeadSelfAttention, TransformerBlock

logger = logging.getLogger(__name__)

# The rotation's random signs (`rotate.rotation`): one draw; others land within a few photos.
ROTATION_SEED = 0
# A block's fc2 takes its input through a Hadamard where one of its units exceeds this.
MASSIVE_UNIT = 32.0
# The share of the Dense layers that cost time kept float, by the cost of their int8 input: nine
# of the ViT-Ti's 46 (each about 0.012x of fp32's time; the nineteenth pass's choice).
FLOAT_SHARE = 0.2
# Calibration images the ranking and the rounding see: each runs the model about once a layer
# over them (the whole export: 206 s for a ViT-Ti at 224 on two Zen 5 cores; four times as many
# cut the divergence by a tenth, at about four times the time).
ROUNDING_IMAGES = 100
ADAROUND_STEPS = 1000
# The name scope of the [cls] row's quantisation residual (`ClsTwiceMlpBlock`).
RESIDUAL_SCOPE = "cls_residual"


def check(model):
    """Raises `rotate.UnsupportedModelError` for a model this recipe does not cover (it then gets
    the family's rules alone, `Family.quantization_recipes`)."""
    rotate.check_rotatable(model)
    if model.shared_position_bias:
        raise rotate.UnsupportedModelError("The int8 rewrite does not cover a shared relative position bias.")
    for block in model.blocks:
        attention = block.attention
        if type(block) is not TransformerBlock or type(attention) is not MultiHeadSelfAttention:
            raise rotate.UnsupportedModelError(
                "The int8 rewrite covers pre-norm blocks with standard attention; "
                f"got {type(block).__name__}."
            )
        if attention.rel_pos is not None or attention.scale_norm or block.mlp_norm is not None:
            raise rotate.UnsupportedModelError(
                "The int8 rewrite does not cover relative positions or sub-LayerNorms."
            )
    if any(getattr(layer, "lora_enabled", False) for layer in dynamic_range.dense_layers(model)):
        raise rotate.UnsupportedModelError("The int8 rewrite does not cover LoRA layers: merge them first.")


@dataclasses.dataclass(frozen=True)
class Int8Model:
    """The rewritten copy, and what its quantisation rules keep float."""

    model: keras.Model
    float_layers: tuple  # Dense layer paths
    hadamard_blocks: tuple  # block indices whose fc2 input is rotated in the graph

    def rules(self):
        """Every FULLY_CONNECTED dynamic-range int8 but the float layers and the Hadamard."""
        fully_connected = "FULLY_CONNECTED"
        return (
            quantize.Rule(".*", fully_connected, quantize.DYNAMIC),
            quantize.Rule(f"/{rotate.HADAMARD_SCOPE}/", fully_connected, None),
            *(quantize.Rule(op_name_pattern(path), fully_connected, None) for path in self.float_layers),
            *quantize.FLOAT_IO,
        )


def int8_model(model, images, seed=ROTATION_SEED, float_share=FLOAT_SHARE, steps=ADAROUND_STEPS):
    """The recipe's copy of the ViT `model` (this module's docstring), from calibration `images`
    (the model's input: pixels, `(n, h, w, c)`; the first `ROUNDING_IMAGES`).

    Raises:
        rotate.UnsupportedModelError: a model the recipe does not cover (`check`).
    """
    check(model)
    images = np.asarray(images[:ROUNDING_IMAGES], np.float32)
    logger.info(
        "Rounding the int8 kernels of %d projections on %d calibration images (minutes: about four "
        "for a ViT-Ti at 224 on two cores) ...", len(dynamic_range.dense_layers(model)), len(images),
    )  # fmt: skip
    float_copy = rotate.rotated_copy(model, seed=seed, norm="rms")
    blocks = massive_unit_blocks(float_copy, images)
    rotate.rotate_inputs(float_copy, ("fc2",), blocks=blocks)
    copy = rotate.rotate_inputs(rotate.rotated_copy(model, seed=seed, norm="rms"), ("fc2",), blocks=blocks)
    free = last_block_row_layers(copy, images[0])
    paths = [layer.path for layer in dynamic_range.dense_layers(copy)]
    count = int(float_share * (len(paths) - len(free)))
    kept = float_layer_choice(dynamic_range.input_sensitivity(copy, images), count, free)
    adaround.sequential_adaround(
        copy, float_copy, images, steps=steps, dynamic=dynamic_range.all_inputs_but(kept), kept=set(kept)
    )
    if _reads_cls_token(copy):
        with_cls_twice_mlp(copy, once=kept)
    return Int8Model(copy, tuple(kept), tuple(blocks))


def massive_unit_blocks(model, images, limit=MASSIVE_UNIT):
    """The indices of `model`'s blocks whose fc2 input (the MLP's hidden units) exceeds `limit`
    on `images`."""
    peaks = {}

    def record(layer, inputs):
        peaks[layer.path] = max(peaks.get(layer.path, 0.0), float(ops.max(ops.abs(inputs))))

    dynamic_range.run_recording(model, images, record)
    return [index for index, block in enumerate(model.blocks) if peaks.get(block.fc2.path, 0.0) > limit]


def last_block_row_layers(model, image):
    """The Dense layers before the head that the export's forward (the family's
    `classifier_forward`) feeds one row an image (a [cls]-pooled ViT's last proj, fc1 and fc2;
    none when its head reads every token), found by running it on `image`: in float they cost a
    product of one row."""
    from keras_vit.model import registry

    classifier_forward = registry.family_of(model).classifier_forward
    rows = {}

    def record(layer, inputs):
        rows[layer.path] = int(np.prod(inputs.shape[:-1]))
        return inputs

    with dynamic_range.dense_inputs_mapped(record):
        classifier_forward(model)(image[None])
    head = dynamic_range.dense_layers(model)[-1].path
    return [path for path, count in rows.items() if count == 1 and path != head]


def float_layer_choice(scores, count, free=()):
    """The layers kept float: the `count` dearest by `scores` (`input_sensitivity`) among those
    not in `free`, then `free` (`last_block_row_layers`, near free in time), so that a free layer
    never takes one of the `count` places that cost time."""
    free = list(free)
    ranked = [path for path in sorted(scores, key=scores.get, reverse=True) if path not in free]
    return ranked[:count] + free


def op_name_pattern(path):
    """A Keras layer path ("block_0/fc1") as a regex of the TFLite names of its ops, where the
    converter suffixes each scope ("vit_1/block_0_1/fc1_1/Tensordot")."""
    return "(^|/)" + "".join(rf"{part}(_\d+)?/" for part in path.split("/"))


def _reads_cls_token(model):
    return model.class_token and model.pooling == "token"


class ClsTwiceMlpBlock(TransformerBlock):
    """A block whose MLP takes the [cls] row apart from the others (the same products, row by
    row) and quantises it twice in fc1 and fc2: the row's dynamic-range residual
    (`dynamic_range_residual`) is one more row of the same product, so that a dynamic-range file
    computes `(Q(x) + Q(x - Q(x))) W`, about 255 times finer than `Q(x) W`, for one row more.
    The [cls] row reaches the head; the others only through attention. In float the row is not
    exact (`(2x - Q(x)) W + b`): an export-time copy for int8 files only
    (`with_cls_twice_mlp`). Layers in `once` (float in the file) and a Hadamard-rotated fc2
    (which would rotate the residual row too) take the row once."""

    once = frozenset()

    def _mlp(self, x, training=None):
        if x.shape[1] == 1:  # the last block of a model whose head reads [cls] alone
            return self._cls_mlp(x)
        others = super()._mlp(x[:, 1:], training=training)
        return ops.concatenate([self._cls_mlp(x[:, :1]), others], axis=1)

    def _cls_mlp(self, row):
        return self._twice(self.fc2, self._twice(self.fc1, row))

    def _twice(self, dense, row):
        if dense.path in self.once or isinstance(dense, rotate.HadamardInputDense):
            return dense(row)
        with keras.name_scope(RESIDUAL_SCOPE):
            both = ops.concatenate([row, dynamic_range_residual(row)], axis=1)
        with without_activation(dense) as activation:
            outputs = dense(both)
        extra = outputs[:, 1:] - dense.bias if dense.bias is not None else outputs[:, 1:]
        return activation(outputs[:, :1] + extra)


def with_cls_twice_mlp(copy, once=()):
    """`copy` (changed in place and returned) with every block a `ClsTwiceMlpBlock` but those
    whose fc1 and fc2 are both in `once`."""
    for block in copy.blocks:
        if {block.fc1.path, block.fc2.path} <= set(once):
            continue
        block.__class__ = ClsTwiceMlpBlock
        block.once = frozenset(once)
    return copy


def dynamic_range_residual(rows):
    """What a dynamic-range FULLY_CONNECTED loses of each of `rows` when it quantises it at run
    time: the row less its int8 image (`dynamic_range.dynamic_int8` to rounding, in fewer ops:
    its integer zero point cancels, and its range holds every value, so nothing clips)."""
    low = ops.minimum(ops.min(rows, -1, keepdims=True), 0.0)
    high = ops.maximum(ops.max(rows, -1, keepdims=True), 0.0)
    steps = 255.0 / (high - low)  # a row of zeros divides by zero; no token is one
    return rows - ops.round(rows * steps) / steps


@contextlib.contextmanager
def without_activation(dense):
    """Inside it, `dense` has no activation (a fused one, fc1's GELU, must follow what is added to
    its product: here the second row's); it yields the activation, which it puts back after."""
    activation, dense.activation = dense.activation, keras.activations.linear
    try:
        yield activation
    finally:
        dense.activation = activation
