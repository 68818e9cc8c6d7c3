"""JAX as a training backend: the same CLI, run folder, resume and evaluation; exports under TensorFlow.

Each case runs in its own processes with `KERAS_BACKEND=jax` (Keras reads the
backend once per process), on the CPU, with the suite's tiny model.
"""

import json
import os
import re
import subprocess
import sys

import keras
import numpy as np
import pytest
from conftest import HANG_SECONDS, NATIVE_LOG_LINE, TINY_MODEL, with_xla_flags

pytest.importorskip("jax")

# One block: the runs here compile with XLA four times, and what they test does not depend on depth.
TINY_FLAGS = [f"--override={k}={v}" for k, v in dict(TINY_MODEL, depth=1).items()]


def _env(backend, **extra):
    return dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3", **extra)


def _user_env(backend):
    """A user's shell: no TF_CPP_MIN_LOG_LEVEL; the CLI keeps the frameworks' lines off itself."""
    return {**{k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}, "KERAS_BACKEND": backend}


def _assert_quiet(result):
    assert not re.search(NATIVE_LOG_LINE, result.stderr), result.stderr[-3000:]


def _cli(*args):
    return [sys.executable, "-m", "keras_vit", *args]


def test_a_lora_run_on_jax_resumes_exactly_after_sigkill_evaluates_and_exports_under_tensorflow(
    colors_dataset, tmp_path, kill_after_two_epochs
):
    """`keras-vit train --lora-rank` on JAX, killed after two epochs and started again from a
    user's shell, ends with the weights of an uninterrupted run (its backups hold the adapters and
    their moments, not the merged kernels), evaluates under JAX, and its `.keras` exports under
    TensorFlow, verified against Keras. (A whole model resuming on JAX: the two-process job in
    test_scale.py; LoRA's layers, counts and merge: test_lora.py.)"""

    def command(run):
        return _cli(
            "train", "--dataset", colors_dataset, "--output", str(run), "--epochs", "4", "--batch-size", "8",
            "--validation-split", "0.25", "--backup-every-steps", "2", "--learning-rate", "3e-3",
            "--lora-rank", "2", "--lora-targets", "attention,mlp", *TINY_FLAGS,
        )  # fmt: skip

    run = tmp_path / "run"
    whole_log = tmp_path / "whole.err"  # a file, not a pipe nobody reads while the other run goes on
    with open(whole_log, "w") as stderr:
        whole = subprocess.Popen(command(tmp_path / "whole"), env=_env("jax"), stderr=stderr)
    kill_after_two_epochs(command(run), _env("jax"), run)
    assert os.listdir(run / "backup") and not (run / "history.json").exists()

    finished = subprocess.run(
        command(run), env=_user_env("jax"), capture_output=True, text=True, timeout=HANG_SECONDS
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert whole.wait(timeout=HANG_SECONDS) == 0, whole_log.read_text()[-3000:]
    _assert_quiet(finished)
    summary = json.loads((run / "history.json").read_text())
    assert summary["backend"] == "jax"
    assert summary["optimizer_steps"] == summary["steps"] == 4 * (54 // 8)
    assert len(summary["history"]["loss"]) == 4
    assert {"model.keras", "class_names.json", "preprocessing.json", "training.png"} <= set(os.listdir(run))
    resumed, uninterrupted = (
        keras.models.load_model(folder / "model.keras") for folder in (run, tmp_path / "whole")
    )
    for a, b in zip(resumed.weights, uninterrupted.weights, strict=True):
        np.testing.assert_allclose(np.array(a), np.array(b), atol=1e-6, err_msg=a.path)

    evaluated = subprocess.run(
        _cli("evaluate", str(run), "--json"),
        env=_user_env("jax"),
        capture_output=True,
        text=True,
        timeout=HANG_SECONDS,
    )
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    _assert_quiet(evaluated)
    assert json.loads(evaluated.stdout)["top1"] >= 0.9  # three colours are easy

    # The .keras written under JAX exports under TensorFlow, verified against Keras.
    exported = subprocess.run(
        _cli("export", str(run), "--output", str(tmp_path / "exports"), "--format", "tflite",
             "--quantize", "none", "--json"),
        env=_user_env("tensorflow"), capture_output=True, text=True, timeout=HANG_SECONDS,
    )  # fmt: skip
    assert exported.returncode == 0, exported.stderr[-3000:]
    _assert_quiet(exported)
    verification = json.loads(exported.stdout)["verification"]
    assert verification["passed"] and verification["results"]["tflite_fp32"]["meets_target"]


# One JAX process for the two checks below (each process spends seconds importing JAX, Keras and
# keras_vit): first the training runs, then the fused-attention check, whose patches of
# keras_vit.model.vit.layers come after every run.
DATA_PARALLEL = """
import json, sys
import jax
from keras_vit.training.train import train
from keras_vit.training.config import TrainConfig
runs = {}
for config in json.loads(sys.argv[1]):  # one process: each run places itself (distribute.placement)
    summary = train(TrainConfig(**config)).summary
    runs[config["strategy"]] = {"loss": summary["history"]["loss"], "teacher": summary["teacher"]["kind"]}
data_parallel = {"runs": runs, "devices": jax.device_count()}
"""

FUSED_ATTENTION_CHECK = """
import json, numpy as np, jax
import keras_vit
from keras_vit.model.vit import layers

model = keras_vit.create_model("vit_tiny_patch16_224", image_size=32, patch_size=8, depth=2, num_classes=5)
images = np.random.default_rng(0).uniform(0, 255, (3, 32, 32, 3)).astype("float32")
fused_calls = []
fused = layers.fused_attention
layers.fused_attention = lambda *args, **kwargs: fused_calls.append(1) or fused(*args, **kwargs)
inference = np.asarray(model(images, training=False))
calls_in_inference = len(fused_calls)
trainable = [v.value for v in model.trainable_variables]
frozen = [v.value for v in model.non_trainable_variables]
model.stateless_call(trainable, frozen, images, training=True)
calls_in_training = len(fused_calls) - calls_in_inference
layers.fused_attention_applies = lambda *args: False
explicit = np.asarray(model(images, training=False))
fused_attention = {"inference": calls_in_inference, "training": calls_in_training,
                   "difference": float(np.abs(inference - explicit).max())}
"""

REPORT = """
print(json.dumps({"data_parallel": data_parallel, "fused_attention": fused_attention}))
"""


@pytest.fixture(scope="module")
def jax_checks(colors_dataset, colour_teacher_tflite, tmp_path_factory):
    """`DATA_PARALLEL` then `FUSED_ATTENTION_CHECK` in one JAX process with two CPU devices: what
    each found, as `{"data_parallel": ..., "fused_attention": ...}`."""
    folder = tmp_path_factory.mktemp("jax_checks")
    configs = [
        dict(
            dataset=colors_dataset,
            output=str(folder / strategy),
            epochs=2,
            batch_size=8,
            validation_split=0.25,
            overrides={**TINY_MODEL, "distillation_token": True},
            crop="none",
            drop_path_rate=0.0,
            strategy=strategy,
            clipnorm=0.05,
            teacher=colour_teacher_tflite,
        )  # fmt: skip
        for strategy in ("one-device", "mirrored")
    ]
    result = subprocess.run(
        [sys.executable, "-c", DATA_PARALLEL + FUSED_ATTENTION_CHECK + REPORT, json.dumps(configs)],
        env=_env("jax", XLA_FLAGS=with_xla_flags("--xla_force_host_platform_device_count=2")),
        capture_output=True, text=True, timeout=HANG_SECONDS,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_data_parallel_over_two_devices_matches_one_device_even_distilling_from_a_tflite(jax_checks):
    """`--strategy mirrored` on JAX splits the global batch of 8 over two CPU devices
    (keras.distribution.DataParallel): the losses equal one device's to 1e-4. The student is
    distilled from a `.tflite` teacher, the hardest case: a host callback (jax.pure_callback)
    inside the sharded, compiled step."""
    report = jax_checks["data_parallel"]
    runs = report["runs"]
    assert report["devices"] == 2 and {run["teacher"] for run in runs.values()} == {"tflite"}
    np.testing.assert_allclose(runs["mirrored"]["loss"], runs["one-device"]["loss"], rtol=1e-4)


def test_jax_inference_runs_attention_fused_with_the_explicit_ops_answers_and_training_keeps_them(jax_checks):
    found = jax_checks["fused_attention"]
    assert found["inference"] == 2 and found["training"] == 0  # one per block, inference only
    assert found["difference"] < 1e-5
