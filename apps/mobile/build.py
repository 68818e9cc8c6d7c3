"""Builds the mobile app's static folder for one `.tflite`: page, LiteRT.js, model and cache list.

The folder holds everything the phone needs, so it can be served by `keras-vit app mobile`
or copied to any static HTTPS host:

    index.html, app.js, preprocess.js, style.css   the page (apps/mobile/web/)
    sw.js                                           the service worker, with its precache list
    manifest.webmanifest, icons/                    what makes it installable
    vendor/@litertjs/...                            LiteRT.js (package-lock.json)
    model.tflite, model.json                        the model and what its metadata says

model.json is read out of the `.tflite` (its metadata, label file and tensor details), so the
class names, image size and normalisation have one source: the exported model.

LiteRT.js comes from the package's own copy, which the wheel carries (`front_end.vendor()`, so
an installed keras-vit needs no Node.js), else, in a source checkout, from `npm ci` run once per
user into a cache folder named after the lock file (`front_end.front_end_folder()`), never into
the package, which may be read-only and is replaced by the next upgrade.
"""

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from keras_vit.apps.mobile.front_end import (
    HERE,
    VENDOR_FILES,
    front_end_folder,
    holds_front_end,
    packaged_front_end,
)
from keras_vit.data.contract import RESIZE, InputContract
from keras_vit.files import DiskFullError, folder_size
from keras_vit.inference.runtimes import TOP_K, TFLiteRunner
from keras_vit.storage.export_folder import TFLITE_FILE as MODEL_FILE

WEB = HERE / "web"
PAGE_FILES = ("index.html", "app.js", "preprocess.js", "style.css")
ICON_SIZES = (192, 512)
INPUT_TYPES = ("float32", "uint8", "int8")


_ROOM_LEFT = 1 << 20  # free bytes an install that had room leaves at least


def ensure_front_end():
    """Installs the locked front-end packages (`npm ci`) into `front_end_folder()` unless they
    are there already; returns its node_modules folder."""
    folder = front_end_folder()
    node_modules = folder / "node_modules"
    if holds_front_end(node_modules):
        return node_modules
    npm = shutil.which("npm")
    if npm is None:
        raise ValueError(
            "The mobile app needs LiteRT.js from npm once, and npm is not installed: install "
            "Node.js (e.g. `apt-get install nodejs npm`), then run `bash scripts/setup.sh apps`."
        )
    folder.parent.mkdir(parents=True, exist_ok=True)
    # Installed beside its final name and renamed into place: an interrupted install leaves nothing.
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        for name in ("package.json", "package-lock.json"):
            shutil.copyfile(HERE / name, staging / name)
        result = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=staging,
            capture_output=True,
            text=True,
        )
        # npm reports success when the disk fills as it unpacks (it leaves empty .wasm files):
        # a disk left without room is taken as one that ran out.
        if "ENOSPC" in result.stderr + result.stdout or shutil.disk_usage(staging).free < _ROOM_LEFT:
            raise DiskFullError(folder, folder_size(staging))
        if result.returncode != 0:
            detail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
            raise ValueError(
                f"`npm ci` for the mobile app's front end failed ({detail[0]}); run it in a copy of "
                f"{HERE / 'package-lock.json'} to see why."
            )
        if folder.exists():  # an incomplete earlier install
            shutil.rmtree(folder)
        os.replace(staging, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return node_modules


def front_end():
    """The folder to copy `VENDOR_FILES` from: the package's own copy (an installed wheel),
    else the npm cache (`ensure_front_end()`, a source checkout)."""
    return packaged_front_end() or ensure_front_end()


def describe_model(path):
    """What the app needs to know about a `.tflite`, read from the file itself (model.json).

    Raises:
        FileNotFoundError: no file at `path`.
        ValueError: not a TFLite model, no keras-vit metadata, or an input LiteRT.js and the
            app cannot feed (not a static `[1, height, width, 3]` image of floats or 8-bit ints).
    """
    import numpy as np

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Model not found: {path} (pass the .tflite that `keras-vit export` wrote).")
    if path.suffix == ".keras":
        raise ValueError(
            f"{path} is a Keras model; the phone runs a .tflite: export it first (`keras-vit export`)."
        )
    # The runner checks the file, reads the metadata and labels and finds the probabilities.
    runner = TFLiteRunner(path)
    metadata, image, contract = runner.metadata, runner.input_details, InputContract.of(runner)
    if runner.input_count != 1:
        raise ValueError(f"{path} has more than one input; the app feeds one image.")
    signature = [int(d) for d in image["shape_signature"]]
    if len(signature) != 4 or signature[0] != 1 or signature[3] != 3 or min(signature) < 1:
        raise ValueError(
            f"{path} takes input of shape {signature}; LiteRT.js in the browser needs a static "
            "[1, height, width, 3] image (-1 is a dynamic size). Re-export it with `keras-vit export`, "
            "which writes batch-1 models."
        )
    input_type = np.dtype(image["dtype"]).name
    if input_type not in INPUT_TYPES:
        raise ValueError(f"{path} takes {input_type} input; the app feeds {', '.join(INPUT_TYPES)}.")
    flatbuffer = runner.flatbuffer

    def quantization(details):
        scale, zero_point = details["quantization"]
        return {"dtype": np.dtype(details["dtype"]).name, "scale": float(scale), "zeroPoint": int(zero_point)}

    return {
        "name": metadata["name"] or path.stem,
        "description": metadata["description"],
        "file": MODEL_FILE,
        "topK": TOP_K,
        "bytes": len(flatbuffer),
        "sha256": hashlib.sha256(flatbuffer).hexdigest(),
        "imageSize": list(contract.image_size),
        "resize": RESIZE,  # the rule preprocess.js ports; the page refuses another
        "transform": contract.transform.config(),  # crop_pct, crop_mode, interpolation, from the .tflite
        "mean": metadata["mean"],  # the metadata's normalisation of the input tensor (MediaPipe's)
        "std": metadata["std"],
        "labels": contract.class_names,
        "input": quantization(image),
        "output": quantization(runner.output_details),
    }


def _manifest(description):
    return {
        "name": f"{description['name']} · keras-vit",
        "short_name": "ViT classifier",
        "description": f"Classifies photos into {len(description['labels'])} classes on the device, offline.",
        "start_url": "./",
        "scope": "./",
        "display": "standalone",
        "orientation": "portrait",
        "background_color": "#f6f6f9",
        "theme_color": "#1b1f3b",
        "icons": [
            {
                "src": f"icons/icon-{size}.png",
                "sizes": f"{size}x{size}",
                "type": "image/png",
                "purpose": "any maskable",
            }
            for size in ICON_SIZES
        ],
    }


def _draw_icon(size):
    """A 4 x 4 grid of patches, one lit: a ViT's view of an image. Kept in the maskable safe zone."""
    from PIL import Image, ImageDraw

    icon = Image.new("RGB", (size, size), "#1b1f3b")
    draw = ImageDraw.Draw(icon)
    grid, margin = 4, size * 0.22
    cell = (size - 2 * margin) / grid
    for row in range(grid):
        for col in range(grid):
            x, y = margin + col * cell, margin + row * cell
            colour = "#ff8c1a" if (row, col) == (1, 2) else "#3a3f7a"
            draw.rounded_rectangle(
                (x + cell * 0.08, y + cell * 0.08, x + cell * 0.92, y + cell * 0.92), cell * 0.15, fill=colour
            )
    return icon


def _version(folder, files):
    digest = hashlib.sha256()
    for name in files:
        digest.update(name.encode())
        digest.update(hashlib.sha256((folder / name).read_bytes()).digest())
    return digest.hexdigest()[:16]


def _is_replaceable(folder):
    # Only an empty folder or an earlier build is replaced, never a folder of the user's.
    return folder.is_dir() and (
        not any(folder.iterdir()) or (folder / "model.json").is_file() and (folder / "sw.js").is_file()
    )


def build_app(model_path, output):
    """Writes the app for `model_path` to the folder `output` (replaced whole) and returns its path.

    The folder is built beside `output` and renamed into place, so an interrupted build
    never leaves a half-written app.
    """
    description = describe_model(model_path)
    vendor = front_end()
    output = Path(output).resolve()
    if output.exists() and not _is_replaceable(output):
        raise ValueError(f"{output} exists and is not a mobile app build; choose another --output.")
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}-", dir=output.parent))
    try:
        for name in PAGE_FILES:
            shutil.copyfile(WEB / name, staging / name)
        for name in VENDOR_FILES:
            (staging / "vendor" / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(vendor / name, staging / "vendor" / name)
        shutil.copyfile(model_path, staging / MODEL_FILE)
        (staging / "model.json").write_text(json.dumps(description, indent=2) + "\n")
        (staging / "manifest.webmanifest").write_text(json.dumps(_manifest(description), indent=2) + "\n")
        (staging / "icons").mkdir()
        for size in ICON_SIZES:
            _draw_icon(size).save(staging / "icons" / f"icon-{size}.png")

        files = sorted(p.relative_to(staging).as_posix() for p in staging.rglob("*") if p.is_file())
        precache = {"version": _version(staging, files), "files": ["./", *files]}
        service_worker = (WEB / "sw.js").read_text().replace("__PRECACHE__", json.dumps(precache))
        (staging / "sw.js").write_text(service_worker)

        if output.exists():
            shutil.rmtree(output)
        os.replace(staging, output)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return output
