"""`keras-vit predict model.tflite photo.jpg` from the shell: its wall-clock time beside LiteRT's
own batch-1 time for the same file, measured in the same run.

    python benchmarks/predict_startup.py            # ViT-Ti/16 at 224, a 1024 x 768 JPEG
    python benchmarks/predict_startup.py --runs 10

The command runs on LiteRT with a NumPy resize and loads no TensorFlow (whose import alone
takes about 4 s here), so what it adds to the model's own time is Python, NumPy, Pillow and
LiteRT starting, and the photo's decode and resize. Goal: under 1 s on this machine.
Random weights (speed does not depend on them); prints a JSON summary as its last line.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
COMMAND = os.path.join(os.path.dirname(sys.executable), "keras-vit")
GOAL_SECONDS = 1.0


def exported_tflite(model_name, folder):
    """`model_name` with random weights, exported by `keras-vit export` as an fp32 `.tflite`."""
    import keras_vit
    from keras_vit.export.exporter import export_model
    from keras_vit.storage.export_folder import TFLITE_FILE

    model = keras_vit.create_model(model_name, num_classes=10, class_names=[f"class {i}" for i in range(10)])
    path = os.path.join(folder, "model.keras")
    model.save(path)
    manifest = export_model(path, output=folder, formats=("tflite",), quantize=(), verify=False)
    return os.path.join(manifest["folder"], TFLITE_FILE)


def photo(folder, width=1024, height=768):
    """A JPEG the size of a downscaled phone photo, so decode and resize are part of the time."""
    from PIL import Image

    y, x = np.mgrid[0:height, 0:width]
    pixels = np.stack([x * 255 // width, y * 255 // height, (x + y) * 255 // (width + height)], -1)
    path = os.path.join(folder, "photo.jpg")
    Image.fromarray(pixels.astype(np.uint8)).save(path, quality=90)
    return path


def command_seconds(model, image, runs):
    """Median wall-clock seconds of the whole command, from the shell, after one warm-up run
    (the page cache holds the files, as for a user's second run)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_CPP")}
    times = []
    for _ in range(runs + 1):
        start = time.perf_counter()
        subprocess.run([COMMAND, "predict", model, image], env=env, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def litert_batch1_seconds(model, repeats=20):
    """LiteRT's own median time for one image through the same file (the interpreter loaded)."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=model)
    interpreter.allocate_tensors()
    details = interpreter.get_input_details()[0]
    image = np.random.default_rng(0).uniform(0, 255, details["shape"]).astype(np.float32)
    times = []
    for _ in range(repeats + 2):
        start = time.perf_counter()
        interpreter.set_tensor(details["index"], image)
        interpreter.invoke()
        times.append(time.perf_counter() - start)
    return statistics.median(times[2:])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vit_tiny_patch16_224")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        model = exported_tflite(args.model, folder)
        image = photo(folder)
        command = command_seconds(model, image, args.runs)
        litert = litert_batch1_seconds(model)
    summary = {
        "model": args.model,
        "command_seconds": round(command, 3),
        "litert_batch1_seconds": round(litert, 4),
        "command_over_litert": round(command / litert, 1),
        "goal_seconds": GOAL_SECONDS,
        "goal_met": command < GOAL_SECONDS,
    }
    print(
        f"keras-vit predict {args.model}.tflite photo.jpg: {command:.2f} s wall-clock "
        f"(LiteRT's own batch-1: {1000 * litert:.0f} ms, {command / litert:.1f}x); "
        f"goal under {GOAL_SECONDS:.0f} s: {'met' if summary['goal_met'] else 'NOT met'}"
    )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
