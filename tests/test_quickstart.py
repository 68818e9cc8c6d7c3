"""The main job, `scripts/quickstart.sh`, as a new user runs it, on a few images: the embedded
ViT-Ti fine-tuned, evaluated, exported, verified, and the apps' line printed last. The full run,
with its accuracy and minutes, is measured by hand (docs/benchmarks/quickstart.md)."""

import json
import os
import re
import subprocess

from conftest import HANG_SECONDS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_quickstart_fine_tunes_the_shipped_vit_ti_offline_exports_verifies_and_ends_with_the_apps(
    tmp_path,
):
    env = dict(
        os.environ,
        QUICKSTART_TRAIN="--image-size 32 --epochs 1 --steps-per-epoch 2 --batch-size 8 --no-jit-compile",
        QUICKSTART_VERIFY_IMAGES="20",
        # Two steps leave near-tied classes, which quantisation reorders: the variants are checked on models
        # that learned (tests/export, tests/test_real_checkpoint.py).
        QUICKSTART_QUANTIZE="none",
        QUICKSTART_RUNS=str(tmp_path / "runs"),
        QUICKSTART_SKIP_SETUP="1",
        HF_HUB_OFFLINE="1",  # an empty cache and no hub: the ViT-Ti shipped inside keras-vit
        HF_HUB_CACHE=str(tmp_path / "empty-cache"),
    )
    result = subprocess.run(
        ["bash", "scripts/quickstart.sh"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_SECONDS,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert "using the copy shipped inside keras-vit" in result.stderr, result.stderr[-3000:]
    (run,) = (tmp_path / "runs").iterdir()
    config = json.loads((run / "history.json").read_text())["config"]
    assert config["weights"] == "vit_tiny_patch16_224" and config["preset"] == "finetune"
    evaluation = json.loads((run / "evaluation.json").read_text())
    assert evaluation["count"] == 500 and evaluation["split"] == "test"
    (export,) = (run / "exports").glob("*/export-1")
    files = set(os.listdir(export))
    assert {"model.tflite", "model_attention.tflite", "model.onnx"} <= files, files
    assert (export.parent / "1" / "saved_model.pb").exists()
    verification = (export / "verification.md").read_text()
    assert "BELOW TARGET" not in verification, verification
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("bash scripts/setup.sh apps && { .venv/bin/keras-vit app desktop --model "), last
    for model in re.findall(r"--model (\S+)", last):
        assert os.path.isfile(model), model
