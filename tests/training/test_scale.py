"""Bigger models and more machines on JAX, on this CPU: two processes on 127.0.0.1 (gloo
collectives), weights sharded over 4 host devices, rematerialisation.

Each case runs in its own processes (Keras reads the backend once per process, and JAX's device
count and distributed runtime are set before it starts), with the suite's tiny model.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import HANG_SECONDS, NATIVE_LOG_LINE, TINY_MODEL, with_xla_flags

pytest.importorskip("jax")

TINY_FLAGS = [f"--override={k}={v}" for k, v in TINY_MODEL.items()]
JOB = (
    "KERAS_DISTRIBUTION_JOB_ADDRESSES",
    "KERAS_DISTRIBUTION_NUM_PROCESSES",
    "KERAS_DISTRIBUTION_PROCESS_ID",
)


def _env(backend="jax", **extra):
    env = {k: v for k, v in os.environ.items() if k not in JOB}
    return dict(env, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3", **extra)


def _user_env(backend="jax"):
    """A user's shell: no TF_CPP_MIN_LOG_LEVEL; the CLI keeps the frameworks' lines off itself."""
    env = {k: v for k, v in os.environ.items() if k not in (*JOB, "TF_CPP_MIN_LOG_LEVEL")}
    return dict(env, KERAS_BACKEND=backend)


def _cli(*args):
    return [sys.executable, "-m", "keras_vit", *args]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Jobs that cannot start, on JAX: (--strategy, the job's variables, what the one line says).
JAX_REFUSALS = [
    ("multi-worker", {}, "KERAS_DISTRIBUTION_JOB_ADDRESSES and KERAS_DISTRIBUTION_NUM_PROCESSES"),
    (
        "multi-worker",
        {JOB[0]: "127.0.0.1:1234,127.0.0.1:1235", JOB[1]: "3", JOB[2]: "0"},
        "lists 2 addresses and KERAS_DISTRIBUTION_NUM_PROCESSES is 3",
    ),
    ("multi-worker", {JOB[0]: "127.0.0.1:1234", JOB[1]: "2", JOB[2]: "2"}, "from 0 to"),
    # The variables without --strategy multi-worker: two processes would train apart, both
    # writing one run folder.
    ("auto", {JOB[0]: "127.0.0.1:1234", JOB[1]: "2", JOB[2]: "1"}, "pass --strategy multi-worker"),
    # A global batch of 8 over the process's 3 devices: JAX cannot split it.
    ("mirrored", {}, "--batch-size 8 does not split evenly over the 3 devices"),
]

# One JAX process with 3 host devices runs every refusal above through the `keras-vit` script's
# entry point, each with its own variables and its own standard error, captured at the descriptor
# (native lines included, and the first case's start-up): a process per case cost ~7 s each.
# First, a job that can start: its process only supervises the one that trains
# (`jax_job.supervise`, here a probe that answers 0 if TensorFlow is still not loaded).
REFUSALS_IN_ONE_PROCESS = """
import json, os, sys, tempfile
import keras_vit_cli  # the `keras-vit` script's entry point: TensorFlow loads muted, if at all
from keras_vit.training import jax_job
jax_job.supervise = lambda argv, verbose=False: 0 if "tensorflow" not in sys.modules else 2
results = []
for argv, job in json.loads(sys.argv[1]):
    for name in json.loads(sys.argv[2]):
        os.environ.pop(name, None)
    os.environ.update(job)
    with tempfile.TemporaryFile("w+") as err:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(err.fileno(), 2)
        try:
            code = keras_vit_cli.main(argv)
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        err.seek(0)
        results.append([code, err.read()])
print(json.dumps(results))
"""


def test_a_job_that_cannot_start_is_refused_in_one_line_before_anything_is_built(
    colors_dataset, tmp_path, capfd
):
    def argv(strategy, index):
        return ["train", "--dataset", colors_dataset, "--output", str(tmp_path / f"run{index}"),
                "--strategy", strategy, "--batch-size", "8"]  # fmt: skip

    starts = ("multi-worker", {JOB[0]: "127.0.0.1:1234,127.0.0.1:1235", JOB[1]: "2", JOB[2]: "0"}, "")
    cases = [(argv(strategy, i), job) for i, (strategy, job, _) in enumerate([starts, *JAX_REFUSALS])]
    result = subprocess.run(
        [sys.executable, "-c", REFUSALS_IN_ONE_PROCESS, json.dumps(cases), json.dumps(JOB)],
        env={**_env(), "XLA_FLAGS": with_xla_flags("--xla_force_host_platform_device_count=3")},
        capture_output=True, text=True, timeout=HANG_SECONDS,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    (supervised, supervised_stderr), *outcomes = json.loads(result.stdout.strip().splitlines()[-1])
    assert supervised == 0 and not supervised_stderr, "a job's supervising process loaded TensorFlow"
    for (strategy, job, says), (code, stderr) in zip(JAX_REFUSALS, outcomes, strict=True):
        assert code == 1, (strategy, job, stderr)
        assert stderr.strip().count("\n") == 0 and says in stderr, (strategy, job, stderr)
    assert not any(tmp_path.iterdir())  # no run folder begun

    # On TensorFlow (this process's backend): model-parallel is JAX's.
    from keras_vit.cli import main

    capfd.readouterr()
    code = main(argv("model-parallel", "_tf"))
    stderr = capfd.readouterr().err
    assert code == 1 and stderr.strip().count("\n") == 0 and "needs KERAS_BACKEND=jax" in stderr, stderr
    assert not any(tmp_path.iterdir())


# One process of a job (or a run alone): trains with `train` and writes its final weights.
PROCESS = """
import json, sys
import numpy as np
from keras_vit.training.train import train
from keras_vit.training.config import TrainConfig
run = train(TrainConfig(**json.loads(sys.argv[1])))
np.savez(sys.argv[2], *run.model.get_weights())
print(json.dumps({k: run.summary[k] for k in ("steps", "optimizer_steps", "history")}))
"""


def _weights(path):
    with np.load(path) as saved:
        return [saved[f"arr_{i}"] for i in range(len(saved.files))]


def test_two_jax_processes_train_lora_as_one_stop_together_when_one_is_killed_resume_exactly_and_export(
    colors_dataset, tmp_path
):
    """Two processes on 127.0.0.1, one CPU device each, gloo collectives, started from a user's
    shell: each reads half of every global batch of 8, and only process 0 writes the shared run
    folder. They train LoRA adapters (rank 2, attention and MLP), whose backups hold the adapters
    and their moments, not merged kernels. Killed mid-run, the other process stops with one line;
    both started again resume from the backup and end with the same weights, equal to one
    process's uninterrupted run with the same global batch (at 3e-3 a lost moment would move
    them by about that much). The run folder then evaluates under JAX, and its `.keras` exports
    under TensorFlow, verified against Keras. (LoRA's layers, counts and merge: test_lora.py.)"""
    lora = dict(lora_rank=2, lora_targets="attention,mlp", learning_rate=3e-3)
    settings = dict(
        dataset=colors_dataset, epochs=3, batch_size=8, validation_split=0.25, backup_every_steps=2,
        overrides=TINY_MODEL, dropout=0.1, **lora,
    )  # fmt: skip
    run = tmp_path / "job"
    port = _free_port()
    job = {JOB[0]: f"127.0.0.1:{port}", JOB[1]: "2"}
    command = _cli(
        "train", "--dataset", colors_dataset, "--output", str(run), "--epochs", "3", "--batch-size", "8",
        "--validation-split", "0.25", "--backup-every-steps", "2", "--dropout", "0.1", *TINY_FLAGS,
        "--strategy", "multi-worker", "--lora-rank", "2", "--lora-targets", "attention,mlp",
        "--learning-rate", "3e-3",
    )  # fmt: skip
    processes = [
        subprocess.Popen(
            command,
            env={**_user_env(), **job, JOB[2]: str(i)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    alone = subprocess.Popen(  # the reference, meanwhile: one process, one device
        [sys.executable, "-c", PROCESS, json.dumps(dict(settings, output=str(tmp_path / "alone"))),
         str(tmp_path / "alone.npz")],
        env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    record = run / "backup" / "training_metadata.json"
    deadline = time.time() + HANG_SECONDS
    while not record.exists() and time.time() < deadline and processes[1].poll() is None:
        time.sleep(0.1)
    assert record.exists() and processes[1].poll() is None, "no backup before the job ended"
    processes[1].send_signal(signal.SIGKILL)
    killed = time.time()
    _, stderr = processes[0].communicate(timeout=HANG_SECONDS)
    assert processes[0].returncode == 1
    assert time.time() - killed < 60  # JAX's heartbeat (10 s) notices it
    assert "process 0 of 2 stopped: another process of the job stopped" in stderr
    # One line, in a user's shell (no TF_CPP_MIN_LOG_LEVEL): no traceback, no native line.
    assert stderr.strip().count("\n") == 0, stderr
    assert not (run / "history.json").exists()

    # Both started again: they resume from the backup and finish.
    resumed = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                PROCESS,
                json.dumps(dict(settings, output=str(run), strategy="multi-worker")),
                str(tmp_path / f"process{i}.npz"),
            ],
            env={**_env(), **job, JOB[2]: str(i)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for i in range(2)
    ]
    outputs = [p.communicate(timeout=HANG_SECONDS) for p in [*resumed, alone]]
    for process, (_, err) in zip([*resumed, alone], outputs, strict=True):
        assert process.returncode == 0, err[-3000:]
    summaries = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    assert all(s["optimizer_steps"] == s["steps"] == 3 * (54 // 8) for s in summaries)
    np.testing.assert_allclose(summaries[0]["history"]["loss"], summaries[2]["history"]["loss"], rtol=1e-4)
    first, second, one = (_weights(tmp_path / f"{name}.npz") for name in ("process0", "process1", "alone"))
    for a, b, c in zip(first, second, one, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(a, c, atol=1e-4)
    summary = json.loads((run / "history.json").read_text())  # written by process 0
    assert summary["steps"] == 3 * (54 // 8) and summary["backend"] == "jax"
    assert {"model.keras", "class_names.json", "preprocessing.json", "training.png"} <= set(os.listdir(run))

    evaluated = subprocess.run(
        _cli("evaluate", str(run), "--json"),
        env=_user_env(),
        capture_output=True,
        text=True,
        timeout=HANG_SECONDS,
    )
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert not re.search(NATIVE_LOG_LINE, evaluated.stderr), evaluated.stderr[-3000:]
    assert json.loads(evaluated.stdout)["top1"] >= 0.9  # three colours are easy

    # The .keras written under JAX exports under TensorFlow, verified against Keras.
    exported = subprocess.run(
        _cli("export", str(run), "--output", str(tmp_path / "exports"), "--format", "tflite",
             "--quantize", "none", "--json"),
        env=_user_env("tensorflow"), capture_output=True, text=True, timeout=HANG_SECONDS,
    )  # fmt: skip
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert not re.search(NATIVE_LOG_LINE, exported.stderr), exported.stderr[-3000:]
    verification = json.loads(exported.stdout)["verification"]
    assert verification["passed"] and verification["results"]["tflite_fp32"]["meets_target"]


# One process with 4 host devices: one device, then model-parallel with --remat; that run's
# shardings and its saved model's answers. Then a tiny Swin: one device, and model-parallel with
# --remat.
ON_FOUR_DEVICES = """
import json, sys
import jax
import numpy as np
from keras_vit.storage.saving import load_trained_model
from keras_vit.training.train import train
from keras_vit.training.config import TrainConfig
report = {"devices": jax.device_count()}
settings = json.loads(sys.argv[1])
swin = dict(settings, model="swin_tiny_patch4_window7_224", image_size=32, overrides=json.loads(sys.argv[3]))
runs = [
    ("one", {"strategy": "one-device"}),
    ("sharded remat", {"strategy": "model-parallel", "model_parallel": 2, "remat": True}),
    ("swin one", dict(swin, strategy="one-device")),
    ("swin sharded remat", dict(swin, strategy="model-parallel", model_parallel=2, remat=True)),
]
for name, extra in runs:
    run = train(TrainConfig(**{**settings, **extra}, output=sys.argv[2] + "/" + name))
    report[name] = run.summary["history"]["loss"]
    if name == "sharded remat":
        report["shards"] = {
            v.path: [list(v.value.shape), [list(s.data.shape) for s in v.value.addressable_shards]]
            for v in [*run.model.weights, *run.training_model.optimizer.variables] if len(v.shape)
        }
        # Its model.keras holds whole weights, not one device's pieces: it loads and answers as
        # the trained model does.
        images = np.random.default_rng(0).uniform(0, 255, (2, 32, 32, 3)).astype("float32")
        saved = load_trained_model(sys.argv[2] + "/" + name)
        answers = [model.predict(images, verbose=0) for model in (saved, run.model)]
        report["saved answers"] = float(np.max(np.abs(answers[0] - answers[1])))
print(json.dumps(report))
"""


def test_model_parallel_shards_weights_and_moments_over_four_devices_and_remat_changes_no_loss(
    colors_dataset, tmp_path
):
    """`--strategy model-parallel --model-parallel 2 --remat` on 4 host devices: a 2 x 2 mesh,
    each device holding half of every sharded kernel and of its optimizer moments, the rest
    replicated, and the blocks recomputed with dropout and stochastic depth on: the losses equal
    one device's. Its model.keras holds the whole weights (it answers as the trained model; a JAX
    run exporting under TensorFlow: test_jax_backend.py). The same for a Swin. (Data-parallel over
    several devices: test_jax_backend.py; what --remat keeps and saves: the tests below.)"""
    settings = dict(
        dataset=colors_dataset, epochs=2, batch_size=8, validation_split=0.0, overrides=TINY_MODEL,
        dropout=0.1, drop_path_rate=0.1, steps_per_epoch=3, crop="none",
    )  # fmt: skip
    # No validation: each run would compile an evaluation step too (the two-process test above
    # validates on a job's devices).
    swin = dict(embed_dim=16, depths=[1, 1], num_heads=[1, 2], window_size=4)
    result = subprocess.run(
        [sys.executable, "-c", ON_FOUR_DEVICES, json.dumps(settings), str(tmp_path), json.dumps(swin)],
        env=_env(XLA_FLAGS=with_xla_flags("--xla_force_host_platform_device_count=4")),
        capture_output=True, text=True, timeout=HANG_SECONDS,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["devices"] == 4
    np.testing.assert_allclose(report["sharded remat"], report["one"], rtol=1e-4)
    np.testing.assert_allclose(report["swin sharded remat"], report["swin one"], rtol=1e-4)
    assert report["saved answers"] < 1e-5

    # The family's layout: the patch projection, each block's QKV, attention output and MLP
    # kernels, and the head's; an optimizer moment is named after its weight.
    sharded_kernels = (
        "projection/kernel",
        "qkv/kernel",
        "proj/kernel",
        "fc1/kernel",
        "fc2/kernel",
        "head/kernel",
    )
    sharded = 0
    for path, (shape, shards) in report["shards"].items():
        assert len(shards) == 4  # a piece on each device
        moment = path.startswith("adam") and path.endswith(("_momentum", "_velocity"))
        weight = path.split("/", 1)[1].rsplit("_", 1)[0].replace("_", "/") if moment else path
        if weight.endswith(sharded_kernels):
            sharded += 1
            assert all(np.prod(piece) * 2 == np.prod(shape) for piece in shards), (path, shards)
        else:
            assert all(piece == shape for piece in shards), (path, shards)  # replicated
    assert sharded == 3 * (2 + 4 * TINY_MODEL["depth"])  # each kernel, with its two moments


# What JAX keeps for the backward pass of a one-block ViT, plain and with the block rematerialised.
RESIDUALS = """
import json
import jax, keras, numpy as np
import contextlib, io
from jax.ad_checkpoint import print_saved_residuals
import keras_vit
report = {}
for remat in (False, True):
    model = keras_vit.create_model("vit_nano_patch4_32", depth=1, hidden_dim=32, num_heads=2, mlp_dim=64)
    model.get_layer("block_0").rematerialise = remat
    weights = [v.value for v in model.trainable_variables]
    state = [v.value for v in model.non_trainable_variables]
    def loss(weights, images):
        logits, _ = model.stateless_call(weights, state, images, training=True)
        return keras.ops.mean(logits**2)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        print_saved_residuals(loss, weights, np.zeros((2, 32, 32, 3), np.float32))
    report[str(remat)] = printed.getvalue().splitlines()  # "f32[2,65,32] output of add from ..."
print(json.dumps(report))
"""


def test_remat_keeps_only_each_blocks_input_for_the_backward_pass():
    """JAX's own account of what the backward pass keeps: with --remat, none of the block's
    activations (its LayerNorms, attention probabilities, MLP), only its input and weights."""
    result = subprocess.run(
        [sys.executable, "-c", RESIDUALS], env=_env(), capture_output=True, text=True, timeout=HANG_SECONDS
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    attention_probabilities = "f32[2,2,65,65]"  # batch, heads, tokens, tokens

    def from_block(kept):
        return [
            line for line in kept if "TransformerBlock" in line or line.startswith(attention_probabilities)
        ]

    assert len(from_block(report["False"])) >= 3
    assert from_block(report["True"]) == []
    assert any("PatchEncoder" in line for line in report["True"])  # the block's input


# XLA's memory figures for one training step (benchmarks/memory.py's own measure), plain, with
# --remat and with LoRA too, for a ViT whose activations outweigh its weights: 6 blocks, 65
# tokens, batch 32 (remat's temporaries 0.37x plain's; 0.30x with 8 blocks, 0.48x with 4).
STEP_MEMORY = """
import json, sys
sys.path.insert(0, sys.argv[1])
import memory
small = dict(image_size=32, overrides=dict(depth=6, hidden_dim=64, num_heads=2, mlp_dim=256))
cases = ("plain", "remat", "remat+lora8")
print(json.dumps({case: memory.measure("vit_nano_patch4_32", case, 32, **small) for case in cases}))
"""


def test_remat_lowers_xlas_memory_for_a_training_step_that_clips_its_gradients():
    """--remat's saving shows in the compiled step, with global-norm clipping on (the default,
    which needs every gradient at once: XLA's CPU scheduler then deferred every weight gradient
    and kept every recomputed activation alive, and keras.remat alone saved nothing)."""
    benchmarks = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "benchmarks")
    sys.path.insert(0, benchmarks)
    import memory

    result = subprocess.run(
        [sys.executable, "-c", STEP_MEMORY, benchmarks],
        env=_env(XLA_FLAGS=with_xla_flags(memory.MEMORY_AWARE_SCHEDULER), JAX_PLATFORMS="cpu"),
        capture_output=True, text=True, timeout=HANG_SECONDS,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    plain, remat, lora = figures["plain"], figures["remat"], figures["remat+lora8"]
    assert plain["arguments"] == remat["arguments"]  # the same weights and moments
    assert remat["temporaries"] < 0.5 * plain["temporaries"], (plain["temporaries"], remat["temporaries"])
    # With LoRA the frozen kernels get no gradient in the recomputed backward pass either
    # (0.80x remat's FLOPs; 0.96x when they were differentiated too).
    assert lora["flops"] < 0.85 * remat["flops"], (remat["flops"], lora["flops"])


def _small_model():
    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.Adam(), loss="mse")
    model.optimizer.build(model.trainable_variables)
    return model


def test_every_process_of_a_job_resumes_from_the_same_backup_whichever_reads_first(tmp_path):
    """A job's processes share process 0's backups. The latest one waits for its epoch's end
    (the job stopped during validation), so all resume from the one before it, whichever reads
    first; no process moves a file before all have read, and then only the writer does."""
    from keras_vit.training.callbacks import ResumableBackup

    folder = tmp_path / "backup"
    writer = ResumableBackup(str(folder), steps_per_epoch=2, save_freq=1)
    writer.set_model(_small_model())
    for step in (1, 2):  # mid-epoch, then on the epoch's last step
        writer.model.optimizer.iterations.assign(step)
        writer._save_model()

    def files():
        return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}

    written = files()
    for order in (("reader", "writer"), ("writer", "reader")):
        for name in set(files()) - set(written):
            (folder / name).unlink()
        for name, content in written.items():
            (folder / name).write_bytes(content)
        resumed = {}
        for who in order:
            before = files()
            unmoved_when_waiting = []
            backup = ResumableBackup(
                str(folder), steps_per_epoch=2, save_freq=1, writes=who == "writer",
                wait_for_all=lambda seen=unmoved_when_waiting, before=before: seen.append(files() == before),
            )  # fmt: skip
            backup.set_model(_small_model())
            resumed[who] = backup.restore()
            assert unmoved_when_waiting == [True]  # it waited for the others before moving anything
            if who == "reader":
                assert files() == before  # a reader never moves or removes a file
        assert resumed == {"reader": 1, "writer": 1}, order
        assert json.loads(files()["training_metadata.json"])["step"] == 1  # the one kept is the latest
