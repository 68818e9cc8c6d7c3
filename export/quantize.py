"""Integer TFLite: quantisation recipes applied to the fp32 model, with Google's ai-edge-quantizer.

A recipe is a list of `Rule`s, each naming ops (a regex on the op's output tensor name and a
TFLite op type) and the bits of their activations, or `None` to keep them in float; the last
matching rule wins, and an op no rule matches stays in float. Weights are int8 per channel
everywhere. `benchmarks/int8_sensitivity.py` measures what each op group costs in int8, and the
recipes below follow from its table (`docs/benchmarks/int8.md`).

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
    the quantizer supports) get `activation_bits`-bit activations, or stay in float (`None`)."""

    pattern: str
    op: str
    activation_bits: int | None


# The model's float32 input (pixels) and output (probabilities) stay as they are: the input is
# cast from uint8 in the graph when asked, and the probabilities are dequantised at the end.
FLOAT_IO = (Rule(".*", "INPUT", None), Rule(".*", "OUTPUT", None))

LAYER_NORM_OPS = ("MEAN", "SQUARED_DIFFERENCE", "RSQRT", "MUL", "ADD", "SUB")

# The op groups the sensitivity table measures, by the names keras-vit's layers give their ops.
GROUPS = {
    "patch projection": (Rule(r"/patch_encoder(_\d+)?/", "CONV_2D", 8),),
    "QKV and out projections": (Rule(r"/attention(_\d+)?/", "FULLY_CONNECTED", 8),),
    "MLP projections": (Rule(r"/fc[12](_\d+)?/", "FULLY_CONNECTED", 8),),
    "attention matmuls": (Rule(r"/attention(_\d+)?/", "BATCH_MATMUL", 8),),
    "softmax": (Rule(r"/attention(_\d+)?/", "SOFTMAX", 8),),
    "LayerNorm": tuple(Rule(r"/norm\d?(_\d+)?/", op, 8) for op in LAYER_NORM_OPS),
    "GELU": (Rule(".*", "GELU", 8),),
    "residual adds": (Rule(r"/block_\d+(_\d+)?/add(_\d+)?(;|$)", "ADD", 8),),
    "head": (Rule(r"/head(_\d+)?/", "FULLY_CONNECTED", 8), Rule(r"^StatefulPartitionedCall", "SOFTMAX", 8)),
}


INT8 = (Rule(".*", "*", 8), *FLOAT_IO)
INT16 = (Rule(".*", "*", 16), *FLOAT_IO)


def block_rules(index, bits=8):
    """Every op of transformer block `index`."""
    return (Rule(rf"/block_{index}(_\d+)?/", "*", bits),)


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


# What `keras-vit export --quantize` ships, chosen from the sensitivity table: int8 everywhere
# costs 2.2 points of agreement on the quickstart's model, no op group alone accounts for it,
# and the first block alone costs 4.4; with that block's activations in 16 bits, 99.0%.
RECIPES = {
    "int8": (*INT8, *with_bits(block_rules(0), 16)),
    "int16x8": INT16,
}


def _op_config(activation_bits):
    from ai_edge_quantizer import qtyping

    return qtyping.OpQuantizationConfig(
        activation_tensor_config=qtyping.TensorQuantizationConfig(
            num_bits=activation_bits,
            # int16 kernels take symmetric activations only.
            symmetric=activation_bits == 16,
            granularity=qtyping.QuantGranularity.TENSORWISE,
        ),
        weight_tensor_config=qtyping.TensorQuantizationConfig(
            num_bits=8, symmetric=True, granularity=qtyping.QuantGranularity.CHANNELWISE
        ),
        compute_precision=qtyping.ComputePrecision.INTEGER,
        explicit_dequantize=False,
    )


def _without_power_of_two_scales(float_model):
    """`float_model` with its ADD and SUB ops free to take any int16 scales.

    TFLite's schema defaults `pot_scale_int16` to true, which lets an int16 ADD or SUB take
    power-of-two scales only; the quantizer's calibrated scales are not, and LiteRT refuses such
    a model ("input1_shift <= 0"). The converter's own 16x8 mode clears the flag the same way.
    The flag means nothing to float kernels, so it is cleared before quantising.
    """
    import flatbuffers
    from ai_edge_litert import schema_py_generated as schema

    model = schema.ModelT.InitFromPackedBuf(bytearray(float_model), 0)
    for graph in model.subgraphs:
        for op in graph.operators:
            if isinstance(op.builtinOptions, (schema.AddOptionsT, schema.SubOptionsT)):
                op.builtinOptions.potScaleInt16 = False
    builder = flatbuffers.Builder(len(float_model) + 1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def _quantizer(float_model, rules):
    from ai_edge_quantizer import quantizer

    q = quantizer.Quantizer(bytearray(_without_power_of_two_scales(float_model)))
    for rule in rules:
        if rule.activation_bits is None:
            q.update_quantization_recipe(
                regex=rule.pattern, operation_name=rule.op, algorithm_key="no_quantize"
            )
        else:
            q.update_quantization_recipe(
                regex=rule.pattern, operation_name=rule.op, op_config=_op_config(rule.activation_bits)
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
            _without_power_of_two_scales(float_model), qsv_update_func=qsv_utils.min_max_update
        )
        calibration.calibrate({"serving_default": samples}, manager)
    return calibration.get_model_qsvs()


def _as_input(image, dtype):
    if np.dtype(dtype) == np.uint8:
        return np.clip(np.round(image), 0, 255).astype(np.uint8)[None]
    return np.asarray(image, np.float32)[None]


def quantize(float_model, rules, ranges):
    """The flatbuffer of `float_model` quantised by `rules`, with the `ranges` from `calibrate`."""
    with _quantizer_quiet():
        result = _quantizer(float_model, rules).quantize(
            ranges, enable_progress_bar=False, enable_progress_report=False
        )
    return bytes(result.quantized_model)


def _ops(flatbuffer):
    """`(op type, op, graph)` for each op of the main graph, in order (flatbuffer readers)."""
    from ai_edge_litert import schema_py_generated as schema

    names = {value: key for key, value in vars(schema.BuiltinOperator).items() if not key.startswith("_")}
    model = schema.Model.GetRootAs(flatbuffer, 0)
    graph = model.Subgraphs(0)
    for i in range(graph.OperatorsLength()):
        op = graph.Operators(i)
        code = model.OperatorCodes(op.OpcodeIndex())
        yield names.get(max(code.BuiltinCode(), code.DeprecatedBuiltinCode()), "CUSTOM"), op, graph


def _outputs(op, graph):
    return [graph.Tensors(op.Outputs(j)) for j in range(op.OutputsLength())]


def float_ops(flatbuffer):
    """The ops that compute in float: every op but QUANTIZE/DEQUANTIZE with a float32 output."""
    from ai_edge_litert import schema_py_generated as schema

    return [
        name
        for name, op, graph in _ops(flatbuffer)
        if name not in ("QUANTIZE", "DEQUANTIZE")
        and any(t.Type() == schema.TensorType.FLOAT32 for t in _outputs(op, graph))
    ]


def output_step(flatbuffer):
    """The step the probabilities come in: the quantisation scale of the output, or of the
    tensor its final DEQUANTIZE reads; 0 for float probabilities."""
    from ai_edge_litert import schema_py_generated as schema

    graph = schema.Model.GetRootAs(flatbuffer, 0).Subgraphs(0)
    output = graph.Outputs(0)
    for name, op, _ in _ops(flatbuffer):
        if name == "DEQUANTIZE" and op.Outputs(0) == output:
            output = op.Inputs(0)
    quantization = graph.Tensors(output).Quantization()
    return float(quantization.Scale(0)) if quantization is not None and quantization.ScaleLength() else 0.0


def matching_ops(flatbuffer, rules):
    """How many ops of `flatbuffer` the quantising `rules` select (none: a renamed layer)."""
    quantising = [rule for rule in rules if rule.activation_bits]
    return sum(
        any(
            rule.op in ("*", name) and re.search(rule.pattern, graph.Tensors(op.Outputs(0)).Name().decode())
            for rule in quantising
        )
        for name, op, graph in _ops(flatbuffer)
    )


def integer_negations(flatbuffer):
    """`flatbuffer` with each float NEG between a DEQUANTIZE and a QUANTIZE made one int8 MUL by -1.

    TFLite has no int8 NEG kernel, so its integer-only conversion leaves LayerNorm's negated mean
    in float behind that pair. A MUL by a constant -1 (int8, scale 1) gives the same int8 values
    with integer kernels only; the pair goes with it.
    """
    import flatbuffers
    from ai_edge_litert import schema_py_generated as schema

    ops = schema.BuiltinOperator
    model = schema.ModelT.InitFromPackedBuf(bytearray(flatbuffer), 0)
    graph = model.subgraphs[0]

    def kind(op):
        code = model.operatorCodes[op.opcodeIndex]
        return max(code.builtinCode, code.deprecatedBuiltinCode)

    producer = {t: op for op in graph.operators for t in op.outputs}
    consumers = {}
    for op in graph.operators:
        for t in op.inputs:
            consumers.setdefault(t, []).append(op)

    removed = []
    for index, op in enumerate(graph.operators):
        if kind(op) != ops.NEG:
            continue
        dequantize = producer.get(op.inputs[0])
        after = consumers.get(op.outputs[0], [])
        if (
            dequantize is None
            or kind(dequantize) != ops.DEQUANTIZE
            or len(consumers[op.inputs[0]]) != 1
            or len(after) != 1
            or kind(after[0]) != ops.QUANTIZE
            or graph.tensors[dequantize.inputs[0]].type != schema.TensorType.INT8
            or graph.tensors[after[0].outputs[0]].type != schema.TensorType.INT8
        ):
            continue
        graph.operators[index] = _multiply(
            model, dequantize.inputs[0], _minus_one(model, graph), after[0].outputs[0]
        )
        removed += [id(dequantize), id(after[0])]
    graph.operators = [op for op in graph.operators if id(op) not in removed]
    builder = flatbuffers.Builder(len(flatbuffer) + 1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def _minus_one(model, graph):
    """A new int8 constant tensor holding -1 (scale 1, zero point 0); returns its index."""
    from ai_edge_litert import schema_py_generated as schema

    buffer = schema.BufferT()
    buffer.data = bytearray(np.array([-1], np.int8).tobytes())
    model.buffers.append(buffer)
    tensor = schema.TensorT()
    tensor.shape, tensor.type, tensor.buffer = [1], schema.TensorType.INT8, len(model.buffers) - 1
    tensor.name = f"minus_one_{len(graph.tensors)}"
    tensor.quantization = schema.QuantizationParametersT()
    tensor.quantization.scale, tensor.quantization.zeroPoint = [1.0], [0]
    graph.tensors.append(tensor)
    return len(graph.tensors) - 1


def _multiply(model, left, right, output):
    """A MUL op `output = left * right` (adding MUL to the model's op codes when missing)."""
    from ai_edge_litert import schema_py_generated as schema

    codes = [max(c.builtinCode, c.deprecatedBuiltinCode) for c in model.operatorCodes]
    if schema.BuiltinOperator.MUL not in codes:
        code = schema.OperatorCodeT()
        code.builtinCode = code.deprecatedBuiltinCode = schema.BuiltinOperator.MUL
        code.version = 2  # int8 kernels
        model.operatorCodes.append(code)
        codes.append(schema.BuiltinOperator.MUL)
    op = schema.OperatorT()
    op.opcodeIndex = codes.index(schema.BuiltinOperator.MUL)
    op.inputs, op.outputs = [left, right], [output]
    op.builtinOptionsType = schema.BuiltinOptions.MulOptions
    op.builtinOptions = schema.MulOptionsT()
    return op
