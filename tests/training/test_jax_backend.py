"""JAX as a training backend: data-parallel over two devices (distilling from a TFLite teacher)
and fused attention. (A JAX job's run folder resumed after a kill, evaluated under JAX and
exported under TensorFlow: the two-process LoRA job in test_scale.py.)

Each case runs in its own processes with `KERAS_BACKEND=jax` (Keras reads the
backend once per process), on the CPU, with the suite's tiny model.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import HANG_SECONDS, TINY_MODEL, with_xla_flags

pytest.importorskip("jax")


def _env(backend, **extra):
    return dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3", **extra)


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
