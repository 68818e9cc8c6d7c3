"""CIFAR-10 from scratch: the full 50,000 / 10,000 split from shared/datasets/cifar10_png.zip.

Trains with the `scratch` recipe plus the flags given, evaluates on the official test
split, and prints one JSON line: test accuracy, epochs, training images per second and
wall time. On a GPU machine, raise --epochs (the recipe's target is 93% or more with at
most 10M parameters); on a 2-core CPU a short run shows the pipeline end to end.

    python benchmarks/cifar10_accuracy.py --epochs 2
    python benchmarks/cifar10_accuracy.py --model vit_mini_patch4_32 --epochs 200 \\
        --randaugment 2 --mixup 0.8 --cutmix 1.0 --precision mixed_bfloat16
"""

import argparse
import json
import os
import sys
import time

DEFAULT_SOURCE = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "datasets", "cifar10_png.zip")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default=DEFAULT_SOURCE)
    parser.add_argument("--model", default="vit_nano_patch4_32")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--randaugment", type=int, default=0)
    parser.add_argument("--mixup", type=float, default=0.0)
    parser.add_argument("--cutmix", type=float, default=0.0)
    parser.add_argument("--precision", default="float32")
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)
    if not os.path.isfile(args.source):
        sys.exit(f"cifar10_accuracy: {args.source} not found (see shared/datasets/README.md)")

    from keras_vit import complexity
    from keras_vit.evaluate import evaluate
    from keras_vit.train import TrainConfig, train

    output = args.output or f"runs/bench-cifar10-{args.model}-{time.strftime('%Y%m%d-%H%M%S')}"
    config = TrainConfig(
        dataset=os.path.abspath(args.source),
        model=args.model,
        output=output,
        epochs=args.epochs,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        warmup_epochs=min(1.0, args.epochs / 4),
        validation_split=0.02,
        randaugment=args.randaugment,
        mixup=args.mixup,
        cutmix=args.cutmix,
        precision=args.precision,
        backup_every_steps=500,
    )
    start = time.time()
    run = train(config)
    train_seconds = time.time() - start
    result = evaluate(run.model, dataset=config.dataset, split="test", validation_split=0.02)
    images = run.summary["steps"] * config.batch_size
    summary = {
        "model": args.model,
        "parameters": complexity.parameter_count(args.model, num_classes=10),
        "epochs": args.epochs,
        "test_top1": result["top1"],
        "test_top5": result["top5"],
        "train_images_per_second": images / train_seconds,
        "wall_seconds": train_seconds,
        "output": output,
        "recipe": {
            k: v for k, v in run.summary["config"].items() if k not in ("dataset", "output", "overrides")
        },
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
