"""Faults: a disk that fills up part way, and damaged backups. Nothing written before is lost,
the user gets one line naming the file, and the same command works once there is room."""

import errno
import os
import subprocess
import sys
import time

import keras
import numpy as np
import pytest

from keras_vit.callbacks import ResumableBackup, optimizer_step
from keras_vit.files import DiskFullError
from keras_vit.saving import load_trained_model

TINY_FLAGS = [f"--override={k}={v}" for k, v in dict(hidden_dim=32, depth=2, num_heads=4, mlp_dim=64).items()]


@pytest.fixture
def small_disk(tmp_path):
    """A 12 MB tmpfs, as a disk that fills up (the tests run as root); `fill()` fills it."""
    mount = tmp_path / "disk"
    mount.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=12m", "tmpfs", str(mount)], capture_output=True
    )
    if mounted.returncode != 0:
        if os.environ.get("CI"):
            pytest.fail(f"cannot mount a tmpfs to fill: {mounted.stderr.decode().strip()}")
        pytest.skip("mounting a tmpfs needs root")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk):
    """Writes a file until the disk is full; returns it (delete it to free the space)."""
    filler = disk / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError as error:
            assert error.errno == errno.ENOSPC
    return filler


def _partial_files(folder):
    return [
        os.path.join(d, n)
        for d, subdirs, names in os.walk(folder)
        for n in names + subdirs
        if ".partial" in n
    ]


def test_a_disk_that_fills_mid_training_loses_nothing_and_the_same_command_resumes(
    colors_dataset, small_disk
):
    run = small_disk / "run"
    command = [
        sys.executable, "-m", "keras_vit", "train", "--dataset", colors_dataset, "--output", str(run),
        "--epochs", "5", "--batch-size", "8", "--validation-split", "0.25", "--backup-every-steps", "2",
        "--no-jit-compile", *TINY_FLAGS,
    ]  # fmt: skip
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    log = run / "log.csv"
    deadline = time.time() + 240
    while process.poll() is None and time.time() < deadline:
        if log.exists() and len(log.read_text().splitlines()) >= 3:  # two epochs logged
            break
        time.sleep(0.1)
    assert process.poll() is None, "the run ended before the disk filled"
    filler = fill(small_disk)
    stderr = process.communicate(timeout=240)[1]

    assert process.returncode == 1
    (line,) = stderr.strip().splitlines()
    assert line.startswith("keras-vit train: error: No space left to write " + str(run)), line
    assert "free there): free some space and run the same command again" in line
    assert not _partial_files(run)
    assert load_trained_model(run).class_names == ["blue", "green", "red"]  # the best model so far

    filler.unlink()
    finished = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stderr[-2000:]
    epochs = [row.split(",")[0] for row in log.read_text().splitlines()[1:]]
    assert epochs[:2] == ["0", "1"] and epochs.count("0") == 1  # resumed, not started over
    assert sorted(set(epochs)) == ["0", "1", "2", "3", "4"]


def _compiled_model():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.compile(optimizer="adam", loss="mse")
    return model


def _steps(model, count):
    x, y = np.ones((count, 4), "float32"), np.zeros((count, 3), "float32")
    model.fit(x, y, batch_size=1, epochs=1, verbose=0)


def test_a_damaged_backup_resumes_from_the_one_before_and_two_refuse_in_one_line(tmp_path):
    model = _compiled_model()
    backup = ResumableBackup(str(tmp_path / "backup"), steps_per_epoch=100, save_freq=1)
    backup.set_model(model)
    _steps(model, 3)
    backup._save_model()  # step 3: will be the one before
    _steps(model, 2)
    backup._save_model()  # step 5: the latest
    latest, before = backup._weights_path, backup._prev_weights_path
    assert os.path.exists(before) and not _partial_files(tmp_path)

    with open(latest, "r+b") as f:  # truncated, as by a crash or a copy cut short
        f.truncate(os.path.getsize(latest) // 2)
    resumed = _compiled_model()
    restore = ResumableBackup(str(tmp_path / "backup"), steps_per_epoch=100, save_freq=1)
    restore.set_model(resumed)
    restore.on_train_begin()
    assert restore.restored_step == optimizer_step(resumed) == 3
    assert os.path.exists(latest) and not os.path.exists(before)  # the good one took its place

    with open(latest, "r+b") as f:
        f.truncate(100)
    again = ResumableBackup(str(tmp_path / "backup"), steps_per_epoch=100, save_freq=1)
    again.set_model(_compiled_model())
    with pytest.raises(ValueError, match=r"backups in .* are damaged \(latest\), so it cannot resume"):
        again.on_train_begin()


def test_a_full_disk_during_a_backup_keeps_the_last_one_and_names_the_file(tmp_path, monkeypatch):
    model = _compiled_model()
    backup = ResumableBackup(str(tmp_path / "backup"), steps_per_epoch=100, save_freq=1)
    backup.set_model(model)
    backup._save_model()
    _steps(model, 2)
    backup._save_model()
    saved = {p: open(p, "rb").read() for p in (backup._weights_path, backup._prev_weights_path)}

    def no_space(path, overwrite=True):
        with open(path, "wb") as f:
            f.write(b"half")
        raise OSError(errno.ENOSPC, "No space left on device", path)

    monkeypatch.setattr(model, "save_weights", no_space)
    with pytest.raises(DiskFullError, match=r"No space left to write .*latest.weights.h5 \(it needs about"):
        backup._save_model()
    # It tried again without the older backup, and failed again: the latest is untouched.
    assert open(backup._weights_path, "rb").read() == saved[backup._weights_path]
    assert not _partial_files(tmp_path)


def test_an_export_on_a_full_disk_leaves_no_version_behind_and_works_once_there_is_room(
    colour_teacher, small_disk, capsys
):
    from keras_vit.cli import main
    from keras_vit.export_folder import BATCHING_FILE, TFLITE_FILE, files_folder
    from keras_vit.runtimes import open_model

    exports = small_disk / "exports"
    command = ["export", str(colour_teacher), "--output", str(exports), "--no-verify", "--quantize", "none"]
    command += ["--format", "saved_model,tflite"]
    assert main(command) == 0
    home = exports / "colour_teacher"
    capsys.readouterr()

    filler = fill(small_disk)
    assert main(command) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"keras-vit export: error: No space left to write {files_folder(home, 2)}"), line
    assert sorted(os.listdir(home)) == ["1", BATCHING_FILE, "export-1"]  # no version 2, no staging
    images = np.full((1, 32, 32, 3), 200, np.float32)
    expected = open_model(colour_teacher).predict(images)
    for version_1 in (home / "1", home / "export-1" / TFLITE_FILE):
        np.testing.assert_allclose(open_model(version_1).predict(images), expected, atol=1e-5)

    filler.unlink()
    assert main(command) == 0
    assert sorted(os.listdir(home)) == ["1", "2", BATCHING_FILE, "export-1", "export-2"]
