"""What is at a path: the one answer for every command, runner and app.

A path a user gives is a run folder, a `.keras` file, a SavedModel folder, an export folder
(`export-<N>`, whose `model.tflite` the apps ship), a `.tflite` (with `model_attention.tflite`
beside it when `--attention` wrote one), an `.onnx`, a pretrained checkpoint, or a pretrained
model's name (`vit_small_patch16_224.augreg_in21k_ft_in1k`, `hf-hub:org/repo`). `locate` says
which, the file to open and the folder its reports go beside; it reads no file's contents.
"""

import dataclasses
import os

from keras_vit.model import pretrained
from keras_vit.model.formats import CHECKPOINT_SUFFIXES
from keras_vit.storage.export_folder import ATTENTION_FILE, MANIFEST_FILE, TFLITE_FILE, ExportFolder
from keras_vit.storage.run_folder import MODEL_FILE, RunFolder


@dataclasses.dataclass(frozen=True)
class Located:
    """`kind`: "keras" (a `.keras` file or run folder), "saved_model", "tflite", "onnx",
    "checkpoint" or "pretrained" (a name, `keras_vit.model.pretrained`, that no file has). `path`:
    the file or folder to open, or the name. `folder`: where reports about it go (an
    export's `export-<N>`, else the run folder or the file's folder). `attention`: the
    attention model beside a `.tflite`, or None."""

    kind: str
    path: str
    folder: str
    attention: str | None = None


def locate(path):
    """What is at `path` (see `Located`).

    Raises:
        FileNotFoundError: nothing at `path`.
        ValueError: a folder or file that holds no model keras-vit reads (one line that says
            what it takes).
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        if pretrained.is_pretrained_name(path):
            return Located("pretrained", path, os.getcwd())
        if pretrained.looks_like_a_name(path):
            raise ValueError(f"No file {path}, and it is no pretrained name: {pretrained.unknown_name(path)}")
        raise FileNotFoundError(f"Model not found: {path}")
    if os.path.isdir(path):
        return _folder(path)
    extension = os.path.splitext(path)[1].lower()
    folder = os.path.dirname(os.path.abspath(path))  # an export's export-<N>, a run folder
    if extension == ".tflite":
        attention = os.path.join(os.path.dirname(path), ATTENTION_FILE)
        beside = os.path.exists(attention) and not os.path.samefile(attention, path)
        return Located("tflite", path, folder, attention if beside else None)
    kinds = {".keras": "keras", ".onnx": "onnx", **dict.fromkeys(CHECKPOINT_SUFFIXES, "checkpoint")}
    if extension in kinds:
        return Located(kinds[extension], path, folder)
    raise ValueError(
        f"Cannot run {path}: expected a .keras file, a run folder, a SavedModel folder, "
        f"a .tflite or an .onnx."
    )


def recorded_dataset(path):
    """The `DatasetSpec` recorded beside the model at `path`: its export folder's manifest, else
    its run's history; an unknown dataset for a file with neither."""
    folder = locate(path).folder
    if os.path.exists(os.path.join(folder, MANIFEST_FILE)):
        return ExportFolder(folder).dataset_spec()
    return RunFolder(folder).dataset_spec()


def _folder(path):
    if os.path.exists(os.path.join(path, "saved_model.pb")):
        return Located("saved_model", path, _saved_model_reports_folder(path))
    if os.path.exists(os.path.join(path, MODEL_FILE)):
        return Located("keras", os.path.join(path, MODEL_FILE), os.path.abspath(path))
    if os.path.exists(os.path.join(path, TFLITE_FILE)):  # an export-N folder: what the apps ship
        return locate(os.path.join(path, TFLITE_FILE))
    raise ValueError(
        f"{path} is neither a run folder ({MODEL_FILE}), a SavedModel (saved_model.pb) nor an "
        f"export folder ({TFLITE_FILE})."
    )


def _saved_model_reports_folder(path):
    """A SavedModel `<N>`'s reports go to the `export-<N>` beside it, which holds its manifest."""
    path = os.path.abspath(path)
    sibling = os.path.join(os.path.dirname(path), f"export-{os.path.basename(path)}")
    return sibling if os.path.isdir(sibling) else os.path.dirname(path)
