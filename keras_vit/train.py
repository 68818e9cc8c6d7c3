"""Training with `model.fit` under a `tf.distribute` strategy: the project's main job.

`train(TrainConfig(...))` (or `keras-vit train`) reads a dataset, builds or
fine-tunes a ViT, trains it with a recipe worth using (AdamW without decay
on norms, biases and embeddings; warmup then cosine decay; gradient
clipping; label smoothing; stochastic depth), survives being killed
(`BackupAndRestore`, mid-epoch), and leaves a run folder:

    model.keras        the best model by validation accuracy (class names and
                       normalisation inside), written atomically
    class_names.json   the labels, in output order
    preprocessing.json image size, mean and std: what the model expects
    history.json       per-epoch metrics and the final ones
    training.png       the training curves
    log.csv, logs/     a CSV log and TensorBoard logs
"""

import dataclasses
import json
import logging
import math
import os

import keras
import tensorflow as tf

from keras_vit import configs, data, optimizers, pipeline
from keras_vit.files import atomic_write, pyplot, save_figure, write_json
from keras_vit.models import create_model
from keras_vit.recipes import NO_DECAY, PRECISIONS, PRESETS, STRATEGIES
from keras_vit.weights import load_weights

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class TrainConfig:
    """Everything a run needs; `keras-vit train` flags map one to one."""

    dataset: str = "cifar10-mini"
    model: str = "vit_nano_patch4_32"
    output: str = "runs/latest"
    preset: str = "scratch"
    epochs: int = 15
    batch_size: int = 128
    learning_rate: float | None = None
    weight_decay: float | None = None
    warmup_epochs: float | None = None
    label_smoothing: float = 0.1
    clipnorm: float = 1.0
    dropout: float = 0.0
    drop_path_rate: float | None = None
    image_size: int | None = None
    validation_split: float = 0.1
    crop: str | None = None
    randaugment: int = 0
    mixup: float = 0.0
    cutmix: float = 0.0
    precision: str = "float32"
    jit_compile: bool = True
    strategy: str = "auto"
    weights: str | None = None
    freeze_backbone: bool = False
    image_mean: tuple = (0.5, 0.5, 0.5)
    image_std: tuple = (0.5, 0.5, 0.5)
    seed: int = 0
    backup_every_steps: int = 100
    steps_per_epoch: int | None = None
    overrides: dict = dataclasses.field(default_factory=dict)  # more create_model arguments

    def validate(self):
        if self.preset not in PRESETS:
            raise ValueError(f"Unknown preset {self.preset!r}; presets: {sorted(PRESETS)}.")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"Unknown strategy {self.strategy!r}; strategies: {', '.join(STRATEGIES)}.")
        if self.precision not in PRECISIONS:
            raise ValueError(f"Unknown precision {self.precision!r}; choose {', '.join(PRECISIONS)}.")
        configs.get_model_config(self.model)
        for name in ("epochs", "batch_size", "backup_every_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}.")
        for name in ("learning_rate", "weight_decay", "warmup_epochs", "label_smoothing", "clipnorm"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must not be negative, got {value}.")
        if self.learning_rate == 0:
            raise ValueError("learning_rate must be positive.")
        # These come from their own settings or from the dataset; an override would disagree.
        owned = {"num_classes", "class_names", "image_size", "dropout", "drop_path_rate"}
        owned |= {"image_mean", "image_std", "dtype", "name"}
        clash = sorted(owned & set(self.overrides))
        if clash:
            raise ValueError(
                f"--override cannot set {clash}: use the matching flag (e.g. --image-size, --precision) "
                f"or let the dataset decide (classes)."
            )


def _resolved(config):
    """The config with the preset's values where the user left None."""
    values = dataclasses.asdict(config)
    for key, value in PRESETS[config.preset].items():
        if values.get(key) is None:
            values[key] = value
    model_size = configs.get_model_config(config.model)["image_size"]
    values["image_size"] = values["image_size"] or model_size
    if values["crop"] is None:
        values["crop"] = "pad" if values["image_size"] <= 64 else "resized"
    return TrainConfig(**values)


def make_strategy(name):
    """The `tf.distribute` strategy for `--strategy`."""
    if name == "multi-worker":  # before anything initialises TensorFlow's devices
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


def _fit_under_multi_worker(model, strategy, sample_batch):
    """Mends two places where Keras 3's `fit` breaks under MultiWorkerMirroredStrategy
    (tensorflow/tensorflow#72388), for this model and process only:

    - `_maybe_symbolic_build` reduces a distributed batch with `strategy.reduce`, which the
      collective strategy cannot do eagerly: the model is built here from one local batch.
    - `reduce_per_replica` averages every log over axis 0, and logs are scalars: scalars
      are averaged over the workers with no axis.
    """
    from keras.src.backend.tensorflow import trainer as tensorflow_trainer

    with strategy.scope():
        model._symbolic_build(data_batch=sample_batch)
    model._maybe_symbolic_build = lambda iterator=None, data_batch=None: None

    reduce_per_replica = tensorflow_trainer.reduce_per_replica
    if getattr(reduce_per_replica, "mends_scalars", False):
        return

    def reduce_scalars_without_axis(values, strategy, reduction):
        if reduction in ("auto", "mean") and tensorflow_trainer._collective_all_reduce_multi_worker(strategy):

            def reduce(value):
                rank = (value.values[0] if hasattr(value, "values") else value).shape.rank
                return strategy.reduce("MEAN", value, axis=0 if rank else None)

            return keras.tree.map_structure(reduce, values)
        return reduce_per_replica(values, strategy, reduction)

    reduce_scalars_without_axis.mends_scalars = True
    tensorflow_trainer.reduce_per_replica = reduce_scalars_without_axis


def _is_chief():
    """Whether this process writes the run's files (the chief, or the only worker)."""
    tf_config = json.loads(os.environ.get("TF_CONFIG", "{}"))
    task = tf_config.get("task", {})
    return task.get("type", "chief") == "chief" or (
        task.get("type") == "worker"
        and task.get("index", 0) == 0
        and "chief" not in tf_config.get("cluster", {})
    )


class BestModelCheckpoint(keras.callbacks.Callback):
    """Saves the model with the best validation accuracy, atomically, on the chief only."""

    def __init__(self, path, monitor="val_accuracy", enabled=True, previous_best=-math.inf):
        super().__init__()
        self.path, self.monitor, self.enabled = path, monitor, enabled
        self.best = previous_best  # from the attempts before a restart
        self.best_epoch = None if previous_best == -math.inf else -1

    def on_epoch_end(self, epoch, logs=None):
        value = (logs or {}).get(self.monitor)
        if value is None or value <= self.best:
            return
        self.best, self.best_epoch = value, epoch
        if self.enabled:
            atomic_write(self.path, self.model.save)


def _step(model):
    """The optimizer's step count, also for a distributed (mirrored) variable."""
    return int(keras.ops.convert_to_numpy(model.optimizer.iterations))


class ResumableBackup(keras.callbacks.BackupAndRestore):
    """`BackupAndRestore` that resumes in the epoch the restored step count is in.

    Keras records the epoch at backup time, which for a backup taken on an
    epoch's last batch is the epoch already finished: it would be replayed
    whole. The optimizer's step count says exactly where the run was.
    """

    def __init__(self, backup_dir, steps_per_epoch, save_freq):
        super().__init__(backup_dir, save_freq=save_freq, double_checkpoint=True)
        self.steps_per_epoch = steps_per_epoch

    def _load_model(self):
        super()._load_model()
        if os.path.exists(self._weights_path):
            self.model._initial_epoch = _step(self.model) // self.steps_per_epoch


class StopAtStep(keras.callbacks.Callback):
    """Ends training after exactly `total_steps` optimizer steps.

    Keras' `BackupAndRestore` restores a mid-epoch backup (weights and the
    optimizer's step count) but replays the interrupted epoch from its first
    batch. Stopping on the step count makes a resumed run end after the same
    number of steps as an uninterrupted one: its last epoch is cut short by
    the batches that were replayed.
    """

    def __init__(self, total_steps):
        super().__init__()
        self.total_steps = total_steps

    def on_train_batch_end(self, batch, logs=None):
        if _step(self.model) >= self.total_steps:
            self.model.stop_training = True


def build_model(config, num_classes, class_names):
    """The ViT for a run: named config, overrides, optional pretrained weights."""
    arguments = dict(
        num_classes=num_classes,
        image_size=config.image_size,
        dropout=config.dropout,
        drop_path_rate=config.drop_path_rate,
        image_mean=list(config.image_mean),
        image_std=list(config.image_std),
        class_names=list(class_names),
        dtype=config.precision,
    )
    model = create_model(config.model, **{**arguments, **config.overrides})
    if config.weights:
        load_weights(model, config.weights)
    if config.freeze_backbone:
        for layer in model.layers:
            layer.trainable = layer.name in ("head", "pre_logits")
    return model


def _optimizer(config, total_steps, warmup_steps):
    schedule = keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=0.0,
        warmup_target=config.learning_rate,
        warmup_steps=warmup_steps,
        decay_steps=max(total_steps - warmup_steps, 1),
        alpha=0.01,
    )
    optimizer = optimizers.AdamW(  # clips the all-reduced gradient under a strategy
        learning_rate=schedule, weight_decay=config.weight_decay, global_clipnorm=config.clipnorm or None
    )
    optimizer.exclude_from_weight_decay(var_names=NO_DECAY)
    return optimizer


def _plot(history, path):
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


@dataclasses.dataclass
class TrainingRun:
    """What `train` returns: the trained model (last epoch) and the run's summary."""

    model: keras.Model
    summary: dict


def train(config):
    """Runs a training job; returns a `TrainingRun`.

    Killed and started again with the same config and output folder, it
    resumes from the last backup (mid-epoch) and ends after the same number
    of steps as an uninterrupted run.
    """
    config.validate()
    config = _resolved(config)
    # First: MultiWorkerMirroredStrategy must be made before TensorFlow runs any op.
    strategy = make_strategy(config.strategy)
    keras.utils.set_random_seed(config.seed)
    chief = _is_chief()
    output = config.output

    dataset = data.load_dataset(config.dataset, validation_split=config.validation_split, seed=config.seed)
    class_names = list(dataset.class_names)
    num_classes = len(class_names)
    image_size = (config.image_size, config.image_size)
    augmentation = pipeline.Augmentation(
        crop=config.crop,
        flip=True,
        randaugment_ops=config.randaugment,
        mixup=config.mixup,
        cutmix=config.cutmix,
        min_scale=0.35 if config.preset == "finetune" else 0.08,
    )
    train_split, val_split = dataset["train"], dataset["validation"]
    if len(train_split) < config.batch_size:
        raise ValueError(
            f"{dataset.source} has {len(train_split)} training images, fewer than one batch of "
            f"{config.batch_size}; lower --batch-size."
        )
    common = dict(image_size=image_size, num_classes=num_classes, seed=config.seed)
    train_data = pipeline.make_dataset(
        train_split.to_dataset(),
        batch_size=config.batch_size,
        training=True,
        augmentation=augmentation,
        num_examples=len(train_split),
        **common,
    )
    val_data = (
        pipeline.make_dataset(val_split.to_dataset(), batch_size=config.batch_size, training=False, **common)
        if len(val_split)
        else None
    )

    steps_per_epoch = config.steps_per_epoch or len(train_split) // config.batch_size
    total_steps = steps_per_epoch * config.epochs
    warmup_steps = min(int(config.warmup_epochs * steps_per_epoch), total_steps // 2)

    with strategy.scope():
        model = build_model(config, num_classes, class_names)
        model.compile(
            optimizer=_optimizer(config, total_steps, warmup_steps),
            loss=keras.losses.CategoricalCrossentropy(
                from_logits=True, label_smoothing=config.label_smoothing
            ),
            metrics=[
                keras.metrics.CategoricalAccuracy(name="accuracy"),
                keras.metrics.TopKCategoricalAccuracy(k=min(5, num_classes), name="top5_accuracy"),
            ],
            jit_compile=config.jit_compile,
        )

    if os.path.exists(os.path.join(output, "history.json")):
        raise ValueError(
            f"{output} already holds a finished run (history.json); choose another --output or delete it."
        )
    os.makedirs(output, exist_ok=True)
    if chief:
        write_json(os.path.join(output, "class_names.json"), class_names)
        write_json(
            os.path.join(output, "preprocessing.json"),
            {
                "image_size": list(image_size),
                "image_mean": list(config.image_mean),
                "image_std": list(config.image_std),
                "input_range": [0, 255],
                "resize": "bilinear, antialiased, to image_size",
            },
        )
    earlier = _merged_history(os.path.join(output, "log.csv"), {}).get("val_accuracy", [])
    best = BestModelCheckpoint(
        os.path.join(output, "model.keras"), enabled=chief, previous_best=max(earlier, default=-math.inf)
    )
    callbacks = [
        ResumableBackup(os.path.join(output, "backup"), steps_per_epoch, config.backup_every_steps),
        StopAtStep(total_steps),
        best,
        keras.callbacks.CSVLogger(os.path.join(output, "log.csv"), append=True),
        keras.callbacks.TensorBoard(os.path.join(output, "logs"), update_freq="epoch"),
    ]
    logger.info(
        "Training %s on %s: %d classes, %d train / %d validation images, %d epochs of %d steps.",
        config.model,
        dataset.source,
        num_classes,
        len(train_split),
        len(val_split),
        config.epochs,
        steps_per_epoch,
    )
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        _fit_under_multi_worker(model, strategy, next(iter(train_data)))
    fit = model.fit(
        train_data.repeat() if config.steps_per_epoch else train_data,
        validation_data=val_data,
        epochs=config.epochs,
        steps_per_epoch=config.steps_per_epoch,
        callbacks=callbacks,
        shuffle=False,  # the pipeline shuffles, with the run's seed
        verbose=2,
    )
    history = _merged_history(os.path.join(output, "log.csv"), fit.history)
    if best.best_epoch is None and chief:  # no validation split: keep the last model
        atomic_write(os.path.join(output, "model.keras"), model.save)
    final = {key: values[-1] for key, values in history.items() if values}
    summary = {
        "config": dataclasses.asdict(config),
        "steps": total_steps,
        "optimizer_steps": _step(model),
        "final": final,
        "best_val_accuracy": None if best.best_epoch is None else best.best,
        "history": history,
    }
    if chief:
        write_json(os.path.join(output, "history.json"), summary)
        _plot(history, os.path.join(output, "training.png"))
    return TrainingRun(model=model, summary=summary)


def _merged_history(csv_path, fit_history):
    """Per-epoch metrics over all attempts of a resumed run, from the appended CSV log."""
    import csv

    if not os.path.exists(csv_path):
        return {k: list(v) for k, v in fit_history.items()}
    by_epoch = {}
    with open(csv_path) as f:
        for row in csv.DictReader(f):
            if row.get("epoch", "").isdigit():
                by_epoch[int(row["epoch"])] = row  # a rerun epoch replaces its earlier row
    keys = [k for k in next(iter(by_epoch.values()), {}) if k != "epoch"]
    return {k: [float(by_epoch[e][k]) for e in sorted(by_epoch) if by_epoch[e].get(k)] for k in keys}
