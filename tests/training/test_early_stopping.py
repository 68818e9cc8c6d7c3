"""`--early-stopping N`: the run stops after N epochs without a better validation accuracy, keeps
the best epoch's model, and counts on from where it was when killed and resumed."""

import csv

import pytest
from conftest import TINY_MODEL

from keras_vit.storage.saving import load_trained_model
from keras_vit.training import callbacks
from keras_vit.training.config import TrainConfig
from keras_vit.training.train import train


class Killed(Exception):
    """Stands for a SIGKILL right after a backup: nothing after it runs."""


def test_early_stopping_counts_on_after_a_kill_and_keeps_the_best_epoch(
    colors_dataset, tmp_path, monkeypatch
):
    # A learning rate too small to change a prediction: the validation accuracy never improves on
    # epoch 0's, so patience 2 ends the run after epoch 2 of 6.
    config = TrainConfig(
        dataset=colors_dataset, output=str(tmp_path / "run"), epochs=6, batch_size=8, validation_split=0.25,
        overrides=dict(TINY_MODEL, depth=1), jit_compile=False, backup_every_steps=3, learning_rate=1e-12,
        early_stopping=2,
    )  # fmt: skip
    save = callbacks.ResumableBackup._save_model

    def saved_then_killed(backup):
        save(backup)
        if callbacks.optimizer_step(backup.model) == 15:  # mid-epoch 2 (6 steps an epoch)
            raise Killed

    monkeypatch.setattr(callbacks.ResumableBackup, "_save_model", saved_then_killed)
    with pytest.raises(Killed):
        train(config)
    with open(tmp_path / "run" / "log.csv") as f:
        assert [row["epoch"] for row in csv.DictReader(f)] == ["0", "1"]

    monkeypatch.setattr(callbacks.ResumableBackup, "_save_model", save)
    run = train(config)
    assert run.summary["stopped_early"] and run.summary["optimizer_steps"] == 18
    with open(tmp_path / "run" / "log.csv") as f:
        accuracies = [float(row["val_accuracy"]) for row in csv.DictReader(f)]
    assert len(accuracies) == 3 and max(accuracies) == accuracies[0]
    assert run.summary["best_val_accuracy"] == accuracies[0]
    assert load_trained_model(tmp_path / "run").class_names == ["blue", "green", "red"]


def test_early_stopping_needs_validation_images(colors_dataset, tmp_path):
    config = TrainConfig(
        dataset=colors_dataset,
        output=str(tmp_path / "run"),
        batch_size=8,
        validation_split=0.0,
        early_stopping=3,
    )
    with pytest.raises(ValueError, match="--early-stopping watches the validation accuracy"):
        train(config)
    assert not (tmp_path / "run").exists()
