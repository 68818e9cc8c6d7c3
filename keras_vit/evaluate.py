"""Evaluation of a trained model: top-1, top-5, per-class accuracy and a confusion matrix."""

import os

import numpy as np

from keras_vit import data, pipeline
from keras_vit.files import pyplot, save_figure, write_json


def evaluate(model, dataset="cifar10-mini", split=None, batch_size=100, validation_split=0.1, seed=0):
    """Scores `model` on a dataset split (its test split when it has one, else validation).

    `validation_split` and `seed` must match training's for a carved
    validation split to hold the same images.

    Returns:
        A dict with `top1`, `top5`, `per_class` accuracy, the `confusion`
        matrix (rows: true class, columns: predicted), `count` and `split`.
    """
    folder = data.load_dataset(dataset, validation_split=validation_split, seed=seed)
    split = split or ("test" if "test" in folder.splits else "validation")
    class_names = list(folder.class_names)
    model_classes = getattr(model, "class_names", None)
    if model_classes is not None and list(model_classes) != class_names:
        raise ValueError(
            f"The model's classes {model_classes} differ from the dataset's {class_names}; "
            f"evaluate on the dataset the model was trained for."
        )
    batches = pipeline.evaluation_batches(
        folder[split].to_dataset(),
        image_size=tuple(model.input_shape[1:3]),
        batch_size=batch_size,
        cache=False,
    )
    scores = model.predict(batches.map(lambda batch: batch["images"]), verbose=0)
    labels = np.asarray(folder[split].labels)
    ranked = np.argsort(-scores, axis=1)
    top1 = ranked[:, 0] == labels
    top5 = (ranked[:, : min(5, len(class_names))] == labels[:, None]).any(axis=1)
    confusion = np.zeros((len(class_names), len(class_names)), dtype=int)
    np.add.at(confusion, (labels, ranked[:, 0]), 1)
    per_class = {
        name: float(confusion[i, i] / max(confusion[i].sum(), 1)) for i, name in enumerate(class_names)
    }
    return {
        "dataset": folder.source,
        "split": split,
        "count": int(len(labels)),
        "top1": float(top1.mean()),
        "top5": float(top5.mean()),
        "per_class": per_class,
        "class_names": class_names,
        "confusion": confusion.tolist(),
    }


def plot_confusion(result, path):
    """Writes the confusion matrix as a PNG, atomically."""
    confusion = np.asarray(result["confusion"])
    names = result["class_names"]
    size = max(4, 0.5 * len(names) + 2)
    figure, axis = pyplot().subplots(figsize=(size, size))
    axis.imshow(confusion, cmap="Blues")
    axis.set_xticks(range(len(names)), names, rotation=90)
    axis.set_yticks(range(len(names)), names)
    axis.set_xlabel("predicted")
    axis.set_ylabel("true")
    axis.set_title(f"{result['split']}: top-1 {result['top1']:.3f}")
    for (i, j), count in np.ndenumerate(confusion):
        axis.text(j, i, str(count), ha="center", va="center", fontsize=7)
    figure.tight_layout()
    save_figure(figure, path)


def write_report(result, folder):
    """Writes `evaluation.json` and `confusion.png` into `folder`."""
    write_json(os.path.join(folder, "evaluation.json"), result)
    plot_confusion(result, os.path.join(folder, "confusion.png"))
