"""The quickstart's settings, compared: one table row per `keras-vit train` run folder.

    python benchmarks/quickstart_runs.py RUN [RUN ...] > table.md

Each RUN is a folder `keras-vit train` wrote (then `keras-vit evaluate RUN --split test`, for
the test column). A row gives the run's image size, batch, peak learning rate, epochs run,
minutes of training (its epochs' wall time, validation included), the fastest epoch's images/s,
the best validation accuracy, the test top-1, and the rest of the recipe (warmup epochs, layer
decay, smallest crop, stochastic depth, frozen blocks, XLA). The CPU is `lscpu`'s model name and the flags
that decide a speed here (AVX-512, VNNI, AMX); the load average says how busy the machine was
when the table was made (the runs themselves record none).
"""

import json
import os
import sys


def cpu():
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                info.setdefault(key.strip(), value.strip())
    except OSError:
        return "unknown CPU"
    flags = set(info.get("flags", "").split())
    named = [f for f in ("avx512f", "avx512_vnni", "avx512_bf16", "amx_int8", "amx_bf16") if f in flags]
    return f"{info.get('model name', 'unknown')}, {os.cpu_count()} cores ({', '.join(named) or 'AVX2 only'})"


def recipe(config):
    """The settings the quickstart's runs varied beyond the table's own columns."""
    parts = [
        f"warmup {config['warmup_epochs']:g}",
        f"layer decay {config['layer_decay']:g}",
        f"crop {config['crop_min_scale']:g}",
        f"drop path {config['drop_path_rate']:g}",
    ]
    if config.get("freeze_blocks"):
        parts.append(f"{config['freeze_blocks']} blocks frozen")
    parts.append("XLA" if config["jit_compile"] else "no XLA")
    return ", ".join(parts)


def row(folder):
    with open(os.path.join(folder, "history.json")) as f:
        run = json.load(f)
    config, history = run["config"], run["history"]
    test = None
    if os.path.exists(os.path.join(folder, "evaluation.json")):
        with open(os.path.join(folder, "evaluation.json")) as f:
            test = json.load(f)["top1"]
    minutes = sum(history["epoch_seconds"]) / 60
    return (
        f"| {os.path.basename(os.path.normpath(folder))} | {config['image_size']} | {config['batch_size']} | "
        f"{config['learning_rate']:g} | {len(history['loss'])} | {minutes:.1f} | "
        f"{max(history['images_per_second']):.1f} | {run['best_val_accuracy']:.2%} | "
        + (f"{test:.2%}" if test is not None else "-")
        + f" | {recipe(config)} |"
    )


def main(folders):
    print(f"CPU: {cpu()}; load average when tabulated: {os.getloadavg()[0]:.1f}.")
    print()
    print(
        "| run | image size | batch | peak lr | epochs run | training minutes | best img/s | best val "
        "| test top-1 | recipe |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for folder in folders:
        print(row(folder))


if __name__ == "__main__":
    main(sys.argv[1:])
