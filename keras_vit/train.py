"""Training with `model.fit`: the project's main job, on TensorFlow (the default) or JAX.

`train(TrainConfig(...))` (or `keras-vit train`) reads a dataset, builds or
fine-tunes a ViT, trains it with a recipe worth using (AdamW without decay
on norms, biases and embeddings; warmup then cosine decay; gradient
clipping; label smoothing; stochastic depth; augmentation on whole batches
inside the compiled step), on one device or several (`keras_vit.distribute`),
survives being killed (`BackupAndRestore`, mid-epoch), and leaves a run folder:

    model.keras        the best model by validation accuracy (class names and
                       normalisation inside), written atomically
    class_names.json   the labels, in output order
    preprocessing.json image size, mean and std: what the model expects
    history.json       per-epoch metrics and the final ones
    training.png       the training curves
    log.csv, logs/     a CSV log and TensorBoard logs
"""

import dataclasses
import logging
import math
import os
import sys

import keras

from keras_vit import configs, data, distribute, optimizers, pipeline
from keras_vit.augment import BatchAugmentation
from keras_vit.callbacks import (
    BestModelCheckpoint,
    EpochTimer,
    ResumableBackup,
    StopAtStep,
    optimizer_step,
    saved_model_of,
    steps_per_execution,
)
from keras_vit.files import atomic_write, pyplot, save_figure, write_json
from keras_vit.models import create_model
from keras_vit.recipes import DEFAULTS, NO_DECAY, PRECISIONS, PRESETS, STRATEGIES
from keras_vit.training_model import TrainingModel
from keras_vit.weights import load_weights

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class TrainConfig:
    """Everything a run needs; `keras-vit train` flags map one to one.

    A setting left None comes from the preset (`recipes.PRESETS`), else from
    `recipes.DEFAULTS`: `resolved()` fills them in.
    """

    dataset: str = "cifar10-mini"
    model: str | None = None
    output: str = "runs/latest"
    preset: str = "scratch"
    epochs: int | None = None
    batch_size: int | None = None
    learning_rate: float | None = None
    weight_decay: float | None = None
    warmup_epochs: float | None = None
    label_smoothing: float | None = None
    clipnorm: float = 1.0
    dropout: float = 0.0
    drop_path_rate: float | None = None
    image_size: int | None = None
    validation_split: float | None = None
    crop: str | None = None
    crop_min_scale: float | None = None
    flip: bool = True
    randaugment: int | None = None
    mixup: float | None = None
    cutmix: float | None = None
    random_erasing: float | None = None
    repeated_augmentation: int | None = None
    ema: float | None = None  # momentum of the weights' moving average; 0 is off
    precision: str | None = None
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
        """Raises ValueError for a setting no run can use; call it on a `resolved()` config."""
        if self.strategy not in STRATEGIES:
            raise ValueError(f"Unknown strategy {self.strategy!r}; strategies: {', '.join(STRATEGIES)}.")
        if self.precision not in PRECISIONS:
            raise ValueError(f"Unknown precision {self.precision!r}; choose {', '.join(PRECISIONS)}.")
        configs.get_model_config(self.model)
        for name in ("epochs", "batch_size", "backup_every_steps", "repeated_augmentation"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}.")
        not_negative = ("learning_rate", "weight_decay", "warmup_epochs", "label_smoothing", "clipnorm")
        for name in not_negative + ("randaugment", "mixup", "cutmix", "random_erasing"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must not be negative, got {value}.")
        if self.random_erasing > 1:
            raise ValueError(f"random_erasing is a probability in [0, 1], got {self.random_erasing}.")
        if not 0 <= self.ema < 1:
            raise ValueError(f"ema is a momentum in [0, 1) (0 is off), got {self.ema}.")
        if not 0 < self.crop_min_scale <= 1:
            raise ValueError(
                f"crop_min_scale is a fraction of the area in (0, 1], got {self.crop_min_scale}."
            )
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

    def resolved(self):
        """This config with every setting left None taken from the preset, else from
        `recipes.DEFAULTS`; validated."""
        if self.preset not in PRESETS:
            raise ValueError(f"Unknown preset {self.preset!r}; presets: {', '.join(sorted(PRESETS))}.")
        values = dataclasses.asdict(self)
        for source in (PRESETS[self.preset], DEFAULTS):
            for key, value in source.items():
                if values.get(key) is None:
                    values[key] = value
        model_size = configs.get_model_config(values["model"])["image_size"]
        values["image_size"] = values["image_size"] or model_size
        if values["crop"] is None:
            values["crop"] = "pad" if values["image_size"] <= 64 else "resized"
        config = TrainConfig(**values)
        config.validate()
        return config


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
        learning_rate=schedule,
        weight_decay=config.weight_decay,
        global_clipnorm=config.clipnorm or None,
        use_ema=config.ema > 0,
        ema_momentum=config.ema or 0.99,
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
    """What `train` returns: the trained classifier (last epoch), the model `fit` trained
    (the classifier with its augmentation and optimizer) and the run's summary."""

    model: keras.Model
    training_model: keras.Model
    summary: dict


@dataclasses.dataclass
class _Data:
    source: str
    class_names: list
    train: object
    validation: object
    train_count: int
    validation_count: int


def _read_data(config):
    """The run's training and validation batches, as `{"images", "labels"}` dicts."""
    dataset = data.load_dataset(config.dataset, validation_split=config.validation_split, seed=config.seed)
    train_split, val_split = dataset["train"], dataset["validation"]
    if len(train_split) < config.batch_size:
        raise ValueError(
            f"{dataset.source} has {len(train_split)} training images, fewer than one batch of "
            f"{config.batch_size}; lower --batch-size."
        )
    image_size = (config.image_size, config.image_size)
    train_batches = pipeline.training_batches(
        train_split.to_dataset(),
        image_size=image_size,
        batch_size=config.batch_size,
        seed=config.seed,
        num_examples=len(train_split),
        repeats=config.repeated_augmentation,
    )
    val_batches = None
    if len(val_split):
        val_batches = pipeline.evaluation_batches(
            val_split.to_dataset(), image_size=image_size, batch_size=config.batch_size
        )
    return _Data(
        source=dataset.source,
        class_names=list(dataset.class_names),
        train=train_batches,
        validation=val_batches,
        train_count=len(train_split),
        validation_count=len(val_split),
    )


def _augmentation(config):
    return BatchAugmentation(
        crop=config.crop,
        min_scale=config.crop_min_scale,
        flip=config.flip,
        randaugment_ops=config.randaugment,
        mixup=config.mixup,
        cutmix=config.cutmix,
        erasing=config.random_erasing,
        seed=config.seed,
        name="augmentation",
    )


def compile_training_model(config, classifier, total_steps, warmup_steps, execution_steps):
    """The classifier wrapped with its augmentation (a `TrainingModel`), compiled with the
    recipe of a resolved `config` (`config.resolved()`); build it inside the strategy's scope."""
    on_tensorflow = keras.backend.backend() == "tensorflow"
    model = TrainingModel(
        classifier, _augmentation(config), xla_classifier=config.jit_compile and on_tensorflow
    )
    num_classes = classifier.num_classes
    model.compile(
        optimizer=_optimizer(config, total_steps, warmup_steps),
        loss=keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=config.label_smoothing),
        metrics=[
            keras.metrics.CategoricalAccuracy(name="accuracy"),
            keras.metrics.TopKCategoricalAccuracy(k=min(5, num_classes), name="top5_accuracy"),
        ],
        # TensorFlow compiles the classifier alone (TrainingModel's xla_classifier).
        jit_compile=config.jit_compile and not on_tensorflow,
        steps_per_execution=execution_steps,
    )
    return model


def _write_run_description(output, class_names, config):
    write_json(os.path.join(output, "class_names.json"), class_names)
    write_json(
        os.path.join(output, "preprocessing.json"),
        {
            "image_size": [config.image_size, config.image_size],
            "image_mean": list(config.image_mean),
            "image_std": list(config.image_std),
            "input_range": [0, 255],
            "resize": "bilinear, antialiased, to image_size",
        },
    )


def train(config, progress_bar=None):
    """Runs a training job; returns a `TrainingRun`.

    `progress_bar`: Keras' bar per step, else a line per epoch; by default
    the bar when standard output is a terminal, lines in a log file.

    Killed and started again with the same config and output folder, it
    resumes from the last backup (mid-epoch) and ends after the same number
    of steps as an uninterrupted run.
    """
    config = config.resolved()
    # First: MultiWorkerMirroredStrategy must be made before TensorFlow runs any op.
    where = distribute.placement(config.strategy)
    keras.utils.set_random_seed(config.seed)
    output = config.output
    if os.path.exists(os.path.join(output, "history.json")):
        raise ValueError(
            f"{output} already holds a finished run (history.json); choose another --output or delete it."
        )

    run_data = _read_data(config)
    steps_per_epoch = config.steps_per_epoch or run_data.train_count // config.batch_size
    total_steps = steps_per_epoch * config.epochs
    warmup_steps = min(int(config.warmup_epochs * steps_per_epoch), total_steps // 2)
    execution_steps = steps_per_execution(
        steps_per_epoch, config.backup_every_steps, limit=where.steps_per_call_limit
    )

    with where.scope():
        classifier = build_model(config, len(run_data.class_names), run_data.class_names)
        model = compile_training_model(config, classifier, total_steps, warmup_steps, execution_steps)

    os.makedirs(output, exist_ok=True)
    if where.chief:
        _write_run_description(output, run_data.class_names, config)
    earlier = _merged_history(os.path.join(output, "log.csv"), {}).get("val_accuracy", [])
    best = BestModelCheckpoint(
        os.path.join(output, "model.keras"),
        enabled=where.chief,
        previous_best=max(earlier, default=-math.inf),
    )
    backup = ResumableBackup(os.path.join(output, "backup"), steps_per_epoch, config.backup_every_steps)
    callbacks = [
        backup,
        StopAtStep(total_steps, backup),
        # With --ema: validate, save and keep the weights' moving average (before `best`).
        *([keras.callbacks.SwapEMAWeights(swap_on_epoch=True)] if config.ema else []),
        best,
        EpochTimer(config.batch_size),  # before the CSV log, which writes what it adds
        keras.callbacks.CSVLogger(os.path.join(output, "log.csv"), append=True),
        keras.callbacks.TensorBoard(os.path.join(output, "logs"), update_freq="epoch"),
    ]
    logger.info(
        "Training %s on %s (%s backend): %d classes, %d train / %d validation images, "
        "%d epochs of %d steps, %d steps per call.",
        config.model,
        run_data.source,
        keras.backend.backend(),
        len(run_data.class_names),
        run_data.train_count,
        run_data.validation_count,
        config.epochs,
        steps_per_epoch,
        execution_steps,
    )
    if where.multi_worker:
        distribute.prepare_multi_worker_fit(model, where.strategy, next(iter(run_data.train)))
    fit = model.fit(
        run_data.train.repeat() if config.steps_per_epoch else run_data.train,
        validation_data=run_data.validation,
        epochs=config.epochs,
        steps_per_epoch=config.steps_per_epoch,
        callbacks=callbacks,
        shuffle=False,  # the pipeline shuffles, with the run's seed
        verbose=keras_verbosity(progress_bar, sys.stdout),
    )
    history = _merged_history(os.path.join(output, "log.csv"), fit.history)
    if best.best_epoch is None and where.chief:  # no validation split: keep the last model
        atomic_write(os.path.join(output, "model.keras"), saved_model_of(model).save)
    summary = {
        "config": dataclasses.asdict(config),
        "backend": keras.backend.backend(),
        "steps": total_steps,
        "optimizer_steps": optimizer_step(model),
        "final": {key: values[-1] for key, values in history.items() if values},
        "best_val_accuracy": None if best.best_epoch is None else best.best,
        "history": history,
    }
    if where.chief:
        write_json(os.path.join(output, "history.json"), summary)
        _plot(history, os.path.join(output, "training.png"))
    return TrainingRun(model=classifier, training_model=model, summary=summary)


def keras_verbosity(progress_bar, stream):
    """`fit`'s verbose: 1 (Keras' progress bar) or 2 (a line per epoch); by default the bar
    when `stream` is a terminal, lines in a log file (where a bar writes a line per update)."""
    return 1 if (stream.isatty() if progress_bar is None else progress_bar) else 2


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
    history = {}
    for key in keys:
        # CSVLogger writes NA for a metric an epoch lacks, and adds val_ columns even with no validation.
        values = [by_epoch[e].get(key) for e in sorted(by_epoch)]
        values = [float(v) for v in values if v not in (None, "", "NA")]
        if values:
            history[key] = values
    return history
