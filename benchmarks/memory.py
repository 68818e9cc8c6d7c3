"""What one training step of a big ViT needs per device, from XLA, without running it.

For each model and case, a fresh JAX process builds the run `keras-vit train` would build (the
`finetune` preset: AdamW, augmentation inside the step), compiles one training step with
`jax.jit(...).lower(...).compile()` and reads `compiled.memory_analysis()`: the arguments
(weights, optimizer moments, the batch), the outputs (the updated state, which XLA writes over
the donated arguments: `alias`), and the temporaries (activations kept for the backward pass,
gradients, scratch). The total is arguments + outputs - aliased + temporaries.

    python benchmarks/memory.py                         # ViT-B/16 and ViT-L/16, every case
    python benchmarks/memory.py --models vit_base_patch16_224 --cases plain remat

The figures are XLA's for the CPU backend. The arguments are the same on any device; the
temporaries depend on the backend's fusion and scheduling, so a GPU's differ (each case is
compared with the plain one on the same backend). Writes docs/benchmarks/memory.{md,json}.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import time

MODELS = ("vit_base_patch16_224", "vit_large_patch16_224")
# Each case: `keras-vit train` settings. model-parallel shards over 4 host devices (`model` axis
# of 4, so each device sees the whole batch).
CASES = {
    "plain": {},
    "remat": {"remat": True},
    "lora8": {"lora_rank": 8},
    "model-parallel-4": {"strategy": "model-parallel", "model_parallel": 4},
    "remat+lora8": {"remat": True, "lora_rank": 8},
}
HOST_DEVICES = 4
# XLA's CPU backend orders its ops for concurrency by default, without regard to memory; its
# memory-minimising order is what the GPU and TPU backends' schedulers aim at (a small ViT's
# step: 149 MB of temporaries by default, 125 MB so; with --remat 42 and 37 MB).
MEMORY_AWARE_SCHEDULER = "--xla_cpu_enable_concurrency_optimized_scheduler=false"
GIB = 1024**3


def measure(model, case, batch_size, **settings):
    """In a fresh process (XLA_FLAGS set before JAX is imported): XLA's memory figures (bytes)
    for one training step on one device. `settings`: more `keras-vit train` settings."""
    import jax
    import numpy as np

    from keras_vit.model import registry
    from keras_vit.training import distribute
    from keras_vit.training.config import TrainConfig
    from keras_vit.training.train import build_model, compile_training_model

    settings = dict(model=model, preset="finetune", batch_size=batch_size, **CASES[case], **settings)
    config = TrainConfig(**settings).resolved()
    where = distribute.placement(config.strategy, registry.family_named(model), config.model_parallel)
    with where.scope():
        classifier = build_model(config, 1000, [str(i) for i in range(1000)])
        trainer = compile_training_model(config, classifier, 1000, 100, 1)
    everything = dict(trainable_variables=True, non_trainable_variables=True)
    state = trainer._get_jax_state(**everything, optimizer_variables=True, metrics_variables=True)
    batch = {
        "images": np.zeros((batch_size, config.image_size, config.image_size, 3), np.uint8),
        "labels": np.zeros((batch_size,), np.int32),
    }
    if where.distribution is not None:  # the batch split as fit splits it; the state is placed already
        layouts = {k: where.distribution.get_data_layout(v.shape).backend_layout for k, v in batch.items()}
        batch = {k: jax.device_put(v, layouts[k]) for k, v in batch.items()}
    step = jax.jit(trainer.train_step, donate_argnums=0)
    started = time.perf_counter()
    compiled = step.lower(state, (batch,)).compile()
    analysis = compiled.memory_analysis()
    figures = {
        "arguments": analysis.argument_size_in_bytes,
        "outputs": analysis.output_size_in_bytes,
        "aliased": analysis.alias_size_in_bytes,
        "temporaries": analysis.temp_size_in_bytes,
    }
    figures["total"] = figures["arguments"] + figures["outputs"] - figures["aliased"] + figures["temporaries"]
    figures["flops"] = _flops(compiled)
    trainable = sum(int(np.prod(v.shape)) for v in classifier.trainable_weights)
    return {
        "model": model,
        "case": case,
        "batch_per_device": batch_size,
        "devices": len(jax.devices()),
        "parameters": classifier.count_params(),
        "trainable": trainable,
        "compile_seconds": time.perf_counter() - started,
        **figures,
    }


def _flops(compiled):
    """XLA's count of the step's floating-point operations (its cost analysis), or None."""
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list | tuple) else cost
    return float(cost["flops"]) if cost and "flops" in cost else None


def _run_case(model, case, batch_size):
    env = dict(os.environ, KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="3", JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = MEMORY_AWARE_SCHEDULER
    if CASES[case].get("strategy") == "model-parallel":
        env["XLA_FLAGS"] += f" --xla_force_host_platform_device_count={HOST_DEVICES}"
    command = [sys.executable, __file__, "--one", model, case, "--batch-size", str(batch_size)]
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(f"{model} {case} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def _tflop(row):
    return f"{row['flops'] / 1e12:.2f}" if row.get("flops") else ""


# Accelerator memory sizes the README reads the table against (GiB).
BUDGETS = (24, 80)


def _table(rows):
    fits = " | ".join(f"fits {b} GiB" for b in BUDGETS)
    lines = [
        "| model | case | trainable params | arguments (GiB) | temporaries (GiB) | outputs - aliased (GiB) "
        f"| total (GiB) | vs plain | step TFLOP | {fits} |",
        "|---|---|---|---|---|---|---|---|---|" + "---|" * len(BUDGETS),
    ]
    plain = {r["model"]: r["total"] for r in rows if r["case"] == "plain"}
    for r in rows:
        ratio = f"{r['total'] / plain[r['model']]:.2f}x" if r["model"] in plain else ""
        lines.append(
            f"| {r['model']} | {r['case']} | {r['trainable']:,} | {r['arguments'] / GIB:.2f} | "
            f"{r['temporaries'] / GIB:.2f} | {(r['outputs'] - r['aliased']) / GIB:.2f} | "
            f"{r['total'] / GIB:.2f} | {ratio} | {_tflop(r)} | "
            + " | ".join("yes" if r["total"] / GIB <= b else "no" for b in BUDGETS)
            + " |"
        )
    return "\n".join(lines)


def _reading(rows):
    """What the table says, from its figures."""
    by = {(r["model"], r["case"]): r["total"] / GIB for r in rows}
    lines = []
    for model in dict.fromkeys(r["model"] for r in rows):
        plain = by.get((model, "plain"))
        for case in ("remat", "lora8", "model-parallel-4", "remat+lora8"):
            if plain and (model, case) in by:
                lines.append(
                    f"- {model}, {case}: {by[(model, case)]:.2f} GiB per device, "
                    f"{by[(model, case)] / plain:.2f}x plain."
                )
    flops = {(r["model"], r["case"]): r.get("flops") for r in rows}
    pairs = [m for m in dict.fromkeys(r["model"] for r in rows) if (m, "remat") in by and (m, "plain") in by]
    remat = [by[(m, "remat")] / by[(m, "plain")] for m in pairs]
    counted = [m for m in pairs if flops[(m, "remat")] and flops[(m, "plain")]]
    cost = [flops[(m, "remat")] / flops[(m, "plain")] for m in counted]
    if remat:
        lines.append(
            f"- `--remat` keeps only each block's input for the backward pass and recomputes the rest "
            f"({min(remat):.2f}-{max(remat):.2f}x plain's memory here"
            + (f", for {max(cost):.2f}x its FLOPs" if cost else "")
            + "). `keras.remat` alone saved nothing in "
            "these figures: with global-norm clipping (the default) XLA's CPU scheduler deferred every "
            "weight gradient and kept every recomputed activation alive; keras-vit fixes the order "
            "(`keras_vit/model/remat.py`)."
        )
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--batch-size", type=int, default=32, help="per device")
    docs = os.path.join(os.path.dirname(__file__), "..", "docs", "benchmarks")
    parser.add_argument("--output", default=docs)
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "CASE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(*args.one, args.batch_size)))
        return
    rows = []
    for model in args.models:
        for case in args.cases:
            rows.append(_run_case(model, case, args.batch_size))
            print(json.dumps(rows[-1]), flush=True)
    command = "python benchmarks/memory.py " + " ".join(sys.argv[1:])
    report = {"command": command.strip(), "machine": platform.processor() or platform.machine(), "rows": rows}
    with open(os.path.join(args.output, "memory.json"), "w") as f:
        json.dump(report, f, indent=2)
    with open(os.path.join(args.output, "memory.md"), "w") as f:
        f.write(_markdown(report))


def _markdown(report):
    return f"""# Memory of one training step, from XLA

Made by `{report["command"]}` (`benchmarks/memory.py`; its docstring says how): one training step
of each model at 224 px, batch {report["rows"][0]["batch_per_device"]} per device, the `finetune`
preset (AdamW, augmentation inside the step), compiled on JAX without running, with XLA's
`compiled.memory_analysis()` per device, and the step's FLOPs from its `cost_analysis()`
(what recomputing costs). "model-parallel-4" shards the kernels over 4 host
devices (`--strategy model-parallel --model-parallel 4`: each device holds a quarter of them
and of their moments, and sees the whole batch).

These are XLA's figures for the **CPU backend**, compiled with its memory-minimising op order
(`{MEMORY_AWARE_SCHEDULER}`; its default order is tuned for concurrency). The arguments
(weights, optimizer moments, the batch) are the same on any device; the temporaries
(activations kept for the backward pass, gradients, scratch) depend on the backend's fusion and
scheduling, so a GPU's differ. Compare each case with the plain one.

{_table(report["rows"])}

{_reading(report["rows"])}
"""


if __name__ == "__main__":
    main()
