"""Classifying image files with a trained model: top-k class names and probabilities."""

import os

import numpy as np

from keras_vit.images import load_image
from keras_vit.pipeline import resize
from keras_vit.runtimes import TOP_K, ranked


def read_image(path, image_size):
    """Reads one image file (any mode, EXIF-rotated) to float32 pixels in [0, 255] at `image_size`.

    Raises:
        FileNotFoundError: no file at `path`.
        ValueError: the file is a directory, empty, or not a decodable image.
    """
    return resize(load_image(path), image_size).numpy()


def predict_files(runner, paths, top_k=TOP_K):
    """Classifies image files; a bad file is reported and the others still classified.

    Args:
        runner: a `keras_vit.runtimes.Runner` (`open_model(path)`) for a
            `.keras` file, run folder, SavedModel, `.tflite` or `.onnx`.

    Returns:
        One dict per path: `{"path", "top_k": [{"class", "index", "probability"}]}`
        or `{"path", "error"}`.
    """
    class_names = runner.class_names
    results, images, good = [], [], []
    for path in paths:
        try:
            images.append(read_image(path, runner.image_size))
            good.append(len(results))
            results.append({"path": os.fspath(path)})
        except (FileNotFoundError, ValueError) as error:
            results.append({"path": os.fspath(path), "error": str(error)})
    if images:
        for row, index in zip(runner.predict(np.stack(images)), good, strict=True):
            results[index]["top_k"] = [
                {"class": name, "index": i, "probability": probability}
                for name, i, probability in ranked(row, class_names, top_k)
            ]
    return results
