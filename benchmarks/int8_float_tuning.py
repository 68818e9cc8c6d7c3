"""Tuning what a dynamic-range file keeps in float, end to end (issue 49, sixteenth pass).

A dynamic-range FULLY_CONNECTED holds int8 weight levels, one float scale per output channel and
a float bias: once the levels are chosen (`int8_weights.py`'s recipes), each channel's scale and
each bias can still move at no cost in the file. Here they learn, with Adam, to bring the
int8-simulated model's probabilities (every Dense input quantised as the file does, a
straight-through gradient) back to the float model's on the calibration photos (KL divergence).
About 21,000 numbers on the real ViT-Ti, against 100 photos of 1,000 probabilities each.
"""

import keras
import numpy as np
import tensorflow as tf
from int8_weights import straight_through_inputs

from keras_vit.export.dynamic_range import dense_layers


def tune_scales_and_biases(
    model, calibration, reference, dynamic=".*", steps=300, batch=8, learning_rate=1e-3, seed=0, log=None
):
    """Moves each Dense layer's per-channel scale (a factor on its kernel's columns) and its bias
    so that `model`'s softmax on `calibration` nears `reference` (the float model's probabilities
    there); assigns them. The kernels' levels stay: each column only scales."""
    layers = dense_layers(model)
    factors = [tf.Variable(np.zeros(layer.kernel.shape[1]), dtype="float32") for layer in layers]
    shifts = [tf.Variable(np.zeros(layer.bias.shape), dtype="float32") for layer in layers]
    variables = factors + shifts
    optimizer = keras.optimizers.Adam(learning_rate)
    optimizer.build(variables)
    kernels = [tf.constant(np.asarray(layer.kernel)) for layer in layers]
    biases = [tf.constant(np.asarray(layer.bias)) for layer in layers]

    @tf.function
    def step(images, target):
        with tf.GradientTape() as tape:
            mapping = []
            for layer, kernel, bias, factor, shift in zip(
                layers, kernels, biases, factors, shifts, strict=True
            ):
                # exp: a scale stays positive; the bias moves in the layer's output units
                mapping += [(layer.kernel, kernel * tf.exp(factor)), (layer.bias, bias + shift)]
            with keras.StatelessScope(state_mapping=mapping), straight_through_inputs(dynamic):
                logits = model(images, training=False)
            log_probabilities = tf.nn.log_softmax(logits)
            loss = tf.reduce_mean(
                tf.reduce_sum(target * (tf.math.log(target + 1e-12) - log_probabilities), -1)
            )
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables, strict=True))
        return loss

    rng = np.random.default_rng(seed)
    losses = []
    for index in range(1, steps + 1):
        chosen = rng.choice(len(calibration), batch, replace=False)
        losses.append(float(step(tf.constant(calibration[chosen]), tf.constant(reference[chosen]))))
        if log and index % 25 == 0:
            log({"step": index, "calibration_kl": float(np.mean(losses[-25:]))})
    for layer, kernel, bias, factor, shift in zip(layers, kernels, biases, factors, shifts, strict=True):
        layer.kernel.assign(kernel * tf.exp(factor))
        layer.bias.assign(bias + shift)
