"""Int8 kernels rounded by AdaRound, kernel by kernel in the forward order (`sequential_adaround`).

Every kernel is int8 per output channel, symmetric, its scale the channel's largest |w| / 127, as
ai-edge-quantizer's dynamic-range recipe makes it. AdaRound (Nagel et al., ICML 2020) chooses
each weight's rounding, down or up, as a continuous variable that learns to minimise the layer's
output error on calibration inputs, driven to 0 or 1 by a regulariser. Done in the forward order,
each layer on the inputs of the model whose earlier kernels are rounded already (and quantised as
a dynamic-range file quantises them), against the float model's outputs, each rounding also
answers for the error upstream (AdaRound's asymmetric reconstruction). The rounded kernels are
float values on the int8 grid, each channel's largest |w| kept at +-127, so the quantizer's own
min/max rounding finds the same grid and keeps these very levels.

On the real ViT-Ti's rotated copy (docs/benchmarks/int8.md, twelfth to twentieth passes) it
halves what round-to-nearest kernels cost the dynamic-range file; GPTQ, bias correction, AWQ and
a least-squares kernel first did worse.
"""

import contextlib

import keras
import numpy as np

from keras_vit.export import dynamic_range

LEVELS = 127  # symmetric int8: -127..127, as TFLite's int8 weights
ZETA, GAMMA = 1.1, -0.1  # AdaRound's rectified sigmoid's stretch


def channel_scale(kernel):
    """Each output channel's int8 step (the kernel is (inputs, outputs)): its largest |w| / 127."""
    scale = np.abs(kernel).max(0) / LEVELS
    scale[scale == 0] = 1
    return scale


def round_to_nearest(kernel):
    scale = channel_scale(kernel)
    return np.clip(np.round(kernel / scale), -LEVELS, LEVELS) * scale


def adaround(kernel, hessian, steps=1000, regulariser=0.01, learning_rate=1e-2, drift=None):
    """AdaRound in the Hessian form `tr(dW^T E[x^T x] dW)` (every calibration token counts): the
    per-channel int8 grid of `round_to_nearest`, each weight rounded down or up by a learned
    choice; the regulariser's beta annealed from 20 to 2 after a fifth of the steps, Adam.
    Gradients by hand (the loss is a quadratic form).

    `drift`, `(E[q^T q] - E[q^T x]) W` for the quantised model's inputs `q` and the float model's
    `x`, makes the loss `E|q W_q - x W|^2`: the rounding also answers for the error upstream."""
    kernel = kernel.astype(np.float32)
    hessian = hessian.astype(np.float32)
    drift = 0 if drift is None else drift.astype(np.float32)
    scale, low, v = adaround_start(kernel)
    first, second = np.zeros_like(v), np.zeros_like(v)
    warmup = steps // 5
    for step in range(1, steps + 1):
        sigmoid = 1 / (1 + np.exp(-v))
        stretched = sigmoid * (ZETA - GAMMA) + GAMMA
        up = np.clip(stretched, 0, 1)
        delta = (low + up) * scale - kernel
        gradient = 2 * (hessian @ delta + drift) * scale  # d tr(dW^T H dW) / d up
        if step > warmup:
            beta = 20 + (2 - 20) * (step - warmup) / (steps - warmup)
            centred = 2 * up - 1
            gradient += regulariser * -2 * beta * np.abs(centred) ** (beta - 1) * np.sign(centred)
        gradient *= ((stretched > 0) & (stretched < 1)) * sigmoid * (1 - sigmoid) * (ZETA - GAMMA)
        first = 0.9 * first + 0.1 * gradient
        second = 0.999 * second + 0.001 * gradient**2
        v -= learning_rate * (first / (1 - 0.9**step)) / (np.sqrt(second / (1 - 0.999**step)) + 1e-8)
    return adaround_kernel(kernel, scale, low, (1 / (1 + np.exp(-v))) * (ZETA - GAMMA) + GAMMA >= 0.5)


def adaround_start(kernel):
    """AdaRound's start for `kernel`: `(scale, low, v)`, the per-channel int8 grid of
    `round_to_nearest`, each weight's level below, and the relaxation's variable where rounding
    to nearest would choose (`h(v)`, the rectified sigmoid, the fraction above `low`)."""
    scale = channel_scale(kernel)
    low = np.floor(kernel / scale)
    rest = np.clip(kernel / scale - low, 0.01, 0.99)
    return scale, low, -np.log((ZETA - GAMMA) / (rest - GAMMA) - 1)


def adaround_kernel(kernel, scale, low, up):
    """The rounded `kernel` (float64): each weight at `low` or the level above (`up`, 0 or 1)."""
    levels = np.clip(low + up, -LEVELS, LEVELS)
    # Each channel's largest |w| stays at +-127, so that a quantiser that takes the result as
    # float (max |w| / 127 again) finds the same grid and these very levels.
    largest, channels = np.abs(kernel).argmax(0), np.arange(kernel.shape[1])
    levels[largest, channels] = np.sign(kernel[largest, channels]) * LEVELS
    return (levels * scale).astype(np.float64)


def sequential_adaround(
    model, float_model, calibration, steps=1000, regulariser=0.01, bias=False, dynamic=None, kept=(),
    target=None, progress=None, batch=10,
):  # fmt: skip
    """Rounds `model`'s Dense kernels in place by AdaRound, kernel by kernel in the forward order,
    each on the inputs of the model whose earlier kernels are already rounded, against the float
    model's outputs. Each layer's statistics are summed `batch` images at a time, each forward
    pass stopped at the layer (`dynamic_range.dense_input`): memory for a kernel's square, not
    for every calibration token's inputs (5 GB for a ViT-B on 100 images at 224).

    Args:
        model: the float model; its kernels are replaced by rounded ones.
        float_model: a float copy of `model` (the same layers in the same order), left as it is:
            the outputs each rounding aims at.
        calibration: the images (the model's input) the rounding sees.
        bias: also correct each bias by the mean error left.
        dynamic: a regex of layer paths (`dynamic_range.dynamic_inputs`' `layers`): those layers'
            inputs quantised as the dynamic-range recipe does, in the rounded model and in each
            layer's own input.
        kept: paths whose kernels stay float (the later roundings see their float outputs).
        target: `target(kernel, hessian, cross)`, a kernel to round instead of the float one
            (`benchmarks/int8_weights.py`'s least-squares kernel).
        progress: called with `(done, total)` after each kernel.
    """
    layers = dynamic_range.dense_layers(model)
    twins = dict(zip((layer.path for layer in layers), dynamic_range.dense_layers(float_model), strict=True))
    called = dynamic_range.dense_input_rows(model, calibration[:1], list(twins))
    by_path = {layer.path: layer for layer in layers}
    order = [path for path in called if path not in kept]  # dicts keep the first call's order
    for done, path in enumerate(order, start=1):
        layer = by_path[path]
        hessian, cross, sums, count = _statistics(
            model, float_model, calibration, path, twins[path].path, dynamic, batch
        )
        kernel = np.asarray(layer.kernel, np.float64)
        aimed = kernel if target is None else target(kernel, hessian, cross)
        rounded = adaround(
            aimed, hessian, steps=steps, regulariser=regulariser, drift=hessian @ aimed - cross @ kernel
        )
        layer.kernel.assign(rounded.astype("float32"))
        if bias and layer.use_bias:
            error = (sums[0] @ rounded - sums[1] @ kernel) / count
            layer.bias.assign((np.asarray(layer.bias, np.float64) - error).astype("float32"))
        if progress is not None:
            progress(done, len(order))


def _statistics(model, float_model, calibration, path, float_path, dynamic, batch):
    """`(E[q^T q], E[q^T x], (sum q, sum x), rows)` over `calibration` for the Dense layer at
    `path`: `q` its input in `model` (under `dynamic`'s quantised inputs, its own quantised too
    when `dynamic` finds it), `x` the input of its twin at `float_path` in `float_model`."""
    hessian = cross = 0.0
    sums, count = [0.0, 0.0], 0
    for start in range(0, len(calibration), batch):
        images = calibration[start : start + batch]
        float_rows = dynamic_range.dense_input(float_model, images, float_path).astype(np.float64)
        with dynamic_range.dynamic_inputs(dynamic) if dynamic else contextlib.nullcontext():
            rows = dynamic_range.dense_input(model, images, path)
        if dynamic_range.quantises_input(dynamic, path):
            rows = keras.ops.convert_to_numpy(dynamic_range.dynamic_int8(rows))
        rows = rows.astype(np.float64)
        hessian = hessian + rows.T @ rows
        cross = cross + rows.T @ float_rows
        sums = [sums[0] + rows.sum(0), sums[1] + float_rows.sum(0)]
        count += len(rows)
    return hessian / count, cross / count, sums, count
