"""Every image input on every surface: classified, or one clear message that names it.

The surfaces: the Python API (`predict_files`), the CLI (`keras-vit predict`, all files in one
call), the TF Serving signature (`serving_default`, one request per image), the desktop app's
inference and the mobile app in Chromium; then load and faults: many requests at once, a
disk that fills up, damaged backups. The results are written to docs/reliability.md.
"""

import dataclasses
import errno
import io
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import full_disk
import keras
import numpy as np
import pytest
from conftest import HANG_SECONDS
from PIL import Image

from keras_vit.files import DiskFullError, atomic_write
from keras_vit.storage.saving import load_trained_model
from keras_vit.training import callbacks
from keras_vit.training.callbacks import ResumableBackup, optimizer_step

FULL_DISK_SCRIPT = full_disk.__file__
REPORT = os.path.join(os.path.dirname(__file__), os.pardir, "docs", "reliability.md")
SURFACES = ("Python API", "CLI", "TF Serving", "Desktop app", "Mobile app")
MODEL_SURFACES = ("Python API", "CLI", "Desktop app", "Mobile app")
SETTINGS_SURFACES = ("Python API", "CLI")
NOT_APPLICABLE = "n/a"
DISK_FULL_SCENARIO = (
    "`keras-vit train` on a disk that fills during a backup, the end-of-epoch save, TensorBoard's "
    "writes and the results, in turn"
)
# The rows of the load-and-faults table, each filled by one test.
LOAD_SCENARIOS = (
    "TF Serving signature, 8 threads x 200 requests",
    "Phone app server, 50 clients loading the app at once",
    DISK_FULL_SCENARIO,
    "No space for a backup (the weights' write fails)",
    "A run whose latest backup is truncated",
    "A run whose backups are all truncated",
    "Damaged files that commands read",
    "`keras-vit export` on a full disk",
    "`keras-vit predict` on 5,000 paths",
    "Desktop app, a folder of 5,000 images",
)


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

    from keras_vit.export import tflite
    from keras_vit.inference.classifier import load_classifier

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
    saved_model = Path(export_folder["folder"]).parent / "1"
    for name, description, damage in SAVED_MODEL_DAMAGE:
        add(name, description, lambda p, damage=damage: damage(_copy_of(saved_model, p)))
    add("missing.tflite", "missing model path")
    return inputs


def _copy_of(folder, path):
    shutil.copytree(folder, path)
    return path


def _truncate(path, size):
    with open(path, "r+b") as f:
        f.truncate(size)


def _flip_bytes(path, count=8, seed=0):
    """Inverts `count` bytes spread over the file, as a bad disk or a bad copy would."""
    data = bytearray(path.read_bytes())
    for i in np.random.default_rng(seed).choice(len(data), size=min(count, len(data)), replace=False):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


VARIABLES = "variables/variables.data-00000-of-00001"
# (name, description, damage(folder)) for a SavedModel that keras-vit export wrote.
SAVED_MODEL_DAMAGE = (
    ("saved_model_pb_truncated", "SavedModel, saved_model.pb truncated to 2,000 bytes",
     lambda f: _truncate(f / "saved_model.pb", 2000)),
    ("saved_model_variables_truncated", "SavedModel, its variables truncated to half",
     lambda f: _truncate(f / VARIABLES, (f / VARIABLES).stat().st_size // 2)),
    ("saved_model_no_variables", "SavedModel without its variables/ folder",
     lambda f: shutil.rmtree(f / "variables")),
    ("saved_model_pb_flipped", "SavedModel, 8 bytes of saved_model.pb inverted",
     lambda f: _flip_bytes(f / "saved_model.pb")),
    ("saved_model_variables_flipped", "SavedModel, 8 bytes of its variables inverted",
     lambda f: _flip_bytes(f / VARIABLES)),
    ("saved_model_index_flipped", "SavedModel, 8 bytes of variables.index inverted",
     lambda f: _flip_bytes(f / "variables/variables.index")),
    ("saved_model_no_labels", "SavedModel without assets/labels.txt",
     lambda f: (f / "assets" / "labels.txt").unlink()),
)  # fmt: skip


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
            "image_size_3",
            ["--image-size", "3", "--output", out],
            "image size smaller than one patch (3, patch 4)",
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
    results = {"images": {}, "models": {}, "settings": {}, "load": {}}
    yield results
    complete = (
        set(results["images"]) == set(SURFACES)
        and set(results["models"]) == set(MODEL_SURFACES)
        and set(results["settings"]) == set(SETTINGS_SURFACES)
        and set(results["load"]) == set(LOAD_SCENARIOS)
    )
    if complete:  # only a complete run rewrites the document
        settings_rows = [(name, None, description, False) for name, _, description in settings_inputs]
        tables = [
            ("Images", SURFACES, inputs, results["images"]),
            ("Model files", MODEL_SURFACES, model_inputs, results["models"]),
            ("Training settings and datasets", SETTINGS_SURFACES, settings_rows, results["settings"]),
        ]
        atomic_write(REPORT, lambda temporary: _write_report(temporary, tables, results["load"]))


def _cell(value):
    return value.replace("|", "\\|").replace("\n", " ").replace('\\"', '"').replace("\\'", "'")


# docs/reliability.md is a page of the documentation site: what stands above this line is written
# by hand and kept; the tables below it are rewritten.
REPORT_MARKER = "<!-- Below: generated by tests/test_reliability.py, which keeps what is above this line. -->"


def _hand_written_head():
    """The page's hand-written text above `REPORT_MARKER`, with the marker; empty if it has none."""
    try:
        text = open(REPORT, encoding="utf-8").read()
    except FileNotFoundError:
        return []
    if REPORT_MARKER not in text:
        return []
    return text.split(REPORT_MARKER, 1)[0].rstrip("\n").split("\n") + ["", REPORT_MARKER, ""]


def _write_report(path, tables, load):
    lines = _hand_written_head() + [
        "## Every input on every surface",
        "",
        "Generated by `tests/test_reliability.py` (do not edit by hand). ✓ is a prediction (the",
        "top-1 class of the suite's one-epoch tiny model, so the classes themselves mean little);",
        "✗ is the message the user sees, which names the input. The tests assert that every input",
        "marked *must work* is classified and every other one gets its message, with no traceback",
        "and no hang; in the CLI and the apps the other images of the same call are still",
        "classified, and the CLI exits with status 1 (some images failed) or 2 (bad arguments).",
        "",
        "Surfaces: Python API `keras_vit.inference.predict.predict_files`,",
        "`keras_vit.inference.runtimes.open_model` and `keras_vit.training.train.train`; CLI",
        "`keras-vit predict` (all images in one call) and `keras-vit train`; TF Serving: the",
        "SavedModel's `serving_default` signature, one request per image (an",
        "error is that request's INVALID_ARGUMENT, whose text starts with TensorFlow's function name,",
        "left out here); the desktop app (`LoadedModel`, whose messages the window shows in its",
        "banner); the mobile app: images picked in headless Chromium as a phone (paths and folders",
        "cannot be picked, so n/a), models given to `keras-vit app mobile`.",
    ]
    for title, surfaces, rows, results in tables:
        lines += [
            "",
            f"### {title}",
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
    lines += [
        "",
        "### Load and faults",
        "",
        "Many requests at once, a disk that fills up, damaged backups: what the user sees and what",
        "is left on disk, each row asserted and measured by its test on the machine that ran the suite.",
        "",
        "| what | what happened |",
        "|---|---|",
    ]
    lines += [f"| {scenario} | {_cell(load[scenario])} |" for scenario in LOAD_SCENARIOS]
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
    from keras_vit.inference.predict import predict_files
    from keras_vit.inference.runtimes import open_model

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


def test_cli(export_folder, inputs, report, capfd):
    """`keras-vit predict`'s `main` in this process, what it prints captured at the file
    descriptors (the command's own process, exit status and stream: the 5,000 paths test below)."""
    from keras_vit.cli import main

    paths = [str(path) for _, path, _, _ in inputs]
    capfd.readouterr()
    status = main(["predict", export_folder["source"], *paths])
    done = capfd.readouterr()
    assert status == 1  # some inputs failed, the rest were classified
    lines = {line.split(": ", 1)[0]: line.split(": ", 1)[1] for line in done.out.splitlines() if ": " in line}

    def outcome(name, path):
        line = lines[str(path)]
        if line.startswith("error: "):
            return "error", line.removeprefix("error: ")
        return "ok", line.split(" ", 1)[0]

    _check("CLI", inputs, outcome, report)
    assert "Traceback" not in done.err


def test_tf_serving_signature(export_folder, inputs, report):
    import tensorflow as tf

    from keras_vit.inference.runtimes import SavedModelRunner

    runner = SavedModelRunner(
        os.path.normpath(os.path.join(export_folder["folder"], export_folder["saved_model"]))
    )

    from keras_vit.inference.predict import read_image
    from keras_vit.inference.runtimes import open_model

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
    from keras_vit.inference.runtimes import open_model

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
        assert status == 1 and len(error.splitlines()) == 1 and name in error
        return "error", error.removeprefix("keras-vit predict: error: ")

    _check("Python API", model_inputs, raised(open_model), report, "models")
    _check("CLI", model_inputs, cli, report, "models")
    _check("Desktop app", model_inputs, raised(LoadedModel.open), report, "models")
    _check("Mobile app", model_inputs, raised(describe_model), report, "models")


def _damaged_checkpoints(folder, source):
    """A keras-vit model's weights as .safetensors, .npz and .pth files, each damaged two ways."""
    import safetensors.numpy
    import torch

    from keras_vit.model.weights import state_dict

    state = {k: np.ascontiguousarray(v) for k, v in state_dict(source).items()}
    writers = {
        ".safetensors": lambda p: safetensors.numpy.save_file(state, str(p)),
        ".npz": lambda p: np.savez(p, **state),
        ".pth": lambda p: torch.save({k: torch.from_numpy(v) for k, v in state.items()}, p),
    }
    for suffix, write in writers.items():
        for damage in ("truncated", "flipped"):
            path = folder / f"{damage}{suffix}"
            write(path)
            _truncate(path, path.stat().st_size // 2) if damage == "truncated" else _flip_bytes(path, 64)
            yield path


def test_damaged_files_that_commands_read_get_one_line_and_exit_1(
    export_folder, colors_dataset, tmp_path, capsys, report
):
    """A damaged SavedModel in every command that opens one, damaged checkpoints for --weights,
    and the damaged JSON and backups of run and export folders: one line naming the file, exit 1,
    never a traceback or a signal (this process would die with it)."""
    from keras_vit.cli import main

    home = _copy_of(Path(export_folder["folder"]).parent, tmp_path / "home")
    saved_model, export = home / "1", home / "export-1"
    _truncate(saved_model / VARIABLES, (saved_model / VARIABLES).stat().st_size // 2)
    train = ["train", "--dataset", colors_dataset, "--epochs", "1", "--batch-size", "8", *TINY_FLAGS]
    cases = [
        (["predict", str(saved_model), str(export / "labels.txt")], saved_model),
        (["evaluate", str(saved_model), "--dataset", "cifar10-mini"], saved_model),
        (["verify", str(export)], saved_model),
        ([*train, "--output", str(tmp_path / "student"), "--override=distillation_token=true",
          "--teacher", str(saved_model)], saved_model),
        ([*train, "--output", str(tmp_path / "tuned"), "--weights", str(saved_model)], saved_model),
    ]  # fmt: skip
    for checkpoint in _damaged_checkpoints(tmp_path, load_trained_model(export_folder["source"])):
        command = [*train, "--output", str(tmp_path / "tuned"), "--weights", str(checkpoint)]
        cases.append((command, checkpoint))

    for name, command in (
        ("class_names.json", ["train", "--dataset", "cifar10-mini", "--output"]),
        ("preprocessing.json", ["train", "--dataset", "cifar10-mini", "--output"]),
        ("history.json", ["export", "--output", str(tmp_path / "exports")]),
    ):
        run = _copy_of(Path(export_folder["source"]), tmp_path / name / "run")
        if command[0] == "train":
            (run / "history.json").unlink()  # a run to resume
        _truncate(run / name, (run / name).stat().st_size // 2)
        cases.append(([*command, str(run)], run / name))
    export = _copy_of(export, tmp_path / "export-json" / "export-1")
    _truncate(export / "export.json", 40)
    cases.append((["verify", str(export)], export / "export.json"))

    for command, damaged in cases:
        assert main(command) == 1, command
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.startswith(f"keras-vit {command[0]}: error: ") and str(damaged) in line, line
    report["load"]["Damaged files that commands read"] = (
        f"{len(cases)} cases (a SavedModel with truncated variables in predict, evaluate, verify, --teacher "
        f"and --weights; truncated and byte-flipped .safetensors, .npz and .pth for --weights; truncated "
        f"class_names.json, preprocessing.json, history.json and export.json): each exit 1 and one line "
        f'naming the file, e.g. "{_readable(line, tmp_path)}"'
    )


def test_training_settings_and_datasets(settings_inputs, report, capsys):
    from keras_vit.cli import _parse_override, build_parser, main
    from keras_vit.training.config import TrainConfig
    from keras_vit.training.train import train

    by_name = {name: arguments for name, arguments, _ in settings_inputs}
    rows = [(name, None, description, False) for name, _, description in settings_inputs]
    arguments = settings_inputs[0][1]
    folder = f"{Path(arguments[arguments.index('--output') + 1]).parent}{os.sep}"  # left out of the document

    def cli(name, path):
        try:
            status = main(["train", "--epochs", "1", *by_name[name]])
        except SystemExit as exit_info:  # argparse's own checks (--model's name)
            status = exit_info.code
        error = capsys.readouterr().err.strip()
        assert status == 1 and len(error.splitlines()) == 1, error
        return "error", error.removeprefix("keras-vit train: error: ").replace(folder, "")

    def python_api(name, path):
        # The same settings as keyword arguments of TrainConfig, as a Python user writes them
        # (the model's name unparsed: the command line checks it before TrainConfig does).
        argv = list(by_name[name])
        model = argv.pop(argv.index("--model") + 1) if "--model" in argv else None
        argv = [a for a in argv if a != "--model"]
        arguments = vars(build_parser().parse_args(["train", *argv]))
        fields = {f.name for f in dataclasses.fields(TrainConfig)}
        values = {k: v for k, v in arguments.items() if k in fields and v is not None}
        if model is not None:
            values["model"] = model
        values["overrides"] = dict(_parse_override(item) for item in arguments["override"] or [])
        config = TrainConfig(**{**values, "epochs": 1})
        try:
            train(config)
        except ValueError as error:
            return "error", str(error).replace(folder, "")
        return "ok", "trained"

    _check("CLI", rows, cli, report, "settings")
    _check("Python API", rows, python_api, report, "settings")


SERVING_LOAD = """
import json, random, sys, threading, time
import numpy as np
import tensorflow as tf

saved_model, files = sys.argv[1], json.loads(sys.argv[2])
threads, requests = int(sys.argv[3]), int(sys.argv[4])
serve = tf.saved_model.load(saved_model).signatures["serving_default"]  # loaded once, shared
blobs = {name: open(path, "rb").read() for name, path in files.items()}


def ask(blob):
    try:
        return "ok", serve(image_bytes=tf.constant([blob]))["probabilities"].numpy()[0]
    except tf.errors.InvalidArgumentError as error:
        return "error", error.message


def memory_mb(field):
    return next(int(l.split()[1]) / 1024 for l in open("/proc/self/status") if l.startswith(field + ":"))


serial = {name: ask(blob) for name, blob in blobs.items()}
open("/proc/self/clear_refs", "w").write("5")  # restart the peak (VmHWM) from here
before = memory_mb("VmRSS")
problems, counts = [], {"ok": 0, "error": 0}
lock = threading.Lock()


def client(seed):
    picker = random.Random(seed)
    for _ in range(requests):
        name = picker.choice(sorted(blobs))
        try:
            kind, value = ask(blobs[name])
        except Exception as error:  # anything but the request's own INVALID_ARGUMENT
            kind, value = "failure", repr(error)
        expected_kind, expected = serial[name]
        same = kind == expected_kind and (
            np.array_equal(value, expected) if kind == "ok" else value == expected
        )
        with lock:
            counts[kind] = counts.get(kind, 0) + 1
            if not same:
                problems.append((name, kind, str(value)[:300]))


start = time.perf_counter()
workers = [threading.Thread(target=client, args=(seed,)) for seed in range(threads)]
for worker in workers:
    worker.start()
for worker in workers:
    worker.join()
print(json.dumps({
    "counts": counts, "problems": problems[:5], "seconds": time.perf_counter() - start,
    "rss_before_mb": before, "peak_rss_mb": memory_mb("VmHWM"),
    "serial_errors": {n: v for n, (k, v) in serial.items() if k == "error"},
}))
"""


def test_serving_under_load_answers_every_request_as_it_answers_one(export_folder, inputs, report):
    """serving_default, loaded once, called from 8 threads with 200 requests each of the photos,
    odd formats and bad files in random order: the same answer as a serial run for every request,
    each bad one its own INVALID_ARGUMENT, nothing else, and memory that stays put."""
    saved_model = os.path.normpath(os.path.join(export_folder["folder"], export_folder["saved_model"]))
    files = {name: str(path) for name, path, _, _ in inputs if path is not None and path.is_file()}
    threads, requests = 8, 200
    done = subprocess.run(
        [sys.executable, "-c", SERVING_LOAD, saved_model, json.dumps(files), str(threads), str(requests)],
        capture_output=True, text=True, timeout=HANG_SECONDS, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["problems"] == [] and set(result["counts"]) == {"ok", "error"}
    assert sum(result["counts"].values()) == threads * requests
    bad = {name for name, _, _, works in inputs if not works and name in files}
    assert set(result["serial_errors"]) == bad
    for message in result["serial_errors"].values():
        assert "image_bytes[0]" in message and "Traceback" not in message
    growth = result["peak_rss_mb"] - result["rss_before_mb"]
    assert growth < 200, f"memory grew by {growth:.0f} MB under load"
    report["load"]["TF Serving signature, 8 threads x 200 requests"] = (
        f"{result['counts']['ok']} good requests answered as a serial run answers them, "
        f"{result['counts']['error']} bad ones each their own INVALID_ARGUMENT, no other failure; "
        f"{threads * requests / result['seconds']:.0f} requests/s; peak RSS {result['peak_rss_mb']:.0f} MB, "
        f"{growth:+.0f} MB over the loaded model"
    )


def test_the_phone_apps_server_serves_50_clients_loading_the_app_at_once(export_folder, report, tmp_path):
    """50 clients at once, each fetching every file of the app (the service worker's list plus
    sw.js): every answer 200 with the file's bytes, and no server thread left behind."""
    import threading
    import time
    import urllib.request
    from concurrent.futures import ThreadPoolExecutor

    from keras_vit.apps.mobile import server
    from keras_vit.apps.mobile.build import build_app

    folder = build_app(os.path.join(export_folder["folder"], "model.tflite"), tmp_path / "app")
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    threads_before = threading.active_count()
    httpd = server.make_server(folder, "127.0.0.1", 0)
    server.serve_in_background(httpd)
    url = server.urls(httpd)[0]

    def load_the_app(client):
        answers = []
        for name in ["", *files]:  # "" is the page itself: index.html
            with urllib.request.urlopen(url + name, timeout=60) as reply:
                expected = (folder / (name or "index.html")).read_bytes()
                answers.append((reply.status, reply.read() == expected))
        return answers

    start = time.perf_counter()
    try:
        with ThreadPoolExecutor(max_workers=50) as clients:
            answers = [a for client in clients.map(load_the_app, range(50)) for a in client]
        seconds = time.perf_counter() - start
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert len(answers) == 50 * (len(files) + 1)
    assert all(status == 200 and same for status, same in answers)
    deadline = time.time() + 60  # a wait that ends as soon as they do, not a time limit
    while threading.active_count() > threads_before and time.time() < deadline:
        time.sleep(0.05)
    assert threading.active_count() == threads_before, threading.enumerate()
    size = sum((folder / name).stat().st_size for name in files)
    report["load"]["Phone app server, 50 clients loading the app at once"] = (
        f"{len(answers)} requests ({len(files) + 1} files, {size / 1e6:.1f} MB per client), every one 200 "
        f"with the file's bytes, in {seconds:.1f} s; no server thread left afterwards"
    )


# Faults: a disk that fills up part way, and damaged backups. Nothing written before is lost, the
# user gets one line naming the file, and the same command works once there is room.
TINY_FLAGS = [f"--override={k}={v}" for k, v in dict(hidden_dim=32, depth=2, num_heads=4, mlp_dim=64).items()]


def _partial_files(folder):
    return [
        os.path.join(d, n)
        for d, subdirs, names in os.walk(folder)
        for n in names + subdirs
        if ".partial" in n
    ]


# Where a training run meets a disk that has just filled up: (the writer that fills it first, which
# of its calls, the bytes left free). What is left free lets a write start and fail part way:
# HDF5 crashed the process (SIGSEGV) when it closed a file whose writes had failed so.
# Each moment is a training run (about 18 s here); the run folder's other writers meet a full
# disk in-process below (TensorBoard's new events file as a fit starts, log.csv, the backup's
# record after an epoch's end: a stop there resumes as a kill after that epoch's last backup
# does, tested in test_train.py).
FULL_DISK_MOMENTS = (
    ("keras_vit.training.callbacks.ResumableBackup._save_model", 2, 64 << 10),  # during a backup
    ("keras_vit.training.callbacks.BestModelCheckpoint.on_epoch_end", 1, 16 << 10),  # the end-of-epoch save
    ("keras_vit.training.callbacks.TensorBoardLog.on_epoch_end", 1, 0),  # TensorFlow's event writer
    ("keras_vit.training.train._write_results", 1, 0),  # training.png and history.json, every step taken
)


def test_a_disk_that_fills_at_any_moment_of_training_loses_nothing_and_the_same_command_resumes(
    colors_dataset, small_disk, report
):
    """One run meets a full disk at each moment in turn: each time one line and exit 1, never a
    signal, nothing half-written, the best model so far loads; with the space freed, the same
    command goes on from where it stopped and finishes every step, never starting over, with a
    log row for every epoch."""
    run = small_disk / "run"
    train = [
        "train", "--dataset", colors_dataset, "--output", str(run), "--epochs", "4", "--batch-size", "8",
        "--validation-split", "0.25", "--backup-every-steps", "2", "--no-jit-compile", *TINY_FLAGS,
    ]  # fmt: skip
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    lines = []
    for target, call, leave in FULL_DISK_MOMENTS:
        command = [
            sys.executable,
            FULL_DISK_SCRIPT,
            str(small_disk),
            target,
            str(call),
            str(leave),
            "--",
            *train,
        ]
        stopped = subprocess.run(command, env=env, capture_output=True, text=True, timeout=HANG_SECONDS)
        assert stopped.returncode == 1, (target, stopped.returncode, stopped.stderr[-2000:])
        (line,) = stopped.stderr.strip().splitlines()
        assert line.startswith("keras-vit train: error: No space left to write " + str(run)), line
        assert "free there): free some space and run the same command again" in line
        assert not _partial_files(run)
        if (run / "model.keras").exists():
            assert load_trained_model(run).class_names == ["blue", "green", "red"]  # the best so far
        lines.append(line)
        os.remove(small_disk / full_disk.FILLER)

    model_file = run / "model.keras"
    with open(model_file, "r+b") as f:  # and the best model truncated, as by a copy cut short
        f.truncate(os.path.getsize(model_file) // 3)
    # The same command once more, to its end: in this process (the runs that meet the full disk
    # above are the ones that must die cleanly in their own).
    from keras_vit.cli import main

    assert main(train) == 0
    assert load_trained_model(run).class_names == ["blue", "green", "red"]  # a new one was saved
    epochs = [int(row.split(",")[0]) for row in (run / "log.csv").read_text().splitlines()[1:]]
    assert epochs == [0, 1, 2, 3]  # each epoch's end written once it was, whichever write failed
    history = json.loads((run / "history.json").read_text())
    assert history["optimizer_steps"] == history["steps"] == 24
    assert sorted(os.listdir(run)) == [
        "class_names.json",
        "history.json",
        "log.csv",
        "logs",
        "model.keras",
        "preprocessing.json",
        "training.png",
    ]  # fmt: skip  (the backups go once the results are written)
    files = sorted({re.search(r"write (\S+) \(", line).group(1) for line in lines})
    report["load"][DISK_FULL_SCENARIO] = (
        f'each time exit 1 and one line, e.g. "{_readable(lines[0], small_disk)}", naming '
        f"{', '.join(_readable(f, small_disk) for f in files)}; no partial file, the best model.keras "
        f"so far loads; with the space freed the same command resumes each time, and at last finishes "
        f"the 24 steps and saves a whole model.keras (after truncating it)"
    )


def test_the_run_folders_other_writers_on_a_full_disk_raise_disk_full_and_leave_no_partial_file(small_disk):
    """TensorBoard's events file, written as each fit starts (TensorFlow's native writer),
    log.csv and the backup's record after an epoch's end: on a disk with no byte left, each a
    `DiskFullError` naming its path (the command's one line and exit 1), never a signal; log.csv
    keeps its earlier rows, the record still says the epoch's end is unwritten."""
    model = _compiled_model()
    backup = ResumableBackup(str(small_disk / "backup"), steps_per_epoch=3, save_freq=1)
    backup.set_model(model)
    _steps(model, 3)
    backup._save_model()  # an epoch's last step: its end is not written yet
    record = (small_disk / "backup" / "training_metadata.json").read_text()
    assert json.loads(record)["epoch_end_written"] is False
    log = callbacks.EpochLog(str(small_disk / "log.csv"))
    log.set_model(model)
    log.on_train_begin()
    log.on_epoch_end(0, {"loss": 1.0})
    written = (small_disk / "log.csv").read_text()
    full_disk.fill(small_disk, leave=0)
    log.on_train_begin()
    with pytest.raises(DiskFullError, match=r"No space left to write .*log\.csv"):
        log.on_epoch_end(1, {"loss": 0.5})
    assert (small_disk / "log.csv").read_text() == written
    with pytest.raises(DiskFullError, match=r"No space left to write .*logs"):
        callbacks.TensorBoardLog(str(small_disk / "logs")).set_model(model)
    with pytest.raises(DiskFullError, match=r"No space left to write .*training_metadata\.json"):
        backup.epoch_end_written()
    assert (small_disk / "backup" / "training_metadata.json").read_text() == record
    assert not _partial_files(small_disk)


def _compiled_model():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.compile(optimizer="adam", loss="mse")
    return model


def _steps(model, count):
    x, y = np.ones((count, 4), "float32"), np.zeros((count, 3), "float32")
    model.fit(x, y, batch_size=1, epochs=1, verbose=0)


def test_backups_fall_on_every_nth_step_of_the_run_with_several_steps_per_call(tmp_path, monkeypatch):
    """`--backup-every-steps 3` with 3 steps per compiled call: a backup at steps 3, 6, 9...
    Keras' own count put the first of each epoch a call late (6, 12, ...)."""
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.compile(optimizer="adam", loss="mse", steps_per_execution=3)
    saved = []
    monkeypatch.setattr(ResumableBackup, "_save_model", lambda backup: saved.append(optimizer_step(model)))
    backup = ResumableBackup(str(tmp_path / "backup"), steps_per_epoch=6, save_freq=3)
    x, y = np.ones((6, 4), "float32"), np.zeros((6, 3), "float32")
    model.fit(x, y, batch_size=1, epochs=2, verbose=0, callbacks=[backup])
    assert saved == [3, 6, 9, 12]


def test_a_damaged_backup_resumes_from_the_one_before_and_two_refuse_in_one_line(tmp_path, report):
    model = _compiled_model()
    backup = ResumableBackup(str(tmp_path / "backup"), steps_per_epoch=100, save_freq=1)
    backup.set_model(model)
    _steps(model, 3)
    backup._save_model()  # step 3: will be the one before
    _steps(model, 2)
    backup._save_model()  # step 5: the latest
    latest, before = backup._weights_path, backup._prev_weights_path
    assert os.path.exists(before) and not _partial_files(tmp_path)

    with open(latest, "r+b") as f:  # truncated, as by a crash or a copy cut short
        f.truncate(os.path.getsize(latest) // 2)
    resumed = _compiled_model()
    restore = ResumableBackup(str(tmp_path / "backup"), steps_per_epoch=100, save_freq=1)
    restore.set_model(resumed)
    assert restore.restore() == optimizer_step(resumed) == 3
    assert os.path.exists(latest) and not os.path.exists(before)  # the good one took its place

    _steps(resumed, 4)
    restore._save_model()  # step 7: the latest again, with step 3 as the one before
    _flip_bytes(Path(latest), count=16)  # HDF5 would load most such files, as wrong weights
    flipped = _compiled_model()
    restore = ResumableBackup(str(tmp_path / "backup"), steps_per_epoch=100, save_freq=1)
    restore.set_model(flipped)
    assert restore.restore() == optimizer_step(flipped) == 3

    with open(latest, "r+b") as f:
        f.truncate(100)
    again = ResumableBackup(str(tmp_path / "backup"), steps_per_epoch=100, save_freq=1)
    again.set_model(_compiled_model())
    with pytest.raises(
        ValueError, match=r"backups in .* are damaged \(latest\), so it cannot resume"
    ) as refused:
        again.restore()
    report["load"]["A run whose latest backup is truncated"] = (
        "resumes from the backup before it (at the step that one holds), which takes the damaged one's place"
    )
    report["load"]["A run whose backups are all truncated"] = (
        f'refuses in one line: "{_readable(str(refused.value), tmp_path)}"'
    )


def test_a_full_disk_during_a_backup_keeps_the_last_one_and_names_the_file(tmp_path, monkeypatch, report):
    model = _compiled_model()
    backup = ResumableBackup(str(tmp_path / "backup"), steps_per_epoch=100, save_freq=1)
    backup.set_model(model)
    backup._save_model()
    _steps(model, 2)
    backup._save_model()
    saved = {p: open(p, "rb").read() for p in (backup._weights_path, backup._prev_weights_path)}

    def no_space(path, data):  # the weights' file fails half way
        def write(temporary):
            with open(temporary, "wb") as f:
                f.write(data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device", temporary)

        atomic_write(path, write)

    monkeypatch.setattr(callbacks, "write_bytes", no_space)
    with pytest.raises(DiskFullError, match=r"No space left to write .*backup \(it needs about") as full:
        backup._save_model()
    # The new backup was written beside it: the latest is untouched.
    assert open(backup._weights_path, "rb").read() == saved[backup._weights_path]
    assert not _partial_files(tmp_path)
    report["load"]["No space for a backup (the weights' write fails)"] = (
        f'"{_readable(str(full.value), tmp_path)}"; the latest backup is untouched, no partial file is left'
    )


def test_an_export_on_a_full_disk_leaves_no_version_behind_and_works_once_there_is_room(
    colour_teacher, small_disk, capsys, report
):
    from keras_vit.cli import main
    from keras_vit.inference.runtimes import open_model
    from keras_vit.storage.export_folder import BATCHING_FILE, TFLITE_FILE, files_folder

    exports = small_disk / "exports"
    command = ["export", str(colour_teacher), "--output", str(exports), "--no-verify", "--quantize", "none"]
    command += ["--format", "saved_model,tflite"]
    assert main(command) == 0
    home = exports / "colour_teacher"
    capsys.readouterr()

    filler = full_disk.fill(small_disk)
    assert main(command) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"keras-vit export: error: No space left to write {files_folder(home, 2)}"), line
    assert sorted(os.listdir(home)) == ["1", BATCHING_FILE, "export-1"]  # no version 2, no staging
    images = np.full((1, 32, 32, 3), 200, np.float32)
    expected = open_model(colour_teacher).predict(images)
    for version_1 in (home / "1", home / "export-1" / TFLITE_FILE):
        np.testing.assert_allclose(open_model(version_1).predict(images), expected, atol=1e-5)

    filler.unlink()
    assert main(command) == 0
    assert sorted(os.listdir(home)) == ["1", "2", BATCHING_FILE, "export-1", "export-2"]
    report["load"]["`keras-vit export` on a full disk"] = (
        f'exit 1 and one line: "{_readable(line, small_disk)}"; version 1 still loads and answers as '
        f"before, no version 2 or staging folder is left; once the space is freed, version 2 is exported"
    )


# Where an export meets a disk that has just filled up: (module, the step that fills it first,
# the bytes left free).
EXPORT_MOMENTS = (
    ("serving", "write_saved_model", 64 << 10),  # TensorFlow's SavedModel writer, part way
    ("exporter", "write_bytes", 0),  # the .tflite
    ("onnx_model", "convert", 0),  # the .onnx
    ("exporter", "write_report", 0),  # verification.md and .json
)


def test_an_export_that_meets_a_full_disk_at_any_step_stops_in_one_line_and_leaves_no_version(
    colour_teacher, colors_dataset, small_disk, capsys, monkeypatch
):
    from keras_vit.cli import main
    from keras_vit.export import exporter, onnx_model, serving

    modules = {"serving": serving, "exporter": exporter, "onnx_model": onnx_model}
    exports = small_disk / "exports"
    command = ["export", str(colour_teacher), "--output", str(exports), "--dataset", colors_dataset]
    command += ["--quantize", "none", "--format", "all"]
    for module, step, leave in EXPORT_MOMENTS:
        with monkeypatch.context() as patch:
            original = getattr(modules[module], step)

            def filled_first(*args, original=original, leave=leave, **kwargs):
                full_disk.fill(small_disk, leave)
                return original(*args, **kwargs)

            patch.setattr(modules[module], step, filled_first)
            assert main(command) == 1, step
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.startswith("keras-vit export: error: No space left to write "), (step, line)
        home = exports / "colour_teacher"
        assert not home.exists() or not [n for n in os.listdir(home) if n[-1].isdigit()], os.listdir(home)
        os.remove(small_disk / full_disk.FILLER)
    assert main(command) == 0  # with the space back


PEAK_RSS_ON_EXIT = """
import atexit, sys
atexit.register(lambda: print("peak_rss_kb", next(
    line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:")), file=sys.stderr))
from keras_vit_cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_predict_on_5000_paths_prints_as_it_goes_in_bounded_memory(
    export_folder, image_folder, tmp_path, report
):
    """`keras-vit predict` given 5,000 paths (real photos, hard links, and a few bad files):
    the first answers print while it is still working, and its memory stays what it was then."""
    photos = sorted(image_folder.glob("*.png"))
    folder = tmp_path / "big"
    folder.mkdir()
    paths = []
    for i in range(5000):
        path = folder / f"{i:04d}.png"
        if i % 1000 == 999:
            path.write_bytes(b"not an image")
        else:
            os.link(photos[i % len(photos)], path)
        paths.append(str(path))
    model = os.path.join(export_folder["folder"], "model.tflite")
    command = [sys.executable, "-c", PEAK_RSS_ON_EXIT, "predict", model, *paths, "--top-k", "1"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    start = time.perf_counter()
    first = process.stdout.readline()
    first_seconds, still_running = time.perf_counter() - start, process.poll() is None
    status = open(f"/proc/{process.pid}/status").read() if still_running else ""
    at_first_mb = int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024 if still_running else 0
    rest = process.stdout.read()  # not communicate(): it would skip what readline buffered
    stderr = process.stderr.read()
    process.wait(timeout=HANG_SECONDS)
    seconds = time.perf_counter() - start
    lines = [first, *rest.splitlines(keepends=True)]
    peak_mb = int(re.search(r"peak_rss_kb (\d+)", stderr).group(1)) / 1024

    assert process.returncode == 1 and len(lines) == 5000  # 5 bad files: exit 1, every path answered
    assert sum(": error: " in line for line in lines) == 5
    assert [line.split(":")[0] for line in lines] == paths  # in order
    assert still_running, "nothing was printed before the end"
    assert peak_mb - at_first_mb < 40, (peak_mb, at_first_mb)
    report["load"]["`keras-vit predict` on 5,000 paths"] = (
        f"the first answer printed after {first_seconds:.1f} s, all 5,000 in {seconds:.0f} s, in order, "
        f"the 5 bad files with their line (exit 1); RSS {at_first_mb:.0f} MB at the first answer, "
        f"peak {peak_mb:.0f} MB"
    )


def _rss_mb(field):
    return next(
        int(line.split()[1]) / 1024 for line in open("/proc/self/status") if line.startswith(field + ":")
    )


def test_the_desktop_app_on_a_folder_of_5000_images_stays_responsive_and_cancels_within_a_second(
    qtbot, export_folder, image_folder, tmp_path, report
):
    """The folder table on 5,000 images (hard links to real photos): the window keeps handling
    events while rows arrive, memory stays put, and Cancel at 1,000 rows stops within a second."""
    from PySide6.QtCore import QSettings, QTimer

    from keras_vit.apps.desktop.window import MainWindow

    photos = sorted(image_folder.glob("*.png"))
    folder = tmp_path / "big"
    folder.mkdir()
    for i in range(5000):
        os.link(photos[i % len(photos)], folder / f"{i:04d}.png")
    window = MainWindow(settings=QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat))
    qtbot.addWidget(window)
    with qtbot.waitSignal(window.model_loaded, timeout=60_000):
        window.load_model(os.path.join(export_folder["folder"], "model.tflite"))

    ticks = []  # the UI thread's own timer: a gap means the window froze
    timer = QTimer()
    timer.timeout.connect(lambda: ticks.append(time.perf_counter()))
    timer.start(20)
    open("/proc/self/clear_refs", "w").write("5")  # the peak from here on
    before = _rss_mb("VmRSS")
    window.classify_folder(folder)
    qtbot.waitUntil(lambda: len(window.rows) >= 1000, timeout=300_000)
    with qtbot.waitSignal(window.folder_finished, timeout=5_000) as finished:
        cancelled_at = time.perf_counter()
        window.cancel_folder()
    stop_seconds = time.perf_counter() - cancelled_at
    timer.stop()
    growth = _rss_mb("VmHWM") - before

    rows = len(finished.args[0])
    assert 1000 <= rows < 5000 and "cancelled" in window.folder_label.text()
    assert stop_seconds < 1.0
    longest_gap = max(b - a for a, b in zip(ticks, ticks[1:], strict=False))
    assert longest_gap < 0.5, f"the window froze for {longest_gap:.2f} s"
    assert growth < 150, f"memory grew by {growth:.0f} MB"
    report["load"]["Desktop app, a folder of 5,000 images"] = (
        f"rows arrive while the window keeps handling events (longest pause {1000 * longest_gap:.0f} ms); "
        f"Cancel at {rows} rows stopped in {1000 * stop_seconds:.0f} ms; memory grew {growth:.0f} MB "
        f"(peak RSS, test process)"
    )


def test_the_desktop_apps_csv_on_a_full_disk_is_one_disk_full_error_and_no_file(small_disk):
    from keras_vit.apps.desktop.inference import CSV_COLUMNS, write_csv

    rows = [dict.fromkeys(CSV_COLUMNS, "x" * 100)] * 200  # about 140 KB
    full_disk.fill(small_disk, 16 << 10)
    with pytest.raises(DiskFullError, match=r"No space left to write .*predictions\.csv"):
        write_csv(rows, small_disk / "predictions.csv")
    assert os.listdir(small_disk) == [full_disk.FILLER]  # no partial file


def test_the_mobile_apps_front_end_install_on_a_full_disk_is_one_line_and_leaves_nothing(
    small_disk, tmp_path
):
    """LiteRT.js (38 MB) is installed once into the user's cache, here a 12 MB disk. npm itself
    reports success there, leaving empty .wasm files that a later run would have served."""
    from keras_vit.apps.mobile.build import ensure_front_end, front_end_folder

    env = dict(os.environ, XDG_CACHE_HOME=str(small_disk))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "environ", env)
        with pytest.raises(DiskFullError, match=r"No space left to write .*mobile-front-end"):
            ensure_front_end()
        cache = front_end_folder().parent
    assert not cache.exists() or not any(cache.iterdir())  # no half-installed packages
