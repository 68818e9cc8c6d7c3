"""Does layer-wise learning-rate decay help a fine-tune? Measures it instead of assuming it.

Fine-tunes the same pretrained model on the same data once per (decay, peak learning
rate), with the `finetune` preset otherwise, and reports each run's held-out accuracy:

    python benchmarks/layer_decay.py --weights runs/pretrained \\
        --dataset ../shared/datasets/imagenette2_224_val.zip \\
        --image-size 32 --epochs 5 --decays 1.0,0.65 --learning-rates 1e-4,5e-4

A `.zip` holding one split only (as Imagenette's `val/`) is unpacked into a temporary
`class_name/image` folder, whose held-out part is the validation split.

`--weights` is any checkpoint `keras-vit train --weights` takes (a run folder fine-tunes
that run's model). Writes docs/benchmarks/layer_decay.{md,json}.
"""

import argparse
import json
import os
import sys
import tempfile
import time
import zipfile

import keras

from keras_vit.storage.run_folder import RunFolder
from keras_vit.training.config import TrainConfig
from keras_vit.training.train import train

REPORT_DIR = os.path.join(os.path.dirname(__file__), "..", "docs", "benchmarks")


def class_folders(dataset, folder):
    """`dataset` as a `class_name/image` folder: a `.zip` of `[top/]split/class/image` files with
    one split is unpacked into `folder`; anything else is returned as it is."""
    if not dataset.endswith(".zip"):
        return dataset
    with zipfile.ZipFile(dataset) as archive:
        names = [n for n in archive.namelist() if not n.endswith("/")]
        if len({n.split("/")[-3] for n in names if n.count("/") >= 2}) != 1:
            return dataset  # train/ and test/ folders: the loader reads it as it is
        for name in names:
            class_name, file_name = name.split("/")[-2:]
            os.makedirs(os.path.join(folder, class_name), exist_ok=True)
            with open(os.path.join(folder, class_name, file_name), "wb") as f:
                f.write(archive.read(name))
    return folder


def verdict(results):
    """One sentence: does decay help at each learning rate?"""
    by_lr = {}
    for r in results:
        by_lr.setdefault(r["learning_rate"], {})[r["layer_decay"]] = r["best_val_accuracy"]
    helped = [
        lr for lr, scores in by_lr.items() if min(scores) < 1 and scores[min(scores)] > scores.get(1.0, 0)
    ]
    best = max(results, key=lambda r: r["best_val_accuracy"])
    return (
        f"Best: layer decay {best['layer_decay']} at peak lr {best['learning_rate']:g} "
        f"({best['best_val_accuracy']:.2%}). Layer decay helped at "
        f"{len(helped)} of {len(by_lr)} learning rates."
    )


def fine_tune(args, decay, learning_rate):
    output = os.path.join(args.output, f"decay{decay}-lr{learning_rate}")
    config = TrainConfig(
        dataset=args.dataset,
        model=args.model,
        output=output,
        preset="finetune",
        weights=args.weights,
        epochs=args.epochs,
        batch_size=args.batch_size,
        image_size=args.image_size,
        learning_rate=learning_rate,
        layer_decay=decay,
        validation_split=args.validation_split,
        seed=args.seed,
    )
    start = time.perf_counter()
    summary = train(config, progress_bar=False).summary
    keras.backend.clear_session()
    history = summary["history"]
    return {
        "layer_decay": decay,
        "learning_rate": learning_rate,
        "best_val_accuracy": summary["best_val_accuracy"],
        "final_val_accuracy": history["val_accuracy"][-1],
        "val_accuracy_per_epoch": history["val_accuracy"],
        "minutes": (time.perf_counter() - start) / 60,
        "output": output,
    }


def describe_start(weights):
    """What the fine-tunes start from, read from the run folder when it is one."""
    summary = RunFolder(weights).summary()
    if not summary:
        return f"The start: `{weights}`."
    config = summary["config"]
    return (
        f"The start: `{weights}`, a `{config['model']}` trained on `{config['dataset']}` "
        f"({summary['best_val_accuracy']:.1%} validation accuracy there)."
    )


def write_report(results, args, command):
    os.makedirs(args.report_dir, exist_ok=True)
    with open(os.path.join(args.report_dir, "layer_decay.json"), "w") as f:
        json.dump({"command": command, "results": results}, f, indent=2)
    lines = [
        "# Layer-wise learning-rate decay in a fine-tune",
        "",
        f"Measured with `{command}`: the `finetune` preset from the same weights, on the same data "
        f"and seed, once per decay and peak learning rate. Held-out accuracy (validation split).",
        "",
        describe_start(args.weights),
        "",
        "| layer decay | peak lr | best val accuracy | last val accuracy | minutes |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in results:
        lines.append(
            f"| {r['layer_decay']} | {r['learning_rate']:g} | {r['best_val_accuracy']:.2%} | "
            f"{r['final_val_accuracy']:.2%} | {r['minutes']:.1f} |"
        )
    lines += ["", verdict(results)]
    with open(os.path.join(args.report_dir, "layer_decay.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", required=True, help="the pretrained start (run folder, .keras, ...)")
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--model", help="default: the weights run's model")
    parser.add_argument("--image-size", type=int)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--validation-split", type=float, default=0.2)
    parser.add_argument("--decays", default="1.0,0.65")
    parser.add_argument("--learning-rates", default="1e-4,5e-4")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default="runs/layer-decay")
    parser.add_argument("--report-dir", default=REPORT_DIR)
    args = parser.parse_args(argv)
    if args.model is None:
        args.model = RunFolder(args.weights).settings().get("model")
    command = "python benchmarks/layer_decay.py " + " ".join(sys.argv[1:] if argv is None else argv)
    with tempfile.TemporaryDirectory(prefix="keras-vit-layer-decay-") as folder:
        args.dataset = class_folders(args.dataset, folder)
        results = [
            fine_tune(args, float(decay), float(lr))
            for lr in args.learning_rates.split(",")
            for decay in args.decays.split(",")
        ]
    write_report(results, args, command)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
