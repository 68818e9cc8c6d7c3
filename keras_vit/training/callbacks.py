"""The callbacks a training run uses: the best model, exact mid-epoch backups, the logs.

None of them reads a device value per batch (only a backup reads the state
it saves), so the training loop never waits for the device between steps
(Keras reads the logs only once per `steps_per_execution` steps).
"""

import contextlib
import hashlib
import io
import logging
import math
import os
import shutil
import tempfile
import time

import keras

from keras_vit.files import (
    DiskFullError,
    disk_full_names,
    read_json,
    size_of,
    write_bytes,
    write_json,
    write_text,
)
from keras_vit.storage.saving import save_model, weights_file_bytes
from keras_vit.training import lora

logger = logging.getLogger(__name__)


def optimizer_step(model):
    """The optimizer's step count, also for a distributed (mirrored) variable. Reads the device."""
    return int(keras.ops.convert_to_numpy(model.optimizer.iterations))


def saved_model_of(model):
    """What a run saves: the classifier inside a `TrainingModel`, else the model itself."""
    return getattr(model, "classifier", model)


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
            save_model(saved_model_of(self.model), self.path)


class EarlyStopping(keras.callbacks.Callback):
    """Stops the run after `patience` epochs without a better validation accuracy than its best.

    The count is read from the run's per-epoch validation accuracies (`earlier`, from its log),
    so a run killed and resumed counts on from where it was."""

    def __init__(self, patience, earlier=()):
        super().__init__()
        self.patience, self.history = patience, list(earlier)

    @property
    def exhausted(self):
        """Whether the epochs so far already end the run."""
        if not self.history:
            return False
        best = self.history.index(max(self.history))  # the first epoch to reach the best
        return len(self.history) - 1 - best >= self.patience

    def on_epoch_end(self, epoch, logs=None):
        value = (logs or {}).get("val_accuracy")
        if value is None:
            return
        self.history.append(float(value))
        if self.exhausted:
            self.model.stop_training = True


class ResumableBackup(keras.callbacks.BackupAndRestore):
    """Backups a run resumes from exactly, that survive a full disk, a kill mid-write and a
    damaged file.

    A backup holds the weights and the optimizer, whose step count says where the run was; its
    record holds the running totals of the epoch's metrics and the states of the dropout draws.
    `train` starts the data stream at the restored step, so a run resumed mid-epoch trains on the
    same batches with the same draws and logs the same epoch as an uninterrupted one.

    A backup taken on an epoch's last step is recorded as waiting for that epoch's end
    (validation, the log row, the best model) until `EpochEndWritten` marks it; a run stopped in
    between resumes from the backup before it and writes that end itself.

    Keras writes the new backup over the last one; here the last one is kept as the one before
    and the new one is written beside it and renamed into place once whole (room for two
    backups is enough), so a good backup is always on disk. A resumed run reads the latest backup, else
    the one before it; with neither readable it stops with one line instead of starting over.
    """

    def __init__(self, backup_dir, steps_per_epoch, save_freq, writes=True, wait_for_all=None):
        # Kept at the end of training: a run stopped while writing its results resumes at its last
        # step instead of training again; `discard` removes them once the results are written.
        super().__init__(backup_dir, save_freq=save_freq, double_checkpoint=True, delete_checkpoint=False)
        self.steps_per_epoch = steps_per_epoch
        self.writes = writes  # False: this process reads backups another one writes
        # Blocks until every process of the job has come to the same point (None: one process).
        self.wait_for_all = wait_for_all or (lambda: None)
        self.restored_step = 0
        self._metric_totals = None  # the resumed epoch's, set once Keras has reset the metrics

    def restore(self):
        """Loads the latest usable backup into the model (`set_model` first); returns the optimizer
        step the run resumes at, 0 with no backup.

        Every process of a job reads the same backup: none moves a file until all have read
        (`wait_for_all`), and then only the one that writes."""
        damaged = []
        latest = (self._weights_path, self._training_metadata_path)
        previous = (self._prev_weights_path, self._prev_training_metadata_path)
        for which, (weights, metadata) in (("latest", latest), ("previous", previous)):
            if not os.path.exists(weights):
                continue
            try:
                record = self._record(weights, metadata)
                if not record.get("epoch_end_written", True):
                    logger.info(
                        "The run stopped before epoch %d's end was written: resuming before it.",
                        record["step"] // self.steps_per_epoch,
                    )
                    continue
                self._restore(record, weights)
            except Exception as error:  # h5py and Keras raise OSError, ValueError, KeyError...
                logger.warning("The %s backup in %s cannot be read (%s).", which, self.backup_dir, error)
                damaged.append(which)
                continue
            self._settle(kept=which)
            return self.restored_step
        if damaged and not self.writes:
            raise ValueError(
                f"The run's backups in {self.backup_dir} are damaged: process 0 says what to do."
            )
        if damaged:
            raise ValueError(
                f"The run's backups in {self.backup_dir} are damaged ({' and '.join(damaged)}), so it "
                f"cannot resume: delete that folder to train again from the start (model.keras and "
                f"log.csv stay)."
            )
        self._settle(kept=None)  # none usable: the run starts over, and leaves no stale one behind
        return 0

    def _settle(self, kept):
        """Once every process has read the backup it resumes from, the writer puts the one kept in
        the latest's place (Keras reads only `.weights.h5` names), or removes them all (None)."""
        self.wait_for_all()
        if not self.writes:
            return
        if kept == "previous":
            for previous, latest in self._backup_files():
                if os.path.exists(previous):
                    os.replace(previous, latest)
        elif kept is None:
            self.discard()

    def on_train_begin(self, logs=None):
        pass  # `restore` runs before `fit`: the data stream starts at the restored step

    def _should_save_on_batch(self, batch):
        # At the run's steps N, 2N, ...: Keras 3.15's BackupAndRestore counts each epoch's batches
        # from 0 instead of -1, so with several steps per call its first backup of an epoch came a
        # call late (ModelCheckpoint had the same bug: keras-team/keras#17589, fixed there by #17632).
        return optimizer_step(self.model) % self.save_freq == 0

    def on_train_batch_end(self, batch, logs=None):
        if self._metric_totals is not None:
            # The resumed epoch's totals so far join this call's: Keras builds the metrics in the
            # first call. (The run's metrics are means: their state is totals that add up.)
            for variable in self.model.metrics_variables:
                variable.assign(variable + self._metric_totals[variable.path])
            self._metric_totals = None
        super().on_train_batch_end(batch, logs)

    def epoch_end_written(self):
        """Marks the latest backup, taken on an epoch's last step, as followed by that epoch's end."""
        if not self.writes:
            return
        try:
            record = read_json(self._training_metadata_path)
        except (OSError, ValueError):
            return  # no backup yet (the first epoch ended before one), or none this epoch
        if not record.get("epoch_end_written", True):
            write_json(self._training_metadata_path, dict(record, epoch_end_written=True))

    def discard(self):
        """Removes the backups: the run's results are written."""
        if self.writes:
            shutil.rmtree(self.backup_dir, ignore_errors=True)

    def _backup_files(self):
        """(the one before, the latest) for the weights and their record."""
        return (
            (self._prev_weights_path, self._weights_path),
            (self._prev_training_metadata_path, self._training_metadata_path),
        )

    def _record(self, weights, metadata):
        """A backup's record, once its SHA-256 says the weights are the ones written: HDF5 loads
        most damaged bytes silently, as wrong weights."""
        record = read_json(metadata)
        expected = record.get("sha256")  # backups from before it was recorded have none
        with open(weights, "rb") as f:
            if expected and hashlib.sha256(f.read()).hexdigest() != expected:
                raise ValueError(f"{weights} is not what was written (its SHA-256 differs)")
        return record

    def _restore(self, record, weights):
        if self.model.optimizer is not None and not self.model.optimizer.built:
            self.model.optimizer.build(self.model.trainable_variables)  # its slots must exist to load
        with lora.adapters_kept(self.model), _weights_named(weights) as readable:
            self.model.load_weights(readable)
        states = record.get("random_states", [])  # older backups: dropout draws start afresh
        for variable, state in zip(_random_states(self.model), states, strict=bool(states)):
            variable.assign(state)
        self.restored_step = optimizer_step(self.model)
        if self.restored_step % self.steps_per_epoch:
            self._metric_totals = record.get("metric_totals")  # older backups: the epoch restarts its means

    def _save_model(self):
        if not self.writes:
            return
        os.makedirs(self.backup_dir, exist_ok=True)
        for previous, latest in self._backup_files():
            if os.path.exists(latest):
                # The last backup stays as the one before (a hard link: no space, no copy).
                if os.path.exists(previous):
                    os.remove(previous)
                try:
                    os.link(latest, previous)
                except OSError:  # a filesystem without hard links
                    shutil.copyfile(latest, previous)
        model = self.model
        with lora.adapters_kept(model):
            weights = weights_file_bytes(model)
        step = optimizer_step(model)
        record = {
            "step": step,
            "epoch_end_written": step % self.steps_per_epoch != 0,
            "metric_totals": {
                v.path: keras.ops.convert_to_numpy(v).tolist() for v in model.metrics_variables
            },
            "random_states": [keras.ops.convert_to_numpy(v).tolist() for v in _random_states(model)],
            "sha256": hashlib.sha256(weights).hexdigest(),
        }
        try:
            write_bytes(self._weights_path, weights)
            write_json(self._training_metadata_path, record)
        except DiskFullError as error:
            # Whichever file it was, what the run needs is room for a backup.
            raise DiskFullError(self.backup_dir, max(error.needed, size_of(self._weights_path))) from None


@contextlib.contextmanager
def _weights_named(path):
    """`path` under a name Keras reads (`*.weights.h5`): the backup before the latest is
    `latest.weights.h5.bkp`, read through a link beside nothing of the run's."""
    if path.endswith(".weights.h5"):
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="keras-vit-backup-") as folder:
        link = os.path.join(folder, "previous.weights.h5")
        os.symlink(os.path.abspath(path), link)
        yield link


def _random_states(model):
    """The states of the model's Keras seed generators (dropout, drop path), which its weights
    file leaves out: restored, the resumed run draws what the uninterrupted one would have."""
    return [v for v in model.non_trainable_variables if v.name == "seed_generator_state"]


class EpochEndWritten(keras.callbacks.Callback):
    """Last of a run's callbacks: tells the backup that the epoch's end is written."""

    def __init__(self, backup):
        super().__init__()
        self.backup = backup

    def on_epoch_end(self, epoch, logs=None):
        self.backup.epoch_end_written()


class EpochLog(keras.callbacks.CSVLogger):
    """Keras' CSV log (a row per epoch, over a resumed run's attempts), written whole and
    atomically after each epoch: a full disk or a kill never leaves half a row in it."""

    def __init__(self, path):
        super().__init__(path, append=True)

    def on_train_begin(self, logs=None):
        earlier = _whole_lines(self.filename)
        self.append_header = not earlier
        self.csv_file = io.StringIO(earlier, newline="")  # Keras writes its rows here
        self.csv_file.seek(0, io.SEEK_END)
        self.writer, self.keys = None, None

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        write_text(self.filename, _last_row_of_each_epoch(self.csv_file.getvalue()))


def _last_row_of_each_epoch(csv_text):
    """A resumed run writes again the end of an epoch whose end was cut short: its new row wins."""
    header, *rows = csv_text.splitlines(keepends=True)
    by_epoch = {}
    for row in rows:
        by_epoch[row.split(",", 1)[0]] = row
    return header + "".join(by_epoch.values())


def _whole_lines(path):
    """A text file's complete lines (a last line without its newline was cut short); "" if none."""
    try:
        with open(path, newline="") as f:
            text = f.read()
    except FileNotFoundError:
        return ""
    return text[: text.rfind("\n") + 1]


class TensorBoardLog(keras.callbacks.TensorBoard):
    """Keras' TensorBoard callback, a summary per epoch; TensorFlow's event writer reporting a
    full disk (in its own error type, on any of these hooks) becomes a `DiskFullError`."""

    def __init__(self, log_dir):
        super().__init__(log_dir, update_freq="epoch")

    def set_model(self, model):  # each fit sets it, and it writes the model's graph
        with disk_full_names(self.log_dir):
            super().set_model(model)

    def on_train_begin(self, logs=None):
        with disk_full_names(self.log_dir):
            super().on_train_begin(logs)

    def on_test_end(self, logs=None):
        with disk_full_names(self.log_dir):
            super().on_test_end(logs)

    def on_epoch_end(self, epoch, logs=None):
        with disk_full_names(self.log_dir):
            super().on_epoch_end(epoch, logs)

    def on_train_end(self, logs=None):
        with disk_full_names(self.log_dir):
            super().on_train_end(logs)


class EpochTimer(keras.callbacks.Callback):
    """Adds each epoch's times and images per second to its logs (and so to log.csv).

    `epoch_seconds` is the whole epoch with its validation; `train_seconds` runs
    from the epoch's start to its validation (or its end): the host has read the
    last step's logs by then, so the device has finished them. The first epoch
    includes compiling.
    """

    def __init__(self, batch_size):
        super().__init__()
        self.batch_size = batch_size

    def on_epoch_begin(self, epoch, logs=None):
        self._start, self._stop, self._steps = time.perf_counter(), None, 0

    def on_train_batch_end(self, batch, logs=None):
        self._steps = batch + 1

    def on_test_begin(self, logs=None):
        if self._stop is None:  # the first validation of this epoch
            self._stop = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        now = time.perf_counter()
        seconds = (self._stop or now) - self._start
        if logs is not None:
            logs["epoch_seconds"] = now - self._start
            logs["train_seconds"] = seconds
            logs["images_per_second"] = self._steps * self.batch_size / seconds


# More fails: tf.data refuses that many get_next calls in one function (keras-team/keras#20344).
MAX_STEPS_PER_CALL = 32


def steps_per_execution(steps_per_epoch, backup_every_steps, limit=MAX_STEPS_PER_CALL):
    """Steps Keras runs per call of the compiled function, without losing an exact stop.

    The largest count up to `limit` that divides both the epoch and the backup
    interval: backups and the last step then fall on a call's boundary, and the
    host reads the logs once per call instead of once per step.
    """
    return max(d for d in range(1, limit + 1) if steps_per_epoch % d == 0 and backup_every_steps % d == 0)
