#!/usr/bin/env bash
# The main job on a fresh machine: install keras-vit, then run it.
# Training, evaluation and export join this script as they land (issues 3 and 4);
# today it installs the library, lists the model configs and checks that a model
# builds, saves and reloads with identical outputs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export KERAS_BACKEND=tensorflow TF_CPP_MIN_LOG_LEVEL=2
.venv/bin/keras-vit models
.venv/bin/python - <<'PY'
import os
import tempfile

import keras
import numpy as np

import keras_vit

model = keras_vit.create_model("vit_mini_patch4_32", num_classes=10)
images = np.random.default_rng(0).uniform(-1, 1, size=(4, 32, 32, 3)).astype("float32")
with tempfile.TemporaryDirectory() as folder:
    path = os.path.join(folder, "vit_mini.keras")
    model.save(path)
    restored = keras.models.load_model(path)
    difference = float(np.max(np.abs(restored.predict(images, verbose=0) - model.predict(images, verbose=0))))
print(f"\nvit_mini_patch4_32: {model.count_params():,} parameters, "
      f"{keras_vit.forward_flops(model) / 1e9:.2f} GFLOPs per image; "
      f".keras round trip max |difference| = {difference:.1e}")
assert difference == 0.0
PY
