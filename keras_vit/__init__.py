"""keras-vit: Vision Transformers for Keras 3 on TensorFlow.

    import keras_vit
    model = keras_vit.create_model("vit_base_patch16_224", num_classes=10)
    keras_vit.load_weights(model, "vit_base_patch16_224.safetensors")

Importing the package registers its layers and the `ViT` model with Keras,
so `keras.models.load_model("model.keras")` works after `import keras_vit`.
"""

import os

# Keras reads its backend once, at import: TensorFlow unless the user chose.
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

from keras_vit import layers, optimizers  # noqa: E402
from keras_vit.complexity import forward_flops, parameter_count, training_flops  # noqa: E402
from keras_vit.configs import list_models  # noqa: E402
from keras_vit.models import ViT, create_model, resize_model  # noqa: E402
from keras_vit.pos_embed import resample_position_embeddings  # noqa: E402
from keras_vit.training_model import TrainingModel  # noqa: E402
from keras_vit.weights import CheckpointMismatchError, load_weights  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "CheckpointMismatchError",
    "TrainingModel",
    "ViT",
    "create_model",
    "forward_flops",
    "layers",
    "list_models",
    "load_weights",
    "optimizers",
    "parameter_count",
    "resample_position_embeddings",
    "resize_model",
    "training_flops",
]
