"""`keras-vit export`: a trained model to TF Serving, TFLite and ONNX files, verified.

Layout under the output folder, one new version per export, never overwritten:

    OUTPUT/<name>/<N>/            the SavedModel; point TF Serving at OUTPUT/<name>
    OUTPUT/<name>/export-<N>/     model_fp32.tflite, model_fp16.tflite,
                                  model_dynamic.tflite, model_int8.tflite,
                                  model.tflite (the recommended variant),
                                  model_attention.tflite (with --attention),
                                  model.onnx, labels.txt, export.json,
                                  verification.json, verification.md

TF Serving loads only numbered folders, so it ignores `export-<N>`. Each
export is written into a hidden staging folder and renamed into place, the
SavedModel last: a crash leaves no half-written version.
"""

import json
import logging
import os
import re
import shutil
import tempfile
import time

logger = logging.getLogger(__name__)

FORMATS = ("saved_model", "tflite", "onnx")
QUANTIZATIONS = ("fp16", "dynamic", "int8")


def parse_formats(value):
    """`"all"` or a comma list such as `"saved_model,tflite"` -> a tuple of formats."""
    return _parse_list(value, FORMATS, "--format")


def parse_quantize(value):
    """`"all"`, `"none"` or a comma list such as `"fp16,dynamic"` -> quantized TFLite variants."""
    if value == "none":
        return ()
    try:
        return _parse_list(value, QUANTIZATIONS, "--quantize")
    except ValueError:
        raise ValueError(
            f"--quantize takes all, none (fp32 only: it is always written) or a comma list of "
            f"{', '.join(QUANTIZATIONS)}; got {value!r}."
        ) from None


def _parse_list(value, choices, flag):
    if value == "all":
        return choices
    items = tuple(item.strip() for item in value.split(",") if item.strip())
    unknown = [item for item in items if item not in choices]
    if unknown or not items:
        raise ValueError(f"{flag} takes all or a comma list of {', '.join(choices)}; got {value!r}.")
    return tuple(c for c in choices if c in items)


def next_version(home):
    """1 + the highest version in `home` (SavedModel folders `N` and `export-N`)."""
    versions = [0]
    if os.path.isdir(home):
        for entry in os.listdir(home):
            match = re.fullmatch(r"(?:export-)?(\d+)", entry)
            if match:
                versions.append(int(match.group(1)))
    return max(versions) + 1


def run_settings(source):
    """The dataset settings a run folder recorded (dataset, validation split, seed), if any."""
    folder = source if os.path.isdir(source) else os.path.dirname(os.path.abspath(source))
    history = os.path.join(folder, "history.json")
    if not os.path.exists(history):
        return {}
    with open(history) as f:
        config = json.load(f).get("config", {})
    return {k: config[k] for k in ("dataset", "validation_split", "seed") if k in config}


def _remove_abandoned_staging(home):
    """Deletes the staging folders of exports that were killed (their process is gone)."""
    for entry in os.listdir(home):
        match = re.fullmatch(r"\.partial-\d+-(\d+)-.*", entry)
        if not match:
            continue
        try:
            os.kill(int(match.group(1)), 0)
        except ProcessLookupError:
            shutil.rmtree(os.path.join(home, entry), ignore_errors=True)
        except PermissionError:
            pass  # another user's live process


def recommended_variant(results):
    """The TFLite file apps should ship: the fastest quantized variant that meets its
    agreement targets and beats fp32's latency, else fp32."""
    fp32 = results.get("tflite_fp32")
    candidates = [
        (r["latency_ms"], name)
        for name, r in results.items()
        if name.removeprefix("tflite_") in QUANTIZATIONS
        and r["meets_target"]
        and (fp32 is None or r["latency_ms"] < fp32["latency_ms"])
    ]
    if candidates:
        return min(candidates)[1].removeprefix("tflite_")
    return "fp32"


def export_model(
    source,
    output="exports",
    formats=FORMATS,
    quantize=QUANTIZATIONS,
    name=None,
    dataset=None,
    int8_input="uint8",
    verify=True,
    verify_images=500,
    calibration_images=200,
    attention=False,
):
    """Exports a run folder or `.keras` file and verifies every file against Keras.

    Args:
        source: a run folder or `.keras` file.
        output: the export root; files go to `output/<name>/<N>/` and `export-<N>/`.
        formats: any of `FORMATS`.
        quantize: quantized TFLite variants beside fp32, any of `QUANTIZATIONS`.
        name: the serving name (default: the model's, e.g. `vit_nano_patch4_32`).
        dataset: held-out images for verification and training images for int8
            calibration; a run folder's own dataset by default.
        int8_input: `"uint8"` or `"float32"` input for the full-integer model.
        verify: run the agreement checks (the report is written either way
            when on).
        attention: also write `model_attention.tflite` (fp32), which returns the
            attention-rollout map beside the probabilities, for the apps.

    Returns:
        The manifest (also written to `export.json`), with `"verification"`.
    """
    import keras

    from keras_vit import __version__
    from keras_vit.export import metadata, onnx_model, serving, tflite
    from keras_vit.export.classifier import load_classifier
    from keras_vit.export.verify import format_table, verify_exports, write_report
    from keras_vit.files import write_bytes, write_json

    if keras.backend.backend() != "tensorflow":
        raise ValueError(
            f"Exporting needs the TensorFlow backend (SavedModel, TFLite and ONNX are made from "
            f"TensorFlow graphs), not {keras.backend.backend()}: run it with KERAS_BACKEND=tensorflow. "
            f"A model trained on any backend exports unchanged."
        )
    unknown = [f for f in formats if f not in FORMATS]
    if unknown or not formats:
        raise ValueError(f"Unknown export format(s) {unknown}; choose from {', '.join(FORMATS)}.")
    source = os.fspath(source)
    classifier = load_classifier(source, name)
    settings = run_settings(source)
    if dataset is not None:
        settings["dataset"] = dataset
    needs_data = verify or ("tflite" in formats and "int8" in quantize)
    if needs_data and "dataset" not in settings:
        raise ValueError(
            f"{source} is not a run folder, so its dataset is unknown: pass --dataset (a folder, .zip, "
            f"tfds name or cifar10-mini) for verification and int8 calibration, or --no-verify."
        )

    home = os.path.join(os.fspath(output), classifier.name)
    os.makedirs(home, exist_ok=True)
    _remove_abandoned_staging(home)
    version = next_version(home)
    # Not a number, so TF Serving never loads it; the pid tells a later export it was abandoned.
    staging = tempfile.mkdtemp(prefix=f".partial-{version}-{os.getpid()}-", dir=home)
    try:
        files_dir = os.path.join(staging, "files")
        os.makedirs(files_dir)
        files = {}
        if "saved_model" in formats:
            logger.info("Writing the serving SavedModel ...")
            serving.write_saved_model(classifier, os.path.join(staging, "saved_model"))
            files["saved_model"] = os.path.join(staging, "saved_model")
        if "tflite" in formats:
            representative = None
            if "int8" in quantize:
                representative = tflite.representative_images(
                    settings["dataset"],
                    classifier.image_size,
                    count=calibration_images,
                    seed=settings.get("seed", 0),
                )
            for variant in ("fp32",) + tuple(quantize):
                logger.info("Converting TFLite %s ...", variant)
                flatbuffer = tflite.convert(classifier, variant, representative, int8_input=int8_input)
                description = f"{classifier.name} ({variant}), exported by keras-vit from {source}"
                path = os.path.join(files_dir, f"model_{variant}.tflite")
                write_bytes(path, metadata.add_metadata(flatbuffer, classifier, description))
                files[f"tflite_{variant}"] = path
            if attention:
                logger.info("Converting TFLite with the attention output ...")
                flatbuffer = tflite.convert_with_attention(classifier)
                description = f"{classifier.name} (fp32, with attention rollout), exported by keras-vit"
                path = os.path.join(files_dir, "model_attention.tflite")
                write_bytes(path, metadata.add_metadata(flatbuffer, classifier, description))
                files["tflite_attention"] = path
        if "onnx" in formats:
            logger.info("Converting ONNX ...")
            path = os.path.join(files_dir, "model.onnx")
            write_bytes(path, onnx_model.convert(classifier))
            files["onnx"] = path
        with open(os.path.join(files_dir, "labels.txt"), "w") as f:
            f.write("".join(f"{label}\n" for label in classifier.class_names))

        report = None
        if verify:
            logger.info("Verifying every export against Keras ...")
            report = verify_exports(
                classifier.model,
                files,
                settings["dataset"],
                limit=verify_images,
                seed=settings.get("seed", 0),
                validation_split=settings.get("validation_split", 0.1),
            )
            write_report(report, files_dir)
        recommended = None
        if "tflite" in formats:
            recommended = recommended_variant(report["results"]) if report else "fp32"
            shutil.copyfile(files[f"tflite_{recommended}"], os.path.join(files_dir, "model.tflite"))

        manifest = {
            "name": classifier.name,
            "version": version,
            "source": os.path.abspath(source),
            "dataset": settings.get("dataset"),
            "validation_split": settings.get("validation_split", 0.1),
            "seed": settings.get("seed", 0),
            "image_size": list(classifier.image_size),
            "channels": classifier.channels,
            "class_names": classifier.class_names,
            "input": "RGB pixels in [0, 255], resized to image_size (bilinear, antialiased); "
            "normalisation is inside the model",
            "saved_model": f"../{version}" if "saved_model" in formats else None,
            "files": sorted(os.path.basename(p) for kind, p in files.items() if kind != "saved_model"),
            "recommended_tflite": f"model_{recommended}.tflite" if recommended else None,
            "int8_input": int8_input if "int8" in quantize else None,
            "keras_vit_version": __version__,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "verification": report,
        }
        write_json(os.path.join(files_dir, "export.json"), manifest)
        os.rename(files_dir, os.path.join(home, f"export-{version}"))
        if "saved_model" in formats:
            os.rename(os.path.join(staging, "saved_model"), os.path.join(home, str(version)))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    manifest["folder"] = os.path.join(home, f"export-{version}")
    manifest["table"] = format_table(report) if report else ""
    return manifest
