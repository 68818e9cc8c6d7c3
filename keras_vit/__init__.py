"""keras-vit: Vision Transformers for Keras 3 on TensorFlow.

    import keras_vit
    model = keras_vit.create_model("vit_base_patch16_224", num_classes=10)
    keras_vit.load_weights(model, "vit_base_patch16_224.safetensors")

Importing the package registers its layers and the `ViT` model with Keras,
so `keras.models.load_model("model.keras")` works after `import keras_vit`.
"""

import os
import sys

# Keras reads its backend once, at import: TensorFlow unless the user chose.
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

__version__ = "0.1.0"


def _command_line_is_starting():
    """The `keras-vit` script (keras_vit_cli) or `python -m keras_vit` (Python sets argv[0] to
    "-m" while it finds the module) imports per command what it uses, so that `--help` and
    `models` answer without loading TensorFlow."""
    return "keras_vit_cli" in sys.modules or getattr(sys, "argv", [])[:1] == ["-m"]


if not _command_line_is_starting():
    from keras_vit.data import pipeline
    from keras_vit.model import features, layers
    from keras_vit.model.complexity import forward_flops, parameter_count, training_flops
    from keras_vit.model.configs import list_models
    from keras_vit.model.pos_embed import resample_position_embeddings
    from keras_vit.model.vit import ViT, create_model, resize_model
    from keras_vit.model.weights import CheckpointMismatchError
    from keras_vit.training import optimizers
    from keras_vit.training.initial_weights import load_weights
    from keras_vit.training.training_model import TrainingModel

__all__ = [
    "CheckpointMismatchError",
    "TrainingModel",
    "ViT",
    "create_model",
    "features",
    "forward_flops",
    "layers",
    "list_models",
    "load_weights",
    "optimizers",
    "parameter_count",
    "pipeline",
    "resample_position_embeddings",
    "resize_model",
    "training_flops",
]
