"""How a training step's time and memory grow with the token count.

Config A's architecture (patch 4, width 192, depth 6, 3 heads, MLP 768) at growing image
sizes: 32 x 32 is 64 patch tokens, 128 x 128 is 1024. Each size runs in its own process,
so its peak resident memory (`VmHWM`, which includes XLA's compilation) is its own.

    python benchmarks/token_scaling.py --image-size 64     # one size, prints one JSON line

Attention's share of the FLOPs is `2 N D / (12 D^2 + 2 N D)` per token and block for N
tokens of width D (QKV, projection and a 4x MLP are 12 D^2 multiply-adds per token), so its
products alone equal the rest at N = 6 D = 1152 tokens; softmax over N x N scores costs
memory traffic that the FLOPs leave out, so in time it takes over earlier.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ARCHITECTURE = dict(patch_size=4, hidden_dim=192, depth=6, num_heads=3, mlp_dim=768)


def _memory_mb(field):
    """`VmHWM` (peak) or `VmRSS` (now) of this process, in MB. Not `ru_maxrss`: a process
    started by fork and exec inherits its parent's peak there."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def measure(image_size, batch_size, steps, architecture=ARCHITECTURE):
    """Runs in a fresh process: step seconds and peak memory for one image size."""
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras
    import numpy as np

    import keras_vit

    model = keras_vit.ViT(image_size=image_size, num_classes=10, drop_path_rate=0.0, **architecture)
    model.compile(
        optimizer=keras.optimizers.AdamW(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=True,
    )
    rng = np.random.default_rng(0)
    images = rng.uniform(0, 255, (batch_size, image_size, image_size, 3)).astype("float32")
    labels = rng.integers(0, 10, batch_size)
    before = _memory_mb("VmRSS")
    model.train_on_batch(images, labels)  # compiles
    model.train_on_batch(images, labels)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        model.train_on_batch(images, labels)
        times.append(time.perf_counter() - start)
    tokens = (image_size // architecture["patch_size"]) ** 2
    d = architecture["hidden_dim"]
    return {
        "image_size": image_size,
        "tokens": tokens,
        "batch_size": batch_size,
        "step_seconds": statistics.median(times),
        "ms_per_image": 1000 * statistics.median(times) / batch_size,
        "training_flops_per_image": keras_vit.training_flops(model),
        "attention_flop_share": (tokens + 1) / (6 * d + tokens + 1),
        "peak_rss_mb": _memory_mb("VmHWM"),
        "peak_rss_over_model_mb": _memory_mb("VmHWM") - before,
    }


def token_scaling(image_sizes, batch_size=16, steps=3, architecture=ARCHITECTURE):
    """One fresh process per size; returns their results, smallest first. `architecture`:
    ViT arguments (the benchmark's by default; the tests pass a tiny one)."""
    results = []
    for size in image_sizes:
        command = [sys.executable, os.path.abspath(__file__), "--image-size", str(size)]
        command += ["--batch-size", str(batch_size), "--steps", str(steps)]
        command += ["--architecture", json.dumps(architecture)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"token scaling at {size} x {size} failed:\n{done.stderr[-2000:]}")
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    base = results[0]
    for result in results:  # time per token, relative to the smallest size
        result["time_per_token_vs_smallest"] = (result["ms_per_image"] / result["tokens"]) / (
            base["ms_per_image"] / base["tokens"]
        )
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image-size", type=int, required=True)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--architecture", type=json.loads, default=ARCHITECTURE, help="ViT arguments, JSON")
    args = parser.parse_args()
    print(json.dumps(measure(args.image_size, args.batch_size, args.steps, args.architecture)))
