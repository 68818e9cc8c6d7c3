"""What every family's Keras model shares: the constructor's prologue (its arguments checked, the
dtype policy, the images input and the normalisation) and epilogue, its arguments kept as
attributes, its config (Keras' `name`, `trainable` and `dtype`, then its `Architecture`'s
fields), and the `__init__` signature `help()` and IDEs show. Each family's model class (`ViT`,
`Swin`, `Eva`) subclasses `FamilyModel` and names its family (`family_spec`)."""

import dataclasses
import inspect

import keras

from keras_vit.model.layers import ImageNormalization

# Keras' own arguments of a model, beside its architecture's (and `dtype`).
_KERAS_ARGUMENTS = ("name", "trainable")


class FamilyModel(keras.Model):
    """A functional model built from an `Architecture` (its class: `architecture_class`)."""

    architecture_class = None
    # The `keras_vit.model.family.Family` of the class's models, and its name (`model.family`).
    family_spec = None
    family = None

    @classmethod
    def _prologue(cls, dtype, arguments):
        """What every family's `__init__` starts with: `(arch, dtype, images, keras_arguments)`,
        the arguments checked and in normal form (`architecture_class`), the dtype policy
        resolved, the images input, and Keras' `name` and `trainable` taken out of `arguments`."""
        keras_arguments = {key: arguments.pop(key) for key in _KERAS_ARGUMENTS if key in arguments}
        arch = cls.architecture_class(**arguments)
        dtype = resolved_dtype(dtype)
        images = keras.Input(shape=arch.image_size + (arch.channels,), name="images")
        return arch, dtype, images, keras_arguments

    def _epilogue(self, images, outputs, arch, dtype, keras_arguments):
        """What every family's `__init__` ends with: the functional model built, named after its
        family unless named, and its arguments kept."""
        super().__init__(inputs=images, outputs=outputs, **{"name": self.family, **keras_arguments})
        self._keep_arguments(arch, dtype)

    def _keep_arguments(self, arch, dtype):
        """After the graph is built: the policy its layers were built with, and every argument as
        an attribute (`model.depth`, `model.class_names`, ...)."""
        self.dtype_policy = dtype
        for field in dataclasses.fields(arch):
            setattr(self, field.name, getattr(arch, field.name))

    @property
    def architecture(self):
        """The model's arguments, as its family's `Architecture`."""
        fields = dataclasses.fields(self.architecture_class)
        return self.architecture_class(**{field.name: getattr(self, field.name) for field in fields})

    def get_config(self):
        return {
            "name": self.name,
            "trainable": self.trainable,
            "dtype": keras.dtype_policies.serialize(self.dtype_policy),
            **self.architecture.config(),
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if isinstance(config.get("dtype"), dict):
            config["dtype"] = keras.dtype_policies.deserialize(config["dtype"])
        return cls(**config)


def normalized(images, arch, dtype):
    """The images normalised inside the model when it carries its mean and std, else as they are."""
    if arch.image_mean is None:
        return images
    return ImageNormalization(arch.image_mean, arch.image_std, dtype=dtype, name="normalization")(images)


def resolved_dtype(dtype):
    """The policy a model is built with, resolved now so that it keeps it."""
    return keras.dtype_policies.get(dtype) if dtype is not None else keras.config.dtype_policy()


def set_signature(model_class):
    """`Model(image_size=224, ..., dtype=None)`: the arguments `help()` and IDEs show, from the
    class's `Architecture` fields."""
    keyword = inspect.Parameter.KEYWORD_ONLY
    fields = dataclasses.fields(model_class.architecture_class)
    model_class.__init__.__signature__ = inspect.Signature(
        [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        + [inspect.Parameter(field.name, keyword, default=field.default) for field in fields]
        + [
            inspect.Parameter("dtype", keyword, default=None),
            inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD),
        ]
    )
    return model_class
