"""Batch-1 latency of several `.tflite` files under LiteRT, measured in one run, alternating.

On a shared machine the load changes from minute to minute, so variants timed one after the
other (as `keras-vit verify` does) can differ by more than they really do. Here every round
invokes each model `--runs` times in turn, over `--rounds` rounds, and the table gives each
model's median over all its invocations and its ratio to the first model. The interpreters
are the ones `keras-vit verify` times (LiteRT's default settings, XNNPACK on); inputs are zeros
of each model's input type (the time of these models does not depend on the pixels). The CPU's
model name and its int8 dot-product flags come first, for the record.

    python benchmarks/tflite_latency.py model_fp32.tflite model_int8_strict.tflite [--rounds 5 --runs 20]
"""

import argparse
import os
import platform
import subprocess
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

from keras_vit.inference.runtimes import xnnpack_delegation  # noqa: E402


def cpu():
    """`lscpu`'s model name and the AVX-512 / VNNI / BF16 flags it lists (empty off Linux)."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor(), []
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    flags = fields.get("Flags", "").split()
    wanted = [f for f in flags if f.startswith(("avx512_vnni", "avx_vnni", "avx512_bf16", "amx"))]
    return fields.get("Model name", "").strip(), wanted


def interpreter(path, threads=None):
    from ai_edge_litert.interpreter import Interpreter

    model = Interpreter(model_path=path, num_threads=threads)
    model.allocate_tensors()
    for given in model.get_input_details():
        model.set_tensor(given["index"], np.zeros(given["shape"], given["dtype"]))
    model.invoke()  # warm-up: XNNPACK builds its graph on the first run
    return model


def alternate(paths, rounds=5, runs=20, threads=None):
    """`{path: [ms of each invocation]}`, the models taking turns every `runs` invocations."""
    models = {path: interpreter(path, threads) for path in paths}
    times = {path: [] for path in paths}
    for _ in range(rounds):
        for path, model in models.items():
            for _ in range(runs):
                start = time.perf_counter()
                model.invoke()
                times[path].append(1000 * (time.perf_counter() - start))
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help=".tflite files; the first is the reference")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of turns")
    parser.add_argument("--runs", type=int, default=20, help="invocations of each model per turn")
    parser.add_argument("--threads", type=int, default=None, help="LiteRT's num_threads (default: its own)")
    args = parser.parse_args()
    name, flags = cpu()
    print(f"CPU: {name}; flags: {' '.join(flags) or 'no int8 dot-product flags'}\n")
    print("| model | ops XNNPACK took | ops outside it | XNNPACK partitions |")
    print("|---|---|---|---|")
    for path in args.models:
        counts = xnnpack_delegation(interpreter(path, args.threads))
        print(f"| {os.path.basename(path)} | {' | '.join(map(str, counts))} |")
    print()
    times = alternate(args.models, args.rounds, args.runs, args.threads)
    first = float(np.median(times[args.models[0]]))
    print("| model | batch-1 ms (median) | x first |")
    print("|---|---|---|")
    for path, values in times.items():
        median = float(np.median(values))
        print(f"| {os.path.basename(path)} | {median:.2f} | {median / first:.2f} |")


if __name__ == "__main__":
    main()
