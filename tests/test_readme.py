"""Every fenced block of README.md and of the documentation site's pages (docs/, in the order
of mkdocs.yml's nav), run as a newcomer runs it, or listed here with the reason it cannot run
in CI: the README and the docs cannot drift from the code again.

`PYTHON_BLOCKS` (keyed by a block's first line) and `COMMANDS` (each shell command, comments
dropped) say how each is treated. `Run` runs it in one scratch folder, in page order and in
one Python process (`keras-vit` commands through `keras_vit.cli.main`), with declared
stand-ins: (page text, what runs instead) pairs, each of which must still occur in the
pages, and the files `SCRATCH_FILES` writes where a page names a download or a user's
files; pretrained names the README downloads come from a stand-in hub (`HUB_REPOS`). A
skipped `keras-vit` command must still parse. A block or command the tables do not know
fails the test, so a new one must be sorted into them.
"""

import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys

import pytest
from conftest import HANG_SECONDS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MKDOCS = os.path.join(ROOT, "mkdocs.yml")
# The reports under docs/benchmarks/ are written by their scripts (their blocks are the commands
# that made them): the pages whose blocks run are the hand-written ones.
GENERATED = "benchmarks/"


@dataclasses.dataclass(frozen=True)
class Run:
    """Runs as written but for `stand_ins`; then `check`, Python that sees the session's
    names, the block's text as `block` and what it printed as `printed`."""

    stand_ins: tuple = ()
    prelude: str = ""
    check: str = ""
    tfds_mock: bool = False  # tfds reads generated examples (tfds.testing.mock_data): no download
    part: str | None = None  # which session runs it, when not its section's (see PARTS)


@dataclasses.dataclass(frozen=True)
class Skip:
    reason: str


# Training commands take one step of 4 images with one block, without XLA's compile: what they
# write is checked, not how well they learn (tracing 12 blocks costs ~10 s a model on CI's CPU).
ONE_STEP = "--epochs 1 --steps-per-epoch 1 --batch-size 4 --no-jit-compile --override depth=1"
# The model the export page exports learns photos/ (colours, easy) in 24 steps instead: a model of one
# step has near-tied classes, which the quantised variants reorder, failing their agreement check.
LEARNS_PHOTOS = "--dataset photos --epochs 8 --batch-size 7 --no-jit-compile --override depth=1"
# Exports verify on 20 held-out images instead of 500.
FEW_IMAGES = "--verify-images 20"

# Written into the scratch folder before the first block: what the pages name but do not make.
SCRATCH_FILES = """
import os
import numpy as np
from PIL import Image
import timm, safetensors.torch

rng = np.random.default_rng(0)
for label, name in enumerate(("daisy", "rose", "tulip")):  # photos/: a user's class folders
    os.makedirs(f"photos/{name}")
    for i in range(8):
        pixels = rng.integers(0, 90, (40, 48, 3), dtype=np.uint8)
        pixels[..., label] += 160
        Image.fromarray(pixels).save(f"photos/{name}/{i}.jpg", quality=90)
Image.fromarray(rng.integers(0, 256, (60, 50, 3), dtype=np.uint8)).save("cat.jpg")
# A timm checkpoint as downloaded from a hub, with random weights and one block (as ONE_STEP).
tiny = timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=1)
safetensors.torch.save_file(tiny.state_dict(), "vit_tiny_patch16_224.safetensors")
"""

# The pretrained names the README's example and the Fine-tune page's backbones download, served by a
# stand-in hub (tests/hub_server.py) as timm's repos: {repo: the timm name whose pretrained_cfg it
# carries}. Each is that ViT with one block and random weights (as ONE_STEP), saved as timm's
# save_for_hf saves a model.
HUB_REPOS = {
    f"timm/{name}": name
    for name in (
        "vit_tiny_patch16_224.augreg_in21k_ft_in1k",
        "vit_small_patch14_dinov2.lvd142m",
        "vit_small_patch16_dinov3.lvd1689m",
    )
}


def _stand_in_hub(root):
    import timm
    import torch
    from hub_server import HubServer
    from timm.models import save_for_hf

    hub = HubServer(root)
    torch.manual_seed(0)
    for repo, name in HUB_REPOS.items():
        model = timm.create_model(name, pretrained=False, depth=1)
        save_for_hf(model, hub.repo_folder(repo), model_args={"depth": 1}, safe_serialization=True)
    return hub


# The other pretrained names download from the hub, which this machine cannot reach: the tests in
# tests/model/test_pretrained.py, tests/training/test_pretrained_start.py and
# tests/export/test_pretrained_export.py run the same calls against a stand-in hub.
_HUB = Skip("downloads from the model hub; the pretrained tests run it against a stand-in hub")

PYTHON_BLOCKS = {
    # The README's example: its pretrained name downloads from the stand-in hub (HUB_REPOS).
    "import keras, keras_vit": Run(
        stand_ins=(
            ("batch_size=32", "batch_size=8"),
            ("epochs=5", "epochs=1"),
            ('dataset="photos/")', 'dataset="photos/", verify_images=20)'),  # as FEW_IMAGES
        ),
        check="""
import glob
cached = os.listdir(os.environ["HF_HUB_CACHE"])
assert "models--timm--vit_tiny_patch16_224.augreg_in21k_ft_in1k" in cached, cached
assert model.get_config()["depth"] == 1  # the stand-in repo's config.json, read from the hub
assert any("head layer re-initialised" in line for line in WARNINGS), WARNINGS
assert keras.models.load_model("flowers.keras").class_names == data.class_names == ["daisy", "rose", "tulip"]
(folder,) = glob.glob("exports/*/export-1")
for name in ("model.tflite", "model_fp16.tflite", "model.onnx", "verification.json"):
    assert os.path.exists(f"{folder}/{name}"), name
assert open(f"{folder}/labels.txt").read().split() == data.class_names
assert glob.glob("exports/*/1/saved_model.pb")
""",
    ),
    "import keras_vit": _HUB,
    "import keras": Run(
        stand_ins=(
            ("image_size=(384, 384), batch_size=32", "image_size=(64, 64), batch_size=8"),
            ('"vit_base_patch16_384",', '"vit_tiny_patch16_384", image_size=64, depth=1,'),
            ('"vit_base_patch16_224.augreg_in21k_ft_in1k.safetensors"', '"vit_tiny_patch16_224.safetensors"'),
            ("epochs=10", "epochs=1"),
        ),
        check="""
first, last = re.search(r"list_models\\(\\)\\s+# \\['(\\w+)', \\.\\.\\., '(\\w+)'\\]", block).groups()
assert (keras_vit.list_models()[0], keras_vit.list_models()[-1]) == (first, last)
assert any("head layer re-initialised" in line for line in WARNINGS), LOGGED
assert any("from a 14x14 to a 4x4 patch grid" in line for line in LOGGED), LOGGED
reloaded = keras.models.load_model("vit.keras")
assert reloaded.class_names == data.class_names == ["daisy", "rose", "tulip"]
assert vit_48.image_size == (48, 48) and vit.dtype_policy.name == "mixed_bfloat16"
""",
    ),
    "grids = keras_vit.features.intermediates(model, images, indices=[3, 7, 11], norm=True)": Run(
        stand_ins=(("indices=[3, 7, 11]", "indices=[0]"), ("indices=[3, 7, 11]", "indices=[0]")),
        prelude="images = next(iter(val_ds))[0]  # a batch of the Use block's validation images",
        check="""
assert [grid.shape[1:3] for grid in grids] == [(4, 4)]
assert os.path.exists("vit_features/saved_model.pb")
assert printed == "", printed  # verbose=False: no capture dump
""",
    ),
    'swin = keras_vit.create_model("swin_tiny_patch4_window7_224", num_classes=10)': Run(
        prelude="import numpy as np",
        check="""
assert swin.family == "swin" and keras_vit.parameter_count("swin_tiny_patch4_window7_224") == 28_288_354
assert [m.shape[1:] for m in maps] == [(64, 64, 96), (32, 32, 192), (16, 16, 384), (8, 8, 768)]
""",
    ),
    "# REST from Python": Skip(
        "needs a TF Serving server (Docker); test_export checks the signature it serves"
    ),
    # The Fine-tune page's backbones: DINOv2 and DINOv3 from the stand-in hub (HUB_REPOS), with their
    # tags' pretrained_cfg; `data` is the Build block's (photos/).
    "# timm's DINOv2 ViT-S/14 has no classifier: the model gives each image's pooled embedding": Run(
        check="""
assert backbone.output_shape == (None, 384) and not backbone.include_top
assert dinov2.output_shape == (None, 3) and dinov2.image_size == (224, 224)
assert any("head layer re-initialised" in line for line in WARNINGS), WARNINGS
assert any("from a 37x37 to a 16x16 patch grid" in line for line in LOGGED), LOGGED
assert (dinov2.image_mean, dinov2.image_std) == ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
assert (dinov2.crop_pct, dinov2.crop_mode, dinov2.interpolation) == (1.0, "center", "bicubic")
assert dinov2.license == "apache-2.0"
assert "head" not in multipliers and multipliers["patch_encoder"] == 0.65 ** (dinov2.depth + 1)
assert multipliers["norm"] == multipliers[f"block_{dinov2.depth - 1}"]
assert dinov3.output_shape == (None, 384) and dinov3.license == "dinov3-license"
assert (dinov3.global_pool, dinov3_cls.global_pool) == ("avg", "token")
""",
    ),
    "import math": Run(check="assert printed.strip() == '450058', printed"),  # LoRA's trainable count
    "import mediapipe as mp": Run(),  # on the export block's model and cat.jpg
}

COMMANDS = {
    "keras-vit predict vit_small_patch16_224.augreg_in21k_ft_in1k cat.jpg": _HUB,
    "keras-vit train --weights vit_small_patch16_224.augreg_in21k_ft_in1k --dataset my_photos/ "
    "--early-stopping 3 --output runs/mine": _HUB,
    "keras-vit export runs/mine": _HUB,
    "python benchmarks/finetune_cifar10.py": Skip(
        "25 minutes of training on ../shared's CIFAR-10; tests/test_benchmarks.py checks its report and "
        "tests/test_real_checkpoint.py fine-tunes and exports the real ViT-Ti on a few photos"
    ),
    "keras-vit train --weights vit_tiny_patch16_224 --preset finetune --dataset cifar10_png.zip "
    "--image-size 160 --epochs 6 --steps-per-epoch 150 --batch-size 64 --validation-split 0.02 "
    "--early-stopping 2": Skip(
        "the benchmark above, by the command line (tests/test_real_checkpoint.py fine-tunes the real ViT-Ti)"
    ),
    "keras-vit export vit_tiny_patch16_224 --format tflite --quantize all "
    "--dataset imagenette2_224/val": Skip(
        "minutes on the real checkpoint and 3,925 photos; tests/test_real_checkpoint.py exports it on 12"
    ),
    "bash scripts/quickstart.sh": Skip(
        "the main job, 15 epochs: run by hand in a fresh clone before each release"
    ),
    "bash scripts/test.sh": Skip("runs this suite"),
    "pip install keras-vision-transformers": Skip(
        "scripts/check_wheel.sh (in .ci/run) installs the wheel into a fresh environment"
    ),
    "pip install keras-vision-transformers[export]": Skip("as above; tests/test_wheel.py checks the extras"),
    "pip install keras-vision-transformers[apps]": Skip("as above"),
    "pip install -e .": Skip("scripts/setup.sh installs it; test_the_install_extras_exist checks the extras"),
    "pip install -e .[export]": Skip("as above"),
    "pip install -e .[torch]": Skip("as above"),
    "pip install -e .[dev]": Skip("as above"),
    "pip install -e .[jax]": Skip("as above"),
    "pip install -e .[docs]": Skip("as above"),
    "keras-vit models": Run(),
    "keras-vit models --pretrained": Run(),
    "keras-vit train --weights vit_base_patch16_siglip_224.webli --dataset my_photos/ --preset finetune "
    "--layer-decay 0.65 --output runs/siglip": Skip(
        "SigLIP's weights are not on the stand-in hub; tests/training/test_pretrained_start.py trains "
        "from a pretrained name, and tests/training/test_eva_training.py with --layer-decay"
    ),
    "keras-vit export runs/siglip": Skip("the Export section runs the same command on runs/latest"),
    "keras-vit train": Run(  # makes runs/latest, which the Export section exports
        part="export",
        stand_ins=(("keras-vit train", f"keras-vit train {LEARNS_PHOTOS}"),),
        check='assert os.path.exists("runs/latest/model.keras")',
    ),
    "keras-vit train --dataset ~/flowers --model vit_small_patch16_224 --image-size 224 --weights "
    "vit_small_patch16_224.safetensors --preset finetune --epochs 10 --output runs/flowers": Run(
        stand_ins=(
            ("~/flowers", "photos"),
            ("vit_small_patch16_224 --image-size 224", "vit_tiny_patch16_224 --image-size 32"),
            ("vit_small_patch16_224.safetensors", "vit_tiny_patch16_224.safetensors"),
            ("--epochs 10", ONE_STEP),
        ),
    ),
    "keras-vit evaluate runs/flowers": Run(check='assert os.path.exists("runs/flowers/confusion.png")'),
    "keras-vit export runs/flowers": Skip("the Export section runs the same command on runs/latest"),
    "keras-vit predict MODEL IMAGE...": Run(
        stand_ins=(("MODEL IMAGE...", "runs/flowers cat.jpg photos/rose/0.jpg"),)
    ),
    "keras-vit app desktop --model M": Skip(
        "opens a window: tests/apps/test_desktop_app.py drives it offscreen"
    ),
    "keras-vit app mobile --model M.tflite": Skip(
        "serves until stopped: tests/apps/test_mobile_app.py drives it"
    ),
    "keras-vit train --output runs/teacher --model vit_small_patch16_224 --image-size 32 "
    "--override patch_size=4 --epochs 30": Run(stand_ins=(("--epochs 30", f"--dataset photos {ONE_STEP}"),)),
    "keras-vit train --output runs/student --model deit_tiny_distilled_patch16_224 --image-size 32 "
    "--override patch_size=4 --teacher runs/teacher": Run(
        stand_ins=(("--teacher runs/teacher", f"--teacher runs/teacher --dataset photos {ONE_STEP}"),)
    ),
    "keras-vit train --preset small-scratch --dataset cifar10 --output runs/cifar10": Run(
        stand_ins=(("--output runs/cifar10", f"--output runs/cifar10 {ONE_STEP}"),), tfds_mock=True
    ),
    "KERAS_BACKEND=jax keras-vit train --model vit_tiny_patch4_32 --precision mixed_bfloat16 "
    "--batch-size 512 --randaugment 2 --mixup 0.8 --cutmix 1.0 --output runs/cifar": Skip(
        "JAX in a process of its own: tests/training/test_jax_backend.py trains, evaluates and exports there"
    ),
    "KERAS_BACKEND=jax keras-vit evaluate runs/cifar": Skip("as above"),
    "keras-vit export runs/cifar": Skip("as above"),
    "KERAS_BACKEND=jax KERAS_DISTRIBUTION_JOB_ADDRESSES=127.0.0.1:1234 KERAS_DISTRIBUTION_NUM_PROCESSES=2 "
    "KERAS_DISTRIBUTION_PROCESS_ID=0 keras-vit train --strategy multi-worker --output runs/job": Skip(
        "two JAX processes at once: tests/training/test_scale.py runs a job of two on 127.0.0.1"
    ),
    "KERAS_BACKEND=jax KERAS_DISTRIBUTION_JOB_ADDRESSES=127.0.0.1:1234 KERAS_DISTRIBUTION_NUM_PROCESSES=2 "
    "KERAS_DISTRIBUTION_PROCESS_ID=1 keras-vit train --strategy multi-worker --output runs/job": Skip(
        "as above"
    ),
    "KERAS_BACKEND=jax KERAS_DISTRIBUTION_JOB_ADDRESSES=10.0.0.1:1234 KERAS_DISTRIBUTION_NUM_PROCESSES=2 "
    "KERAS_DISTRIBUTION_PROCESS_ID=1 keras-vit train --strategy multi-worker --output /shared/runs/job": Skip(
        "a second machine"
    ),
    "KERAS_BACKEND=jax keras-vit train --model vit_large_patch16_224 --strategy model-parallel "
    "--model-parallel 4 --output runs/large": Skip(
        "ViT-L/16 on 4 devices; tests/training/test_scale.py shards the tiny ViT over 4 host devices"
    ),
    "keras-vit train --weights vit_base_patch16_224.augreg2_in21k_ft_in1k --lora-rank 8 --dataset photos/ "
    "--output runs/lora": Skip(
        "ViT-B/16's weights are not on the stand-in hub; "
        "tests/test_real_checkpoint.py trains LoRA from the real ViT-Ti"
    ),
    "keras-vit export runs/latest": Run(stand_ins=(("runs/latest", f"runs/latest {FEW_IMAGES}"),)),
    "keras-vit export runs/latest --format tflite --quantize int8 --int8-input uint8": Run(
        stand_ins=(("--int8-input uint8", f"--int8-input uint8 {FEW_IMAGES}"),)
    ),
    "keras-vit verify exports/vit_nano_patch4_32/export-1": Run(
        stand_ins=(("export-1", "export-1 --limit 20"),)
    ),
    "keras-vit predict exports/vit_nano_patch4_32/export-1/model.tflite cat.jpg": Run(),
    "docker run --rm -p 8501:8501 -p 8500:8500 "
    "-v $PWD/exports/vit_nano_patch4_32:/models/vit_nano_patch4_32 -e MODEL_NAME=vit_nano_patch4_32 "
    "tensorflow/serving --enable_batching "
    "--batching_parameters_file=/models/vit_nano_patch4_32/batching_parameters.txt": Skip(
        "Docker and the tensorflow/serving image are not on CI's machine"
    ),
    'curl -s http://localhost:8501/v1/models/vit_nano_patch4_32:predict -d {"instances": [{"b64": '
    '"$(base64 -w0 cat.jpg)"}]}': Skip("needs the server above"),
    "bash scripts/setup.sh apps": Skip("CI's dev install holds the apps' packages"),
    ".venv/bin/keras-vit app desktop --model "
    "runs/quickstart-*/exports/vit_tiny_patch16_224/export-1/model_attention.tflite": Skip(
        "opens a window (as above)"
    ),
    ".venv/bin/keras-vit app mobile --model "
    "runs/quickstart-*/exports/vit_tiny_patch16_224/export-1/model_int8.tflite "
    "--host 0.0.0.0 --port 8000": Skip("serves until stopped (as above)"),
}

# Blocks that are not code: what they list must be true.
LISTINGS = {
    "exports/vit_nano_patch4_32/1/": Run(
        check="""
listed = block.split("export-1/", 1)[1]
for optional, stem, extensions in re.findall(r"(\\[?)(\\w+)\\.(\\{[\\w,]+\\}|\\w+)", listed):
    for extension in extensions.strip("{}").split(","):
        path = f"exports/vit_nano_patch4_32/export-1/{stem}.{extension}"
        assert optional or os.path.exists(path), path
assert os.path.exists("exports/vit_nano_patch4_32/1/saved_model.pb")
""",
    ),
    "model_config_list {": Skip("TF Serving's config file, for the server above"),
    "keras_vit/": Skip("checked by test_the_layout_names_files_that_exist"),
}


# The pages run as two sessions in two test files (tests/test_readme_export.py runs the second),
# so that two workers share their minute and a half: README.md and the pages before the export
# page, then that page and the pages after it in the nav.
PARTS = ("use", "export")
FIRST_PAGE_OF_EXPORT = "docs/export.md"


def pages():
    """README.md, then each hand-written page of the documentation site in mkdocs.yml's nav
    order (paths from the checkout's root)."""
    import yaml

    config = yaml.safe_load(open(MKDOCS, encoding="utf-8"))

    def walk(entry):
        if isinstance(entry, str):
            yield entry
        else:
            for value in entry.values() if isinstance(entry, dict) else entry:
                yield from walk(value)

    docs = config.get("docs_dir", "docs")
    return ["README.md"] + [
        f"{docs}/{page}" for page in walk(config["nav"]) if not page.startswith(GENERATED)
    ]


def _blocks(with_part=False):
    """(language, first line (up to a gap of spaces), text) of each fenced block, in page order;
    with its part (`PARTS`) and its page too when `with_part`."""
    blocks = []
    part = PARTS[0]
    for page in pages():
        part = PARTS[1] if page == FIRST_PAGE_OF_EXPORT else part
        text = open(os.path.join(ROOT, page), encoding="utf-8").read()
        for found in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.M | re.S):
            language, body = found.groups()
            block = (language, re.split(r"\s{2,}", body.splitlines()[0].strip())[0], body)
            blocks.append(block + ((part, page) if with_part else ()))
    assert part == PARTS[1], f"{FIRST_PAGE_OF_EXPORT} is not in mkdocs.yml's nav"
    return blocks


def _commands(body):
    """A shell block's commands, each as one line with its comments and continuations dropped."""
    commands = []
    for line in re.sub(r"\\\n\s*", " ", body).splitlines():
        words = shlex.split(line, comments=True)
        if words:
            commands.append(" ".join(words))
    return commands


def _with_stand_ins(text, entry, where):
    for readme_text, stand_in in entry.stand_ins:
        assert readme_text in text, f"stand-in for {readme_text!r}: no longer in {where}"
        text = text.replace(readme_text, stand_in, 1)
    return text


def _session_steps(part):
    """The pages' runnable blocks and commands of `part` (one of `PARTS`), in order, as steps
    for SESSION."""
    steps = [{"name": "scratch files", "kind": "python", "code": SCRATCH_FILES, "block": "", "check": ""}]
    for language, first_line, body, section_part, page in _blocks(with_part=True):
        if language == "python":
            entries = [(first_line, PYTHON_BLOCKS.get(first_line), body)]
        elif language == "bash":
            entries = [(command, COMMANDS.get(command), command) for command in _commands(body)]
        else:
            entries = [(first_line, LISTINGS.get(first_line), None)]
        for key, entry, code in entries:
            assert entry is not None, f"{page}: block or command not sorted into test_readme.py: {key!r}"
            if isinstance(entry, Skip) or (entry.part or section_part) != part:
                continue
            step = {"name": key[:80], "block": body, "check": entry.check, "tfds_mock": entry.tfds_mock}
            if code is None:
                step.update(kind="python", code="")
            elif language == "bash":
                step.update(kind="cli", argv=shlex.split(_with_stand_ins(code, entry, key))[1:])
            else:
                step.update(kind="python", code=entry.prelude + "\n" + _with_stand_ins(code, entry, key))
            steps.append(step)
    return steps


SESSION = """
import contextlib, io, json, logging, os, re, sys, time
START = time.monotonic()
import torch, timm  # before TensorFlow, as in a process that reads timm checkpoints

LOGGED, WARNINGS = [], []

class Collect(logging.Handler):
    def emit(self, record):
        (WARNINGS if record.levelno >= logging.WARNING else LOGGED).append(record.getMessage())
        LOGGED.append(record.getMessage())

logging.getLogger("keras_vit").addHandler(Collect(logging.INFO))
logging.getLogger("keras_vit").setLevel(logging.INFO)
names = {"re": re, "os": os, "LOGGED": LOGGED, "WARNINGS": WARNINGS}
for step in json.load(open(sys.argv[1])):
    print(f"=== {step['name']} (at {time.monotonic() - START:.1f} s)", flush=True)
    del LOGGED[:], WARNINGS[:]  # a step's check sees what that step logged
    printed = io.StringIO()
    mock = contextlib.nullcontext()
    if step.get("tfds_mock"):
        import tensorflow_datasets as tfds
        mock = tfds.testing.mock_data(num_examples=24)
    with mock:
        if step["kind"] == "cli":
            from keras_vit.cli import main  # as the script runs it, after the README's imports

            code = main(step["argv"])
            assert code == 0, f"keras-vit {' '.join(step['argv'])} exited {code}"
        else:
            with contextlib.redirect_stdout(printed):
                exec(compile(step["code"], step["name"], "exec"), names)
    names.update(block=step["block"], printed=printed.getvalue())
    exec(compile(step["check"], step["name"] + " (check)", "exec"), names)
print(f"=== all ran (at {time.monotonic() - START:.1f} s)", flush=True)
"""


def test_every_block_of_the_readme_and_the_pages_before_export_runs_or_says_why_not(tmp_path):
    run_session(tmp_path, "use")


def run_session(tmp_path, part):
    """Runs the pages' `part` in one Python process in a scratch folder; fails naming the step."""
    steps = _session_steps(part)
    (tmp_path / "steps.json").write_text(json.dumps(steps))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (tmp_path / "hub").mkdir()
    hub = _stand_in_hub(tmp_path / "hub")
    try:
        result = subprocess.run(
            [sys.executable, "-c", SESSION, str(tmp_path / "steps.json")],
            cwd=scratch,
            env=dict(os.environ, HF_ENDPOINT=hub.url, HF_HUB_CACHE=str(tmp_path / "hub-cache")),
            capture_output=True,
            text=True,
            timeout=HANG_SECONDS,
        )
    finally:
        hub.stop()
    ran = re.findall(r"^=== (.*) \(at [\d.]+ s\)$", result.stdout, re.M)
    print("\n".join(re.findall(r"^=== .*$", result.stdout, re.M)))  # each step's start, for --durations' sake
    assert result.returncode == 0 and ran[-1:] == ["all ran"], (
        f"page step {ran[-1] if ran else '?'!r} failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    )


def test_the_tables_name_only_what_the_pages_hold():
    """A table entry whose block or command has left the pages would hide nothing: drop it."""
    blocks = _blocks()
    commands = {command for language, _, body in blocks if language == "bash" for command in _commands(body)}
    first_lines = {first_line for _, first_line, _ in blocks}
    assert set(COMMANDS) - commands == set()
    assert (set(PYTHON_BLOCKS) | set(LISTINGS)) - first_lines == set()


def _keras_vit_arguments(command):
    """The arguments of a `keras-vit` command (after any `NAME=value` settings), else None."""
    words = shlex.split(command)
    while words and "=" in words[0]:  # KERAS_BACKEND=jax ...
        words.pop(0)
    return words[1:] if words and os.path.basename(words[0]) == "keras-vit" else None


@pytest.mark.parametrize(
    "command", [c for c, entry in COMMANDS.items() if isinstance(entry, Skip) and _keras_vit_arguments(c)]
)
def test_a_skipped_keras_vit_command_still_parses(command):
    from keras_vit.cli import build_parser

    build_parser().parse_args(_keras_vit_arguments(command))  # exits on an unknown flag or a bad value


def test_the_install_extras_exist():
    import tomllib

    extras = tomllib.load(open(os.path.join(ROOT, "pyproject.toml"), "rb"))["project"][
        "optional-dependencies"
    ]
    named = {re.search(r"\[(\w+)\]", c).group(1) for c in COMMANDS if c.startswith("pip install -e .[")}
    assert named and named <= set(extras), named - set(extras)


def test_the_layout_names_files_that_exist():
    (layout,) = [body for _, first_line, body in _blocks() if first_line == "keras_vit/"]
    files = set(
        subprocess.run(
            ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.split()
    )
    basenames = {os.path.basename(path) for path in files}
    named = set(re.findall(r"\b[\w-]+\.(?:py|sh|zip)\b", layout))
    assert named and named - basenames == set(), named - basenames
