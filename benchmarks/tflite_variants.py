"""TFLite variants of a trained model: size, LiteRT batch-1 latency, agreement with Keras, accuracy.

Every variant `keras-vit export` can write, and the integer ones calibrated on 4x the images
too (does more calibration help?). What each op group costs in int8: int8_sensitivity.py.

    python benchmarks/tflite_variants.py runs/quickstart-... [--dataset cifar10-mini] [--images 500]
    # sizes and latency at real scale: a randomly initialised ViT-Ti/16 at 224 (agreement of
    # random weights means little; calibration still uses real images)
    python benchmarks/tflite_variants.py vit_tiny_patch16_224 --random --dataset imagenette.zip

Prints one JSON line per variant and a Markdown table.
"""

import argparse
import json
import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

from keras_vit.data.contract import InputContract  # noqa: E402
from keras_vit.data.datasets import DATASET  # noqa: E402
from keras_vit.export import metadata, tflite  # noqa: E402
from keras_vit.export.verify import held_out_images, latency_ms  # noqa: E402
from keras_vit.inference.classifier import load_classifier  # noqa: E402
from keras_vit.inference.runtimes import KerasRunner, TFLiteRunner  # noqa: E402
from keras_vit.model.transform import DEFAULT_MEAN, DEFAULT_STD  # noqa: E402
from keras_vit.storage.export_folder import VERIFY_IMAGES  # noqa: E402
from keras_vit.storage.locate import locate  # noqa: E402
from keras_vit.storage.run_folder import DatasetSpec, RunFolder  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a run folder or .keras file (with --random: a config name)")
    parser.add_argument("--random", action="store_true", help="a randomly initialised named config")
    parser.add_argument("--dataset", help="default: the run's dataset")
    parser.add_argument("--images", type=int, default=VERIFY_IMAGES, help="held-out images")
    parser.add_argument("--calibration", type=int, default=200, help="representative images for int8")
    args = parser.parse_args()

    spec = DatasetSpec() if args.random else RunFolder(locate(args.model).folder).dataset_spec()
    spec = spec.with_name(args.dataset or spec.name or DATASET)
    dataset = spec.name
    if args.random:
        import keras_vit
        from keras_vit.data import datasets as data

        names = list(data.load_dataset(dataset).class_names)
        model = keras_vit.create_model(
            args.model,
            num_classes=len(names),
            class_names=names,
            image_mean=list(DEFAULT_MEAN),
            image_std=list(DEFAULT_STD),
        )
        classifier = load_classifier(model)
    else:
        classifier = load_classifier(args.model)
    _, images, labels, split, _ = held_out_images(spec, InputContract.of(classifier), limit=args.images)
    reference = KerasRunner(classifier.model).predict(images)
    keras_accuracy = float((reference.argmax(1) == labels).mean())
    representative = tflite.representative_images(spec, InputContract.of(classifier), count=args.calibration)
    large_set = tflite.representative_images(spec, InputContract.of(classifier), count=4 * args.calibration)

    calibration = tflite.Calibration(classifier, representative)
    larger = tflite.Calibration(classifier, large_set)
    variants = {name: (lambda v=name: tflite.convert(classifier, v, calibration)) for name in tflite.VARIANTS}
    for name in tflite.INTEGER_VARIANTS:
        variants[f"{name}, {len(large_set)} calibration images"] = lambda v=name: tflite.convert(
            classifier, v, larger
        )

    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name, make in variants.items():
            flatbuffer = metadata.add_metadata(make(), classifier)
            path = os.path.join(folder, "model.tflite")
            open(path, "wb").write(flatbuffer)
            runner = TFLiteRunner(path)
            probabilities = runner.predict(images)
            row = {
                "variant": name,
                "bytes": len(flatbuffer),
                "latency_ms": latency_ms(runner, images[0], repeats=50),
                "top1_agreement": float((probabilities.argmax(1) == reference.argmax(1)).mean()),
                "accuracy": float((probabilities.argmax(1) == labels).mean()),
                "max_abs_difference": float(np.abs(probabilities - reference).max()),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)

    fp32 = rows[0]
    print(f"\n{classifier.name} on {len(labels)} images of {dataset} [{split}]", end="")
    print(f"; Keras accuracy {keras_accuracy:.2%}\n")
    print("| variant | size vs fp32 | latency vs fp32 | top-1 agreement | accuracy | max abs diff |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['variant']} | {r['bytes'] / fp32['bytes']:.0%} "
            f"| {r['latency_ms'] / fp32['latency_ms']:.2f}x "
            f"| {r['top1_agreement']:.1%} | {r['accuracy']:.1%} | {r['max_abs_difference']:.3f} |"
        )
    print(f"\nfp32: {fp32['bytes'] / 1e6:.2f} MB, {fp32['latency_ms']:.2f} ms per image", end="")
    print(" (batch 1, LiteRT, XNNPACK)")


if __name__ == "__main__":
    main()
