"""tf.distribute on CPU: mirrored over two logical CPUs matching one device, multi-worker over
two processes, and every pair of strategy, precision and XLA settings training."""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
from conftest import HANG_SECONDS, TINY_MODEL

# A tiny Swin for 32x32 images: 8x8 patches, windows of 4, two stages (the first with a shifted block).
TINY_SWIN = dict(
    model="swin_tiny_patch4_window7_224",
    image_size=32,
    overrides=dict(embed_dim=16, depths=[2, 1], num_heads=[1, 2], window_size=4),
)

# One process with two logical CPUs for every run of the two tests below (starting one costs as
# much as a run): the mirrored strategy over both, one device on the first. The process's one
# MirroredStrategy serves every mirrored run (tensorflow#62790: distribute.mirrored_strategy).
LOGICAL_CPUS = """
import json, sys
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras_vit.training.distribute as d
from keras_vit.training.train import train
from keras_vit.training.config import TrainConfig
keras_vits_strategy = d._tf_strategy
both_cpus = lambda name: d.mirrored_strategy(("/cpu:0", "/cpu:1"))
results = {}
for key, config in json.loads(sys.argv[1]).items():  # each run seeds itself
    mirrored = config["strategy"] == "mirrored"
    d._tf_strategy = both_cpus if mirrored else keras_vits_strategy
    summary = train(TrainConfig(**config)).summary
    results[key] = {"optimizer_steps": summary["optimizer_steps"], "loss": summary["history"]["loss"]}
print(json.dumps(results))
"""

# The mirrored test's runs: the same global batch of 8, one device or split 4 + 4, clipped or not.
MIRRORED_RUNS = (
    ("one-device", "one-device", 0.05),
    ("unclipped", "one-device", 0.0),
    ("mirrored", "mirrored", 0.05),
)

# Every pair of strategy (one device, mirrored over 2 logical CPUs), precision (float32,
# mixed_bfloat16, mixed_float16 with loss scaling) and XLA (on, off) in six runs, a pairwise
# design; one mirrored run trains a Swin.
MATRIX_RUNS = {
    "one-device": [
        ("float32", True, "vit"),
        ("mixed_bfloat16", False, "vit"),
        ("mixed_float16", True, "vit"),
    ],
    "mirrored": [
        ("float32", False, "swin"),
        ("mixed_bfloat16", True, "vit"),
        ("mixed_float16", False, "vit"),
    ],
}


@pytest.fixture(scope="module")
def logical_cpu_runs(colors_dataset, tmp_path_factory):
    """Every run of the two tests below, in `LOGICAL_CPUS`' one process: `{key: its steps and losses}`."""
    folder = tmp_path_factory.mktemp("logical_cpus")
    mirrored = dict(
        dataset=colors_dataset, epochs=2, steps_per_epoch=3, batch_size=8, validation_split=0.0,
        overrides=TINY_MODEL, jit_compile=False, crop="none", flip=False, drop_path_rate=0.0,
    )  # fmt: skip
    matrix = dict(
        dataset=colors_dataset, epochs=1, batch_size=8, steps_per_epoch=2, validation_split=0.0,
        overrides=dict(TINY_MODEL, depth=1), mixup=0.8, cutmix=1.0, random_erasing=0.25,
        backup_every_steps=2, layer_decay=0.65,
    )  # fmt: skip
    configs = {
        name: dict(mirrored, output=str(folder / name), strategy=strategy, clipnorm=clipnorm)
        for name, strategy, clipnorm in MIRRORED_RUNS
    }
    for strategy, settings in MATRIX_RUNS.items():
        for precision, xla, model in settings:
            key = f"{strategy}/{precision}/{'xla' if xla else 'graph'}"
            configs[key] = dict(
                matrix, **(TINY_SWIN if model == "swin" else {}), strategy=strategy, precision=precision,
                jit_compile=xla, output=str(folder / key.replace("/", "-")),
            )  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-c", LOGICAL_CPUS, json.dumps(configs)],
        capture_output=True, text=True, timeout=HANG_SECONDS, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_mirrored_over_two_cpu_replicas_matches_one_replica_with_clipping(logical_cpu_runs):
    """Same data order, same initial weights, the same global batch of 8 split 4 + 4. (A Swin
    trains mirrored in the test of every setting below.)

    No augmentation: each replica draws its own, so with it the two runs see different images.

    The replicas' gradients are summed (each holds its share of the batch), and gradient
    clipping measures the norm of that sum (keras_vit.training.optimizers.AdamW), so both runs take
    the same steps up to float32 summation order: losses agree to 1e-4 relative after 2
    epochs of 3 steps. No validation: evaluating costs as much as training here, and the
    multi-worker test below validates. The clip norm is small enough to act on every step:
    without clipping the losses differ by more than 1e-3.
    """
    losses = {name: logical_cpu_runs[name]["loss"] for name, _, _ in MIRRORED_RUNS}
    np.testing.assert_allclose(losses["mirrored"], losses["one-device"], rtol=1e-4)
    assert np.max(np.abs(np.subtract(losses["unclipped"], losses["one-device"]))) > 1e-3  # clipping acted


WORKER = """
import json, sys
import numpy as np
from keras_vit.training.train import build_model, compile_training_model, train
from keras_vit.training.config import TrainConfig
run = train(TrainConfig(**json.loads(sys.argv[1])))
weights = np.concatenate([np.ravel(w) for w in run.model.get_weights()])
np.save(sys.argv[2], weights)
"""


def _free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def test_multi_worker_training_ends_with_the_same_weights_on_both_workers(colors_dataset, tmp_path):
    """Two worker processes on 127.0.0.1 with TensorFlow's collectives. A ViT: the strategy's path
    does not depend on the model (the test of every setting below trains a Swin mirrored)."""
    workers = [f"127.0.0.1:{port}" for port in _free_ports(2)]
    processes = []
    for index in range(2):
        config = dict(
            dataset=colors_dataset, output=str(tmp_path / f"worker{index}"), epochs=2, batch_size=8,
            validation_split=0.25, strategy="multi-worker", overrides=TINY_MODEL,  # XLA on: the default
        )  # fmt: skip
        tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        env = dict(os.environ, TF_CONFIG=json.dumps(tf_config), TF_CPP_MIN_LOG_LEVEL="3")
        processes.append(
            subprocess.Popen(
                [sys.executable, "-c", WORKER, json.dumps(config), str(tmp_path / f"weights{index}.npy")],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
        )
    for process in processes:
        _, err = process.communicate(timeout=HANG_SECONDS)
        assert process.returncode == 0, err[-3000:]
    first, second = (np.load(tmp_path / f"weights{i}.npy") for i in range(2))
    np.testing.assert_array_equal(first, second)
    assert (tmp_path / "worker0" / "history.json").exists()  # the chief writes the run folder
    assert not (tmp_path / "worker1" / "history.json").exists()
    summary = json.loads((tmp_path / "worker0" / "history.json").read_text())
    losses = summary["history"]["loss"]
    assert len(losses) == 2 and all(np.isfinite(losses)) and losses[1] < losses[0]  # it learned
    assert summary["steps"] == 2 * (54 // 8)  # the global batch of 8 is split over the 2 workers


def test_every_pair_of_strategy_precision_and_xla_settings_trains(logical_cpu_runs):
    """Strategy (one device, mirrored over 2 logical CPUs) x precision (float32, mixed_bfloat16,
    mixed_float16 with loss scaling) x XLA (on, off), with augmentation and layer decay on: a
    few steps each, finite losses. Six runs hold every pair of two settings, a pairwise design:
    each run spends its time tracing and compiling, not stepping, and all 12 took 2 minutes.
    (Multi-worker over two processes: the test above, with the default XLA on.) One mirrored run
    trains a Swin: its buffers (the relative position index, the shifted windows' masks) under
    a strategy."""
    pairs = {
        pair
        for strategy, settings in MATRIX_RUNS.items()
        for precision, xla, _ in settings
        for pair in ((strategy, precision), (strategy, xla), (precision, xla))
    }
    assert len(pairs) == 2 * 3 + 2 * 2 + 3 * 2  # every pair of values, each at least once
    runs = {key: run for key, run in logical_cpu_runs.items() if key.count("/") == 2}
    assert len(runs) == 6
    for key, run in runs.items():
        assert run["optimizer_steps"] == 2 and np.isfinite(run["loss"][-1]), key
