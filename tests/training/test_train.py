"""Training: the recipe, the run folder, resuming after SIGKILL (strategies: test_distribute.py)."""

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import keras
import kill_after_backup  # tests/ is on the path (conftest.py's folder), as for full_disk
import numpy as np
import pytest
from conftest import HANG_SECONDS, NATIVE_LOG_LINE, TINY_MODEL

from keras_vit.training.config import TrainConfig
from keras_vit.training.train import build_model, compile_training_model, train


def _config(dataset, output, **changes):
    values = dict(
        dataset=dataset,
        output=str(output),
        epochs=3,
        batch_size=8,
        validation_split=0.25,
        overrides=dict(TINY_MODEL),
        jit_compile=False,
        backup_every_steps=2,
    )
    values.update(changes)
    return TrainConfig(**values)


@pytest.fixture(scope="module")
def finished_run(colors_dataset, tmp_path_factory):
    """One finished 8-epoch run on the colours, shared by the tests that read a run folder
    (each run costs half a minute of tracing on 2 cores): `(TrainingRun, config, folder)`."""
    folder = tmp_path_factory.mktemp("finished") / "run"
    config = _config(colors_dataset, folder, epochs=8, learning_rate=3e-3)
    return train(config), config, pathlib.Path(config.output)


def test_train_writes_a_complete_run_folder_and_learns(finished_run):
    run, _, folder = finished_run
    files = set(os.listdir(folder))
    assert {
        "model.keras",
        "class_names.json",
        "preprocessing.json",
        "history.json",
        "training.png",
        "log.csv",
    } <= files
    assert "backup" not in files  # removed once the run completed
    assert not [f for f in files if f.startswith(".partial-")]
    summary = json.loads((folder / "history.json").read_text())
    assert summary["optimizer_steps"] == summary["steps"] == 8 * (54 // 8)
    assert len(summary["history"]["loss"]) == 8
    assert summary["best_val_accuracy"] >= 0.9  # three colours are easy
    assert json.loads((folder / "class_names.json").read_text()) == ["blue", "green", "red"]

    model = keras.models.load_model(folder / "model.keras")
    assert model.class_names == ["blue", "green", "red"]
    assert model.image_mean == [0.5, 0.5, 0.5]
    red = np.zeros((1, 32, 32, 3), np.float32)
    red[..., 0] = 230
    assert model.class_names[int(np.argmax(model.predict(red, verbose=0)))] == "red"
    assert run.training_model.optimizer.weight_decay == 0.05
    # The saved model is the classifier alone: no augmentation layer travels with it.
    assert not [layer for layer in model.layers if "augment" in layer.name.lower()]
    assert "BatchAugmentation" not in json.dumps(model.get_config())
    assert oct(os.stat(folder / "class_names.json").st_mode & 0o777) != oct(0o600)


def test_ema_validates_saves_and_returns_the_moving_average_of_the_weights(
    finished_run, colors_dataset, tmp_path
):
    """At momentum 0.999 over 6 steps the average barely leaves the initial weights: the run
    with --ema returns and saves those, while a run without it (the shared one: the same
    initial weights, from the same seed) moves away."""
    changes = dict(epochs=1, crop="none", flip=False, learning_rate=3e-3)
    plain = finished_run[0]
    averaged = train(_config(colors_dataset, tmp_path / "ema", ema=0.999, **changes))
    config = _config(colors_dataset, tmp_path / "unused", **changes).resolved()
    keras.utils.set_random_seed(config.seed)  # as train() does before building
    initial = build_model(config, 3, ["blue", "green", "red"]).get_weights()

    def distance(weights):
        return np.sqrt(sum(np.sum((w - w0) ** 2) for w, w0 in zip(weights, initial, strict=True)))

    print(
        "distance from the initial weights:",
        distance(averaged.model.get_weights()),
        distance(plain.model.get_weights()),
    )
    assert distance(averaged.model.get_weights()) < 0.05 * distance(plain.model.get_weights())
    saved = keras.models.load_model(tmp_path / "ema" / "model.keras").get_weights()
    for weight, returned in zip(saved, averaged.model.get_weights(), strict=True):
        np.testing.assert_allclose(weight, returned, atol=1e-6)  # the validated epoch: the average


def test_evaluate_scores_the_run_on_its_own_validation_split(finished_run, colors_dataset, tmp_path, capsys):
    from keras_vit.cli import main

    _, _, folder = finished_run
    assert main(["evaluate", str(folder), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["split"] == "validation" and result["count"] == 18  # 25% of 24 per class
    assert result["top1"] >= 0.9 and result["top5"] == 1.0
    assert set(result["per_class"]) == {"blue", "green", "red"}
    saved = json.loads((folder / "evaluation.json").read_text())
    assert np.sum(saved["confusion"]) == 18 and np.trace(saved["confusion"]) == round(18 * saved["top1"])
    assert (folder / "confusion.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    none_of_its_classes = r"10 of the dataset's 10 classes \(airplane, .*\) are none of the model's 3"
    with pytest.raises(ValueError, match=none_of_its_classes):
        from keras_vit.inference.evaluate import evaluate
        from keras_vit.storage.saving import load_trained_model

        evaluate(load_trained_model(folder), dataset="cifar10-mini")

    # predict: class names from the model; a bad file is reported, the others still classified.
    red = os.path.join(colors_dataset, "red", "00.png")
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"not a jpeg at all")
    # In a fresh process, as a user runs it: the saved classes must load there too.
    result = subprocess.run(
        _cli_command("predict", str(folder), red, str(broken), "--top-k", "2", "--json"),
        capture_output=True, text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )  # fmt: skip
    assert result.returncode == 1, result.stderr[-2000:]
    first, second = json.loads(result.stdout)
    assert first["top_k"][0]["class"] == "red" and len(first["top_k"]) == 2
    assert sum(p["probability"] for p in first["top_k"]) <= 1.0 + 1e-6
    assert "broken.jpg is not an image format we can read" in second["error"]


def test_weight_decay_skips_norms_biases_and_embeddings(colors_dataset, tmp_path):
    # DeiT's distillation token and DeiT III's LayerScale too (timm's no_weight_decay and 1-d rule).
    deit = dict(TINY_MODEL, distillation_token=True, layer_scale=1e-6)
    config = _config(colors_dataset, tmp_path / "run", epochs=1, overrides=deit).resolved()
    classifier = build_model(config, 3, ["red", "green", "blue"])
    model = compile_training_model(config, classifier, total_steps=4, warmup_steps=1, execution_steps=1)
    optimizer = model.optimizer  # the one `train` compiles with
    decayed = {v.path for v in model.trainable_variables if optimizer._use_weight_decay(v)}
    assert any("qkv/kernel" in p for p in decayed) and any("head_dist/kernel" in p for p in decayed)
    for excluded in ("gamma", "beta", "bias", "cls_token", "dist_token", "position_embedding", "ls1", "ls2"):
        assert not any(excluded in p.rsplit("/", 1)[-1] for p in decayed), excluded


def test_a_finished_run_folder_is_not_overwritten(finished_run):
    _, config, folder = finished_run
    before = {name: os.stat(folder / name).st_mtime_ns for name in os.listdir(folder)}
    with pytest.raises(ValueError, match="already holds a finished run"):
        train(config)
    assert {name: os.stat(folder / name).st_mtime_ns for name in os.listdir(folder)} == before


def test_an_unfinished_run_resumes_only_with_its_own_classes_and_input(colors_dataset, tmp_path):
    from keras_vit.storage.run_folder import RunFolder
    from keras_vit.training.train import _write_run_description

    # A run on the colours that was killed: what train writes first, before any step.
    (tmp_path / "run").mkdir()
    config = _config(colors_dataset, tmp_path / "run", epochs=1).resolved()
    _write_run_description(RunFolder(tmp_path / "run"), ["blue", "green", "red"], config)
    with pytest.raises(ValueError, match=r"holds a run on the classes \['blue', 'green', 'red'\]"):
        train(_config("cifar10-mini", tmp_path / "run", epochs=1))
    with pytest.raises(ValueError, match=r"other input settings \(image_size\)"):
        train(_config(colors_dataset, tmp_path / "run", epochs=1, image_size=48))
    # Resuming with the same settings passes the check: the SIGKILL tests below resume this way.


def test_bad_settings_are_clear_errors(colors_dataset, tmp_path):
    with pytest.raises(ValueError, match="learning_rate must not be negative"):
        train(_config(colors_dataset, tmp_path / "a", learning_rate=-1.0))
    with pytest.raises(ValueError, match="Unknown model config"):
        train(_config(colors_dataset, tmp_path / "b", model="vit_gigantic"))
    with pytest.raises(ValueError, match="fewer than one batch"):
        train(_config(colors_dataset, tmp_path / "c", batch_size=512))
    with pytest.raises(ValueError, match=r"--override cannot set \['image_size'\]"):
        train(_config(colors_dataset, tmp_path / "d", overrides=dict(TINY_MODEL, image_size=48)))


def _cli_command(*args):
    return [sys.executable, "-m", "keras_vit", *args]


def test_files_that_do_not_decode_are_refused_by_name_before_anything_is_written(
    colors_dataset, tmp_path, capfd
):
    """Once a text file named .jpg killed training mid-epoch with 28 lines of TensorFlow. The
    folder in a user's shell (a fresh process: TensorFlow's native lines, such as the JPEG
    decoder's "Premature end of JPEG data", must stay off it), the archive through the same
    command's `main` in this process (its refusal is the same code's)."""
    import io
    import shutil
    import zipfile

    from PIL import Image

    from keras_vit.cli import main

    folder = tmp_path / "photos"
    shutil.copytree(colors_dataset, folder)
    (folder / "red" / "zz_fake.jpg").write_text("not an image")
    photo = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(
        photo, "JPEG"
    )
    (folder / "green" / "cut.jpg").write_bytes(photo.getvalue()[: len(photo.getvalue()) // 2])
    png = (folder / "blue" / "00.png").read_bytes()
    (folder / "blue" / "cut.png").write_bytes(png[: len(png) // 2])
    archive = tmp_path / "photos.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for path in sorted(folder.rglob("*.*")):
            z.write(path, path.relative_to(tmp_path).as_posix())
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_CPP")}  # as a user runs it
    for dataset in (folder, archive):
        output = tmp_path / f"run-{dataset.suffix or 'folder'}"
        args = ["train", "--dataset", str(dataset), "--output", str(output), "--epochs", "1"]
        args += ["--batch-size", "8"]
        capfd.readouterr()
        if dataset == folder:
            result = subprocess.run(
                _cli_command(*args), env=env, capture_output=True, text=True, timeout=HANG_SECONDS
            )
            code, stderr = result.returncode, result.stderr
        else:  # this process's TensorFlow was not quieted by the command: its native lines left out
            code, stderr = main(args), re.sub(NATIVE_LOG_LINE + ".*\n", "", capfd.readouterr().err)
        (line,) = stderr.strip().splitlines()
        assert code == 1 and line.startswith("keras-vit train: error: 3 of the dataset's files"), line
        for name in ("blue/cut.png", "green/cut.jpg", "red/zz_fake.jpg"):
            assert name in line, line
        assert not output.exists()


KILL_AFTER_BACKUP = kill_after_backup.__file__


def test_killed_again_and_again_it_ends_exactly_like_an_uninterrupted_run(colors_dataset, tmp_path):
    """Killed right after chosen backups, and once at a random moment (mid-step, mid-write), the
    run resumes each time on the batches, dropout draws and metric totals it had, so its every
    epoch logs what the uninterrupted run's does. Drop path and EMA are on: both have state.
    One block: five runs of tracing, and resuming does not depend on depth."""
    import random
    import zipfile

    from keras_vit.cli import main

    KILLED = kill_after_backup.KILLED

    def args(output):
        return [
            "train", "--dataset", colors_dataset, "--output", str(output), "--epochs", "4",
            "--batch-size", "8", "--validation-split", "0.25", "--backup-every-steps", "3",
            "--no-jit-compile", "--seed", "3", "--ema", "0.9", "--drop-path-rate", "0.2",
            *[f"--override={k}={v}" for k, v in dict(TINY_MODEL, depth=1).items()],
        ]  # fmt: skip

    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    # The uninterrupted run in this process (what it logs is the reference, not how it ran); the
    # killed runs and the last one each in their own, as a user's shell starts them.
    assert main(args(tmp_path / "whole")) == 0
    expected = json.loads((tmp_path / "whole" / "history.json").read_text())

    output = tmp_path / "killed"

    def killed_after_backup(step, random_moment=None):
        process = subprocess.Popen(
            [sys.executable, KILL_AFTER_BACKUP, str(step), "--", *args(output)],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        if random_moment is not None:  # or earlier, by SIGKILL: mid-step, mid-write, mid-epoch
            time.sleep(random_moment)
            process.send_signal(signal.SIGKILL)
        _, stderr = process.communicate(timeout=HANG_SECONDS)
        assert process.returncode in (KILLED, -signal.SIGKILL), stderr[-2000:]
        for path in output.rglob("*.keras"):  # nothing half-written under a final name
            assert zipfile.is_zipfile(path) and not zipfile.ZipFile(path).testzip(), path
        assert not (output / "history.json").exists()

    # 6 steps an epoch, a backup every 3: mid-epoch; at a random moment, else after the last step;
    # after the last step, its epoch's end (validation, log row) unwritten, so the last run resumes
    # from the backup before it, mid-epoch in the fourth pass over the data.
    killed_after_backup(3)
    killed_after_backup(24, random_moment=random.Random(0).uniform(2.0, 6.0))
    killed_after_backup(24)

    result = subprocess.run(
        _cli_command(*args(output)), env=env, capture_output=True, text=True, timeout=HANG_SECONDS
    )
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((output / "history.json").read_text())
    assert summary["steps"] == summary["optimizer_steps"] == expected["steps"] == 4 * (54 // 8)
    assert not (output / "backup").exists()
    for metric in ("loss", "accuracy", "val_loss", "val_accuracy"):
        assert len(summary["history"][metric]) == 4, metric
        np.testing.assert_allclose(summary["history"][metric], expected["history"][metric], rtol=0, atol=1e-6)


def test_tensorflow_datasets_names_train_and_evaluate_without_downloading(tmp_path, capsys):
    import tensorflow_datasets as tfds

    from keras_vit.cli import main

    with tfds.testing.mock_data(num_examples=24):
        run = train(
            _config("cifar10", tmp_path / "run", epochs=1, image_size=32, crop="pad", backup_every_steps=100)
        )
        assert len(run.model.class_names) == 10  # mocked metadata: names "0".."9"
        assert run.summary["optimizer_steps"] == 24 // 8
        capsys.readouterr()  # drop fit's progress lines
        assert main(["evaluate", str(tmp_path / "run"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["dataset"] == "tfds:cifar10" and result["split"] == "test" and result["count"] == 24
