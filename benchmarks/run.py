"""keras-vit against its peers, measured side by side in one run on this machine.

    python benchmarks/run.py --quick      # about 5 minutes on 2 cores: config A, ViT-Ti/16 inference
    python benchmarks/run.py              # also config B (ViT-Ti/16 at 224) training

Measures the machine's fp32 matmul peak (2048 x 2048, TensorFlow and PyTorch), then
- training images/s and MFU for one architecture in three implementations: keras_vit,
  keras-hub's `ViTBackbone` + a Dense head (with XLA, its faster mode) and timm (PyTorch);
  config A: 32 x 32, patch 4, width 192, depth 6, 3 heads, MLP 768, batch 128, AdamW;
  config B: ViT-Ti/16 at 224, batch 32;
- batch-1 inference latency of ViT-Ti/16 at 224: the Keras model (`predict_on_batch`),
  TFLite fp32 and dynamic-range int8 under LiteRT (2 threads), timm through ONNX Runtime
  (2 threads) and in PyTorch.
The sides alternate within each round (the machine is noisy: one config differs by up to 20%
between runs), and every figure is the median over rounds. Writes docs/benchmarks/
results.json, results.md and training.png, and prints a JSON summary as its last line:
speed-ups are keras_vit's speed over the peer's (above 1: keras_vit is faster).
Needs the bench extra: pip install -e ".[bench]".
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

# PyTorch before TensorFlow: the other order crashes torchvision's import (timm needs it).
import timm  # noqa: F401
import torch

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_vit  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUTPUT = os.path.join(HERE, os.pardir, "docs", "benchmarks")
CONFIGS = {
    "A": dict(image_size=32, patch_size=4, hidden_dim=192, depth=6, num_heads=3, mlp_dim=768, batch=128),
    "B": dict(image_size=224, patch_size=16, hidden_dim=192, depth=12, num_heads=3, mlp_dim=768, batch=32),
}
NUM_CLASSES = 10
THREADS = 2


def median_seconds(function, repeats, warmup=1):
    for _ in range(warmup):
        function()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


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


# ---- inference --------------------------------------------------------------------------


def inference(rounds):
    """Batch-1 latency (ms) of ViT-Ti/16 at 224 in each runtime, alternating, medians."""
    import onnxruntime
    from ai_edge_litert.interpreter import Interpreter

    from keras_vit.export import tflite
    from keras_vit.export.classifier import load_classifier

    model = keras_vit.create_model("vit_tiny_patch16_224", num_classes=1000)
    classifier = load_classifier(model)
    image = np.random.default_rng(0).uniform(0, 255, (1, 224, 224, 3)).astype("float32")

    def litert(flatbuffer):
        interpreter = Interpreter(model_content=flatbuffer, num_threads=THREADS)
        interpreter.allocate_tensors()
        index = interpreter.get_input_details()[0]["index"]

        def run():
            interpreter.set_tensor(index, image)
            interpreter.invoke()

        return run

    peer = _timm(
        dict(image_size=224, patch_size=16, hidden_dim=192, depth=12, num_heads=3, mlp_dim=768)
    ).eval()
    peer_image = torch.from_numpy(image.transpose(0, 3, 1, 2) / 255.0).float()
    with tempfile.TemporaryDirectory() as folder:
        onnx_path = os.path.join(folder, "timm.onnx")
        torch.onnx.export(peer, (peer_image,), onnx_path, dynamo=False, input_names=["x"])
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = THREADS
        session = onnxruntime.InferenceSession(onnx_path, options, providers=["CPUExecutionProvider"])
    feed = {"x": peer_image.numpy()}

    def timm_torch():
        with torch.inference_mode():
            peer(peer_image)

    sides = {
        "keras_predict_on_batch": lambda: model.predict_on_batch(image),
        "tflite_fp32": litert(tflite.convert(classifier, "fp32")),
        "tflite_dynamic": litert(tflite.convert(classifier, "dynamic")),
        "onnxruntime_timm": lambda: session.run(None, feed),
        "torch_timm": timm_torch,
    }
    for run in sides.values():
        run()
        run()
    milliseconds = {name: [] for name in sides}
    for _ in range(rounds):
        for name, run in sides.items():
            milliseconds[name].append(1000 * median_seconds(run, repeats=10, warmup=0))
    return {
        name: {"ms": statistics.median(times), "rounds_ms": times} for name, times in milliseconds.items()
    }


# ---- report -----------------------------------------------------------------------------


def write_report(results):
    from keras_vit.files import atomic_write, pyplot, save_figure, write_json

    os.makedirs(OUTPUT, exist_ok=True)
    write_json(os.path.join(OUTPUT, "results.json"), results)
    lines = [
        "# Benchmarks",
        "",
        f"`python benchmarks/run.py{' --quick' if results['quick'] else ''}` on {results['machine']}, "
        f"{results['date']}. Medians over {results['rounds']} alternating rounds.",
        "",
        f"fp32 matmul peak (2048 x 2048): TensorFlow {results['peak']['tensorflow']:.0f} GFLOP/s, "
        f"with XLA {results['peak']['tensorflow_xla']:.0f}, PyTorch {results['peak']['torch']:.0f}; "
        "MFU is relative to the largest.",
        "",
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
    lines += [
        "",
        "## Inference, ViT-Ti/16 at 224, batch 1 (ms, 2 threads)",
        "",
        "| runtime | ms |",
        "|---|---|",
    ]
    for name, value in results["inference"].items():
        lines.append(f"| {name} | {value['ms']:.1f} |")
    atomic_write(os.path.join(OUTPUT, "results.md"), lambda p: open(p, "w").write("\n".join(lines) + "\n"))

    plt = pyplot()
    figure, axis = plt.subplots(figsize=(6, 3.5))
    names = list(results["training"])
    width = 0.25
    for offset, side in enumerate(("keras_vit", "keras_hub", "timm")):
        values = [results["training"][n][side]["images_per_second"] for n in names]
        axis.bar(np.arange(len(names)) + (offset - 1) * width, values, width, label=side)
    axis.set_xticks(np.arange(len(names)), [f"config {n}" for n in names])
    axis.set_ylabel("training images/s")
    axis.legend()
    axis.grid(axis="y", alpha=0.3)
    save_figure(figure, os.path.join(OUTPUT, "training.png"))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="config A only, fewer rounds (about 5 minutes)")
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args(argv)
    rounds = args.rounds or (3 if args.quick else 5)
    torch.set_num_threads(THREADS)

    peak = matmul_peak()
    best_peak = max(peak.values())
    configs = ["A"] if args.quick else ["A", "B"]
    training_results = {}
    for name in configs:
        steps = 2 if name == "A" else 1
        training_results[name] = training(CONFIGS[name], rounds, steps, best_peak)
        print(
            json.dumps(
                {
                    "training": name,
                    **{k: round(v["images_per_second"], 1) for k, v in training_results[name].items()},
                }
            ),
            flush=True,
        )
    inference_results = inference(rounds)
    print(
        json.dumps({"inference_ms": {k: round(v["ms"], 2) for k, v in inference_results.items()}}), flush=True
    )

    results = {
        "quick": args.quick,
        "rounds": rounds,
        "machine": f"{os.cpu_count()} CPU cores, TensorFlow {tf.__version__}, PyTorch {torch.__version__}",
        "date": time.strftime("%Y-%m-%d"),
        "peak": peak,
        "training": training_results,
        "inference": inference_results,
    }
    write_report(results)
    a = training_results["A"]
    ours = a["keras_vit"]["images_per_second"]
    summary = {
        "speedup_train_vs_keras_hub": ours / a["keras_hub"]["images_per_second"],
        "speedup_train_vs_timm": ours / a["timm"]["images_per_second"],
        "speedup_tflite_fp32_vs_onnxruntime": inference_results["onnxruntime_timm"]["ms"]
        / inference_results["tflite_fp32"]["ms"],
        "speedup_int8_vs_fp32": inference_results["tflite_fp32"]["ms"]
        / inference_results["tflite_dynamic"]["ms"],
        "train_mfu": a["keras_vit"]["mfu"],
        "matmul_peak_gflops": best_peak,
    }
    print(json.dumps({k: round(v, 3) for k, v in summary.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
