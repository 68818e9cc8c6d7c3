"""Does layer-wise learning-rate decay help a fine-tune? Measures it instead of assuming it.

Fine-tunes the same pretrained model on the same data once per (decay, peak learning
rate), with the `finetune` preset otherwise, and reports each run's held-out accuracy:

    python benchmarks/layer_decay.py --weights runs/pretrained --dataset path/to/imagenette \\
        --image-size 32 --epochs 5 --decays 1.0,0.65 --learning-rates 1e-4,5e-4

`--weights` is any checkpoint `keras-vit train --weights` takes (a run folder fine-tunes
that run's model). Writes docs/benchmarks/layer_decay.{md,json}.
"""

import argparse
import json
import os
import sys
import time

import keras

from keras_vit.run_folder import RunFolder
from keras_vit.train import train
from keras_vit.train_config import TrainConfig

REPORT_DIR = os.path.join(os.path.dirname(__file__), "..", "docs", "benchmarks")


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
        "| layer decay | peak lr | best val accuracy | last val accuracy | minutes |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in results:
        lines.append(
            f"| {r['layer_decay']} | {r['learning_rate']:g} | {r['best_val_accuracy']:.2%} | "
            f"{r['final_val_accuracy']:.2%} | {r['minutes']:.1f} |"
        )
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
    results = [
        fine_tune(args, float(decay), float(lr))
        for lr in args.learning_rates.split(",")
        for decay in args.decays.split(",")
    ]
    write_report(results, args, command)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
