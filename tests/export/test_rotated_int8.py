"""The ViT family's `int8` (`export.rotated_int8`): the rewritten copy, its AdaRound kernels
(`export.adaround`), the dynamic-range simulation they are rounded under
(`export.dynamic_range`), and the file `keras-vit export --quantize int8` makes of them."""

import logging
import re

import keras
import numpy as np
import pytest
from conftest import TINY, TINY_MODEL, correlated_layer, tflite_outputs

import keras_vit
from keras_vit.export import adaround, dynamic_range, rotate, rotated_int8, tflite, tflite_graph
from keras_vit.inference.classifier import load_classifier
from keras_vit.model.vit.classify import classifier_forward

TINY_ARCHITECTURE = dict(patch_size=4, **TINY_MODEL)
IMAGES = np.random.default_rng(1).uniform(0, 255, (12, 32, 32, 3)).astype(np.float32)


def _tiny(massive_block=None, **options):
    """The tests' tiny ViT (normalised pixels in [0, 255]); with `massive_block`, one MLP unit of
    that block made massive (fc1's column and bias, fc2's row scaled alike: the same model up to
    GELU's bend, and an fc2 input far above `MASSIVE_UNIT`, as the real ViT-Ti's block 7)."""
    keras.utils.set_random_seed(1)
    model = keras_vit.ViT(**{**TINY, **options}, image_mean=[0.5] * 3, image_std=[0.25] * 3, name="tiny_vit")
    if massive_block is not None:
        block = model.blocks[massive_block]
        kernel, bias = np.asarray(block.fc1.kernel).copy(), np.asarray(block.fc1.bias).copy()
        kernel[:, 0], bias[0] = 200 * np.abs(kernel).max(), 100.0
        block.fc1.kernel.assign(kernel)
        block.fc1.bias.assign(bias)
    return model


def _fully_connected(flatbuffer):
    """`{output tensor name: (kernel type, input type)}` of every FULLY_CONNECTED."""
    from ai_edge_litert import schema_py_generated as schema

    names = {schema.TensorType.INT8: "int8", schema.TensorType.FLOAT32: "float32"}
    found = {}
    for name, op, graph in tflite_graph.ops(flatbuffer):
        if name == "FULLY_CONNECTED":
            kernel, given = graph.Tensors(op.Inputs(1)), graph.Tensors(op.Inputs(0))
            found[graph.Tensors(op.Outputs(0)).Name().decode()] = (names[kernel.Type()], names[given.Type()])
    return found


def test_the_int8_export_is_the_recipes_keras_simulation_with_its_float_layers_and_hadamard_in_float():
    """`keras-vit export --quantize int8` of a ViT the rewrite covers: uint8 pixels in, every
    FULLY_CONNECTED int8 by int8 with its float input quantised at run time (dynamic range) but
    the recipe's float layers and fc2's Hadamard in the block with a massive unit; the file's
    probabilities are the Keras simulation's (`dynamic_range.dynamic_inputs` on the rewritten
    copy) far nearer than fp32's; and the export, deterministic, writes the same bytes twice."""
    model = _tiny(massive_block=1)
    classifier = load_classifier(model)
    made = rotated_int8.int8_model(model, IMAGES)
    assert made.hadamard_blocks == (1,)
    last = model.blocks[-1]
    free = {f"{last.path}/attention/proj", f"{last.path}/fc1", f"{last.path}/fc2"}
    assert free <= set(made.float_layers) and len(made.float_layers) == len(free) + 1  # a fifth of 6
    assert isinstance(made.model.blocks[1].fc2, rotate.HadamardInputDense)
    assert type(made.model.blocks[0]) is rotated_int8.ClsTwiceMlpBlock
    assert type(model.blocks[0]) is not rotated_int8.ClsTwiceMlpBlock  # the user's model untouched

    flatbuffer = tflite.convert(classifier, "int8", tflite.Calibration(classifier, IMAGES, "uint8"))
    tflite.check_builtin_ops(flatbuffer)
    layers = _fully_connected(flatbuffer)
    float_ops = {name for name, kinds in layers.items() if kinds == ("float32", "float32")}
    dynamic = {name for name, kinds in layers.items() if kinds == ("int8", "float32")}
    assert float_ops | dynamic == set(layers)
    assert sum("/hadamard/" in name for name in float_ops) == 1
    pattern = "|".join(rotated_int8.op_name_pattern(path) for path in made.float_layers)
    assert {name for name in float_ops if "/hadamard/" not in name} == {
        name for name in layers if re.search(pattern, name) and "/hadamard/" not in name
    }
    assert len(dynamic) >= 4 * TINY["depth"] + 1 - len(made.float_layers)  # [cls] rows twice: more

    probabilities, given, _ = tflite_outputs(flatbuffer, IMAGES)
    assert given == np.uint8
    fp32 = keras.ops.convert_to_numpy(keras.ops.softmax(model(np.round(IMAGES))))
    with dynamic_range.dynamic_inputs(dynamic_range.all_inputs_but(made.float_layers)):
        simulated = dynamic_range.probabilities(made.model, np.round(IMAGES))
    assert np.abs(probabilities - simulated).max() < np.abs(probabilities - fp32).max() / 3
    again = tflite.convert(classifier, "int8", tflite.Calibration(classifier, IMAGES, "uint8"))
    assert again == flatbuffer


@pytest.mark.parametrize(
    "options, reason",
    [
        (dict(qkv_bias=False), "no QKV bias"),
        (dict(mlp="swiglu"), "gated MLP"),
        (dict(block="res_post"), "pre-norm"),
    ],
)
def test_a_vit_the_rewrite_does_not_cover_gets_the_familys_rules_and_says_so(options, reason, caplog):
    """No QKV bias to take LayerNorm's shift, a gated MLP, a post-norm block: `int8` falls back to
    the family's rules (each projection's input rotated, dynamic-range int8), and logs why."""
    model = _tiny(**options)
    with pytest.raises(rotate.UnsupportedModelError, match=reason):
        rotated_int8.int8_model(model, IMAGES)
    classifier = load_classifier(model)
    with caplog.at_level(logging.INFO, logger="keras_vit.export.tflite"):
        flatbuffer = tflite.convert(classifier, "int8", tflite.Calibration(classifier, IMAGES, "uint8"))
    assert any(reason in record.getMessage() for record in caplog.records)
    layers = _fully_connected(flatbuffer)
    assert any("hadamard" in name.lower() for name in layers)  # the rules' rotations, in float
    probabilities, _, _ = tflite_outputs(flatbuffer, IMAGES)
    fp32 = keras.ops.convert_to_numpy(keras.ops.softmax(model(np.round(IMAGES))))
    assert np.abs(probabilities - fp32).max() < 0.05


def test_the_split_mlp_quantises_the_cls_row_twice_and_its_error_falls_tenfold():
    """`ClsTwiceMlpBlock`: under `dynamic_range.dynamic_inputs`, fc1 and fc2 quantising the [cls]
    row twice bring its MLP output ten times nearer the float one than quantising once, and leave
    the other rows as they were; with both layers in `once` the block is left a plain one."""
    model = _tiny()
    block = rotate.rotated_copy(model).blocks[0]
    x = keras.ops.convert_to_tensor(
        np.random.default_rng(2).normal(size=(1, 5, TINY["hidden_dim"])), "float32"
    )
    exact = keras.ops.convert_to_numpy(block._mlp(x))
    with dynamic_range.dynamic_inputs():
        once = keras.ops.convert_to_numpy(block._mlp(x))
        split = rotated_int8.with_cls_twice_mlp(rotate.rotated_copy(model))
        twice = keras.ops.convert_to_numpy(split.blocks[0]._mlp(x))
    assert np.abs(twice[:, 0] - exact[:, 0]).max() < np.abs(once[:, 0] - exact[:, 0]).max() / 10
    np.testing.assert_allclose(twice[:, 1:], once[:, 1:], atol=1e-6)
    kept = rotate.rotated_copy(model)
    rotated_int8.with_cls_twice_mlp(kept, once={kept.blocks[0].fc1.path, kept.blocks[0].fc2.path})
    assert type(kept.blocks[0]) is not rotated_int8.ClsTwiceMlpBlock
    assert type(kept.blocks[1]) is rotated_int8.ClsTwiceMlpBlock


def test_the_massive_unit_blocks_are_those_whose_fc2_input_exceeds_the_limit():
    """`massive_unit_blocks` on the rotated copy (which leaves fc2's inputs as they were)."""
    plain, massive = _tiny(), _tiny(massive_block=0)
    assert rotated_int8.massive_unit_blocks(rotate.rotated_copy(plain), IMAGES) == []
    assert rotated_int8.massive_unit_blocks(rotate.rotated_copy(massive), IMAGES) == [0]


def test_adaround_rounds_each_weight_down_or_up_and_closer_to_the_outputs_than_rounding_to_nearest():
    """AdaRound keeps every weight on its channel's int8 grid, one of the two steps around it, and
    on correlated inputs changes the layer's outputs less than round-to-nearest does."""
    x, kernel, scale = correlated_layer()
    nearest = adaround.round_to_nearest(kernel)
    rounded = adaround.adaround(kernel, x.T @ x / len(x))
    steps = rounded / scale
    assert np.allclose(steps, np.round(steps), atol=1e-3) and np.abs(np.round(steps)).max() <= 127
    assert np.all(np.abs(np.round(steps) - kernel / scale) < 1)  # down or up, never further
    assert np.mean(np.round(steps) != np.round(kernel / scale)) > 0.01  # it chose, not copied
    error = lambda w: np.mean((x @ (w - kernel)) ** 2)  # noqa: E731
    assert error(rounded) < 0.5 * error(nearest)


def test_adaround_given_the_drift_of_its_inputs_rounds_against_the_error_upstream():
    """`seq-adaround`'s rounding: when the layer's inputs come from a model already rounded (here
    1% too large, and noisier), the `drift` term makes AdaRound aim at the float model's outputs,
    and it lands far closer to them than the rounding that assumes its inputs exact."""
    x, kernel, _ = correlated_layer()
    upstream = x * 1.01 + 0.02 * np.random.default_rng(1).normal(size=x.shape)
    hessian, cross = upstream.T @ upstream / len(x), upstream.T @ x / len(x)
    error = lambda w: np.mean((upstream @ w - x @ kernel) ** 2)  # noqa: E731
    blind = adaround.adaround(kernel, hessian)
    aimed = adaround.adaround(kernel, hessian, drift=(hessian - cross) @ kernel)
    assert error(aimed) < 0.5 * error(blind)


def test_sequential_adaround_rounds_a_vits_kernels_in_order_closer_to_its_float_outputs():
    """`seq-adaround` on a ViT, its Dense inputs quantised as dynamic range does: every kernel on
    its int8 grid, and the model's logits nearer the float model's than with every kernel rounded
    to nearest under the same activations."""
    keras.utils.set_random_seed(0)
    model = keras_vit.create_model("vit_tiny_patch16_224", image_size=32, num_classes=10, **TINY_ARCHITECTURE)
    images = np.random.default_rng(0).uniform(-1, 1, (16, 32, 32, 3)).astype("float32")
    exact = keras.ops.convert_to_numpy(model(images))
    float_weights = model.get_weights()
    float_model = keras_vit.create_model(
        "vit_tiny_patch16_224", image_size=32, num_classes=10, **TINY_ARCHITECTURE
    )
    float_model.set_weights(float_weights)

    def logits_error():
        with dynamic_range.dynamic_inputs():
            return np.mean((keras.ops.convert_to_numpy(model(images)) - exact) ** 2)

    for layer in dynamic_range.dense_layers(model):
        layer.kernel.assign(adaround.round_to_nearest(np.asarray(layer.kernel, np.float64)))
    nearest = logits_error()
    model.set_weights(float_weights)
    adaround.sequential_adaround(model, float_model, images, steps=300, dynamic=".*")
    for layer in dynamic_range.dense_layers(model):
        steps = np.asarray(layer.kernel, np.float64) / adaround.channel_scale(np.asarray(layer.kernel))
        assert np.allclose(steps, np.round(steps), atol=1e-3), layer.path
    assert logits_error() < 0.8 * nearest


def test_sequential_adaround_leaves_the_kept_kernels_float_and_rounds_the_rest():
    """`kept`: the layers `kept` (those whose FULLY_CONNECTED stays
    float in the file) keep their kernels to the bit; every other kernel lands on its int8 grid."""
    keras.utils.set_random_seed(0)
    model = keras_vit.create_model("vit_tiny_patch16_224", image_size=32, num_classes=10, **TINY_ARCHITECTURE)
    images = np.random.default_rng(0).uniform(-1, 1, (4, 32, 32, 3)).astype("float32")
    layers = dynamic_range.dense_layers(model)
    float_model = keras_vit.create_model(
        "vit_tiny_patch16_224", image_size=32, num_classes=10, **TINY_ARCHITECTURE
    )
    float_model.set_weights(model.get_weights())
    kept = {layers[0].path, layers[-1].path}
    before = {layer.path: np.asarray(layer.kernel).copy() for layer in layers}
    adaround.sequential_adaround(model, float_model, images, steps=20, dynamic=".*", kept=kept)
    for layer in layers:
        kernel = np.asarray(layer.kernel)
        if layer.path in kept:
            np.testing.assert_array_equal(kernel, before[layer.path])
        else:
            steps = kernel.astype(np.float64) / adaround.channel_scale(kernel)
            assert np.allclose(steps, np.round(steps), atol=1e-3), layer.path
            assert not np.array_equal(kernel, before[layer.path]), layer.path


def test_the_last_blocks_row_layers_are_those_the_classifiers_export_runs_on_the_cls_row_alone():
    """`last_block_row_layers` are the ones the export's forward
    (`classify.classifier_forward`) feeds one token's row: their float kernels cost one row's product."""

    keras.utils.set_random_seed(0)
    model = keras_vit.create_model("vit_tiny_patch16_224", image_size=32, num_classes=10, **TINY_ARCHITECTURE)
    rows = {}

    def record(layer, inputs):
        rows[layer.path] = int(np.prod(inputs.shape[:-1]))
        return inputs

    image = np.zeros((32, 32, 3), "float32")
    with dynamic_range.dense_inputs_mapped(record):
        classifier_forward(model)(image[None])
    one_row = {path for path, count in rows.items() if count == 1}
    head = dynamic_range.dense_layers(model)[-1].path  # the classifier
    free = rotated_int8.last_block_row_layers(model, image)
    assert one_row == {*free, head}
    assert all(path.startswith(model.blocks[-1].path) for path in free)
    last = model.blocks[-1]
    assert sorted(free) == sorted(layer.path for layer in (last.attention.proj, last.fc1, last.fc2))
    pooled = keras_vit.create_model(
        "vit_tiny_patch16_224", image_size=32, num_classes=10, pooling="gap", **TINY_ARCHITECTURE
    )
    assert rotated_int8.last_block_row_layers(pooled, image) == []  # its head reads every token


def test_the_free_float_layers_take_none_of_the_ranked_places():
    """`float_layer_choice`: K layers that cost time, the dearest, plus the free ones,
    even when a free one ranks among the dearest."""
    scores = {"block_0/fc1": 5, "block_11/fc2": 4, "block_0/fc2": 3, "block_1/fc1": 2, "block_11/fc1": 1}
    free = ["block_11/fc1", "block_11/fc2"]
    assert rotated_int8.float_layer_choice(scores, 2, free) == ["block_0/fc1", "block_0/fc2", *free]
    assert rotated_int8.float_layer_choice(scores, 2) == ["block_0/fc1", "block_11/fc2"]


def test_a_dense_input_is_the_full_forwards_and_the_layers_after_it_do_not_run():
    """`dynamic_range.dense_input` (what the rounding sums its statistics from, batch by batch):
    the rows a full forward pass records for that layer, and no Dense layer after it runs."""
    model = _tiny()
    images = np.round(IMAGES[:3])
    layers = dynamic_range.dense_layers(model)
    paths = [layer.path for layer in layers]
    full = dynamic_range.dense_input_rows(model, images, paths)
    order = list(full)  # the forward pass's order
    for path in (order[1], order[-1]):
        np.testing.assert_array_equal(dynamic_range.dense_input(model, images, path), full[path])
    ran = []
    with dynamic_range.dense_inputs_mapped(lambda layer, inputs: ran.append(layer.path) or inputs):
        dynamic_range.dense_input(model, images, order[1])
    assert ran == order[:1]  # the first layer ran; the recorded one stopped the pass before its product
    with pytest.raises(ValueError, match="No Dense layer"):
        dynamic_range.dense_input(model, images, "block_9/fc1")


def test_the_input_ranking_starts_each_pass_at_its_blocks_input_and_equals_the_full_forwards():
    """`dynamic_range.input_sensitivity` runs each layer's pass from the input of the block that
    holds it: the same divergences as a full forward pass per layer, to the bit, every Dense layer
    ranked once, in the model's order."""
    model = rotate.rotated_copy(_tiny())
    images = np.round(IMAGES[:6])
    ranked = dynamic_range.input_sensitivity(model, images)
    reference = dynamic_range.probabilities(model, images)
    full = {}
    for layer in dynamic_range.dense_layers(model):
        with dynamic_range.dynamic_inputs(f"^{re.escape(layer.path)}$"):
            quantised = dynamic_range.probabilities(model, images)
        full[layer.path] = dynamic_range.kl_divergence(reference, quantised)
    assert list(ranked) == list(full) and ranked == full
    assert max(ranked.values()) > 0
