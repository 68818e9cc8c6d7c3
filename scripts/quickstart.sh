#!/usr/bin/env bash
# The main job on a fresh machine, the worked example: install keras-vit, load a pretrained
# ViT-Ti (timm's vit_tiny_patch16_224.augreg_in21k_ft_in1k: from the hub, or the copy shipped
# inside keras-vit when the hub cannot be reached), give it CIFAR-10's ten classes, fine-tune it
# on the embedded cifar10-mini (3,000 real CIFAR-10 images, no download) with the `finetune`
# recipe and early stopping on the CPU, evaluate it on the 500 held-out test images, export it
# (TF Serving SavedModel, TFLite fp32 and int8 with MediaPipe metadata, the attention model,
# ONNX), verify every export against Keras on those images, and print the
# command that opens the result in the apps.
#
# Its settings were chosen by measurement on 2 CPU cores: docs/benchmarks/quickstart.md.
# The tests run it on a few images: QUICKSTART_TRAIN, QUICKSTART_VERIFY_IMAGES and
# QUICKSTART_QUANTIZE replace those settings (a model of two steps has near-tied classes, which
# quantisation reorders), QUICKSTART_RUNS the runs/ folder, QUICKSTART_SKIP_SETUP=1 keeps the
# test suite's .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "${QUICKSTART_SKIP_SETUP:-0}" = 1 ] || bash scripts/setup.sh export
export KERAS_BACKEND=tensorflow TF_CPP_MIN_LOG_LEVEL=3
# A short fine-tune on 2,700 images: a larger step with layer decay, a half-epoch warmup, lighter
# crops and no stochastic depth than the recipe's defaults, and no XLA (its compile costs more
# than it saves in 3 epochs); docs/benchmarks/quickstart.md has the settings tried.
train_settings=${QUICKSTART_TRAIN:-"--image-size 128 --epochs 3 --batch-size 64 --early-stopping 2 \
    --learning-rate 3e-4 --layer-decay 0.75 --warmup-epochs 0.5 --crop-min-scale 0.6 --drop-path-rate 0 \
    --no-jit-compile"}
verify_images=${QUICKSTART_VERIFY_IMAGES:-500}
quantize=${QUICKSTART_QUANTIZE:-int8}  # what a phone runs; fp16 and dynamic: keras-vit export --quantize
run="${QUICKSTART_RUNS:-runs}/quickstart-$(date +%Y%m%d-%H%M%S)"
# shellcheck disable=SC2086  # the settings are words
.venv/bin/keras-vit train --weights vit_tiny_patch16_224 --preset finetune $train_settings --output "$run"
.venv/bin/keras-vit evaluate "$run" --dataset cifar10-mini --split test
.venv/bin/keras-vit export "$run" --output "$run/exports" --quantize "$quantize" --attention \
    --verify-images "$verify_images"
exported=$(ls -d "$run"/exports/*/export-1)
phone_model=model_int8.tflite  # XNNPACK's integer kernels on the phone's CPU
[ -f "$exported/$phone_model" ] || phone_model=model.tflite
echo
echo "Run folder: $run (model.keras, history.json, training.png, evaluation.json, confusion.png)"
echo "Exports:    $(dirname "$exported")/ (1/ = SavedModel for TF Serving; export-1/ = .tflite, .onnx, verification.md)"
echo "Open the result in the desktop app and, on a phone on this network, the web app (the first command installs the apps' extra):"
echo "bash scripts/setup.sh apps && { .venv/bin/keras-vit app desktop --model $exported/model_attention.tflite &" \
    ".venv/bin/keras-vit app mobile --model $exported/$phone_model --host 0.0.0.0; }"
