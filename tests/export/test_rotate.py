"""The residual stream rotated offline (`keras_vit.export.rotate`): exact in float, outliers spread."""

import tempfile

import keras
import numpy as np
import pytest
from conftest import TINY

import keras_vit
from keras_vit.export import rotate


def _random_vit(seed=0, outlier=0.0, **arguments):
    """A tiny ViT with every weight random (LayerNorm scales around 1, shifts around 0), so that
    each fold has something to fold; `outlier` is added to one channel of the patch projection's
    bias, a residual-stream outlier as the real ViT-Ti's."""
    model = keras_vit.ViT(**{**TINY, **arguments}, image_mean=[0.5] * 3, image_std=[0.25] * 3)
    rng = np.random.default_rng(seed)
    for weight in model.weights:
        value = 0.3 * rng.standard_normal(weight.shape) + weight.path.endswith("gamma")
        weight.assign(value.astype("float32"))
    if outlier:
        bias = model.get_layer("patch_encoder").projection.bias
        bias.assign(bias.numpy() + outlier * np.eye(TINY["hidden_dim"])[3])
    return model


def _images(count=4):
    return np.random.default_rng(1).uniform(0, 255, (count, 32, 32, 3)).astype("float32")


def _probabilities(model, images):
    return keras.ops.convert_to_numpy(keras.ops.softmax(model(images, training=False), axis=-1))


@pytest.mark.parametrize("n", [8, 12, 32, 192, 384, 768])
def test_hadamard_is_orthonormal_with_a_constant_first_row(n):
    matrix = rotate.hadamard(n)
    np.testing.assert_allclose(matrix @ matrix.T, np.eye(n), atol=1e-12)
    np.testing.assert_allclose(np.abs(matrix), 1 / np.sqrt(n))
    np.testing.assert_allclose(matrix[0], 1 / np.sqrt(n))


@pytest.mark.parametrize("n", [32, 192, 10])  # 10: no Hadamard, a random orthogonal basis
def test_rotations_are_orthogonal(n):
    flat, keeping = rotate.rotation(n, seed=3), rotate.rotation(n, seed=3, keep_mean=True)
    for q in (flat, keeping):
        np.testing.assert_allclose(q @ q.T, np.eye(n), atol=1e-12)
        assert np.abs(q).max() < 0.9  # no channel stays where it was
    np.testing.assert_allclose(keeping @ np.ones(n), np.ones(n), atol=1e-12)
    if n != 10:  # a randomised Hadamard: every channel spread evenly over all
        np.testing.assert_allclose(np.abs(flat), 1 / np.sqrt(n))


@pytest.mark.parametrize(
    "arguments",
    [
        {},
        {"class_token": False, "register_tokens": 2, "pooling": "gap"},
        {"register_tokens": 1, "layer_scale": 0.5, "distillation_token": True},
        {"pooling": "gap", "norm_before_pooling": False, "cls_position_embedding": False},
    ],
    ids=["cls", "registers-gap", "layer-scale-distilled", "fc-norm"],
)
@pytest.mark.parametrize("norm", rotate.NORMS)
def test_rotated_copy_gives_the_same_probabilities(arguments, norm):
    model = _random_vit(**arguments)
    before = [w.copy() for w in model.get_weights()]
    images = _images()
    rotated = rotate.rotated_copy(model, seed=1, norm=norm)
    assert isinstance(rotated.get_layer("norm"), rotate.RMSNorm) == (norm == "rms")
    assert not isinstance(model.get_layer("norm"), rotate.RMSNorm)
    np.testing.assert_allclose(_probabilities(rotated, images), _probabilities(model, images), atol=1e-5)
    assert not np.allclose(rotated.get_weights()[2], model.get_weights()[2])  # other weights
    for kept, weight in zip(before, model.get_weights(), strict=True):  # the user's model untouched
        np.testing.assert_array_equal(kept, weight)


def test_rotation_spreads_an_outlier_channel_of_the_residual_stream():
    model = _random_vit(outlier=300.0)
    rotated = rotate.rotated_copy(model)
    images = _images()

    def stream(m):
        return keras.ops.convert_to_numpy(keras.Model(m.inputs, m.get_layer("block_1").output)([images]))

    before, after = np.abs(stream(model)).max(axis=(0, 1)), np.abs(stream(rotated)).max(axis=(0, 1))
    assert before.max() > 10 * np.median(before)  # one channel far above the rest
    assert after.max() < 3 * np.median(after)
    assert after.max() < before.max() / 3


def test_the_stream_is_mean_free_without_rotation():
    model = _random_vit(outlier=50.0)
    invariant = rotate.rotated_copy(model, rotate=np.eye(TINY["hidden_dim"]), norm="layer")
    output = keras.Model(invariant.inputs, invariant.get_layer("block_0").output)([_images()])
    assert np.abs(keras.ops.convert_to_numpy(output).mean(axis=-1)).max() < 1e-4
    np.testing.assert_allclose(
        _probabilities(invariant, _images()), _probabilities(model, _images()), atol=1e-5
    )


def test_layer_norm_needs_a_rotation_that_keeps_the_mean():
    with pytest.raises(ValueError, match="keep the mean"):
        rotate.rotated_copy(_random_vit(), rotate=rotate.rotation(TINY["hidden_dim"]), norm="layer")


def test_an_uncovered_vit_is_refused_by_name():
    model = keras_vit.ViT(**TINY, pre_norm=True)
    with pytest.raises(rotate.UnsupportedModelError, match="pre_norm"):
        rotate.rotated_copy(model)


def test_l2_norms_convert_to_one_integer_tflite_op_each():
    import tensorflow as tf

    from keras_vit.export import tflite, tflite_graph
    from keras_vit.inference.classifier import load_classifier

    model = rotate.rotated_copy(_random_vit(depth=1), norm="l2")
    images = _images()
    with tempfile.TemporaryDirectory() as folder:
        converter = tflite._converter(load_classifier(model), folder)
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = lambda: ([image[None]] for image in images)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        flatbuffer = converter.convert()
    names = [name for name, _, _ in tflite_graph.ops(flatbuffer)]
    assert names.count("L2_NORMALIZATION") == 3  # norm1, norm2 and the final norm
    assert "RSQRT" not in names and "MEAN" not in names
    assert tflite_graph.float_ops(flatbuffer) == []


def _with_massive_tokens(tokens, size=400.0, **arguments):
    """A tiny random ViT whose stream carries `tokens` (positions) at about `size` times the
    others' size, the real ViT-Ti's corner tokens in small: a large position embedding there."""
    model = _random_vit(**{"depth": 3, **arguments})
    embedding = model.get_layer("patch_encoder").position_embedding
    value = embedding.numpy()
    value[..., tokens, :] *= size
    embedding.assign(value)
    return model


@pytest.mark.parametrize("norm", ["rms", "l2"])
@pytest.mark.parametrize("units", [(), (3, 40)], ids=["tokens", "tokens-and-units"])
@pytest.mark.parametrize(
    "arguments",
    [{}, {"class_token": False, "register_tokens": 2, "pooling": "gap", "norm_before_pooling": True}],
    ids=["cls", "gap"],
)
def test_massive_tokens_scaled_give_the_same_probabilities(norm, units, arguments):
    model = _random_vit(depth=3, **arguments)
    images = _images()
    copy = rotate.with_massive_tokens(
        rotate.rotated_copy(model, seed=2, norm=norm), tokens=[1, 5], block=1, units=units
    )
    assert isinstance(copy.blocks[2], rotate.TokenScaledBlock)
    assert not isinstance(model.blocks[2], rotate.TokenScaledBlock)
    np.testing.assert_allclose(_probabilities(copy, images), _probabilities(model, images), atol=1e-5)
    stream = keras.Model(copy.inputs, copy.blocks[1].output)([images])
    unscaled = rotate.rotated_copy(model, seed=2, norm=norm)
    plain = keras.Model(unscaled.inputs, unscaled.blocks[1].output)([images])
    rms = np.sqrt((keras.ops.convert_to_numpy(stream) ** 2).mean(-1))
    original = np.sqrt((keras.ops.convert_to_numpy(plain) ** 2).mean(-1))
    np.testing.assert_allclose(rms[:, [1, 5]], original[:, [1, 5]] / 32, rtol=1e-4)  # scaled
    np.testing.assert_allclose(rms[:, [0, 2]], original[:, [0, 2]], rtol=1e-4)  # kept


def test_massive_tokens_and_units_are_found_from_the_photos():
    model = _with_massive_tokens([2, 9])
    bias = model.blocks[1].fc1.bias
    bias.assign(bias.numpy() + 100.0 * np.eye(TINY["mlp_dim"])[7])  # hidden unit 7 at about 100
    model = rotate.rotated_copy(model, norm="l2")
    images = _images(8)
    assert rotate.massive_tokens(model, images, block=0).tolist() == [2, 9]
    assert rotate.massive_units(model, images, 1, limit=32.0).tolist() == [7]


def test_massive_tokens_scaled_fit_one_int8_scale_with_the_others():
    """What the rewrite is for: after it, one per-tensor int8 scale of the stream (its max |x|
    over 127) leaves the ordinary tokens many steps, where before the massive ones took them."""
    model = _with_massive_tokens([2, 9], size=1000.0)
    images = _images(8)
    plain = rotate.rotated_copy(model, norm="l2")
    tokens = rotate.massive_tokens(plain, images, block=0)
    scaled = rotate.with_massive_tokens(rotate.rotated_copy(model, norm="l2"), tokens, block=0)

    def steps(copy, block):  # the ordinary tokens' median RMS in int8 steps of the stream
        stream = keras.ops.convert_to_numpy(keras.Model(copy.inputs, copy.blocks[block].output)([images]))
        ordinary = np.delete(stream, tokens, axis=1)
        return np.median(np.sqrt((ordinary**2).mean(-1))) / (np.abs(stream).max() / 127)

    assert tokens.tolist() == [2, 9]
    for block in (0, 2):
        assert steps(plain, block) < 3  # the massive tokens take the scale
        assert steps(scaled, block) > 8 * steps(plain, block)
    np.testing.assert_allclose(_probabilities(scaled, images), _probabilities(model, images), atol=1e-5)


def test_massive_tokens_and_units_convert_to_a_full_integer_tflite_model():
    import tensorflow as tf

    from keras_vit.export import tflite, tflite_graph
    from keras_vit.inference.classifier import load_classifier

    images = _images()

    def full_integer(model):
        with tempfile.TemporaryDirectory() as folder:
            converter = tflite._converter(load_classifier(model), folder)
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
            converter.representative_dataset = lambda: ([image[None]] for image in images)
            converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
            flatbuffer = converter.convert()
        assert tflite_graph.float_ops(flatbuffer) == []
        return [name for name, _, _ in tflite_graph.ops(flatbuffer)]

    model = _random_vit(depth=2)
    plain = full_integer(rotate.rotated_copy(model, norm="l2"))
    copy = rotate.with_massive_tokens(rotate.rotated_copy(model, norm="l2"), [1, 5], block=0, units=[3, 7])
    names = full_integer(copy)

    # the split MLP: fc1 and fc2 twice in block 0; the scales: MULs in both blocks
    def matmuls(found):
        return found.count("FULLY_CONNECTED") + found.count("BATCH_MATMUL")

    assert matmuls(names) == matmuls(plain) + 2
    assert names.count("MUL") >= plain.count("MUL") + 4


@pytest.mark.parametrize("norm", ["l2", "layer"])
def test_per_head_attention_gives_the_same_probabilities(norm):
    model = _random_vit(depth=2)
    images = _images()
    copy = rotate.with_per_head_attention(rotate.rotated_copy(model, norm=norm))
    assert isinstance(copy.blocks[1].attention, rotate.PerHeadAttention)
    np.testing.assert_allclose(_probabilities(copy, images), _probabilities(model, images), atol=1e-5)


@pytest.mark.parametrize(
    "arguments, groups",
    [
        ({"mlp_dim": 128}, [64, 64]),  # two blocks of 64 per token
        ({"mlp_dim": 96, "mlp": "swiglu"}, [32, 32]),  # 96 = 3 x 32: the largest power of two
        ({"block": "res_post"}, [64, 64]),
        ({"block": "parallel"}, [None, None]),  # no fc2 of its own: left as it is
    ],
)
def test_rotated_inputs_give_the_same_probabilities_and_leave_the_model_alone(arguments, groups):
    model = _random_vit(**arguments)
    weights = [np.array(weight) for weight in model.weights]
    images = _images()
    copy = rotate.with_rotated_inputs(model, ("fc2",))
    np.testing.assert_allclose(_probabilities(copy, images), _probabilities(model, images), atol=1e-6)
    assert [getattr(getattr(block, "fc2", None), "hadamard_group", None) for block in copy.blocks] == groups
    assert all(np.array_equal(a, np.array(b)) for a, b in zip(weights, model.weights, strict=True))
    assert not any(isinstance(getattr(b, "fc2", None), rotate.HadamardInputDense) for b in model.blocks)


def test_the_vits_dynamic_range_variants_rotate_fc2s_input_in_the_graph_in_float():
    """`dynamic` of a ViT (and `int8` of one `export.rotated_int8` does not cover, no QKV bias):
    each block's fc2 reads its input through a float FULLY_CONNECTED (the Hadamard) and is itself
    int8 without ai-edge-quantizer's rotation before it; the other projections keep theirs; the
    probabilities stay near fp32's."""
    from ai_edge_litert.interpreter import Interpreter

    from keras_vit.export import tflite, tflite_graph
    from keras_vit.inference.classifier import load_classifier

    images = _images()
    for variant, options in (("dynamic", {}), ("int8", dict(qkv_bias=False))):
        classifier = load_classifier(_random_vit(mlp_dim=128, **options))
        calibration = tflite.Calibration(classifier, images, "uint8")
        reference = _probabilities(classifier.model, images)
        flatbuffer = tflite.convert(classifier, variant, calibration)
        products = {}  # output tensor name -> weight type, for every FULLY_CONNECTED
        for name, op, graph in tflite_graph.ops(flatbuffer):
            if name == "FULLY_CONNECTED":
                products[graph.Tensors(op.Outputs(0)).Name().decode()] = graph.Tensors(op.Inputs(1)).Type()
        float32, int8 = 0, 9  # TFLite's TensorType
        hadamards = [weight for name, weight in products.items() if "/hadamard/" in name]
        fc2 = [weight for name, weight in products.items() if "/fc2" in name and "/rotated_input/" in name]
        assert hadamards == [float32, float32] and fc2 == [int8, int8], (variant, products)
        online = [name for name in products if name.endswith("_rotated")]  # ai-edge-quantizer's
        assert len(online) == 2 * 3 + 1  # QKV, proj and fc1 of each block, and the head: not fc2
        probabilities = []
        interpreter = Interpreter(model_content=flatbuffer)
        interpreter.allocate_tensors()
        given, output = interpreter.get_input_details()[0], interpreter.get_output_details()[0]
        for image in images:
            interpreter.set_tensor(given["index"], image[None].astype(given["dtype"]))
            interpreter.invoke()
            probabilities.append(interpreter.get_tensor(output["index"])[0])
        assert np.abs(np.array(probabilities) - reference).max() < 0.05, variant
    # Both quantised the rewritten copy: the original's fp32 model was never converted for them.
    assert "float_model" not in vars(calibration)
