#!/usr/bin/env bash
# The main job on a fresh machine, the worked example: install keras-vit, load a pretrained ViT-Ti
# (timm's vit_tiny_patch16_224.augreg_in21k_ft_in1k: from the hub, or the copy shipped inside
# keras-vit when the hub cannot be reached), give it CIFAR-10's ten classes, fine-tune it on the
# embedded cifar10-mini (3,000 real CIFAR-10 images, no download) with the `finetune` recipe and
# early stopping on the CPU, evaluate it on the 500 held-out test images, export it (TF Serving
# SavedModel, TFLite fp32 and int8 with MediaPipe metadata, ONNX), verify every export against
# Keras on those images, and print the command that opens the result in the apps.
#
# Its settings were chosen by measurement on 2 CPU cores: docs/benchmarks/quickstart.md.
# QUICKSTART_TRAIN and QUICKSTART_VERIFY_IMAGES replace them (the tests run it on a few images).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh export
export KERAS_BACKEND=tensorflow TF_CPP_MIN_LOG_LEVEL=3
train_settings=${QUICKSTART_TRAIN:-"--image-size 112 --epochs 6 --batch-size 64 --early-stopping 2"}
verify_images=${QUICKSTART_VERIFY_IMAGES:-500}
run="runs/quickstart-$(date +%Y%m%d-%H%M%S)"
# shellcheck disable=SC2086  # the settings are words
.venv/bin/keras-vit train --weights vit_tiny_patch16_224 --preset finetune $train_settings --output "$run"
.venv/bin/keras-vit evaluate "$run" --dataset cifar10-mini --split test
.venv/bin/keras-vit export "$run" --output "$run/exports" --quantize int8 --attention \
    --verify-images "$verify_images"
exported=$(ls -d "$run"/exports/*/export-1)
echo
echo "Run folder: $run (model.keras, history.json, training.png, evaluation.json, confusion.png)"
echo "Exports:    $(dirname "$exported")/ (1/ = SavedModel for TF Serving; export-1/ = .tflite, .onnx, verification.md)"
echo "Open the result in the desktop app and, on a phone on this network, the web app (the first command installs the apps' extra):"
echo "bash scripts/setup.sh apps && { .venv/bin/keras-vit app desktop --model $exported/model_attention.tflite &" \
    ".venv/bin/keras-vit app mobile --model $exported/model_int8.tflite --host 0.0.0.0; }"
