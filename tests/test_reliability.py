"""Every image input on every surface: classified, or one clear message that names it.

The surfaces: the Python API (`predict_files`), the CLI (`keras-vit predict`, all files in one
call), the TF Serving signature (`serving_default`, one request per image), the desktop app's
inference and the mobile app in Chromium. The results are written to docs/reliability.md.
"""

import dataclasses
import io
import os
import re
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from keras_vit.files import atomic_write

VENV_BIN = os.path.dirname(sys.executable)
REPORT = os.path.join(os.path.dirname(__file__), os.pardir, "docs", "reliability.md")
SURFACES = ("Python API", "CLI", "TF Serving", "Desktop app", "Mobile app")
MODEL_SURFACES = ("Python API", "CLI", "Desktop app", "Mobile app")
SETTINGS_SURFACES = ("Python API", "CLI")
NOT_APPLICABLE = "n/a"


def _picture(width, height, seed=0):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // max(width - 1, 1), y * 255 // max(height - 1, 1), np.full_like(x, 90)], -1)
    noise = rng.integers(0, 40, (height, width, 3))
    return Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8))


def _save(image, path, format=None, **options):
    image.save(path, format, **options)


def _bomb_png(width, height):
    """A valid PNG header declaring `width` x `height` pixels, followed by a tiny data chunk."""

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    data = zlib.compress(b"\0" * 64)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b"")


def _make_inputs(folder):
    """(name, path, description, must_work) for every input in issue 8's lists."""
    picture = _picture(48, 36)
    inputs = []

    def add(name, description, must_work, write=None):
        path = folder / name
        if write is not None:
            write(path)
        inputs.append((name, path, description, must_work))

    add("grayscale.png", "grayscale PNG", True, lambda p: _save(picture.convert("L"), p))
    rgba = picture.convert("RGBA")
    rgba.putalpha(Image.fromarray(np.tile(np.linspace(0, 255, 48, dtype=np.uint8), (36, 1))))
    add("rgba.png", "RGBA PNG (alpha gradient)", True, lambda p: _save(rgba, p))
    add(
        "palette.png",
        "palette PNG",
        True,
        lambda p: _save(picture.convert("P", palette=Image.Palette.ADAPTIVE), p),
    )
    sixteen = Image.fromarray((np.asarray(picture.convert("L"), np.uint16) * 257).astype(np.uint16))
    add("16bit.png", "16-bit grayscale PNG", True, lambda p: _save(sixteen, p))
    add("cmyk.jpg", "CMYK JPEG", True, lambda p: _save(picture.convert("CMYK"), p, "JPEG"))
    add("progressive.jpg", "progressive JPEG", True, lambda p: _save(picture, p, "JPEG", progressive=True))
    frames = [picture, picture.transpose(Image.Transpose.FLIP_LEFT_RIGHT)]
    add("animated.gif", "GIF, 2 frames (the first is used)", True,
        lambda p: frames[0].save(p, save_all=True, append_images=frames[1:]))  # fmt: skip
    add("image.bmp", "BMP", True, lambda p: _save(picture, p))
    add("image.webp", "WebP", True, lambda p: _save(picture, p))
    exif = Image.Exif()
    exif[0x0112] = 6  # stored sideways: "rotate 90 degrees clockwise to view"
    sideways = picture.transpose(Image.Transpose.ROTATE_90)
    add("phone_exif_rotated.jpg", "EXIF-rotated phone photo (orientation 6)", True,
        lambda p: _save(sideways, p, "JPEG", exif=exif))  # fmt: skip
    add("one_pixel.png", "1 x 1 image", True, lambda p: _save(_picture(1, 1), p))
    add("wide.png", "very wide, 2000 x 10", True, lambda p: _save(_picture(2000, 10), p))
    add("tall.png", "very tall, 10 x 2000", True, lambda p: _save(_picture(10, 2000), p))

    jpeg = io.BytesIO()
    picture.save(jpeg, "JPEG")
    add("truncated.jpg", "truncated JPEG (first 40%)", False,
        lambda p: p.write_bytes(jpeg.getvalue()[: len(jpeg.getvalue()) * 2 // 5]))  # fmt: skip
    add("empty.jpg", "0-byte file", False, lambda p: p.write_bytes(b""))
    add("notes.jpg", "text file named .jpg", False, lambda p: p.write_text("shopping list: milk, eggs\n"))
    add("random.png", "random bytes", False, lambda p: p.write_bytes(np.random.default_rng(1).bytes(4096)))
    add("bomb.png", "decompression bomb (PNG header: 60000 x 60000)", False,
        lambda p: p.write_bytes(_bomb_png(60_000, 60_000)))  # fmt: skip
    add("missing.jpg", "missing path", False)
    add("folder.jpg", "a directory where a file is expected", False, lambda p: p.mkdir())
    return inputs


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return _make_inputs(tmp_path_factory.mktemp("reliability"))


def _readable(message, folder):
    """The message as the document shows it: no temporary folder, no TensorFlow function name."""
    message = message.replace(f"{folder}{os.sep}", "")
    message = re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", message)
    return re.sub(r"^assertion failed: \[(.*)\]$", r"\1", message)


@pytest.fixture(scope="module")
def model_inputs(export_folder, tmp_path_factory):
    """Model files that are not keras-vit models, or not whole ones."""
    import keras

    from keras_vit.classifier import load_classifier
    from keras_vit.export import tflite

    folder = tmp_path_factory.mktemp("models")
    inputs = []

    def add(name, description, write=None):
        path = folder / name
        if write is not None:
            write(path)
        inputs.append((name, path, description, False))

    good = (Path(export_folder["folder"]) / "model.tflite").read_bytes()
    add(
        "truncated.tflite",
        "truncated .tflite (first 60%)",
        lambda p: p.write_bytes(good[: len(good) * 3 // 5]),
    )
    bare = tflite.convert(load_classifier(export_folder["source"]), "fp32")
    add(
        "foreign.tflite",
        "foreign .tflite (a model without keras-vit metadata)",
        lambda p: p.write_bytes(bare),
    )
    add("notes.tflite", "text file named .tflite", lambda p: p.write_text("not a model"))

    @keras.saving.register_keras_serializable(package="OtherProject")
    class Shift(keras.layers.Layer):
        def call(self, x):
            return x + 1.0

    other = keras.Sequential(
        [keras.Input((32, 32, 3)), Shift(), keras.layers.Flatten(), keras.layers.Dense(3)]
    )
    add("other_project.keras", ".keras from another project (a custom layer)", lambda p: other.save(p))
    keras.saving.get_custom_objects().pop("OtherProject>Shift")  # as in a process without that project
    code = keras.Sequential(
        [
            keras.Input((32, 32, 3)),
            keras.layers.Lambda(lambda x: x * 2.0),
            keras.layers.Flatten(),
            keras.layers.Dense(3),
        ]
    )
    add("lambda_layer.keras", ".keras with a Lambda layer (Python code)", lambda p: code.save(p))
    tabular = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
    add("tabular.keras", ".keras of a model that takes no image", lambda p: tabular.save(p))
    add("damaged.keras", "damaged .keras (first 5 KB)", lambda p: p.write_bytes(good[:5000]))
    add("missing.tflite", "missing model path")
    return inputs


@pytest.fixture(scope="module")
def settings_inputs(tmp_path_factory):
    """Settings and datasets that cannot train: (name, CLI arguments, description)."""
    folder = tmp_path_factory.mktemp("settings")
    picture = folder / "a.png"
    _picture(32, 32).save(picture)
    for layout in ("empty_class/cat", "empty_class/dog", "one_class/cat"):
        (folder / layout).mkdir(parents=True)
    for cls in ("empty_class/cat", "one_class/cat"):
        for i in range(3):
            _picture(32, 32, seed=i).save(folder / cls / f"{i}.png")
    out = str(folder / "run")
    return [
        ("unknown_config", ["--model", "vit_hyuge_patch16_224", "--output", out], "unknown config name"),
        (
            "image_size_30",
            ["--image-size", "30", "--output", out],
            "image size not divisible by the patch (30, patch 4)",
        ),
        (
            "heads",
            ["--override", "num_heads=5", "--output", out],
            "heads that do not divide the width (5 heads)",
        ),  # fmt: skip
        ("negative_lr", ["--learning-rate", "-0.001", "--output", out], "negative learning rate"),
        (
            "empty_class",
            ["--dataset", str(folder / "empty_class"), "--output", out],
            "dataset folder with an empty class",
        ),
        (
            "one_class",
            ["--dataset", str(folder / "one_class"), "--output", out],
            "dataset folder with a single class",
        ),
    ]


@pytest.fixture(scope="module")
def report(inputs, model_inputs, settings_inputs):
    """Collects each surface's results per table; written to docs/reliability.md at the end."""
    results = {"images": {}, "models": {}, "settings": {}}
    yield results
    complete = (
        set(results["images"]) == set(SURFACES)
        and set(results["models"]) == set(MODEL_SURFACES)
        and set(results["settings"]) == set(SETTINGS_SURFACES)
    )
    if complete:  # only a complete run rewrites the document
        settings_rows = [(name, None, description, False) for name, _, description in settings_inputs]
        tables = [
            ("Images", SURFACES, inputs, results["images"]),
            ("Model files", MODEL_SURFACES, model_inputs, results["models"]),
            ("Training settings and datasets", SETTINGS_SURFACES, settings_rows, results["settings"]),
        ]
        atomic_write(REPORT, lambda temporary: _write_report(temporary, tables))


def _cell(value):
    return value.replace("|", "\\|").replace("\n", " ").replace('\\"', '"').replace("\\'", "'")


def _write_report(path, tables):
    lines = [
        "# Reliability: every input on every surface",
        "",
        "Generated by `tests/test_reliability.py` (do not edit by hand). ✓ is a prediction (the",
        "top-1 class of the suite's one-epoch tiny model, so the classes themselves mean little);",
        "✗ is the message the user sees, which names the input. The tests assert that every input",
        "marked *must work* is classified and every other one gets its message, with no traceback",
        "and no hang; in the CLI and the apps the other images of the same call are still",
        "classified, and the CLI exits with status 1 (some images failed) or 2 (bad arguments).",
        "",
        "Surfaces: Python API `keras_vit.predict.predict_files`, `keras_vit.runtimes.open_model`",
        "and `keras_vit.train.train`; CLI `keras-vit predict` (all images in one call) and `keras-vit",
        "train`; TF Serving: the SavedModel's `serving_default` signature, one request per image (an",
        "error is that request's INVALID_ARGUMENT, whose text starts with TensorFlow's function name,",
        "left out here); the desktop app (`LoadedModel`, whose messages the window shows in its",
        "banner); the mobile app: images picked in headless Chromium as a phone (paths and folders",
        "cannot be picked, so n/a), models given to `keras-vit app mobile`.",
    ]
    for title, surfaces, rows, results in tables:
        lines += [
            "",
            f"## {title}",
            "",
            "| input | " + " | ".join(surfaces) + " |",
            "|---" * (len(surfaces) + 1) + "|",
        ]
        groups = (True, False) if any(works for *_, works in rows) else (False,)
        for must_work in groups:
            if len(groups) > 1:
                label = "must work" if must_work else "must fail cleanly"
                lines.append(f"| **{label}** |" + " |" * len(surfaces))
            for name, _, description, works in rows:
                if works == must_work:
                    cells = [_cell(results[surface][name]) for surface in surfaces]
                    lines.append(f"| {description} (`{name}`) | " + " | ".join(cells) + " |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def _check(surface, inputs, outcome, report, table="images"):
    """`outcome(name, path)` -> ("ok", class) or ("error", message) or None (n/a)."""
    results = {}
    for name, path, _, must_work in inputs:
        result = outcome(name, path)
        if result is None:
            results[name] = NOT_APPLICABLE
            continue
        kind, text = result
        assert "Traceback" not in text, (surface, name, text)
        text = _readable(text, path.parent) if path is not None else text
        if must_work:
            assert kind == "ok", (surface, name, text)
            results[name] = f"✓ {text}"
        else:
            assert kind == "error", (surface, name, text)
            results[name] = f"✗ {text}"
    report[table][surface] = results
    return results


def _first_line(message):
    return str(message).strip().splitlines()[0]


def test_python_api(export_folder, inputs, report):
    from keras_vit.predict import predict_files
    from keras_vit.runtimes import open_model

    runner = open_model(export_folder["source"])
    results = predict_files(
        runner, [path for _, path, _, _ in inputs]
    )  # one call: one bad file, others go on
    by_name = {os.path.basename(r["path"]): r for r in results}

    def outcome(name, path):
        result = by_name[name]
        if "error" in result:
            assert name in result["error"]
            return "error", result["error"]
        return "ok", result["top_k"][0]["class"]

    _check("Python API", inputs, outcome, report)


def test_cli(export_folder, inputs, report):
    paths = [str(path) for _, path, _, _ in inputs]
    done = subprocess.run(
        [os.path.join(VENV_BIN, "keras-vit"), "predict", export_folder["source"], *paths],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1  # some inputs failed, the rest were classified
    lines = {
        line.split(": ", 1)[0]: line.split(": ", 1)[1] for line in done.stdout.splitlines() if ": " in line
    }

    def outcome(name, path):
        line = lines[str(path)]
        if line.startswith("error: "):
            return "error", line.removeprefix("error: ")
        return "ok", line.split(" ", 1)[0]

    _check("CLI", inputs, outcome, report)
    assert "Traceback" not in done.stderr


def test_tf_serving_signature(export_folder, inputs, report):
    import tensorflow as tf

    from keras_vit.runtimes import SavedModelRunner

    runner = SavedModelRunner(
        os.path.normpath(os.path.join(export_folder["folder"], export_folder["saved_model"]))
    )

    from keras_vit.predict import read_image
    from keras_vit.runtimes import open_model

    keras_runner = open_model(export_folder["source"])

    def outcome(name, path):
        if not path.is_file():
            return None  # serving receives bytes, never a path
        try:
            output = runner.predict_bytes([path.read_bytes()])
        except tf.errors.InvalidArgumentError as error:
            assert "image_bytes[0]" in error.message  # the request's image, by its index
            return "error", _first_line(error.message)
        # The server decodes as the apps read files: same orientation, alpha, first frame.
        expected = keras_runner.predict(np.stack([read_image(path, keras_runner.image_size)]))[0]
        assert np.abs(output["probabilities"][0] - expected).max() < 1e-2, name
        return "ok", output["top_k_classes"][0, 0].decode()

    _check("TF Serving", inputs, outcome, report)


def test_desktop_app_inference(export_folder, inputs, report):
    from keras_vit.apps.desktop.inference import LoadedModel

    model = LoadedModel.open(os.path.join(export_folder["folder"], "model.tflite"))

    def outcome(name, path):
        try:
            prediction = model.classify_file(path)
        except (FileNotFoundError, ValueError) as error:
            assert name in str(error)
            return "error", str(error)
        return "ok", prediction.top1

    _check("Desktop app", inputs, outcome, report)


def test_mobile_app(export_folder, inputs, report, tmp_path, phone):
    from keras_vit.apps.mobile import browser, server
    from keras_vit.apps.mobile.build import build_app

    folder = build_app(os.path.join(export_folder["folder"], "model.tflite"), tmp_path / "app")
    httpd = server.make_server(folder, "127.0.0.1", 0)
    server.serve_in_background(httpd)
    try:
        page = browser.open_app(phone.new_context(), server.urls(httpd)[0])

        def outcome(name, path):
            if not path.is_file():
                return None  # a file picker offers files only
            result = browser.classify(page, path)
            if result["error"]:
                assert name in result["error"]
                return "error", result["error"]
            return "ok", result["predictions"][0]["name"]

        _check("Mobile app", inputs, outcome, report)
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_model_files_on_every_surface(model_inputs, report, image_folder, capsys, tmp_path):
    from keras_vit.apps.desktop.inference import LoadedModel
    from keras_vit.apps.mobile.build import describe_model
    from keras_vit.cli import main
    from keras_vit.runtimes import open_model

    image = str(sorted(image_folder.glob("*.png"))[0])

    def raised(load):
        def outcome(name, path):
            try:
                load(path)
            except (FileNotFoundError, ValueError) as error:
                assert name in str(error)
                return "error", str(error)
            return "ok", "loaded"

        return outcome

    def cli(name, path):
        status = main(["predict", str(path), image])
        error = capsys.readouterr().err.strip()
        assert status == 2 and len(error.splitlines()) == 1 and name in error
        return "error", error.removeprefix("keras-vit predict: error: ")

    _check("Python API", model_inputs, raised(open_model), report, "models")
    _check("CLI", model_inputs, cli, report, "models")
    _check("Desktop app", model_inputs, raised(LoadedModel.open), report, "models")
    _check("Mobile app", model_inputs, raised(describe_model), report, "models")


def test_training_settings_and_datasets(settings_inputs, report, capsys):
    from keras_vit.cli import _parse_override, build_parser, main
    from keras_vit.train import train
    from keras_vit.train_config import TrainConfig

    by_name = {name: arguments for name, arguments, _ in settings_inputs}
    rows = [(name, None, description, False) for name, _, description in settings_inputs]
    arguments = settings_inputs[0][1]
    folder = f"{Path(arguments[arguments.index('--output') + 1]).parent}{os.sep}"  # left out of the document

    def cli(name, path):
        status = main(["train", "--epochs", "1", *by_name[name]])
        error = capsys.readouterr().err.strip()
        assert status == 2 and len(error.splitlines()) == 1, error
        return "error", error.removeprefix("keras-vit train: error: ").replace(folder, "")

    def python_api(name, path):
        # The same settings as keyword arguments of TrainConfig, as a Python user writes them.
        arguments = vars(build_parser().parse_args(["train", *by_name[name]]))
        fields = {f.name for f in dataclasses.fields(TrainConfig)}
        values = {k: v for k, v in arguments.items() if k in fields and v is not None}
        values["overrides"] = dict(_parse_override(item) for item in arguments["override"] or [])
        config = TrainConfig(**{**values, "epochs": 1})
        try:
            train(config)
        except ValueError as error:
            return "error", str(error).replace(folder, "")
        return "ok", "trained"

    _check("CLI", rows, cli, report, "settings")
    _check("Python API", rows, python_api, report, "settings")
