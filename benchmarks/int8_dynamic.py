"""Dynamic-range int8 recipes for the real ViT-Ti (issue 49): which rotations and which float
projections keep fp32's answers, and the ceiling that int8 weights alone set.

Each recipe is a `.tflite` file made from timm's ViT-Ti (or its copy with the residual stream
rotated offline, `export.rotate.rotated_copy`) by `export.quantize` rules: every
FULLY_CONNECTED int8 by int8 with its input quantised at run time per token (dynamic range),
unless the recipe says otherwise. `had64` rotates fc2's input in the graph by a block-diagonal
Hadamard of 64 (a float FULLY_CONNECTED over rows of 64, fc2's kernel rotated to match: exact in
float) instead of ai-edge-quantizer's online rotation, whose blocks of 256 are the recipe's
dearest op. Scored against the original's fp32 Keras model on the photos calibration did not use
(the seeded permutation of `int8_rotation.py`; GPTQ calibrates on the first 100).

    unzip ../shared/datasets/imagenette2_224_val.zip -d /tmp/imagenette
    HF_HUB_OFFLINE=1 python benchmarks/int8_dynamic.py --dataset /tmp/imagenette/imagenette2_224/val \\
        --images 10000 --save /tmp/int8_dynamic
    python benchmarks/tflite_latency.py /tmp/int8_dynamic/fp32.tflite /tmp/int8_dynamic/*.tflite \\
        --threads 2

`--hadamard-blocks 7` keeps that Hadamard in those blocks only; `--float-cls` computes the [cls]
token's row of every projection in float with its float kernel (`with_float_cls_rows`);
`--cls-residual` has every projection quantise the [cls] row twice, its dynamic-range residual
one more row of the same product (`with_cls_residual_rows`), and `--cls-split-mlp` does it in
fc1 and fc2 with each block's MLP run on the [cls] row apart, without copying the other rows
(`with_cls_split_mlp`); `--rotation-seed` draws `rms_had64`'s signs.

One JSON line per recipe (agreement, flips, mean KL divergence to fp32, accuracy);
docs/benchmarks/int8.md (eighth to twentieth passes) reports them.
"""

import argparse
import json
import os
import re
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from int8_rotation import MODEL, fp32, keras_probabilities, labels_of, photos, read, tflite_probabilities  # noqa: E402
from keras import ops  # noqa: E402

import keras_vit  # noqa: E402
from keras_vit.export import quantize, rotate, rotated_int8  # noqa: E402
from keras_vit.export.dynamic_range import kl_divergence  # noqa: E402
from keras_vit.export.quantize import DYNAMIC, FLOAT_IO, ROTATED, Rule  # noqa: E402
from keras_vit.export.rotated_int8 import op_name_pattern  # noqa: E402
from keras_vit.inference.classifier import load_classifier  # noqa: E402
from keras_vit.model.vit.model import ViT  # noqa: E402

WEIGHT_ONLY = "weight only"  # int8 weights, float activations: what the weights alone cost


def _op_config(bits, original=quantize._op_config):
    from ai_edge_quantizer import qtyping

    if bits != WEIGHT_ONLY:
        return original(bits)
    weights = qtyping.TensorQuantizationConfig(
        num_bits=8, symmetric=True, granularity=qtyping.QuantGranularity.CHANNELWISE
    )
    return qtyping.OpQuantizationConfig(
        weight_tensor_config=weights,
        compute_precision=qtyping.ComputePrecision.FLOAT,
        explicit_dequantize=True,
    )


quantize._op_config = _op_config


def layer(name):
    return rf"/{name}(_\d+)?/"


def projections(activations, pattern=".*", algorithm="min_max_uniform_quantize"):
    return Rule(pattern, "FULLY_CONNECTED", activations, algorithm)


def _with_fc2_input_rotated(model, rotation_of, rotate, blocks=None):
    """`model` (changed in place) with each block's fc2 input (those of `blocks`, indices: all by
    default) rotated in the graph by `rotate(inputs, rows)`, under the name scope "hadamard", and
    fc2's kernel rows by the transpose of `rotation_of(rows)`, the same map as a `(rows, rows)`
    matrix: the same outputs."""
    for index, block in enumerate(model.blocks):
        if blocks is not None and index not in blocks:
            continue
        fc2 = block.fc2
        rows = fc2.kernel.shape[0]
        rotation = rotation_of(rows)
        fc2.kernel.assign((rotation.T @ np.asarray(fc2.kernel, np.float64)).astype("float32"))

        def call(inputs, *args, layer=fc2, rows=rows, **kwargs):
            with tf.name_scope("hadamard"):
                rotated = ops.reshape(rotate(inputs, rows), ops.shape(inputs))
            # The class's call as it is now: `int8_weights.py` records and quantises Dense inputs
            # by patching it, and must see fc2's rotated input.
            return type(layer).call(layer, rotated, *args, **kwargs)

        fc2.call = call
    return model


def with_fc2_hadamard(model, group=64, seed=None, blocks=None):
    """`model` (changed in place) with each block's fc2 input multiplied by `I (x) H_group` in the
    graph, and fc2's kernel by its transpose: the same outputs. With `seed`, `H_group`'s rows take
    random signs: as exact, another rounding of the kernels. `blocks`: only those (indices); the
    real ViT-Ti's massive MLP unit is block 7's (seventeenth pass: the others' cost more time
    than they save divergence)."""
    hadamard = rotate.hadamard(group)
    if seed is not None:
        hadamard = np.random.default_rng(seed).choice([-1.0, 1.0], group)[:, None] * hadamard
    return _with_fc2_input_rotated(
        model,
        lambda rows: np.kron(np.eye(rows // group), hadamard),
        lambda inputs, rows: ops.matmul(ops.reshape(inputs, (-1, group)), hadamard.astype("float32")),
        blocks,
    )


def with_fc2_full_rotation(model, group=64):
    """`model` (changed in place) with each block's whole fc2 input rotated in the graph by an
    orthogonal `H_(width/group) (x) H_group` in two cheap steps: rows of `group` times `H_group`
    (as `with_fc2_hadamard`), then, across the `width / group` blocks, each of the `group`
    positions times the small Hadamard (12 x 12 for a width of 768), one TRANSPOSE between; fc2's
    kernel rows rotated and permuted to match: the same outputs. A massive unit spreads over every
    channel, not only over its own block of `group`."""
    inner = rotate.hadamard(group)

    def rotation_of(rows):  # x -> y, y[k * blocks + l] = sum_ij x[i * group + j] inner[j, k] outer[i, l]
        return np.einsum("il,jk->ijkl", rotate.hadamard(rows // group), inner).reshape(rows, rows)

    def rotated(inputs, rows):
        blocks = rows // group
        within = ops.matmul(ops.reshape(inputs, (-1, group)), inner.astype("float32"))
        across = ops.transpose(ops.reshape(within, (-1, blocks, group)), (0, 2, 1))
        return ops.matmul(ops.reshape(across, (-1, blocks)), rotate.hadamard(blocks).astype("float32"))

    return _with_fc2_input_rotated(model, rotation_of, rotated)


def with_value_rotation(model):
    """`model` (changed in place) with each head's values multiplied by a Hadamard matrix of the
    head's width (`qkv`'s value columns and bias on the right) and attention's output projection
    by its transpose (`proj`'s rows): `proj`'s input arrives rotated, per head, at no cost in the
    graph, and the same outputs (attention mixes tokens, never a head's channels)."""
    for block in model.blocks:
        attention = block.attention
        width = attention.hidden_dim
        rotation = np.kron(np.eye(attention.num_heads), rotate.hadamard(width // attention.num_heads))
        kernel = np.asarray(attention.qkv.kernel, np.float64)
        kernel[:, 2 * width :] = kernel[:, 2 * width :] @ rotation
        attention.qkv.kernel.assign(kernel.astype("float32"))
        if attention.qkv.use_bias:
            bias = np.asarray(attention.qkv.bias, np.float64)
            bias[2 * width :] = bias[2 * width :] @ rotation
            attention.qkv.bias.assign(bias.astype("float32"))
        proj = attention.proj
        proj.kernel.assign((rotation.T @ np.asarray(proj.kernel, np.float64)).astype("float32"))
    return model


CLS_SCOPE = "cls_float"


def with_float_cls_rows(model):
    """`model` (changed in place) with the [cls] token's row of every Dense input multiplied by
    the layer's kernel as it is now, a constant, under the name scope "cls_float" (which the
    recipes keep float), and the other rows through the layer (dynamic-range int8 in the file):
    `int8_weights.float_cls_rows` as a graph. A layer that sees the [cls] token alone (the last
    block's, the head) is float whole. Kernels put in the layers later (`--kernels`) reach the
    other rows only; biases reach both, as in the simulation. Each layer's class becomes a
    subclass whose `call` splits the rows, so a rotation in front of it (`with_fc2_hadamard`'s,
    which calls the class's `call`) reaches both."""
    for dense in model._flatten_layers():
        if not isinstance(dense, keras.layers.Dense):
            continue
        kernel = np.asarray(dense.kernel)
        parent = type(dense)

        def call(self, inputs, *args, parent=parent, kernel=kernel, **kwargs):
            def exact(rows):
                with tf.name_scope(CLS_SCOPE):
                    outputs = ops.matmul(rows, kernel)
                    return self.activation(outputs + self.bias if self.bias is not None else outputs)

            if len(inputs.shape) == 3 and inputs.shape[1] > 1:
                rest = parent.call(self, inputs[:, 1:], *args, **kwargs)
                return ops.concatenate([exact(inputs[:, :1]), rest], axis=1)
            return exact(inputs)

        dense.__class__ = type(f"FloatClsRows{parent.__name__}", (parent,), {"call": call})
    return model


def with_cls_residual_rows(model, layers=".*", skip=()):
    """`model` (changed in place) with the [cls] token's row quantised twice by every Dense layer
    whose path the regex `layers` finds but those at `skip` (the float ones: in float the trick
    double-counts): its quantisation residual (`dynamic_range_residual`) joins the layer's input
    as one more row, whose output, less the bias, is added to the [cls] row's. A dynamic-range
    file then computes the [cls] row as `(Q(x) + Q(x - Q(x))) W`, about 255 times finer than
    `Q(x) W`, for one row more in the same product (the [cls] row reaches the head; the others
    only through attention). In float the [cls] row is `(2x - Q(x)) W + b`, not exact: the
    rewrite is for int8 inputs only. The class becomes a subclass, as in `with_float_cls_rows`,
    so fc2's Hadamard reaches it."""
    for dense in model._flatten_layers():
        if not isinstance(dense, keras.layers.Dense):
            continue
        if dense.path in skip or not re.search(layers, dense.path):
            continue
        parent = type(dense)

        def call(self, inputs, *args, parent=parent, **kwargs):
            rows = inputs if len(inputs.shape) == 3 else ops.expand_dims(inputs, 1)

            def product(both):  # the class's call, which `int8_weights.dynamic_inputs` patches
                return parent.call(self, both, *args, **kwargs)

            with rotated_int8.without_activation(self) as activation:
                outputs = activation(_with_residual_row(rows, product, self))
            return outputs if len(inputs.shape) == 3 else ops.squeeze(outputs, 1)

        dense.__class__ = type(f"ClsResidualRow{parent.__name__}", (parent,), {"call": call})
    return model


def with_cls_split_mlp(model, skip=()):
    """`model` (changed in place) with each block's MLP run on the [cls] row apart from the other
    rows and the [cls] row quantised twice by fc1 and fc2 (`export.rotated_int8.ClsTwiceMlpBlock`,
    what the export ships). Layers at `skip` (float in the file) and an fc2 behind this script's
    own in-graph rotation (`_with_fc2_input_rotated`, which would rotate the residual row too)
    take the [cls] row once."""
    for block in model.blocks:
        if block.mlp != "mlp" or block.mlp_norm is not None:  # the split is fc1, its activation, fc2
            raise ValueError(f"{block.name}: the [cls] row's split is a plain MLP's, not {block.mlp!r}'s.")
    rotated = {block.fc2.path for block in model.blocks if "call" in vars(block.fc2)}
    return rotated_int8.with_cls_twice_mlp(model, once={*skip, *rotated})


def _with_residual_row(rows, product, dense):
    """`product` (`dense`'s kernel and bias, no activation) of `rows` and, as one more row, the
    first row's dynamic-range residual, whose output less the bias joins the first row's."""
    count = rows.shape[1]
    with tf.name_scope(rotated_int8.RESIDUAL_SCOPE):
        residual = rotated_int8.dynamic_range_residual(rows[:, :1])
    outputs = product(ops.concatenate([rows, residual], axis=1))
    extra = outputs[:, count:] - dense.bias if dense.bias is not None else outputs[:, count:]
    first = outputs[:, :1] + extra
    return ops.concatenate([first, outputs[:, 1:count]], axis=1) if count > 1 else first


def add_rotation_arguments(parser):
    """`--rotation-seed` and `--hadamard-blocks 7,8` (a list of indices, or None), which
    `int8_weights.py` takes too."""
    parser.add_argument("--rotation-seed", type=int, default=0, help="`rms_had64`'s random signs")
    parser.add_argument(
        "--hadamard-blocks",
        type=block_indices,
        default=None,
        metavar="7,8",
        help="`rms_had64`'s Hadamard on fc2's input in these blocks only (indices; all by default)",
    )


def block_indices(text):
    """`--hadamard-blocks`' "7,8" as `[7, 8]`; None (every block) when not given."""
    return None if text is None else [int(index) for index in text.split(",") if index]


def copy_of(model):
    copy = ViT.from_config(model.get_config())
    copy.set_weights(model.get_weights())
    return copy


SENSITIVE = "the most sensitive kernels in float"
SENSITIVE_KERNELS = 12

# The shipped `int8` and `dynamic`: every projection's input rotated online, but fc2's, rotated
# in the graph by `with_fc2_hadamard`.
ROTATED_HAD64 = (
    projections(DYNAMIC, ".*", ROTATED),
    projections(DYNAMIC, layer("fc2")),
    projections(None, "hadamard"),
)
# name: (the model the file is made from, its rules, whether the rules need calibration)
RECIPES = {
    "shipped": ("original", (projections(DYNAMIC, ".*", ROTATED),), False),
    "plain": ("original", (projections(DYNAMIC),), False),
    "rms": ("rms", (projections(DYNAMIC),), False),
    "rms_had64": ("rms had64", (projections(DYNAMIC), projections(None, "hadamard")), False),
    # fc2's whole input rotated (`with_fc2_full_rotation`), still no online rotation.
    "rms_had768": ("rms had768", (projections(DYNAMIC), projections(None, "hadamard")), False),
    "rotated_had64": ("original had64", ROTATED_HAD64, False),
    # `rotated_had64` with the head in float: 192 x 1000 multiply-adds a photo (0.02% of the
    # projections'), and its rounding alone the third dearest of the 49 kernels (ninth pass).
    "rotated_had64_head_float": (
        "original had64",
        (*ROTATED_HAD64, projections(None, op_name_pattern("head"))),
        False,
    ),
    # ... and block 0's MLP too (5.5% of the projections' multiply-adds; its fc2 and fc1 the two dearest).
    "rotated_had64_head_mlp0_float": (
        "original had64",
        (
            *ROTATED_HAD64,
            projections(None, "|".join(map(op_name_pattern, ("head", "block_0/fc1", "block_0/fc2")))),
        ),
        False,
    ),
    # `rotated_had64` again with random signs on the Hadamard's rows: as exact, other roundings
    # of fc2's kernels and inputs; how far the flips move between recipes equally good in float.
    **{
        f"rotated_had64_signs{seed}": (f"original had64 signs{seed}", ROTATED_HAD64, False)
        for seed in range(1, 5)
    },
    # proj's input rotated per head offline (`with_value_rotation`) instead of online.
    "rotated_had64_vrot": (
        "original had64 vrot",
        (*ROTATED_HAD64, projections(DYNAMIC, layer("proj"))),
        False,
    ),
    "rotated_had64_vrot_head_float": (
        "original had64 vrot",
        (*ROTATED_HAD64, projections(DYNAMIC, layer("proj")), projections(None, op_name_pattern("head"))),
        False,
    ),
    # No online rotation: the stream rotated offline, proj's input per head, fc2's in the graph.
    "rms_had64_vrot_head_float": (
        "rms had64 vrot",
        (projections(DYNAMIC), projections(None, "hadamard"), projections(None, op_name_pattern("head"))),
        False,
    ),
    "rotated_fc2_float": (
        "original",
        (projections(DYNAMIC, ".*", ROTATED), projections(None, layer("fc2"))),
        False,
    ),
    "rms_had64_gptq": (
        "rms had64",
        (projections(DYNAMIC, ".*", "GPTQ"), projections(None, "hadamard")),
        True,
    ),
    # `rotated_had64` with the kernels whose int8 rounding alone moves the calibration photos'
    # probabilities most kept in float (`int8_weights.sensitivity`; the rule is filled in `main`).
    "rotated_had64_sensitive12": ("original had64", SENSITIVE, False),
    "weight_only": ("original", (projections(WEIGHT_ONLY),), False),
    "rms_weight_only": ("rms", (projections(WEIGHT_ONLY),), False),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", required=True, help="a folder of ImageNet class folders (wnids)")
    parser.add_argument("--calibration", type=int, default=100)
    parser.add_argument("--images", type=int, default=1000, help="scored photos (more than there are: all)")
    parser.add_argument("--recipes", default=",".join(RECIPES))
    parser.add_argument("--save", default=None, help="a folder for fp32.tflite and each recipe's file")
    parser.add_argument(
        "--kernels",
        default=None,
        help="an .npz of kernels rounded beforehand (`int8_weights.py --save-kernels`, the same source "
        "model), put in the recipes' float model: its min/max rounding then keeps them as they are",
    )
    parser.add_argument(
        "--float-inputs",
        default="",
        help="comma-separated Dense layers (block_3/fc1, ...: `int8_weights.py --float-inputs`' choice) "
        "whose FULLY_CONNECTED stays float in every recipe; with --kernels their kernels are int8 levels "
        "already, so the op computes what a weight-only one would (whose dequantise op ai-edge-quantizer "
        "0.10 fails to insert beside dynamic-range ones)",
    )
    add_rotation_arguments(parser)
    parser.add_argument(
        "--cls-split-mlp", action="store_true",
        help="each block's MLP on the [cls] row apart, fc1 and fc2 quantising it twice "
        "(`with_cls_split_mlp`)",
    )  # fmt: skip
    parser.add_argument(
        "--float-cls", action="store_true",
        help="the [cls] token's row of every FULLY_CONNECTED in float, with the float kernel "
        "(`with_float_cls_rows`; `int8_weights.py --float-cls`)",
    )  # fmt: skip
    parser.add_argument(
        "--cls-residual", nargs="?", const=".*", default=None, metavar="LAYERS",
        help="the [cls] token's row quantised twice by every dynamic-range FULLY_CONNECTED (or those whose "
        "path the regex finds): its quantisation residual as one more row of the same product "
        "(`with_cls_residual_rows`)",
    )  # fmt: skip
    arguments = parser.parse_args()
    hadamard_blocks = arguments.hadamard_blocks

    model = keras_vit.create_model(MODEL, pretrained=True)
    calibration_paths, scored_paths = photos(arguments.dataset, arguments.calibration, arguments.images)
    images, labels = read(model, scored_paths), labels_of(model, scored_paths)
    calibration = [{"images": image[None]} for image in read(model, calibration_paths)]
    reference = keras_probabilities(model, images)
    print(json.dumps({"images": len(images), "fp32_accuracy": float((reference.argmax(1) == labels).mean())}))
    sources = {
        "original": lambda: model,
        "rms": lambda: rotate.rotated_copy(model, norm="rms"),
        "original had64": lambda: with_fc2_hadamard(copy_of(model)),
        "rms had64": lambda: with_fc2_hadamard(
            rotate.rotated_copy(model, seed=arguments.rotation_seed, norm="rms"), blocks=hadamard_blocks
        ),
        "rms had768": lambda: with_fc2_full_rotation(rotate.rotated_copy(model, norm="rms")),
        **{
            f"original had64 signs{seed}": lambda seed=seed: with_fc2_hadamard(copy_of(model), seed=seed)
            for seed in range(1, 5)
        },
        "original had64 vrot": lambda: with_value_rotation(with_fc2_hadamard(copy_of(model))),
        "rms had64 vrot": lambda: with_value_rotation(
            with_fc2_hadamard(rotate.rotated_copy(model, norm="rms"))
        ),
    }
    float_models = {}
    if arguments.save:
        os.makedirs(arguments.save, exist_ok=True)
        with open(os.path.join(arguments.save, "fp32.tflite"), "wb") as file:
            file.write(fp32(load_classifier(model)))
    for name in arguments.recipes.split(","):
        source, rules, calibrated = RECIPES[name]
        if rules == SENSITIVE:
            import int8_weights

            scores = int8_weights.sensitivity(model, read(model, calibration_paths))
            kept = sorted(scores, key=scores.get, reverse=True)[:SENSITIVE_KERNELS]
            rules = (
                *ROTATED_HAD64,
                projections(None, "|".join(map(op_name_pattern, kept))),
            )
        if arguments.float_inputs:
            paths = arguments.float_inputs.split(",")
            rules = (*rules, projections(None, "|".join(map(op_name_pattern, paths))))
        if arguments.float_cls:
            rules = (*rules, projections(None, CLS_SCOPE))
        start = time.perf_counter()
        if source not in float_models:
            built = sources[source]()
            if arguments.float_cls:
                with_float_cls_rows(built)
            float_layers = set(filter(None, arguments.float_inputs.split(",")))  # quantise nothing twice
            if arguments.cls_split_mlp:
                with_cls_split_mlp(built, skip=float_layers)
            if arguments.cls_residual:
                with_cls_residual_rows(built, arguments.cls_residual, skip=float_layers)
            if arguments.kernels:
                with np.load(arguments.kernels) as saved:
                    kernels = {path for path in saved.files if not path.endswith("/bias")}
                    for dense in built._flatten_layers():
                        if dense.path in kernels:
                            dense.kernel.assign(saved[dense.path])
                            dense.bias.assign(saved[dense.path + "/bias"])
                            kernels.remove(dense.path)
                if kernels:
                    raise SystemExit(f"{source} has no layers {sorted(kernels)} for {arguments.kernels}")
            exact = float(np.abs(keras_probabilities(built, images[:50]) - reference[:50]).max())
            float_models[source] = (fp32(load_classifier(built)), exact)
        float_model, exact = float_models[source]
        quantizer = quantize._quantizer(float_model, (*rules, *FLOAT_IO))
        with quantize._quantizer_quiet():
            result = quantizer.calibrate({"serving_default": calibration}) if calibrated else None
            flatbuffer = bytes(
                quantizer.quantize(
                    result, enable_progress_bar=False, enable_progress_report=False
                ).quantized_model
            )
        if arguments.save:
            with open(os.path.join(arguments.save, f"{name}.tflite"), "wb") as file:
                file.write(flatbuffer)
        predicted, _ = tflite_probabilities(flatbuffer, images)
        flips = int((predicted.argmax(1) != reference.argmax(1)).sum())
        row = {
            "recipe": name,
            "kernels": arguments.kernels,
            "float_inputs": arguments.float_inputs or None,
            "hadamard_blocks": hadamard_blocks,
            "rotation_seed": arguments.rotation_seed,
            "float_cls": arguments.float_cls,
            "cls_residual": arguments.cls_residual,
            "cls_split_mlp": arguments.cls_split_mlp,
            "agreement": 1 - flips / len(images),
            "flips": flips,
            "kl": kl_divergence(reference, predicted),  # finer than flips (twentieth pass)
            "accuracy": float((predicted.argmax(1) == labels).mean()),
            "float_max_abs_diff_of_the_rewrite": exact,
            "seconds": round(time.perf_counter() - start, 1),
        }
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
