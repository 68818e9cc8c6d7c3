"""The teacher of DeiT's hard-label distillation: a trained classifier run inside the training step.

    teacher = open_teacher("runs/big/model.keras", class_names)   # any file `keras-vit predict` runs
    labels = teacher.hard_labels(augmented_images)                 # one-hot of its top class

A Keras teacher (a `.keras` file or run folder) runs in the compiled step as a
frozen part of the graph. A SavedModel, `.tflite` or `.onnx` runs on the host
through a callback (`tf.numpy_function` on TensorFlow, `jax.pure_callback` on
JAX): slower, and the step cannot be compiled across it, but any export can teach.
Either way the teacher runs once per batch, in inference mode, on the images the
student sees (after augmentation), resized to its own input size when it differs.
"""

import threading
import time

import keras
import numpy as np
from keras import ops

from keras_vit.data.contract import InputContract
from keras_vit.inference.runtimes import KerasRunner, open_model


class Teacher:
    """A trained classifier whose top class a distilled student's second head learns.

    Attributes:
        path: the model file.
        kind: the runner's kind (`keras`, `saved_model`, `tflite`, `onnx`).
        contract: its `InputContract` (image size, classes); the student's images are resized
            by it.
        image_size: `(height, width)` it takes.
        num_classes: how many classes it scores.
        model: the frozen Keras model for a Keras teacher, else None.
    """

    def __init__(self, path, runner):
        self.path = str(path)
        self.runner = runner
        self.kind = runner.kind
        self.contract = InputContract.of(runner)
        self.image_size = self.contract.image_size
        self.num_classes = len(runner.class_names)
        self._classifier = runner.classifier if isinstance(runner, KerasRunner) else None
        self.model = None if self._classifier is None else self._classifier.model
        if self.model is not None:
            self.model.trainable = False
        self._host_lock = threading.Lock()  # one interpreter, called from each replica's thread

    def probabilities(self, images):
        """Class probabilities `(batch, classes)` for float pixels in [0, 255] (a backend tensor)."""
        images = self.contract.resize_batch(images)
        if self._classifier is not None:
            return ops.stop_gradient(self._classifier.probabilities(images))  # training=False
        return ops.stop_gradient(self._on_host(images))

    def hard_labels(self, images):
        """One-hot float32 labels of the teacher's top class: DeiT's hard distillation targets."""
        top = ops.argmax(self.probabilities(images), axis=-1)
        return ops.one_hot(top, self.num_classes, dtype="float32")

    def _predict_on_host(self, images):
        with self._host_lock:
            return self.runner.predict(np.asarray(images, dtype=np.float32)).astype(np.float32)

    def _on_host(self, images):
        backend = keras.backend.backend()
        if backend == "tensorflow":
            import tensorflow as tf

            probabilities = tf.numpy_function(self._predict_on_host, [images], tf.float32, stateful=False)
            return tf.ensure_shape(probabilities, (images.shape[0], self.num_classes))
        if backend == "jax":
            import jax

            shape = jax.ShapeDtypeStruct((images.shape[0], self.num_classes), np.float32)
            return jax.pure_callback(self._predict_on_host, shape, images, vmap_method="sequential")
        raise ValueError(
            f"A {self.kind} teacher runs on TensorFlow or JAX, not {backend}: use a .keras teacher, "
            f"or KERAS_BACKEND=tensorflow."
        )

    def seconds_per_batch(self, images, repeats=3):
        """The teacher's time for one batch of `images`, measured alone after one warm-up call:
        what distillation adds to each training step, roughly (a compiled step overlaps some)."""
        images = ops.convert_to_tensor(np.asarray(images, dtype=np.float32))
        run = self.probabilities
        if keras.backend.backend() == "tensorflow":
            import tensorflow as tf

            run = tf.function(self.probabilities)
        elif keras.backend.backend() == "jax":
            import jax

            run = jax.jit(self.probabilities)
        keras.ops.convert_to_numpy(run(images))
        start = time.perf_counter()
        for _ in range(repeats):
            keras.ops.convert_to_numpy(run(images))
        return (time.perf_counter() - start) / repeats


def open_teacher(path, class_names):
    """The teacher at `path` (any file `keras-vit predict` runs) for a dataset's `class_names`.

    Open it inside the strategy's scope: a Keras teacher's weights are placed like the student's.

    Raises:
        FileNotFoundError: nothing at `path`.
        ValueError: not a model we can run, or another set of classes.
    """
    runner = open_model(path)
    teacher_classes = list(runner.class_names or [])
    if teacher_classes != list(class_names):
        raise ValueError(
            f"The teacher {path} scores the classes {_shown(teacher_classes)}, and this dataset has "
            f"{_shown(class_names)}: a teacher must be trained on the same classes, in the same order."
        )
    if runner.channels != 3:
        raise ValueError(f"The teacher {path} takes {runner.channels} channels; the student takes RGB.")
    return Teacher(path, runner)


def _shown(names, limit=8):
    names = list(names)
    return str(names) if len(names) <= limit else f"{names[:limit]}... ({len(names)} classes)"
