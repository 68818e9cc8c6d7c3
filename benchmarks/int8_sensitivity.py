"""Which parts of a ViT (or a Swin) survive int8? Quantises one op group, or one block, at a time
and measures it.

For a trained model: the fp32 `.tflite` (uint8 pixels in, as `keras-vit export` writes it) is
calibrated once (min/max over the calibration images), then quantised by one recipe per row:
- everything in int8, and everything with int16 activations;
- dynamic-range int8 in every FULLY_CONNECTED, with min/max and with rotated weights;
- each op group of the model's family (`quantize.groups(family)`) alone in int8, the rest in float;
- everything in int8 but that group (kept in float);
- on the 16-bit base (`quantize.base_16(family)`: int16 activations, LayerNorm's statistics in
  float), that group in int8: the rows the shipped `int8` recipe is read from;
- each layer group of the family (the patch embedding, each block) alone in int8;
- the variants `keras-vit export` ships.

Each row gives top-1 agreement with fp32 and the accuracy change on the held-out images that
verification uses. The report goes to docs/benchmarks/int8.md, one section per model.

    python benchmarks/int8_sensitivity.py runs/quickstart-... [--images 500] [--calibration 200]
    # a pretrained checkpoint (any name `keras-vit export` takes) on a folder of photos; ImageNet
    # folders named by WordNet id (n01440764, ...) are scored against the model's 1000 classes
    python benchmarks/int8_sensitivity.py local-dir:PATH --dataset /work/data/imagenette2_224/val \
        --images 394 --calibration 100 --skip-16-bit
"""

import argparse
import os
import re
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

from keras_vit.data.contract import InputContract  # noqa: E402
from keras_vit.export import quantize, tflite, tflite_graph  # noqa: E402
from keras_vit.export.verify import held_out_images  # noqa: E402
from keras_vit.inference.classifier import load_classifier  # noqa: E402
from keras_vit.model import pretrained, registry  # noqa: E402
from keras_vit.storage.export_folder import VERIFY_IMAGES  # noqa: E402
from keras_vit.storage.locate import locate  # noqa: E402
from keras_vit.storage.run_folder import RunFolder  # noqa: E402

REPORT = os.path.join(os.path.dirname(__file__), "..", "docs", "benchmarks", "int8.md")


def probabilities(flatbuffer, images):
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=flatbuffer)
    interpreter.allocate_tensors()
    given, output = interpreter.get_input_details()[0], interpreter.get_output_details()[0]
    results = []
    for image in images:
        interpreter.set_tensor(given["index"], quantize._as_input(image, given["dtype"]))
        interpreter.invoke()
        values = interpreter.get_tensor(output["index"])[0].astype(np.float32)
        scale, zero_point = output["quantization"]
        results.append((values - zero_point) * scale if output["dtype"] != np.float32 else values)
    return np.stack(results)


def recipes(model, float_model, skip_16_bit=False):
    """`(row name, rules)` in the table's order (`skip_16_bit`: none with 16-bit activations,
    whose reference kernels take a real model half a second an image). The family's op groups
    that select no op of `float_model` (its fp32 `.tflite`) have no rows: parts this model lacks
    (a hybrid's stem, SwiGLU's gate, attention pooling, a relative position bias)."""
    family = registry.family_of(model)
    groups = {
        group: rules
        for group, rules in quantize.groups(family).items()
        if quantize.matching_ops(float_model, rules)
    }
    rows = [("everything int8", quantize.INT8), ("everything int16", quantize.INT16)]
    # Dynamic-range int8 (activations quantised token by token at run time) in every projection,
    # with min/max weights and with Hadamard-rotated ones (`quantize.ROTATED`).
    for name, algorithm in (("min/max", "min_max_uniform_quantize"), ("rotated", quantize.ROTATED)):
        rules = (quantize.Rule(".*", "FULLY_CONNECTED", quantize.DYNAMIC, algorithm), *quantize.FLOAT_IO)
        rows.append((f"dynamic-range int8 projections, {name} weights", rules))
    for group, rules in groups.items():
        rows.append((f"only {group} int8", (*rules, *quantize.FLOAT_IO)))
    for group, rules in groups.items():
        rows.append(
            (f"everything int8 but {group} (float)", (*quantize.INT8, *quantize.with_bits(rules, None)))
        )
    for group, rules in groups.items():
        rows.append((f"16-bit base, {group} int8", (*quantize.base_16(family), *rules)))
    layer_groups, _ = family.layer_groups(model)
    for layer in layer_groups:  # the patch embedding, then each block (a layer with no op: none)
        if quantize.matching_ops(float_model, quantize.layer_rules(layer)):
            rows.append((f"only {layer} int8", (*quantize.layer_rules(layer), *quantize.FLOAT_IO)))
    if skip_16_bit:
        rows = [(name, rules) for name, rules in rows if all(rule.activation_bits != 16 for rule in rules)]
    return rows


def model_labels(classifier, labels, class_names):
    """`labels` (indices into the dataset's `class_names`) as the model's class indices: the
    same when the dataset is the model's; by WordNet id for ImageNet folders and a 1000-class
    model; None (agreement only) when neither."""
    if list(class_names) == list(classifier.class_names):
        return labels
    ids = pretrained.wordnet_ids(classifier.class_names) or []
    if all(name in ids for name in class_names):
        return np.array([ids.index(class_names[label]) for label in labels])
    return None


def measure(classifier, spec, image_count, calibration_count, skip_16_bit=False):
    _, images, labels, split, names = held_out_images(spec, InputContract.of(classifier), limit=image_count)
    labels = model_labels(classifier, labels, names)
    if labels is None:
        labels = np.full(len(images), -1)  # agreement only: every accuracy is 0
    representative = tflite.representative_images(spec, InputContract.of(classifier), count=calibration_count)
    start = time.perf_counter()
    calibration = tflite.Calibration(classifier, representative, "uint8")
    calibration_seconds = time.perf_counter() - start
    float_model, ranges = calibration.float_model, calibration.ranges
    reference = probabilities(float_model, images)
    made = {}
    for name, rules in recipes(classifier.model, float_model, skip_16_bit):
        if not quantize.matching_ops(float_model, rules):
            raise ValueError(f"{name}: its rules match no op; were the layers renamed?")
        made[name] = lambda rules=rules: quantize.quantize(float_model, rules, ranges)
    for variant in ("dynamic", *tflite.INTEGER_VARIANTS):  # what `keras-vit export --quantize` ships
        if skip_16_bit and variant == "int16x8":
            continue
        made[f"shipped `{variant}`"] = lambda v=variant: tflite.convert(classifier, v, calibration)
    rows = []
    for name, make in made.items():
        quantized = make()
        predicted = probabilities(quantized, images)
        rows.append(
            {
                "recipe": name,
                "agreement": float((predicted.argmax(1) == reference.argmax(1)).mean()),
                "accuracy_change": float(
                    (predicted.argmax(1) == labels).mean() - (reference.argmax(1) == labels).mean()
                ),
                "float_ops": len(tflite_graph.float_ops(quantized)),
            }
        )
        print(rows[-1], flush=True)
    return {
        "split": split,
        "count": len(labels),
        "accuracy": float((reference.argmax(1) == labels).mean()),
        "calibration_seconds": calibration_seconds,
        "rows": rows,
    }


def section(model, command, result, spec):
    lines = [
        f"<!-- model: {model} -->",
        f"## {model}",
        "",
        f"`{command}`: {result['count']} held-out images of {spec.name} [{result['split']}], fp32 accuracy "
        f"{result['accuracy']:.1%}; calibrated on {result['calibration_images']} training images "
        f"({result['calibration_seconds']:.0f} s).",
        "",
        "| recipe | top-1 agreement with fp32 | accuracy change | ops left in float |",
        "|---|---|---|---|",
    ]
    for row in result["rows"]:
        lines.append(
            f"| {row['recipe']} | {row['agreement']:.1%} | {100 * row['accuracy_change']:+.1f} pt "
            f"| {row['float_ops']} |"
        )
    return "\n".join(lines) + f"\n<!-- end: {model} -->\n"


def write_report(model, text):
    """Replaces this model's section of the report (or adds it), keeping the others."""
    header = (
        "# Int8 sensitivity: which parts of a ViT survive integer quantisation\n\n"
        "Made by `benchmarks/int8_sensitivity.py` (its docstring says how). Weights are int8 per "
        "channel in every row; a row's recipe says which ops get int8 activations; every other op "
        "stays in float.\n\n"
    )
    old = open(REPORT).read() if os.path.exists(REPORT) else header
    pattern = re.compile(rf"<!-- model: {re.escape(model)} -->.*?<!-- end: {re.escape(model)} -->\n", re.S)
    new = pattern.sub(lambda _: text, old) if pattern.search(old) else old.rstrip("\n") + "\n\n" + text
    with open(REPORT, "w") as f:
        f.write(new)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a run folder or .keras file")
    parser.add_argument("--dataset", help="default: the run's dataset")
    parser.add_argument(
        "--images", type=int, default=VERIFY_IMAGES, help=f"held-out images (default {VERIFY_IMAGES})"
    )
    parser.add_argument("--calibration", type=int, default=200, help="calibration images (default 200)")
    parser.add_argument("--skip-16-bit", action="store_true", help="no row with 16-bit activations")
    args = parser.parse_args()

    classifier = load_classifier(args.model)
    spec = RunFolder(locate(args.model).folder).dataset_spec().with_name(args.dataset)
    result = measure(classifier, spec, args.images, args.calibration, args.skip_16_bit)
    result["calibration_images"] = args.calibration
    command = "python benchmarks/int8_sensitivity.py " + " ".join(sys.argv[1:])
    text = section(f"{classifier.name} ({args.model})", command, result, spec)
    print(text)
    write_report(f"{classifier.name} ({args.model})", text)


if __name__ == "__main__":
    main()
