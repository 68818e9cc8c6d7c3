"""What rotating a ViT's residual stream offline (`keras_vit.export.rotate`) buys a full-integer
TFLite model (issue 49), on timm's ViT-Ti and real photos.

For the original model and its rotated copies (`--variants`: `rotated_copy(norm=...)`, "rms":
QuaRot's randomised Hadamard with RMSNorms; "l2": the same with one L2_NORMALIZATION per norm;
"layer": the mean-keeping rotation with the LayerNorms kept):
1. float exactness: the largest difference of the Keras probabilities from the original's;
2. ranges, in Keras on the calibration photos: the residual stream's per-channel max |x| after
   each block, each norm's input range and its per-token statistic (variance, or mean square),
   and fc2's input;
3. the TFLite converter's full-integer model (int8 per-channel weights, int8 per-tensor activations
   in every op, uint8 pixels in, float probabilities out; `Optimize.DEFAULT`, a representative
   dataset of the calibration photos, `TFLITE_BUILTINS_INT8` only): its ops, and its top-1
   agreement with the original's fp32 Keras model (and accuracy) on photos calibration did not use;
4. `--sensitivity`: everything int8, then each op group in turn left in float (ai-edge-quantizer,
   the ranges calibrated once: `export.quantize`), on the first `--sensitivity-images` scored photos;
5. `--token-scales-from B`: an experiment on the l2 copy, the tokens the stream makes massive
   (`rotate.massive_tokens`) scaled down from block B on (`rotate.with_massive_tokens`);
   `--split-massive-units` splits that block's massive MLP units too, `--per-head-attention`
   gives each head its own ops (`rotate.with_per_head_attention`);
6. `--only-one` (with `--sensitivity`): each op group alone in int8 too; `--skip-full-int8` leaves
   out step 3; `--save-tflite DIR` writes the original's fp32 model and each full-integer one.

    unzip ../shared/datasets/imagenette2_224_val.zip -d /tmp/imagenette
    HF_HUB_OFFLINE=1 python benchmarks/int8_rotation.py --dataset /tmp/imagenette/imagenette2_224/val \\
        --calibration 100 --images 500 --variants original,l2,rms,layer
    HF_HUB_OFFLINE=1 python benchmarks/int8_rotation.py --dataset /tmp/imagenette/imagenette2_224/val \\
        --calibration 100 --images 200 --variants l2 --sensitivity
    HF_HUB_OFFLINE=1 python benchmarks/int8_rotation.py --dataset /tmp/imagenette/imagenette2_224/val \\
        --calibration 100 --images 200 --variants '' --token-scales-from 7

The results go to `--output` (JSON); docs/benchmarks/int8.md reports them.

Photos: a seeded permutation of every photo under `--dataset`; the first `--calibration` calibrate,
the next `--images` are scored.
"""

import argparse
import collections
import json
import os
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_vit  # noqa: E402
from keras_vit import framework_logs  # noqa: E402
from keras_vit.data import images as image_files  # noqa: E402
from keras_vit.data.contract import InputContract  # noqa: E402
from keras_vit.export import quantize, rotate, tflite, tflite_graph  # noqa: E402
from keras_vit.inference.classifier import load_classifier  # noqa: E402
from keras_vit.model import pretrained  # noqa: E402

MODEL = "vit_tiny_patch16_224"


def photos(folder, calibration, count, seed=0):
    """`(calibration pixels, scored pixels, scored labels as ImageNet indices, class wnids)`."""
    paths = sorted(image_files.image_files(folder, recursive=True))
    order = np.random.default_rng(seed).permutation(len(paths))
    chosen = [paths[i] for i in order[: calibration + count]]
    return chosen[:calibration], chosen[calibration:]


def read(model, paths):
    contract = InputContract.of(model)
    return np.stack([contract.read(path) for path in paths])


def labels_of(model, paths):
    ids = pretrained.wordnet_ids(model.class_names)
    return np.array([ids.index(os.path.basename(os.path.dirname(path))) for path in paths])


def keras_probabilities(model, images, batch=25):
    outputs = [
        keras.ops.convert_to_numpy(keras.ops.softmax(model(images[i : i + batch], training=False)))
        for i in range(0, len(images), batch)
    ]
    return np.concatenate(outputs)


def ranges(model, images, batch=16):
    """In Keras: the residual stream's per-channel max |x| after each block; each norm's input
    min and max and its per-token statistic's min and max (the variance of a LayerNorm, the mean
    square of an RMSNorm: equal on a mean-free stream); fc2's input max |x|."""
    classes = (keras.layers.LayerNormalization, rotate.RMSNorm, rotate.L2Norm)
    statistics = (lambda x: x.var(-1), lambda x: (x**2).mean(-1), lambda x: (x**2).mean(-1))
    norm_calls = [cls.call for cls in classes]
    dense_call = keras.layers.Dense.call
    found = collections.defaultdict(list)

    def norm_recorder(original, statistic):
        def call(self, inputs):
            x = keras.ops.convert_to_numpy(inputs)
            found[f"{self.path}"].append((x.min(), x.max(), statistic(x).min(), statistic(x).max()))
            return original(self, inputs)

        return call

    def dense(self, inputs, training=None):
        if self.name == "fc2":
            found[self.path].append((np.abs(keras.ops.convert_to_numpy(inputs)).max(),))
        return dense_call(self, inputs, training=training)

    for cls, call, statistic in zip(classes, norm_calls, statistics, strict=True):
        cls.call = norm_recorder(call, statistic)
    keras.layers.Dense.call = dense
    try:
        streams = keras.Model(model.inputs, [block.output for block in model.blocks])
        channel_max = np.zeros((model.depth, model.hidden_dim))
        for i in range(0, len(images), batch):
            for depth, x in enumerate(streams([images[i : i + batch]])):
                channel_max[depth] = np.maximum(
                    channel_max[depth], np.abs(keras.ops.convert_to_numpy(x)).max((0, 1))
                )
            model(images[i : i + batch], training=False)
    finally:
        for cls, call in zip(classes, norm_calls, strict=True):
            cls.call = call
        keras.layers.Dense.call = dense_call
    per_layer = {}
    for path, rows in found.items():
        rows = np.array(rows, dtype=np.float64)
        if rows.shape[1] == 1:
            per_layer[path] = {"max_abs": float(rows[:, 0].max())}
        else:
            per_layer[path] = {
                "min": float(rows[:, 0].min()),
                "max": float(rows[:, 1].max()),
                "statistic_min": float(rows[:, 2].min()),
                "statistic_max": float(rows[:, 3].max()),
            }
    return {
        "stream_channel_max": channel_max.tolist(),
        "layers": per_layer,
    }


def full_int8(classifier, calibration_images):
    """The TFLite converter's full-integer model: every op int8 (`TFLITE_BUILTINS_INT8`)."""
    with tempfile.TemporaryDirectory(prefix="keras-vit-int8-") as folder:
        converter = tflite._converter(classifier, folder, input_dtype="float32")
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = lambda: (
            [image[None].astype(np.float32)] for image in calibration_images
        )
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        converter.inference_input_type = tf.uint8
        with framework_logs.native_lines_muted():
            return converter.convert()


def fp32(classifier):
    with tempfile.TemporaryDirectory(prefix="keras-vit-fp32-") as folder:
        converter = tflite._converter(classifier, folder, input_dtype="float32")
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
        return converter.convert()


def tflite_probabilities(flatbuffer, images):
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=flatbuffer, num_threads=2)
    interpreter.allocate_tensors()
    given, output = interpreter.get_input_details()[0], interpreter.get_output_details()[0]
    results, start = [], time.perf_counter()
    for image in images:
        interpreter.set_tensor(given["index"], quantize._as_input(image, given["dtype"]))
        interpreter.invoke()
        values = interpreter.get_tensor(output["index"])[0].astype(np.float32)
        scale, zero_point = output["quantization"]
        results.append((values - zero_point) * scale if output["dtype"] != np.float32 else values)
    return np.stack(results), 1000 * (time.perf_counter() - start) / len(images)


def op_counts(flatbuffer):
    counts = collections.Counter(name for name, _, _ in tflite_graph.ops(flatbuffer))
    return dict(sorted(counts.items(), key=lambda item: -item[1]))


def norm_groups(norm):
    """The norm's op groups in the TFLite graph (the family's LayerNorm groups, or an RMSNorm's)."""
    layer = r"/norm\d?(_\d+)?/"
    if norm == "rms":
        return {
            "RMSNorm statistics": ((layer + r"(mul|Mean|add|Rsqrt)(;|$)", "*"),),
            "RMSNorm normalisation": ((layer + r"mul_1(;|$)", "*"),),
        }
    if norm == "l2":
        return {"L2 norms": ((".*", "L2_NORMALIZATION"),)}
    return {}


def sensitivity(classifier, norm, calibration_images, images, reference, only=False):
    """Top-1 agreement with everything int8 (ai-edge-quantizer), then with each op group left in
    float (and with `only`, each op group alone in int8): the cheap form of a per-op sensitivity
    check."""
    from keras_vit.model.registry import family_of

    calibration = tflite.Calibration(classifier, calibration_images, "uint8")
    own = {
        group: tuple(quantize.Rule(*ops, 8) for ops in patterns)
        for group, patterns in norm_groups(norm).items()
    }
    groups = {**quantize.groups(family_of(classifier.model)), **own}
    rows = [("everything int8", quantize.INT8)]
    for group, rules in groups.items():
        if quantize.matching_ops(calibration.float_model, rules):
            rows.append(
                (f"everything int8 but {group} (float)", (*quantize.INT8, *quantize.with_bits(rules, None)))
            )
            if only:
                rows.append((f"only {group} int8", quantize.with_bits(rules, 8)))
    found = []
    for name, rules in rows:
        try:
            model = quantize.quantize(calibration.float_model, rules, calibration.ranges)
        except ValueError as error:  # an op the quantizer has no int8 kernel for (L2_NORMALIZATION)
            found.append({"recipe": name, "unsupported": str(error)})
            continue
        predicted, _ = tflite_probabilities(model, images)
        found.append(
            {
                "recipe": name,
                "agreement": float((predicted.argmax(1) == reference.argmax(1)).mean()),
                "float_ops": len(tflite_graph.float_ops(model)),
            }
        )
        print(json.dumps(found[-1]), flush=True)
    return found


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dataset", required=True, help="a folder of ImageNet class folders (wnids)")
    parser.add_argument("--calibration", type=int, default=100)
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--range-images", type=int, default=64, help="calibration photos the ranges use")
    parser.add_argument("--seed", type=int, default=0, help="the rotation's random signs")
    parser.add_argument(
        "--variants", default="original,rms,l2,layer", help="the original and the rotated copies' norms"
    )
    parser.add_argument("--sensitivity", action="store_true")
    parser.add_argument(
        "--token-scales-from",
        type=int,
        default=None,
        help="also the l2 copy with the massive tokens scaled by 1/32 from this block on",
    )
    parser.add_argument(
        "--split-massive-units",
        action="store_true",
        help="with --token-scales-from: that block's massive MLP units scaled per token too",
    )
    parser.add_argument(
        "--per-head-attention",
        action="store_true",
        help="with --token-scales-from: each head's matmuls and softmax its own ops (its own scales)",
    )
    parser.add_argument("--sensitivity-images", type=int, default=300)
    parser.add_argument(
        "--only-one", action="store_true", help="with --sensitivity: also each op group alone in int8"
    )
    parser.add_argument(
        "--skip-full-int8", action="store_true", help="no converter model (for a sensitivity run)"
    )
    parser.add_argument("--output", default="int8_rotation.json")
    parser.add_argument(
        "--save-tflite",
        default=None,
        help="a folder: the original's fp32 model and each variant's full-integer one go there",
    )
    arguments = parser.parse_args()

    model = keras_vit.create_model(MODEL, pretrained=True)
    calibration_paths, scored_paths = photos(arguments.dataset, arguments.calibration, arguments.images)
    calibration_images, images = read(model, calibration_paths), read(model, scored_paths)
    labels = labels_of(model, scored_paths)
    reference = keras_probabilities(model, images)
    report = {
        "model": MODEL,
        "calibration": len(calibration_images),
        "images": len(images),
        "fp32_accuracy": float((reference.argmax(1) == labels).mean()),
        "variants": {},
    }
    if arguments.save_tflite:
        os.makedirs(arguments.save_tflite, exist_ok=True)
        with open(os.path.join(arguments.save_tflite, "original_fp32.tflite"), "wb") as file:
            file.write(fp32(load_classifier(model)))
    variants = {}
    for name in filter(None, arguments.variants.split(",")):
        if name == "original":
            variants[name] = model
        else:
            variants[f"rotated ({name})"] = rotate.rotated_copy(model, seed=arguments.seed, norm=name)
    if arguments.token_scales_from is not None:
        block = arguments.token_scales_from
        copy = rotate.rotated_copy(model, seed=arguments.seed, norm="l2")
        tokens = rotate.massive_tokens(copy, calibration_images[:32], block)
        print("massive tokens", tokens.tolist(), flush=True)
        units = (
            rotate.massive_units(copy, calibration_images[:32], block)
            if arguments.split_massive_units
            else np.array([], int)
        )
        name = f"rotated (l2), tokens {tokens.tolist()} / 32 from block {block}"
        name += f", MLP units {units.tolist()} split" if len(units) else ""
        variants[name] = rotate.with_massive_tokens(copy, tokens, block, units=units)
        if arguments.per_head_attention:
            variants[f"{name}, per-head attention"] = rotate.with_per_head_attention(variants.pop(name))
    for name, variant in variants.items():
        start = time.perf_counter()
        result = {}
        probabilities = reference if variant is model else keras_probabilities(variant, images)
        result["float_max_abs_diff"] = float(np.abs(probabilities - reference).max())
        result["float_agreement"] = float((probabilities.argmax(1) == reference.argmax(1)).mean())
        classifier = load_classifier(variant)
        if not arguments.skip_full_int8:
            result["ranges"] = ranges(variant, calibration_images[: arguments.range_images])
            result["fp32_ops"] = op_counts(fp32(classifier))
            int8 = full_int8(classifier, calibration_images)
            if arguments.save_tflite:
                os.makedirs(arguments.save_tflite, exist_ok=True)
                slug = "".join(c if c.isalnum() else "_" for c in name)[:60].strip("_")
                with open(os.path.join(arguments.save_tflite, f"{slug}_int8.tflite"), "wb") as file:
                    file.write(int8)
            result["int8_ops"] = op_counts(int8)
            result["int8_float_ops"] = len(tflite_graph.float_ops(int8))
            predicted, milliseconds = tflite_probabilities(int8, images)
            result["int8_agreement"] = float((predicted.argmax(1) == reference.argmax(1)).mean())
            result["int8_accuracy"] = float((predicted.argmax(1) == labels).mean())
            result["int8_max_abs_diff"] = float(np.abs(predicted - reference).max())
            result["int8_ms_per_image"] = milliseconds
        if arguments.sensitivity:
            count = arguments.sensitivity_images
            norm = name[len("rotated (") :].split(")")[0] if name.startswith("rotated") else "layer"
            result["sensitivity"] = sensitivity(
                classifier, norm, calibration_images, images[:count], reference[:count], arguments.only_one
            )
        result["seconds"] = time.perf_counter() - start
        report["variants"][name] = result
        summary = {
            key: value for key, value in result.items() if key not in ("ranges", "fp32_ops", "int8_ops")
        }
        print(name, json.dumps(summary), flush=True)
        with open(arguments.output, "w") as file:
            json.dump(report, file, indent=1)


if __name__ == "__main__":
    main()
