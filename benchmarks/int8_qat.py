"""Int8 weights fine-tuned for the model's output (issue 49, eleventh pass): does a short
quantisation-aware fine-tune against fp32's own probabilities, on unlabelled photos, cut the
rounding's flips by the factor 99% needs?

The student is a copy of the real ViT-Ti whose Dense kernels (QKV, proj, fc1, fc2, head) are
rounded to int8 per output channel in the forward pass (symmetric min/max, as
`int8_weights.round_to_nearest` and ai-edge-quantizer's weights) with a straight-through
gradient; only those kernels train, by Adam on the KL divergence from the fp32 model's
probabilities (the teacher, frozen). The photos are unlabelled and none is scored: CIFAR-10's
training images (32 px, up-sampled by the model's own transform) and the 100 calibration photos,
mirrored at random. Scored as `int8_weights.py` scores: the kernels rounded to nearest, float
activations, flips and KL against fp32 on the 3,825 photos calibration did not use.

    unzip ../shared/datasets/imagenette2_224_val.zip -d /tmp/imagenette
    unzip ../shared/datasets/cifar10_png.zip -d /tmp/cifar10
    HF_HUB_OFFLINE=1 python benchmarks/int8_qat.py --dataset /tmp/imagenette/imagenette2_224/val \\
        --unlabelled /tmp/cifar10/cifar10/train --images 10000

One JSON line per scoring; docs/benchmarks/int8.md reports them.
"""

import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from int8_rotation import MODEL, keras_probabilities, photos, read  # noqa: E402
from keras import ops  # noqa: E402

import keras_vit  # noqa: E402
from keras_vit.data import images as image_files  # noqa: E402
from keras_vit.export.adaround import LEVELS  # noqa: E402
from keras_vit.export.dynamic_range import dense_layers, kl_divergence  # noqa: E402


def fake_quantised(layer):
    """`layer` (a Dense, changed in place) computing with its kernel rounded to int8 per output
    channel, the gradient passed straight through the rounding to the float kernel."""

    def call(inputs, training=None):
        kernel = layer.kernel
        scale = ops.maximum(ops.max(ops.abs(kernel), axis=0), 1e-12) / LEVELS
        rounded = ops.clip(ops.round(kernel / scale), -LEVELS, LEVELS) * scale
        x = ops.matmul(inputs, kernel + ops.stop_gradient(rounded - kernel))
        if layer.use_bias:
            x = x + layer.bias
        return layer.activation(x) if layer.activation is not None else x

    layer.call = call


def score(student, images, reference):
    """Flips and KL against fp32: the student's fake-quantised forward pass is that of its
    kernels rounded to nearest."""
    probabilities = keras_probabilities(student, images)
    flips = int((probabilities.argmax(1) != reference.argmax(1)).sum())
    kl = kl_divergence(reference, probabilities)
    return {"flips": flips, "agreement": 1 - flips / len(images), "kl": kl}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", required=True, help="a folder of ImageNet class folders (wnids)")
    parser.add_argument("--unlabelled", required=True, help="a folder of images (searched recursively)")
    parser.add_argument("--unlabelled-count", type=int, default=6000)
    parser.add_argument("--calibration", type=int, default=100)
    parser.add_argument("--images", type=int, default=1000, help="scored photos (more than there are: all)")
    parser.add_argument("--steps", type=int, default=1200)
    parser.add_argument("--score-every", type=int, default=400)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--learning-rate", type=float, default=2e-6)
    arguments = parser.parse_args()

    teacher = keras_vit.create_model(MODEL, pretrained=True)
    student = teacher.__class__.from_config(teacher.get_config())
    student.set_weights(teacher.get_weights())
    calibration_paths, scored_paths = photos(arguments.dataset, arguments.calibration, arguments.images)
    images = read(teacher, scored_paths)
    reference = keras_probabilities(teacher, images)
    unlabelled_paths = sorted(image_files.image_files(arguments.unlabelled, recursive=True))
    chosen = np.random.default_rng(1).permutation(len(unlabelled_paths))[: arguments.unlabelled_count]
    unlabelled = read(teacher, [unlabelled_paths[i] for i in chosen])
    pool = np.concatenate([unlabelled, read(teacher, calibration_paths)])
    print(json.dumps({"images": len(images), "pool": len(pool)}), flush=True)

    for layer in dense_layers(student):
        fake_quantised(layer)
    kernels = [layer.kernel for layer in dense_layers(student)]
    optimizer = keras.optimizers.Adam(arguments.learning_rate)
    optimizer.build(kernels)

    @tf.function(jit_compile=True)
    def step(batch):
        target = ops.softmax(teacher(batch, training=False))
        with tf.GradientTape() as tape:
            logits = student(batch, training=False)
            loss = ops.mean(ops.sum(target * (ops.log(target + 1e-12) - ops.log_softmax(logits)), axis=-1))
        optimizer.apply_gradients(zip(tape.gradient(loss, kernels), kernels, strict=True))
        return loss

    print(json.dumps({"step": 0, **score(student, images, reference)}), flush=True)
    rng = np.random.default_rng(0)
    start, losses = time.perf_counter(), []
    for i in range(1, arguments.steps + 1):
        batch = pool[rng.choice(len(pool), arguments.batch_size, replace=False)]
        mirrored = rng.random(len(batch)) < 0.5
        batch[mirrored] = batch[mirrored, :, ::-1]
        losses.append(float(step(tf.constant(batch))))
        if i % arguments.score_every == 0 or i == arguments.steps:
            row = {"step": i, "train_kl": float(np.mean(losses[-50:])), **score(student, images, reference)}
            row["seconds"] = round(time.perf_counter() - start, 1)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
