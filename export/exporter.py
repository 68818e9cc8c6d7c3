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

Size limits, checked from the parameter count before anything is converted: a SavedModel keeps
its weights in `variables/`, outside its graph's protobuf, so it has none; ONNX over protobuf's
2 GiB is written with external data (`model.onnx.data` beside `model.onnx`); a TFLite variant
over flatbuffers' 2 GiB is refused in one line (`ExportTooLargeError`).
"""

import logging
import os
import re
import shutil
import tempfile
import time

import keras

from keras_vit import __version__
from keras_vit.data.contract import InputContract
from keras_vit.data.datasets import DATASET
from keras_vit.export import metadata, onnx_model, serving, tflite
from keras_vit.export.verify import format_table, verify_exports, write_report
from keras_vit.files import DiskFullError, folder_size, is_disk_full, write_bytes, write_json
from keras_vit.inference.classifier import load_classifier
from keras_vit.model import complexity, registry
from keras_vit.storage.export_folder import (
    BATCHING_FILE,
    DEFAULT_QUANTIZATIONS,
    EXPORT_FORMATS,
    LABELS_FILE,
    MANIFEST_FILE,
    ONNX_FILE,
    TFLITE_FILE,
    VERIFY_IMAGES,
    files_folder,
    tflite_file,
)
from keras_vit.storage.locate import locate
from keras_vit.storage.run_folder import RunFolder

logger = logging.getLogger(__name__)

FORMATS = EXPORT_FORMATS
# The TFLite variants beside fp32 that --quantize picks from.
QUANTIZATIONS = tuple(v for v in tflite.VARIANTS if v != "fp32")
# The largest file protobuf (ONNX) and flatbuffers (TFLite) address with their 32-bit offsets.
FORMAT_SIZE_LIMIT = 2**31
# Bytes a weight takes in each TFLite variant (the integer ones: int8 weights) and in ONNX (float32).
BYTES_PER_WEIGHT = {
    "fp32": 4,
    "attention": 4,
    "fp16": 2,
    **dict.fromkeys(("dynamic", *tflite.INTEGER_VARIANTS), 1),
    "onnx": 4,
}


class ExportTooLargeError(ValueError):
    """A format cannot hold the model: refused before any conversion, in one line."""


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
    quantize=DEFAULT_QUANTIZATIONS,
    name=None,
    dataset=None,
    int8_input="uint8",
    verify=True,
    verify_images=VERIFY_IMAGES,
    calibration_images=tflite.CALIBRATION_IMAGES,
    attention=False,
):
    """Exports a run folder or `.keras` file and verifies every file against Keras.

    Args:
        source: a run folder or `.keras` file.
        output: the export root; files go to `output/<name>/<N>/` and `export-<N>/`.
        formats: any of `FORMATS`.
        quantize: quantized TFLite variants beside fp32, any of `QUANTIZATIONS` (the
            integer ones are opt-in, as on the command line).
        name: the serving name (default: the model's, e.g. `vit_nano_patch4_32`).
        dataset: held-out images for verification and training images for int8
            calibration; a run folder's own dataset by default.
        int8_input: `"uint8"` or `"float32"` input for the `int8` and `int16x8` models
            (`int8_strict` always takes uint8).
        verify: run the agreement checks (the report is written either way
            when on).
        attention: also write `model_attention.tflite` (fp32), which returns the
            attention-rollout map beside the probabilities, for the apps.

    Returns:
        The manifest (also written to `export.json`), with `"verification"`.

    Raises:
        ExportTooLargeError: a TFLite variant would pass `FORMAT_SIZE_LIMIT` (a pretrained model by
            name is refused before it is loaded); nothing is written. ONNX over it is written with
            external data instead.
    """
    _require_tensorflow_backend()
    unknown = [f for f in formats if f not in FORMATS]
    if unknown or not formats:
        raise ValueError(f"Unknown export format(s) {unknown}; choose from {', '.join(FORMATS)}.")
    source = os.fspath(source)
    variants = _tflite_variants(formats, quantize, attention)
    _check_size(_pretrained_parameters(source), source, variants)  # a giant by name: before loading it
    classifier = load_classifier(source, name)
    external = _check_size(classifier.model.count_params(), source, variants) and "onnx" in formats
    family = registry.family_of(classifier.model, default=None)  # None: a user's own Keras model
    if attention and not (family and family.has_attention_maps):
        kind = f"a {family.name} model" if family else "not a keras-vit ViT"
        raise ValueError(
            f"--attention: {source} is {kind}, which has no global attention map to roll out; export "
            f"without --attention."
        )
    located = locate(source)
    spec = RunFolder(located.folder).dataset_spec().with_name(dataset)
    # A pretrained model by name: checked on --dataset's images, else the embedded ones, for
    # agreement only unless they are of its classes.
    pretrained = located.kind == "pretrained"
    if pretrained and spec.name is None:
        spec = spec.with_name(DATASET)
    integer = "tflite" in formats and any(v in tflite.INTEGER_VARIANTS for v in quantize)
    if (verify or integer) and spec.name is None:
        raise ValueError(
            f"{source} is not a run folder, so its dataset is unknown: pass --dataset (a folder, .zip, "
            f"tfds name or cifar10-mini) for verification and int8 calibration, or --no-verify."
        )

    with _Staging(os.path.join(os.fspath(output), classifier.name)) as staging:
        files = _convert(
            classifier, staging, formats, variants, spec, int8_input, calibration_images, source, external
        )
        report = None
        if verify:
            report = _verify(classifier, files, spec, verify_images, staging.files, agreement_only=pretrained)
        recommended = _choose_tflite(report) if variants else None
        if recommended:
            shutil.copyfile(files[f"tflite_{recommended}"], os.path.join(staging.files, TFLITE_FILE))
        manifest = _manifest(classifier, source, spec, staging.version, formats, variants, files)
        manifest.update(
            recommended_tflite=tflite_file(recommended) if recommended else None,
            int8_input=int8_input if integer else None,
            verification=report,
        )
        staging.publish(manifest)
    manifest["folder"] = staging.published_files
    manifest["table"] = format_table(report) if report else ""
    return manifest


def _tflite_variants(formats, quantize, attention):
    """The .tflite files to write: fp32 always, the quantized ones asked for, the attention model."""
    if "tflite" not in formats:
        return ()
    return ("fp32", *quantize, *(("attention",) if attention else ()))


def _pretrained_parameters(source):
    """The parameter count of a pretrained model named by `source`, from the pretrained table and
    the family's formula (no weights read); None for a file or a name the table lacks."""
    from keras_vit.model.pretrained import pretrained_table

    table = pretrained_table()
    tag = table["defaults"].get(source, source)  # an architecture's name: its default tag
    entry = table["tags"].get(tag)
    if entry is None:
        return None
    head = {"num_classes": entry["num_classes"]} if entry["num_classes"] else {"include_top": False}
    return complexity.parameter_count(tag.split(".")[0], image_size=entry["image_size"], **head)


def _size(count):
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.2f} {unit}"
    return f"{count} bytes"


def _check_size(parameters, source, variants):
    """Refuses a TFLite variant over `FORMAT_SIZE_LIMIT` (`ExportTooLargeError`, naming the
    estimate and what to do); returns whether ONNX must keep its weights in external data.
    `parameters` None: not known yet, nothing checked."""
    if parameters is None:
        return False
    for variant in variants:  # fp32 always among them, and the largest
        estimate = parameters * BYTES_PER_WEIGHT[variant]
        if estimate > FORMAT_SIZE_LIMIT:
            raise ExportTooLargeError(
                f"{source}: its TFLite {variant} model would be about {_size(estimate)} ({parameters:,} "
                f"weights x {BYTES_PER_WEIGHT[variant]} bytes), over flatbuffers' limit of "
                f"{_size(FORMAT_SIZE_LIMIT)}, and TFLite always writes fp32 (the quantised variants are "
                f"made from it): export --format saved_model,onnx (the SavedModel keeps its weights "
                f"outside its graph, ONNX in external data), or a smaller model."
            )
    return parameters * BYTES_PER_WEIGHT["onnx"] > FORMAT_SIZE_LIMIT


def _require_tensorflow_backend():
    if keras.backend.backend() != "tensorflow":
        raise ValueError(
            f"Exporting needs the TensorFlow backend (SavedModel, TFLite and ONNX are made from "
            f"TensorFlow graphs), not {keras.backend.backend()}: run it with KERAS_BACKEND=tensorflow. "
            f"A model trained on any backend exports unchanged."
        )


class _Staging:
    """A hidden folder beside the versions that becomes version N only when complete.

    Its name is not a number, so TF Serving never loads it; the pid in it tells a
    later export that it was abandoned.
    """

    def __init__(self, home):
        self.home = home

    def __enter__(self):
        os.makedirs(self.home, exist_ok=True)
        _remove_abandoned_staging(self.home)
        self.version = next_version(self.home)
        self.path = tempfile.mkdtemp(prefix=f".partial-{self.version}-{os.getpid()}-", dir=self.home)
        self.files = os.path.join(self.path, "files")
        self.saved_model = os.path.join(self.path, "saved_model")
        self.published_files = files_folder(self.home, self.version)
        os.makedirs(self.files)
        return self

    def publish(self, manifest):
        """Writes the manifest and renames the files into place, the SavedModel last (with TF
        Serving's batching parameters beside it, unless a file is there already)."""
        write_json(os.path.join(self.files, MANIFEST_FILE), manifest)
        os.rename(self.files, self.published_files)
        if os.path.exists(self.saved_model):
            batching = os.path.join(self.home, BATCHING_FILE)
            if not os.path.exists(batching):  # staged too: a kill never leaves half of it
                staged = os.path.join(self.path, BATCHING_FILE)
                write_bytes(staged, serving.BATCHING_PARAMETERS.encode())
                os.rename(staged, batching)
            os.rename(self.saved_model, os.path.join(self.home, str(self.version)))

    def __exit__(self, kind, error, traceback):
        disk_full = error is not None and is_disk_full(error)
        written = folder_size(self.path) if disk_full else 0
        shutil.rmtree(self.path, ignore_errors=True)
        if disk_full:
            # TensorFlow, LiteRT and ONNX report a full disk in their own error types: one line
            # instead, naming the version and about the space it takes.
            last = [files_folder(self.home, self.version - 1), os.path.join(self.home, str(self.version - 1))]
            raise DiskFullError(self.published_files, max(written, sum(map(folder_size, last)))) from None


def _convert(classifier, staging, formats, variants, spec, int8_input, calibration_images, source, external):
    """Writes every requested file into the staging folder; returns `{kind: path}`."""
    files = {}
    if "saved_model" in formats:
        logger.info("Writing the serving SavedModel ...")
        serving.write_saved_model(classifier, staging.saved_model)
        files["saved_model"] = staging.saved_model
    calibration = None
    if any(v in tflite.INTEGER_VARIANTS for v in variants):
        images = tflite.representative_images(spec, InputContract.of(classifier), count=calibration_images)
        calibration = tflite.Calibration(classifier, images, int8_input)
    for variant in variants:
        logger.info("Converting TFLite %s ...", variant)
        if variant == "attention":
            flatbuffer = tflite.convert_with_attention(classifier)
            description = f"{classifier.name} (fp32, with attention rollout), exported by keras-vit"
        else:
            flatbuffer = tflite.convert(classifier, variant, calibration)
            description = f"{classifier.name} ({variant}), exported by keras-vit from {source}"
        path = os.path.join(staging.files, tflite_file(variant))
        write_bytes(path, metadata.add_metadata(flatbuffer, classifier, description))
        files[f"tflite_{variant}"] = path
    if "onnx" in formats:
        logger.info("Converting ONNX%s ...", " (over 2 GiB: weights in external data)" if external else "")
        files["onnx"] = os.path.join(staging.files, ONNX_FILE)
        onnx_model.write(classifier, files["onnx"], external_data=external)
    with open(os.path.join(staging.files, LABELS_FILE), "w") as f:
        f.write("".join(f"{label}\n" for label in classifier.class_names))
    return files


def _verify(classifier, files, spec, verify_images, folder, agreement_only):
    logger.info("Verifying every export against Keras ...")
    report = verify_exports(classifier.model, files, spec, limit=verify_images, agreement_only=agreement_only)
    write_report(report, folder)
    return report


def _choose_tflite(report):
    """The variant `model.tflite` is a copy of: the recommended one, fp32 when unverified."""
    return recommended_variant(report["results"]) if report else "fp32"


def _written(files):
    """Every file of the export folder that `files` names, the ONNX model's external data included."""
    for kind, path in files.items():
        if kind != "saved_model":
            yield path
        if kind == "onnx" and os.path.exists(onnx_model.data_file(path)):
            yield onnx_model.data_file(path)


def _manifest(classifier, source, spec, version, formats, variants, files):
    return {
        "name": classifier.name,
        "version": version,
        "source": source if locate(source).kind == "pretrained" else os.path.abspath(source),
        "dataset": spec.name,
        "validation_split": spec.validation_split,
        "seed": spec.seed,
        "image_size": list(classifier.image_size),
        "channels": classifier.channels,
        "class_names": classifier.class_names,
        "license": classifier.license,  # the weights' (timm's pretrained_cfg), None when unknown
        "input": InputContract.of(classifier).description()["input"],
        "saved_model": f"../{version}" if "saved_model" in formats else None,
        "files": sorted(os.path.basename(p) for p in _written(files)),
        "tflite_variants": list(variants),
        "keras_vit_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
