"""Training with `model.fit`: the project's main job, on TensorFlow (the default) or JAX.

`train(TrainConfig(...))` (or `keras-vit train`) reads a dataset, builds or
fine-tunes a ViT, trains it with a recipe worth using (AdamW without decay
on norms, biases and embeddings; warmup then cosine decay; gradient
clipping; label smoothing; stochastic depth; augmentation on whole batches
inside the compiled step), on one device or several (`keras_vit.training.distribute`),
survives being killed (`callbacks.ResumableBackup`: an exact mid-epoch resume), and leaves a run
folder (`keras_vit.storage.run_folder` lists its files).

`train` reads as its steps: resolve the config, place it (`distribute`), read
the data, build and compile the model, write the run's description, make the
callbacks, `fit`, write the results.
"""

import dataclasses
import logging
import math
import os
import sys
import zipfile

import keras

from keras_vit.data import pipeline
from keras_vit.data.contract import InputContract
from keras_vit.files import write_json
from keras_vit.model import registry
from keras_vit.model.registry import create_model
from keras_vit.model.transform import Transform
from keras_vit.storage import plots
from keras_vit.storage.run_folder import (
    BACKUP_FOLDER,
    CLASS_NAMES_FILE,
    CURVES_FILE,
    HISTORY_FILE,
    LOG_FILE,
    PREPROCESSING_FILE,
    TENSORBOARD_FOLDER,
    RunFolder,
)
from keras_vit.storage.saving import save_model
from keras_vit.training import distribute, keras_patches, lora, optimizers
from keras_vit.training.augment import BatchAugmentation
from keras_vit.training.callbacks import (
    BestModelCheckpoint,
    EarlyStopping,
    EpochEndWritten,
    EpochLog,
    EpochTimer,
    ResumableBackup,
    TensorBoardLog,
    optimizer_step,
    saved_model_of,
    steps_per_execution,
)
from keras_vit.training.initial_weights import load_weights
from keras_vit.training.teacher import open_teacher
from keras_vit.training.training_model import TrainingModel

logger = logging.getLogger(__name__)


def build_model(config, num_classes, class_names):
    """The model for a run: named config, overrides, optional pretrained weights, then what
    trains (all, the head, or LoRA adapters and the head) and what is recomputed (`--remat`)."""
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
    family = registry.family_of(model)
    if config.weights:
        load_weights(model, config.weights)
    if config.freeze_backbone:
        for layer in model.layers:
            layer.trainable = layer.name in family.head_layers
    if config.freeze_blocks:
        freeze_first_blocks(model, family, config.freeze_blocks)
    if config.lora_rank:
        lora.enable_lora(model, config.lora_rank, config.lora_target_names)
    for name in family.block_names(model.get_config()) if config.remat else ():
        model.get_layer(name).rematerialise = True  # recomputed in the backward pass
    return model


def freeze_first_blocks(model, family, count):
    """Partial fine-tuning: the stem and the first `count` blocks stop training, by the family's
    layer groups (timm's `group_matcher`: group 0 the stem, group i block i - 1)."""
    groups, group_count = family.layer_groups(model)
    blocks = group_count - 1
    if count >= blocks:
        raise ValueError(
            f"--freeze-blocks {count} leaves no block to train: {model.name} has {blocks}; give fewer, "
            f"or --freeze-backbone to train the head alone."
        )
    for name, group in groups.items():
        if group <= count:
            model.get_layer(name).trainable = False


def _optimizer(config, total_steps, warmup_steps, model):
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
        lr_multipliers=(
            optimizers.layer_decay_multipliers(model, config.layer_decay) if config.layer_decay < 1 else None
        ),
    )
    # As timm's no_weight_decay and its 1-d rule, by the model's family.
    optimizer.exclude_from_weight_decay(var_names=list(registry.family_of(model).no_weight_decay))
    return optimizer


@dataclasses.dataclass
class TrainingRun:
    """What `train` returns: the trained classifier (last epoch), the model `fit` trained
    (the classifier with its augmentation and optimizer) and the run's summary."""

    model: keras.Model
    training_model: keras.Model
    summary: dict


def _read_data(config):
    """The run's training stream and validation batches, as `{"images", "labels"}` dicts."""
    return pipeline.read_training_data(
        config.dataset,
        image_size=(config.image_size, config.image_size),
        batch_size=config.batch_size,
        validation_split=config.validation_split,
        seed=config.seed,
        repeats=config.repeated_augmentation,
        transform=_transform(config),
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


def compile_training_model(config, classifier, total_steps, warmup_steps, execution_steps, teacher=None):
    """The classifier wrapped with its augmentation (a `TrainingModel`, with its `teacher` when
    distilling), compiled with the recipe of a resolved `config` (`config.resolved()`); build it
    inside the strategy's scope."""
    on_tensorflow = keras.backend.backend() == "tensorflow"
    model = TrainingModel(
        classifier,
        _augmentation(config),
        xla_classifier=config.jit_compile and on_tensorflow,
        teacher=teacher,
        distillation_weight=config.distillation_weight,
    )
    num_classes = classifier.num_classes
    model.compile(
        optimizer=_optimizer(config, total_steps, warmup_steps, model=classifier),
        loss=keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=config.label_smoothing),
        metrics=[
            keras.metrics.CategoricalAccuracy(name="accuracy"),
            keras.metrics.TopKCategoricalAccuracy(k=min(5, num_classes), name="top5_accuracy"),
        ],
        # TensorFlow compiles the classifier alone (TrainingModel's xla_classifier).
        jit_compile=config.jit_compile and not on_tensorflow,
        steps_per_execution=execution_steps,
    )
    # Built now, not inside the first traced step: a step that makes variables is traced twice.
    model.optimizer.build(model.trainable_variables)
    return model


@dataclasses.dataclass(frozen=True)
class _Schedule:
    steps_per_epoch: int
    total_steps: int
    warmup_steps: int
    steps_per_call: int  # Keras' steps_per_execution


def _schedule(config, run_data, where):
    steps_per_epoch = config.steps_per_epoch or run_data.train_count // config.batch_size
    total_steps = steps_per_epoch * config.epochs
    return _Schedule(
        steps_per_epoch=steps_per_epoch,
        total_steps=total_steps,
        warmup_steps=min(int(config.warmup_epochs * steps_per_epoch), total_steps // 2),
        steps_per_call=steps_per_execution(
            steps_per_epoch, config.backup_every_steps, limit=where.steps_per_call_limit
        ),
    )


def train(config, progress_bar=None):
    """Runs a training job; returns a `TrainingRun`.

    `progress_bar`: Keras' bar per step, else a line per epoch; by default
    the bar when standard output is a terminal, lines in a log file.

    Killed and started again with the same config and output folder, it
    resumes from the last backup (mid-epoch) on the batches it would have
    trained on, and ends as an uninterrupted run would: the same steps, the
    same per-epoch log.
    """
    config = config.resolved()
    # First: MultiWorkerMirroredStrategy must be made before TensorFlow runs any op.
    where = distribute.placement(config.strategy, registry.family_named(config.model), config.model_parallel)
    where.check_batch_size(config.batch_size)
    if config.remat and keras.backend.backend() != "jax":
        raise ValueError(
            "--remat needs KERAS_BACKEND=jax: TensorFlow's recompute_grad cannot carry the blocks' "
            "dropout seeds through the recomputation."
        )
    keras.utils.set_random_seed(config.seed)
    run = RunFolder(config.output)
    if run.finished:
        raise ValueError(
            f"{run.path} already holds a finished run ({HISTORY_FILE}); choose another --output or delete it."
        )

    run_data = _read_data(config)
    if config.early_stopping and not run_data.validation_count:
        raise ValueError(
            "--early-stopping watches the validation accuracy, and this run has no validation images: "
            "give --validation-split (or a val/ folder)."
        )
    _check_same_run(run, run_data.class_names, _preprocessing(config))
    schedule = _schedule(config, run_data, where)
    with where.scope():
        classifier = build_model(config, len(run_data.class_names), run_data.class_names)
        teacher = open_teacher(config.teacher, run_data.class_names) if config.teacher else None
        model = compile_training_model(
            config, classifier, schedule.total_steps, schedule.warmup_steps, schedule.steps_per_call, teacher
        )
    teacher_cost = _teacher_cost(teacher, run_data, config) if teacher else None
    os.makedirs(run.path, exist_ok=True)
    if where.chief:
        _write_run_description(run, run_data.class_names, config)
    callbacks, best, backup = _callbacks(config, run, schedule, where)
    backup.set_model(model)
    start_step = backup.restore()
    _log_start(config, run_data, schedule, start_step)
    if where.multi_worker and where.strategy is not None:  # TensorFlow's
        keras_patches.prepare_multi_worker_fit(model, where.strategy, next(iter(run_data.train_from(0))))
    history = _fit(model, run_data, config, schedule, callbacks, start_step, progress_bar, where)
    summary = _write_results(run, config, model, history, best, schedule, where.chief, teacher_cost, backup)
    return TrainingRun(model=classifier, training_model=model, summary=summary)


def _fit(model, run_data, config, schedule, callbacks, start_step, progress_bar, where):
    """`model.fit` from `start_step` to the last step; the per-epoch history of what it trained.

    Keras starts epochs at their first batch: a run resumed mid-epoch fits the rest of that epoch
    as a shorter epoch first, then the whole epochs after it, each on the stream from its step.
    """
    epoch, batch = divmod(start_step, schedule.steps_per_epoch)
    spans = []  # (first epoch, steps per epoch, first step)
    if batch:
        spans.append((epoch, schedule.steps_per_epoch - batch, start_step))
        epoch += 1
    if epoch < config.epochs:
        spans.append((epoch, schedule.steps_per_epoch, epoch * schedule.steps_per_epoch))
    history = {}
    stopper = next((c for c in callbacks if isinstance(c, EarlyStopping)), None)
    for first_epoch, steps_per_epoch, first_step in spans:
        if stopper is not None and stopper.exhausted:
            break  # --early-stopping ended the run (before a kill, when resumed)
        # The rest of an epoch ends after it, under the run's epoch count (which EMA's last swap reads).
        stop = [] if steps_per_epoch == schedule.steps_per_epoch else [_StopAfterThisEpoch()]
        fit = model.fit(
            where.local_batches(run_data.train_from(first_step)),
            validation_data=where.evaluation_batches(
                run_data.validation, run_data.validation_count, config.batch_size
            ),
            initial_epoch=first_epoch,
            epochs=config.epochs,
            steps_per_epoch=steps_per_epoch,
            callbacks=callbacks + stop,
            shuffle=False,  # the stream is shuffled, with the run's seed
            verbose=keras_verbosity(progress_bar, sys.stdout),
        )
        for key, values in fit.history.items():
            history.setdefault(key, []).extend(values)
    return history


class _StopAfterThisEpoch(keras.callbacks.Callback):
    """Ends the fit of an interrupted epoch's rest. Keras ends every fit as the run's end (with
    EMA, the moving average replaces the weights): the weights go back to the epoch's end."""

    def on_epoch_end(self, epoch, logs=None):
        self.model.stop_training = True
        self._weights = [keras.ops.convert_to_numpy(v) for v in self.model.trainable_variables]

    def on_train_end(self, logs=None):
        for variable, value in zip(self.model.trainable_variables, self._weights, strict=True):
            variable.assign(value)


def _teacher_cost(teacher, run_data, config):
    """What the teacher costs: its time for one training batch, measured alone before training."""
    images = next(iter(run_data.train_from(0)))["images"]
    seconds = teacher.seconds_per_batch(keras.ops.convert_to_numpy(images))
    cost = {
        "path": teacher.path,
        "kind": teacher.kind,
        "seconds_per_batch": seconds,
        "images_per_second": config.batch_size / seconds,
    }
    logger.info(
        "Teacher %s (%s): %.4f s for a batch of %d alone (%.0f images/s); it runs once per training "
        "step and once per validation batch.",
        teacher.path,
        teacher.kind,
        seconds,
        config.batch_size,
        cost["images_per_second"],
    )
    return cost


def _transform(config):
    """How the run's validation images are read, and its model keeps: a pretrained start's own
    transform (`--weights NAME` puts it in the overrides), else a plain resize."""
    return Transform.of(config.overrides)


def _preprocessing(config):
    """The run's input contract, recorded in `preprocessing.json`: a resume must keep it."""
    contract = InputContract(
        (config.image_size, config.image_size),
        image_mean=list(config.image_mean),
        image_std=list(config.image_std),
        transform=_transform(config),
    )
    return contract.description()


def _check_same_run(run, class_names, preprocessing):
    """A run folder resumes only the run that started it: same classes, same input."""
    recorded = run.description()
    if recorded is None:
        return
    recorded_classes, recorded_preprocessing = recorded
    if recorded_classes != list(class_names):
        raise ValueError(
            f"{run.path} holds a run on the classes {recorded_classes}, and this dataset has "
            f"{list(class_names)}: resume it with its own --dataset, or choose another --output."
        )
    changed = sorted(k for k, v in recorded_preprocessing.items() if preprocessing.get(k) != v)
    if changed:
        raise ValueError(
            f"{run.path} holds a run with other input settings ({', '.join(changed)}): resume it with "
            f"its own settings, or choose another --output."
        )


def _write_run_description(run, class_names, config):
    """The labels and the expected input, for people and tools that read no Keras file, and for
    a resumed run to check that it is the same run."""
    write_json(run.file(CLASS_NAMES_FILE), class_names)
    write_json(run.file(PREPROCESSING_FILE), _preprocessing(config))


def _callbacks(config, run, schedule, where):
    """The run's callbacks in the order they must run, the best-model checkpoint and the backup."""
    logged = _merged_history(run.file(LOG_FILE), {}).get("val_accuracy", [])
    earlier = logged
    if earlier and not zipfile.is_zipfile(run.model_file):
        # The best model so far is missing or damaged (truncated): the next validated epoch replaces it.
        logger.warning("%s is missing or damaged; the next validated epoch saves a new one.", run.model_file)
        earlier = []
    best = BestModelCheckpoint(
        run.model_file, enabled=where.chief, previous_best=max(earlier, default=-math.inf)
    )
    backup = ResumableBackup(
        run.file(BACKUP_FOLDER),
        schedule.steps_per_epoch,
        config.backup_every_steps,
        writes=where.writes_run_folder,
        wait_for_all=where.wait_for_all,
    )
    # The other processes of a JAX job share process 0's run folder: they read it, never write it.
    logs = [EpochLog(run.file(LOG_FILE)), TensorBoardLog(run.file(TENSORBOARD_FOLDER))]
    callbacks = [
        backup,
        # With --ema: validate, save and keep the weights' moving average (before `best`).
        *([keras.callbacks.SwapEMAWeights(swap_on_epoch=True)] if config.ema else []),
        best,
        *([EarlyStopping(config.early_stopping, logged)] if config.early_stopping else []),
        EpochTimer(config.batch_size),  # before the CSV log, which writes what it adds
        *(logs if where.writes_run_folder else []),
        EpochEndWritten(backup),  # last: everything the epoch's end writes is written
    ]
    return callbacks, best, backup


def _log_start(config, run_data, schedule, start_step):
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
        schedule.steps_per_epoch,
        schedule.steps_per_call,
    )
    if start_step:
        epoch, batch = divmod(start_step, schedule.steps_per_epoch)
        logger.info(
            "Resuming from the backup at step %d: epoch %d, after %d of its steps.",
            start_step,
            epoch + 1,
            batch,
        )


def _write_results(run, config, model, fit_history, best, schedule, chief, teacher_cost=None, backup=None):
    """history.json and training.png (and model.keras when nothing was validated); the summary.
    With a teacher, `teacher` says what it cost, and its share of the last epoch's training time."""
    history = _merged_history(run.file(LOG_FILE), fit_history)
    if best.best_epoch is None and chief:  # no validation split: keep the last model
        save_model(saved_model_of(model), run.model_file)
    summary = {
        "config": dataclasses.asdict(config),
        "backend": keras.backend.backend(),
        "steps": schedule.total_steps,
        "optimizer_steps": optimizer_step(model),
        "final": {key: values[-1] for key, values in history.items() if values},
        "best_val_accuracy": None if best.best_epoch is None else best.best,
        "stopped_early": bool(config.early_stopping) and len(history.get("loss", [])) < config.epochs,
        "history": history,
    }
    if teacher_cost:
        step_seconds = config.batch_size / history["images_per_second"][-1]
        summary["teacher"] = {
            **teacher_cost,
            "share_of_step": min(1.0, teacher_cost["seconds_per_batch"] / step_seconds),
        }
    if chief:
        plots.training_curves(history, run.file(CURVES_FILE))
    if backup is not None:
        backup.discard()  # only now: a run stopped before this resumes at its last step
    if chief:
        write_json(run.file(HISTORY_FILE), summary)  # last: it marks the run finished
    return summary


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
