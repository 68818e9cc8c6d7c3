"""Export: the TF Serving SavedModel, TFLite variants with MediaPipe metadata, ONNX, and verification."""

import base64
import io
import json
import os
import re
import subprocess
import sys
import zipfile

import keras
import numpy as np
import onnx
import pytest
import tensorflow as tf
from conftest import HANG_SECONDS, TINY

import keras_vit
from keras_vit.cli import main
from keras_vit.data import datasets as data
from keras_vit.export import tflite, tflite_graph
from keras_vit.export.exporter import QUANTIZATIONS, export_model, next_version, recommended_variant
from keras_vit.inference.classifier import load_classifier
from keras_vit.inference.runtimes import open_model
from keras_vit.inference.tflite_metadata import read_metadata
from keras_vit.storage.export_folder import BATCHING_FILE, LICENSE_FILE, ONNX_FILE

VENV_BIN = os.path.dirname(sys.executable)


@pytest.fixture(scope="module")
def cifar_images():
    """Real CIFAR-10 test images from the embedded dataset: (encoded bytes, label) pairs."""
    folder = data.load_dataset("cifar10-mini")
    pairs = list(folder["test"].to_dataset().take(1000).as_numpy_iterator())
    return [pairs[i] for i in range(0, 500, 50)], list(folder.class_names)


@pytest.fixture(scope="module")
def tiny_model_file(tmp_path_factory, cifar_images):
    _, class_names = cifar_images
    keras.utils.set_random_seed(
        0
    )  # the same weights every run: a quantized variant's top-1 on near-ties is too
    model = keras_vit.ViT(
        **TINY,
        image_mean=[0.5] * 3,
        image_std=[0.25] * 3,
        class_names=class_names,
        name="tiny_vit",
        license="cc-by-nc-4.0",  # as a fine-tune of a non-commercial checkpoint keeps it
    )
    path = tmp_path_factory.mktemp("model") / "tiny.keras"
    model.save(path)
    return str(path)


@pytest.fixture(scope="module")
def exported(tiny_model_file, tmp_path_factory):
    """Every format and every TFLite variant of the tiny model, verified on 100 held-out images."""
    output = tmp_path_factory.mktemp("exports")
    manifest = export_model(
        tiny_model_file, output=str(output), quantize=QUANTIZATIONS, dataset="cifar10-mini",
        verify_images=100, calibration_images=50,
    )  # fmt: skip
    return manifest


def test_the_layout_is_what_tf_serving_expects_and_versions_are_never_overwritten(exported, tiny_model_file):
    home = os.path.dirname(exported["folder"])
    assert os.path.basename(home) == "tiny_vit"
    assert os.path.exists(os.path.join(home, "1", "saved_model.pb"))
    files = set(os.listdir(exported["folder"]))
    for variant in tflite.VARIANTS:
        assert f"model_{variant}.tflite" in files
    assert {"model.tflite", "model.onnx", "labels.txt", "export.json", "verification.json"} <= files
    assert not [entry for entry in os.listdir(home) if entry.startswith(".partial")]
    before = open(os.path.join(home, "1", "saved_model.pb"), "rb").read()
    # TF Serving's --batching_parameters_file, beside the versions: a text proto of its fields.
    batching = os.path.join(home, BATCHING_FILE)
    fields = dict(re.findall(r"^(\w+)\W+(?:value: )?(\w+)", open(batching).read(), re.M))
    assert fields == {
        "max_batch_size": "32", "batch_timeout_micros": "2000", "max_enqueued_batches": "100",
        "num_batch_threads": "4", "pad_variable_length_inputs": "false",
    }  # fmt: skip
    with open(batching, "a") as f:
        f.write("# tuned by hand\n")

    second = export_model(
        tiny_model_file, output=os.path.dirname(home), formats=("saved_model",), quantize=(), verify=False
    )
    assert second["version"] == 2 and next_version(home) == 3
    assert sorted(os.listdir(home)) == ["1", "2", BATCHING_FILE, "export-1", "export-2"]
    assert open(os.path.join(home, "1", "saved_model.pb"), "rb").read() == before
    assert open(batching).read().endswith("# tuned by hand\n")  # a user's tuning is kept


def test_every_export_meets_its_agreement_target_except_where_the_report_says_so(exported):
    report = exported["verification"]
    assert report["split"] == "test" and report["count"] == 100
    results = report["results"]
    assert set(results) == {"saved_model", "onnx"} | {f"tflite_{v}" for v in tflite.VARIANTS}
    for name in ("saved_model", "onnx", "tflite_fp32"):
        assert results[name]["max_abs_difference"] < 1e-4, name
        assert results[name]["top1_agreement"] == 1.0
    assert results["tflite_fp16"]["max_abs_difference"] < 1e-2
    for result in results.values():
        assert result["meets_target"] == (not result["failures"])
    assert report["passed"] == all(r["meets_target"] for r in results.values())
    table = open(os.path.join(exported["folder"], "verification.md")).read()
    assert "tflite_int8" in table and "max abs diff" in table


def test_tflite_models_hold_only_builtin_ops_and_a_static_batch_of_one(exported):
    for variant in tflite.VARIANTS:
        flatbuffer = open(os.path.join(exported["folder"], f"model_{variant}.tflite"), "rb").read()
        tflite.check_builtin_ops(flatbuffer)
        assert not [op for op in tflite_graph.operators(flatbuffer) if op.startswith("Flex")]
        runner = open_model(os.path.join(exported["folder"], f"model_{variant}.tflite"))
        assert list(runner.input_details["shape"]) == [1, 32, 32, 3]
    for variant in ("int8", "int16x8"):
        assert open_model(os.path.join(exported["folder"], f"model_{variant}.tflite")).input_dtype == "uint8"
    # Integer from end to end: uint8 pixels in, uint8 probabilities out, no op in float.
    strict_path = os.path.join(exported["folder"], "model_int8_strict.tflite")
    strict = open_model(strict_path)
    assert strict.input_dtype == "uint8" and strict.output_details["dtype"] == np.uint8
    assert tflite_graph.float_ops(open(strict_path, "rb").read()) == []
    assert exported["verification"]["results"]["tflite_int8_strict"]["float_ops"] == 0
    assert exported["verification"]["results"]["tflite_fp32"]["float_ops"] > 50


def test_the_report_counts_the_ops_xnnpack_takes_and_those_left_to_litert(exported):
    results = exported["verification"]["results"]
    fp32 = results["tflite_fp32"]
    assert fp32["xnnpack_ops"] > 50 and fp32["ops_outside_xnnpack"] == 0  # XNNPACK runs all of fp32
    # XNNPACK has no 16-bit integer type: int16x8's 16-bit ops stay on LiteRT's kernels.
    assert results["tflite_int16x8"]["ops_outside_xnnpack"] > 0
    for name, result in results.items():
        if name.startswith("tflite_"):
            flatbuffer = open(os.path.join(exported["folder"], result["file"]), "rb").read()
            ops = len(list(tflite_graph.ops(flatbuffer)))
            assert result["xnnpack_ops"] + result["ops_outside_xnnpack"] == ops, name
    table = open(os.path.join(exported["folder"], "verification.md")).read()
    assert f"| {fp32['xnnpack_ops']} / 0 |" in table


def test_a_flex_op_fails_the_check_and_names_the_op():
    @tf.function(input_signature=[tf.TensorSpec([1, 4], tf.float32)])
    def needs_flex(x):
        return tf.strings.to_number(tf.strings.as_string(x))  # no TFLite builtin for these

    function = needs_flex.get_concrete_function()
    converter = tf.lite.TFLiteConverter.from_concrete_functions([function], needs_flex)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS, tf.lite.OpsSet.SELECT_TF_OPS]
    with pytest.raises(tflite.UnsupportedOpError, match="FlexAsString"):
        tflite.check_builtin_ops(converter.convert())


def test_the_metadata_carries_labels_normalisation_and_the_transform(exported, cifar_images):
    _, class_names = cifar_images
    flatbuffer = open(os.path.join(exported["folder"], "model_fp32.tflite"), "rb").read()
    info = read_metadata(flatbuffer)
    assert info["labels"] == class_names and info["name"] == "tiny_vit"
    # The weights' licence, in every file a user ships: the .tflite, the .onnx, export.json and the
    # SavedModel's assets.
    assert info["license"] == exported["license"] == "cc-by-nc-4.0"
    onnx_props = {
        p.key: p.value for p in onnx.load(os.path.join(exported["folder"], "model.onnx")).metadata_props
    }
    assert onnx_props["license"] == "cc-by-nc-4.0"
    saved_model = os.path.join(os.path.dirname(exported["folder"]), str(exported["version"]), "assets")
    assert open(os.path.join(saved_model, LICENSE_FILE)).read() == "cc-by-nc-4.0\n"
    assert info["mean"] == [0.0] and info["std"] == [1.0]
    # keras-vit's own model: a plain bilinear resize to its size
    assert info["transform"] == {"crop_pct": 1.0, "crop_mode": "squash", "interpolation": "bilinear"}
    with zipfile.ZipFile(io.BytesIO(flatbuffer)) as archive:
        assert archive.namelist() == ["labels.txt", "transform.json"]
    with pytest.raises(ValueError, match="no metadata"):
        read_metadata(tflite.convert(load_classifier(exported["source"]), "fp32"))


@pytest.mark.parametrize("variant", ["fp32", "int8", "int16x8", "int8_strict"])
def test_mediapipe_image_classifier_names_the_same_top1_as_litert(exported, cifar_images, variant):
    mp = pytest.importorskip("mediapipe")
    from mediapipe.tasks.python import BaseOptions, vision

    pairs, class_names = cifar_images
    path = os.path.join(exported["folder"], f"model_{variant}.tflite")
    runner = open_model(path)
    options = vision.ImageClassifierOptions(base_options=BaseOptions(model_asset_path=path), max_results=10)
    with vision.ImageClassifier.create_from_options(options) as classifier:
        for encoded, _ in pairs:
            pixels = tf.io.decode_png(encoded, channels=3).numpy()
            result = classifier.classify(mp.Image(image_format=mp.ImageFormat.SRGB, data=pixels))
            categories = result.classifications[0].categories
            probabilities = runner.predict(pixels[None].astype(np.float32))[0]
            top = categories[0]
            assert top.category_name == class_names[top.index]  # names from the packed label file
            # The same top-1 (int8 probabilities come in steps of 1/256, so ties are broken either way).
            assert probabilities[top.index] == pytest.approx(float(probabilities.max()), abs=1e-6)
            assert top.score == pytest.approx(float(probabilities.max()), abs=1e-5)


_SERVING_CLIENT = """
import base64, json, sys
import tensorflow as tf
payload = json.loads(open(sys.argv[2]).read())
# TF Serving's REST layer base64-decodes {"b64": ...} for inputs whose name ends in _bytes.
images = [base64.b64decode(instance["b64"]) for instance in payload["instances"]]
model = tf.saved_model.load(sys.argv[1])
serve = model.signatures["serving_default"]
out = serve(image_bytes=tf.constant(images))
print(json.dumps([c.decode() for c in out["top_k_classes"].numpy()[:, 0]]))
try:
    serve(image_bytes=tf.constant([images[0], b"not an image at all"]))
    print("no error")
except tf.errors.InvalidArgumentError as error:
    print("error:", "image_bytes[1] is not a JPEG, PNG, GIF, BMP or WebP image" in str(error))
out = serve(image_bytes=tf.constant(images[:1]))
print(json.dumps([c.decode() for c in out["top_k_classes"].numpy()[:, 0]]))
"""


def test_the_serving_signature_takes_a_rest_payload_in_a_fresh_process(exported, cifar_images, tmp_path):
    """As TF Serving would run it: no keras_vit, the b64 payload, a bad image, then a good one again."""
    pairs, class_names = cifar_images
    saved_model = os.path.join(os.path.dirname(exported["folder"]), "1")
    jpegs = [tf.io.encode_jpeg(tf.io.decode_png(encoded), quality=95).numpy() for encoded, _ in pairs]
    payload = tmp_path / "request.json"
    payload.write_text(json.dumps({"instances": [{"b64": base64.b64encode(j).decode()} for j in jpegs]}))
    script = tmp_path / "client.py"
    script.write_text(_SERVING_CLIENT)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run(
        [sys.executable, str(script), saved_model, str(payload)],
        capture_output=True,
        text=True,
        env=env,
        timeout=HANG_SECONDS,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    first, error_line, again = result.stdout.strip().splitlines()[-3:]
    keras_runner = open_model(exported["source"])
    decoded = np.stack([tf.cast(tf.io.decode_jpeg(j), tf.float32).numpy() for j in jpegs])
    expected = [class_names[i] for i in keras_runner.predict(decoded).argmax(1)]
    assert json.loads(first) == expected
    assert error_line == "error: True"
    assert json.loads(again) == expected[:1]


def test_saved_model_cli_lists_both_signatures_and_runs_a_jpeg(exported, cifar_images, tmp_path):
    saved_model = os.path.join(os.path.dirname(exported["folder"]), "1")
    cli = os.path.join(VENV_BIN, "saved_model_cli")
    if not os.path.exists(cli):
        pytest.skip("saved_model_cli is not beside this Python")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    command = [cli, "show", "--dir", saved_model, "--all"]
    shown = subprocess.run(command, capture_output=True, text=True, env=env)
    assert "signature_def['serving_default']" in shown.stdout
    assert "signature_def['serving_images']" in shown.stdout
    assert "image_bytes" in shown.stdout and "top_k_classes" in shown.stdout

    pairs, class_names = cifar_images
    encoded, _ = pairs[0]
    jpeg = tf.io.encode_jpeg(tf.io.decode_png(encoded), quality=95).numpy()
    # A fixed-width bytes array (dtype S) saves without pickle; JPEGs end in FFD9, so no
    # trailing NUL is lost.
    np.save(tmp_path / "request.npy", np.array([jpeg]))
    run = subprocess.run(
        [
            cli,
            "run",
            "--dir",
            saved_model,
            "--tag_set",
            "serve",
            "--signature_def",
            "serving_default",
            "--inputs",
            f"image_bytes={tmp_path / 'request.npy'}",
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    expected = open_model(saved_model).predict_bytes([jpeg])["top_k_classes"][0, 0].decode()
    assert expected in run.stdout


def test_predict_reads_every_format_and_agrees(exported, cifar_images, tmp_path, capsys):
    pairs, _ = cifar_images
    paths = []
    for i, (encoded, _) in enumerate(pairs[:4]):
        paths.append(str(tmp_path / f"{i}.png"))
        open(paths[-1], "wb").write(encoded)
    folder = exported["folder"]
    models = [
        exported["source"],
        os.path.join(os.path.dirname(folder), "1"),
        os.path.join(folder, "model_fp32.tflite"),
        os.path.join(folder, "model.onnx"),
    ]
    answers = []
    for model in models:
        assert main(["predict", model, *paths, "--json", "--top-k", "3"]) == 0
        results = json.loads(capsys.readouterr().out)
        answers.append([r["top_k"][0]["class"] for r in results])
        assert all(len(r["top_k"]) == 3 for r in results)
    assert all(a == answers[0] for a in answers)


CLI_AND_LIST_FRAMEWORKS = """
import json, sys
import keras_vit_cli
code = keras_vit_cli.main(sys.argv[1:])
loaded = [name for name in ("tensorflow", "keras", "jax", "torch") if name in sys.modules]
print(json.dumps({"code": code, "loaded": loaded}))
"""


def test_predict_on_a_tflite_or_onnx_prints_only_its_answer_and_loads_no_framework(
    exported, cifar_images, tmp_path
):
    """A `.tflite` (or an export folder's) and an `.onnx` run on LiteRT and ONNX Runtime with a
    NumPy resize: no TensorFlow (4 s to import), no Keras; LiteRT's start-up lines stay off the
    output. A SavedModel loads TensorFlow, quietly. tests/training/test_jax_backend.py checks train,
    evaluate and export the same way."""
    from conftest import NATIVE_LOG_LINE

    image = tmp_path / "image.png"
    image.write_bytes(cifar_images[0][0][0])
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_CPP")}  # as a user's shell has it
    folder = exported["folder"]
    for model, tensorflow in (
        (os.path.join(folder, "model_fp32.tflite"), False),
        (folder, False),  # its model.tflite
        (os.path.join(folder, ONNX_FILE), False),
        (os.path.join(folder, exported["saved_model"]), True),
    ):
        command = [sys.executable, "-c", CLI_AND_LIST_FRAMEWORKS, "predict", model, str(image)]
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=HANG_SECONDS)
        answer, listed = result.stdout.splitlines()
        listed = json.loads(listed)
        assert listed["code"] == 0, (model, result.stderr[-2000:])
        assert ("tensorflow" in listed["loaded"]) == bool(listed["loaded"]) == tensorflow, listed
        assert answer.startswith(f"{image}: ") and not re.search(NATIVE_LOG_LINE, result.stderr), model

    command = [
        os.path.join(VENV_BIN, "keras-vit"),
        "predict",
        os.path.join(folder, "model_fp32.tflite"),
        str(image),
    ]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=HANG_SECONDS)
    assert result.returncode == 0 and result.stdout.startswith(f"{image}: ") and not result.stderr, (
        result.stderr
    )


def test_evaluate_scores_an_exported_file_on_the_images_its_export_was_verified_on(exported, capsys):
    """`keras-vit evaluate` takes any model file; an export folder remembers its dataset. A
    `.tflite` is scored without TensorFlow or Keras, as `predict` runs it."""
    assert main(["evaluate", exported["source"], "--json"]) == 0
    keras_score = json.loads(capsys.readouterr().out)
    tflite = os.path.join(exported["folder"], "model_fp32.tflite")
    command = [sys.executable, "-c", CLI_AND_LIST_FRAMEWORKS, "evaluate", tflite, "--json"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=HANG_SECONDS)
    assert result.returncode == 0, result.stderr[-2000:]
    printed, listed = result.stdout.rsplit("\n", 2)[:2]
    tflite_score = json.loads(printed)
    assert json.loads(listed) == {"code": 0, "loaded": []}
    assert tflite_score["dataset"] == keras_score["dataset"] and tflite_score["count"] == keras_score["count"]
    assert abs(tflite_score["top1"] - keras_score["top1"]) <= 1 / keras_score["count"]  # fp32: 1e-4 agreement
    report = json.load(open(os.path.join(exported["folder"], "evaluation.json")))  # beside the export
    assert report["top1"] == tflite_score["top1"]


def test_verify_reruns_the_checks_from_the_export_folder(exported, capsys):
    code = main(["verify", exported["folder"], "--limit", "20", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["count"] == 20
    assert code == (0 if report["passed"] else 1)
    assert json.load(open(os.path.join(exported["folder"], "verification.json")))["count"] == 20


def test_the_recommended_tflite_is_the_fastest_variant_within_target():
    results = {
        "tflite_fp32": {"latency_ms": 10.0, "meets_target": True},
        "tflite_fp16": {"latency_ms": 9.0, "meets_target": True},
        "tflite_dynamic": {"latency_ms": 5.0, "meets_target": True},
        "tflite_int8": {"latency_ms": 3.0, "meets_target": False},
    }
    assert recommended_variant(results) == "dynamic"
    results["tflite_dynamic"]["meets_target"] = False
    assert recommended_variant(results) == "fp16"
    results["tflite_fp16"]["latency_ms"] = 11.0
    assert recommended_variant(results) == "fp32"


def test_bad_export_requests_are_clear_errors(tiny_model_file, tmp_path, capsys):
    output = str(tmp_path / "out")
    assert main(["export", tiny_model_file, "--output", output]) == 1
    assert "pass --dataset" in capsys.readouterr().err
    assert main(["export", tiny_model_file, "--output", output, "--format", "coreml", "--no-verify"]) == 1
    assert "--format takes all or a comma list" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "missing.keras"), "--output", output, "--no-verify"]) == 1
    assert "Model not found" in capsys.readouterr().err
    broken = tmp_path / "broken.tflite"
    broken.write_bytes(b"this is not a model")
    assert main(["predict", str(broken), str(broken)]) == 1
    assert "not a TFLite model" in capsys.readouterr().err
    assert not os.path.exists(output) or not [e for e in os.listdir(output) if not e.startswith(".")]


def test_an_export_killed_at_any_point_leaves_no_version_tf_serving_would_load(tiny_model_file, tmp_path):
    """TF Serving loads every numeric folder: each one must always be a whole SavedModel."""
    import random
    import signal
    import time

    output = tmp_path / "exports"
    command = [
        sys.executable, "-m", "keras_vit", "export", tiny_model_file, "--output", str(output),
        "--format", "saved_model,tflite", "--quantize", "none", "--no-verify",
    ]  # fmt: skip
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    picker = random.Random(1)
    home = output / "tiny_vit"

    def check_versions():
        for entry in home.iterdir() if home.exists() else []:
            if entry.name.isdigit():
                assert (entry / "saved_model.pb").is_file() and (
                    entry / "variables" / "variables.index"
                ).is_file()
                assert "serving_default" in tf.saved_model.load(str(entry)).signatures
            else:
                assert entry.name.startswith((".partial-", "export-", BATCHING_FILE)), entry.name

    kills = 0
    for _ in range(2):
        process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(picker.uniform(4.0, 14.0))  # from TensorFlow's import to the last rename
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
            kills += 1
        process.wait()
        check_versions()
    assert kills >= 1, "every export finished before it could be killed"
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=HANG_SECONDS)
    assert done.returncode == 0, done.stderr[-2000:]
    check_versions()
    assert not [e for e in home.iterdir() if e.name.startswith(".partial-")]  # killed exports' staging: gone
    newest = max(int(e.name) for e in home.iterdir() if e.name.isdigit())
    assert (home / f"export-{newest}" / "model.tflite").is_file()


def test_every_runner_names_a_wrong_image_shape(exported):
    sources = [exported["source"], os.path.join(os.path.dirname(exported["folder"]), "1")]
    sources += [os.path.join(exported["folder"], name) for name in ("model_fp32.tflite", "model.onnx")]
    for source in sources:
        runner = open_model(source)
        with pytest.raises(ValueError, match=r"images of shape \(n, 32, 32, 3\), got \(1, 48, 48, 3\)"):
            runner.predict(np.zeros((1, 48, 48, 3), np.float32))
        with pytest.raises(ValueError, match=r"got \(32, 32, 3\)"):
            runner.predict(np.zeros((32, 32, 3), np.float32))


def test_the_keras_runner_traces_one_graph_for_every_batch_size(exported, cifar_images):
    runner = open_model(exported["source"])
    pixels = np.stack([tf.io.decode_png(encoded).numpy() for encoded, _ in cifar_images[0][:7]])
    pixels = pixels.astype(np.float32)
    eager = keras.ops.convert_to_numpy(runner.classifier.probabilities(pixels))
    np.testing.assert_allclose(runner.predict(pixels, batch_size=3), eager, atol=1e-6)  # batches 3, 3, 1
    np.testing.assert_allclose(runner.predict(pixels[:2]), eager[:2], atol=1e-6)
    assert runner._probabilities.experimental_get_tracing_count() == 1
    probabilities, maps = runner.predict_attention(pixels)
    np.testing.assert_allclose(probabilities, eager, atol=1e-6)
    assert maps.shape == (7, 8, 8)


def test_export_on_another_backend_says_to_use_tensorflow(tiny_model_file, tmp_path, monkeypatch):
    monkeypatch.setattr(keras.backend, "backend", lambda: "jax")
    with pytest.raises(ValueError, match="KERAS_BACKEND=tensorflow"):
        export_model(tiny_model_file, output=str(tmp_path / "exports"), verify=False)
    assert not (tmp_path / "exports").exists()  # refused before writing anything


def test_int8_on_a_dataset_smaller_than_its_calibration_calibrates_on_what_there_is(
    tiny_model_file, tmp_path
):
    """9 training images, 200 asked: once a StopIteration traceback. Said in one line, and the
    converter's own lines ("fully_quantize: 0, ...") stay off the output. (The model's weights
    do not matter to calibration: the module's untrained tiny ViT.)"""
    from conftest import NATIVE_LOG_LINE
    from PIL import Image

    rng = np.random.default_rng(0)
    for name in ("a", "b", "c"):
        os.makedirs(tmp_path / "small" / name)
        for i in range(3):
            pixels = rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / "small" / name / f"{i}.png")
    command = [
        os.path.join(VENV_BIN, "keras-vit"), "export", tiny_model_file, "--output",
        str(tmp_path / "exports"), "--format", "tflite", "--quantize", "int8", "--dataset",
        str(tmp_path / "small"), "--no-verify", "--json",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_CPP")}  # as a user's shell has it
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=HANG_SECONDS)
    assert result.returncode == 0, result.stderr[-2000:]
    calibrated, *converting = result.stderr.splitlines()
    assert 0 < int(re.search(r"on the (\d+) training images .* \(200 asked\)", calibrated).group(1)) < 9
    assert converting[:2] == ["Converting TFLite fp32 ...", "Converting TFLite int8 ..."], result.stderr
    assert len(converting) == 3 and converting[2].startswith("Rounding the int8 kernels of "), result.stderr
    assert not re.search(NATIVE_LOG_LINE, result.stderr)
    folder = json.loads(result.stdout)["folder"]
    assert os.path.exists(os.path.join(folder, "model_int8.tflite"))


def _jpeg_photos(folder, class_names, per_class=8):
    """cifar10-mini's test images as JPEG photos at 64x48 (so they are resized), half in train/,
    half in test/, a third stored sideways with an EXIF orientation that turns them upright, as
    cameras write them."""
    from PIL import Image

    pairs = data.load_dataset("cifar10-mini")["test"].to_dataset().as_numpy_iterator()
    counts = dict.fromkeys(range(len(class_names)), 0)
    for index, (encoded, label) in enumerate(pairs):
        if counts[label] == per_class:
            continue
        counts[label] += 1
        photo = Image.open(io.BytesIO(encoded)).convert("RGB").resize((64, 48), Image.BICUBIC)
        exif = Image.Exif()
        if index % 3 == 0:
            photo = photo.transpose(Image.Transpose.ROTATE_90)  # stored turned left
            exif[0x0112] = 6  # "turn right to view"
        split = folder / ("train", "test")[counts[label] % 2] / class_names[label]
        os.makedirs(split, exist_ok=True)
        photo.save(split / f"{index}.jpg", quality=90, exif=exif)
    return folder


def test_a_jpeg_dataset_exports_with_every_variant_meeting_its_target(
    tiny_model_file, cifar_images, tmp_path, capsys
):
    """Once the served SavedModel decoded JPEGs with the accurate DCT (as Pillow does), and
    training and the verification's reference with TensorFlow's fast one: 7e-3 apart, below
    target. Now one decode serves every path; sideways photos come upright in each."""
    from keras_vit.cli import main

    photos = _jpeg_photos(tmp_path / "photos", cifar_images[1])
    code = main([
        "export", tiny_model_file, "--output", str(tmp_path / "exports"), "--dataset", str(photos),
        "--verify-images", "40", "--json",
    ])  # fmt: skip
    captured = capsys.readouterr()
    assert captured.out, captured.err
    report = json.loads(captured.out)["verification"]
    assert report["count"] == 40
    failing = {name: r for name, r in report["results"].items() if not r["meets_target"]}
    assert code == 0 and not failing and report["passed"], (failing, captured.err)
    for name in ("saved_model", "onnx", "tflite_fp32"):
        assert report["results"][name]["max_abs_difference"] < 1e-4, name


def test_training_decodes_a_photo_as_pillow_and_the_apps_do(tmp_path):
    """Training's pixels are the ones predict, the apps and the server give the model."""
    from keras_vit.data import images, pipeline

    photos = _jpeg_photos(tmp_path / "photos", [f"c{i}" for i in range(10)], per_class=2)
    files = sorted(photos.rglob("*.jpg"))
    for path in files:
        decoded = pipeline.decode_image(tf.constant(path.read_bytes())).numpy()
        assert decoded.shape == (48, 64, 3), path  # the sideways ones upright
        np.testing.assert_array_equal(decoded, images.load_image(str(path)), err_msg=str(path))


def test_predict_takes_an_export_folder_and_folders_of_images(exported, tmp_path, capsys):
    """As the apps do: an export-N folder runs its model.tflite; a folder is its images."""
    import shutil

    from keras_vit.cli import main

    photos = tmp_path / "photos"
    photos.mkdir()
    pairs = data.load_dataset("cifar10-mini")["test"].to_dataset().take(3).as_numpy_iterator()
    for i, (encoded, _) in enumerate(pairs):
        (photos / f"{i}.png").write_bytes(encoded)
    (photos / "notes.txt").write_text("not an image, and not listed")
    shutil.copyfile(photos / "0.png", tmp_path / "single.png")
    assert main(["predict", exported["folder"], str(photos), str(tmp_path / "single.png"), "--json"]) == 0
    results = json.loads(capsys.readouterr().out)
    assert [os.path.basename(r["path"]) for r in results] == ["0.png", "1.png", "2.png", "single.png"]
    assert results[0]["top_k"] == results[3]["top_k"]
    tflite = main(["predict", os.path.join(exported["folder"], "model.tflite"), str(photos), "--json"])
    assert tflite == 0 and json.loads(capsys.readouterr().out) == results[:3]


def test_int8_calibrates_on_the_runs_training_images_only(colors_dataset):
    """The run's validation split decides what calibration may see: never the images its
    verification holds out (calibration once carved the default 10% instead of the run's)."""
    from keras_vit.data.contract import InputContract
    from keras_vit.storage.run_folder import DatasetSpec

    spec = DatasetSpec(colors_dataset, validation_split=0.5, seed=3)
    split = spec.load()
    calibration = tflite.representative_images(spec, InputContract((32, 32)), count=1000)
    assert len(calibration) == len(split["train"]) == len(split["validation"])  # half of the 72
    held_out = {bytes(pixels) for pixels in _decoded(split["validation"])}
    assert not any(bytes(image.astype(np.uint8)) in held_out for image in calibration)


def test_int8_calibrates_on_images_read_as_the_models_input_contract_reads_them(colors_dataset):
    """The exported model is fed what its contract prepares (a pretrained model's centre crop
    and interpolation included), so its calibration images are read the same way: each one is the
    contract's reading of a training image, not the training pipeline's plain resize."""
    import tensorflow as tf

    from keras_vit.data.contract import InputContract
    from keras_vit.model.transform import Transform
    from keras_vit.storage.run_folder import DatasetSpec

    spec = DatasetSpec(colors_dataset, validation_split=0.5, seed=3)
    contract = InputContract((24, 24), transform=Transform(crop_pct=0.75, interpolation="bicubic"))
    calibration = tflite.representative_images(spec, contract, count=6)
    assert calibration.shape == (6, 24, 24, 3)
    read = {}
    for path in spec.load()["train"].images:
        with open(path, "rb") as file:
            pixels = contract.decode_and_resize(tf.constant(file.read())).numpy()
        read[pixels.tobytes()] = path
    assert all(image.tobytes() in read for image in calibration)
    plain = tflite.representative_images(spec, InputContract((24, 24)), count=6)
    assert not any(image.tobytes() in read for image in plain)  # the plain resize differs


def _decoded(split):
    from keras_vit.data import images

    return [images.load_image(path) for path in split.images]
