"""Proof that every export agrees with Keras, on real held-out images.

For each exported file, on the dataset's test split (else validation): top-1
agreement with Keras, the max absolute difference of probabilities, accuracy,
and for TFLite the size, batch-1 latency under LiteRT and the ops left in float.
The SavedModel is fed the images' encoded bytes through `serving_default`,
exactly as a TF Serving REST request delivers them. Results go to `verification.json` and
`verification.md` beside the exports; a variant below its target is flagged.
"""

import os
import time

import numpy as np
import tensorflow as tf

from keras_vit.data.contract import InputContract
from keras_vit.export import tflite_graph
from keras_vit.files import atomic_write, write_json
from keras_vit.inference.evaluate import model_columns
from keras_vit.inference.runtimes import KerasRunner, open_model
from keras_vit.storage.export_folder import VERIFICATION_FILES, VERIFY_IMAGES, ExportFolder
from keras_vit.storage.locate import locate

# Per kind of export: (max |probability difference|, min top-1 agreement, max accuracy drop).
TARGETS = {
    "saved_model": (1e-4, None, None),
    "onnx": (1e-4, None, None),
    "tflite_fp32": (1e-4, None, None),
    "tflite_attention": (1e-4, None, None),
    "tflite_fp16": (1e-2, 0.995, None),
    "tflite_dynamic": (None, 0.99, 0.01),
    "tflite_int8": (None, 0.99, 0.01),
    "tflite_int16x8": (None, 0.99, 0.01),
    "tflite_int8_strict": (None, 0.99, 0.01),
}


def held_out_images(spec, contract, split=None, limit=VERIFY_IMAGES):
    """A seeded sample of a held-out split (`spec.held_out`): encoded bytes, float32 pixels and labels,
    the pixels read by the model's input `contract` (an `InputContract`).

    Returns:
        `(encoded, images, labels, split, class_names)`: a list of bytes,
        `(n, h, w, 3)` float32 pixels in [0, 255] resized as in training, int
        labels, the split's name and the dataset's class names.
    """
    folder, split = spec.held_out(split)
    pairs = list(folder[split].to_dataset().as_numpy_iterator())
    order = np.random.default_rng(spec.seed).permutation(len(pairs))[: limit or len(pairs)]
    encoded, images, labels = [], [], []
    for index in sorted(order):
        image, label = pairs[index]
        if not isinstance(image, bytes):  # tfds gives decoded uint8 arrays
            image = tf.io.encode_png(image).numpy()
        encoded.append(image)
        images.append(contract.decode_and_resize(tf.constant(image)).numpy())
        labels.append(int(label))
    return encoded, np.stack(images), np.asarray(labels), split, list(folder.class_names)


def latency_ms(runner, image, repeats=30):
    runner.predict(image[None])  # warm-up: XNNPACK builds its graph on the first run
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        runner.predict(image[None])
        times.append(time.perf_counter() - start)
    return 1000 * float(np.median(times))


def _accuracy(probabilities, labels):
    """Top-1 accuracy; None with no labels of the model's classes (agreement only)."""
    return None if labels is None else float((probabilities.argmax(1) == labels).mean())


def _compare(name, probabilities, reference, labels):
    difference = float(np.abs(probabilities - reference).max())
    agreement = float((probabilities.argmax(1) == reference.argmax(1)).mean())
    accuracy, reference_accuracy = _accuracy(probabilities, labels), _accuracy(reference, labels)
    max_difference, min_agreement, max_drop = TARGETS[name]
    if labels is None:
        max_drop = None
    failures = []
    if max_difference is not None and difference > max_difference:
        failures.append(f"max |difference| {difference:.2e} > {max_difference:.0e}")
    if min_agreement is not None and agreement < min_agreement:
        failures.append(f"top-1 agreement {agreement:.2%} < {min_agreement:.1%}")
    if max_drop is not None and reference_accuracy - accuracy > max_drop:
        failures.append(
            f"accuracy {accuracy:.2%} is more than {max_drop:.0%} below Keras' {reference_accuracy:.2%}"
        )
    return {
        "max_abs_difference": difference,
        "top1_agreement": agreement,
        "accuracy": accuracy,
        "meets_target": not failures,
        "failures": failures,
    }


def _compare_attention(result, runner, reference_runner, images):
    """The attention-rollout maps of the attention model against Keras' (same 1e-4 target)."""
    _, maps = runner.predict_attention(images)
    _, reference_maps = reference_runner.predict_attention(images)
    difference = float(np.abs(maps - reference_maps).max())
    result["attention_max_abs_difference"] = difference
    limit = TARGETS["tflite_attention"][0]
    if difference > limit:
        result["failures"].append(f"attention map max |difference| {difference:.2e} > {limit:.0e}")
        result["meets_target"] = False


def verify_exports(keras_model, files, spec, split=None, limit=VERIFY_IMAGES, agreement_only=False):
    """Runs Keras and each exported file on held-out images and compares them.

    Args:
        keras_model: a `.keras` path, run folder or Keras model: the reference.
        files: `{name: path}`, names from `TARGETS` (`saved_model`, `onnx`,
            `tflite_fp32`, ...).
        spec: the `DatasetSpec` the model was trained on: its held-out images are used.
        agreement_only: the images may be of other classes than the model's (a pretrained
            model checked on whatever images there are): agreement and differences only,
            no accuracy. Images of some of the model's classes (ImageNet photos in folders named
            by WordNet id, for an ImageNet model) are scored among all the model's classes.

    Returns:
        The report: `{"dataset", "split", "count", "keras_accuracy", "results": {name: {...}}, "passed"}`.
    """
    reference_runner = KerasRunner(keras_model)
    encoded, images, labels, split, class_names = held_out_images(
        spec, InputContract.of(reference_runner), split, limit
    )
    labels = _as_model_classes(labels, class_names, reference_runner.class_names)
    labelled = labels is not None
    if not labelled and not agreement_only:
        raise ValueError(
            f"The model's classes {reference_runner.class_names} differ from {spec.name}'s {class_names}; "
            f"verify on the dataset the model was trained on (--dataset)."
        )
    reference = reference_runner.predict(images)
    results = {}
    for name, path in files.items():
        runner = open_model(path)
        if list(runner.class_names) != list(reference_runner.class_names):
            raise ValueError(
                f"{path} carries class names {runner.class_names}, not the model's "
                f"{reference_runner.class_names}."
            )
        if name == "saved_model":
            probabilities = runner.predict_bytes(encoded)["probabilities"]
        else:
            probabilities = runner.predict(images)
        result = _compare(name, probabilities, reference, labels)
        if name == "tflite_attention":
            _compare_attention(result, runner, reference_runner, images[:50])
        result["file"] = os.path.basename(os.path.normpath(path))
        if os.path.isfile(path):
            result["bytes"] = os.path.getsize(path)
        if name.startswith("tflite_"):
            result["latency_ms"] = latency_ms(runner, images[0])
            with open(path, "rb") as f:
                result["float_ops"] = len(tflite_graph.float_ops(f.read()))
            result["xnnpack_ops"], result["ops_outside_xnnpack"], _ = runner.delegation()
        results[name] = result
    return {
        "dataset": str(spec.name),
        "split": split,
        "count": int(len(images)),
        "keras_accuracy": _accuracy(reference, labels),
        # Of how many classes the model chose: more than the dataset has for ImageNet photos.
        "model_classes": len(reference_runner.class_names),
        "dataset_classes": len(class_names),
        "results": results,
        "passed": all(r["meets_target"] for r in results.values()),
    }


def _as_model_classes(labels, class_names, model_classes):
    """The dataset's labels as the model's outputs; None when some class is none of the model's."""
    columns = model_columns(model_classes, class_names)
    return None if columns is None else np.asarray(columns)[labels]


def format_table(report):
    """The report as a Markdown table."""
    scored = (
        f"Keras accuracy {report['keras_accuracy']:.2%}."
        if report["keras_accuracy"] is not None
        else "agreement only: the images are not of the model's classes."
    )
    if report["keras_accuracy"] is not None and report.get("model_classes", 0) > report.get(
        "dataset_classes", 0
    ):
        scored = f"{scored[:-1]} among the model's {report['model_classes']} classes."
    lines = [
        f"Verified on {report['count']} images of {report['dataset']} [{report['split']}]; {scored}",
        "",
        "| export | max abs diff | top-1 agreement | accuracy | size (MB) | batch-1 latency (ms) "
        "| ops in float | ops on XNNPACK / outside | target |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in report["results"].items():
        size = f"{r['bytes'] / 1e6:.2f}" if "bytes" in r else ""
        latency = f"{r['latency_ms']:.2f}" if "latency_ms" in r else ""
        float_ops = str(r["float_ops"]) if "float_ops" in r else ""
        delegated = f"{r['xnnpack_ops']} / {r['ops_outside_xnnpack']}" if "xnnpack_ops" in r else ""
        verdict = "met" if r["meets_target"] else "**BELOW TARGET**: " + "; ".join(r["failures"])
        lines.append(
            f"| {name} | {r['max_abs_difference']:.2e} | {r['top1_agreement']:.2%} "
            f"| {_percent(r['accuracy'])} | {size} | {latency} | {float_ops} | {delegated} | {verdict} |"
        )
    return "\n".join(lines) + "\n"


def _percent(value):
    return "n/a" if value is None else f"{value:.2%}"


def write_report(report, folder):
    report_json, report_table = VERIFICATION_FILES
    write_json(os.path.join(folder, report_json), report)

    def write_table(temporary):
        with open(temporary, "w") as f:
            f.write(format_table(report))

    atomic_write(os.path.join(folder, report_table), write_table)


def reverify(folder, model=None, dataset=None, limit=VERIFY_IMAGES):
    """Verifies an export folder (`OUTPUT/<name>/export-<N>`) again; rewrites its reports."""
    export = ExportFolder(folder)
    spec = export.dataset_spec().with_name(dataset)
    source = model or export.manifest["source"]
    agreement_only = model is None and locate(source).kind == "pretrained"
    report = verify_exports(source, export.exports(), spec, limit=limit, agreement_only=agreement_only)
    write_report(report, folder)
    return report
