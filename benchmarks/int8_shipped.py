"""What `keras-vit export --quantize int8` ships for the real ViT-Ti, scored on the photos its
calibration did not use (issue 49).

The export's own path (`export.tflite.convert(classifier, "int8", Calibration(...))`, uint8
pixels in), calibrated on the first `--calibration` photos of `int8_rotation.py`'s seeded
permutation and scored against the fp32 Keras model on the others: flips of the top-1 class,
agreement, accuracy, the mean KL divergence to fp32, and the export's own time. `--recipe rules`
makes the file by the family's rules alone, as the export did before the rewrite
(`export.rotated_int8`) and still does for the ViTs the rewrite does not cover.

    unzip ../shared/datasets/imagenette2_224_val.zip -d /tmp/imagenette
    HF_HUB_OFFLINE=1 python benchmarks/int8_shipped.py --dataset /tmp/imagenette/imagenette2_224/val \\
        --images 10000 --save /tmp/int8_shipped
    python benchmarks/tflite_latency.py /tmp/int8_shipped/fp32.tflite /tmp/int8_shipped/int8*.tflite \\
        --threads 2 --rounds 5 --runs 20

One JSON line per recipe; docs/benchmarks/int8.md (twenty-first pass) reports them.
"""

import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from int8_rotation import MODEL, fp32, keras_probabilities, labels_of, photos, read, tflite_probabilities  # noqa: E402

import keras_vit  # noqa: E402
from keras_vit.export import dynamic_range, tflite  # noqa: E402
from keras_vit.inference.classifier import load_classifier  # noqa: E402
from keras_vit.inference.runtimes import xnnpack_delegation  # noqa: E402


def _delegation(flatbuffer):
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=flatbuffer, num_threads=2)
    interpreter.allocate_tensors()
    return xnnpack_delegation(interpreter)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", required=True, help="a folder of ImageNet class folders (wnids)")
    parser.add_argument("--calibration", type=int, default=100)
    parser.add_argument("--images", type=int, default=1000, help="scored photos (more than there are: all)")
    parser.add_argument("--recipes", default="rewrite,rules", help="`rewrite` (shipped), `rules` (before it)")
    parser.add_argument("--save", default=None, help="a folder for fp32.tflite and int8_<recipe>.tflite")
    arguments = parser.parse_args()

    model = keras_vit.create_model(MODEL, pretrained=True)
    classifier = load_classifier(model)
    calibration_paths, scored_paths = photos(arguments.dataset, arguments.calibration, arguments.images)
    images, labels = read(model, scored_paths), labels_of(model, scored_paths)
    reference = keras_probabilities(model, images)
    print(json.dumps({"images": len(images), "fp32_accuracy": float((reference.argmax(1) == labels).mean())}))
    if arguments.save:
        os.makedirs(arguments.save, exist_ok=True)
        with open(os.path.join(arguments.save, "fp32.tflite"), "wb") as file:
            file.write(fp32(classifier))
    calibration_images = read(model, calibration_paths)
    rewritten = tflite._rewritten
    for recipe in arguments.recipes.split(","):
        tflite._rewritten = rewritten if recipe == "rewrite" else (lambda *_: None)
        start = time.perf_counter()
        calibration = tflite.Calibration(classifier, calibration_images, "uint8")
        flatbuffer = tflite.convert(classifier, "int8", calibration)
        seconds = time.perf_counter() - start
        tflite._rewritten = rewritten
        if arguments.save:
            with open(os.path.join(arguments.save, f"int8_{recipe}.tflite"), "wb") as file:
                file.write(flatbuffer)
        predicted, _ = tflite_probabilities(flatbuffer, images)
        flips = int((predicted.argmax(1) != reference.argmax(1)).sum())
        delegated, outside, _ = _delegation(flatbuffer)
        row = {
            "recipe": recipe,
            "calibration": arguments.calibration,
            "flips": flips,
            "agreement": 1 - flips / len(images),
            "accuracy": float((predicted.argmax(1) == labels).mean()),
            "kl": dynamic_range.kl_divergence(reference, predicted),
            "xnnpack_ops": delegated,
            "outside_xnnpack": outside,
            "export_seconds": round(seconds, 1),
        }
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
