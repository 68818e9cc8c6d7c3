"""Reading and rewriting a `.tflite` graph: which ops it holds, which compute in float, the step
its probabilities come in, and the rewrites the integer variants need. LiteRT's own schema
module reads and writes the flatbuffer. The rewrites repack the converter's own models, whose
weights sit inside the flatbuffer (`metadata.add_metadata` also takes the quantizer's, whose
weights sit past its end).
"""

import warnings

import flatbuffers


def operators(flatbuffer):
    """The op names a `.tflite` flatbuffer uses (custom ops by their custom name)."""
    from ai_edge_litert import schema_py_generated as schema

    names = {value: key for key, value in vars(schema.BuiltinOperator).items() if not key.startswith("_")}
    model = schema.Model.GetRootAs(flatbuffer, 0)
    used = set()
    for i in range(model.OperatorCodesLength()):
        code = model.OperatorCodes(i)
        builtin = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
        if builtin == schema.BuiltinOperator.CUSTOM:
            used.add(code.CustomCode().decode())
        else:
            used.add(names.get(builtin, str(builtin)))
    return sorted(used)


def ops(flatbuffer):
    """`(op type, op, graph)` for each op of the main graph, in order."""
    from ai_edge_litert import schema_py_generated as schema

    names = {value: key for key, value in vars(schema.BuiltinOperator).items() if not key.startswith("_")}
    model = schema.Model.GetRootAs(flatbuffer, 0)
    graph = model.Subgraphs(0)
    for i in range(graph.OperatorsLength()):
        op = graph.Operators(i)
        code = model.OperatorCodes(op.OpcodeIndex())
        yield names.get(max(code.BuiltinCode(), code.DeprecatedBuiltinCode()), "CUSTOM"), op, graph


def transpose_ranks(flatbuffer):
    """The rank of each TRANSPOSE's input: LiteRT's GPU delegate and LiteRT.js take at most 5-D."""
    ranks = []
    for name, op, graph in ops(flatbuffer):
        if name == "TRANSPOSE":
            ranks.append(graph.Tensors(op.Inputs(0)).ShapeLength())
    return ranks


def _outputs(op, graph):
    return [graph.Tensors(op.Outputs(j)) for j in range(op.OutputsLength())]


def float_ops(flatbuffer):
    """The ops that compute in float: every op but QUANTIZE/DEQUANTIZE with a float32 output."""
    from ai_edge_litert import schema_py_generated as schema

    return [
        name
        for name, op, graph in ops(flatbuffer)
        if name not in ("QUANTIZE", "DEQUANTIZE")
        and any(t.Type() == schema.TensorType.FLOAT32 for t in _outputs(op, graph))
    ]


def output_step(flatbuffer):
    """The step the probabilities come in: the quantisation scale of the output, or of the
    tensor its final DEQUANTIZE reads; 0 for float probabilities."""
    from ai_edge_litert import schema_py_generated as schema

    graph = schema.Model.GetRootAs(flatbuffer, 0).Subgraphs(0)
    output = graph.Outputs(0)
    for name, op, _ in ops(flatbuffer):
        if name == "DEQUANTIZE" and op.Outputs(0) == output:
            output = op.Inputs(0)
    quantization = graph.Tensors(output).Quantization()
    return float(quantization.Scale(0)) if quantization is not None and quantization.ScaleLength() else 0.0


def without_power_of_two_scales(float_model):
    """`float_model` with its ADD and SUB ops free to take any int16 scales.

    TFLite's schema defaults `pot_scale_int16` to true, which lets an int16 ADD or SUB take
    power-of-two scales only; the quantizer's calibrated scales are not, and LiteRT refuses such
    a model ("input1_shift <= 0"). The converter's own 16x8 mode clears the flag the same way.
    The flag means nothing to float kernels, so it is cleared before quantising.
    """
    from ai_edge_litert import schema_py_generated as schema

    model = schema.ModelT.InitFromPackedBuf(bytearray(float_model), 0)
    for graph in model.subgraphs:
        for op in graph.operators:
            if isinstance(op.builtinOptions, (schema.AddOptionsT, schema.SubOptionsT)):
                op.builtinOptions.potScaleInt16 = False
    return _packed(model, len(float_model))


def integer_io(flatbuffer):
    """`flatbuffer`, a full-integer model with float32 pixels in and float32 probabilities out (the
    converter's 16x8 integer-only mode), made to take the pixel bytes and return uint8
    probabilities, still with no op in float.

    In: the float32 input and the QUANTIZE that reads it become a uint8 input (scale 1, zero point
    0: MediaPipe and camera pipelines hand a uint8 model the bytes as they are), a CAST to int16
    (an integer copy: pixel 200 stays 200, so the int16 tensor says scale 1 too) and that QUANTIZE,
    now an int16 requantisation. Out: the final DEQUANTIZE becomes two requantisations, int16 to
    int8 to uint8 (step 1/256, as the converter's own uint8 output), since TFLite's QUANTIZE has no
    int16-to-uint8 kernel. The operator codes no op uses any more are dropped.
    """
    from ai_edge_litert import schema_py_generated as schema

    builtin, types = schema.BuiltinOperator, schema.TensorType
    model = schema.ModelT.InitFromPackedBuf(bytearray(flatbuffer), 0)
    graph = model.subgraphs[0]

    def kind(op):
        return _kind(model, op)

    image, output = graph.tensors[graph.inputs[0]], graph.tensors[graph.outputs[0]]
    readers = [op for op in graph.operators if graph.inputs[0] in op.inputs]
    last = next(op for op in graph.operators if graph.outputs[0] in op.outputs)
    if (
        image.type != types.FLOAT32
        or not readers
        or any(kind(op) != builtin.QUANTIZE for op in readers)
        or kind(last) != builtin.DEQUANTIZE
        or graph.tensors[last.inputs[0]].type not in (types.INT16, types.INT8)
    ):
        raise ValueError("integer_io takes a full-integer model with float32 input and output.")

    image.type, image.quantization = types.UINT8, _quantization(1.0, 0)
    pixels = _new_tensor(graph, image.shape, types.INT16, 1.0, 0, "images_int16")
    cast = _new_op(model, builtin.CAST, [graph.inputs[0]], [pixels])
    cast.builtinOptionsType = schema.BuiltinOptions.CastOptions
    cast.builtinOptions = schema.CastOptionsT()
    cast.builtinOptions.inDataType, cast.builtinOptions.outDataType = types.UINT8, types.INT16
    for op in readers:
        op.inputs = [pixels if index == graph.inputs[0] else index for index in op.inputs]

    requantised, source = [], last.inputs[0]
    if graph.tensors[source].type == types.INT16:
        step = _new_tensor(graph, output.shape, types.INT8, 1 / 256, -128, "probabilities_int8")
        requantised.append(_new_op(model, builtin.QUANTIZE, [source], [step]))
        source = step
    output.type, output.quantization = types.UINT8, _quantization(1 / 256, 0)
    requantised.append(_new_op(model, builtin.QUANTIZE, [source], [graph.outputs[0]]))
    at = graph.operators.index(last)
    graph.operators[at : at + 1] = requantised
    graph.operators.insert(0, cast)
    _drop_unused_codes(model)
    return _packed(model, len(flatbuffer))


def per_head_matmuls(flatbuffer, ranges=None):
    """`flatbuffer`, a full-integer 16x8 model, with each int16 BATCH_MATMUL (attention's `q k^T`
    and `p v`, one per head) split into one FULLY_CONNECTED per head: the left operand stays in
    int16, the right one is requantised to int8 and becomes the layer's weights.

    LiteRT has only its reference loop for an int16 BATCH_MATMUL (77 of the 150 ms of the real
    ViT-Ti's 16-bit model, docs/benchmarks/int8.md), while a 16x8 FULLY_CONNECTED goes through its
    optimised kernel, weights computed at run time or not: 3 heads' `p v` take 0.06 ms instead of
    3.1. The int8 right operand is the price: keys and values get steps of their calibrated range
    over 127 instead of 32767 (the left operands, queries and the attention probabilities, keep
    16 bits). A matmul is `[..., M, K] x [..., K, N]`; each of the `P` products of the leading
    dimensions is one FULLY_CONNECTED: `lhs` reshaped to `(P, M, K)` and split, `rhs` transposed to
    `(..., N, K)`, requantised, reshaped to `(P, N, K)` and split, each product `(1, M, N)`, then
    concatenated and reshaped back. Matmuls with adjoint flags or broadcast leading dimensions are
    left as they are.
    """
    import numpy as np
    from ai_edge_litert import schema_py_generated as schema

    builtin, types, options = schema.BuiltinOperator, schema.TensorType, schema.BuiltinOptions
    model = schema.ModelT.InitFromPackedBuf(bytearray(flatbuffer), 0)
    graph = model.subgraphs[0]

    def kind(op):
        return _kind(model, op)

    def constant(values, name):
        buffer = schema.BufferT()
        buffer.data = np.asarray(values, np.int32).view(np.uint8).ravel()
        model.buffers.append(buffer)
        tensor = schema.TensorT()
        tensor.shape, tensor.type, tensor.name = [len(values)], types.INT32, name
        tensor.buffer = len(model.buffers) - 1
        graph.tensors.append(tensor)
        return len(graph.tensors) - 1

    def op(code, inputs, outputs, option_type=None, option_class=None, **values):
        new = _new_op(model, code, inputs, outputs)
        if option_class is not None:
            new.builtinOptionsType, new.builtinOptions = option_type, option_class()
            for key, value in values.items():
                setattr(new.builtinOptions, key, value)
        return new

    def reshape(source, shape, tensor_type, scale, name):
        target = _new_tensor(graph, shape, tensor_type, scale, 0, name)
        return target, op(
            builtin.RESHAPE,
            [source, constant(shape, name + "/shape")],
            [target],
            options.ReshapeOptions,
            schema.ReshapeOptionsT,
            newShape=list(shape),
        )

    def split(source, count, shape, tensor_type, scale, name):
        parts = [_new_tensor(graph, shape, tensor_type, scale, 0, f"{name}/{i}") for i in range(count)]
        axis = constant([0], name + "/axis")
        graph.tensors[axis].shape = []  # SPLIT's axis is a scalar
        split_options = (options.SplitOptions, schema.SplitOptionsT)
        return parts, op(builtin.SPLIT, [axis, source], parts, *split_options, numSplits=count)

    operators = []
    for matmul in graph.operators:
        if kind(matmul) != builtin.BATCH_MATMUL:
            operators.append(matmul)
            continue
        lhs, rhs = (graph.tensors[i] for i in matmul.inputs[:2])
        flags = matmul.builtinOptions
        if (
            lhs.type != types.INT16
            or (flags is not None and (flags.adjX or flags.adjY))
            or list(lhs.shape[:-2]) != list(rhs.shape[:-2])
        ):
            operators.append(matmul)
            continue
        output = graph.tensors[matmul.outputs[0]]
        *leading, rows, depth = (int(d) for d in lhs.shape)
        columns, count, name = int(rhs.shape[-1]), int(np.prod(leading, dtype=np.int64)), output.name.decode()
        lhs_scale, rhs_scale, out_scale = (t.quantization.scale[0] for t in (lhs, rhs, output))
        rank, shape = len(leading) + 2, [int(d) for d in output.shape]
        steps = []
        transposed = _new_tensor(
            graph, [*leading, columns, depth], types.INT16, rhs_scale, 0, f"{name}/rhs_t"
        )
        permutation = [*range(rank - 2), rank - 1, rank - 2]
        steps.append(
            op(
                builtin.TRANSPOSE,
                [matmul.inputs[1], constant(permutation, name + "/perm")],
                [transposed],
                options.TransposeOptions,
                schema.TransposeOptionsT,
            )
        )
        flat_rhs, step = reshape(transposed, [count, columns, depth], types.INT16, rhs_scale, f"{name}/rhs_")
        steps.append(step)
        flat_lhs, step = reshape(
            matmul.inputs[0], [count, rows, depth], types.INT16, lhs_scale, f"{name}/lhs_"
        )
        steps.append(step)
        rights, step = split(flat_rhs, count, [1, columns, depth], types.INT16, rhs_scale, name + "/rhs")
        steps.append(step)
        lefts, step = split(flat_lhs, count, [1, rows, depth], types.INT16, lhs_scale, name + "/lhs")
        steps.append(step)
        # Each head's right operand in int8 over its own range (calibrated), else the int16 one's.
        maxima = (ranges or {}).get(name, [rhs_scale * 32767] * count)
        products = []
        for i in range(count):
            weight_scale = max(float(maxima[i]), rhs_scale) / 127
            narrow = _new_tensor(graph, [1, columns, depth], types.INT8, weight_scale, 0, f"{name}/int8/{i}")
            steps.append(op(builtin.QUANTIZE, [rights[i]], [narrow]))
            kernel, step = reshape(narrow, [columns, depth], types.INT8, weight_scale, f"{name}/kernel/{i}")
            steps.append(step)
            product = _new_tensor(graph, [1, rows, columns], types.INT16, out_scale, 0, f"{name}/head/{i}")
            products.append(product)
            steps.append(
                op(
                    builtin.FULLY_CONNECTED,
                    [lefts[i], kernel, -1],
                    [products[-1]],
                    options.FullyConnectedOptions,
                    schema.FullyConnectedOptionsT,
                    keepNumDims=True,
                )
            )
        joined = _new_tensor(graph, [count, rows, columns], types.INT16, out_scale, 0, name + "/heads")
        steps.append(
            op(
                builtin.CONCATENATION,
                products,
                [joined],
                options.ConcatenationOptions,
                schema.ConcatenationOptionsT,
            )
        )
        steps.append(
            op(
                builtin.RESHAPE,
                [joined, constant(shape, f"{name}/out_shape")],
                [matmul.outputs[0]],
                options.ReshapeOptions,
                schema.ReshapeOptionsT,
                newShape=shape,
            )
        )
        operators.extend(steps)
    graph.operators = operators
    _drop_unused_codes(model)
    return _packed(model, len(flatbuffer))


def means_as_fully_connected(flatbuffer):
    """`flatbuffer`, a full-integer 16x8 model, with each int16 MEAN over the last axis (kept) as a
    FULLY_CONNECTED whose one output has weights 1/n: 127 in int8 at a scale of 1/(127 n), exact.
    LiteRT's int16 MEAN is a reference loop (0.1 ms on ViT-Ti's (197, 192), three in each
    LayerNorm); the 16x8 FULLY_CONNECTED is its optimised kernel."""
    import numpy as np
    from ai_edge_litert import schema_py_generated as schema

    builtin, types = schema.BuiltinOperator, schema.TensorType
    model = schema.ModelT.InitFromPackedBuf(bytearray(flatbuffer), 0)
    graph = model.subgraphs[0]

    def kind(op):
        return _kind(model, op)

    def axes(op):
        data = model.buffers[graph.tensors[op.inputs[1]].buffer].data
        return np.frombuffer(bytes(bytearray(data)), np.int32) if data is not None else None

    operators = []
    for mean in graph.operators:
        source = graph.tensors[mean.inputs[0]] if kind(mean) == builtin.MEAN else None
        rank = len(source.shape) if source is not None else 0
        if (
            source is None
            or source.type != types.INT16
            or axes(mean) is None
            or list(axes(mean) % rank) != [rank - 1]
            or not mean.builtinOptions.keepDims
        ):
            operators.append(mean)
            continue
        channels = int(source.shape[-1])
        buffer = schema.BufferT()
        buffer.data = np.full(channels, 127, np.int8).view(np.uint8)
        model.buffers.append(buffer)
        weights = _new_tensor(graph, [1, channels], types.INT8, 1 / (127 * channels), 0, "mean_weights")
        graph.tensors[weights].buffer = len(model.buffers) - 1
        replaced = _new_op(model, builtin.FULLY_CONNECTED, [mean.inputs[0], weights, -1], mean.outputs)
        replaced.builtinOptionsType = schema.BuiltinOptions.FullyConnectedOptions
        replaced.builtinOptions = schema.FullyConnectedOptionsT()
        replaced.builtinOptions.keepNumDims = True
        operators.append(replaced)
    graph.operators = operators
    _drop_unused_codes(model)
    return _packed(model, len(flatbuffer))


def head_ranges(flatbuffer, images):
    """`{matmul: [max |right operand| per head]}` over `images` (uint8 pixels `(n, h, w, 3)`), from
    a run of `per_head_matmuls(flatbuffer)` that keeps its int16 tensors: each head's keys and
    values have a range of their own, narrower than the tensor of all heads' (which also holds
    the queries, split from the same projection)."""
    import numpy as np
    from ai_edge_litert.interpreter import Interpreter

    with warnings.catch_warnings():  # LiteRT warns that keeping every tensor is for debugging
        warnings.filterwarnings("ignore", message=".*experimental_preserve_all_tensors.*")
        interpreter = Interpreter(model_content=flatbuffer, experimental_preserve_all_tensors=True)
    interpreter.allocate_tensors()
    given = interpreter.get_input_details()[0]
    parts = {}
    for tensor in interpreter.get_tensor_details():
        name, _, head = tensor["name"].rpartition("/rhs/")
        if name and head.isdigit():
            parts[tensor["index"]] = (name, int(head), tensor["quantization"][0])
    ranges = {}
    for image in images:
        interpreter.set_tensor(given["index"], np.clip(np.round(image), 0, 255).astype(np.uint8)[None])
        interpreter.invoke()
        for index, (name, head, scale) in parts.items():
            heads = ranges.setdefault(name, {})
            value = float(np.abs(interpreter.get_tensor(index).astype(np.float32)).max()) * scale
            heads[head] = max(heads.get(head, 0.0), value)
    return {name: [heads[i] for i in range(len(heads))] for name, heads in ranges.items()}


def _quantization(scale, zero_point):
    from ai_edge_litert import schema_py_generated as schema

    quantization = schema.QuantizationParametersT()
    quantization.scale, quantization.zeroPoint = [float(scale)], [int(zero_point)]
    return quantization


def _new_tensor(graph, shape, tensor_type, scale, zero_point, name):
    """A new activation tensor of the main graph; returns its index."""
    from ai_edge_litert import schema_py_generated as schema

    tensor = schema.TensorT()
    tensor.shape, tensor.type, tensor.buffer, tensor.name = list(shape), tensor_type, 0, name
    tensor.quantization = _quantization(scale, zero_point)
    graph.tensors.append(tensor)
    return len(graph.tensors) - 1


def _new_op(model, builtin, inputs, outputs):
    """An op of type `builtin` (its operator code added to the model when missing)."""
    from ai_edge_litert import schema_py_generated as schema

    codes = [max(c.builtinCode, c.deprecatedBuiltinCode) for c in model.operatorCodes]
    if builtin not in codes:
        code = schema.OperatorCodeT()
        code.builtinCode, code.deprecatedBuiltinCode = builtin, min(builtin, 127)
        # The versions the converter's 16x8 mode writes (QUANTIZE 2: requantisation; CAST 2:
        # integer types); LiteRT has no RESHAPE version 2.
        versions = {schema.BuiltinOperator.RESHAPE: 1, schema.BuiltinOperator.FULLY_CONNECTED: 5}
        code.version = versions.get(builtin, 2)
        model.operatorCodes.append(code)
        codes.append(builtin)
    op = schema.OperatorT()
    op.opcodeIndex = codes.index(builtin)
    op.inputs, op.outputs = list(inputs), list(outputs)
    return op


def _kind(model, op):
    """`op`'s builtin operator code (new codes above 127 are in `builtinCode` only)."""
    code = model.operatorCodes[op.opcodeIndex]
    return max(code.builtinCode, code.deprecatedBuiltinCode)


def _drop_unused_codes(model):
    used = sorted({op.opcodeIndex for graph in model.subgraphs for op in graph.operators})
    renumbered = {old: new for new, old in enumerate(used)}
    model.operatorCodes = [model.operatorCodes[old] for old in used]
    for graph in model.subgraphs:
        for op in graph.operators:
            op.opcodeIndex = renumbered[op.opcodeIndex]


def _packed(model, size_hint):
    builder = flatbuffers.Builder(size_hint + 1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())
