"""The figures keras-vit writes: a run's training curves and an evaluation's confusion matrix."""

import numpy as np

from keras_vit.files import pyplot, save_figure


def training_curves(history, path):
    """Writes the loss and accuracy curves of a run's history as a PNG, atomically."""
    figure, (loss_axis, accuracy_axis) = pyplot().subplots(1, 2, figsize=(10, 4))
    epochs = range(1, len(history["loss"]) + 1)
    for key in ("loss", "val_loss"):
        if key in history:
            loss_axis.plot(epochs, history[key], label=key)
    for key in ("accuracy", "val_accuracy"):
        if key in history:
            accuracy_axis.plot(epochs, history[key], label=key)
    for axis, title in ((loss_axis, "loss"), (accuracy_axis, "accuracy")):
        axis.set_xlabel("epoch")
        axis.set_title(title)
        axis.grid(alpha=0.3)
        axis.legend()
    figure.tight_layout()
    save_figure(figure, path)


def confusion_matrix(result, path):
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
