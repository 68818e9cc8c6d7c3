"""Saving and loading the `.keras` and `.weights.h5` files keras-vit writes.

Saving serialises in memory and writes the bytes with plain Python (`write_bytes`): HDF5 can
crash the process when it closes a file whose writes failed for lack of space, so it never
writes to a disk that can fill. Loading gives one clear line for a file that does not load.
"""

import contextlib
import io
import os
import re
import zipfile

import keras
from keras.src.saving import saving_lib

from keras_vit.files import write_bytes
from keras_vit.model import registry
from keras_vit.storage.locate import locate

# Registers every family's model and layers with Keras, whoever started the process: a run's
# `model.keras` names only them. A file that holds the training wrapper or keras-vit's optimizer
# needs `keras_vit.training` too, which `import keras_vit` and the `keras-vit` command import.
registry.register_with_keras()


def save_model(model, path):
    """`model.save(path)` for a `.keras` file, serialised in memory, written atomically.

    Raises:
        DiskFullError: no space for the file; `path` keeps its previous version.
    """
    buffer = io.BytesIO()
    # Keras' own route for a file object (it uses it for remote paths): the zip and the HDF5
    # weights inside it are made in memory.
    with _variables_made_locally():
        saving_lib.save_model(model, buffer)
    write_bytes(path, buffer.getvalue())


def weights_file_bytes(model):
    """The bytes `model.save_weights` writes to a `.weights.h5` file, made in memory.

    Keras' `save_weights_only` opens its HDF5 store on a path; the store takes an in-memory
    file as well, and the state is saved the same way (tests/test_reliability.py checks that
    Keras loads the result as its own).
    """
    if not model.built:
        raise ValueError("The model is not built yet: call it on a batch before saving its weights.")
    buffer = io.BytesIO()
    store = saving_lib.H5IOStore(buffer, mode="w")
    try:
        with _variables_made_locally():
            saving_lib._save_state(
                model, weights_store=store, assets_store=None, inner_path="", visited_saveables=set()
            )
    finally:
        store.close()
    return buffer.getvalue()


@contextlib.contextmanager
def _variables_made_locally():
    """Keras makes a throwaway optimizer while it saves (`saving_lib.get_attr_skipset`). Under a
    JAX distribution across processes, making a variable waits for every process, and only
    process 0 saves: its variables are made outside the distribution."""
    distribution = keras.distribution.distribution()
    keras.distribution.set_distribution(None)
    try:
        yield
    finally:
        keras.distribution.set_distribution(distribution)


def load_trained_model(path):
    """Loads a `.keras` file, `model.keras` from a run folder, or a pretrained model by name
    (`keras_vit.model.pretrained`)."""
    located = locate(path)
    if located.kind == "pretrained":
        from keras_vit.model.registry import create_model

        return create_model(located.path, pretrained=True)
    if located.kind != "keras":
        raise ValueError(f"Expected a .keras file or a run folder, got {os.fspath(path)}.")
    path = located.path
    if not zipfile.is_zipfile(path):
        raise ValueError(
            f"{path} is not a Keras model file (a .keras file is a zip archive): damaged, or not a model."
        )
    try:
        # safe_mode (Keras' default, stated here on purpose): a file's Lambda layers never run code.
        return keras.models.load_model(path, safe_mode=True)
    except Exception as error:  # Keras raises TypeError, ValueError, KeyError... with long messages
        raise ValueError(_load_error(path, error)) from None


def _load_error(path, error):
    """One readable line for a `.keras` file that does not load."""
    message = str(error)
    if "Lambda" in message and "safe_mode" in message:
        return (
            f"{path} holds a Lambda layer with Python code, which keras-vit does not run (safe_mode): "
            "re-save the model without Lambda layers, or load it yourself with "
            "keras.models.load_model(path, safe_mode=False) if you trust where it came from."
        )
    unknown = re.search(r"Could not locate (?:class|function) '([^']+)'", message)
    if unknown:
        return (
            f"{path} was saved by another project: it uses {unknown.group(1)!r}, which is neither a "
            "Keras nor a keras-vit class. Import that project's layers first, or pass a keras-vit model."
        )
    first_line = message.strip().splitlines()[0] if message.strip() else type(error).__name__
    return f"{path} could not be loaded as a Keras model ({first_line[:300]})."
