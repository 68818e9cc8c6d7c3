"""The modern backbones' batch-1 latency beside ViT-S/16, in one run: TFLite fp32 (LiteRT,
2 threads) against ONNX Runtime on timm's same model and timm in PyTorch.

    python benchmarks/backbones.py            # about 6 minutes on 2 cores
    python benchmarks/backbones.py --rounds 1 --models vit_small_patch16_224

Every model at 224 (DINOv2's default is 518, DINOv3's 256), random weights (speed does not
depend on them). Writes docs/benchmarks/backbones.json and backbones.md, and prints the
ratios, then the products-alone ratios, as its last lines. The goal is the ViT's: TFLite fp32 at
most 0.85x ONNX Runtime. Beside it, in the same rounds, each model's matrix products alone
(`matmul_floor.py`): the ratio no TFLite graph computing those products can beat on this CPU.
`run.py` (the full run) measures the same rows.
"""

import argparse
import json
import os
import sys
import time

# PyTorch before TensorFlow (inference.py imports them in that order).
from inference import THREADS, inference  # isort: skip
import torch  # isort: skip

HERE = os.path.dirname(os.path.abspath(__file__))
OUTPUT = os.path.join(HERE, os.pardir, "docs", "benchmarks")
BACKBONES = {
    "vit_small_patch16_224": "ViT-S/16",
    "vit_small_patch14_dinov2": "DINOv2-S/14",
    "vit_base_patch16_siglip_224": "SigLIP-B/16",
    "vit_small_patch16_dinov3": "DINOv3-S/16",
}
MODEL_RUNTIMES = ("tflite_fp32", "onnxruntime_timm", "torch_timm")  # the page's first table
RUNTIMES = (*MODEL_RUNTIMES, "tflite_matmuls_only")
GOAL = 0.85  # TFLite fp32's batch-1 latency over ONNX Runtime's, at most


def measure(models, rounds):
    """`{name: {runtime: {"batch1_ms": ...}}}`, sides alternating within each model; the
    products-alone entry also carries their GFLOP (batch 1: the products the export computes)."""
    return {name: inference(name, RUNTIMES, rounds) for name in models}


def backbone_goals(results):
    """(goal, measured, met) rows: TFLite fp32 against ONNX Runtime, per backbone."""
    rows = []
    for name, runtimes in results.items():
        ratio = runtimes["tflite_fp32"]["batch1_ms"] / runtimes["onnxruntime_timm"]["batch1_ms"]
        label = BACKBONES.get(name, name)
        rows.append((f"{label}: TFLite fp32 batch 1 <= {GOAL}x ONNX Runtime", f"{ratio:.2f}x", ratio <= GOAL))
    return rows


def floor_ratios(results):
    """`{label: ratio}`: the model's matrix products alone in TFLite (every other op free) over
    ONNX Runtime's whole model, where the run measured them: no TFLite graph that computes
    every one of them runs faster on XNNPACK's fp32 kernels."""
    return {
        BACKBONES.get(name, name): runtimes["tflite_matmuls_only"]["batch1_ms"]
        / runtimes["onnxruntime_timm"]["batch1_ms"]
        for name, runtimes in results.items()
        if "tflite_matmuls_only" in runtimes
    }


def _per_round(runtimes, runtime):
    """`runtime`'s time over ONNX Runtime's, round by round (each pair timed back to back), in
    the order measured: how far this CPU's speed moved the ratio within the run."""
    ours, theirs = (
        runtimes[runtime].get("batch1_ms_rounds"),
        runtimes["onnxruntime_timm"].get("batch1_ms_rounds"),
    )
    if not ours or not theirs:
        return ""
    return ", ".join(f"{a / b:.2f}" for a, b in zip(ours, theirs, strict=True))


def report(results, rounds, machine):
    """The markdown page: one row per backbone, the goals below, then what the goals need."""
    lines = [
        "# Backbones: batch-1 latency at 224",
        "",
        f"`python benchmarks/backbones.py` on {machine}, {time.strftime('%Y-%m-%d')}; "
        f"{THREADS} threads, medians over {rounds} alternating rounds, random weights.",
        "",
        "| model | timm name | TFLite fp32 (ms) | ONNX Runtime, timm (ms) | PyTorch, timm (ms) "
        "| TFLite / ORT | TFLite / ORT, each round |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, runtimes in results.items():
        ms = [runtimes[r]["batch1_ms"] for r in MODEL_RUNTIMES]
        lines.append(
            f"| {BACKBONES.get(name, name)} | `{name}` | {ms[0]:.1f} | {ms[1]:.1f} | {ms[2]:.1f} | "
            f"{ms[0] / ms[1]:.2f}x | {_per_round(runtimes, 'tflite_fp32')} |"
        )
    lines += ["", "| goal | measured | met |", "|---|---|---|"]
    lines += [
        f"| {goal} | {value} | {'yes' if met else 'no'} |" for goal, value, met in backbone_goals(results)
    ]
    floors = floor_ratios(results)
    if floors:
        lines += [
            "",
            "What the goal needs: each model's matrix products alone (timm's model's every `Linear`, "
            "its patch embedding and its attention's two batched products, at their real shapes, "
            "the last block's on the [cls] token alone where the export's are, "
            "`benchmarks/matmul_floor.py`), as one LiteRT file in the same run: TFLite's time if "
            "every other op were free.",
            "",
            "| model | GFLOP | TFLite, products alone (ms) | GFLOP/s | products alone / ORT | "
            "each round | the goal is reachable |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, runtimes in results.items():
            if "tflite_matmuls_only" not in runtimes:
                continue
            label = BACKBONES.get(name, name)
            alone = runtimes["tflite_matmuls_only"]
            gflop = alone.get("gflop")
            rate, gflop = (f"{gflop / alone['batch1_ms'] * 1000:.0f}", f"{gflop:.2f}") if gflop else ("", "")
            lines.append(
                f"| {label} | {gflop} | {alone['batch1_ms']:.1f} | {rate} | "
                f"{floors[label]:.2f}x | {_per_round(runtimes, 'tflite_matmuls_only')} | "
                f"{'yes' if floors[label] <= GOAL else 'no'} |"
            )
    return "\n".join(lines) + "\n"


def _machine():
    model = "unknown CPU"
    if os.path.exists("/proc/cpuinfo"):
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{model}, {os.cpu_count()} cores, PyTorch {torch.__version__}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(BACKBONES), help="comma-separated timm names")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(THREADS)
    results = measure(args.models.split(","), args.rounds)
    from keras_vit.files import write_json, write_text

    machine = _machine()
    os.makedirs(OUTPUT, exist_ok=True)
    write_json(os.path.join(OUTPUT, "backbones.json"), {"machine": machine, "rounds": args.rounds, **results})
    text = report(results, args.rounds, machine)
    write_text(os.path.join(OUTPUT, "backbones.md"), text)
    ratios = {
        BACKBONES.get(name, name): runtimes["tflite_fp32"]["batch1_ms"]
        / runtimes["onnxruntime_timm"]["batch1_ms"]
        for name, runtimes in results.items()
    }
    print(json.dumps({label: round(ratio, 3) for label, ratio in ratios.items()}))
    print(json.dumps({f"{label}, products alone": round(r, 3) for label, r in floor_ratios(results).items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
