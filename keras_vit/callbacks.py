"""The callbacks a training run uses: the best model, mid-epoch backups, an exact step count.

None of them reads a device value per batch: the step count is read once,
after a backup is restored, and counted on the host from there, so the
training loop never waits for the device between steps (Keras reads the
logs only once per `steps_per_execution` steps).
"""

import hashlib
import io
import logging
import math
import os
import shutil
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
from keras_vit.saving import save_model, weights_file_bytes

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


class ResumableBackup(keras.callbacks.BackupAndRestore):
    """`BackupAndRestore` that resumes in the epoch the restored step count is in, and whose
    backups survive a full disk, a kill mid-write and a damaged file.

    Keras records the epoch at backup time, which for a backup taken on an
    epoch's last batch is the epoch already finished: it would be replayed
    whole. The optimizer's step count says exactly where the run was.

    Keras writes the new backup over the last one; here the last one is kept as the one before
    and the new one is written beside it and renamed into place once whole (room for two
    backups is enough), so a good backup is always on disk. A resumed run reads the latest backup, else
    the one before it; with neither readable it stops with one line instead of starting over.
    """

    def __init__(self, backup_dir, steps_per_epoch, save_freq):
        # Kept at the end of training: a run stopped while writing its results resumes at its last
        # step instead of training again; `discard` removes them once the results are written.
        super().__init__(backup_dir, save_freq=save_freq, double_checkpoint=True, delete_checkpoint=False)
        self.steps_per_epoch = steps_per_epoch
        self.restored_step = 0

    def on_train_begin(self, logs=None):
        damaged = []
        for which in ("latest", "previous"):
            if which == "previous" and os.path.exists(self._prev_weights_path):
                # Keras reads only `.weights.h5` names: the one before takes the damaged one's place.
                for previous, latest in self._backup_files():
                    if os.path.exists(previous):
                        os.replace(previous, latest)
            elif which == "previous" or not os.path.exists(self._weights_path):
                continue
            try:
                self._check_sum()
                self._restore(self._weights_path)
                return
            except Exception as error:  # h5py and Keras raise OSError, ValueError, KeyError...
                logger.warning("The %s backup in %s cannot be read (%s).", which, self.backup_dir, error)
                damaged.append(which)
        if damaged:
            raise ValueError(
                f"The run's backups in {self.backup_dir} are damaged ({' and '.join(damaged)}), so it "
                f"cannot resume: delete that folder to train again from the start (model.keras and "
                f"log.csv stay)."
            )

    def discard(self):
        """Removes the backups: the run's results are written."""
        shutil.rmtree(self.backup_dir, ignore_errors=True)

    def _backup_files(self):
        """(the one before, the latest) for the weights and their record."""
        return (
            (self._prev_weights_path, self._weights_path),
            (self._prev_training_metadata_path, self._training_metadata_path),
        )

    def _check_sum(self):
        """HDF5 loads most damaged bytes silently, as wrong weights: the record's SHA-256 (backups
        from before it was recorded have none) says whether the weights are the ones written."""
        if not os.path.exists(self._training_metadata_path):
            return
        expected = read_json(self._training_metadata_path).get("sha256")
        if expected:
            with open(self._weights_path, "rb") as f:
                if hashlib.sha256(f.read()).hexdigest() != expected:
                    raise ValueError(f"{self._weights_path} is not what was written (its SHA-256 differs)")

    def _restore(self, weights):
        if self.model.optimizer is not None and not self.model.optimizer.built:
            self.model.optimizer.build(self.model.trainable_variables)  # its slots must exist to load
        self.model.load_weights(weights)
        self.restored_step = optimizer_step(self.model)
        self.model._initial_epoch = self.restored_step // self.steps_per_epoch

    def _save_model(self):
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
        weights = weights_file_bytes(self.model)
        try:
            write_bytes(self._weights_path, weights)
            # The step count in the weights says where to resume; this is Keras' own record.
            position = {
                "epoch": self._current_epoch,
                "batch": self._last_batch_seen,
                "sha256": hashlib.sha256(weights).hexdigest(),
            }
            write_json(self._training_metadata_path, position)
        except DiskFullError as error:
            # Whichever file it was, what the run needs is room for a backup.
            raise DiskFullError(self.backup_dir, max(error.needed, size_of(self._weights_path))) from None


class EpochLog(keras.callbacks.CSVLogger):
    """Keras' CSV log (a row per epoch, appended over a resumed run's attempts), written whole
    and atomically after each epoch: a full disk or a kill never leaves half a row in it."""

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
        write_text(self.filename, self.csv_file.getvalue())


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


class StopAtStep(keras.callbacks.Callback):
    """Ends training after exactly `total_steps` optimizer steps.

    Keras' `BackupAndRestore` restores a mid-epoch backup (weights and the
    optimizer's step count) but replays the interrupted epoch from its first
    batch. Stopping on the step count makes a resumed run end after the same
    number of steps as an uninterrupted one: its last epoch is cut short by
    the batches that were replayed. The count starts from the restored step
    (`backup.restored_step`, read once) and goes on from Keras' batch index.
    """

    def __init__(self, total_steps, backup):
        super().__init__()
        self.total_steps = total_steps
        self.backup = backup
        self.step = 0
        self._epoch_start = 0

    def on_train_begin(self, logs=None):
        self.step = self.backup.restored_step

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = self.step

    def on_train_batch_end(self, batch, logs=None):
        self.step = self._epoch_start + batch + 1
        if self.step >= self.total_steps:
            self.model.stop_training = True


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
