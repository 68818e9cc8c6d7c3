"""TFLite for phones and boards: fp32, fp16, dynamic-range int8 and the integer variants.

Every variant has a static batch of 1 (XNNPACK keeps a static graph whole and
LiteRT.js needs it) and takes RGB pixels in [0, 255]: float32, or uint8 for the
integer variants when asked. All return float32 probabilities but `int8_strict`,
which is integer from end to end (uint8 in, uint8 probabilities out). Only builtin
ops are allowed: a Flex or custom op fails the export, naming the op.
"""

import contextlib
import dataclasses
import functools
import logging
import tempfile

import keras
import numpy as np
import tensorflow as tf

from keras_vit import framework_logs
from keras_vit.data import pipeline
from keras_vit.export import quantize, rotate, rotated_int8, tflite_graph
from keras_vit.model import registry
from keras_vit.storage.export_folder import INTEGER_VARIANTS, TFLITE_VARIANTS

logger = logging.getLogger(__name__)

VARIANTS = TFLITE_VARIANTS


class UnsupportedOpError(ValueError):
    """The converted model needs an op outside TFLite's builtins (a Flex or custom op)."""


# Training images the integer variants are calibrated on, by default.
CALIBRATION_IMAGES = 200
# Of those, the ones the strict variant's per-head int8 keys and values are ranged on.
HEAD_CALIBRATION_IMAGES = 100


def _converter(classifier, folder, outputs=None, input_dtype="float32"):
    """A converter from a batch-1 SavedModel (Keras 3 models cannot go through from_keras_model).

    `outputs` maps images to a dict of output tensors; probabilities alone by default.
    `input_dtype="uint8"` takes pixels as bytes and casts them to float32 in the graph.
    """
    height, width = classifier.image_size
    spec = tf.TensorSpec([1, height, width, classifier.channels], input_dtype, name="images")
    archive = keras.export.ExportArchive()  # untracked, as export/serving.py's: no lookup tables
    outputs = outputs or (
        lambda images: {"probabilities": classifier.probabilities(keras.ops.cast(images, "float32"))}
    )
    archive.add_endpoint("serving_default", outputs, [spec])
    archive.write_out(folder, verbose=False)
    return tf.lite.TFLiteConverter.from_saved_model(folder)


def convert_with_attention(classifier):
    """An fp32 model with two outputs: `probabilities` and `attention`, the attention-rollout
    map `(1, rows, cols)` from the [cls] token (the family's `attention_rollout`), for apps that show
    where the model looked. The plain exports are unchanged.
    """
    rollout = registry.family_of(classifier.model).attention_rollout(classifier.model)
    with tempfile.TemporaryDirectory(prefix="keras-vit-tflite-") as folder:
        converter = _converter(classifier, folder, outputs=rollout)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
        converter.allow_custom_ops = False
        try:
            flatbuffer = converter.convert()
        except Exception as error:  # the converter raises its own ConverterError
            raise UnsupportedOpError(
                f"The attention TFLite conversion failed: {_first_lines(str(error))}"
            ) from None
    check_builtin_ops(flatbuffer)
    return flatbuffer


class Calibration:
    """What the integer variants are quantised from: the fp32 model with the integer variants'
    input type (`int8_input`), and each tensor's range over the representative images.
    Calibrated once for every recipe (`export.quantize`)."""

    def __init__(self, classifier, representative_images, int8_input="uint8"):
        if representative_images is None or len(representative_images) == 0:
            raise ValueError("Integer TFLite variants need representative images from the training data.")
        self.classifier = classifier
        self.representative_images = representative_images
        self.int8_input = int8_input

    @functools.cached_property
    def float_model(self):
        """The fp32 model with the integer variants' input; converted only for a recipe that
        quantises this model (the ViT's `int8` quantises a rewritten copy: `_with_rotated_inputs`)."""
        return convert(self.classifier, "fp32", input_dtype=self.int8_input)

    @functools.cached_property
    def ranges(self):
        """Each tensor's range over the representative images; measured (the float model run on
        every image, each tensor kept: the export's slowest step) only for a recipe with static
        activations."""
        return quantize.calibrate(self.float_model, self.representative_images, self.int8_input)


def convert(classifier, variant, calibration=None, input_dtype="float32"):
    """Converts to one TFLite variant and returns the flatbuffer's bytes.

    Args:
        classifier: an `export.classifier.Classifier`.
        variant: one of `VARIANTS`.
        calibration: a `Calibration`, for the integer variants (`INTEGER_VARIANTS`).
        input_dtype: the float variants' input, `"float32"` or `"uint8"` (cast in the graph).

    Raises:
        UnsupportedOpError: the graph needs a Flex or custom op.
        ValueError: an unknown variant, or an integer one without a calibration.
    """
    if variant not in VARIANTS:
        raise ValueError(f"Unknown TFLite variant {variant!r}; choose from {', '.join(VARIANTS)}.")
    if variant in INTEGER_VARIANTS and calibration is None:
        raise ValueError(f"The {variant} TFLite variant needs a Calibration from the training images.")
    if variant == "dynamic":  # no calibration: activations are quantised at run time
        rewritten = _with_rotated_inputs(classifier, variant)
        float_model = _convert_from_saved_model(rewritten, "fp32", None, input_dtype)
        flatbuffer = quantize.quantize(float_model, _recipe(classifier, variant), None)
    elif (rewritten := _rewritten(classifier, variant, calibration)) is not None:
        float_model = convert(rewritten.classifier, "fp32", input_dtype=calibration.int8_input)
        flatbuffer = quantize.quantize(float_model, rewritten.rules, None)
    elif variant in quantize.RECIPE_VARIANTS:
        rules = _recipe(classifier, variant)
        rewritten = _with_rotated_inputs(classifier, variant)
        if rewritten is classifier:
            ranges = calibration.ranges if quantize.needs_ranges(rules) else None
            float_model = calibration.float_model
        else:  # the rewritten copy's own float model, and its own ranges where the rules need them
            float_model = convert(rewritten, "fp32", input_dtype=calibration.int8_input)
            ranges = None
            if quantize.needs_ranges(rules):
                images = calibration.representative_images
                ranges = quantize.calibrate(float_model, images, calibration.int8_input)
        flatbuffer = quantize.quantize(float_model, rules, ranges)
    else:
        flatbuffer = _convert_from_saved_model(classifier, variant, calibration, input_dtype)
    check_builtin_ops(flatbuffer)
    return flatbuffer


@dataclasses.dataclass(frozen=True)
class _Rewritten:
    classifier: object
    rules: tuple


# The rewrites a family may declare for a variant (`Family.quantization_rewrites`): a function of
# the model and the calibration images that returns a copy with the rules that quantise it
# (`rotated_int8.Int8Model`), or raises `rotate.UnsupportedModelError` for a model it does not cover.
REWRITES = {"rotated stream": rotated_int8.int8_model}


def _rewritten(classifier, variant, calibration):
    """`classifier` rewritten for `variant` by its family's declared rewrite, with its rules; None
    where the family declares none or the model is one the rewrite does not cover (the family's
    rules then quantise it as it is, `_recipe`)."""
    family = registry.family_of(classifier.model, default=None)
    rewrite = family.quantization_rewrites.get(variant) if family is not None else None
    if rewrite is None:
        return None
    try:
        made = REWRITES[rewrite](classifier.model, calibration.representative_images)
    except rotate.UnsupportedModelError as reason:
        logger.info("%s: %s The family's rules quantise the model as it is.", variant, reason)
        return None
    return _Rewritten(dataclasses.replace(classifier, model=made.model), made.rules())


def _recipe(classifier, variant):
    rules = quantize.recipes(registry.family_of(classifier.model, default=None))[variant]
    if _rotated_layers(classifier, variant):
        # Later rules win: the rotated layers' own products dynamic-range int8 as they are, their
        # rotations in float.
        fully_connected = "FULLY_CONNECTED"
        rules += (
            quantize.Rule(f"/{rotate.ROTATED_INPUT_SCOPE}/", fully_connected, quantize.DYNAMIC),
            quantize.Rule(f"/{rotate.HADAMARD_SCOPE}/", fully_connected, None),
        )
    return rules


def _rotated_layers(classifier, variant):
    """The Dense layers whose input the family rotates in the graph for `variant` (none: `()`)."""
    family = registry.family_of(classifier.model, default=None)
    return family.quantization_rotated_inputs.get(variant, ()) if family is not None else ()


def _with_rotated_inputs(classifier, variant):
    """`classifier` with the layers its family declares for `variant` taking their input rotated
    (`rotate.with_rotated_inputs`, on a copy), or `classifier` itself."""
    layers = _rotated_layers(classifier, variant)
    if not layers:
        return classifier
    return dataclasses.replace(classifier, model=rotate.with_rotated_inputs(classifier.model, layers))


def _convert_from_saved_model(classifier, variant, calibration, input_dtype):
    """fp32 and fp16 by the TFLite converter; and the strict variant, its full-integer 16x8 mode
    (int8 weights, int16 activations, no op in float) on the model traced with
    `integer_graph`, then given uint8 pixel bytes in and uint8 probabilities out
    (`tflite_graph.integer_io`), with LayerNorm's means and attention's matmuls per head as
    FULLY_CONNECTED ops (`tflite_graph.means_as_fully_connected`, `per_head_matmuls`)."""
    strict = variant == "int8_strict"
    with tempfile.TemporaryDirectory(prefix="keras-vit-tflite-") as folder:
        gelu_ranges = (
            gelu_input_ranges(classifier.model, calibration.representative_images) if strict else None
        )
        with integer_graph(gelu_ranges) if strict else contextlib.nullcontext():
            converter = _converter(classifier, folder, input_dtype="float32" if strict else input_dtype)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
        converter.allow_custom_ops = False
        if variant == "fp16":
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
            converter.target_spec.supported_types = [tf.float16]
        elif strict:
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
            converter.representative_dataset = lambda: (
                [image[None].astype(np.float32)] for image in calibration.representative_images
            )
            # int16 activations everywhere: per-tensor int8 ones cannot hold a real ViT's residual
            # stream (docs/benchmarks/int8.md: 0% agreement on timm's ViT-Ti, 97% in 16 bits).
            converter.target_spec.supported_ops = [
                tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8
            ]
            # int32 biases let LiteRT run the 16x8 FULLY_CONNECTED ops through its optimised
            # (ruy) kernel; with the default int64 ones it takes the reference loop, 3x slower.
            converter._experimental_full_integer_quantization_bias_type = tf.int32
        try:
            with framework_logs.native_lines_muted():  # the calibrator prints "fully_quantize: 0, ..."
                flatbuffer = converter.convert()
        except Exception as error:  # the converter raises its own ConverterError
            message = str(error)
            if "Flex" in message or "custom op" in message or "not supported" in message:
                raise UnsupportedOpError(
                    f"The {variant} TFLite conversion needs ops outside TFLite's builtins: "
                    f"{_first_lines(message)}"
                ) from None
            raise
    if strict:
        flatbuffer = tflite_graph.means_as_fully_connected(tflite_graph.integer_io(flatbuffer))
        # Attention per head in optimised 16x8 FULLY_CONNECTED kernels, each head's keys and
        # values in int8 over their own calibrated range (docs/benchmarks/int8.md, fourth pass).
        images = calibration.representative_images[:HEAD_CALIBRATION_IMAGES]
        ranges = tflite_graph.head_ranges(tflite_graph.per_head_matmuls(flatbuffer), images)
        flatbuffer = tflite_graph.per_head_matmuls(flatbuffer, ranges)
    return flatbuffer


# GELU(x) is x to float32 precision above this and 0 below minus this (x * Phi(x); Phi(8) = 1 - 6e-16).
GELU_SATURATION = 8.0
# GELU inputs within this range keep Keras' plain GELU in the strict variant (one int16 table over
# it); wider ones are clipped to +-GELU_SATURATION first (`integer_graph`). On timm's ViT-Ti, fc1's
# inputs reach 8 to 19 in every block but block 7, where they reach 217.
GELU_TABLE_RANGE = 32.0
# Calibration images the GELU input ranges are measured on (in Keras, in batches of 16).
GELU_RANGE_IMAGES = 64


def gelu_input_ranges(model, images):
    """`{layer path: max |input|}` of each Dense layer's GELU in `model` (its pre-activation) over
    the first `GELU_RANGE_IMAGES` of `images`."""
    from keras import ops

    dense = keras.layers.Dense
    dense_call, ranges = dense.call, {}

    def record(self, inputs, training=None):
        if not _has_gelu(self):
            return dense_call(self, inputs, training=training)
        x = _before_activation(self, dense_call, inputs, training)
        value = float(ops.convert_to_numpy(ops.max(ops.abs(x))))
        ranges[self.path] = max(ranges.get(self.path, 0.0), value)
        return self.activation(x)

    dense.call = record
    try:
        for start in range(0, min(len(images), GELU_RANGE_IMAGES), 16):
            model(images[start : min(start + 16, GELU_RANGE_IMAGES)], training=False)
    finally:
        dense.call = dense_call
    return ranges


def _has_gelu(dense):
    return dense.activation in (keras.activations.gelu, keras.activations.get("gelu"))


def _before_activation(dense, dense_call, inputs, training):
    """What the Dense layer `dense` computes before its activation (`dense_call`: Keras' own)."""
    with rotated_int8.without_activation(dense):
        return dense_call(dense, inputs, training=training)


@contextlib.contextmanager
def integer_graph(gelu_ranges=None):
    """Keras' LayerNormalization and GELU, traced (while this lasts) in forms that 16-bit integer
    kernels compute well: the same functions, in float to within float32 rounding (the model
    itself is not changed). Measured on timm's ViT-Ti (docs/benchmarks/int8.md), where from block 7
    one channel of the residual stream reaches -508 in some tokens:

    - LayerNorm. Keras computes `x * inv + (beta - mean * inv)`, `inv = gamma * rsqrt(variance +
      epsilon)`: the converter's 16x8 mode has no kernel for its NEG, and the variance does not fit
      16 bits. One tensor holds variances from 0.8 to 1400, and the squares they average reach
      258,000 where other tokens' are below 1, which one int16 scale rounds to 0 (agreement with
      fp32: 60%). Here each token is centred (SUB), scaled by a first, coarse 1 / sqrt(variance + 1)
      (any positive per-token scale cancels out; this one brings every token near unit variance,
      epsilon scaled along), and normalised by the root mean square of that (97.0%).
    - GELU. An int16 GELU is a 513-entry table over the input's calibrated range: from block 7, fc1
      reaches 187, and steps of 0.4 blur GELU's bend near 0. `GELU(clip(x, -8, 8)) + relu(x - 8)`
      keeps the table on [-8, 8] (97.9%). Its extra int16 ops (MINIMUM, MAXIMUM, two
      requantisations, SUB, ADD) cost about 1.6 ms a block, so with `gelu_ranges`
      (`gelu_input_ranges`) only the layers whose inputs reach beyond `GELU_TABLE_RANGE` take it.
    """
    from keras import ops

    layer_norm, dense = keras.layers.LayerNormalization, keras.layers.Dense
    layer_norm_call, dense_call = layer_norm.call, dense.call

    def normalise(self, inputs):
        axis = self.axis if isinstance(self.axis, int) else (self.axis[0] if len(self.axis) == 1 else None)
        if self.rms_scaling or axis not in (-1, len(inputs.shape) - 1):
            return layer_norm_call(self, inputs)
        x = ops.cast(inputs, "float32")
        centred = x - ops.mean(x, axis=-1, keepdims=True)
        coarse = ops.rsqrt(ops.mean(centred * centred, axis=-1, keepdims=True) + 1.0)
        scaled = centred * coarse
        variance = ops.mean(scaled * scaled, axis=-1, keepdims=True)
        outputs = scaled * ops.rsqrt(variance + self.epsilon * (coarse * coarse))
        if self.scale:
            outputs = outputs * ops.cast(self.gamma, outputs.dtype)
        if self.center:
            outputs = outputs + ops.cast(self.beta, outputs.dtype)
        return ops.cast(outputs, self.compute_dtype)

    def project(self, inputs, training=None):
        if not _has_gelu(self):
            return dense_call(self, inputs, training=training)
        if gelu_ranges is not None and gelu_ranges.get(self.path, np.inf) <= GELU_TABLE_RANGE:
            return dense_call(self, inputs, training=training)
        x = _before_activation(self, dense_call, inputs, training)
        bound = GELU_SATURATION
        return self.activation(ops.clip(x, -bound, bound)) + ops.relu(x - bound)

    layer_norm.call, dense.call = normalise, project
    try:
        yield
    finally:
        layer_norm.call, dense.call = layer_norm_call, dense_call


def _first_lines(message, count=6):
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return " ".join(lines[:count])


def check_builtin_ops(flatbuffer):
    """Raises `UnsupportedOpError` naming any Flex or custom op in the flatbuffer."""
    from ai_edge_litert import schema_py_generated as schema

    model = schema.Model.GetRootAs(flatbuffer, 0)
    codes = [model.OperatorCodes(i) for i in range(model.OperatorCodesLength())]
    # A builtin's code may carry a name too (ai-edge-quantizer names the ops it adds): custom
    # is the CUSTOM code, whatever the name.
    custom = sorted(
        {
            (code.CustomCode() or b"?").decode()
            for code in codes
            if max(code.BuiltinCode(), code.DeprecatedBuiltinCode()) == schema.BuiltinOperator.CUSTOM
        }
    )
    if custom:
        raise UnsupportedOpError(
            f"The TFLite model uses ops outside the builtins: {', '.join(custom)}. "
            f"keras-vit ships builtins only (Flex ops need the TensorFlow runtime on the device)."
        )


def representative_images(spec, contract, count=CALIBRATION_IMAGES):
    """`count` training images (all of them, when there are fewer), a seeded sample read as the
    model's input `contract` reads them (an `InputContract`: what the exported model is fed, a
    pretrained model's centre crop included), for int8 calibration. `spec`: the run's
    `DatasetSpec`, whose validation split and seed leave out the images its verification holds out."""
    dataset, seed = spec.name, spec.seed
    split = spec.load()["train"]
    if not len(split):
        raise ValueError(
            f"{dataset} has no training images to calibrate the integer variants on (its held-out "
            f"ones verify them): give a --dataset with a train/ split, or export float variants only."
        )
    if len(split) < count:
        logger.info(
            "Calibrating the integer variants on the %d training images of %s (%d asked): their ranges come "
            "from fewer images.", len(split), dataset, count,
        )  # fmt: skip
        count = len(split)

    def read(image, label):
        if image.dtype == tf.string:  # encoded (folders, zips); tfds gives uint8 arrays
            return contract.decode_and_resize(image)
        return pipeline.resize(image, contract.image_size, contract.transform)

    # shuffled, so every class is represented
    sample = split.to_dataset().shuffle(min(len(split), 10_000), seed=seed).take(count).map(read)
    return np.stack(list(sample.as_numpy_iterator())).astype("float32")
