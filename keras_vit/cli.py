"""The `keras-vit` command line. It parses arguments and calls the library.

Each command imports what it uses inside its function, so that `--help` and `models` load
no framework (keras_vit_cli.py, the entry point, keeps `import keras_vit` from loading it).
"""

import argparse
import dataclasses
import json
import os
import sys
import typing

from keras_vit import __version__, framework_logs
from keras_vit.data.images import IMAGE_EXTENSIONS
from keras_vit.inference.runtimes import TOP_K
from keras_vit.storage.export_folder import (
    DEFAULT_QUANTIZATIONS,
    EXPORT_FORMATS,
    INTEGER_VARIANTS,
    TFLITE_VARIANTS,
    VERIFY_IMAGES,
)


def _models(args):
    if args.pretrained:
        return _pretrained_models(args)
    from keras_vit.model import complexity, registry

    rows = []
    for name, family in sorted(registry.all_configs().items()):
        overrides = {} if args.num_classes is None else {"num_classes": args.num_classes}
        rows.append(
            {
                "name": name,
                "family": family.name,
                **family.columns(name),
                "params": complexity.parameter_count(name, **overrides),
                "gflops": complexity.forward_flops(name, **overrides) / 1e9,
                "description": family.configs[name]["description"],
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    columns = ("size", "patch", "width", "depth", "heads")
    wide = max(36, *(len(r["name"]) for r in rows))
    header = f"{'name':<{wide}} " + " ".join(f"{c:>5}" for c in columns) + f" {'params':>13} {'GFLOPs':>8}"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['name']:<{wide}} {r['image_size']:>5} {r['patch_size']:>5} {r['hidden_dim']:>5} "
            f"{r['depth']:>5} {r['num_heads']:>5} {r['params']:>13,} {r['gflops']:>8.2f}"
        )
    classes = 1000 if args.num_classes is None else args.num_classes
    print(
        f"\nParameters with a {classes}-class head. GFLOPs: one image's forward pass, "
        f"2 FLOPs per multiply-accumulate; a training step costs about 3x."
    )
    return 0


def _train(args):
    if args.supervise:  # before training's imports, which load TensorFlow
        from keras_vit.training import jax_job

        return jax_job.supervise(args.argv, verbose=args.verbose)
    import dataclasses

    from keras_vit.training.config import TrainConfig
    from keras_vit.training.train import train

    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    values = {k: v for k, v in vars(args).items() if k in fields and v is not None}
    values["overrides"] = dict(_parse_override(item) for item in args.override or [])
    summary = train(TrainConfig(**values)).summary
    final = summary["final"]
    best = summary["best_val_accuracy"]  # None without validation; 0.0 is a best like any other
    print(
        f"\nTrained {summary['config']['model']} for {summary['steps']} steps: "
        f"val accuracy {final.get('val_accuracy', float('nan')):.4f} (best "
        f"{float('nan') if best is None else best:.4f}); run folder: {summary['config']['output']}"
    )
    return 0


def _trains_in_this_process(args):
    """`train`'s uses_keras. A JAX job across processes trains in a child of this process
    (`jax_job.supervise`): its runtime aborts a process whose peer died, and the parent turns
    that into one line. The parent only starts and watches the child, so it loads no TensorFlow.
    Sets `args.supervise` for `_train`."""
    from keras_vit.training import jax_job

    args.supervise = False
    if args.strategy != "multi-worker" or os.environ.get(jax_job.CHILD):
        return True
    with framework_logs.native_lines_muted():  # on the TensorFlow backend, Keras loads it
        import keras
    if keras.backend.backend() != "jax":
        return True
    jax_job.read()  # a missing or inconsistent variable: one line, before a child starts
    args.supervise = True
    return False


def _pretrained_models(args):
    from keras_vit.model import complexity, hub
    from keras_vit.model.pretrained import list_pretrained, pretrained_table

    table = pretrained_table()
    defaults = set(table["defaults"].values())
    rows = []
    for name in list_pretrained():
        entry = table["tags"][name]
        architecture = name.split(".")[0]
        head = {"num_classes": entry["num_classes"]} if entry["num_classes"] else {"include_top": False}
        rows.append(
            {
                "name": name,
                "default": name in defaults,
                "image_size": entry["image_size"],
                "label_set": entry["label_set"]
                or (f"{entry['num_classes']} classes" if entry["num_classes"] else None),
                "params": complexity.parameter_count(architecture, image_size=entry["image_size"], **head),
                "cached": hub.is_cached(entry["repo"])
                if "repo" in entry
                else hub.is_url_cached(entry["url"]),
                "repo": entry.get("repo") or entry["url"],
                "license": entry.get("license"),
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    wide = max(52, *(len(r["name"]) + 2 for r in rows))
    header = f"{'name':<{wide}} {'size':>9} {'labels':<18} {'params':>13}  {'cached':<6}  licence"
    print(header)
    print("-" * len(header))
    for r in rows:
        size = "x".join(str(side) for side in r["image_size"])
        labels = r["label_set"] or "features only"
        name = r["name"] + (" *" if r["default"] else "")
        print(
            f"{name:<{wide}} {size:>9} {labels:<18} {r['params']:>13,}  "
            f"{'yes' if r['cached'] else '':<6}  {r['license'] or ''}"
        )
    print(
        "\n* timm's default tag: the architecture's name alone loads it. Downloads go to "
        "huggingface_hub's cache; hf-hub:org/repo and local-dir:/path load any ViT repo."
    )
    return 0


def _evaluate(args):
    from keras_vit.data.datasets import DATASET
    from keras_vit.inference.evaluate import evaluate, write_report
    from keras_vit.inference.runtimes import open_model
    from keras_vit.storage.locate import locate, recorded_dataset

    # The run or export remembers its dataset and split; flags win.
    spec = recorded_dataset(args.model)
    spec = spec.with_name(args.dataset or spec.name or DATASET)
    result = evaluate(open_model(args.model), spec, split=args.split, batch_size=args.batch_size)
    folder = locate(args.model).folder
    write_report(result, args.output or folder)
    if args.json:
        print(json.dumps({k: v for k, v in result.items() if k != "confusion"}, indent=2))
        return 0
    print(f"{result['dataset']} [{result['split']}], {result['count']} images")
    if "model_top1" in result:  # data of some of the model's classes: scored both ways
        print(
            f"top-1 accuracy {result['model_top1']:.4f}   top-5 accuracy {result['model_top5']:.4f}   "
            f"among the model's {result['model_classes']} classes"
        )
        among = f"   among the dataset's {len(result['class_names'])} classes"
    else:
        among = ""
    print(f"top-1 accuracy {result['top1']:.4f}   top-5 accuracy {result['top5']:.4f}{among}")
    for name, accuracy in result["per_class"].items():
        print(f"  {name:<24} {accuracy:.4f}")
    print(f"Wrote evaluation.json and confusion.png to {args.output or folder}")
    return 0


def _model_needs_tensorflow(args):
    from keras_vit.inference.runtimes import needs_tensorflow

    return needs_tensorflow(args.model)


def _predict(args):
    import textwrap

    from keras_vit.data.images import image_files
    from keras_vit.inference.predict import iter_predictions
    from keras_vit.inference.runtimes import open_model

    paths = []
    for given in args.images:  # a folder stands for the images in it and its subfolders (class folders)
        try:
            paths += image_files(given, recursive=True) if os.path.isdir(given) else [given]
        except ValueError:  # one with none is reported in its turn, as a bad file is
            paths.append(given)
    failed = False
    # Each answer is printed as its batch is classified (a JSON array, item by item, with --json).
    for number, result in enumerate(iter_predictions(open_model(args.model), paths, top_k=args.top_k)):
        failed = failed or "error" in result
        if args.json:
            item = textwrap.indent(json.dumps(result, indent=2), "  ")
            print(("[\n" if number == 0 else ",\n") + item, end="", flush=True)
        elif "error" in result:
            print(f"{result['path']}: error: {result['error']}", flush=True)
        else:
            ranked = ", ".join(f"{p['class']} {p['probability']:.3f}" for p in result["top_k"])
            print(f"{result['path']}: {ranked}", flush=True)
    if args.json:
        print("\n]")
    return 1 if failed else 0


def _export(args):
    import logging

    from keras_vit.export.exporter import export_model, parse_formats, parse_quantize

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    manifest = export_model(
        args.model,
        output=args.output,
        formats=parse_formats(args.format),
        quantize=parse_quantize(args.quantize),
        name=args.name,
        dataset=args.dataset,
        int8_input=args.int8_input,
        verify=args.verify,
        verify_images=args.verify_images,
        attention=args.attention,
    )
    return _print_verification(manifest["verification"], manifest["folder"], args.json, manifest)


def _verify(args):
    from keras_vit.export.verify import reverify

    report = reverify(args.folder, model=args.model, dataset=args.dataset, limit=args.limit)
    return _print_verification(report, args.folder, args.json, report)


def _app_desktop(args):
    from keras_vit.apps.desktop.app import run

    return run(model=args.model, image=args.image, screenshot=args.screenshot)


def _app_mobile(args):
    from keras_vit.apps.mobile.app import run

    return run(
        model=args.model,
        host=args.host,
        port=args.port,
        output=args.output,
        build_only=args.build_only,
        certfile=args.certfile,
        keyfile=args.keyfile,
        screenshot=args.screenshot,
        image=args.image,
    )


def _print_verification(report, folder, as_json, value):
    from keras_vit.export.verify import format_table

    if as_json:
        print(json.dumps({k: v for k, v in value.items() if k != "table"}, indent=2))
    else:
        if report:
            print("\n" + format_table(report))
        print(f"Wrote {folder}")
    if report and not report["passed"]:
        failed = [name for name, r in report["results"].items() if not r["meets_target"]]
        print(
            f"keras-vit: WARNING: below the agreement target: {', '.join(failed)} (see the table).",
            file=sys.stderr,
        )
        return 1
    return 0


def _parse_override(item):
    """`depth=4` -> ("depth", 4): the value is read as JSON, else kept as a string."""
    key, separator, value = item.partition("=")
    if not separator or not key:
        raise ValueError(f"--override takes KEY=VALUE, got {item!r}.")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def _add_train_arguments(parser):
    """One flag per `TrainConfig` setting, its help and default text from the setting's own
    declaration (`keras_vit.training.config.setting`), then `--override`."""
    from keras_vit.training.config import TrainConfig

    for field in dataclasses.fields(TrainConfig):
        options = dict(field.metadata)
        if not options.pop("flag"):
            continue
        options.pop("default_text", None)
        options["help"] = f"{options['help']} (default: {TrainConfig.default_text(field.name)})"
        kind = _flag_type(field.type)
        if kind is bool:
            options["action"] = argparse.BooleanOptionalAction
        elif "choices" not in options:
            options["type"] = _model_name if field.name == "model" else kind
        parser.add_argument("--" + field.name.replace("_", "-"), **options)
    parser.add_argument(
        "--override",
        action="append",
        metavar="KEY=VALUE",
        help="any other ViT argument for the named config, e.g. --override depth=4 (repeatable)",
    )


def _flag_type(annotation):
    """`int | None` -> int: the type of a setting's value."""
    kinds = [kind for kind in typing.get_args(annotation) or (annotation,) if kind is not type(None)]
    return kinds[0]


def _add_models_arguments(models):
    models.add_argument("--json", action="store_true", help="print JSON, for scripts")
    models.add_argument(
        "--pretrained",
        action="store_true",
        help="list the pretrained names: resolution, label set, parameters, and whether each is cached",
    )
    models.add_argument(
        "--num-classes",
        type=_at_least(1),
        default=None,
        help="count parameters for this many classes (default 1000)",
    )


def _add_evaluate_arguments(evaluate):
    evaluate.add_argument(
        "model",
        help="a run folder, .keras file, SavedModel folder, .tflite, .onnx or pretrained name (as predict)",
    )
    evaluate.add_argument("--dataset", help="default: the run's or export's dataset, else cifar10-mini")
    evaluate.add_argument("--split", choices=("train", "validation", "test"), help="default: test if any")
    evaluate.add_argument("--batch-size", type=_at_least(1), default=100)
    evaluate.add_argument(
        "--output", help="folder for evaluation.json and confusion.png (default: beside the model)"
    )
    evaluate.add_argument("--json", action="store_true", help="print JSON, for scripts")


def _add_export_arguments(export):
    export.add_argument("model", help="a run folder, a .keras file or a pretrained name")
    export.add_argument("--output", default="exports", help="export root (default exports/)")
    export.add_argument(
        "--format", default="all", help=f"all (default) or a comma list of {','.join(EXPORT_FORMATS)}"
    )
    export.add_argument(
        "--quantize",
        default=",".join(DEFAULT_QUANTIZATIONS),
        help=f"TFLite variants beside fp32: a comma list of {','.join(TFLITE_VARIANTS[1:])} (default "
        f"%(default)s), all or none. The integer ones ({', '.join(INTEGER_VARIANTS)}) are opt-in: "
        f"int16x8 and int8_strict run LiteRT's 16-bit reference loops, slower than fp32, and int8 is "
        f"faster only on CPUs with int8 dot products (AVX512-VNNI, AMX, Arm dotprod), its kernels rounded "
        f"on the calibration images (minutes: about four for a ViT-Ti at 224 on two cores, more for wider "
        f"models); each is verified against its targets (docs/tflite-integer.md)",
    )
    export.add_argument(
        "--int8-input",
        choices=("uint8", "float32"),
        default="uint8",
        help="input type of the int8 and int16x8 models (default uint8; int8_strict takes uint8)",
    )
    export.add_argument(
        "--attention",
        action="store_true",
        help="also write model_attention.tflite, which returns the attention-rollout map beside the "
        "probabilities (for the desktop app); the other files are unchanged",
    )
    export.add_argument("--name", help="serving name (default: the model's name)")
    export.add_argument("--dataset", help="held-out and calibration images (default: the run's dataset)")
    export.add_argument(
        "--verify",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="check every export against Keras (default on)",
    )
    export.add_argument(
        "--verify-images",
        type=_at_least(1),
        default=VERIFY_IMAGES,
        help=f"held-out images to verify on (default {VERIFY_IMAGES})",
    )
    export.add_argument("--json", action="store_true", help="print the manifest as JSON")


def _add_verify_arguments(verify):
    verify.add_argument("folder", help="an export folder (OUTPUT/<name>/export-<N>)")
    verify.add_argument("--model", help="the Keras model (default: the export's source)")
    verify.add_argument("--dataset", help="default: the export's dataset")
    verify.add_argument(
        "--limit", type=_at_least(1), default=VERIFY_IMAGES, help=f"held-out images (default {VERIFY_IMAGES})"
    )
    verify.add_argument("--json", action="store_true", help="print the report as JSON")


def _add_predict_arguments(predict):
    predict.add_argument(
        "model",
        help="a run folder, .keras file, SavedModel folder, export-N folder, .tflite, .onnx, or a "
        "pretrained name (`keras-vit models --pretrained`)",
    )
    predict.add_argument(
        "images",
        nargs="+",
        help=f"image files ({', '.join(IMAGE_EXTENSIONS)}), or folders of them or of class folders",
    )
    predict.add_argument("--top-k", type=_at_least(1), default=TOP_K)
    predict.add_argument("--json", action="store_true", help="print JSON: each image's path and top-k")


def _add_app_commands(app, common):
    apps = app.add_subparsers(dest="app", required=True, metavar="APP")
    desktop = apps.add_parser(
        "desktop",
        parents=[common],
        help="the Qt classifier: open, drop or paste images; top-5 and attention; folders",
    )
    desktop.add_argument(
        "--model", help="a .tflite (default: the last model used), SavedModel, .keras or pretrained name"
    )
    desktop.add_argument("--image", help="an image to classify at start")
    desktop.add_argument(
        "--screenshot",
        metavar="OUT.png",
        help="render the window with --model and --image to a PNG, then exit",
    )
    desktop.set_defaults(run=_app_desktop, uses_keras=False)
    mobile = apps.add_parser(
        "mobile",
        parents=[common],
        help="the offline web app for phones (LiteRT.js): build it for a .tflite and serve it",
    )
    mobile.add_argument("--model", required=True, help="a .tflite from keras-vit export (or its folder)")
    mobile.add_argument(
        "--host", default="127.0.0.1", help="address to serve on (default 127.0.0.1; 0.0.0.0 for phones)"
    )
    mobile.add_argument(
        "--port", type=_at_least(0, most=65535), default=8000, help="port (default 8000; 0 picks a free one)"
    )
    mobile.add_argument("--output", help="folder to write the app to (default: a temporary folder)")
    mobile.add_argument(
        "--build-only", action="store_true", help="write the app to --output and exit (for any static host)"
    )
    mobile.add_argument(
        "--certfile", help="TLS certificate (PEM): serve HTTPS (phones need it for the camera)"
    )
    mobile.add_argument("--keyfile", help="the certificate's private key (PEM), unless --certfile holds it")
    mobile.add_argument(
        "--screenshot",
        metavar="OUT.png",
        help="classify --image in headless Chromium as a phone; save the screen",
    )
    mobile.add_argument("--image", help="the picture for --screenshot")
    mobile.set_defaults(run=_app_mobile, uses_keras=False)


def _model_name(text):
    """An argparse type: a named config, checked before TensorFlow loads (a typo answers at once)."""
    from keras_vit.model.registry import get_model_config

    try:
        get_model_config(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def _at_least(least, most=None):
    """An argparse type: an integer in [least, most]. (`train`'s numbers are checked by
    `TrainConfig.validate`, so that the Python API checks them too.)"""

    def integer(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < least or (most is not None and value > most):
            bounds = f"at least {least}" if most is None else f"from {least} to {most}"
            raise argparse.ArgumentTypeError(f"must be {bounds}, got {value}")
        return value

    return integer


class _Parser(argparse.ArgumentParser):
    """Bad arguments get what all bad input gets: one line, exit 1 (argparse: usage, exit 2)."""

    def error(self, message):
        self.exit(1, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser():
    parser = _Parser(
        prog="keras-vit",
        description="Vision Transformers for Keras 3: list, train, evaluate, export and predict.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--verbose", action="store_true", help="also show TensorFlow's, XLA's and CUDA's own log lines"
    )

    # uses_keras: the command loads TensorFlow and Keras, so it loads them at once with their
    # start-up lines muted (the apps start without them); a function of the arguments where
    # that depends on them (`predict` and `evaluate` on a .tflite need neither).
    def command(name, run, uses_keras=True, **kwargs):
        parser = commands.add_parser(name, parents=[common], **kwargs)
        parser.set_defaults(run=run, uses_keras=uses_keras)
        return parser

    _add_models_arguments(command("models", _models, uses_keras=False, help="list the named model configs"))
    train_help = "train or fine-tune a ViT (resumable)"
    _add_train_arguments(command("train", _train, uses_keras=_trains_in_this_process, help=train_help))
    evaluate_help = "top-1, top-5, per-class accuracy, confusion matrix"
    _add_evaluate_arguments(
        command("evaluate", _evaluate, uses_keras=_model_needs_tensorflow, help=evaluate_help)
    )
    _add_export_arguments(
        command(
            "export",
            _export,
            help="SavedModel for TF Serving, TFLite (fp32/fp16/int8), ONNX; verified against Keras",
        )
    )
    _add_verify_arguments(command("verify", _verify, help="check an export folder against Keras again"))
    _add_predict_arguments(
        command("predict", _predict, uses_keras=_model_needs_tensorflow, help="top-k classes of image files")
    )
    _add_app_commands(commands.add_parser("app", help="the desktop and mobile classifiers"), common)
    return parser


def _disk_full_message(error):
    """keras-vit's own DiskFullError names the file and the space; a write elsewhere (the CSV
    log, TensorBoard's events, a converter's scratch files) names what it can."""
    from keras_vit.files import DiskFullError

    if isinstance(error, DiskFullError):
        return str(error)
    where = f" writing {error.filename}" if getattr(error, "filename", None) else ""
    return (
        f"No space left on the device{where}: free some space and run the same command again. "
        f"Nothing written before was lost."
    )


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    args.argv = argv[1:]  # after the command's name
    try:
        if not args.verbose:  # first, so that deciding what loads loads nothing loudly
            framework_logs.quiet(load_frameworks=False)
        uses_keras = args.uses_keras(args) if callable(args.uses_keras) else args.uses_keras
        if uses_keras and not args.verbose:
            framework_logs.quiet(load_frameworks=True)
        if uses_keras:  # registers every class a keras-vit `.keras` file can name
            from keras_vit.training import optimizers, training_model  # noqa: F401
        return args.run(args)
    except (ValueError, FileNotFoundError, TypeError) as error:
        # Bad input: one clear line, no traceback.
        print(f"keras-vit {args.command}: error: {error}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # `keras-vit models | head`: the reader left early, which is no error (before OSError, its base).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as error:
        # A full disk (or quota, or file-size limit) while writing, or a model hub that cannot
        # give a file: one line, and what to do.
        from keras_vit.files import is_disk_full
        from keras_vit.model.hub import HubError

        if isinstance(error, HubError):
            print(f"keras-vit {args.command}: error: {error}", file=sys.stderr)
            return 1
        if not is_disk_full(error):
            raise
        print(f"keras-vit {args.command}: error: {_disk_full_message(error)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        # Ctrl+C (pressed twice, or during clean-up): a one-line goodbye, the shell's status for SIGINT.
        print(f"keras-vit {args.command}: interrupted", file=sys.stderr)
        return 130
