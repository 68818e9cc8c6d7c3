"""GPU training speed: keras_vit through `model.fit` against keras-hub and timm, in one run.

    KERAS_BACKEND=jax python benchmarks/gpu.py           # on a machine with a GPU
    KERAS_BACKEND=jax python benchmarks/gpu.py --quick   # fewer steps, ViT-B/16 at batch 128 only

Measures, on the first GPU:
- the bf16 matmul peak (8192^3, jitted) beside the GPU's bf16 spec;
- training images/s and MFU of one architecture in three implementations, same batch:
  keras_vit as users run it (`TrainingModel` compiled by `keras_vit.training.train`, `model.fit` on
  uint8 batches from tf.data, mixed_bfloat16, AdamW), keras-hub's `ViTBackbone` + a Dense
  head through `model.fit` (when keras-hub is installed), and timm (bf16 autocast, fused
  AdamW, `torch.compile`, data already on the GPU): ViT-B/16 at 224 (batch 128 and 256)
  and config A (32x32, patch 4, width 192, depth 6, batch 1024);
- the whole `keras-vit train` rate on CIFAR-10-sized images (`vit_tiny_patch4_32`, bf16,
  batch 512) with the full augmentation set (pad-crop, flip, RandAugment 2, MixUp 0.8,
  CutMix 1.0, RandomErasing 0.25) against the same run without augmentation.
Writes docs/benchmarks/gpu.json and gpu.md and prints the JSON summary as its last line
(`speedup_gpu_train_vs_timm`: keras_vit's ViT-B/16 batch-128 rate over timm's; above 1,
keras_vit is faster). Without a GPU it says so in one line and exits 0; `--allow-cpu`
runs the same code on the CPU at tiny sizes (the test suite does, to keep it working).
"""

import argparse
import json
import os
import statistics
import sys
import time

# JAX must leave GPU memory to PyTorch in the same process.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

HERE = os.path.dirname(os.path.abspath(__file__))
OUTPUT = os.path.join(HERE, os.pardir, "docs", "benchmarks")
# Dense bf16 tensor-core TFLOP/s from the vendors' data sheets (SXM parts).
BF16_SPEC_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "L4": 121.0, "B200": 2250.0}
ARCHITECTURES = {
    "vit_b16_224": dict(image_size=224, patch_size=16, hidden_dim=768, depth=12, num_heads=12, mlp_dim=3072),
    "config_a": dict(image_size=32, patch_size=4, hidden_dim=192, depth=6, num_heads=3, mlp_dim=768),
    "tiny": dict(image_size=32, patch_size=4, hidden_dim=32, depth=2, num_heads=4, mlp_dim=64),
}
NUM_CLASSES = 10
FULL_AUGMENTATION = dict(randaugment=2, mixup=0.8, cutmix=1.0, random_erasing=0.25)


def gpu_name():
    """The first GPU's name as JAX reports it, or None."""
    import jax

    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    return gpus[0].device_kind if gpus else None


def bf16_spec(name):
    for key, tflops in BF16_SPEC_TFLOPS.items():
        if name and key in name.upper():
            return tflops
    return None


def matmul_peak_tflops(size=8192, repeats=20):
    import jax
    import jax.numpy as jnp

    a = jnp.ones((size, size), jnp.bfloat16)
    product = jax.jit(lambda x, y: x @ y)
    product(a, a).block_until_ready()
    start = time.perf_counter()
    for _ in range(repeats):
        out = product(a, a)
    out.block_until_ready()
    return 2 * size**3 * repeats / (time.perf_counter() - start) / 1e12


class _EpochTimer:
    """Wall time of each epoch of `fit`, as a Keras callback (made lazily: Keras imports late)."""

    def __new__(cls):
        import keras

        class Timer(keras.callbacks.Callback):
            def __init__(self):
                super().__init__()
                self.seconds = []

            def on_epoch_begin(self, epoch, logs=None):
                self._start = time.perf_counter()

            def on_epoch_end(self, epoch, logs=None):
                self.seconds.append(time.perf_counter() - self._start)

        return Timer()


def _fit_rate(model, dataset, batch, steps, epochs):
    """images/s of `model.fit` over `epochs` epochs of `steps` steps; the first (compile) is dropped.
    Each epoch ends with a host sync (the logs), so its time covers its steps."""
    timer = _EpochTimer()
    model.fit(dataset, epochs=epochs, steps_per_epoch=steps, callbacks=[timer], verbose=0)
    return batch * steps / statistics.median(timer.seconds[1:])


def _synthetic_batches(size, batch, as_dict):
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (batch, size, size, 3), dtype=np.uint8)
    labels = rng.integers(0, NUM_CLASSES, batch).astype(np.int32)
    element = {"images": images, "labels": labels} if as_dict else (images, labels)
    return tf.data.Dataset.from_tensors(element).repeat()


def keras_vit_rate(architecture, batch, steps, epochs, precision):
    from keras_vit.training.callbacks import steps_per_execution
    from keras_vit.training.config import TrainConfig
    from keras_vit.training.train import build_model, compile_training_model

    spec = ARCHITECTURES[architecture]
    overrides = {k: spec[k] for k in ("patch_size", "hidden_dim", "depth", "num_heads", "mlp_dim")}
    config = TrainConfig(
        model="vit_tiny_patch16_224", image_size=spec["image_size"], batch_size=batch, overrides=overrides,
        precision=precision, crop="none", drop_path_rate=0.0, learning_rate=1e-3,
    ).resolved()  # fmt: skip
    classifier = build_model(config, NUM_CLASSES, [str(i) for i in range(NUM_CLASSES)])
    model = compile_training_model(
        config, classifier, total_steps=steps * epochs, warmup_steps=1,
        execution_steps=steps_per_execution(steps, config.backup_every_steps),
    )  # fmt: skip
    model.augmentation = None  # the step alone: augmentation is measured by augmentation_cost()
    data = _synthetic_batches(spec["image_size"], batch, as_dict=True)
    return _fit_rate(model, data, batch, steps, epochs), classifier


def keras_hub_rate(architecture, batch, steps, epochs, precision):
    try:
        import keras_hub
    except ImportError:
        return None
    import keras

    spec = ARCHITECTURES[architecture]
    size = spec["image_size"]
    keras.config.set_dtype_policy(precision)
    try:
        backbone = keras_hub.models.ViTBackbone(
            image_shape=(size, size, 3), patch_size=spec["patch_size"], num_layers=spec["depth"],
            num_heads=spec["num_heads"], hidden_dim=spec["hidden_dim"], mlp_dim=spec["mlp_dim"],
        )  # fmt: skip
        images = keras.Input((size, size, 3), dtype="uint8")
        tokens = backbone(keras.ops.cast(images, "float32"))
        logits = keras.layers.Dense(NUM_CLASSES, dtype="float32")(tokens[:, 0])
        model = keras.Model(images, logits)
    finally:
        keras.config.set_dtype_policy("float32")
    model.compile(
        optimizer=keras.optimizers.AdamW(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=True,
    )
    return _fit_rate(model, _synthetic_batches(size, batch, as_dict=False), batch, steps, epochs)


def timm_rate(architecture, batch, steps, epochs, device):
    import torch
    from timm.models.vision_transformer import VisionTransformer

    spec = ARCHITECTURES[architecture]
    size = spec["image_size"]
    model = VisionTransformer(
        img_size=size, patch_size=spec["patch_size"], embed_dim=spec["hidden_dim"], depth=spec["depth"],
        num_heads=spec["num_heads"], num_classes=NUM_CLASSES, mlp_ratio=spec["mlp_dim"] / spec["hidden_dim"],
    ).to(device)  # fmt: skip
    fused = device == "cuda"
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=fused)
    compiled = torch.compile(model) if fused else model
    images = torch.rand(batch, 3, size, size, device=device)
    labels = torch.randint(0, NUM_CLASSES, (batch,), device=device)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(compiled(images), labels)
        loss.backward()
        optimizer.step()

    seconds = []
    for _ in range(epochs):
        if fused:
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            step()
        if fused:
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    return batch * steps / statistics.median(seconds[1:])


def augmentation_cost(dataset, model, batch, steps, epochs, precision, image_size=None):
    """`keras-vit train` images/s with the full augmentation set and without, from whole runs:
    the rate is the extra images of a longer run over its extra seconds (start-up and compile cancel)."""
    import tempfile

    from keras_vit.training.config import TrainConfig
    from keras_vit.training.train import train

    def seconds(augment, run_epochs):
        with tempfile.TemporaryDirectory() as folder:
            config = TrainConfig(
                dataset=dataset, model=model, output=os.path.join(folder, "run"), epochs=run_epochs,
                batch_size=batch, steps_per_epoch=steps, precision=precision, validation_split=0.02,
                backup_every_steps=steps, image_size=image_size, crop="pad" if augment else "none",
                **(FULL_AUGMENTATION if augment else {}),
            )  # fmt: skip
            start = time.perf_counter()
            train(config)
            return time.perf_counter() - start

    rates = {}
    for name, augment in (("plain", False), ("augmented", True)):
        extra = seconds(augment, 1 + epochs) - seconds(augment, 1)
        rates[name] = batch * steps * epochs / extra
    return {**rates, "cost": 1 - rates["augmented"] / rates["plain"]}


def _row(name, rate, flops_per_image, peak_tflops):
    if rate is None:
        return {"images_per_second": None, "mfu": None, "note": "not installed"}
    return {
        "images_per_second": rate,
        "mfu": rate * flops_per_image / (peak_tflops * 1e12) if peak_tflops else None,
    }


def run(quick=False, on_progress=None):
    """Measures everything; `on_progress(summary)` after each row, so that a run cut short (the
    lent GPU's minutes end) still leaves its report with the rows it measured."""
    # PyTorch before TensorFlow (keras_vit imports it for tf.data): the other order breaks torchvision.
    import torch  # noqa: F401

    import keras_vit

    name = gpu_name()
    tiny = name is None
    device = "cpu" if tiny else "cuda"
    spec_tflops = bf16_spec(name)
    measured_peak = matmul_peak_tflops(size=512 if tiny else 8192)
    precision = "float32" if tiny else "mixed_bfloat16"
    steps, epochs = (2, 2) if tiny else ((30, 3) if quick else (50, 4))
    cases = (
        [("tiny", 8)]
        if tiny
        else [("vit_b16_224", 128)] + ([] if quick else [("vit_b16_224", 256), ("config_a", 1024)])
    )
    training = []
    for architecture, batch in cases:
        rate, classifier = keras_vit_rate(architecture, batch, steps, epochs, precision)
        flops = keras_vit.training_flops(classifier)
        peak = spec_tflops or measured_peak
        row = {"architecture": architecture, "batch": batch, "training_flops_per_image": flops}
        row["keras_vit"] = _row("keras_vit", rate, flops, peak)
        row["keras_hub"] = _row(
            "keras_hub", keras_hub_rate(architecture, batch, steps, epochs, precision), flops, peak
        )
        row["timm"] = _row("timm", timm_rate(architecture, batch, steps, epochs, device), flops, peak)
        row["keras_vit"]["mfu_of_measured_peak"] = rate * flops / (measured_peak * 1e12)
        training.append(row)
        print(json.dumps(row), flush=True)
        if on_progress:
            on_progress(summarise(name, spec_tflops, measured_peak, training, None))
    augmentation = augmentation_cost(
        "cifar10-mini", "vit_tiny_patch4_32", batch=8 if tiny else 512, steps=2 if tiny else 40,
        epochs=1 if tiny else 3, precision=precision,
    )  # fmt: skip
    return summarise(name, spec_tflops, measured_peak, training, augmentation)


def summarise(name, spec_tflops, measured_peak, training, augmentation):
    """The report's JSON from the measured rows; `augmentation` None while it is not measured."""
    import torch

    headline = training[0]
    return {
        "gpu": name or "none (CPU smoke run)",
        "bf16_spec_tflops": spec_tflops,
        "bf16_matmul_peak_tflops": measured_peak,
        "speedup_gpu_train_vs_timm": headline["keras_vit"]["images_per_second"]
        / headline["timm"]["images_per_second"],
        "gpu_train_mfu": headline["keras_vit"]["mfu"],
        "gpu_augmentation_cost": augmentation["cost"] if augmentation else None,
        "training": training,
        "augmentation": augmentation,
        "torch": torch.__version__,
        "keras_backend": os.environ["KERAS_BACKEND"],
    }


def write_report(summary, folder):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "gpu.json"), "w") as f:
        json.dump(summary, f, indent=2)
    lines = [
        "# GPU training speed",
        "",
        f"Measured with `KERAS_BACKEND=jax python benchmarks/gpu.py` on {summary['gpu']}: bf16 spec "
        f"{summary['bf16_spec_tflops']} TFLOP/s, matmul peak measured in the same run "
        f"{summary['bf16_matmul_peak_tflops']:.0f} TFLOP/s. MFU is against the spec.",
        "",
        "| architecture | batch | keras_vit img/s (MFU) | keras-hub img/s | timm compiled img/s (MFU) |",
        "|---|---|---|---|---|",
    ]

    def cell(result):
        if result["images_per_second"] is None:
            return result.get("note", "-")
        mfu = f" ({result['mfu']:.0%})" if result["mfu"] is not None else ""
        return f"{result['images_per_second']:,.0f}{mfu}"

    for row in summary["training"]:
        lines.append(
            f"| {row['architecture']} | {row['batch']} | {cell(row['keras_vit'])} | "
            f"{cell(row['keras_hub'])} | {cell(row['timm'])} |"
        )
    augmentation = summary["augmentation"]
    lines.append("")
    if augmentation:
        lines.append(
            f"`keras-vit train` (vit_tiny_patch4_32, bf16, batch 512): {augmentation['plain']:,.0f} img/s "
            f"without augmentation, {augmentation['augmented']:,.0f} with the full set "
            f"(cost {augmentation['cost']:.1%})."
        )
    else:
        lines.append("The augmentation's cost: not measured (the run ended before that part).")
    lines += [
        "",
        f"keras_vit over timm (ViT-B/16, first row): {summary['speedup_gpu_train_vs_timm']:.2f}x.",
        "",
    ]
    with open(os.path.join(folder, "gpu.md"), "w") as f:
        f.write("\n".join(lines))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="ViT-B/16 at batch 128 only, fewer steps")
    parser.add_argument("--allow-cpu", action="store_true", help="without a GPU, run tiny sizes on the CPU")
    parser.add_argument("--output", default=OUTPUT, help="folder for gpu.json and gpu.md")
    args = parser.parse_args(argv)
    import torch  # noqa: F401  (before TensorFlow, which keras_vit brings)

    if gpu_name() is None and not args.allow_cpu:
        print("benchmarks/gpu.py: no GPU found (JAX sees none); nothing measured.")
        return 0
    # A CPU smoke run never replaces the GPU figures.
    report = (lambda summary: write_report(summary, args.output)) if gpu_name() is not None else None
    summary = run(quick=args.quick, on_progress=report)
    if report:
        report(summary)
    print(json.dumps({k: v for k, v in summary.items() if k not in ("training", "augmentation")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
