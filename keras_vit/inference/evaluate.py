"""Evaluation of a trained or exported model: top-1, top-5, per-class accuracy and a confusion matrix.

Any model file runs through `keras_vit.inference.runtimes`, so a quantized `.tflite` is scored on
the same images, decoded and resized the same way, as the Keras model it came from. A
`.tflite` or `.onnx` is scored without TensorFlow: a folder or `.zip` is then read with
Pillow and NumPy (`keras_vit.data.images`), which give the pixels the tf.data pipeline gives.
"""

import concurrent.futures
import os

import numpy as np

from keras_vit.data import datasets
from keras_vit.data.contract import InputContract
from keras_vit.files import write_json
from keras_vit.inference.runtimes import KerasRunner, Runner
from keras_vit.model import pretrained
from keras_vit.storage import plots
from keras_vit.storage.run_folder import DatasetSpec


def evaluate(model, dataset=datasets.DATASET, split=None, batch_size=100):
    """Scores `model` on a dataset split (its test split when it has one, else validation).

    `model`: a `keras_vit.inference.runtimes.Runner` (`open_model(path)`: `.keras`, run folder,
    SavedModel, `.tflite`, `.onnx`) or a Keras classifier.
    `dataset`: a name (folder, `.zip`, tfds or embedded dataset), or the model's
    `DatasetSpec` (`recorded_dataset(path)`), whose validation split and seed carve the
    same validation images as training did.

    A dataset of some of the model's classes (Imagenette for an ImageNet classifier) is scored
    on its classes alone, the model choosing among them, and also among all the model's classes
    (`model_top1`, `model_top5`: the figure timm's `validate.py` gives on ImageNet data).

    Returns:
        A dict with `top1`, `top5`, `per_class` accuracy, the `confusion`
        matrix (rows: true class, columns: predicted), `count`, `split` and `model_classes`;
        `model_top1` and `model_top5` when the dataset has only some of the model's classes.
    """
    runner = model if isinstance(model, Runner) else KerasRunner(model)
    spec = dataset if isinstance(dataset, DatasetSpec) else DatasetSpec(os.fspath(dataset))
    folder, split = spec.held_out(split)
    class_names = list(folder.class_names)
    columns = _model_columns(runner.class_names, class_names)
    batches = _image_batches(folder[split], InputContract.of(runner), batch_size, runner.uses_tensorflow)
    scores = np.concatenate([runner.predict(batch) for batch in batches])
    labels = np.asarray(folder[split].labels)
    among_all = {}
    if columns is not None:
        among_all = _accuracies(scores, np.asarray(columns)[labels], prefix="model_")
        scores = scores[:, columns]
    confusion = np.zeros((len(class_names), len(class_names)), dtype=int)
    np.add.at(confusion, (labels, scores.argmax(axis=1)), 1)
    per_class = {
        name: float(confusion[i, i] / max(confusion[i].sum(), 1)) for i, name in enumerate(class_names)
    }
    return {
        "dataset": folder.source,
        "split": split,
        "count": int(len(labels)),
        **_accuracies(scores, labels),
        "per_class": per_class,
        "class_names": class_names,
        "confusion": confusion.tolist(),
        # Of how many classes the model chose: the dataset's alone when they are a part of the model's.
        "model_classes": len(class_names) if columns is None else len(runner.class_names),
        **among_all,
    }


def _accuracies(scores, labels, prefix=""):
    """Top-1 and top-5 accuracy of `scores` (n, classes) against `labels`."""
    ranked = np.argsort(-scores, axis=1)[:, :5]
    return {
        f"{prefix}top1": float((ranked[:, 0] == labels).mean()),
        f"{prefix}top5": float((ranked == labels[:, None]).any(axis=1).mean()),
    }


def model_columns(model_classes, class_names):
    """The model's output for each of a dataset's classes, in the dataset's order, each found by
    its name, or by its WordNet id for an ImageNet classifier (the folder names of ImageNet data);
    None when one of them is none of the model's."""
    names = list(model_classes or ())
    column = {name: i for i, name in enumerate(names)}
    column.update((wnid, i) for i, wnid in enumerate(pretrained.wordnet_ids(names) or ()))
    found = [column.get(name) for name in class_names]
    return None if None in found else found


def _model_columns(model_classes, class_names):
    """`model_columns`, or a ValueError naming the classes the model lacks; None when they are
    the model's own. Data of some of the model's classes (Imagenette for an ImageNet
    classifier) is scored on those classes alone."""
    if model_classes is None or list(model_classes) == class_names:
        return None
    names = list(model_classes)
    columns = model_columns(names, class_names)
    if columns is None:
        missing = [name for name in class_names if model_columns(names, [name]) is None]
        shown = ", ".join(missing[:3]) + (", ..." if len(missing) > 3 else "")
        raise ValueError(
            f"{len(missing)} of the dataset's {len(class_names)} classes ({shown}) are none of the "
            f"model's {len(names)} ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''}): evaluate "
            f"on images of the model's classes, in folders named as its classes (or by WordNet id, "
            f"for an ImageNet model)."
        )
    return columns


def _image_batches(split, contract, batch_size, tensorflow):
    """Float32 `(n, height, width, 3)` batches of `split`'s images read by the model's input
    `contract` (its image size and evaluation transform), in order.

    Without `tensorflow` (a `.tflite` or `.onnx` runner), a folder or `.zip` split is decoded
    by the input contract (`keras_vit.data.contract`, Pillow and NumPy): `keras-vit evaluate` then starts
    as fast as `predict`. tfds splits always go through tf.data.
    """
    if tensorflow or not isinstance(split, datasets.Split):
        from keras_vit.data import pipeline

        batches = pipeline.evaluation_batches(
            split.to_dataset(),
            image_size=contract.image_size,
            batch_size=batch_size,
            cache=False,
            transform=contract.transform,
        )
        yield from (batch["images"] for batch in batches.as_numpy_iterator())
        return

    def read(index):
        source = split.images[index]
        try:
            return contract.read(source)
        except ValueError as error:
            if isinstance(source, str):  # the message names the file
                raise
            name = split.names[index] if split.names else f"image {index}"  # a `.zip` member
            raise ValueError(f"{name}: {error}") from None

    with concurrent.futures.ThreadPoolExecutor() as pool:  # Pillow and NumPy release the GIL
        for start in range(0, len(split), batch_size):
            indices = range(start, min(start + batch_size, len(split)))
            yield np.stack(list(pool.map(read, indices)))


def write_report(result, folder):
    """Writes `evaluation.json` and `confusion.png` into `folder`."""
    write_json(os.path.join(folder, "evaluation.json"), result)
    plots.confusion_matrix(result, os.path.join(folder, "confusion.png"))
