"""keras-vit: Vision Transformers for Keras 3 on TensorFlow.

    import keras_vit
    model = keras_vit.create_model("vit_base_patch16_224", num_classes=10)
    keras_vit.load_weights(model, "vit_base_patch16_224.safetensors")

Importing the package registers its layers and the `ViT` model with Keras,
so `keras.models.load_model("model.keras")` works after `import keras_vit`.
"""

# Imported under private names: the package's namespace is its public API.
import importlib as _importlib
import os as _os
import sys as _sys

# Keras reads its backend once, at import: TensorFlow unless the user chose.
_os.environ.setdefault("KERAS_BACKEND", "tensorflow")

__version__ = "0.2.0"


def _command_line_is_starting():
    """The `keras-vit` script (keras_vit_cli) or `python -m keras_vit` (Python sets argv[0] to
    "-m" while it finds the module) imports per command what it uses, so that `--help` and
    `models` answer without loading TensorFlow."""
    return "keras_vit_cli" in _sys.modules or getattr(_sys, "argv", [])[:1] == ["-m"]


# The public API: each name and where it lives (the module itself, for `features`, `layers`,
# `optimizers` and `pipeline`).
_PUBLIC = {
    "CheckpointMismatchError": "keras_vit.model.state",
    "Eva": "keras_vit.model.eva.model",
    "Swin": "keras_vit.model.swin.model",
    "TrainingModel": "keras_vit.training.training_model",
    "ViT": "keras_vit.model.vit.model",
    "create_model": "keras_vit.model.registry",
    "enable_lora": "keras_vit.training.lora",
    "features": "keras_vit.features",
    "forward_flops": "keras_vit.model.complexity",
    "layers": "keras_vit.layers",
    "list_models": "keras_vit.model.registry",
    "list_pretrained": "keras_vit.model.pretrained",
    "load_weights": "keras_vit.training.initial_weights",
    "optimizers": "keras_vit.optimizers",
    "parameter_count": "keras_vit.model.complexity",
    "pipeline": "keras_vit.pipeline",
    "resample_position_embeddings": "keras_vit.model.vit.pos_embed",
    "resize_model": "keras_vit.model.registry",
    "save_pretrained": "keras_vit.model.pretrained",
    "training_flops": "keras_vit.model.complexity",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name):
    """A public name, imported on first use: a process the command line started imports none
    of them up front, and still finds them all."""
    if name not in _PUBLIC:
        raise AttributeError(f"module 'keras_vit' has no attribute {name!r}")
    module = _importlib.import_module(_PUBLIC[name])
    value = module if _PUBLIC[name].endswith("." + name) else getattr(module, name)
    globals()[name] = value
    return value


if not _command_line_is_starting():
    # Eagerly: importing the package registers its layers and the ViT with Keras.
    for _name in __all__:
        __getattr__(_name)
