"""What int8 weights alone cost the real ViT-Ti, and whether a better rounding buys it back
(issue 49, ninth pass).

Every recipe here rounds the Dense kernels (QKV, proj, fc1, fc2, head) to int8 per output
channel, symmetric, as ai-edge-quantizer's weight-only and dynamic-range recipes do, and keeps
activations in float (unless `--dynamic`, below): in Keras, so a recipe is a few seconds and its
answers are those of a TFLite weight-only file (`int8_dynamic.py --recipes weight_only` agrees
on the same photos).
Recipes (`--recipes`):
- `rtn`: round to nearest, the scale from the channel's largest |w| (min/max);
- `bias`: the same, and each bias corrected by the rounding's mean effect on the calibration
  photos' inputs, `b - E[x] (W_q - W)` (Nagel et al., data-free quantisation's bias correction);
- `gptq`: GPTQ (Frantar et al., 2023), columns in the order of the calibration inputs' energy,
  each column's rounding error spread over the columns not yet rounded (1% damping);
- `awq`: each input channel scaled by `mean|x|^alpha` before rounding, the inverse folded into
  the float op before (norm1 for QKV, norm2 for fc1, V's columns for proj, the final norm for the
  head): alpha from 0 to 1 by the least layer-output error on the calibration inputs (AWQ,
  Lin et al., 2024); exact in float;
- `adaround`: AdaRound (Nagel et al., 2020): each weight rounded up or down as a continuous
  variable learns, minimising the layer's output error on the calibration inputs (in the
  Hessian form `tr(dW^T E[x^T x] dW)`, so every calibration token counts) plus a regulariser that
  drives each variable to 0 or 1 (beta annealed from 20 to 2 after a fifth of the steps), Adam;
  `adaround-s2000-r0.03` sets the steps and the regulariser's weight (1000 and 0.01 by default);
- `seq-adaround` (`-bias`, `-s2000`, `-r0.03`): AdaRound kernel by kernel in the order of the
  forward pass, each on the inputs of the model whose earlier kernels are already rounded, against
  the float model's outputs (AdaRound's asymmetric reconstruction: the rounding also answers for
  the error upstream); `-bias` then corrects each bias by the mean error left; `-l0.1` first moves
  each kernel to the least-squares answer to the float outputs from its own inputs, ridge 0.1
  (`least_squares_kernel`, ERQ's activation-error reduction; twentieth pass: worse here);
- `block-adaround` (`-s2000`, `-r0.03`, `-n8`: photos a step, 4 by default; `-bias`: the biases
  learn too): BRECQ, each Transformer block's four kernels rounded together against the float
  block's output, the int8 inputs inside the loop (`int8_block_rounding.py`); the head then as
  `seq-adaround`;
- `float`: no kernel rounded (with `--dynamic`, what the activations alone cost);
- `float_K`: the K kernels whose rounding alone moves the calibration photos' probabilities most
  (KL divergence) kept in float, the others `rtn`.

`--source rms_had64` rounds the kernels of `int8_dynamic.py`'s model of that name (the residual
stream rotated offline, RMSNorms, fc2's input rotated in the graph; `--rotation-seed` draws the
rotation's random signs), which a dynamic-range file
rounds with no online rotation (`rms_had768` rotates all of fc2's input; `rms_had64_vrot` also
rotates each head's values offline); `--dynamic` quantises every Dense input token by token
as LiteRT's dynamic-range FULLY_CONNECTED does (`dynamic_inputs`; `--dynamic fc2` only the
inputs of the layers whose path that regex finds; `--dynamic "fc2;proj"` each recipe under each
pattern in turn; `--float-inputs K` keeps in float the inputs of the K Dense layers whose int8
input alone moves the calibration photos most, `input_sensitivity`, or with `--rank-by layer`
whose int8 input and rounded kernel together do, `float_saving`, and `--float-last-block`
the last block's proj, fc1 and fc2, which the export runs on the [cls] row alone), while scoring and, for
`seq-adaround`, while rounding; `--save-kernels DIR` writes each recipe's kernels for
`int8_dynamic.py --kernels`, which makes the TFLite file of them; `--tune-scales LR` then tunes
each Dense layer's per-channel scale and bias end to end (`int8_float_tuning.py`);
`--hadamard-blocks 7` keeps `rms_had64`'s Hadamard on fc2's input in those blocks only, and
`--float-cls` scores with the [cls] token's row of every Dense layer in float, float kernel
included (`float_cls_rows`; seventeenth pass), and `--cls-split-mlp` with each block's MLP run on
the [cls] row apart, fc1 and fc2 quantising it twice (`cls_split_mlp`; eighteenth pass).

Scored against the fp32 Keras model on the photos calibration did not use (the seeded
permutation of `int8_rotation.py`): flips of the top-1 class, and the mean KL divergence of the
probabilities, a finer measure than flips on a thousand photos.

    unzip ../shared/datasets/imagenette2_224_val.zip -d /tmp/imagenette
    HF_HUB_OFFLINE=1 python benchmarks/int8_weights.py --dataset /tmp/imagenette/imagenette2_224/val

One JSON line per recipe; docs/benchmarks/int8.md (ninth, twelfth to twentieth passes)
reports them.
"""

import argparse
import contextlib
import itertools
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from int8_rotation import MODEL, keras_probabilities, photos, read  # noqa: E402

import keras_vit  # noqa: E402
from keras_vit.export.adaround import (  # noqa: E402, F401  (the recipes' rounding, shipped: `export.adaround`)
    LEVELS,
    adaround,
    adaround_kernel,
    adaround_start,
    channel_scale,
    round_to_nearest,
)
from keras_vit.export.dynamic_range import (  # noqa: E402, F401  (the simulation, shipped: `export.dynamic_range`)
    all_inputs_but,
    dense_input_rows,
    dense_inputs_mapped,
    dense_layers,
    dynamic_inputs,
    dynamic_int8,
    input_sensitivity,
    kl_divergence,
    one_layer_costs,
    quantises_input,
    run_recording,
)
from keras_vit.export.rotated_int8 import float_layer_choice, last_block_row_layers  # noqa: E402, F401

ROTATED_SOURCES = ("rms_had64", "rms_had64_vrot", "rms_had768")  # `source_model`


def gptq(kernel, hessian, damping=0.01):
    scale = channel_scale(kernel)
    w = kernel.T.copy()  # (outputs, inputs): one column per input channel
    h = hessian.copy()
    dead = np.diag(h) == 0
    h[dead, dead] = 1
    w[:, dead] = 0
    order = np.argsort(-np.diag(h))
    w, h = w[:, order], h[order][:, order]
    h += damping * np.mean(np.diag(h)) * np.eye(len(h))
    inverse = np.linalg.cholesky(np.linalg.inv(h)).T  # upper Cholesky factor of H^-1
    rounded = np.zeros_like(w)
    for i in range(len(h)):
        column = w[:, i]
        rounded[:, i] = np.clip(np.round(column / scale), -LEVELS, LEVELS) * scale
        error = (column - rounded[:, i]) / inverse[i, i]
        w[:, i + 1 :] -= np.outer(error, inverse[i, i + 1 :])
    result = np.empty_like(rounded)
    result[:, order] = rounded
    return result.T


@contextlib.contextmanager
def float_cls_rows(float_kernels):
    """Inside it (and inside `dynamic_inputs`), the [cls] token's row of each Dense input meets
    the layer's float kernel (`float_kernels[path]`) in float, while the other rows take the Dense
    call as it is (int8 inputs, rounded kernels): what `int8_dynamic.py --float-cls` puts in the
    file. A layer that sees the [cls] token alone (the last block's, the head) is float whole."""
    call = keras.layers.Dense.call

    def split(layer, inputs, training=None):
        def exact(rows):
            outputs = keras.ops.matmul(rows, float_kernels[layer.path])
            return layer.activation(outputs + layer.bias if layer.bias is not None else outputs)

        if len(inputs.shape) == 3 and inputs.shape[1] > 1:
            rest = call(layer, inputs[:, 1:], training=training)
            return keras.ops.concatenate([exact(inputs[:, :1]), rest], axis=1)
        return exact(inputs)

    keras.layers.Dense.call = split
    try:
        yield
    finally:
        keras.layers.Dense.call = call


@contextlib.contextmanager
def cls_split_mlp(model, skip=()):
    """Inside it, `model`'s blocks run their MLPs as `int8_dynamic.with_cls_split_mlp` makes them
    (the [cls] row apart, quantised twice by fc1 and fc2 but the layers at `skip`); after it, as
    before."""
    import int8_dynamic

    classes = [type(block) for block in model.blocks]
    int8_dynamic.with_cls_split_mlp(model, skip=skip)
    try:
        yield
    finally:
        for block, kind in zip(model.blocks, classes, strict=True):
            block.__class__ = kind


def straight_through_inputs(layers):
    """`dynamic_inputs(layers)` forwards, the gradient passed straight through the rounding
    backwards: what the learned recipes (`int8_block_rounding`, `int8_float_tuning`) train under."""
    import tensorflow as tf

    return dense_inputs_mapped(
        lambda layer, inputs: (
            inputs + tf.stop_gradient(dynamic_int8(inputs) - inputs)
            if quantises_input(layers, layer.path)
            else inputs
        )
    )


def dense_inputs(model, images, rows_per_call=64, seed=0):
    """`{layer path: (mean input, E[x^T x], sampled input rows)}` over `images`, in float64."""
    rng = np.random.default_rng(seed)
    found = {}

    def record(layer, inputs):
        x = keras.ops.convert_to_numpy(inputs).reshape(-1, inputs.shape[-1]).astype(np.float64)
        total, second, count, rows = found.get(layer.path, (0, 0, 0, []))
        rows.append(x[rng.choice(len(x), min(rows_per_call, len(x)), replace=False)])
        found[layer.path] = (total + x.sum(0), second + x.T @ x, count + len(x), rows)

    run_recording(model, images, record)
    return {
        path: (total / count, second / count, np.concatenate(rows))
        for path, (total, second, count, rows) in found.items()
    }


def least_squares_kernel(kernel, hessian, cross, ridge):
    """The kernel `W'` whose outputs on a layer's own inputs `q` come nearest the float layer's,
    `x W`: `argmin E|q W' - x W|^2 + ridge * mean(diag H) |W' - W|^2`, from `H = E[q^T q]` and
    `cross = E[q^T x]`. Unlike a rounding, it may move a weight by many int8 steps."""
    damping = ridge * np.mean(np.diag(hessian)) * np.eye(len(hessian))
    return np.linalg.solve(hessian + damping, (cross + damping) @ kernel)


def sequential_adaround(model, float_model, calibration, ridge=None, **options):
    """`export.adaround.sequential_adaround` (the shipped rounding); `ridge`: each kernel first
    moved to `least_squares_kernel` (ERQ's activation-error reduction, Zhong et al., ICML 2024),
    which AdaRound then rounds (twentieth pass: worse here)."""
    from keras_vit.export import adaround as shipped

    def target(kernel, hessian, cross):
        return least_squares_kernel(kernel, hessian, cross, ridge)

    shipped.sequential_adaround(
        model, float_model, calibration, target=None if ridge is None else target, **options
    )


def awq_scales(model, inputs):
    """Scales each kernel's input channels and folds the inverse into the float op before;
    returns `{path: alpha}`. The model's float answers do not change."""
    dense = {layer.path: layer for layer in dense_layers(model)}
    final_norm = next(
        layer
        for layer in model._flatten_layers()
        if isinstance(layer, keras.layers.LayerNormalization) and layer.name == "norm"
    )
    readers = {dense[next(p for p in dense if p.split("/")[-1] == "head")].path: ("norm", final_norm)}
    for block in model.blocks:
        readers[block.attention.qkv.path] = ("norm", block.norm1)
        readers[block.fc1.path] = ("norm", block.norm2)
        readers[block.attention.proj.path] = ("values", block.attention.qkv)
    alphas = {}
    for path, (kind, before) in readers.items():
        kernel = np.asarray(dense[path].kernel, np.float64)
        x = inputs[path][2]
        magnitude = np.abs(x).mean(0) + 1e-8
        exact = x @ kernel
        best = (np.inf, 0.0, np.ones(len(magnitude)))
        for alpha in np.linspace(0, 1, 21):
            scale = magnitude**alpha
            scale /= np.sqrt(scale.max() * scale.min())
            error = np.mean(((x * scale) @ round_to_nearest(kernel / scale[:, None]) - exact) ** 2)
            best = min(best, (error, alpha, scale), key=lambda candidate: candidate[0])
        _, alphas[path], scale = best
        dense[path].kernel.assign((kernel / scale[:, None]).astype("float32"))
        if kind == "norm":
            for weight in (before.gamma, before.beta):
                weight.assign((np.asarray(weight, np.float64) * scale).astype("float32"))
        else:  # V's output channels are proj's input channels, in the same order
            qkv_kernel, qkv_bias = np.array(before.kernel, np.float64), np.array(before.bias, np.float64)
            values = slice(2 * qkv_kernel.shape[1] // 3, None)
            qkv_kernel[:, values] *= scale
            qkv_bias[values] *= scale
            before.kernel.assign(qkv_kernel.astype("float32"))
            before.bias.assign(qkv_bias.astype("float32"))
    return alphas


def sensitivity(model, images):
    """`{path: KL divergence on `images` with that kernel alone rounded}`."""
    return one_layer_costs(model, images, kernel=True, inputs=False, round_kernel=round_to_nearest)


def float_saving(model, images):
    """`{path: KL divergence on `images` with only that Dense layer in int8}`, input and kernel
    (rounded to nearest): what keeping the whole layer float (`--float-kernels`) saves, where
    `input_sensitivity` sees the input alone."""
    return one_layer_costs(model, images, kernel=True, inputs=True, round_kernel=round_to_nearest)


def quantise(model, inputs, recipe, kept=()):
    for layer in dense_layers(model):
        if layer.path in kept:
            continue
        kernel = np.asarray(layer.kernel, np.float64)
        mean, hessian, _ = inputs[layer.path]
        if recipe == "gptq":
            rounded = gptq(kernel, hessian)
        elif recipe.startswith("adaround"):  # adaround-s2000-r0.03: 2000 steps, regulariser 0.03
            options = {part[0]: float(part[1:]) for part in recipe.split("-")[1:]}
            rounded = adaround(
                kernel, hessian, steps=int(options.get("s", 1000)), regulariser=options.get("r", 0.01)
            )
        else:
            rounded = round_to_nearest(kernel)
        layer.kernel.assign(rounded.astype("float32"))
        if recipe == "bias" and layer.use_bias:
            layer.bias.assign(
                (np.asarray(layer.bias, np.float64) - mean @ (rounded - kernel)).astype("float32")
            )


def source_model(original, source, seed=0, hadamard_blocks=None):
    """A float copy of `original`: itself (`original`), or the rotated copy with RMSNorms and
    fc2's input rotated in the graph by a Hadamard of 64 (`rms_had64`, `int8_dynamic.py`'s model
    of that name), whose kernels are the ones a dynamic-range file then rounds with no online
    rotation; `rms_had64_vrot` also rotates each head's values offline
    (`int8_dynamic.with_value_rotation`: `proj`'s input arrives rotated per head, at no cost);
    `rms_had768` rotates fc2's whole input instead (`int8_dynamic.with_fc2_full_rotation`).
    `hadamard_blocks`: `rms_had64`'s Hadamard in those blocks only (indices; None: all)."""
    if source == "original":
        model = original.__class__.from_config(original.get_config())
        model.set_weights(original.get_weights())
        return model
    import int8_dynamic

    from keras_vit.export import rotate

    model = rotate.rotated_copy(original, seed=seed, norm="rms")
    if source == "rms_had768":
        return int8_dynamic.with_fc2_full_rotation(model)
    model = int8_dynamic.with_fc2_hadamard(model, blocks=hadamard_blocks)
    return int8_dynamic.with_value_rotation(model) if source == "rms_had64_vrot" else model


def main():
    import int8_dynamic

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", required=True, help="a folder of ImageNet class folders (wnids)")
    parser.add_argument("--calibration", type=int, default=100)
    parser.add_argument("--images", type=int, default=1000, help="scored photos (more than there are: all)")
    parser.add_argument("--recipes", default="rtn,bias,gptq,awq,float_4,float_12")
    parser.add_argument("--source", default="original", choices=("original", *ROTATED_SOURCES))
    int8_dynamic.add_rotation_arguments(parser)
    parser.add_argument(
        "--dynamic", nargs="?", const=".*", default=None, metavar="LAYERS",
        help="Dense inputs quantised as dynamic range does: every one, or those whose path the regex finds",
    )  # fmt: skip
    parser.add_argument("--save-kernels", default=None, help="a folder for each recipe's kernels (.npz)")
    parser.add_argument(
        "--float-inputs", type=int, default=0, metavar="K",
        help="with --dynamic: the K Dense layers whose int8 input alone moves the calibration photos most "
        "keep a float input (their kernels still on the int8 grid unless --float-kernels: in the file, a "
        "float FULLY_CONNECTED holding those levels, `int8_dynamic.py --float-inputs`)",
    )  # fmt: skip
    parser.add_argument(
        "--rank-by", choices=("input", "layer"), default="input",
        help="--float-inputs' ranking: what each layer's int8 input alone costs the calibration photos "
        "(`input_sensitivity`), or its int8 input and rounded kernel together (`float_saving`)",
    )  # fmt: skip
    parser.add_argument(
        "--float-last-block", action="store_true",
        help="with --float-inputs: the last block's proj, fc1 and fc2 float too, inputs and kernels (the "
        "export computes them for the [cls] row alone, `last_block_row_layers`: near free in time)",
    )  # fmt: skip
    parser.add_argument(
        "--float-kernels", action="store_true",
        help="with --float-inputs: those layers keep their float kernels too (a float FULLY_CONNECTED "
        "in the file either way, so it costs no time); the roundings after them see their float outputs",
    )  # fmt: skip
    parser.add_argument(
        "--tune-scales", type=float, default=None, metavar="LR",
        help="after each recipe: each Dense layer's per-channel scale and bias tuned end to end towards the "
        "float probabilities on the calibration photos, Adam at LR (`int8_float_tuning.py`)",
    )  # fmt: skip
    parser.add_argument("--tune-steps", type=int, default=200, help="--tune-scales' steps (8 photos each)")
    parser.add_argument(
        "--float-cls", action="store_true",
        help="when scoring: the [cls] token's row of every Dense layer in float with its float kernel "
        "(`float_cls_rows`), the other rows as the recipe makes them",
    )  # fmt: skip
    parser.add_argument(
        "--cls-split-mlp", action="store_true",
        help="when scoring: each block's MLP on the [cls] row apart, fc1 and fc2 quantising it twice "
        "(`int8_dynamic.with_cls_split_mlp`; the float layers once)",
    )  # fmt: skip
    arguments = parser.parse_args()
    if arguments.float_inputs and arguments.dynamic != ".*":
        parser.error(
            "--float-inputs keeps some inputs of --dynamic's every one in float: give --dynamic alone"
        )
    if arguments.float_last_block and not arguments.float_inputs:
        parser.error("--float-last-block joins --float-inputs' layers: give --float-inputs K")
    if arguments.float_kernels and not arguments.float_inputs:
        parser.error("--float-kernels keeps --float-inputs' layers' kernels float: give --float-inputs K")

    original = keras_vit.create_model(MODEL, pretrained=True)
    calibration_paths, scored_paths = photos(arguments.dataset, arguments.calibration, arguments.images)
    images, calibration = read(original, scored_paths), read(original, calibration_paths)
    reference = keras_probabilities(original, images)
    print(json.dumps({"images": len(images), "calibration": len(calibration)}), flush=True)
    # One model for every recipe, its float weights put back before each: a second rotated copy
    # would name its layers apart, and the calibration inputs are found by layer path.
    hadamard_blocks = arguments.hadamard_blocks
    float_source = source_model(original, arguments.source, arguments.rotation_seed, hadamard_blocks)
    float_weights = float_source.get_weights()
    float_kernels = {layer.path: np.asarray(layer.kernel) for layer in dense_layers(float_source)}
    inputs = dense_inputs(float_source, calibration)
    ranked = float_twin = None
    float_layers = ()  # `--float-kernels`: the layers whose kernels no recipe rounds
    float_input_layers = ()  # `--float-inputs`: the layers whose inputs stay float
    # `--dynamic "fc2;qkv|fc1"`: each recipe under each pattern in turn.
    patterns = arguments.dynamic.split(";") if arguments.dynamic else [None]
    if arguments.float_inputs:
        rank = float_saving if arguments.rank_by == "layer" else input_sensitivity
        scores = rank(float_source, calibration)
        free = last_block_row_layers(float_source, calibration[0]) if arguments.float_last_block else []
        kept = float_layer_choice(scores, arguments.float_inputs, free)
        print(json.dumps({"float_inputs": {path: f"{scores[path]:.1e}" for path in kept}}), flush=True)
        patterns = [all_inputs_but(kept)]
        float_layers = set(kept) if arguments.float_kernels else ()
        float_input_layers = set(kept)
    for recipe, dynamic in itertools.product(arguments.recipes.split(","), patterns):
        start = time.perf_counter()
        model = float_source
        model.set_weights(float_weights)
        row = {"recipe": recipe, "source": arguments.source, "dynamic": dynamic}
        if arguments.source != "original":
            row["rotation_seed"] = arguments.rotation_seed
        if hadamard_blocks is not None:
            row["hadamard_blocks"] = hadamard_blocks
        if float_layers:
            row["float_kernels"] = sorted(float_layers)
        if recipe == "awq":
            alphas = awq_scales(model, inputs)
            row["float_kl_of_the_scaling"] = kl_divergence(reference, keras_probabilities(model, images))
            row["kernels_scaled"] = int(sum(alpha > 0 for alpha in alphas.values()))
            quantise(model, dense_inputs(model, calibration), "rtn")
        elif recipe.startswith("float_"):
            if ranked is None:
                scores = sensitivity(model, calibration)
                ranked = sorted(scores, key=scores.get, reverse=True)
                row["most_sensitive"] = {path: f"{scores[path]:.1e}" for path in ranked[:6]}
            quantise(model, inputs, "rtn", kept=set(ranked[: int(recipe.split("_")[1])]))
        # seq-adaround[-bias][-s2000][-r0.03][-l0.01], block-adaround[-n8]
        elif recipe.startswith(("seq", "block")):
            parts = recipe.split("-")[2:]
            options = {part[0]: float(part[1:]) for part in parts if part != "bias"}
            if float_twin is None:  # the float model the roundings aim at, never rounded
                seed = arguments.rotation_seed
                float_twin = source_model(original, arguments.source, seed, hadamard_blocks)
            rounding = dict(steps=int(options.get("s", 1000)), regulariser=options.get("r", 0.01))
            kept = set(float_layers)
            if recipe.startswith("block"):
                import int8_block_rounding

                int8_block_rounding.block_adaround(
                    model, calibration, dynamic=dynamic, kept=kept, learn_bias="bias" in parts,
                    batch=int(options.get("n", 4)), log=lambda fit: print(json.dumps(fit), flush=True),
                    **rounding,
                )  # fmt: skip
                kept |= {layer.path for block in model.blocks for layer in dense_layers(block)}
            # seq-adaround: every kernel; after block-adaround, those outside the blocks (the head)
            sequential_adaround(
                model, float_twin, calibration, bias="bias" in parts and recipe.startswith("seq"),
                dynamic=dynamic, kept=kept, ridge=options.get("l"), **rounding,
            )  # fmt: skip
        elif recipe != "float":  # `float`: the kernels as they are (what the activations alone cost)
            quantise(model, inputs, recipe, kept=float_layers)
        if arguments.tune_scales:
            import int8_float_tuning

            int8_float_tuning.tune_scales_and_biases(
                model, calibration, keras_probabilities(original, calibration), dynamic=dynamic,
                steps=arguments.tune_steps, learning_rate=arguments.tune_scales,
            )  # fmt: skip
            row.update(tune_scales=arguments.tune_scales, tune_steps=arguments.tune_steps)
        if arguments.save_kernels:
            os.makedirs(arguments.save_kernels, exist_ok=True)
            kernels = {layer.path: np.asarray(layer.kernel) for layer in dense_layers(model)}
            biases = {layer.path + "/bias": np.asarray(layer.bias) for layer in dense_layers(model)}
            np.savez(
                os.path.join(arguments.save_kernels, f"{arguments.source}-{recipe}.npz"), **kernels, **biases
            )
        with contextlib.ExitStack() as scoring:
            if dynamic:
                scoring.enter_context(dynamic_inputs(dynamic))
            if arguments.float_cls:  # inside `dynamic_inputs`: the [cls] rows skip its rounding
                scoring.enter_context(float_cls_rows(float_kernels))
                row["float_cls"] = True
            if arguments.cls_split_mlp:
                scoring.enter_context(cls_split_mlp(model, skip=float_input_layers))
                row["cls_split_mlp"] = True
            probabilities = keras_probabilities(model, images)
        flips = int((probabilities.argmax(1) != reference.argmax(1)).sum())
        row.update(
            agreement=1 - flips / len(images),
            flips=flips,
            kl=kl_divergence(reference, probabilities),
            seconds=round(time.perf_counter() - start, 1),
        )
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
