"""keras-vit against its peers, measured side by side in one run on this machine.

    python benchmarks/run.py --quick      # under 5 minutes on 2 cores
    python benchmarks/run.py              # everything (about 13 minutes on 2 cores)

Measures the machine's fp32 matmul peak (2048 x 2048, TensorFlow, TensorFlow with XLA and
PyTorch), then
- training images/s and MFU for one architecture in three implementations: keras_vit,
  keras-hub's `ViTBackbone` + a Dense head (with XLA, its faster mode) and timm (PyTorch);
  config A: 32 x 32, patch 4, width 192, depth 6, 3 heads, MLP 768, batch 128, AdamW;
  config B: ViT-Ti/16 at 224, batch 32 (full run only);
- the input pipeline's images/s against the training step's (`input_pipeline.py`);
- step time and memory as the token count grows, 64 to 1024 tokens (`token_scaling.py`);
- inference of ViT-Ti/16 (and ViT-S/16 in the full run) at 224 in every runtime
  (`inference.py`): batch-1 latency, and batch-32 throughput in the full run;
- in the full run, DINOv2-S/14, SigLIP-B/16 and DINOv3-S/16 at 224 beside ViT-S/16: TFLite fp32
  against ONNX Runtime and PyTorch (`backbones.py`).
The sides alternate within each round (the machine is noisy: one config differs by up to 20%
between runs), and every figure is the median over rounds. Writes docs/benchmarks/
results.json, results.md, training.png and scaling.png, and prints a JSON summary as its
last line: speed-ups are keras_vit's speed over the peer's (above 1: keras_vit is faster).
Needs the bench extra: pip install -e ".[bench]".
"""

import argparse
import json
import os
import statistics
import sys
import time

# PyTorch before TensorFlow: the other order crashes torchvision's import (timm needs it).
import timm  # noqa: F401
import torch

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from backbones import BACKBONES, backbone_goals  # noqa: E402
from backbones import RUNTIMES as BACKBONE_RUNTIMES  # noqa: E402
from inference import QUICK_RUNTIMES, THREADS, inference, median_seconds  # noqa: E402
from input_pipeline import cifar10, images_224  # noqa: E402
from token_scaling import token_scaling  # noqa: E402

import keras_vit  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUTPUT = os.path.join(HERE, os.pardir, "docs", "benchmarks")
CONFIGS = {
    "A": dict(image_size=32, patch_size=4, hidden_dim=192, depth=6, num_heads=3, mlp_dim=768, batch=128),
    "B": dict(image_size=224, patch_size=16, hidden_dim=192, depth=12, num_heads=3, mlp_dim=768, batch=32),
}
NUM_CLASSES = 10
ALL_RUNTIMES = (
    "keras_predict_on_batch", "keras_xla", "saved_model", "tflite_fp32", "tflite_fp16",
    "tflite_dynamic", "tflite_int8", "onnxruntime_timm", "torch_timm",
)  # fmt: skip


# ---- the machine's peak ----------------------------------------------------------------


def matmul_peak(size=2048, repeats=10):
    """fp32 GFLOP/s of a size x size matmul: TensorFlow (graph, and XLA as keras_vit trains)
    and PyTorch; the peak is the largest."""
    a, b = tf.random.normal((size, size)), tf.random.normal((size, size))
    flops = 2 * size**3
    peak = {}
    for name, jit in (("tensorflow", False), ("tensorflow_xla", True)):
        product = tf.function(lambda: tf.matmul(a, b), jit_compile=jit)
        peak[name] = flops / median_seconds(lambda f=product: f().numpy(), repeats, warmup=2) / 1e9
    x, y = torch.randn(size, size), torch.randn(size, size)
    peak["torch"] = flops / median_seconds(lambda: torch.mm(x, y), repeats, warmup=2) / 1e9
    return peak


# ---- training ---------------------------------------------------------------------------


def _keras_vit(config):
    return keras_vit.ViT(
        image_size=config["image_size"], patch_size=config["patch_size"], hidden_dim=config["hidden_dim"],
        depth=config["depth"], num_heads=config["num_heads"], mlp_dim=config["mlp_dim"],
        num_classes=NUM_CLASSES, drop_path_rate=0.0,
    )  # fmt: skip


def _keras_hub(config):
    import keras_hub

    size = config["image_size"]
    backbone = keras_hub.models.ViTBackbone(
        image_shape=(size, size, 3), patch_size=config["patch_size"], num_layers=config["depth"],
        num_heads=config["num_heads"], hidden_dim=config["hidden_dim"], mlp_dim=config["mlp_dim"],
    )  # fmt: skip
    inputs = keras.Input((size, size, 3))
    tokens = backbone(inputs)
    return keras.Model(inputs, keras.layers.Dense(NUM_CLASSES)(tokens[:, 0]))


def _timm(config):
    from timm.models.vision_transformer import VisionTransformer

    return VisionTransformer(
        img_size=config["image_size"], patch_size=config["patch_size"], embed_dim=config["hidden_dim"],
        depth=config["depth"], num_heads=config["num_heads"], num_classes=NUM_CLASSES,
        mlp_ratio=config["mlp_dim"] / config["hidden_dim"],
    )  # fmt: skip


def keras_step(model, config):
    model.compile(
        optimizer=keras.optimizers.AdamW(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=True,
    )
    rng = np.random.default_rng(0)
    size = config["image_size"]
    images = rng.uniform(0, 255, (config["batch"], size, size, 3)).astype("float32")
    labels = rng.integers(0, NUM_CLASSES, config["batch"])
    return lambda: model.train_on_batch(images, labels)


def torch_step(model, config):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    size = config["image_size"]
    images = torch.rand(config["batch"], 3, size, size)
    labels = torch.randint(0, NUM_CLASSES, (config["batch"],))
    model.train()

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()

    return step


def training(config, rounds, steps, peak):
    """images/s per implementation (median over rounds; sides alternate) and MFU."""
    sides = {
        "keras_vit": keras_step(_keras_vit(config), config),
        "keras_hub": keras_step(_keras_hub(config), config),
        "timm": torch_step(_timm(config), config),
    }
    for step in sides.values():  # compile (XLA) and warm up
        step()
        step()
    seconds = {name: [] for name in sides}
    for _ in range(rounds):
        for name, step in sides.items():
            start = time.perf_counter()
            for _ in range(steps):
                step()
            seconds[name].append((time.perf_counter() - start) / steps)
    flops = keras_vit.training_flops(_keras_vit(config))
    results = {}
    for name, times in seconds.items():
        images_per_second = config["batch"] / statistics.median(times)
        results[name] = {
            "images_per_second": images_per_second,
            "mfu": images_per_second * flops / (peak * 1e9),
            "step_seconds": times,
        }
    return results


# ---- report -----------------------------------------------------------------------------


SWIN = "swin_tiny_patch4_window7_224"


def _goals(results):
    """(goal, measured, met) rows for the issue's targets that this run measured."""
    rows = []
    for name, sides in results["training"].items():
        ours = sides["keras_vit"]["images_per_second"]
        hub, versus_timm = (ours / sides[s]["images_per_second"] for s in ("keras_hub", "timm"))
        mfu = sides["keras_vit"]["mfu"]
        rows += [
            (f"config {name}: keras_vit >= 1.2x keras-hub (XLA)", f"{hub:.2f}x", hub >= 1.2),
            (f"config {name}: keras_vit >= 1.3x timm", f"{versus_timm:.2f}x", versus_timm >= 1.3),
            (f"config {name}: MFU >= 75% of the matmul peak", f"{mfu:.0%}", mfu >= 0.75),
        ]
    ti = results["inference"]["vit_tiny_patch16_224"]
    fp32, ort = ti["tflite_fp32"]["batch1_ms"], ti["onnxruntime_timm"]["batch1_ms"]
    rows.append(("TFLite fp32 batch 1 <= 0.85x ONNX Runtime", f"{fp32 / ort:.2f}x", fp32 / ort <= 0.85))
    if SWIN in results["inference"]:
        swin = results["inference"][SWIN]
        ratio = swin["tflite_fp32"]["batch1_ms"] / swin["onnxruntime_timm"]["batch1_ms"]
        rows.append(("Swin-T: TFLite fp32 batch 1 <= 0.85x ONNX Runtime", f"{ratio:.2f}x", ratio <= 0.85))
    rows += backbone_goals({n: r for n, r in results["inference"].items() if n in BACKBONES})
    dynamic = ti["tflite_dynamic"]["batch1_ms"] / fp32
    rows.append(("dynamic-range int8 <= 0.55x fp32", f"{dynamic:.2f}x", dynamic <= 0.55))
    if "tflite_int8" in ti:
        from keras_vit.export.exporter import recommended_variant

        full = ti["tflite_int8"]["batch1_ms"] / fp32
        # The exporter's choice, even if int8 met its accuracy targets.
        timings = {f"tflite_{v}": {"latency_ms": ti[f"tflite_{v}"]["batch1_ms"]} for v in ("fp32", "int8")}
        chosen = recommended_variant({k: dict(v, meets_target=True) for k, v in timings.items()})
        rows.append(
            (
                "full int8 faster than fp32, else not the default",
                f"{full:.2f}x fp32's latency; the default: {chosen}",
                full < 1 or chosen != "int8",
            )
        )
    keras = ti["keras_xla"]["batch1_ms"] / fp32
    rows.append(("Keras (XLA) within 1.2x of TFLite fp32 per image", f"{keras:.2f}x", keras <= 1.2))
    for row in results["pipeline"]:
        rows.append(
            (
                f"input pipeline ({row['dataset']}) >= 3x the training step",
                f"{row['ratio']:.1f}x",
                row["ratio"] >= 3,
            )
        )
    return rows


def write_report(results):
    """results.json, results.md (a table per measurement) and the two figures, in OUTPUT."""
    from keras_vit.files import atomic_write, write_json

    os.makedirs(OUTPUT, exist_ok=True)
    write_json(os.path.join(OUTPUT, "results.json"), results)
    sections = (
        _header(results),
        _goals_table(results),
        _training_table(results),
        _pipeline_table(results),
        _scaling_table(results),
        *(_inference_table(name, runtimes) for name, runtimes in results["inference"].items()),
    )
    text = "\n\n".join("\n".join(lines) for lines in sections) + "\n"
    atomic_write(os.path.join(OUTPUT, "results.md"), lambda p: open(p, "w").write(text))
    _plot_training(results, os.path.join(OUTPUT, "training.png"))
    _plot_scaling(results, os.path.join(OUTPUT, "scaling.png"))


def _header(results):
    peak = results["peak"]
    return [
        "# Benchmarks",
        "",
        f"`python benchmarks/run.py{' --quick' if results['quick'] else ''}` on {results['machine']}, "
        f"{results['date']}. Medians over {results['rounds']} alternating rounds. "
        "How the figures moved with each change: [history.md](history.md).",
        "",
        f"fp32 matmul peak (2048 x 2048): TensorFlow {peak['tensorflow']:.0f} GFLOP/s, "
        f"with XLA {peak['tensorflow_xla']:.0f}, PyTorch {peak['torch']:.0f}; "
        "MFU is relative to the largest.",
    ]


def _goals_table(results):
    rows = [f"| {goal} | {value} | {'yes' if met else 'no'} |" for goal, value, met in _goals(results)]
    return ["## Goals", "", "| goal | measured | met |", "|---|---|---|", *rows]


def _training_table(results):
    lines = [
        "## Training (images/s, MFU)",
        "",
        "| config | keras_vit | keras-hub (XLA) | timm | keras_vit / keras-hub | keras_vit / timm |",
        "|---|---|---|---|---|---|",
    ]
    for name, sides in results["training"].items():
        cells = [
            f"{sides[s]['images_per_second']:.1f} ({sides[s]['mfu']:.0%})"
            for s in ("keras_vit", "keras_hub", "timm")
        ]
        ours = sides["keras_vit"]["images_per_second"]
        lines.append(
            f"| {name} | {' | '.join(cells)} | {ours / sides['keras_hub']['images_per_second']:.2f}x "
            f"| {ours / sides['timm']['images_per_second']:.2f}x |"
        )
    return lines


def _pipeline_table(results):
    lines = [
        "## Input pipeline against the training step (images/s)",
        "",
        "| data | pipeline | keras_vit training step | pipeline / step |",
        "|---|---|---|---|",
    ]
    for row in results["pipeline"]:
        lines.append(
            f"| {row['dataset']} | {row['pipeline']:.0f} | {row['step']:.1f} | {row['ratio']:.1f}x |"
        )
    return lines


def _scaling_table(results):
    lines = [
        "## Cost against the token count (config A's architecture, batch 16, one process per size)",
        "",
        "| image | tokens | ms per image | time per token vs 64 tokens | attention's FLOP share "
        "| peak memory (MB) | growth from the first step on (MB) |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in results["scaling"]:
        lines.append(
            f"| {row['image_size']} | {row['tokens']} | {row['ms_per_image']:.1f} | "
            f"{row['time_per_token_vs_smallest']:.2f}x | {row['attention_flop_share']:.0%} | "
            f"{row['peak_rss_mb']:.0f} | {row['peak_rss_over_model_mb']:.0f} |"
        )
    return lines


def _inference_table(name, runtimes):
    lines = [
        f"## Inference, {name} (2 threads)",
        "",
        "| runtime | batch 1 (ms) | batch 32 (images/s) |",
        "|---|---|---|",
    ]
    for runtime, value in runtimes.items():
        throughput = value.get("batch32_images_per_second")
        throughput = "" if throughput is None else f"{throughput:.1f}"
        lines.append(f"| {runtime} | {value['batch1_ms']:.1f} | {throughput} |")
    return lines


def _plot_training(results, path):
    from keras_vit.files import pyplot, save_figure

    figure, axis = pyplot().subplots(figsize=(6, 3.5))
    names = list(results["training"])
    width = 0.25
    for offset, side in enumerate(("keras_vit", "keras_hub", "timm")):
        values = [results["training"][n][side]["images_per_second"] for n in names]
        axis.bar(np.arange(len(names)) + (offset - 1) * width, values, width, label=side)
    axis.set_xticks(np.arange(len(names)), [f"config {n}" for n in names])
    axis.set_ylabel("training images/s")
    axis.legend()
    axis.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    save_figure(figure, path)


def _plot_scaling(results, path):
    from keras_vit.files import pyplot, save_figure

    figure, (time_axis, memory_axis) = pyplot().subplots(1, 2, figsize=(9, 3.5))
    tokens = [row["tokens"] for row in results["scaling"]]
    time_axis.plot(tokens, [row["ms_per_image"] for row in results["scaling"]], "o-", label="measured")
    base = results["scaling"][0]
    flops = [row["training_flops_per_image"] / base["training_flops_per_image"] for row in results["scaling"]]
    time_axis.plot(tokens, [base["ms_per_image"] * f for f in flops], "--", label="FLOPs (scaled)")
    time_axis.set_xscale("log", base=2)
    time_axis.set_yscale("log")
    time_axis.set_xlabel("tokens")
    time_axis.set_ylabel("training ms per image")
    time_axis.legend()
    memory_axis.plot(tokens, [row["peak_rss_mb"] for row in results["scaling"]], "o-")
    memory_axis.set_xscale("log", base=2)
    memory_axis.set_xlabel("tokens")
    memory_axis.set_ylabel("peak memory (MB)")
    for axis in (time_axis, memory_axis):
        axis.grid(alpha=0.3)
    figure.tight_layout()
    save_figure(figure, path)


def _print(**values):
    print(json.dumps(values, default=lambda v: round(v, 2)), flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="fewer configs, runtimes and rounds (under 5 minutes)"
    )
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args(argv)
    rounds = args.rounds or (3 if args.quick else 5)
    torch.set_num_threads(THREADS)

    peak = matmul_peak()
    best_peak = max(peak.values())
    _print(matmul_peak_gflops=peak)
    training_results = {}
    for name in ["A"] if args.quick else ["A", "B"]:
        steps = 2 if name == "A" else 1
        training_results[name] = training(CONFIGS[name], rounds, steps, best_peak)
        _print(training=name, **{k: v["images_per_second"] for k, v in training_results[name].items()})

    pipeline = [
        {"dataset": "CIFAR-10 32x32 (cifar10-mini)", "pipeline": cifar10(seconds=5 if args.quick else 10)}
    ]
    pipeline[0]["step"] = training_results["A"]["keras_vit"]["images_per_second"]
    if "B" in training_results:
        rate, source = images_224()
        step = training_results["B"]["keras_vit"]["images_per_second"]
        pipeline.append({"dataset": f"224x224 JPEGs ({source})", "pipeline": rate, "step": step})
    for row in pipeline:
        row["ratio"] = row["pipeline"] / row["step"]
        _print(**row)

    scaling = token_scaling([32, 64, 128] if args.quick else [32, 48, 64, 96, 128])
    _print(scaling={row["tokens"]: row["ms_per_image"] for row in scaling})

    inference_results = {}
    # Swin-T beside ViT-S/16: about the same FLOPs (4.5 and 4.6 GMACs).
    models = (
        ["vit_tiny_patch16_224"] if args.quick else ["vit_tiny_patch16_224", "vit_small_patch16_224", SWIN]
    )
    for model_name in models:
        inference_results[model_name] = inference(
            model_name,
            QUICK_RUNTIMES if args.quick else ALL_RUNTIMES,
            rounds,
            batch_sizes=(1,) if args.quick else (1, 32),
        )
        _print(
            inference=model_name,
            batch1_ms={k: v["batch1_ms"] for k, v in inference_results[model_name].items()},
        )
    if not args.quick:  # the modern backbones beside ViT-S/16: fp32 against the peers only
        for model_name in BACKBONES:
            if model_name not in inference_results:
                inference_results[model_name] = inference(model_name, BACKBONE_RUNTIMES, rounds)
                _print(
                    inference=model_name,
                    batch1_ms={k: v["batch1_ms"] for k, v in inference_results[model_name].items()},
                )

    results = {
        "quick": args.quick,
        "rounds": rounds,
        "machine": f"{os.cpu_count()} CPU cores, TensorFlow {tf.__version__}, PyTorch {torch.__version__}",
        "date": time.strftime("%Y-%m-%d"),
        "peak": peak,
        "training": training_results,
        "pipeline": pipeline,
        "scaling": scaling,
        "inference": inference_results,
    }
    write_report(results)
    ti = inference_results["vit_tiny_patch16_224"]
    summary = {}
    for name, sides in training_results.items():
        ours = sides["keras_vit"]["images_per_second"]
        suffix = "" if name == "A" else f"_{name}"
        summary[f"speedup_train_vs_keras_hub{suffix}"] = ours / sides["keras_hub"]["images_per_second"]
        summary[f"speedup_train_vs_timm{suffix}"] = ours / sides["timm"]["images_per_second"]
        summary[f"train_mfu{suffix}"] = sides["keras_vit"]["mfu"]
    summary["speedup_tflite_fp32_vs_onnxruntime"] = (
        ti["onnxruntime_timm"]["batch1_ms"] / ti["tflite_fp32"]["batch1_ms"]
    )
    summary["speedup_int8_vs_fp32"] = ti["tflite_fp32"]["batch1_ms"] / ti["tflite_dynamic"]["batch1_ms"]
    if "tflite_int8" in ti:
        summary["speedup_full_int8_vs_fp32"] = ti["tflite_fp32"]["batch1_ms"] / ti["tflite_int8"]["batch1_ms"]
    summary["speedup_keras_xla_vs_predict_on_batch"] = (
        ti["keras_predict_on_batch"]["batch1_ms"] / ti["keras_xla"]["batch1_ms"]
    )
    for row in pipeline:
        summary["pipeline_vs_train_" + ("cifar10" if row is pipeline[0] else "224")] = row["ratio"]
    summary["matmul_peak_gflops"] = best_peak
    print(json.dumps({k: round(v, 3) for k, v in summary.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
