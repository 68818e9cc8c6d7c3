"""GPU: what fused attention changes in keras_vit's ViT-B/16, against timm, in one run.

    KERAS_BACKEND=jax python benchmarks/gpu_attention.py     # on a machine with a GPU

Measures, bf16 at 224, batch 128, on the first GPU:
- the forward pass alone (inference mode, jitted `stateless_call`): keras_vit with its attention
  as one fused kernel (`ops.dot_product_attention`: cuDNN's flash attention where JAX finds it),
  keras_vit with the explicit matmul, softmax, matmul it ran before, and timm compiled;
- a training step through `model.fit` (as `benchmarks/gpu.py` measures it), fused and explicit
  (the library fuses attention for inference only: on an H200 the fused training step was slower,
  docs/benchmarks/history.md).
Writes docs/benchmarks/gpu_attention.{json,md}; prints the JSON summary as its last line.
"""

import argparse
import json
import os
import re
import statistics
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import gpu  # noqa: E402  (benchmarks/gpu.py: the training rate, the GPU's name and spec)

BATCH = 128
STEPS, ROUNDS = 30, 4


def _median_rate(run_round, batch):
    seconds = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        run_round()
        seconds.append(time.perf_counter() - start)
    return batch * STEPS / statistics.median(seconds[1:])


def keras_vit_forward_rate(classifier, batch):
    import jax
    import numpy as np

    images = jax.device_put(np.random.default_rng(0).uniform(0, 255, (batch, 224, 224, 3)).astype("float32"))
    trainable = [v.value for v in classifier.trainable_variables]
    frozen = [v.value for v in classifier.non_trainable_variables]
    forward = jax.jit(lambda t, f, x: classifier.stateless_call(t, f, x, training=False)[0])

    def run_round():
        for _ in range(STEPS):
            out = forward(trainable, frozen, images)
        out.block_until_ready()

    return _median_rate(run_round, batch)


def timm_forward_rate(batch):
    import torch
    from timm.models.vision_transformer import VisionTransformer

    model = (
        VisionTransformer(img_size=224, patch_size=16, embed_dim=768, depth=12, num_heads=12).cuda().eval()
    )
    compiled = torch.compile(model)
    images = torch.rand(batch, 3, 224, 224, device="cuda")

    def run_round():
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            for _ in range(STEPS):
                compiled(images)
        torch.cuda.synchronize()

    return _median_rate(run_round, batch)


def measure():
    import torch  # noqa: F401  (PyTorch before TensorFlow)

    import keras_vit
    from keras_vit.model.vit import layers

    fused_applies, fused = layers.fused_attention_applies, layers.fused_attention

    def cudnn_attention(q, k, v, num_heads, scale):  # jax.nn's cuDNN kernel, asked for by name
        import jax

        shape = (q.shape[0], q.shape[1], num_heads, q.shape[-1] // num_heads)
        heads = [t.reshape(shape) for t in (q, k, v)]
        return jax.nn.dot_product_attention(*heads, scale=scale, implementation="cudnn").reshape(q.shape)

    def everywhere(attention_dropout, training, return_attention_scores):  # training steps too
        return not return_attention_scores

    rows = {}
    variants = (
        ("fused", everywhere, fused),
        ("cudnn", everywhere, cudnn_attention),
        ("explicit", lambda *args: False, fused),
    )
    for kind, applies, attend in variants:
        layers.fused_attention_applies, layers.fused_attention = applies, attend
        try:
            rate, classifier = gpu.keras_vit_rate("vit_b16_224", BATCH, STEPS, ROUNDS, "mixed_bfloat16")
        except Exception as error:  # the cuDNN kernel may refuse this shape or this JAX
            message = [line for line in str(error).splitlines() if "Unsupported" in line or "rror" in line]
            message = re.sub(r"\x1b\[[0-9;]*m", "", (message or [str(error)])[0])
            rows[kind] = {"error": f"{type(error).__name__}: {message[:200]}"}
            print(json.dumps({kind: rows[kind]}), flush=True)
            continue
        flops = keras_vit.training_flops(classifier)
        rows[kind] = {
            "train_images_per_second": rate,
            "train_mfu": rate * flops / (gpu.bf16_spec(gpu.gpu_name()) * 1e12),
            "forward_images_per_second": keras_vit_forward_rate(classifier, BATCH),
        }
        print(json.dumps({kind: rows[kind]}), flush=True)
    layers.fused_attention_applies, layers.fused_attention = fused_applies, fused
    timm_train = gpu.timm_rate("vit_b16_224", BATCH, STEPS, ROUNDS, "cuda")
    timm_forward = timm_forward_rate(BATCH)
    return {
        "gpu": gpu.gpu_name(),
        "bf16_spec_tflops": gpu.bf16_spec(gpu.gpu_name()),
        "architecture": "vit_b16_224",
        "batch": BATCH,
        "keras_vit": rows,
        "timm_compiled": {"train_images_per_second": timm_train, "forward_images_per_second": timm_forward},
        "fused_train_vs_timm": rows["fused"]["train_images_per_second"] / timm_train,
        "fused_forward_vs_timm": rows["fused"]["forward_images_per_second"] / timm_forward,
        "fused_vs_explicit_train": rows["fused"]["train_images_per_second"]
        / rows["explicit"]["train_images_per_second"],
    }


def write_report(summary, folder):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "gpu_attention.json"), "w") as f:
        json.dump(summary, f, indent=2)
    lines = [
        "# Fused attention on the GPU (ViT-B/16, bf16, 224, batch 128)",
        "",
        f"Measured on {summary['gpu']} by `KERAS_BACKEND=jax python benchmarks/gpu_attention.py`; "
        f"MFU against the {summary['bf16_spec_tflops']:.0f} TFLOP/s dense bf16 spec.",
        "",
        "| implementation | training img/s | training MFU | forward img/s |",
        "|---|---|---|---|",
    ]
    for kind, row in summary["keras_vit"].items():
        if "error" in row:
            lines.append(f"| keras_vit, {kind} attention | {row['error']} | | |")
            continue
        lines.append(
            f"| keras_vit, {kind} attention | {row['train_images_per_second']:,.0f} | "
            f"{row['train_mfu']:.1%} | {row['forward_images_per_second']:,.0f} |"
        )
    timm = summary["timm_compiled"]
    lines.append(
        f"| timm, `torch.compile` | {timm['train_images_per_second']:,.0f} | | "
        f"{timm['forward_images_per_second']:,.0f} |"
    )
    with open(os.path.join(folder, "gpu_attention.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default=gpu.OUTPUT)
    args = parser.parse_args()
    if gpu.gpu_name() is None:
        print("No GPU: benchmarks/gpu_attention.py measures a GPU only.")
        return
    summary = measure()
    write_report(summary, args.output)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
