"""Where a run trains: `tf.distribute` strategies on TensorFlow, `keras.distribution` on JAX.

`placement(name)` turns `--strategy` into a `Placement` for the active Keras
backend. On TensorFlow: one device, `MirroredStrategy` over the local GPUs,
or `MultiWorkerMirroredStrategy` across processes (`TF_CONFIG`). On JAX:
one device, or `keras.distribution.DataParallel` over the local devices
(`mirrored`, and `auto` with more than one), which splits each global batch.
"""

import contextlib
import dataclasses
import json
import os

import keras
import tensorflow as tf

from keras_vit.training.callbacks import MAX_STEPS_PER_CALL
from keras_vit.training.recipes import STRATEGIES


@dataclasses.dataclass
class Placement:
    """A strategy for the active backend: `scope()` to build in, and whether this process writes."""

    name: str
    strategy: object = None  # the tf.distribute strategy, on TensorFlow
    distribution: object = None  # the keras.distribution, on JAX
    chief: bool = True

    def scope(self):
        return self.strategy.scope() if self.strategy is not None else contextlib.nullcontext()

    @property
    def multi_worker(self):
        return self.name == "multi-worker"

    @property
    def steps_per_call_limit(self):
        """Most training steps Keras may run per compiled call (`steps_per_execution`).

        One under a mirrored TensorFlow strategy: Keras 3 loops over steps with a
        `tf.cond` in the replica context, which fails there ("You must feed a value
        for placeholder tensor", keras-team/keras#19246; Keras 3.15, TF 2.21).
        """
        if self.strategy is None:
            return MAX_STEPS_PER_CALL

        mirrored = (tf.distribute.MirroredStrategy, tf.distribute.MultiWorkerMirroredStrategy)
        return 1 if isinstance(self.strategy, mirrored) else MAX_STEPS_PER_CALL


def placement(name):
    """The `Placement` for `--strategy name` on the active Keras backend.

    On TensorFlow, call it before anything runs a TensorFlow op:
    `MultiWorkerMirroredStrategy` must be made first.
    """
    if name not in STRATEGIES:
        raise ValueError(f"Unknown strategy {name!r}; strategies: {', '.join(STRATEGIES)}.")
    backend = keras.backend.backend()
    if backend == "tensorflow":
        return Placement(name, strategy=_tf_strategy(name), chief=_is_chief())
    if backend == "jax":
        return Placement(name, distribution=_jax_distribution(name))
    if name not in ("auto", "one-device"):
        raise ValueError(f"--strategy {name} needs the tensorflow or jax backend, not {backend}.")
    return Placement(name)


def _tf_strategy(name):
    if name == "multi-worker":
        if "TF_CONFIG" not in os.environ:
            raise ValueError(
                "--strategy multi-worker needs TF_CONFIG describing the cluster and this worker."
            )
        return tf.distribute.MultiWorkerMirroredStrategy()
    gpus = tf.config.list_logical_devices("GPU")
    if name == "auto":
        return tf.distribute.MirroredStrategy() if len(gpus) > 1 else tf.distribute.get_strategy()
    if name == "mirrored":
        return tf.distribute.MirroredStrategy()
    return tf.distribute.OneDeviceStrategy("/gpu:0" if gpus else "/cpu:0")


def _jax_distribution(name):
    if name == "multi-worker":
        raise ValueError(
            "--strategy multi-worker is TensorFlow's (TF_CONFIG); on JAX, start every process "
            "with keras.distribution.initialize() and train with --strategy mirrored, or use "
            "KERAS_BACKEND=tensorflow."
        )
    devices = keras.distribution.list_devices()
    if name == "one-device" or (name == "auto" and len(devices) < 2):
        keras.distribution.set_distribution(None)
        return None
    distribution = keras.distribution.DataParallel(devices=devices)
    keras.distribution.set_distribution(distribution)
    return distribution


def replicas(placement_):
    """How many parts each global batch is split into."""
    if placement_.strategy is not None:
        return placement_.strategy.num_replicas_in_sync
    if placement_.distribution is not None:
        return len(placement_.distribution.device_mesh.devices.flatten())
    return 1


def _is_chief():
    """Whether this process writes the run's files (the chief, or the only worker)."""
    tf_config = json.loads(os.environ.get("TF_CONFIG", "{}"))
    task = tf_config.get("task", {})
    return task.get("type", "chief") == "chief" or (
        task.get("type") == "worker"
        and task.get("index", 0) == 0
        and "chief" not in tf_config.get("cluster", {})
    )
