"""Dynamic-range int8 simulated in Keras: what a TFLite file whose FULLY_CONNECTED ops quantise
their input at run time computes, so that a recipe can be chosen and its kernels rounded on the
Keras model in seconds (`export.rotated_int8`; docs/benchmarks/int8.md, ninth to twentieth passes).

Inside `dynamic_inputs(layers)`, every Dense layer whose path the regex `layers` finds quantises
its input as LiteRT's dynamic-range FULLY_CONNECTED does (XNNPACK's qd8: each token its own int8
scale, asymmetric, its range widened to hold zero). On the real ViT-Ti the files' divergence from
fp32 follows this simulation's to 2%.
"""

import contextlib
import re

import keras
import numpy as np


def dynamic_int8(x):
    """`x` as a dynamic-range FULLY_CONNECTED sees it: each row (token) int8, asymmetric, its
    range widened to hold zero (XNNPACK's qd8 and TFLite's asymmetric hybrid inputs)."""
    low = keras.ops.minimum(keras.ops.min(x, -1, keepdims=True), 0.0)
    high = keras.ops.maximum(keras.ops.max(x, -1, keepdims=True), 0.0)
    scale = keras.ops.where(high > low, (high - low) / 255.0, 1.0)
    zero = keras.ops.clip(keras.ops.round(-128.0 - low / scale), -128.0, 127.0)
    return (keras.ops.clip(keras.ops.round(x / scale) + zero, -128.0, 127.0) - zero) * scale


def quantises_input(layers, path):
    """Whether a Dense layer at `path` quantises its input under `dynamic_inputs(layers)`."""
    return bool(layers) and re.search(layers, path) is not None


def all_inputs_but(paths):
    """A `dynamic_inputs` pattern for every Dense layer but those at `paths`."""
    if not paths:
        return ".*"
    return "^(?!(" + "|".join(re.escape(path) for path in paths) + ")$)"


@contextlib.contextmanager
def dense_inputs_mapped(map_input):
    """Inside it, every Dense layer calls itself on `map_input(layer, inputs)` (the class's `call`
    is patched: a subclass that calls `super().call`, `rotate.HadamardInputDense`, maps the input
    it passes on)."""
    call = keras.layers.Dense.call
    keras.layers.Dense.call = lambda layer, inputs, training=None: call(
        layer, map_input(layer, inputs), training=training
    )
    try:
        yield
    finally:
        keras.layers.Dense.call = call


def dynamic_inputs(layers=".*"):
    """Inside it, every Dense layer whose path `layers` (a regex; None: none) finds quantises its
    input as `dynamic_int8` does; the others keep theirs in float."""
    return dense_inputs_mapped(
        lambda layer, inputs: dynamic_int8(inputs) if quantises_input(layers, layer.path) else inputs
    )


def dense_layers(model):
    return [layer for layer in model._flatten_layers() if isinstance(layer, keras.layers.Dense)]


def run_recording(model, images, record, batch=10):
    """Runs `images` through `model`, `batch` at a time, with `record(layer, inputs)` called on
    every Dense layer's input (through `Dense.call` as it is: inside `dynamic_inputs`, before it
    quantises)."""
    with dense_inputs_mapped(lambda layer, inputs: record(layer, inputs) or inputs):
        for i in range(0, len(images), batch):
            model(images[i : i + batch], training=False)


def dense_input_rows(model, images, paths):
    """`{path: every input row of that Dense layer over `images`}` (float32), for `paths`, in the
    order the forward pass calls them."""
    wanted, found = set(paths), {}

    def record(layer, inputs):
        if layer.path in wanted:
            rows = keras.ops.convert_to_numpy(inputs).reshape(-1, inputs.shape[-1])
            found.setdefault(layer.path, []).append(rows)

    run_recording(model, images, record)
    return {path: np.concatenate(rows) for path, rows in found.items()}


class _Recorded(Exception):
    """Ends a forward pass once the wanted Dense input is recorded (`dense_input`)."""


def dense_input(model, images, path):
    """The input of the Dense layer at `path` when `model` runs `images` (through `Dense.call` as
    it is: inside `dynamic_inputs`, before it quantises), `(rows, width)` as numpy. The forward
    pass stops there: the layers after it are not run. A layer called twice gives its first input."""
    found = []

    def record(layer, inputs):
        if layer.path == path:
            found.append(keras.ops.convert_to_numpy(inputs).reshape(-1, inputs.shape[-1]))
            raise _Recorded
        return inputs

    try:
        with dense_inputs_mapped(record):
            model(images, training=False)
    except _Recorded:
        pass
    if not found:
        raise ValueError(f"No Dense layer at {path!r} ran in {model.name}.")
    return found[0]


def probabilities(model, images, batch=25):
    """`softmax(model(images))`, `batch` images at a time, as numpy."""
    outputs = [
        keras.ops.convert_to_numpy(keras.ops.softmax(model(images[i : i + batch], training=False)))
        for i in range(0, len(images), batch)
    ]
    return np.concatenate(outputs)


def kl_divergence(reference, predicted):
    """The mean KL divergence of `predicted` probabilities from `reference` (rows of images):
    finer than the count of flipped top-1 classes."""
    return float(np.mean(np.sum(reference * (np.log(reference + 1e-12) - np.log(predicted + 1e-12)), 1)))


def one_layer_costs(model, images, kernel, inputs, round_kernel=None):
    """`{path: KL divergence on `images` with only that Dense layer in int8}`: its `kernel` rounded
    by `round_kernel` (float64 in and out) and/or its `inputs` quantised as the dynamic-range
    recipe does; the weights are put back after each layer. Each layer's pass starts at the input
    of the model's top-level layer that holds it (a block), computed once in float: the layers
    before it compute what they did for the reference."""
    reference = probabilities(model, images)
    result = {}
    for stage, layers in _stages(model):
        tail, stage_inputs = model, images
        if stage is not None:
            tail = keras.Model(stage.input, model.outputs)
            stage_inputs = _outputs(keras.Model(model.inputs, stage.input), images)
        for layer in layers:
            float_kernel = np.asarray(layer.kernel)
            if kernel:
                layer.kernel.assign(round_kernel(float_kernel.astype(np.float64)).astype("float32"))
            with dynamic_inputs(f"^{re.escape(layer.path)}$") if inputs else contextlib.nullcontext():
                result[layer.path] = kl_divergence(reference, probabilities(tail, stage_inputs))
            layer.kernel.assign(float_kernel)
    return {layer.path: result[layer.path] for layer in dense_layers(model)}


def _stages(model):
    """`[(top-level layer or None, its Dense layers)]` in the forward order: for a functional
    model, each top-level layer that holds Dense layers and reads one tensor; None (the whole model
    from its input) for a model of another kind."""
    if not isinstance(getattr(model, "_operations", None), list) or not hasattr(model, "inputs"):
        return [(None, dense_layers(model))]
    stages = []
    for layer in model.layers:
        held = dense_layers(layer)
        if held:
            single = isinstance(getattr(layer, "input", None), keras.KerasTensor)
            stages.append((layer if single else None, held))
    return stages


def _outputs(model, images, batch=25):
    """`model(images)` (one output), `batch` images at a time, as numpy."""
    return np.concatenate(
        [keras.ops.convert_to_numpy(model([images[i : i + batch]])) for i in range(0, len(images), batch)]
    )


def input_sensitivity(model, images):
    """`{path: KL divergence on `images` with only that Dense layer's input quantised as the
    dynamic-range recipe does}`: which layers' inputs cost most in int8."""
    return one_layer_costs(model, images, kernel=False, inputs=True)
