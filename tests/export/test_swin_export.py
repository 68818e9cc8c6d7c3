"""A Swin through export: every format and the float and dynamic-range TFLite variants verified
against Keras, builtin ops only with no transpose above 5-D (the shift is slices and a
concatenation, not ROLL), MediaPipe's ImageClassifier reading it, `--attention` refused, and the
Swin's own quantisation op groups and integer recipes."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_vit
from keras_vit.cli import main
from keras_vit.data import datasets as data
from keras_vit.export import quantize, tflite, tflite_graph
from keras_vit.export.exporter import export_model
from keras_vit.inference.runtimes import open_model
from keras_vit.model.registry import FAMILIES

# A 16x16 grid in windows of 4: shifted blocks with masks in stages 0 and 1, a stage whose grid is
# its window (no shift), and a 2x2 last stage attended as one window. Few blocks: each is traced
# once per format.
TINY_SWIN = dict(
    image_size=64, patch_size=4, embed_dim=16, depths=(2, 2, 1, 1), num_heads=(1, 2, 2, 4), window_size=4
)


@pytest.fixture(scope="module")
def swin_export(tmp_path_factory):
    class_names = list(data.load_dataset("cifar10-mini").class_names)
    keras.utils.set_random_seed(0)
    model = keras_vit.Swin(
        **TINY_SWIN, num_classes=len(class_names), class_names=class_names,
        image_mean=[0.5] * 3, image_std=[0.25] * 3, name="tiny_swin",
    )  # fmt: skip
    path = tmp_path_factory.mktemp("swin") / "tiny_swin.keras"
    model.save(path)
    manifest = export_model(
        str(path), output=str(tmp_path_factory.mktemp("exports")), quantize=("dynamic",),
        dataset="cifar10-mini", verify_images=40,
    )  # fmt: skip
    return str(path), manifest


def test_every_swin_export_meets_its_target_with_builtin_ops_and_transposes_of_5d_at_most(swin_export):
    _, manifest = swin_export
    results = manifest["verification"]["results"]
    assert set(results) == {"saved_model", "tflite_fp32", "tflite_dynamic", "onnx"}
    for name in ("saved_model", "tflite_fp32", "onnx"):
        assert results[name]["meets_target"], (name, results[name])
    assert results["tflite_fp32"]["max_abs_difference"] < 1e-4
    # Dynamic-range int8 on a random model's near-uniform probabilities: close, and its top-1 may
    # flip on near-ties, which the report then says.
    dynamic = results["tflite_dynamic"]
    assert dynamic["max_abs_difference"] < 5e-3
    assert dynamic["meets_target"] == (dynamic["top1_agreement"] >= 0.99)
    # XNNPACK takes every op of the float graph and of dynamic-range int8's (the cyclic shift is
    # slices, not SPLIT_V, which XNNPACK refuses): one partition, nothing left to LiteRT's kernels.
    for name in ("tflite_fp32", "tflite_dynamic"):
        assert results[name]["ops_outside_xnnpack"] == 0 and results[name]["xnnpack_ops"] > 0, results[name]
    for variant in ("fp32", "dynamic"):
        flatbuffer = open(os.path.join(manifest["folder"], f"model_{variant}.tflite"), "rb").read()
        tflite.check_builtin_ops(flatbuffer)
        operators = tflite_graph.operators(flatbuffer)
        assert "ROLL" not in operators and not [op for op in operators if op.startswith("Flex")]
        assert tflite_graph.transpose_ranks(flatbuffer) and max(tflite_graph.transpose_ranks(flatbuffer)) <= 5


def test_mediapipe_reads_the_swin_and_names_litert_s_top1(swin_export):
    mp = pytest.importorskip("mediapipe")
    from mediapipe.tasks.python import BaseOptions, vision

    _, manifest = swin_export
    path = os.path.join(manifest["folder"], "model_fp32.tflite")
    runner = open_model(path)
    pairs = list(data.load_dataset("cifar10-mini")["test"].to_dataset().take(5).as_numpy_iterator())
    options = vision.ImageClassifierOptions(base_options=BaseOptions(model_asset_path=path), max_results=3)
    with vision.ImageClassifier.create_from_options(options) as classifier:
        for encoded, _ in pairs:
            # At the model's size, so that MediaPipe resizes nothing: the same pixels as LiteRT's.
            pixels = tf.image.resize(tf.io.decode_png(encoded, channels=3), (64, 64)).numpy().round()
            pixels = pixels.clip(0, 255).astype(np.uint8)
            result = classifier.classify(mp.Image(image_format=mp.ImageFormat.SRGB, data=pixels))
            top = result.classifications[0].categories[0]
            probabilities = runner.predict(pixels[None].astype(np.float32))[0]
            assert top.category_name == runner.class_names[top.index]  # names from the packed labels
            assert probabilities[top.index] == pytest.approx(float(probabilities.max()), abs=1e-6)
            assert top.score == pytest.approx(float(probabilities.max()), abs=1e-5)


def test_attention_maps_are_refused_for_a_swin_in_one_line(swin_export, tmp_path, capsys):
    path, _ = swin_export
    assert main(["export", path, "--format", "tflite", "--attention", "--output", str(tmp_path)]) == 1
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "no global attention map" in error


def test_every_swin_quantisation_group_and_layer_selects_ops_of_the_swin(swin_export):
    """The Swin's op groups (`SwinFamily.quantization_groups`) find ops by the names its layers
    give them in the converted model; a renamed layer fails here, not in a recipe that quantises
    nothing. The out projections are the blocks' FULLY_CONNECTED that are neither QKV nor MLP."""
    _, manifest = swin_export
    flatbuffer = open(os.path.join(manifest["folder"], "model_fp32.tflite"), "rb").read()
    family = FAMILIES["swin"]
    blocks = sum(TINY_SWIN["depths"])
    shifted = 2  # the second block of stages 0 and 1
    counts = {
        group: quantize.matching_ops(flatbuffer, rules) for group, rules in quantize.groups(family).items()
    }
    assert counts["QKV projections"] == counts["out projections"] == blocks
    assert counts["MLP projections"] == 2 * blocks and counts["residual adds"] == 2 * blocks
    assert counts["patch merging reduction"] == len(TINY_SWIN["depths"]) - 1
    # Two slices and a concatenation per axis, shifting and shifting back; then the mask's add.
    assert counts["shift and mask"] == shifted * (2 * 2 * 3 + 1)
    assert all(counts.values()), counts
    layers, _ = family.layer_groups(keras_vit.Swin(**TINY_SWIN))
    for layer in layers:
        assert quantize.matching_ops(flatbuffer, quantize.layer_rules(layer)) > 0, layer


def _fully_connected(flatbuffer):
    """`(output name, input type, kernel type, kernel name)` of each FULLY_CONNECTED."""
    return [
        (
            graph.Tensors(op.Outputs(0)).Name().decode(),
            graph.Tensors(op.Inputs(0)).Type(),
            graph.Tensors(op.Inputs(1)).Type(),
            graph.Tensors(op.Inputs(1)).Name().decode(),
        )
        for name, op, graph in tflite_graph.ops(flatbuffer)
        if name == "FULLY_CONNECTED"
    ]


def test_the_swin_s_own_recipes_dynamic_range_and_static_int8_projections_with_no_rotation(swin_export):
    """The Swin's sensitivity table (docs/benchmarks/int8.md) gives it recipes of its own: plain
    dynamic-range int8 in every projection, and for `int8` static int8 activations in the blocks'
    projections and patch merging's reduction, the head and the patch embedding in float. No
    Hadamard rotation (the ViT's): a Swin's residual stream has no outlier channel to spread."""
    from ai_edge_litert import schema_py_generated as schema

    _, manifest = swin_export
    folder = manifest["folder"]
    recipes = quantize.recipes(FAMILIES["swin"])
    # The 16-bit base, as every family's (each family's groups find its own ops).
    assert FAMILIES["swin"].quantization_recipes["int16x8"] == FAMILIES["vit"].quantization_recipes["int16x8"]
    dynamic = open(os.path.join(folder, "model_dynamic.tflite"), "rb").read()
    layers = _fully_connected(dynamic)
    blocks = sum(TINY_SWIN["depths"])
    assert len(layers) == 4 * blocks + len(TINY_SWIN["depths"]) - 1 + 1  # blocks, reductions, head
    for output, given, kernel, kernel_name in layers:
        assert "hadamard" not in kernel_name
        assert (given, kernel) == (schema.TensorType.FLOAT32, schema.TensorType.INT8), output
    float_model = open(os.path.join(folder, "model_fp32.tflite"), "rb").read()
    images = np.random.default_rng(0).uniform(0, 255, (8, 64, 64, 3)).astype(np.float32)
    ranges = quantize.calibrate(float_model, images, "float32")
    int8 = quantize.quantize(float_model, recipes["int8"], ranges)
    tflite.check_builtin_ops(int8)
    static = [layer for layer in _fully_connected(int8) if layer[1] == schema.TensorType.INT8]
    assert len(static) == 4 * blocks + len(TINY_SWIN["depths"]) - 1
    assert all(kernel == schema.TensorType.INT8 and "hadamard" not in name for _, _, kernel, name in static)
    assert not [output for output, *_ in static if "/head" in output]
    convolutions = [(op, g) for name, op, g in tflite_graph.ops(int8) if name == "CONV_2D"]
    assert [g.Tensors(op.Inputs(1)).Type() for op, g in convolutions] == [schema.TensorType.FLOAT32]
    assert np.abs(_probabilities(int8, images) - _probabilities(float_model, images)).max() < 0.05


def _probabilities(flatbuffer, images):
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=flatbuffer)
    interpreter.allocate_tensors()
    given, output = interpreter.get_input_details()[0], interpreter.get_output_details()[0]
    results = []
    for image in images:
        interpreter.set_tensor(given["index"], image[None])
        interpreter.invoke()
        results.append(interpreter.get_tensor(output["index"])[0])
    return np.stack(results)
