"""Every image input on every surface: classified, or one clear message that names it.

The surfaces: the Python API (`predict_files`), the CLI (`keras-vit predict`, all files in one
call), the TF Serving signature (`serving_default`, one request per image), the desktop app's
inference and the mobile app in Chromium. The results are written to docs/reliability.md.
"""

import io
import os
import re
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest
from PIL import Image

from keras_vit.files import atomic_write

VENV_BIN = os.path.dirname(sys.executable)
REPORT = os.path.join(os.path.dirname(__file__), os.pardir, "docs", "reliability.md")
SURFACES = ("Python API", "CLI", "TF Serving", "Desktop app", "Mobile app")
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
def report(inputs):
    """Collects each surface's result per input; written to docs/reliability.md at the end."""
    results = {}
    yield results
    if set(results) == set(SURFACES):  # only a complete run rewrites the document
        atomic_write(REPORT, lambda temporary: _write_report(temporary, inputs, results))


def _cell(value):
    return value.replace("|", "\\|").replace("\n", " ").replace('\\"', '"').replace("\\'", "'")


def _write_report(path, inputs, results):
    lines = [
        "# Reliability: every image input on every surface",
        "",
        "Generated by `tests/test_reliability.py` (do not edit by hand): each image input from",
        "issue 8's lists, given to each surface that takes images. ✓ is a prediction (the top-1 class",
        "of the suite's one-epoch tiny model, so the classes themselves mean little); ✗ is the",
        "message the user sees, which names the input. The tests assert that every input in the",
        "first group is classified and every one in the second gets its message, with no",
        "traceback and no hang; in the CLI and the apps the other images of the same call are",
        "still classified.",
        "",
        "Surfaces: Python API `keras_vit.predict.predict_files`; CLI `keras-vit predict MODEL",
        "IMAGES...` (all inputs in one call, exit status 1 when any failed); TF Serving: the",
        "SavedModel's `serving_default` signature, one request per image (an error is that",
        "request's INVALID_ARGUMENT, whose text starts with TensorFlow's function name, left out",
        "here); the desktop app's inference (`LoadedModel.classify_file`,",
        "whose message the window shows in its banner); the mobile app in headless Chromium as a",
        "phone (a picked file; paths and folders cannot be picked, so n/a).",
        "",
        "| input | " + " | ".join(SURFACES) + " |",
        "|---" * (len(SURFACES) + 1) + "|",
    ]
    for must_work in (True, False):
        lines.append(f"| **{'must work' if must_work else 'must fail cleanly'}** |" + " |" * len(SURFACES))
        for name, _, description, works in inputs:
            if works == must_work:
                cells = [_cell(results[surface][name]) for surface in SURFACES]
                lines.append(f"| {description} (`{name}`) | " + " | ".join(cells) + " |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def _check(surface, inputs, outcome, report):
    """`outcome(name, path)` -> ("ok", class) or ("error", message) or None (n/a)."""
    results = {}
    for name, path, _, must_work in inputs:
        result = outcome(name, path)
        if result is None:
            results[name] = NOT_APPLICABLE
            continue
        kind, text = result
        assert "Traceback" not in text, (surface, name, text)
        text = _readable(text, path.parent)
        if must_work:
            assert kind == "ok", (surface, name, text)
            results[name] = f"✓ {text}"
        else:
            assert kind == "error", (surface, name, text)
            results[name] = f"✗ {text}"
    report[surface] = results
    return results


def _first_line(message):
    return str(message).strip().splitlines()[0]


def test_python_api(export_folder, inputs, report):
    from keras_vit.export.runtimes import open_model
    from keras_vit.predict import predict_files

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

    from keras_vit.export.runtimes import SavedModelRunner

    runner = SavedModelRunner(
        os.path.normpath(os.path.join(export_folder["folder"], export_folder["saved_model"]))
    )

    from keras_vit.export.runtimes import open_model
    from keras_vit.predict import read_image

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


def test_mobile_app(export_folder, inputs, report, tmp_path):
    pytest.importorskip("playwright")
    from keras_vit.apps.mobile import browser, server
    from keras_vit.apps.mobile.build import build_app

    if browser.find_chromium() is None:
        if os.environ.get("CI"):
            pytest.fail("Chromium is not installed (scripts/setup.sh dev installs it as root)")
        pytest.skip("Chromium is not installed")
    folder = build_app(os.path.join(export_folder["folder"], "model.tflite"), tmp_path / "app")
    httpd = server.make_server(folder, "127.0.0.1", 0)
    server.serve_in_background(httpd)
    try:
        with browser.phone_browser() as phone:
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
