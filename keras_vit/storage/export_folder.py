"""An export folder: the files `keras-vit export` writes, and the one way to read them.

    OUTPUT/<name>/<N>/             the SavedModel TF Serving loads (version N)
    OUTPUT/<name>/batching_parameters.txt
                                   TF Serving's --batching_parameters_file (written once, yours
                                   to tune: a later export keeps it)
    OUTPUT/<name>/export-<N>/      model.tflite (the recommended variant), model_<variant>.tflite,
                                   model_attention.tflite (with --attention), model.onnx,
                                   labels.txt, export.json, verification.json, verification.md

`export.json` (the manifest) names every file and the dataset the exports
were verified on; `ExportFolder` reads it for `keras-vit verify` and the apps.
"""

import os

from keras_vit.files import read_json
from keras_vit.storage.run_folder import DatasetSpec

MANIFEST_FILE = "export.json"
LABELS_FILE = "labels.txt"  # one class name per line: here, in SavedModel assets and in TFLite metadata
LICENSE_FILE = "license.txt"  # the weights' licence (timm's pretrained_cfg), in SavedModel assets
# The evaluation transform (crop_pct, crop_mode, interpolation) as JSON: in SavedModel assets, in
# TFLite metadata, and as an ONNX metadata entry of this name.
TRANSFORM_FILE = "transform.json"
TFLITE_FILE = "model.tflite"  # the variant apps should ship
ATTENTION_FILE = "model_attention.tflite"
ONNX_FILE = "model.onnx"
BATCHING_FILE = "batching_parameters.txt"
VERIFICATION_FILES = ("verification.json", "verification.md")
# Held-out images an export is verified on against Keras, by default.
VERIFY_IMAGES = 500
# The formats `keras-vit export` writes.
EXPORT_FORMATS = ("saved_model", "tflite", "onnx")
# The TFLite variants, in the order they are exported and reported (`keras_vit.export.tflite`
# makes them): float, then integer (`int8` and `int16x8` by `keras_vit.export.quantize`'s
# recipes, `int8_strict` with no float op at all).
TFLITE_VARIANTS = ("fp32", "fp16", "dynamic", "int8", "int16x8", "int8_strict")
INTEGER_VARIANTS = ("int8", "int16x8", "int8_strict")
# What an export writes beside fp32 unless told: the integer variants are opt-in (16-bit ones run
# LiteRT's reference loops; int8 is faster than fp32 only with int8 dot-product instructions).
DEFAULT_QUANTIZATIONS = ("fp16", "dynamic")


def tflite_file(variant):
    """`model_fp16.tflite` for variant `fp16`; `attention` is the fp32 model with the rollout output."""
    return ATTENTION_FILE if variant == "attention" else f"model_{variant}.tflite"


def files_folder(home, version):
    """Where version `version`'s files go: `export-<N>`, beside the SavedModel folder `<N>`."""
    return os.path.join(home, f"export-{version}")


class ExportFolder:
    """An `OUTPUT/<name>/export-<N>` folder, read through its manifest."""

    def __init__(self, path):
        self.path = os.fspath(path)
        manifest = os.path.join(self.path, MANIFEST_FILE)
        if not os.path.exists(manifest):
            raise FileNotFoundError(
                f"No {MANIFEST_FILE} in {self.path}: give an export folder (OUTPUT/<name>/export-<N>)."
            )
        self.manifest = read_json(manifest)

    def dataset_spec(self):
        """The dataset and held-out split the exports were verified on."""
        return DatasetSpec.from_record(self.manifest)

    def exports(self):
        """`{kind: path}` for every export: `saved_model`, `tflite_<variant>`, `onnx`."""
        found = {}
        if self.manifest.get("saved_model"):
            found["saved_model"] = os.path.normpath(os.path.join(self.path, self.manifest["saved_model"]))
        for variant in self.manifest.get("tflite_variants", []):
            found[f"tflite_{variant}"] = os.path.join(self.path, tflite_file(variant))
        if ONNX_FILE in self.manifest["files"]:
            found["onnx"] = os.path.join(self.path, ONNX_FILE)
        return found
