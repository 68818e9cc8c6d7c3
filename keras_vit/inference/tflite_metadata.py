"""Reading the metadata `keras-vit export` packs into a `.tflite` (export/metadata.py writes it).

What the apps and `keras_vit.inference.runtimes` need from a model file: its name,
description, normalisation and class names, with no TensorFlow.
"""

import functools
import importlib.util
import io
import json
import os
import struct
import zipfile

from keras_vit.storage.export_folder import LABELS_FILE, TRANSFORM_FILE

METADATA_NAME = "TFLITE_METADATA"  # the model buffer that holds the ModelMetadata flatbuffer


@functools.cache
def schemas():
    """MediaPipe's pure-Python flatbuffer schemas: (metadata, model).

    Loaded from their files: importing them as `mediapipe.tasks.metadata.*` runs mediapipe's
    package start-up, which imports TensorFlow (4 s) and which reading a `.tflite` never needs."""
    found = importlib.util.find_spec("mediapipe")  # finds the package without running it
    if found is None:
        raise ImportError("Reading .tflite metadata needs mediapipe: pip install 'keras-vit[export]'.")
    folder = os.path.join(found.submodule_search_locations[0], "tasks", "metadata")
    return tuple(
        _module_from_file(f"keras_vit._mediapipe_{name}", os.path.join(folder, f"{name}.py"))
        for name in ("metadata_schema_py_generated", "schema_py_generated")
    )


def _module_from_file(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read_metadata(flatbuffer):
    """Reads what our metadata records: `{"name", "description", "license", "mean", "std",
    "labels", "transform"}` (`license`: the weights', None when the export did not know it).

    Raises:
        ValueError: the model has no metadata or no label file.
    """
    try:
        return _read_metadata(flatbuffer)
    except (struct.error, IndexError, UnicodeDecodeError, AttributeError, TypeError):
        # flatbuffers reads offsets blindly: a cut-off or foreign file fails deep inside it.
        raise ValueError(
            "This .tflite is damaged or truncated (it ends before its tables do); export it again."
        ) from None


def _read_metadata(flatbuffer):
    fb, schema = schemas()
    model = schema.Model.GetRootAs(flatbuffer, 0)
    for i in range(model.MetadataLength()):
        if model.Metadata(i).Name().decode() == METADATA_NAME:
            data = model.Buffers(model.Metadata(i).Buffer()).DataAsNumpy().tobytes()
            break
    else:
        raise ValueError("This .tflite has no metadata; export it with `keras-vit export`.")
    metadata = fb.ModelMetadataT.InitFromObj(fb.ModelMetadata.GetRootAs(data, 0))
    image = metadata.subgraphMetadata[0].inputTensorMetadata[0]
    mean, std = [0.0], [1.0]
    for unit in image.processUnits or []:
        if unit.optionsType == fb.ProcessUnitOptions.NormalizationOptions:
            mean, std = list(unit.options.mean), list(unit.options.std)
    return {
        "name": metadata.name.decode() if metadata.name else None,
        "description": metadata.description.decode() if metadata.description else "",
        "license": metadata.license.decode() if metadata.license else None,
        "mean": [float(m) for m in mean],
        "std": [float(s) for s in std],
        "labels": read_labels(flatbuffer),
        "transform": read_transform(flatbuffer),
    }


def read_transform(flatbuffer):
    """The evaluation transform packed in a `.tflite` (a dict), or None in one exported before."""
    try:
        with zipfile.ZipFile(io.BytesIO(flatbuffer)) as archive:
            return json.loads(archive.read(TRANSFORM_FILE))
    except KeyError:
        return None
    except (zipfile.BadZipFile, ValueError):
        raise ValueError(f"This .tflite's {TRANSFORM_FILE} cannot be read; export it again.") from None


def read_labels(flatbuffer):
    """The class names from the label file packed in a `.tflite`."""
    try:
        with zipfile.ZipFile(io.BytesIO(flatbuffer)) as archive:
            text = archive.read(LABELS_FILE).decode()
    except (zipfile.BadZipFile, KeyError):
        raise ValueError(f"This .tflite has no {LABELS_FILE}; export it with `keras-vit export`.") from None
    return text.splitlines()
