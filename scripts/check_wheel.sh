#!/usr/bin/env bash
# The release as a user gets it: `python -m build` writes the sdist and the wheel (built from the
# sdist) into dist/, the wheel is installed (not editable) with its dependencies from PyPI into a
# fresh virtual environment, and keras-vit runs there, outside the source tree: --version, train
# a few steps on the embedded cifar10-mini, predict with the model it trained, and predict with the
# embedded pretrained ViT-Ti by name, offline (HF_HUB_OFFLINE=1, an empty Hugging Face cache).
# tests/test_wheel.py checks the wheel's contents (the apps' files among them) file by file.
#   bash scripts/check_wheel.sh        # after `bash scripts/setup.sh dev` (python -m build, LiteRT.js)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
work=$(mktemp -d "${TMPDIR:-/tmp}/keras-vit-wheel.XXXXXX")
trap 'rm -rf "$work"' EXIT
passed=0 skipped=0

# step NAME COMMAND...: runs COMMAND with its output in a log; on failure, the log's end and one line.
step() {
    local name=$1 start=$SECONDS
    shift
    local status=0
    "$@" > "$work/step.log" 2>&1 || status=$?
    if [ "$status" = 0 ]; then
        passed=$((passed + 1))
        echo "check_wheel: $name: ok ($((SECONDS - start)) s)"
    else
        tail -n 25 "$work/step.log" >&2
        echo "check_wheel: FAILED: $name (exit $status; its output's end is above)" >&2
        echo "check_wheel: $passed passed, 1 failed"
        exit 1
    fi
}

.venv/bin/python -m build --version > /dev/null 2>&1 || {
    echo "check_wheel: FAILED: .venv has no \`python -m build\`: run \`bash scripts/setup.sh dev\` first." >&2
    exit 1
}
rm -f dist/keras_vision_transformers-*
step "python -m build (sdist, then the wheel from it)" .venv/bin/python -m build --outdir dist .
wheel=$(ls dist/keras_vision_transformers-*.whl)
version=$(basename "$wheel" | cut -d- -f2)
echo "check_wheel: $wheel ($(du -h "$wheel" | cut -f1)), $(ls dist/*.tar.gz) ($(du -h dist/*.tar.gz | cut -f1))"

step "a fresh virtual environment" "${PYTHON:-python3}" -m venv "$work/venv"
step "pip install $(basename "$wheel") and its dependencies" \
    "$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check "$root/$wheel"

# Outside the source tree, which would shadow the installed package; nothing from this machine's caches.
cd "$work"
export PATH="$work/venv/bin:$PATH" KERAS_BACKEND=tensorflow TF_CPP_MIN_LOG_LEVEL=2
export HF_HUB_OFFLINE=1 HF_HOME="$work/hf-home" XDG_CACHE_HOME="$work/cache"
unset HF_HUB_CACHE HF_ENDPOINT

installed_version() {
    [ "$(keras-vit --version)" = "keras-vit $version" ] || return 1
    python -c 'import keras_vit, sys; sys.exit(not keras_vit.__file__.startswith(sys.argv[1]))' "$work/venv/"
}
step "keras-vit --version is $version, keras_vit imported from the new environment" installed_version

# An image from the installed cifar10-mini (a test-split airplane), read without importing keras_vit.
an_image() {
    python - "$work/airplane.png" << 'EOF'
import importlib.util, pathlib, sys, zipfile

package = pathlib.Path(importlib.util.find_spec("keras_vit").submodule_search_locations[0])
with zipfile.ZipFile(package / "data" / "embedded" / "cifar10_mini.zip") as archive:
    name = next(n for n in sorted(archive.namelist()) if n.startswith("cifar10_mini/test/airplane/"))
    pathlib.Path(sys.argv[1]).write_bytes(archive.read(name))
EOF
}
step "an image from the installed cifar10-mini" an_image

# predicted JSON CLASSES [TOP1]: `keras-vit predict --json`'s one answer has a top 5 from CLASSES
# (and TOP1 first).
predicted() {
    python - "$@" << 'EOF'
import json, sys

(answer,) = json.loads(open(sys.argv[1]).read())
assert "error" not in answer, answer["error"]
classes = [row["class"] for row in answer["top_k"]]
assert len(classes) == 5 and set(classes) <= set(json.loads(sys.argv[2])), classes
assert sys.argv[3:] in ([], classes[:1]), f"top-1 {classes[0]!r}, expected {sys.argv[3]!r}"
print(answer["path"] + ": " + ", ".join(f"{r['class']} {r['probability']:.3f}" for r in answer["top_k"]))
EOF
}

step "keras-vit train on the embedded cifar10-mini (1 epoch of 2 steps)" \
    keras-vit train --model vit_nano_patch4_32 --dataset cifar10-mini --epochs 1 --steps-per-epoch 2 \
    --batch-size 8 --output "$work/run"
cifar10='["airplane","automobile","bird","cat","deer","dog","frog","horse","ship","truck"]'
predict_trained() {
    keras-vit predict "$work/run" "$work/airplane.png" --json > "$work/trained.json" &&
        predicted "$work/trained.json" "$cifar10"
}
step "keras-vit predict with the model it trained" predict_trained
tail -n 1 "$work/step.log"

ships_embedded_model='import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
sys.exit(not [n for n in names if n.startswith("keras_vit/model/embedded/") and n.endswith(".safetensors")])'
if python -c "$ships_embedded_model" "$root/$wheel"; then
    predict_embedded() {
        local labels
        keras-vit predict vit_tiny_patch16_224 "$work/airplane.png" --json > "$work/embedded.json" &&
            labels=$(python -c 'import json, keras_vit.model.pretrained as p
print(json.dumps(p.label_set("imagenet-1k")))') &&
            predicted "$work/embedded.json" "$labels" airliner  # timm's ViT-Ti: 0.86
    }
    step "keras-vit predict vit_tiny_patch16_224 with the embedded model, offline" predict_embedded
    tail -n 1 "$work/step.log"
else
    skipped=1
    echo "check_wheel: skipped: predict vit_tiny_patch16_224 offline (the wheel has no" \
        "keras_vit/model/embedded/*.safetensors: the source tree has none)"
fi
if [ "$skipped" = 0 ]; then
    echo "check_wheel: $passed passed, 0 failed"
else
    echo "check_wheel: $passed passed, 0 failed, $skipped skipped"
fi
