"""Shared fixtures: tiny configs and images, so the suite stays fast on 2 CPU cores."""

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # the desktop app's tests need no display
# One thread per op, in the workers and every process they start (TensorFlow's Eigen pool,
# PyTorch's and NumPy's OpenMP): three workers and their subprocesses already share CI's 2 cores,
# and a pool that spins waiting for work on a busy core only burns it. The same four test files
# took 12% less CPU and 10% less time so (tests are not timed: this changes no result).
os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
# XLA's LLVM backend at -O0, in the workers and every process they start (JAX, and TensorFlow's
# jit_compile): the tests' models are tiny, so compiling is most of a JAX run's CPU, and the
# model-parallel test took 34 s instead of 51 so. The HLO passes (fusion, scheduling, buffer
# assignment, the memory figures) are the same; only the machine code is less optimised.
os.environ["XLA_FLAGS"] = " ".join(
    filter(None, (os.environ.get("XLA_FLAGS"), "--xla_backend_optimization_level=0"))
)

import atexit  # noqa: E402
import contextlib  # noqa: E402
import gc  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402

from hub_server import HubServer  # noqa: E402

# Nothing downloads from a real model hub: huggingface_hub talks to a stand-in on 127.0.0.1
# that serves the repos tests write, in this process and the subprocesses it starts. It reads
# its settings once, at import (timm's, below). Tests that download set their own cache
# (`hub_cache`).
HUB = HubServer(tempfile.mkdtemp(prefix="keras-vit-hub-"))
os.environ.update(
    HF_ENDPOINT=HUB.url,
    HF_HUB_DISABLE_XET="1",
    HF_HUB_DISABLE_TELEMETRY="1",
    HF_HUB_CACHE=tempfile.mkdtemp(prefix="keras-vit-hub-cache-"),
)
atexit.register(shutil.rmtree, HUB.root, ignore_errors=True)
atexit.register(shutil.rmtree, os.environ["HF_HUB_CACHE"], ignore_errors=True)

try:
    # PyTorch must load before TensorFlow: importing torchvision (through timm) after
    # TensorFlow segfaults in this pair of wheels. The weight tests need both.
    import timm  # noqa: F401
    import torch  # noqa: F401
except ImportError:
    pass

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from keras_vit.storage.export_folder import INTEGER_VARIANTS  # noqa: E402

# The slowest files first (minutes each: subprocess training runs, exports, a browser, timm's
# kinds), by their totals in a --junitxml run of the whole suite on the 2-core Zen 4 EPYC
# (2026-11-29, a fresh clone, three workers, 861 s). scripts/test.sh runs three pytest-xdist
# workers that take one file at a time, in this order (--no-loadscope-reorder): a slow file left
# for last would run alone at the end. A file missing here runs after all of them: add a new
# file that takes over a minute.
SLOWEST_FILES = (
    "test_reliability.py",  # 252 s (its setup waits while another worker builds export_folder)
    "test_scale.py",  # 233 s
    "test_distribute.py",  # 178 s
    "test_real_checkpoint.py",  # 146 s
    "test_export.py",  # 135 s
    "test_quickstart.py",  # 133 s: one test, the quickstart end to end
    "test_timm_kinds.py",  # 133 s
    "test_train.py",  # 110 s
    "test_swin_training.py",  # 89 s
    "test_readme.py",  # 87 s
    "test_benchmarks.py",  # 73 s
    "test_mobile_app.py",  # 72 s
    "test_eva.py",  # 62 s
    "test_quantize.py",  # 60 s
    "test_eva_training.py",  # 57 s
    "test_app_backbones.py",  # 57 s
    "test_models.py",  # 52 s
    "test_readme_export.py",  # 50 s
    "test_pretrained.py",  # 45 s
    "test_jax_backend.py",  # 42 s
    "test_pipeline.py",  # 41 s
    "test_swin_export.py",  # 36 s
    "test_weights.py",  # 36 s
    "test_rotate.py",  # 27 s
)


def pytest_generate_tests(metafunc):
    """`KERAS_VIT_TEST_REPEAT=N pytest ... -x`: each test N times in a row in one session (the
    module's fixtures built once), to show that it never fails at random."""
    repeat = int(os.environ.get("KERAS_VIT_TEST_REPEAT", "1"))
    if repeat > 1:
        metafunc.fixturenames.append("_attempt")
        metafunc.parametrize("_attempt", range(1, repeat + 1), indirect=True, ids=lambda n: f"attempt{n}")


@pytest.fixture
def _attempt(request):
    return request.param


def pytest_collection_modifyitems(config, items):
    seed = os.environ.get("KERAS_VIT_TEST_ORDER_SEED")
    if seed is not None:  # a shuffled order, to show that no test depends on another's leftovers
        _shuffle_files_and_tests(items, int(seed))
        return

    def rank(item):
        name = item.path.name
        return SLOWEST_FILES.index(name) if name in SLOWEST_FILES else len(SLOWEST_FILES)

    items.sort(key=rank)  # stable: the other files, and each file's tests, keep their order


def pytest_collection_finish(session):
    """Every test module is imported now, and with them PyTorch, TensorFlow, JAX and timm: their
    ~750,000 objects live as long as the worker. Frozen, Python's full collections skip them,
    and so does the `gc.collect()` that TFLite's converter runs for every file it writes (0.4 s
    each, in a worker, unfrozen). On tests/export/test_quantize.py, test_swin_export.py and
    tests/model/test_timm_kinds.py (two workers) the workers' full collections took 9 s instead
    of 28. Nothing a test checks changes: frozen objects are the imports', never collected anyway."""
    gc.collect()
    gc.freeze()


def _shuffle_files_and_tests(items, seed):
    """`KERAS_VIT_TEST_ORDER_SEED=N bash scripts/test.sh`: the files in a random order, and each
    file's tests in a random order (xdist still gives a file's tests to one worker)."""
    import random

    by_file = {}
    for item in items:
        by_file.setdefault(item.path, []).append(item)
    picker = random.Random(seed)
    files = list(by_file)
    picker.shuffle(files)
    items[:] = [item for path in files for item in picker.sample(by_file[path], len(by_file[path]))]


# A line TensorFlow, XLA, absl or LiteRT writes from C++ ("I0000 00:00:...", "E0000 ... cuInit"):
# the CLI shows none unless --verbose.
NATIVE_LOG_LINE = r"(?m)^([IWEF]\d{4} |WARNING: All log messages before absl|INFO: Created TensorFlow Lite)"

# dim 32, depth 2, 32 x 32 images: the suite's standard model.
# A subprocess that runs this long has hung: a guard, never a time limit (tests are not timed;
# under three workers on 2 cores, a minute's training run takes five).
HANG_SECONDS = 1800

# The tests' one tiny ViT (32x32 images, 8x8 patches of 4, width 32, 2 blocks); TINY_MODEL is its
# size as overrides of a named config (`keras-vit train --override`).
TINY = dict(image_size=32, patch_size=4, hidden_dim=32, depth=2, num_heads=4, mlp_dim=64, num_classes=10)
TINY_MODEL = {key: TINY[key] for key in ("hidden_dim", "depth", "num_heads", "mlp_dim")}


def encoded_in_every_format():
    """(name, bytes) of one photo-like image in every format a dataset may hold: EXIF-rotated
    JPEG, progressive JPEG, gray and transparent PNG, GIF, BMP, WebP and TIFF."""
    import io

    from PIL import Image

    rng = np.random.default_rng(1)
    smooth = np.cumsum(rng.integers(0, 9, (30, 44, 3)), axis=1).clip(0, 255).astype(np.uint8)
    photo = Image.fromarray(smooth)
    exif = Image.Exif()
    exif[0x0112] = 6  # shown rotated 90 degrees clockwise

    def encoded(image, format, **options):
        buffer = io.BytesIO()
        image.save(buffer, format, **options)
        return buffer.getvalue()

    transparent = photo.convert("RGBA")
    transparent.putalpha(Image.fromarray(rng.integers(0, 256, (30, 44), np.uint8)))
    return [
        ("rotated.jpg", encoded(photo, "JPEG", quality=90, exif=exif.tobytes())),
        ("progressive.jpg", encoded(photo, "JPEG", progressive=True)),
        ("gray.png", encoded(photo.convert("L"), "PNG")),
        ("transparent.png", encoded(transparent, "PNG")),
        ("palette.gif", encoded(photo, "GIF")),
        ("photo.bmp", encoded(photo, "BMP")),
        ("photo.webp", encoded(photo, "WEBP", lossless=True)),
        ("photo.tiff", encoded(photo, "TIFF")),
    ]


@pytest.fixture
def tiny_config():
    return dict(TINY)


@pytest.fixture
def images():
    return np.random.default_rng(0).normal(size=(2, 32, 32, 3)).astype("float32")


def with_xla_flags(*flags):
    """The run's XLA_FLAGS (above) and `flags`, for a process that needs its own."""
    return " ".join((os.environ["XLA_FLAGS"], *flags))


@pytest.fixture(scope="session", autouse=True)
def _shared_jax_compilation_cache(tmp_path_factory):
    """One XLA compilation cache for every JAX process the run starts (all workers', in a folder
    beside their temporary folders, new each run). A JAX process compiles each eager op once
    (the initializers take 2 s of a tiny training run's 7.5 s of compiling) and a resumed or
    repeated run compiles its steps again: JAX reads those from here. The four training files
    that start JAX processes took 495 s of CPU instead of 520. A cached executable is the one
    the compiler made, so no result changes (tests are not timed)."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    os.environ.update(
        JAX_COMPILATION_CACHE_DIR=str(shared / "jax-compilation-cache"),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
    )


@pytest.fixture(autouse=True)
def _float32_policy():
    """Tests that change the global dtype policy must not leak it into others."""
    yield
    keras.config.set_dtype_policy("float32")


@pytest.fixture(scope="session")
def colors_dataset(tmp_path_factory):
    """3 classes x 24 images of 32x32: a colour per class plus noise, so a tiny ViT can learn it."""
    from PIL import Image

    root = tmp_path_factory.mktemp("colors")
    rng = np.random.default_rng(0)
    for label, name in enumerate(("red", "green", "blue")):
        os.makedirs(root / name)
        for i in range(24):
            image = rng.integers(0, 80, size=(32, 32, 3), dtype=np.uint8)
            image[..., label] += 150
            Image.fromarray(image).save(root / name / f"{i:02d}.png")
    return str(root)


# colors_dataset's classes (sorted folder names), and the class colour_teacher gives each
# dominant channel: never the true one (red -> green, green -> blue, blue -> red).
COLOR_CLASSES = ["blue", "green", "red"]
TEACHER_CLASS_OF_CHANNEL = {0: 1, 1: 0, 2: 2}


@pytest.fixture(scope="session")
def colour_teacher(tmp_path_factory):
    """A `.keras` teacher for colors_dataset that is wrong on every image, set by hand: a GAP ViT
    whose blocks are identities (zero outputs) and whose patch embedding is each patch's mean
    colour, with a head that maps each colour to another class. A student that learns its labels
    learns something the true labels cannot teach."""
    from keras_vit import ViT

    model = ViT(
        image_size=32, patch_size=8, hidden_dim=8, depth=1, num_heads=2, mlp_dim=8, class_token=False,
        pooling="gap", num_classes=3, class_names=COLOR_CLASSES, image_mean=[0, 0, 0], image_std=[1, 1, 1],
        name="colour_teacher",
    )  # fmt: skip
    values = {w.path: np.zeros(w.shape, "float32") for w in model.weights}
    values["norm/gamma"][:] = 1
    for channel, teacher_class in TEACHER_CLASS_OF_CHANNEL.items():
        values["patch_encoder/projection/kernel"][:, :, channel, channel] = 1 / 64  # the mean
        values["head/kernel"][channel, teacher_class] = 1
    for weight in model.weights:
        weight.assign(values[weight.path])
    path = tmp_path_factory.mktemp("teacher") / "colour_teacher.keras"
    model.save(path)
    return path


@pytest.fixture(scope="session")
def colour_teacher_tflite(colour_teacher, tmp_path_factory):
    """colour_teacher exported as an fp32 `.tflite` (with its labels in the metadata)."""
    from keras_vit.export.exporter import export_model
    from keras_vit.storage.export_folder import tflite_file

    manifest = export_model(
        colour_teacher, output=str(tmp_path_factory.mktemp("teacher_export")), formats=("tflite",),
        quantize=(), verify=False,
    )  # fmt: skip
    return os.path.join(manifest["folder"], tflite_file("fp32"))


@pytest.fixture(scope="session")
def image_folder(tmp_path_factory):
    """20 real CIFAR-10 test images from the embedded dataset, as PNG files."""
    from keras_vit.data import datasets as data

    folder = tmp_path_factory.mktemp("images")
    dataset = data.load_dataset("cifar10-mini")
    pairs = list(dataset["test"].to_dataset().as_numpy_iterator())
    for i, (encoded, label) in enumerate(pairs[::25][:20]):
        (folder / f"{i:02d}_{dataset.class_names[label]}.png").write_bytes(encoded)
    return folder


@pytest.fixture(scope="session")
def export_folder(tmp_path_factory):
    """A tiny ViT trained for one epoch, exported: SavedModel, TFLite fp32, attention and the
    integer variants (`model.tflite` is the fp32 one: the exports are not verified).

    Built once for the whole run: pytest-xdist's workers share it through a folder beside their
    own temporary folders, the first to take the lock building it (about 35 s). Tests only read it.
    """
    import fcntl
    import json

    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        return _build_export_folder(tmp_path_factory.mktemp("export_folder"))
    shared = tmp_path_factory.getbasetemp().parent / "export_folder"
    with open(str(shared) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        manifest = shared / "manifest.json"
        if not manifest.exists():
            built = _build_export_folder(shared)
            manifest.write_text(json.dumps(built))
        return json.loads(manifest.read_text())


def _build_export_folder(root):
    from keras_vit.export.exporter import export_model
    from keras_vit.training.config import TrainConfig
    from keras_vit.training.train import train

    run = root / "run" / "run"
    train(
        TrainConfig(
            model="vit_nano_patch4_32",
            dataset="cifar10-mini",
            output=str(run),
            epochs=1,
            batch_size=64,
            overrides={"hidden_dim": 32, "depth": 2, "num_heads": 4, "mlp_dim": 64},
            jit_compile=False,  # XLA's CPU compile costs seconds; the exports are under test
        )
    )
    manifest = export_model(
        str(run),
        output=str(root / "exports"),
        formats=("saved_model", "tflite"),
        quantize=INTEGER_VARIANTS,  # for the apps: each runs them as it runs fp32
        verify=False,
        attention=True,
    )
    return manifest


@pytest.fixture(scope="module")
def phone():
    """Headless Chromium as a phone (Playwright), for the mobile app's tests.

    Skipped on a machine without Chromium, but never under CI, where
    scripts/setup.sh dev installs it: there a missing browser fails the test.
    """
    pytest.importorskip("playwright")
    from keras_vit.apps.mobile import browser

    if browser.find_chromium() is None:
        message = "Chromium is not installed (apt-get install chromium; scripts/setup.sh dev does it as root)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    with browser.phone_browser() as opened:
        yield opened


@contextlib.contextmanager
def phone_app(phone, model_path, folder):
    """The phone app built for the `.tflite` at `model_path` into `folder`, served on a free local
    port and opened in a new context of `phone`: yields the page; closes both after."""
    from keras_vit.apps.mobile import browser, server
    from keras_vit.apps.mobile.build import build_app

    httpd = server.make_server(build_app(model_path, folder), "127.0.0.1", 0)
    server.serve_in_background(httpd)
    context = phone.new_context()
    try:
        yield browser.open_app(context, server.urls(httpd)[0])
    finally:
        context.close()
        httpd.shutdown()
        httpd.server_close()


_PARITY = []


@pytest.fixture
def record_parity():
    """Records a measured max |difference| so the run ends with the parity table."""

    def record(case, difference, tolerance):
        _PARITY.append((case, difference, tolerance))
        return difference

    return record


def pytest_terminal_summary(terminalreporter):
    if not _PARITY:
        return
    terminalreporter.section("parity with reference implementations (max |difference|)")
    for case, difference, tolerance in _PARITY:
        terminalreporter.write_line(f"{case:<72} {difference:.2e}  (tolerance {tolerance:.0e})")


@pytest.fixture
def small_disk(tmp_path):
    """A 12 MB tmpfs, as a disk that fills up (the tests run as root); `fill()` fills it."""
    mount = tmp_path / "disk"
    mount.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=12m", "tmpfs", str(mount)], capture_output=True
    )
    if mounted.returncode != 0:
        if os.environ.get("CI"):
            pytest.fail(f"cannot mount a tmpfs to fill: {mounted.stderr.decode().strip()}")
        pytest.skip("mounting a tmpfs needs root")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty huggingface_hub cache for this test and the subprocesses it starts (the stand-in
    hub, `HUB`, serves what the test writes under `HUB.root`)."""
    from huggingface_hub import constants

    cache = tmp_path / "hub-cache"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


# Real material beside the checkout (never committed): timm's real ViT-Ti/16 in its hub layout,
# and ImageNet validation photos of ten classes (Imagenette), in folders named by WordNet id.
SHARED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared")
REAL_VIT_TI = "timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k"
REAL_PHOTOS = os.path.join(SHARED, "datasets", "imagenette2_224_val.zip")


def _shared(path):
    """A path in ../shared, or a skip (a failure under CI, where ../shared is always there)."""
    if not os.path.exists(path):
        if os.environ.get("CI"):
            pytest.fail(f"{path} is missing: CI runs with ../shared beside the checkout")
        pytest.skip(f"{path} is missing (../shared beside the checkout)")
    return path


def serve_real_vit_ti():
    """The stand-in hub serves the real checkpoint under its real repo id, so timm's names
    (`vit_tiny_patch16_224`, `...augreg_in21k_ft_in1k`) resolve to it, as on the real hub."""
    source = _shared(os.path.join(SHARED, "pretrained", *REAL_VIT_TI.split("/")))
    folder = HUB.repo_folder(REAL_VIT_TI)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    for name in os.listdir(source):
        os.symlink(os.path.abspath(os.path.join(source, name)), os.path.join(folder, name))
    return os.path.abspath(source)


def real_photos(folder, classes, per_class):
    """The first `per_class` photos (by name) of each WordNet id in `classes`, from the real
    ImageNet validation photos, written to `folder/<wnid>/`."""
    import zipfile

    with zipfile.ZipFile(_shared(REAL_PHOTOS)) as archive:
        names = sorted(n for n in archive.namelist() if n.lower().endswith(".jpeg"))
        for wnid in classes:
            os.makedirs(os.path.join(folder, wnid))
            for name in [n for n in names if f"/{wnid}/" in n][:per_class]:
                with open(os.path.join(folder, wnid, os.path.basename(name)), "wb") as f:
                    f.write(archive.read(name))
    return folder


def correlated_layer():
    """A kernel (48 inputs, 24 outputs), inputs of rank 16 that correlate its rows, and the
    kernel's per-channel int8 step: where a rounding that sees the inputs beats the nearest one."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2000, 16)) @ rng.normal(size=(16, 48))
    kernel = rng.normal(size=(48, 24)) * 0.05
    return x, kernel, np.abs(kernel).max(0) / 127


def tflite_outputs(flatbuffer, images):
    """`(probabilities, input dtype, output dtype)` of a `.tflite` on `images` (float pixels in
    [0, 255], rounded and cast to the file's input type), one image at a time, a uint8 output
    dequantised."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=flatbuffer)
    interpreter.allocate_tensors()
    given, output = interpreter.get_input_details()[0], interpreter.get_output_details()[0]
    results = []
    for image in images:
        interpreter.set_tensor(given["index"], np.round(image).astype(given["dtype"])[None])
        interpreter.invoke()
        value = interpreter.get_tensor(output["index"])[0].astype(np.float32)
        scale, zero_point = output["quantization"]
        results.append((value - zero_point) * scale if output["dtype"] != np.float32 else value)
    return np.stack(results), given["dtype"], output["dtype"]
