"""The benchmark harness's own logic, at tiny sizes: no timing is asserted."""

import os
import sys

import pytest
from conftest import HANG_SECONDS, correlated_layer

BENCHMARKS = os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks")
sys.path.insert(0, BENCHMARKS)

pytest.importorskip("timm")
import input_pipeline  # noqa: E402
import run  # noqa: E402
import token_scaling  # noqa: E402

from keras_vit.inference.runtimes import xnnpack_delegation  # noqa: E402

TINY_ARCHITECTURE = dict(patch_size=4, hidden_dim=32, depth=2, num_heads=4, mlp_dim=64)


def test_token_scaling_measures_a_size_in_its_own_process():
    (row,) = token_scaling.token_scaling([48], batch_size=2, steps=1, architecture=TINY_ARCHITECTURE)
    assert row["tokens"] == 144 and row["time_per_token_vs_smallest"] == 1.0
    assert row["step_seconds"] > 0 and row["ms_per_image"] == pytest.approx(500 * row["step_seconds"])
    # A fresh process: its own peak (VmHWM), not the test runner's, and growth within it.
    assert 0 < row["peak_rss_over_model_mb"] < row["peak_rss_mb"]
    assert row["attention_flop_share"] == pytest.approx(145 / (6 * 32 + 145))
    assert row["training_flops_per_image"] > 2 * token_scaling_flops_at_32()


def token_scaling_flops_at_32():
    import keras_vit

    return keras_vit.training_flops(
        "vit_tiny_patch16_224", image_size=32, num_classes=10, **TINY_ARCHITECTURE
    )


def test_the_224_pipeline_falls_back_to_synthetic_jpegs(monkeypatch, tmp_path):
    monkeypatch.setattr(input_pipeline, "IMAGENETTE", str(tmp_path / "absent.zip"))
    rate, source = input_pipeline.images_224(batch_size=4, seconds=0.5)
    assert source == "synthetic" and rate > 0


def _results(ours, hub, timm, fp32_ms, ort_ms, dynamic_ms, int8_ms):
    side = lambda rate: {"images_per_second": rate, "mfu": rate / 200}  # noqa: E731
    runtimes = {"tflite_fp32": fp32_ms, "onnxruntime_timm": ort_ms, "tflite_dynamic": dynamic_ms}
    runtimes.update(tflite_int8=int8_ms, keras_xla=1.1 * fp32_ms, keras_predict_on_batch=2 * fp32_ms)
    return {
        "quick": False,
        "rounds": 1,
        "machine": "test",
        "date": "today",
        "peak": {"tensorflow": 100.0, "tensorflow_xla": 150.0, "torch": 200.0},
        "training": {"A": {"keras_vit": side(ours), "keras_hub": side(hub), "timm": side(timm)}},
        "pipeline": [{"dataset": "cifar", "pipeline": 300.0, "step": ours, "ratio": 300.0 / ours}],
        "scaling": [
            dict(
                image_size=s,
                tokens=(s // 4) ** 2,
                ms_per_image=s,
                time_per_token_vs_smallest=1.0,
                attention_flop_share=0.1,
                peak_rss_mb=1000.0 + s,
                peak_rss_over_model_mb=s,
                training_flops_per_image=1e9 * s,
            )  # fmt: skip
            for s in (32, 64)
        ],
        "inference": {"vit_tiny_patch16_224": {k: {"batch1_ms": v} for k, v in runtimes.items()}},
    }


def test_the_goals_table_says_what_is_met():
    met = dict((goal, ok) for goal, _, ok in run._goals(_results(130, 100, 90, 8, 10, 4, 6)))
    assert all(met.values()) is False  # MFU 65% is below 75%
    assert met["config A: keras_vit >= 1.2x keras-hub (XLA)"] and met["config A: keras_vit >= 1.3x timm"]
    assert met["TFLite fp32 batch 1 <= 0.85x ONNX Runtime"] and met["dynamic-range int8 <= 0.55x fp32"]
    assert met["full int8 faster than fp32, else not the default"]
    assert met["Keras (XLA) within 1.2x of TFLite fp32 per image"]

    missed = dict((goal, ok) for goal, _, ok in run._goals(_results(100, 100, 100, 10, 10, 9, 30)))
    assert not missed["config A: keras_vit >= 1.2x keras-hub (XLA)"]
    assert not missed["TFLite fp32 batch 1 <= 0.85x ONNX Runtime"]
    # Slower full int8 is fine as long as the exporter does not make it the default.
    assert missed["full int8 faster than fp32, else not the default"]


def test_the_report_writes_its_files(monkeypatch, tmp_path):
    monkeypatch.setattr(run, "OUTPUT", str(tmp_path))
    run.write_report(_results(84, 80, 100, 16.6, 19.8, 16.4, 60.4))
    assert sorted(os.listdir(tmp_path)) == ["results.json", "results.md", "scaling.png", "training.png"]
    table = (tmp_path / "results.md").read_text()
    assert "| config A: keras_vit >= 1.3x timm | 0.84x | no |" in table
    assert "| tflite_fp32 | 16.6 |  |" in table


def _backbone(tflite_ms, ort_ms, torch_ms, products_ms=None, gflop=None):
    milliseconds = {"tflite_fp32": tflite_ms, "onnxruntime_timm": ort_ms, "torch_timm": torch_ms}
    measured = {runtime: {"batch1_ms": ms} for runtime, ms in milliseconds.items()}
    if products_ms is not None:
        measured["tflite_matmuls_only"] = {"batch1_ms": products_ms, "gflop": gflop}
    return measured


@pytest.mark.parametrize("pooling", ["token", "map"])
def test_the_products_alone_are_timms_every_flop_and_the_file_holds_nothing_else(pooling):
    """The floor's shapes, read from timm's model by hooks, add up to the FLOPs PyTorch's own
    counter finds in that model (its attention unfused, so that the counter sees both products),
    and the LiteRT file runs exactly those products: FULLY_CONNECTED and BATCH_MATMUL, one each."""
    import matmul_floor
    import timm
    import torch
    from ai_edge_litert.interpreter import Interpreter
    from torch.utils.flop_counter import FlopCounterMode

    peer = timm.create_model(
        "vit_base_patch16_siglip_224" if pooling == "map" else "vit_small_patch16_224",
        pretrained=False, img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5,
    ).eval()  # fmt: skip
    products, batched = matmul_floor.matmul_shapes(peer, 32)
    for module in peer.modules():
        if hasattr(module, "fused_attn"):
            module.fused_attn = False
    peer.requires_grad_(False)  # the counter's module tracker fails on the MAP pool under no_grad
    with FlopCounterMode(display=False) as counter:
        peer(torch.zeros(1, 3, 32, 32))
    assert matmul_floor.flops(products, batched) == counter.get_total_flops()
    # Two blocks' four projections and two attention products; the head; the MAP pool's own.
    assert len(batched) == 2 * 2 + (2 if pooling == "map" else 0)
    assert (16, 3 * 64, 32) in products  # the patch embedding: 16 patches of 3 x 8 x 8
    flatbuffer = matmul_floor.matmuls_only_flatbuffer(products, batched)
    ops = [op["op_name"] for op in Interpreter(model_content=flatbuffer)._get_ops_details()]
    assert sorted(ops) == sorted(["FULLY_CONNECTED"] * len(products) + ["BATCH_MATMUL"] * len(batched))
    matmul_floor.litert_runner(flatbuffer, threads=1)()
    if pooling == "token":
        # The export's last block computes the [cls] token alone (vit.classify): so does the
        # floor, its QKV projection on every token (keys and values), the rest on one row.
        skipping, skipping_batched = matmul_floor.matmul_shapes(peer, 32, reads=1)
        tokens = 16 + 1
        last = [(tokens, 32, 96), (1, 32, 32), (1, 32, 128), (1, 128, 32)]  # qkv, proj, fc1, fc2
        assert skipping == [*products[: -len(last) - 1], *last, products[-1]]  # the head: last
        assert skipping_batched == [*batched[:2], (2, 1, 16, tokens), (2, 1, tokens, 16)]


def test_the_floor_of_an_eva_with_separate_projections_keeps_its_keys_and_values_on_every_token():
    """EVA02-CLIP's q_proj, k_proj, v_proj: the skipping export (`eva.classify`) computes [cls]'s
    query alone, the keys and values of every token; so does the floor."""
    import matmul_floor
    import timm

    peer = timm.create_model("eva02_base_patch16_clip_224", img_size=32, patch_size=8, embed_dim=32, depth=1,
                             num_heads=2, num_classes=5).eval()  # fmt: skip
    whole, _ = matmul_floor.matmul_shapes(peer, 32)
    skipping, batched = matmul_floor.matmul_shapes(peer, 32, reads=1)
    tokens = 16 + 1
    moved = [(a, b) for a, b in zip(whole, skipping, strict=True) if a != b]
    # q_proj and proj (32 -> 32), SwiGLU's fc1_g and fc1_x (32 -> 85), fc2: from every token to one
    # row; k_proj and v_proj (32 -> 32) stay on every token.
    expected = [((tokens, 32, 32), (1, 32, 32))] * 2 + [((tokens, 32, 85), (1, 32, 85))] * 2
    assert sorted(moved) == sorted([*expected, ((tokens, 85, 32), (1, 85, 32))]), moved
    assert [shape for shape in skipping if shape == (tokens, 32, 32)] == [(tokens, 32, 32)] * 2
    assert batched == [(2, 1, 16, tokens), (2, 1, tokens, 16)]


def test_each_backbone_is_judged_against_onnx_runtime_in_the_goals_and_its_page():
    import backbones

    measured = {
        "vit_small_patch14_dinov2": _backbone(8, 10, 20),
        "vit_small_patch16_dinov3": _backbone(9, 10, 20, products_ms=8.8, gflop=1.76),
    }
    assert backbones.backbone_goals(measured) == [
        ("DINOv2-S/14: TFLite fp32 batch 1 <= 0.85x ONNX Runtime", "0.80x", True),
        ("DINOv3-S/16: TFLite fp32 batch 1 <= 0.85x ONNX Runtime", "0.90x", False),
    ]
    page = backbones.report(measured, rounds=1, machine="test")
    assert "| DINOv2-S/14 | `vit_small_patch14_dinov2` | 8.0 | 10.0 | 20.0 | 0.80x |  |" in page
    assert "| DINOv3-S/16: TFLite fp32 batch 1 <= 0.85x ONNX Runtime | 0.90x | no |" in page
    # Its products alone, every other op free, already take 0.88x ONNX Runtime's whole model.
    assert backbones.floor_ratios(measured) == {"DINOv3-S/16": pytest.approx(0.88)}
    assert "| DINOv3-S/16 | 1.76 | 8.8 | 200 | 0.88x |  | no |" in page
    # Round by round, where the run kept them: each pair of sides timed back to back.
    measured["vit_small_patch16_dinov3"]["tflite_fp32"]["batch1_ms_rounds"] = [9, 8]
    measured["vit_small_patch16_dinov3"]["onnxruntime_timm"]["batch1_ms_rounds"] = [10, 10]
    page = backbones.report(measured, rounds=2, machine="test")
    assert "| DINOv3-S/16 | `vit_small_patch16_dinov3` | 9.0 | 10.0 | 20.0 | 0.90x | 0.90, 0.80 |" in page
    # The full run's goals table carries the same rows.
    results = _results(130, 100, 90, 8, 10, 4, 6)
    results["inference"].update(measured)
    met = dict((goal, ok) for goal, _, ok in run._goals(results))
    assert met["DINOv2-S/14: TFLite fp32 batch 1 <= 0.85x ONNX Runtime"]
    assert not met["DINOv3-S/16: TFLite fp32 batch 1 <= 0.85x ONNX Runtime"]


def test_the_onnx_peer_of_a_rotary_vit_exports_and_keeps_timms_outputs(tmp_path):
    import inference
    import numpy as np
    import timm
    import torch

    peer = timm.create_model(
        "vit_small_patch16_dinov3", embed_dim=32, depth=1, num_heads=2, img_size=inference.IMAGE_SIZE
    ).eval()
    images = np.random.default_rng(0).uniform(0, 1, (1, 3, inference.IMAGE_SIZE, inference.IMAGE_SIZE))
    images = images.astype("float32")
    (logits,) = inference._onnxruntime(peer, str(tmp_path))(images)
    with torch.inference_mode():
        expected = peer(torch.from_numpy(images)).numpy()
    np.testing.assert_allclose(logits, expected, atol=1e-4)
    assert all(m.fused_attn for m in peer.modules() if hasattr(m, "fused_attn"))  # the peer untouched


def test_gpu_benchmark_says_in_one_line_that_there_is_no_gpu_and_exits_0():
    import subprocess

    result = subprocess.run(
        [sys.executable, os.path.join(BENCHMARKS, "gpu.py")],
        capture_output=True, text=True, timeout=HANG_SECONDS,
        env=dict(os.environ, KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="3"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines() == [
        "benchmarks/gpu.py: no GPU found (JAX sees none); nothing measured."
    ]


def test_gpu_benchmark_measures_each_side_and_writes_its_report_at_tiny_sizes(tmp_path):
    """The GPU run's code paths on the CPU, so the next GPU session does not meet a bug."""
    import json

    import gpu

    rate, classifier = gpu.keras_vit_rate("tiny", batch=4, steps=2, epochs=2, precision="float32")
    timm = gpu.timm_rate("tiny", batch=4, steps=1, epochs=2, device="cpu")
    assert rate > 0 and timm > 0 and classifier.num_classes == gpu.NUM_CLASSES
    flops = 3 * 10**6
    row = {"architecture": "tiny", "batch": 4, "training_flops_per_image": flops}
    row["keras_vit"] = gpu._row("keras_vit", rate, flops, 1.0)
    row["keras_hub"] = gpu._row("keras_hub", None, flops, 1.0)
    row["timm"] = gpu._row("timm", timm, flops, 1.0)
    assert row["keras_vit"]["mfu"] == pytest.approx(rate * flops / 1e12)
    summary = {
        "gpu": "test", "bf16_spec_tflops": 1.0, "bf16_matmul_peak_tflops": 0.5,
        "speedup_gpu_train_vs_timm": rate / timm, "gpu_train_mfu": row["keras_vit"]["mfu"],
        "gpu_augmentation_cost": 0.05, "training": [row],
        "augmentation": {"plain": 100.0, "augmented": 95.0, "cost": 0.05},
    }  # fmt: skip
    gpu.write_report(summary, str(tmp_path))
    assert json.loads((tmp_path / "gpu.json").read_text())["speedup_gpu_train_vs_timm"] == rate / timm
    report = (tmp_path / "gpu.md").read_text()
    assert "| tiny | 4 |" in report and "not installed" in report and "cost 5.0%" in report
    assert gpu.bf16_spec("NVIDIA H100 80GB HBM3") == 989.0 and gpu.bf16_spec("Some CPU") is None


def test_the_small_scratch_recipe_is_a_plain_vit_under_10m_parameters_with_its_own_choices():
    from keras_vit.model import complexity, registry
    from keras_vit.training.config import TrainConfig

    recipe = TrainConfig(dataset="unused", preset="small-scratch").resolved()
    assert (
        recipe.model == "vit_cifar_patch4_32" and registry.get_model_config(recipe.model)["patch_size"] == 4
    )
    assert complexity.parameter_count(recipe.model, num_classes=10) < 10_000_000
    assert (recipe.randaugment, recipe.mixup, recipe.cutmix, recipe.random_erasing) == (2, 0.8, 1.0, 0.25)
    assert recipe.precision == "mixed_bfloat16" and recipe.crop == "pad" and recipe.epochs >= 100
    # A flag the user gives wins over the recipe.
    assert TrainConfig(dataset="unused", preset="small-scratch", mixup=0.0).resolved().mixup == 0.0


def test_the_cifar10_recipe_command_shortened_trains_scores_and_reports(tmp_path):
    """`benchmarks/cifar10_accuracy.py --recipe small-scratch`, cut to 2 steps of 32 images of a
    small model without XLA, on the embedded cifar10-mini (the shared CIFAR-10 zip's train/ and test/
    layout).
    The export it ends with is `keras-vit export`, tested in test_export.py: skipped here."""
    import json
    import subprocess

    from keras_vit.data import datasets as data

    command = [
        sys.executable, os.path.join(BENCHMARKS, "cifar10_accuracy.py"), "--recipe", "small-scratch",
        "--source", data.embedded_dataset_path("cifar10-mini"), "--output", str(tmp_path / "run"),
        "--report-dir", str(tmp_path / "report"), "--epochs", "1", "--steps-per-epoch", "2",
        "--batch-size", "32", "--model", "vit_nano_patch4_32", "--no-export",
        "--no-jit-compile",  # XLA's CPU compile of a bfloat16 step alone took about 20 s
    ]  # fmt: skip
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=HANG_SECONDS,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert json.loads((tmp_path / "report" / "cifar10.json").read_text()) == summary
    run_config = json.loads((tmp_path / "run" / "history.json").read_text())["config"]
    assert run_config["preset"] == "small-scratch" and run_config["model"] == summary["model"]
    assert run_config["precision"] == "mixed_bfloat16" and run_config["randaugment"] == 2
    assert summary["test_images"] == 500 and 0.0 <= summary["test_top1"] <= summary["test_top5"] <= 1.0
    assert summary["steps"] == 2 and summary["epochs"] == 1 and summary["minutes"] > 0
    assert summary["images_per_second"] > 0 and summary["gpu"].startswith("CPU only")
    report = (tmp_path / "report" / "cifar10.md").read_text()
    assert "| ViT-Lite-7/4 | 3.7M | 91.38% |" in report and f"**{summary['test_top1']:.2%}**" in report
    assert "--recipe small-scratch" in report and "Not met by this run" in report
    assert "No GPU ran this report" in report and "Not exported in this run" in report
    assert (tmp_path / "report" / "cifar10.png").stat().st_size > 0


def test_the_cifar10_report_judges_both_goals_and_full_int8_against_one_point():
    import cifar10_accuracy

    summary = {
        "recipe": "small-scratch", "model": "vit_cifar_patch4_32", "params": 8_335_882,
        "test_top1": 0.9412, "test_top5": 0.998, "test_images": 10_000, "best_val_accuracy": 0.945,
        "epochs": 200, "steps": 19_000, "batch_size": 512, "minutes": 14.2, "images_per_second": 25_000.0,
        "gpu": "NVIDIA H100 80GB HBM3", "backend": "jax", "keras": "3.15.1", "output": "runs/x",
        "int8_accuracy_change_points": -0.6,
    }  # fmt: skip
    report = cifar10_accuracy.report_markdown(summary, "| tflite_int8 | ... |\n", "python benchmarks/...")
    assert "**Met by this run.**" in report and "No GPU ran this report" not in report
    assert (
        "| **keras-vit `small-scratch`** (`vit_cifar_patch4_32`, plain ViT) | 8.3M | **94.12%** |" in report
    )
    assert "accuracy changes by -0.6 points on the verification images (met)" in report
    slower = cifar10_accuracy.report_markdown({**summary, "minutes": 15.5}, "", "")
    assert "**Not met by this run.**" in slower
    worse_int8 = {**summary, "int8_accuracy_change_points": -1.4}
    assert "-1.4 points on the verification images (not met)" in cifar10_accuracy.report_markdown(
        worse_int8, "", ""
    )


def test_the_finetune_report_judges_top1_and_minutes_and_names_the_cpu():
    import finetune_cifar10

    summary = {
        "weights": "vit_tiny_patch16_224.augreg_in21k_ft_in1k", "model": "vit_tiny_patch16_224",
        "image_size": 224, "precision": "float32", "freeze_backbone": False, "test_top1": 0.9512,
        "test_top5": 0.999, "test_images": 10_000, "best_val_accuracy": 0.95, "epochs": 4, "steps": 480,
        "batch_size": 64, "minutes": 25.0, "images_per_second": 22.3, "device": "CPU only (x86_64, 2 cores)",
        "cpu": "AMD EPYC, 2 cores, avx512_vnni avx512_bf16", "int8_accuracy_change_points": 0.0,
    }  # fmt: skip
    report = finetune_cifar10.report_markdown(summary, "| tflite_int8 | ... |\n", "python benchmarks/...")
    assert "**Met by this run.**" in report and "avx512_vnni" in report and "Test top-1 **95.12%**" in report
    assert "**Not met by this run.**" in finetune_cifar10.report_markdown(
        {**summary, "test_top1": 0.9466}, "", ""
    )
    assert "**Not met by this run.**" in finetune_cifar10.report_markdown(
        {**summary, "minutes": 31.0}, "", ""
    )


def test_layer_decay_unpacks_a_one_split_zip_and_judges_each_learning_rate(tmp_path):
    import zipfile

    import layer_decay

    with zipfile.ZipFile(tmp_path / "val_only.zip", "w") as archive:
        for name in ("top/val/cat/1.png", "top/val/cat/2.png", "top/val/dog/3.png"):
            archive.writestr(name, b"png")
    folder = layer_decay.class_folders(str(tmp_path / "val_only.zip"), str(tmp_path / "unpacked"))
    assert sorted(os.listdir(folder)) == ["cat", "dog"] and len(os.listdir(os.path.join(folder, "cat"))) == 2

    def result(decay, lr, accuracy):
        return {"layer_decay": decay, "learning_rate": lr, "best_val_accuracy": accuracy}

    results = [
        result(1.0, 1e-4, 0.30),
        result(0.65, 1e-4, 0.35),
        result(1.0, 5e-4, 0.42),
        result(0.65, 5e-4, 0.37),
    ]
    assert layer_decay.verdict(results) == (
        "Best: layer decay 1.0 at peak lr 0.0005 (42.00%). Layer decay helped at 1 of 2 learning rates."
    )


def test_the_tflite_profile_times_every_op_alone_and_sums_them_per_type():
    """`benchmarks/tflite_profile.py` on a three-op model (FULLY_CONNECTED with its weights, ADD,
    RSQRT, which refuses negative inputs): one row per op, and a table that adds them up."""
    import numpy as np
    import tensorflow as tf
    import tflite_profile

    weights = tf.constant(np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([1, 8], tf.float32), tf.TensorSpec([1, 4], tf.float32)])
    def model(x, y):
        return tf.math.rsqrt(tf.matmul(x, weights) + y)

    flatbuffer = tf.lite.TFLiteConverter.from_concrete_functions(
        [model.get_concrete_function()], model
    ).convert()
    rows = tflite_profile.op_rows(flatbuffer, runs=3, copies=2)
    assert [(name, kind) for _, name, kind, _ in rows] == [
        ("FULLY_CONNECTED", "float32"),
        ("ADD", "float32"),
        ("RSQRT", "float32"),
    ]
    assert all(ms > 0 for *_, ms in rows)
    table = tflite_profile.table(rows, whole_ms=tflite_profile.time_model(flatbuffer, runs=3))
    assert "| FULLY_CONNECTED | float32 | 1 |" in table and "sum of ops timed alone** | | 3 |" in table


def test_tflite_latency_times_the_models_in_turns_and_names_the_cpu(tmp_path):
    """`benchmarks/tflite_latency.py`: every model invoked `runs` times a round, each round."""
    import tensorflow as tf
    import tflite_latency

    paths = []
    for width in (4, 64):

        @tf.function(input_signature=[tf.TensorSpec([1, width], tf.float32)])
        def model(x):
            return tf.nn.relu(x)

        path = tmp_path / f"relu_{width}.tflite"
        path.write_bytes(
            tf.lite.TFLiteConverter.from_concrete_functions([model.get_concrete_function()], model).convert()
        )
        paths.append(str(path))
    times = tflite_latency.alternate(paths, rounds=2, runs=3)
    assert list(times) == paths and all(len(v) == 6 and min(v) > 0 for v in times.values())
    name, flags = tflite_latency.cpu()
    assert isinstance(name, str) and isinstance(flags, list)


def test_tflite_latency_counts_the_ops_xnnpack_takes(tmp_path):
    """An op XNNPACK has no kernel for (float L2_NORMALIZATION) stays outside, cutting the graph
    in two partitions; the others are taken."""
    import tensorflow as tf
    import tflite_latency

    @tf.function(input_signature=[tf.TensorSpec([1, 8], tf.float32)])
    def model(x):
        y = tf.math.l2_normalize(tf.nn.relu(x) + 1.0, axis=-1)
        return tf.nn.relu(y * 3.0 + x)

    path = tmp_path / "l2.tflite"
    path.write_bytes(
        tf.lite.TFLiteConverter.from_concrete_functions([model.get_concrete_function()], model).convert()
    )
    taken, outside, partitions = xnnpack_delegation(tflite_latency.interpreter(str(path), 1))
    assert outside == 1 and partitions == 2 and taken >= 4


def test_gptq_rounds_a_kernel_closer_to_its_outputs_than_rounding_to_nearest():
    """`benchmarks/int8_weights.py`: on correlated inputs GPTQ's rounding, still on the int8 grid
    of each output channel, changes the layer's outputs less than round-to-nearest does."""
    import int8_weights
    import numpy as np

    x, kernel, scale = correlated_layer()
    nearest = int8_weights.round_to_nearest(kernel)
    rounded = int8_weights.gptq(kernel, x.T @ x / len(x))
    steps = rounded / scale
    assert np.allclose(steps, np.round(steps)) and np.abs(np.round(steps)).max() <= 127
    error = lambda w: np.mean((x @ (w - kernel)) ** 2)  # noqa: E731
    assert error(rounded) < 0.5 * error(nearest)


def test_the_least_squares_kernel_answers_for_an_upstream_error_no_rounding_step_can():
    """`seq-adaround-l`: inputs 5% too large from upstream need every weight 5% smaller, many
    int8 steps for the largest; AdaRound aimed by the drift moves each weight one step at most,
    the least-squares kernel rounded after lands far nearer the float outputs."""
    import int8_weights
    import numpy as np

    x, kernel, _ = correlated_layer()
    upstream = x * 1.05 + 0.02 * np.random.default_rng(1).normal(size=x.shape)
    hessian, cross = upstream.T @ upstream / len(x), upstream.T @ x / len(x)
    error = lambda w: np.mean((upstream @ w - x @ kernel) ** 2)  # noqa: E731
    aimed = int8_weights.adaround(kernel, hessian, drift=(hessian - cross) @ kernel)
    target = int8_weights.least_squares_kernel(kernel, hessian, cross, ridge=1e-3)
    solved = int8_weights.adaround(target, hessian, drift=hessian @ target - cross @ kernel)
    steps = solved / int8_weights.channel_scale(solved)
    assert np.allclose(steps, np.round(steps), atol=1e-6)
    assert error(solved) < 0.25 * error(aimed)


def test_the_whole_layer_ranking_sees_a_kernel_that_rounds_badly_where_the_input_ranking_does_not():
    """`--rank-by layer` (`float_saving`): an MLP unit made dead (its GELU input far below zero)
    whose fc2 row is 10,000 times the others sets every fc2 channel's int8 step, so rounding
    fc2's kernel zeroes the rest: the float model does not change, fc2's whole-layer cost tops the
    ranking and dwarfs what its input alone costs (`input_sensitivity`, blind to kernels); both
    leave the weights as they were."""
    import int8_weights
    import keras
    import numpy as np

    import keras_vit

    keras.utils.set_random_seed(0)
    model = keras_vit.create_model("vit_tiny_patch16_224", image_size=32, num_classes=10, **TINY_ARCHITECTURE)
    images = np.random.default_rng(0).uniform(-1, 1, (8, 32, 32, 3)).astype("float32")
    block = model.blocks[1]
    kernel1, bias1 = np.asarray(block.fc1.kernel).copy(), np.asarray(block.fc1.bias).copy()
    kernel1[:, 0], bias1[0] = 0.0, -1e4  # GELU(-1e4) is exactly 0: unit 0 is dead
    block.fc1.kernel.assign(kernel1)
    block.fc1.bias.assign(bias1)
    kernel2 = np.asarray(block.fc2.kernel).copy()
    kernel2[0] = 1e4 * np.abs(kernel2).max()
    block.fc2.kernel.assign(kernel2)
    weights = [w.copy() for w in model.get_weights()]
    whole = int8_weights.float_saving(model, images)
    inputs = int8_weights.input_sensitivity(model, images)
    assert max(whole, key=whole.get) == block.fc2.path
    assert inputs[block.fc2.path] < 0.01 * whole[block.fc2.path]
    for before, after in zip(weights, model.get_weights(), strict=True):
        np.testing.assert_array_equal(before, after)


def test_block_adaround_rounds_each_blocks_kernels_up_or_down_on_their_grid_and_leaves_the_head():
    """`int8_weights.py --recipes block-adaround` (BRECQ): every kernel of every block lands on its
    int8 grid, each weight on the level below or above its float value, with the model's int8
    inputs in the loop; the head, outside the blocks, is left to the caller (`seq-adaround`)."""
    import int8_block_rounding
    import int8_weights
    import keras
    import numpy as np

    import keras_vit

    keras.utils.set_random_seed(0)
    model = keras_vit.create_model("vit_tiny_patch16_224", image_size=32, num_classes=10, **TINY_ARCHITECTURE)
    images = np.random.default_rng(0).uniform(-1, 1, (8, 32, 32, 3)).astype("float32")
    before = {layer.path: np.asarray(layer.kernel, np.float64) for layer in int8_weights.dense_layers(model)}
    fits = []
    int8_block_rounding.block_adaround(model, images, dynamic=".*", steps=50, batch=4, log=fits.append)
    assert [row["block"] for row in fits] == [0, 1]
    for layer in int8_weights.dense_layers(model):
        kernel = np.asarray(layer.kernel, np.float64)
        if layer.path == "head":
            np.testing.assert_array_equal(kernel, before[layer.path])
            continue
        scale = int8_weights.channel_scale(before[layer.path])
        levels = kernel / scale
        assert np.allclose(levels, np.round(levels), atol=1e-3), layer.path
        assert np.all(np.abs(levels - before[layer.path] / scale) < 1 + 1e-3), layer.path
        assert not np.array_equal(kernel, before[layer.path]), layer.path


def test_tuning_the_scales_and_biases_keeps_each_kernels_int8_levels():
    """`int8_weights.py --tune-scales`: each Dense column only scales (by a positive factor), so a
    file's quantiser finds the same int8 levels; the biases move."""
    import int8_float_tuning
    import int8_weights
    import keras
    import numpy as np

    import keras_vit

    keras.utils.set_random_seed(0)
    model = keras_vit.create_model("vit_tiny_patch16_224", image_size=32, num_classes=10, **TINY_ARCHITECTURE)
    images = np.random.default_rng(0).uniform(-1, 1, (16, 32, 32, 3)).astype("float32")
    reference = keras.ops.convert_to_numpy(keras.ops.softmax(model(images)))
    layers = int8_weights.dense_layers(model)
    for layer in layers:
        layer.kernel.assign(int8_weights.round_to_nearest(np.asarray(layer.kernel, np.float64)))

    def levels_of(layer):
        kernel = np.asarray(layer.kernel)
        return kernel / int8_weights.channel_scale(kernel)

    levels = {layer.path: levels_of(layer) for layer in layers}
    biases = {layer.path: np.asarray(layer.bias).copy() for layer in layers}
    int8_float_tuning.tune_scales_and_biases(model, images, reference, steps=20, learning_rate=1e-3)
    for layer in layers:
        np.testing.assert_allclose(levels_of(layer), levels[layer.path], atol=1e-3)
        assert not np.array_equal(np.asarray(layer.bias), biases[layer.path]), layer.path


def test_the_awq_scaling_keeps_a_vits_float_answers():
    """Scaling each kernel's input channels and folding the inverse into the norm or V before
    changes nothing in float, whatever alpha each kernel gets."""
    import int8_weights
    import keras
    import numpy as np

    import keras_vit

    keras.utils.set_random_seed(0)
    model = keras_vit.create_model("vit_tiny_patch16_224", image_size=32, num_classes=10, **TINY_ARCHITECTURE)
    images = np.random.default_rng(0).uniform(-1, 1, (8, 32, 32, 3)).astype("float32")
    for layer in model._flatten_layers():  # norms and biases away from their initial values
        for weight in layer.weights:
            if weight.path.endswith(("gamma", "beta", "bias")):
                weight.assign(np.random.default_rng(1).normal(1, 0.5, weight.shape).astype("float32"))
    before = keras.ops.convert_to_numpy(model(images))
    alphas = int8_weights.awq_scales(model, int8_weights.dense_inputs(model, images))
    assert len(alphas) == 3 * TINY_ARCHITECTURE["depth"] + 1 and any(a > 0 for a in alphas.values())
    np.testing.assert_allclose(keras.ops.convert_to_numpy(model(images)), before, atol=1e-4)


def test_rotating_each_heads_values_and_the_output_projection_keeps_a_vits_float_answers():
    """`benchmarks/int8_dynamic.py`'s per-head rotation of `proj`'s input, folded into V and
    `proj`, and its fc2 Hadamard with random signs: the same answers in float, other kernels."""
    import int8_dynamic
    import keras
    import numpy as np

    import keras_vit

    keras.utils.set_random_seed(0)
    model = keras_vit.create_model("vit_tiny_patch16_224", image_size=32, num_classes=10, **TINY_ARCHITECTURE)
    images = np.random.default_rng(0).uniform(-1, 1, (8, 32, 32, 3)).astype("float32")
    before = keras.ops.convert_to_numpy(model(images))
    copy = int8_dynamic.with_value_rotation(
        int8_dynamic.with_fc2_hadamard(int8_dynamic.copy_of(model), 16, seed=1)
    )
    np.testing.assert_allclose(keras.ops.convert_to_numpy(copy(images)), before, atol=1e-5)
    for name in ("qkv", "proj"):
        kernel, rotated = (np.asarray(getattr(m.blocks[0].attention, name).kernel) for m in (model, copy))
        assert np.abs(kernel - rotated).max() > 1e-3, name


def test_the_fc2_hadamard_in_named_blocks_rotates_only_theirs_and_keeps_the_answers():
    """`with_fc2_hadamard(..., blocks=[1])` (`--hadamard-blocks 1`): block 1's fc2 input rotated
    in the graph and its kernel to match, block 0's left as it was; the same answers in float."""
    import int8_dynamic
    import keras
    import numpy as np

    import keras_vit

    keras.utils.set_random_seed(0)
    model = keras_vit.create_model("vit_tiny_patch16_224", image_size=32, num_classes=10, **TINY_ARCHITECTURE)
    images = np.random.default_rng(0).uniform(-1, 1, (8, 32, 32, 3)).astype("float32")
    before = keras.ops.convert_to_numpy(model(images))
    copy = int8_dynamic.with_fc2_hadamard(int8_dynamic.copy_of(model), 16, blocks=[1])
    np.testing.assert_allclose(keras.ops.convert_to_numpy(copy(images)), before, atol=1e-5)
    kernels = [[np.asarray(m.blocks[i].fc2.kernel) for m in (model, copy)] for i in range(2)]
    np.testing.assert_array_equal(*kernels[0])
    assert np.abs(kernels[1][0] - kernels[1][1]).max() > 1e-3
    assert int8_dynamic.block_indices("7,8") == [7, 8] and int8_dynamic.block_indices(None) is None


def test_rotating_fc2s_whole_input_keeps_a_vits_answers_and_spreads_a_massive_unit_over_every_channel():
    """`benchmarks/int8_dynamic.py`'s `with_fc2_full_rotation`: fc2's input times `H_4 (x) H_16`
    in two steps in the graph, fc2's kernel rotated and permuted to match: the same answers in
    float, and one unit's value reaches fc2 spread evenly over all 64 channels (a Hadamard of 16
    alone keeps it within its block)."""
    import int8_dynamic
    import keras
    import numpy as np

    import keras_vit

    keras.utils.set_random_seed(0)
    model = keras_vit.create_model("vit_tiny_patch16_224", image_size=32, num_classes=10, **TINY_ARCHITECTURE)
    images = np.random.default_rng(0).uniform(-1, 1, (8, 32, 32, 3)).astype("float32")
    before = keras.ops.convert_to_numpy(model(images))
    copies = {
        "blocks": int8_dynamic.with_fc2_hadamard(int8_dynamic.copy_of(model), 16),
        "whole": int8_dynamic.with_fc2_full_rotation(int8_dynamic.copy_of(model), 16),
    }
    massive = np.zeros((1, 64), "float32")
    massive[0, 5] = 8.0
    seen, call = {}, keras.layers.Dense.call
    for name, copy in copies.items():
        np.testing.assert_allclose(keras.ops.convert_to_numpy(copy(images)), before, atol=1e-5)
        keras.layers.Dense.call = lambda layer, x, training=None, name=name: (
            seen.setdefault(name, keras.ops.convert_to_numpy(x)),
            call(layer, x),
        )[1]
        try:
            copy.blocks[0].fc2.call(massive)
        finally:
            keras.layers.Dense.call = call
    np.testing.assert_allclose(np.abs(seen["whole"]), 1.0, atol=1e-6)  # 8 / sqrt(64) on every channel
    assert np.count_nonzero(np.abs(seen["blocks"]) > 1e-6) == 16


def test_the_fine_tunes_forward_pass_is_the_int8_rounded_kernels_and_its_gradient_reaches_them():
    """`benchmarks/int8_qat.py`: a Dense layer made `fake_quantised` answers as the same layer with
    its kernel rounded to nearest (`int8_weights.round_to_nearest`), and the loss's gradient
    passes the rounding to the float kernel."""
    import int8_qat
    import int8_weights
    import keras
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    layer = keras.layers.Dense(6)
    inputs = rng.normal(size=(5, 12)).astype("float32")
    layer.build((None, 12))
    layer.bias.assign(rng.normal(size=6).astype("float32"))
    rounded = int8_weights.round_to_nearest(np.asarray(layer.kernel, np.float64)).astype("float32")
    expected = inputs @ rounded + np.asarray(layer.bias)
    int8_qat.fake_quantised(layer)
    with tf.GradientTape() as tape:
        outputs = layer(inputs)
        loss = tf.reduce_sum(outputs**2)
    np.testing.assert_allclose(outputs.numpy(), expected, atol=1e-5)
    gradient = tape.gradient(loss, layer.kernel.value)
    np.testing.assert_allclose(gradient.numpy(), inputs.T @ (2 * expected), rtol=1e-4, atol=1e-4)


def test_the_dynamic_range_simulation_answers_as_litert_does_and_rounded_kernels_pass_unchanged(tmp_path):
    """`benchmarks/int8_weights.py`'s `dynamic_inputs`: a Dense layer whose kernel is already on
    its int8 grid (AdaRound's, with each channel's largest |w| kept at 127 steps), converted and
    quantised as the dynamic-range recipes are, answers in LiteRT as the layer does in Keras with
    its input quantised token by token, far closer than the float layer does: the simulation is
    the runtime's arithmetic, and the quantiser kept the kernel's levels as given."""
    import int8_weights
    import keras
    import numpy as np
    import tensorflow as tf
    import tflite_latency

    from keras_vit.export import quantize

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 48)).astype("float32")
    x[:, 5] *= 30  # an outlier channel, as a ViT's residual stream has: coarse int8 steps per token
    kernel = rng.normal(size=(48, 24)) * 0.05
    rounded = int8_weights.adaround(kernel, x.T.astype(np.float64) @ x / len(x), steps=200)
    dense = keras.layers.Dense(24)
    dense.build((None, 48))
    dense.set_weights([rounded.astype("float32"), rng.normal(size=24).astype("float32")])
    weights, bias = (tf.constant(w) for w in dense.get_weights())  # Keras 3's variables do not freeze

    @tf.function(input_signature=[tf.TensorSpec((64, 48))])
    def layer(inputs):
        return tf.matmul(inputs, weights) + bias

    converter = tf.lite.TFLiteConverter.from_concrete_functions([layer.get_concrete_function()], layer)
    rules = (quantize.Rule(".*", "FULLY_CONNECTED", quantize.DYNAMIC), *quantize.FLOAT_IO)
    with quantize._quantizer_quiet():
        quantised = quantize._quantizer(converter.convert(), rules).quantize().quantized_model
    path = tmp_path / "dynamic.tflite"
    path.write_bytes(bytes(quantised))
    interpreter = tflite_latency.interpreter(str(path), 1)
    (levels,) = (
        interpreter.get_tensor(tensor["index"])
        for tensor in interpreter.get_tensor_details()
        if tensor["dtype"] == np.int8
    )
    np.testing.assert_array_equal(levels.T, np.round(rounded / int8_weights.channel_scale(rounded)))
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x)
    interpreter.invoke()
    litert = interpreter.get_tensor(interpreter.get_output_details()[0]["index"])

    with int8_weights.dynamic_inputs():
        simulated = keras.ops.convert_to_numpy(dense(x))
    exact = keras.ops.convert_to_numpy(dense(x))
    assert np.abs(simulated - litert).max() < 0.05 * np.abs(exact - litert).max()


def test_the_dynamic_range_simulation_quantises_only_the_layers_its_pattern_names():
    """`dynamic_inputs(layers)`: the Dense layers whose path the regex finds see their inputs
    quantised token by token, the others their float inputs (what each group's inputs cost)."""
    import int8_weights
    import keras
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 32)).astype("float32")
    x[:, 3] *= 30
    inputs = keras.Input((32,))
    first = keras.layers.Dense(32, name="fc1")
    second = keras.layers.Dense(8, name="fc2")
    model = keras.Model(inputs, second(first(inputs)))
    exact = keras.ops.convert_to_numpy(model(x))
    answers = {}
    for pattern in ("fc2", "fc1|fc2", "head"):
        with int8_weights.dynamic_inputs(pattern):
            answers[pattern] = keras.ops.convert_to_numpy(model(x))
    only_fc2 = keras.ops.convert_to_numpy(second(int8_weights.dynamic_int8(first(x))))
    np.testing.assert_allclose(answers["fc2"], only_fc2, atol=1e-6)
    np.testing.assert_array_equal(answers["head"], exact)  # no layer of that name: all float
    both = keras.ops.convert_to_numpy(second(int8_weights.dynamic_int8(first(int8_weights.dynamic_int8(x)))))
    np.testing.assert_allclose(answers["fc1|fc2"], both, atol=1e-6)
    assert np.abs(answers["fc1|fc2"] - exact).max() > np.abs(answers["fc2"] - exact).max() > 0
    with int8_weights.dynamic_inputs(int8_weights.all_inputs_but(["fc1"])):  # fc1's input stays float
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(model(x)), answers["fc2"])


def test_the_cls_rows_meet_the_float_kernel_the_other_rows_the_int8_path_in_keras_and_in_the_graph():
    """`int8_weights.float_cls_rows` inside `dynamic_inputs`: a Dense layer's [cls] row (the first
    token) is the float input times the float kernel, every other row what `dynamic_inputs` alone
    gives it with the rounded kernel; `int8_dynamic.with_float_cls_rows` computes the same split
    in the graph, exact in float, with the [cls] products under their own name scope."""
    import int8_dynamic
    import int8_weights
    import keras
    import numpy as np
    import tensorflow as tf

    import keras_vit

    keras.utils.set_random_seed(0)
    model = keras_vit.create_model("vit_tiny_patch16_224", image_size=32, num_classes=10, **TINY_ARCHITECTURE)
    qkv = model.blocks[0].attention.qkv
    float_kernel = np.asarray(qkv.kernel)
    x = np.random.default_rng(0).normal(size=(2, 5, 32)).astype("float32")
    x[:, :, 3] *= 30  # an outlier channel: coarse int8 steps per token
    qkv.kernel.assign(int8_weights.round_to_nearest(float_kernel).astype("float32"))
    with int8_weights.dynamic_inputs():
        rounded = keras.ops.convert_to_numpy(qkv(x))
        with int8_weights.float_cls_rows({qkv.path: float_kernel}):
            split = keras.ops.convert_to_numpy(qkv(x))
    exact_cls = x[:, 0] @ float_kernel + np.asarray(qkv.bias)
    np.testing.assert_allclose(split[:, 0], exact_cls, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(split[:, 1:], rounded[:, 1:])
    assert np.abs(split[:, 0] - rounded[:, 0]).max() > 1e-3

    qkv.kernel.assign(float_kernel)
    images = np.random.default_rng(1).uniform(-1, 1, (4, 32, 32, 3)).astype("float32")
    before = keras.ops.convert_to_numpy(model(images))
    # Behind fc2's in-graph Hadamard too: the [cls] row meets the rotated kernel on the rotated input.
    copy = int8_dynamic.with_float_cls_rows(int8_dynamic.with_fc2_hadamard(int8_dynamic.copy_of(model), 16))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(copy(images)), before, atol=1e-5)
    graph = tf.function(copy).get_concrete_function(tf.TensorSpec((1, 32, 32, 3))).graph
    scope = f"{int8_dynamic.CLS_SCOPE}/"
    scoped = [op for op in graph.get_operations() if scope in op.name and op.type == "MatMul"]
    assert len(scoped) == len(int8_weights.dense_layers(model))


def test_the_cls_residual_row_quantises_the_cls_row_twice_in_the_same_product():
    """`int8_dynamic.with_cls_residual_rows`: a Dense layer's input gains one row, the [cls] row's
    dynamic-range quantisation residual, whose output (less the bias) joins the [cls] row's. In
    float the [cls] row is then `(2x - Q(x)) W + b` and the others unchanged; under
    `int8_weights.dynamic_inputs` it is `(Q(x) + Q(x - Q(x))) W + b`, far nearer the float answer
    than `Q(x) W + b`, and a whole model (fc1's GELU after the sum) nearer fp32 too."""
    import int8_dynamic
    import int8_weights
    import keras
    import numpy as np

    import keras_vit

    keras.utils.set_random_seed(0)
    model = keras_vit.create_model("vit_tiny_patch16_224", image_size=32, num_classes=10, **TINY_ARCHITECTURE)
    images = np.random.default_rng(1).uniform(-1, 1, (4, 32, 32, 3)).astype("float32")
    fp32 = keras.ops.convert_to_numpy(model(images))
    with int8_weights.dynamic_inputs():
        plain = keras.ops.convert_to_numpy(model(images))
    qkv = model.blocks[0].attention.qkv
    kernel, bias = np.asarray(qkv.kernel), np.asarray(qkv.bias)
    x = np.random.default_rng(0).normal(size=(2, 5, 32)).astype("float32")
    x[:, :, 3] *= 30  # an outlier channel: coarse int8 steps per token
    q = keras.ops.convert_to_numpy(int8_weights.dynamic_int8(x))
    before = keras.ops.convert_to_numpy(qkv(x))
    with int8_weights.dynamic_inputs():
        once = keras.ops.convert_to_numpy(qkv(x))

    int8_dynamic.with_cls_residual_rows(model, skip={"head"})
    in_float = keras.ops.convert_to_numpy(qkv(x))
    np.testing.assert_allclose(in_float[:, 0], (2 * x[:, 0] - q[:, 0]) @ kernel + bias, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(in_float[:, 1:], before[:, 1:])
    with int8_weights.dynamic_inputs():
        twice = keras.ops.convert_to_numpy(qkv(x))
        residual = x[:, :1] - q[:, :1]
        expected = (q[:, 0] + keras.ops.convert_to_numpy(int8_weights.dynamic_int8(residual))[:, 0]) @ kernel
        np.testing.assert_allclose(twice[:, 0], expected + bias, rtol=1e-4, atol=1e-4)
        np.testing.assert_array_equal(twice[:, 1:], once[:, 1:])
        assert np.abs(twice[:, 0] - before[:, 0]).max() < np.abs(once[:, 0] - before[:, 0]).max() / 30
        rewritten = keras.ops.convert_to_numpy(model(images))
    (head,) = [layer for layer in int8_weights.dense_layers(model) if layer.path == "head"]
    assert type(head) is keras.layers.Dense  # skipped: a float layer keeps its one quantisation-free row
    assert np.abs(rewritten - fp32).max() < np.abs(plain - fp32).max()


def test_the_split_mlp_is_exact_in_float_and_its_twice_quantised_cls_row_nearer_fp32_in_int8():
    """`int8_dynamic.with_cls_split_mlp`: each block's MLP on the [cls] row apart from the others
    is the same model in float (behind fc2's Hadamard too) when no layer quantises twice; with
    fc1 and fc2 quantising the [cls] row twice, a model under `int8_weights.dynamic_inputs` is
    nearer its fp32 answers than the same model quantising once."""
    import int8_dynamic
    import int8_weights
    import keras
    import numpy as np

    import keras_vit

    keras.utils.set_random_seed(0)
    model = keras_vit.create_model("vit_tiny_patch16_224", image_size=32, num_classes=10, **TINY_ARCHITECTURE)
    images = np.random.default_rng(1).uniform(-1, 1, (4, 32, 32, 3)).astype("float32")
    fp32 = keras.ops.convert_to_numpy(model(images))
    every = {layer.path for layer in int8_weights.dense_layers(model)}
    behind_hadamard = int8_dynamic.with_fc2_hadamard(int8_dynamic.copy_of(model), 16)
    split = int8_dynamic.with_cls_split_mlp(behind_hadamard, skip=every)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(split(images)), fp32, atol=1e-5)

    with int8_weights.dynamic_inputs():
        once = keras.ops.convert_to_numpy(model(images))
        split_model = int8_dynamic.with_cls_split_mlp(int8_dynamic.copy_of(model))
        twice = keras.ops.convert_to_numpy(split_model(images))
    assert np.abs(twice - fp32).max() < np.abs(once - fp32).max()
    kinds = [type(block) for block in model.blocks]
    with int8_weights.dynamic_inputs(), int8_weights.cls_split_mlp(model):  # scoring's form: undone after
        np.testing.assert_allclose(keras.ops.convert_to_numpy(model(images)), twice, atol=1e-6)
    assert [type(block) for block in model.blocks] == kinds
    with int8_weights.dynamic_inputs():
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(model(images)), once)
