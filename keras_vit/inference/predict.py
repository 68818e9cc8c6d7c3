"""Classifying image files with a trained model: top-k class names and probabilities."""

import os

import numpy as np

from keras_vit.data.contract import InputContract
from keras_vit.inference.runtimes import TOP_K, ranked
from keras_vit.model.transform import DEFAULT


def read_image(path, image_size, transform=DEFAULT):
    """Reads one image file (any mode, EXIF-rotated) to float32 pixels in [0, 255] at `image_size`,
    by the input contract (`keras_vit.data.contract`) with the model's evaluation `transform`.

    Raises:
        FileNotFoundError: no file at `path`.
        ValueError: the file is a directory, empty, or not a decodable image.
    """
    return InputContract(tuple(image_size), transform=transform).read(path)


def predict_files(runner, paths, top_k=TOP_K):
    """Classifies image files; a bad file is reported and the others still classified.

    Args:
        runner: a `keras_vit.inference.runtimes.Runner` (`open_model(path)`) for a
            `.keras` file, run folder, SavedModel, `.tflite` or `.onnx`.

    Returns:
        One dict per path: `{"path", "top_k": [{"class", "index", "probability"}]}`
        or `{"path", "error"}`.
    """
    return list(iter_predictions(runner, paths, top_k))


def iter_predictions(runner, paths, top_k=TOP_K, batch_size=32):
    """`predict_files`' dicts one by one, in order, as each batch of `batch_size` images is
    classified: memory holds one batch whatever the number of paths, and a caller can show
    each answer as it comes."""
    contract = InputContract.of(runner)
    pending, images = [], 0  # (result, image or None), in the order of `paths`
    for path in paths:
        result = {"path": os.fspath(path)}
        try:
            pending.append((result, contract.read(path)))
            images += 1
        except (FileNotFoundError, ValueError) as error:
            result["error"] = str(error)
            pending.append((result, None))
        if images == batch_size:
            yield from _classified(runner, pending, top_k)
            pending, images = [], 0
    yield from _classified(runner, pending, top_k)


def _classified(runner, pending, top_k):
    images = [image for _, image in pending if image is not None]
    rows = iter(runner.predict(np.stack(images)) if images else [])
    for result, image in pending:
        if image is not None:
            result["top_k"] = [
                {"class": name, "index": i, "probability": probability}
                for name, i, probability in ranked(next(rows), runner.class_names, top_k)
            ]
        yield result
