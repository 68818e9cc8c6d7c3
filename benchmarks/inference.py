"""Inference speed of one model (a ViT or a Swin) in every runtime a user could ship it with.

Batch-1 latency (ms) and batch-32 throughput (images/s) of the Keras model as
`keras-vit predict` runs it (`predict_on_batch`) and compiled with XLA, the SavedModel's
`serving_images` signature, TFLite fp32 / fp16 / dynamic-range int8 / full int8 under LiteRT
(2 threads, the static batch-1 files `keras-vit export` writes: their batch-32 figure is 32
invocations), and timm's same architecture in PyTorch and through ONNX Runtime (2 threads).
Random weights: speed does not depend on them.
"""

import copy
import os
import statistics
import tempfile
import time

import numpy as np

# PyTorch, timm and torchvision before TensorFlow: TensorFlow, then torchvision, segfaults.
import timm  # isort: skip
import torch  # isort: skip
import tensorflow as tf  # isort: skip

import keras_vit

THREADS = 2
QUICK_RUNTIMES = (
    "keras_predict_on_batch",
    "keras_xla",
    "tflite_fp32",
    "tflite_dynamic",
    "onnxruntime_timm",
    "torch_timm",
)


def median_seconds(function, repeats, warmup=1):
    """The median of `repeats` timed calls, after `warmup` untimed ones."""
    for _ in range(warmup):
        function()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _litert(flatbuffer):
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=flatbuffer, num_threads=THREADS)
    interpreter.allocate_tensors()
    index = interpreter.get_input_details()[0]["index"]

    def run(images):
        for image in images:  # the exported file has a static batch of 1
            interpreter.set_tensor(index, image[None])
            interpreter.invoke()

    return run


IMAGE_SIZE = 224  # every model at 224, whatever its default (DINOv2's 518, DINOv3's 256)


def timm_model(name):
    """timm's same architecture (any family), random weights, for inference."""
    return timm.create_model(name, pretrained=False, num_classes=1000, img_size=IMAGE_SIZE).eval()


def _onnxruntime(model, folder):
    import onnxruntime

    path = os.path.join(folder, "timm.onnx")
    example = torch.zeros(1, 3, IMAGE_SIZE, IMAGE_SIZE)
    # The TorchScript exporter cannot trace timm's eva attention through the fused
    # `scaled_dot_product_attention` (its `is_causal` reaches the op as a tensor); the explicit
    # path exports the same ONNX ops (MatMul, Softmax, MatMul) that the fused one decomposes to.
    model = copy.deepcopy(model)
    for module in model.modules():
        if hasattr(module, "fused_attn"):
            module.fused_attn = False
    torch.onnx.export(
        model, (example,), path, dynamo=False, input_names=["x"], dynamic_axes={"x": {0: "batch"}}
    )
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = THREADS
    session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    return lambda images: session.run(None, {"x": images})


def runtimes(name, folder, names, calibration_images):
    """`{runtime: (run(images NHWC float32 in [0, 255]), layout)}` for the requested runtimes."""
    from keras_vit.export import tflite
    from keras_vit.export.serving import write_saved_model
    from keras_vit.inference.classifier import load_classifier
    from keras_vit.inference.runtimes import SavedModelRunner

    model = keras_vit.create_model(name, num_classes=1000, image_size=IMAGE_SIZE)
    classifier = load_classifier(model)
    xla_forward = tf.function(lambda x: model(x, training=False), jit_compile=True)
    peer = timm_model(name)
    built = {}
    for runtime in names:
        if runtime == "keras_predict_on_batch":
            built[runtime] = (model.predict_on_batch, "nhwc")
        elif runtime == "keras_xla":
            built[runtime] = (lambda x: xla_forward(tf.constant(x)).numpy(), "nhwc")
        elif runtime == "saved_model":
            path = os.path.join(folder, "saved_model")
            write_saved_model(classifier, path)
            built[runtime] = (SavedModelRunner(path).predict, "nhwc")
        elif runtime == "tflite_matmuls_only":  # the floor: every op but the products free
            import matmul_floor

            # The products the export computes: its last block's on the tokens the head reads.
            shapes = matmul_floor.matmul_shapes(
                peer, IMAGE_SIZE, reads=getattr(classifier.forward, "reads", None)
            )
            run_products = matmul_floor.litert_runner(matmul_floor.matmuls_only_flatbuffer(*shapes), THREADS)

            def run_floor(images, run=run_products):
                return [run() for _ in images]

            run_floor.gflop = matmul_floor.flops(*shapes) / 1e9
            built[runtime] = (run_floor, "nhwc")
        elif runtime.startswith("tflite_"):
            variant = runtime.removeprefix("tflite_")
            calibration = None
            if variant in tflite.INTEGER_VARIANTS:
                calibration = tflite.Calibration(classifier, calibration_images, int8_input="float32")
            built[runtime] = (_litert(tflite.convert(classifier, variant, calibration)), "nhwc")
        elif runtime == "onnxruntime_timm":
            built[runtime] = (_onnxruntime(peer, folder), "nchw")
        elif runtime == "torch_timm":

            def run_torch(x):
                with torch.inference_mode():
                    return peer(torch.from_numpy(x))

            built[runtime] = (run_torch, "nchw")
        else:
            raise ValueError(f"unknown runtime {runtime!r}")
    return built


def inference(name, runtime_names, rounds, batch_sizes=(1,)):
    """Latency (batch 1, ms) and throughput (batch 32, images/s), sides alternating, medians."""
    rng = np.random.default_rng(0)
    images = {b: rng.uniform(0, 255, (b, IMAGE_SIZE, IMAGE_SIZE, 3)).astype("float32") for b in batch_sizes}
    # timm's input: the same pixels, channels first, on timm's [0, 1] scale.
    peer_images = {b: (x.transpose(0, 3, 1, 2) / 255.0).astype("float32") for b, x in images.items()}
    calibration = rng.uniform(0, 255, (8, IMAGE_SIZE, IMAGE_SIZE, 3)).astype("float32")
    with tempfile.TemporaryDirectory() as folder:
        built = runtimes(name, folder, runtime_names, calibration)
        results = {runtime: {} for runtime in built}
        for runtime, (run, _) in built.items():
            if hasattr(run, "gflop"):  # the products alone: their FLOPs
                results[runtime]["gflop"] = run.gflop
        for batch in batch_sizes:
            calls = {
                runtime: (lambda r=run, x=(images if layout == "nhwc" else peer_images)[batch]: r(x))
                for runtime, (run, layout) in built.items()
            }
            for call in calls.values():  # compiles, allocates
                call()
                call()
            seconds = {runtime: [] for runtime in calls}
            repeats = 10 if batch == 1 else 1
            for _ in range(rounds):
                for runtime, call in calls.items():
                    seconds[runtime].append(median_seconds(call, repeats=repeats, warmup=0))
            for runtime, times in seconds.items():
                if batch == 1:
                    results[runtime]["batch1_ms"] = 1000 * statistics.median(times)
                    # Each round's own median: sides timed back to back, for ratios per round.
                    results[runtime]["batch1_ms_rounds"] = [1000 * t for t in times]
                else:
                    results[runtime][f"batch{batch}_images_per_second"] = batch / statistics.median(times)
    return results
