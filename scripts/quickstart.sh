#!/usr/bin/env bash
# The main job on a fresh machine: install keras-vit, train a small ViT on the embedded
# cifar10-mini (3,000 real CIFAR-10 images, no download) on the CPU, and evaluate it on the
# 500 held-out test images, then export it (TF Serving SavedModel, TFLite fp32/fp16/dynamic-range
# int8, ONNX) and verify every export against Keras on those test images.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh export
export KERAS_BACKEND=tensorflow TF_CPP_MIN_LOG_LEVEL=3
run="runs/quickstart-$(date +%Y%m%d-%H%M%S)"
.venv/bin/keras-vit train --model vit_nano_patch4_32 --epochs 15 --learning-rate 2e-3 --warmup-epochs 1 \
    --output "$run"
.venv/bin/keras-vit evaluate "$run" --dataset cifar10-mini --split test
.venv/bin/keras-vit export "$run" --output "$run/exports" --attention
echo
echo "Run folder: $run (model.keras, history.json, training.png, evaluation.json, confusion.png)"
echo "Exports:    $run/exports/vit_nano_patch4_32/ (1/ = SavedModel for TF Serving; export-1/ = .tflite, .onnx, verification.md)"
