"""What every export format is built from: a float32 Keras ViT that maps pixels to probabilities.

A trained model carries its own preprocessing (image size, normalisation inside
the graph, class names and evaluation transform in its config). Each export reads them from
here and nowhere else, so SavedModel, TFLite and ONNX take the same input: RGB pixels in
[0, 255], brought to the model's image size by its transform.
"""

import dataclasses
import functools
import os
import re

import keras

from keras_vit.model import registry
from keras_vit.model.transform import DEFAULT, Transform
from keras_vit.storage.saving import load_trained_model


@dataclasses.dataclass
class Classifier:
    """A Keras model ready for export.

    Attributes:
        model: the Keras model, float32 whatever precision it was trained in.
        name: a name for serving (`[A-Za-z0-9_-]`), the model's own by default.
        image_size: `(height, width)` the model takes.
        channels: input channels (3 for RGB).
        class_names: the label of each output, in order.
        outputs_probabilities: whether `model` ends in a softmax already.
        transform: how an image is brought to `image_size` (`keras_vit.model.transform`).
        license: the licence of the weights it was built from (timm's pretrained_cfg's, e.g.
            "cc-by-nc-4.0"), None when unknown; every export carries it, so a user sees it before
            shipping.
    """

    model: keras.Model
    name: str
    image_size: tuple
    channels: int
    class_names: list
    outputs_probabilities: bool
    transform: Transform = DEFAULT
    license: str | None = None

    @property
    def num_classes(self):
        return len(self.class_names)

    @functools.cached_property
    def forward(self):
        """`model` at inference as the exports run it: its family's `classifier_forward`, which
        may skip work the outputs do not read (a ViT's last block on tokens its head ignores)."""
        family = registry.family_of(self.model, default=None)
        return self.model if family is None else family.classifier_forward(self.model)

    def probabilities(self, images):
        """Class probabilities, float32, for a batch of pixels in [0, 255]."""
        outputs = self.forward(images, training=False)
        outputs = keras.ops.cast(outputs, "float32")
        return outputs if self.outputs_probabilities else keras.ops.softmax(outputs, axis=-1)


def load_classifier(source, name=None):
    """Loads a run folder or `.keras` file (or takes a Keras model) for export.

    Raises:
        FileNotFoundError: no model at `source`.
        ValueError: not a classifier with a static image size.
    """
    model = source if isinstance(source, keras.Model) else load_trained_model(source)
    which = "This model" if isinstance(source, keras.Model) else os.fspath(source)
    shape = model.input_shape
    if not isinstance(shape, tuple) or len(shape) != 4 or None in shape[1:]:
        raise ValueError(
            f"{which} is not an image classifier keras-vit can run: it needs one image input of a "
            f"fixed size, (batch, height, width, channels), and takes {shape}."
        )
    if (
        len(model.outputs) != 1
        or len(model.output_shape) != 2
        or getattr(model, "include_top", True) is False
    ):
        raise ValueError(
            f"{which} is not a classifier: keras-vit needs one (batch, classes) output, and it "
            f"returns {model.output_shape}. Use a model with its head (include_top=True)."
        )
    num_classes = model.output_shape[-1]
    class_names = getattr(model, "class_names", None) or [str(i) for i in range(num_classes)]
    # A run's model is named after its config (vit_nano_patch4_32): a fine serving name.
    name = name or re.sub(r"[^A-Za-z0-9_.-]", "_", model.name)
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", name):
        raise ValueError(f"Model name {name!r} must use letters, digits, '_', '-' and '.' only.")
    activation = getattr(model, "classifier_activation", None)
    return Classifier(
        model=_float32(model),
        name=name,
        image_size=tuple(shape[1:3]),
        channels=shape[3],
        class_names=list(class_names),
        outputs_probabilities=activation == "softmax",
        transform=Transform.of(model),
        license=getattr(model, "license", None),
    )


def _float32(model):
    """The same model in float32: edge runtimes and TF Serving want float32 graphs."""
    if keras.dtype_policies.get(model.dtype_policy).name == "float32":
        return model
    config = model.get_config()
    config["dtype"] = "float32"
    copy = model.__class__.from_config(config)
    copy.set_weights([keras.ops.cast(w, "float32") for w in model.get_weights()])
    return copy
