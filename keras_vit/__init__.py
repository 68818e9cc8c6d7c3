"""keras-vit: Vision Transformers for Keras 3 on TensorFlow.

    import keras_vit
    model = keras_vit.create_model("vit_base_patch16_224", num_classes=10)
    keras_vit.load_weights(model, "vit_base_patch16_224.safetensors")

Names are imported on first use, so that tools that need no Keras (the CLI's
`models` listing, apps running a `.tflite`) start without loading TensorFlow.
"""

import importlib
import os

# Keras reads its backend once, at import: TensorFlow unless the user chose.
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

__version__ = "0.1.0"

_EXPORTS = {
    "CheckpointMismatchError": "keras_vit.weights",
    "ViT": "keras_vit.models",
    "create_model": "keras_vit.models",
    "forward_flops": "keras_vit.complexity",
    "list_models": "keras_vit.configs",
    "load_weights": "keras_vit.weights",
    "parameter_count": "keras_vit.complexity",
    "resample_position_embeddings": "keras_vit.pos_embed",
    "resize_model": "keras_vit.models",
    "training_flops": "keras_vit.complexity",
}

__all__ = sorted(_EXPORTS) + ["layers"]


def __getattr__(name):
    if name == "layers":
        return importlib.import_module("keras_vit.layers")
    if name not in _EXPORTS:
        raise AttributeError(f"module 'keras_vit' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
