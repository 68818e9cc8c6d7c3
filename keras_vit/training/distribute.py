"""Where a run trains: `tf.distribute` strategies on TensorFlow, `keras.distribution` on JAX.

`placement(name)` turns `--strategy` into a `Placement` for the active Keras
backend. On TensorFlow: one device, `MirroredStrategy` over the local GPUs,
or `MultiWorkerMirroredStrategy` across processes (`TF_CONFIG`). On JAX:
one device; `keras.distribution.DataParallel` over the local devices
(`mirrored`, and `auto` with more than one), which splits each global batch;
the same over every device of several processes (`multi-worker`, started from
Keras' `KERAS_DISTRIBUTION_*` variables); or `keras.distribution.ModelParallel`
(`model-parallel`), a `batch` x `model` mesh whose `model` axis shards the
kernels the model's family names (`Family.model_parallel_layout`).
"""

import contextlib
import dataclasses
import functools
import json
import logging
import os

import keras
import tensorflow as tf

from keras_vit.training import jax_job
from keras_vit.training.callbacks import MAX_STEPS_PER_CALL
from keras_vit.training.recipes import STRATEGIES

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class Placement:
    """A strategy for the active backend: `scope()` to build in, and whether this process writes."""

    name: str
    strategy: object = None  # the tf.distribute strategy, on TensorFlow
    distribution: object = None  # the keras.distribution, on JAX
    chief: bool = True
    processes: int = 1  # JAX processes that each read their share of every global batch
    process_index: int = 0

    def scope(self):
        return self.strategy.scope() if self.strategy is not None else contextlib.nullcontext()

    def wait_for_all(self):
        """Returns once every process of a JAX job has called it (at once with one process)."""
        if self.processes > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices("keras-vit")

    def check_batch_size(self, batch_size):
        """Refuses a global batch that JAX cannot split evenly over the batch axis's devices (every
        process's): it would fail inside the step, or train each process on a different share."""
        parts = replicas(self) if self.distribution is not None else 1
        if batch_size % parts:
            nearest = max(parts, batch_size - batch_size % parts)
            raise ValueError(
                f"--batch-size {batch_size} does not split evenly over the {parts} devices of the "
                f"batch axis: choose a multiple of {parts}, e.g. {nearest}."
            )

    @property
    def multi_worker(self):
        return self.name == "multi-worker"

    @property
    def writes_run_folder(self):
        """Whether this process writes the run folder: all but process 0 of a JAX job share its
        folder and leave it to process 0 (a TensorFlow worker has its own)."""
        return self.chief or self.processes == 1

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

    def local_batches(self, dataset):
        """This process's share of each global batch of `dataset` (the whole batch with one
        process): process i of n takes the i-th n-th, as Keras' own auto-sharding does."""
        if self.processes == 1:
            return dataset
        size = tf.data.experimental.get_structure(dataset)["images"].shape[0]
        return dataset.rebatch(size // self.processes).shard(self.processes, self.process_index)

    def evaluation_batches(self, dataset, count, batch_size):
        """`dataset`'s `count` images in batches of `batch_size` that split evenly over this
        process's share of the batch axis: JAX cannot split a last, partial batch of 2 over 4
        devices. Leaves out the last `count % shards` images (fewer than the devices), and says
        so."""
        shards = replicas(self) // self.processes if self.distribution is not None else 1
        if dataset is None or shards == 1 or count % shards == 0:
            return dataset
        kept = count - count % shards
        logger.warning(
            "Validating on %d of the %d validation images: each batch must split evenly over %d devices.",
            kept,
            count,
            shards,
        )
        return dataset.unbatch().take(kept).batch(batch_size)


def placement(name, family=None, model_parallel=None):
    """The `Placement` for `--strategy name` on the active Keras backend; `family` and
    `model_parallel` (the size of the mesh's `model` axis) for `model-parallel`.

    Call it before anything runs a TensorFlow op or a JAX computation: TensorFlow's
    `MultiWorkerMirroredStrategy` and JAX's distributed runtime must be started first.
    """
    if name not in STRATEGIES:
        raise ValueError(f"Unknown strategy {name!r}; strategies: {', '.join(STRATEGIES)}.")
    backend = keras.backend.backend()
    if backend == "tensorflow":
        return Placement(name, strategy=_tf_strategy(name), chief=_is_chief())
    if backend == "jax":
        return _jax_placement(name, family, model_parallel)
    if name not in ("auto", "one-device"):
        raise ValueError(f"--strategy {name} needs the tensorflow or jax backend, not {backend}.")
    return Placement(name)


def _tf_strategy(name):
    if name == "model-parallel":
        raise ValueError(
            "--strategy model-parallel needs KERAS_BACKEND=jax (Keras' TensorFlow distribution "
            "backend is a prototype); on TensorFlow, --lora-rank makes a big model fit."
        )
    if name == "multi-worker":
        if "TF_CONFIG" not in os.environ:
            raise ValueError(
                "--strategy multi-worker needs TF_CONFIG describing the cluster and this worker."
            )
        return tf.distribute.MultiWorkerMirroredStrategy()
    gpus = tf.config.list_logical_devices("GPU")
    if name == "auto":
        return mirrored_strategy() if len(gpus) > 1 else tf.distribute.get_strategy()
    if name == "mirrored":
        return mirrored_strategy()
    return tf.distribute.OneDeviceStrategy("/gpu:0" if gpus else "/cpu:0")


@functools.cache
def mirrored_strategy(devices=None):
    """The process's one MirroredStrategy over `devices` (a tuple; None: every GPU). A second
    strategy would number its collectives from the start again, and a run after one with other
    weight shapes would fail with "Shape mismatch in the collective instance" (tensorflow#62790)."""
    return tf.distribute.MirroredStrategy(list(devices) if devices else None)


def _jax_placement(name, family, model_parallel):
    if name != "multi-worker" and jax_job.described():
        raise ValueError(
            f"{', '.join(jax_job.VARIABLES)} describe a job across processes, but --strategy is "
            f"{name}: pass --strategy multi-worker, or unset them to train in this process alone."
        )
    job = jax_job.start() if name == "multi-worker" else None
    devices = keras.distribution.list_devices()
    if name == "model-parallel":
        distribution = _model_parallel(devices, family, model_parallel)
    elif name == "one-device" or (name == "auto" and len(devices) < 2):
        distribution = None
    else:
        distribution = keras.distribution.DataParallel(devices=devices)
    if job is not None:
        # Each process feeds its own share of the training batches (`local_batches`), and the
        # whole validation set: Keras' auto-sharding would give one process the last, partial
        # batch alone. A metric over the validation set repeated once per process is the same mean.
        distribution.auto_shard_dataset = False
    keras.distribution.set_distribution(distribution)
    if job is None:
        return Placement(name, distribution=distribution)
    return Placement(
        name,
        distribution=distribution,
        chief=job.process_id == 0,
        processes=job.num_processes,
        process_index=job.process_id,
    )


def _model_parallel(devices, family, size):
    """`ModelParallel` over a `batch` x `model` mesh of `devices`, `size` devices along `model`,
    sharding what `family` declares."""
    if size is None or size < 1 or len(devices) % size:
        divisors = [str(n) for n in range(1, len(devices) + 1) if len(devices) % n == 0]
        raise ValueError(
            f"--model-parallel {size} must divide the {len(devices)} devices this process sees "
            f"(choose one of {', '.join(divisors)})."
        )
    mesh = keras.distribution.DeviceMesh((len(devices) // size, size), ("batch", "model"), devices)
    layout = keras.distribution.LayoutMap(mesh)
    for pattern, axes in family.model_parallel_layout.items():
        layout[pattern] = axes
    return keras.distribution.ModelParallel(layout_map=layout, batch_dim_name="batch")


def replicas(placement_):
    """How many parts each global batch is split into."""
    if placement_.strategy is not None:
        return placement_.strategy.num_replicas_in_sync
    if placement_.distribution is not None:
        # The batch axis: the only axis of DataParallel's mesh, the first of ModelParallel's.
        return placement_.distribution.device_mesh.shape[0]
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
