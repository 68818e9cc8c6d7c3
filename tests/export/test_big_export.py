"""Models over a format's 2 GiB: TFLite refused in one line before any work, ONNX written with
external data, the SavedModel unlimited (its weights live outside its graph). The limit is lowered
for a tiny ViT; the real one refuses a ViT-H by name without reading a weight."""

import json
import os
import time

import keras
import numpy as np
import onnx
import onnxruntime
import pytest
from conftest import TINY
from tensorflow.core.protobuf import saved_model_pb2

import keras_vit
from keras_vit.cli import main
from keras_vit.data import datasets as data
from keras_vit.export import exporter, onnx_model
from keras_vit.inference.classifier import load_classifier
from keras_vit.storage.export_folder import MANIFEST_FILE, ONNX_FILE


@pytest.fixture(scope="module")
def tiny_model_file(tmp_path_factory):
    keras.utils.set_random_seed(0)
    class_names = list(data.load_dataset("cifar10-mini").class_names)
    model = keras_vit.ViT(**TINY, class_names=class_names, name="tiny_vit")
    path = tmp_path_factory.mktemp("model") / "tiny.keras"
    model.save(path)
    return str(path), model.count_params()


def _everything_under(folder):
    return sorted(os.path.relpath(os.path.join(root, name), folder) for root, dirs, files in os.walk(folder)
                  for name in dirs + files)  # fmt: skip


def test_a_tflite_export_over_the_limit_is_refused_in_one_line_and_writes_nothing(
    tiny_model_file, tmp_path, monkeypatch, capsys
):
    path, parameters = tiny_model_file
    monkeypatch.setattr(exporter, "FORMAT_SIZE_LIMIT", 4 * parameters - 1)  # fp32 one byte over
    output = tmp_path / "exports"
    code = main(
        ["export", path, "--output", str(output), "--format", "saved_model,tflite,onnx", "--no-verify"]
    )
    error = capsys.readouterr().err.strip()
    assert code == 1
    assert len(error.splitlines()) == 1 and "Traceback" not in error
    assert f"its TFLite fp32 model would be about {4 * parameters / 1e3:.2f} kB" in error
    assert f"{parameters:,} weights x 4 bytes" in error and "flatbuffers' limit" in error
    assert "--format saved_model,onnx" in error
    assert not output.exists()  # refused before the staging folder: nothing at all


def test_a_pretrained_giant_is_refused_by_its_name_in_a_second_without_reading_a_weight(tmp_path, capsys):
    # deit3_huge_patch14_224: 632M weights, 2.5 GB in float32, against the real limit. No weights
    # are downloaded or cached here: the refusal comes from the parameter formula alone.
    output = tmp_path / "exports"
    start = time.perf_counter()
    code = main(["export", "deit3_huge_patch14_224.fb_in1k", "--output", str(output), "--format", "tflite",
                 "--no-verify"])  # fmt: skip
    elapsed = time.perf_counter() - start
    error = capsys.readouterr().err.strip()
    assert code == 1 and len(error.splitlines()) == 1
    assert "TFLite fp32 model would be about 2.53 GB (632," in error and "limit of 2.15 GB" in error
    assert elapsed < 5, elapsed
    assert not output.exists()


def test_onnx_over_the_limit_is_written_with_external_data_and_agrees_with_keras(
    tiny_model_file, tmp_path, monkeypatch, capsys
):
    path, parameters = tiny_model_file
    monkeypatch.setattr(exporter, "FORMAT_SIZE_LIMIT", 4 * parameters - 1)
    manifest = exporter.export_model(
        path, output=str(tmp_path), formats=("saved_model", "onnx"), dataset="cifar10-mini", verify_images=20
    )
    folder = manifest["folder"]
    assert manifest["verification"]["passed"], manifest["table"]
    assert manifest["verification"]["results"]["onnx"]["max_abs_difference"] <= 1e-4
    data_name = os.path.basename(onnx_model.data_file(ONNX_FILE))
    assert {ONNX_FILE, data_name} <= set(os.listdir(folder))
    assert data_name in json.load(open(os.path.join(folder, MANIFEST_FILE)))["files"]
    assert not [e for e in os.listdir(os.path.dirname(folder)) if e.startswith(".partial")]
    # The weights are in the data file, the graph alone in model.onnx.
    model_bytes = os.path.getsize(os.path.join(folder, ONNX_FILE))
    assert os.path.getsize(os.path.join(folder, data_name)) > 4 * parameters * 0.9 > model_bytes
    proto = onnx.load(os.path.join(folder, ONNX_FILE), load_external_data=False)
    external = [t for t in proto.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert external and {e.value for t in external for e in t.external_data if e.key == "location"} == {
        data_name
    }
    # `keras-vit verify` reads it again from the export folder.
    assert main(["verify", folder, "--limit", "10", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["results"]["onnx"]["meets_target"]
    # Read by ONNX Runtime from the folder, as any user would, against Keras.
    size = TINY["image_size"]
    images = np.random.default_rng(0).uniform(0, 255, (4, size, size, 3)).astype("float32")
    session = onnxruntime.InferenceSession(
        os.path.join(folder, ONNX_FILE), providers=["CPUExecutionProvider"]
    )
    expected = np.asarray(load_classifier(path).probabilities(images))
    np.testing.assert_allclose(session.run(None, {"images": images})[0], expected, atol=1e-5)


def test_the_saved_model_keeps_its_weights_outside_its_graph(tiny_model_file, tmp_path, monkeypatch):
    """No format limit for the SavedModel: every weight is a variable in variables/, none a
    constant folded into saved_model.pb (whose protobuf is what 2 GiB would bound)."""
    path, parameters = tiny_model_file
    monkeypatch.setattr(exporter, "FORMAT_SIZE_LIMIT", 4 * parameters - 1)
    exporter.export_model(path, output=str(tmp_path), formats=("saved_model",), verify=False)
    saved_model = tmp_path / "tiny_vit" / "1"
    proto = saved_model_pb2.SavedModel.FromString((saved_model / "saved_model.pb").read_bytes())
    graph = proto.meta_graphs[0].graph_def
    nodes = list(graph.node) + [n for f in graph.library.function for n in f.node_def]
    constant_bytes = sum(len(n.attr["value"].tensor.tensor_content) for n in nodes if n.op == "Const")
    assert constant_bytes < 4 * parameters / 10, constant_bytes
    variables = sum(os.path.getsize(p) for p in (saved_model / "variables").iterdir())
    assert variables > 4 * parameters


def test_an_onnx_export_that_fails_midway_leaves_no_partial_file(tiny_model_file, tmp_path, monkeypatch):
    path, parameters = tiny_model_file
    monkeypatch.setattr(exporter, "FORMAT_SIZE_LIMIT", 4 * parameters - 1)
    write = onnx_model.write

    def write_then_crash(classifier, target, external_data=False):
        write(classifier, target, external_data=external_data)  # model.onnx and model.onnx.data written
        raise OSError("the machine went down")

    monkeypatch.setattr(onnx_model, "write", write_then_crash)
    with pytest.raises(OSError, match="went down"):
        exporter.export_model(path, output=str(tmp_path), formats=("onnx",), verify=False)
    assert _everything_under(tmp_path / "tiny_vit") == []


def test_an_onnx_optimizer_that_fails_in_place_falls_back_to_tf2onnx_default_and_still_agrees(
    tiny_model_file, monkeypatch
):
    """tf2onnx's optimizers run in place (fast); one that raises there is skipped as tf2onnx's own
    default skips it, on a second conversion, and the model still answers as Keras does."""
    from tf2onnx import optimizer

    calls = []

    class FailsInPlace(optimizer.TransposeOptimizer):
        def optimize(self, graph, iteration):
            calls.append(os.environ.get(onnx_model.CATCH_ERRORS))
            if os.environ.get(onnx_model.CATCH_ERRORS) == "FALSE":
                raise RuntimeError("this optimizer breaks on the graph itself")
            return super().optimize(graph, iteration)

    monkeypatch.setitem(optimizer._optimizers, "optimize_transpose", FailsInPlace)
    monkeypatch.delenv(onnx_model.CATCH_ERRORS, raising=False)
    classifier = load_classifier(tiny_model_file[0])
    session = onnxruntime.InferenceSession(onnx_model.convert(classifier))
    assert calls[0] == "FALSE" and None in calls  # in place first, then tf2onnx's default
    assert onnx_model.CATCH_ERRORS not in os.environ  # the process's environment as it was
    images = (
        np.random.default_rng(0)
        .uniform(0, 255, (2, TINY["image_size"], TINY["image_size"], 3))
        .astype(np.float32)
    )
    (onnx_answers,) = session.run(None, {"images": images})
    np.testing.assert_allclose(onnx_answers, classifier.probabilities(images), atol=1e-5)
