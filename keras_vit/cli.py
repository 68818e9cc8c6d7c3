"""The `keras-vit` command line. It parses arguments and calls the library."""

import argparse
import json
import os
import sys


def _models(args):
    from keras_vit import complexity, configs

    rows = []
    for name in configs.list_models():
        entry = configs.MODEL_CONFIGS[name]
        overrides = {} if args.num_classes is None else {"num_classes": args.num_classes}
        rows.append(
            {
                "name": name,
                "image_size": entry["image_size"],
                "patch_size": entry["patch_size"],
                "hidden_dim": entry["hidden_dim"],
                "depth": entry["depth"],
                "num_heads": entry["num_heads"],
                "mlp_dim": entry["mlp_dim"],
                "params": complexity.parameter_count(name, **overrides),
                "gflops": complexity.forward_flops(name, **overrides) / 1e9,
                "description": entry["description"],
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    columns = ("size", "patch", "width", "depth", "heads")
    header = f"{'name':<24} " + " ".join(f"{c:>5}" for c in columns) + f" {'params':>13} {'GFLOPs':>8}"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['name']:<24} {r['image_size']:>5} {r['patch_size']:>5} {r['hidden_dim']:>5} "
            f"{r['depth']:>5} {r['num_heads']:>5} {r['params']:>13,} {r['gflops']:>8.2f}"
        )
    classes = 1000 if args.num_classes is None else args.num_classes
    print(
        f"\nParameters with a {classes}-class head. GFLOPs: one image's forward pass, "
        f"2 FLOPs per multiply-accumulate; a training step costs about 3x."
    )
    return 0


def build_parser():
    parser = argparse.ArgumentParser(
        prog="keras-vit",
        description="Vision Transformers for Keras 3: list, train, evaluate, export and predict.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True

    models = commands.add_parser("models", help="list the named model configs")
    models.add_argument("--json", action="store_true", help="print JSON, for scripts")
    models.add_argument(
        "--num-classes", type=int, default=None, help="count parameters for this many classes (default 1000)"
    )
    models.set_defaults(run=_models)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    if getattr(args, "num_classes", None) is not None and args.num_classes < 1:
        print(f"keras-vit: error: --num-classes must be at least 1, got {args.num_classes}", file=sys.stderr)
        return 2
    try:
        return args.run(args)
    except BrokenPipeError:
        # `keras-vit models | head`: the reader left early, which is no error.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
