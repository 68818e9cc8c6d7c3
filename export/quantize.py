"""Integer TFLite: quantisation recipes applied to the fp32 model, with Google's ai-edge-quantizer.

A recipe is a list of `Rule`s, each naming ops (a regex on the op's output tensor name and a
TFLite op type) and the bits of their activations, or `None` to keep them in float; the last
matching rule wins, and an op no rule matches stays in float. Weights are int8 per channel
everywhere. `benchmarks/int8_sensitivity.py` measures what each op group of a model's family
costs in int8, and each family declares the recipes that follow from its table
(`Family.quantization_recipes`, `docs/benchmarks/int8.md`); `recipes` turns them into rules.

Calibration takes each tensor's minimum and maximum over all the calibration images. The
quantizer's own `calibrate()` keeps a moving average of every image's min and max instead, which
on a ViT lands well inside the real range: on the quickstart's model it clipped the logits at
1.8 where they reach 3.2, and that alone cost 13 points of top-1 agreement.
"""

import contextlib
import dataclasses
import io
import logging
import re
import warnings

import numpy as np

from keras_vit import framework_logs
from keras_vit.export import tflite_graph
from keras_vit.model.family import Family


@contextlib.contextmanager
def _quantizer_quiet():
    """The quantizer logs its every step through the root logger at INFO, draws progress bars on
    stderr, and its calibrator warns that it keeps all tensors (which calibration needs) while
    LiteRT announces its delegate: none of it is the user's business."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.WARNING))
    try:
        with framework_logs.native_lines_muted(), contextlib.redirect_stderr(io.StringIO()):
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*experimental_preserve_all_tensors.*")
                yield
    finally:
        root.setLevel(level)


@dataclasses.dataclass(frozen=True)
class Rule:
    """Ops whose output tensor name matches `pattern` and whose type is `op` (`"*"`: any type
    the quantizer supports) get `activation_bits`-bit activations, or stay in float (`None`).
    `DYNAMIC` (0): int8 weights, and activations quantised to int8 at run time, token by token,
    with float in and out (dynamic-range quantisation: XNNPACK's int8 kernels on CPUs).
    `algorithm`: how the weights are quantised (an ai-edge-quantizer algorithm key): min/max per
    channel, or `ROTATED`."""

    pattern: str
    op: str
    activation_bits: int | None
    algorithm: str = "min_max_uniform_quantize"


# The model's float32 input (pixels) and output (probabilities) stay as they are: the input is
# cast from uint8 in the graph when asked, and the probabilities are dequantised at the end.
FLOAT_IO = (Rule(".*", "INPUT", None), Rule(".*", "OUTPUT", None))

DYNAMIC = 0

# ai-edge-quantizer's Hadamard rotation in builtin ops: the layer's input is multiplied by a
# block-diagonal orthonormal Hadamard matrix (a float FULLY_CONNECTED, blocks of up to 256
# channels) and its kernel by the same matrix offline, which leaves the product unchanged but
# spreads an outlier channel over every channel of its block before the int8 rounding of the
# weights and of each token's activations.
ROTATED = "DECOMPOSED_HADAMARD_ROTATION"


def groups(family):
    """The op groups the sensitivity table measures, as int8 rules: the family's own groups
    (`Family.quantization_groups`), by the names its layers give their ops; none for a model
    keras-vit did not build (`family` None)."""
    return {
        group: tuple(Rule(pattern, op, 8) for pattern, op in patterns)
        for group, patterns in (family.quantization_groups if family else {}).items()
    }


INT8 = (Rule(".*", "*", 8), *FLOAT_IO)
INT16 = (Rule(".*", "*", 16), *FLOAT_IO)


def layer_rules(layer):
    """Every op of the layer named `layer` (a block, `block_3` or `stage_1_block_0`), in int8."""
    return (Rule(rf"/{layer}(_\d+)?/", "*", 8),)


# Ops the quantizer has no int16 kernel for: they stay in float in a 16-bit recipe.
NO_INT16 = ("SQUARED_DIFFERENCE",)


def with_bits(rules, bits):
    """`rules` with `bits`-bit activations (`None`: float). In 16 bits, the ops with no int16
    kernel stay in float (the quantizer would otherwise give them an earlier rule's int8)."""
    changed = []
    for rule in rules:
        keep_float = bits == 16 and rule.op in NO_INT16
        changed.append(dataclasses.replace(rule, activation_bits=None if keep_float else bits))
        if bits == 16 and rule.op == "*":
            changed.extend(Rule(rule.pattern, op, None) for op in NO_INT16)
    return tuple(changed)


def base_16(family):
    """16-bit activations everywhere but LayerNorm's statistics, which stay in float: with them
    in 16 bits too, the 224-px ViT agrees with fp32 on 86.0% of its images; in float, on 99.5%."""
    return (*INT16, *with_bits(groups(family).get("LayerNorm statistics", ()), None))


# What `keras-vit export --quantize` ships is the model family's (`Family.quantization_recipes`,
# each read from the family's sensitivity table in docs/benchmarks/int8.md); a model keras-vit
# did not build gets the base `Family`'s. The ViT's, chosen on a real checkpoint (timm's ViT-Ti/16,
# augreg in21k -> in1k, 394 ImageNet photos): from its block 7 on, one channel of the residual
# stream reaches -585 where the others stay within +-40, and LayerNorm passes it on to the
# projections' inputs. Static int8 activations cost a point of agreement or more wherever they go
# (added to the recipe below, in the head alone: 98.5%; in blocks 0-6's QKV and output
# projections: 95.7%), and dynamic-range int8 with min/max weights agrees on 98.0%. Rotating each
# projection's input and kernel first (`ROTATED`) gives 99.5%, with the patch projection in float
# (rotated projections and a dynamic-range patch projection: 98.5%; on all 3,825 held-out photos
# 98.4%, and 98.8% with fc2's input rotated in the graph instead, the family's
# `quantization_rotated_inputs`: export/tflite.py applies it). `dynamic` takes float32
# pixels, `int8` the integer variants' input (uint8 pixels by default); both compute every
# FULLY_CONNECTED projection int8 by int8 (XNNPACK's dynamic-range kernels). `int16x8` is the
# 16-bit base.
ROTATED_DYNAMIC = (Rule(".*", "FULLY_CONNECTED", DYNAMIC, ROTATED), *FLOAT_IO)
# The variants made by this module's recipes (the others by the TFLite converter).
RECIPE_VARIANTS = ("dynamic", "int8", "int16x8")
# A family recipe step's activations: (bits, weight algorithm).
ACTIVATIONS = {
    "int8": (8, "min_max_uniform_quantize"),
    "int16": (16, "min_max_uniform_quantize"),
    "float": (None, "min_max_uniform_quantize"),
    "dynamic": (DYNAMIC, "min_max_uniform_quantize"),
    "rotated dynamic": (DYNAMIC, ROTATED),
}


def family_rules(family, steps):
    """The rules of a family's recipe, `((ops, activations), ...)` as `Family.quantization_recipes`
    declares it: each step's ops (a group of `family`, or one `(pattern, op)` pair) with those
    activations, in order, then the float input and output. A group the family does not have
    (`family` None) adds nothing.

    Raises:
        ValueError: unknown activations.
    """
    named = groups(family)
    rules = []
    for ops, activations in steps:
        if activations not in ACTIVATIONS:
            raise ValueError(f"Unknown activations {activations!r}; choose from {', '.join(ACTIVATIONS)}.")
        bits, algorithm = ACTIVATIONS[activations]
        selected = named.get(ops, ()) if isinstance(ops, str) else (Rule(*ops, 8),)
        rules.extend(dataclasses.replace(rule, algorithm=algorithm) for rule in with_bits(selected, bits))
    return (*rules, *FLOAT_IO)


def recipes(family):
    """`{variant: rules}` for a model of `family` (None: a model keras-vit did not build)."""
    declared = family.quantization_recipes if family else Family.quantization_recipes
    return {variant: family_rules(family, declared[variant]) for variant in RECIPE_VARIANTS}


def _op_config(activation_bits):
    from ai_edge_quantizer import qtyping

    weights = qtyping.TensorQuantizationConfig(
        num_bits=8, symmetric=True, granularity=qtyping.QuantGranularity.CHANNELWISE
    )
    if activation_bits == DYNAMIC:
        return qtyping.OpQuantizationConfig(
            weight_tensor_config=weights,
            compute_precision=qtyping.ComputePrecision.INTEGER,
            explicit_dequantize=False,
        )
    return qtyping.OpQuantizationConfig(
        activation_tensor_config=qtyping.TensorQuantizationConfig(
            num_bits=activation_bits,
            # int16 kernels take symmetric activations only.
            symmetric=activation_bits == 16,
            granularity=qtyping.QuantGranularity.TENSORWISE,
        ),
        weight_tensor_config=weights,
        compute_precision=qtyping.ComputePrecision.INTEGER,
        explicit_dequantize=False,
    )


def _quantizer(float_model, rules):
    from ai_edge_quantizer import quantizer

    q = quantizer.Quantizer(bytearray(tflite_graph.without_power_of_two_scales(float_model)))
    for rule in rules:
        if rule.activation_bits is None:
            q.update_quantization_recipe(
                regex=rule.pattern, operation_name=rule.op, algorithm_key="no_quantize"
            )
        else:
            q.update_quantization_recipe(
                regex=rule.pattern,
                operation_name=rule.op,
                op_config=_op_config(rule.activation_bits),
                algorithm_key=rule.algorithm,
            )
    return q


def calibrate(float_model, images, input_dtype):
    """Each tensor's min and max over `images` (float `(n, h, w, c)` pixels in [0, 255]), for
    every op any recipe may quantise. Pass the result to `quantize` for any number of recipes."""
    from ai_edge_quantizer import calibrator, recipe_manager
    from ai_edge_quantizer.utils import qsv_utils

    manager = recipe_manager.RecipeManager()
    manager.load_quantization_recipe(
        _quantizer(float_model, (Rule(".*", "*", 16),)).get_quantization_recipe()
    )
    samples = [{"images": _as_input(image, input_dtype)} for image in images]
    with _quantizer_quiet():
        calibration = calibrator.Calibrator(
            tflite_graph.without_power_of_two_scales(float_model), qsv_update_func=qsv_utils.min_max_update
        )
        calibration.calibrate({"serving_default": samples}, manager)
    return calibration.get_model_qsvs()


def _as_input(image, dtype):
    if np.dtype(dtype) == np.uint8:
        return np.clip(np.round(image), 0, 255).astype(np.uint8)[None]
    return np.asarray(image, np.float32)[None]


def needs_ranges(rules):
    """Whether `rules` quantise any activation statically, from calibrated ranges (a recipe of
    dynamic-range and float ops needs none)."""
    return any(rule.activation_bits not in (None, DYNAMIC) for rule in rules)


def quantize(float_model, rules, ranges):
    """The flatbuffer of `float_model` quantised by `rules`, with the `ranges` from `calibrate`
    (`None` when every quantising rule is `DYNAMIC`)."""
    with _quantizer_quiet():
        result = _quantizer(float_model, rules).quantize(
            ranges, enable_progress_bar=False, enable_progress_report=False
        )
    return bytes(result.quantized_model)


def matching_ops(flatbuffer, rules):
    """How many ops of `flatbuffer` the quantising `rules` select (none: a renamed layer)."""
    quantising = [rule for rule in rules if rule.activation_bits is not None]
    return sum(
        any(
            rule.op in ("*", name) and re.search(rule.pattern, graph.Tensors(op.Outputs(0)).Name().decode())
            for rule in quantising
        )
        for name, op, graph in tflite_graph.ops(flatbuffer)
    )
