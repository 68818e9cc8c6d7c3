"""DeiT's hard-label distillation: `--teacher` trains a distilled student's second head on the
teacher's top class, with any model file `keras-vit predict` runs as the teacher."""

import json

import numpy as np
import pytest
from conftest import COLOR_CLASSES
from PIL import Image

from keras_vit.cli import main
from keras_vit.data import datasets as data
from keras_vit.model.vit import distilled_heads
from keras_vit.storage.saving import load_trained_model
from keras_vit.training.config import TrainConfig
from keras_vit.training.teacher import open_teacher
from keras_vit.training.train import train

TINY_DISTILLED = dict(hidden_dim=32, depth=2, num_heads=4, mlp_dim=64, distillation_token=True)


def _training_images(dataset):
    split = data.load_dataset(dataset, validation_split=0.25, seed=0)["train"]
    images = np.stack([np.asarray(Image.open(path).convert("RGB"), "float32") for path in split.images])
    return images, np.asarray(split.labels)


def test_the_distillation_head_learns_the_teachers_labels_and_the_class_head_the_truth(
    colors_dataset, colour_teacher, tmp_path
):
    """The teacher is wrong on every image, so the two heads can only both succeed by learning
    different things: the [cls] head the folders' labels, the distillation head the teacher's."""
    run = train(
        TrainConfig(
            dataset=colors_dataset, output=str(tmp_path / "run"), epochs=5, batch_size=8,
            validation_split=0.25, learning_rate=3e-3, overrides=TINY_DISTILLED, jit_compile=False,
            drop_path_rate=0.0, label_smoothing=0.0, crop="none", flip=False, teacher=str(colour_teacher),
        ),
        progress_bar=False,
    )  # fmt: skip
    images, labels = _training_images(colors_dataset)
    teacher_labels = load_trained_model(colour_teacher).predict(images, verbose=0).argmax(-1)
    assert (teacher_labels != labels).all()

    heads = distilled_heads(run.model).predict(images, verbose=0)
    assert (heads["head"].argmax(-1) == labels).mean() >= 0.9
    assert (heads["head_dist"].argmax(-1) == teacher_labels).mean() >= 0.9
    # The student answers with the mean of its heads; its saved best model holds no teacher.
    mean = (heads["head"] + heads["head_dist"]) / 2
    np.testing.assert_allclose(run.model.predict(images, verbose=0), mean, atol=1e-5)
    saved = load_trained_model(tmp_path / "run")
    assert [w.shape for w in saved.weights] == [w.shape for w in run.model.weights]

    history = json.loads((tmp_path / "run" / "history.json").read_text())
    assert {"teacher_agreement", "val_teacher_agreement"} <= set(history["history"])
    cost = history["teacher"]
    assert cost["kind"] == "keras" and cost["seconds_per_batch"] > 0 and 0 < cost["share_of_step"] <= 1
    assert cost["images_per_second"] == pytest.approx(8 / cost["seconds_per_batch"])


def test_a_tflite_teacher_gives_the_keras_teachers_labels_inside_the_graph(
    colors_dataset, colour_teacher, colour_teacher_tflite
):
    """A `.tflite` teacher runs on the host (tf.numpy_function) inside a traced step, on images of
    another size than its own (resized first), and gives the labels its Keras original gives."""
    import tensorflow as tf

    images, _ = _training_images(colors_dataset)
    images = tf.image.resize(images[:16], (48, 48))  # the student's size; the teacher takes 32
    labels = {}
    for kind, path in (("keras", colour_teacher), ("tflite", colour_teacher_tflite)):
        teacher = open_teacher(path, COLOR_CLASSES)
        assert teacher.kind == kind
        labels[kind] = tf.function(teacher.hard_labels)(images).numpy()
    assert labels["tflite"].shape == (16, 3)
    np.testing.assert_array_equal(labels["tflite"], labels["keras"])


def test_a_teacher_of_other_classes_or_a_student_without_a_distillation_token_is_refused(
    colors_dataset, colour_teacher, tmp_path, capsys
):
    with pytest.raises(ValueError, match=r"scores the classes \['blue', 'green', 'red'\].*same classes"):
        open_teacher(colour_teacher, ["cat", "dog", "frog"])
    with pytest.raises(ValueError, match="has no distillation token: use a deit_\\*_distilled_\\* model"):
        TrainConfig(dataset=colors_dataset, teacher=str(colour_teacher)).resolved()

    flags = [
        "--dataset",
        colors_dataset,
        "--output",
        str(tmp_path / "run"),
        "--override=distillation_token=true",
    ]
    assert main(["train", *flags, "--teacher", str(tmp_path / "missing.keras")]) == 1
    assert "Teacher not found" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    assert main(["train", *flags, "--teacher", str(colour_teacher), "--distillation-weight", "1.5"]) == 1
    assert "distillation_weight is in [0, 1]" in capsys.readouterr().err
