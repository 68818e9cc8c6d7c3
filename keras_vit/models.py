"""The ViT model: any configuration, built as a functional Keras model."""

import keras

from keras_vit import configs
from keras_vit.checks import check_positive_int, check_rate
from keras_vit.layers import (
    ImageNormalization,
    PatchEncoder,
    TokenPooling,
    TransformerBlock,
    weight_initializer,
)
from keras_vit.pos_embed import resample_position_embeddings


def _pair(value, what):
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value, value)
    value = tuple(value)
    if len(value) != 2:
        raise ValueError(f"{what} must be an int or (height, width), got {value!r}.")
    for side in value:
        check_positive_int(side, what)
    return value


@keras.saving.register_keras_serializable(package="keras_vit")
class ViT(keras.Model):
    """Vision Transformer (Dosovitskiy et al., 2020), weight-compatible with timm.

    Takes `(batch, height, width, channels)` float images and returns class
    logits (or probabilities with `classifier_activation="softmax"`). With
    `image_mean` and `image_std` the images are pixel values in [0, 255] and
    the model normalises them itself, so saved and exported models carry
    their preprocessing; without, they must arrive normalised the way the
    weights were trained. With `include_top=False` it returns the pooled,
    normalised embedding of each image instead.

    Args:
        image_size: int or (height, width). Input resolution; each side must
            be a multiple of `patch_size`.
        patch_size: int. Side of the square patches.
        hidden_dim: int. Token width.
        depth: int. Number of Transformer blocks.
        num_heads: int. Attention heads; must divide `hidden_dim`.
        mlp_dim: int. Hidden width of each block's MLP.
        num_classes: int, default 1000. Classifier outputs.
        channels: int, default 3. Image channels (1 for grayscale).
        pooling: `"token"` ([cls] token, default) or `"gap"` (mean of the patch tokens).
        representation_size: int or None. Adds the paper's pre-logits layer
            (Dense + tanh) of this width before the classifier.
        include_top: bool, default True. Whether to add the classifier.
        dropout: float, default 0. Dropout on embeddings, attention output and MLPs.
        attention_dropout: float, default 0. Dropout on attention weights.
        drop_path_rate: float, default 0. Stochastic depth rate of the last
            block; it grows linearly from 0 at the first block.
        layer_norm_epsilon: float, default 1e-6.
        classifier_activation: None (logits, default) or an activation name
            such as `"softmax"`.
        image_mean: list of floats or None. Per-channel mean on the [0, 1]
            scale, e.g. `[0.5, 0.5, 0.5]`; set with `image_std`.
        image_std: list of floats or None. Per-channel std on the [0, 1] scale.
        class_names: list of str or None. The label of each output, saved
            with the model for prediction and export.
        layer_scale: float or None. LayerScale's initial value in every block
            (DeiT III: 1e-6); None (ViT, DeiT) has none.
        cls_position_embedding: bool, default True. False gives position
            embeddings to the patches only (DeiT III; timm's `no_embed_class`).
    """

    def __init__(
        self,
        image_size=224,
        patch_size=16,
        hidden_dim=768,
        depth=12,
        num_heads=12,
        mlp_dim=3072,
        num_classes=1000,
        channels=3,
        pooling="token",
        representation_size=None,
        include_top=True,
        dropout=0.0,
        attention_dropout=0.0,
        drop_path_rate=0.0,
        layer_norm_epsilon=1e-6,
        classifier_activation=None,
        image_mean=None,
        image_std=None,
        class_names=None,
        layer_scale=None,
        cls_position_embedding=True,
        dtype=None,
        **kwargs,
    ):
        image_size = _pair(image_size, "image_size")
        if (image_mean is None) != (image_std is None):
            raise ValueError("Set both image_mean and image_std, or neither.")
        if image_mean is not None and not (len(image_mean) == len(image_std) == channels):
            raise ValueError(
                f"image_mean and image_std need {channels} values (one per channel), "
                f"got {list(image_mean)} and {list(image_std)}."
            )
        if class_names is not None:
            class_names = [str(name) for name in class_names]
            if len(class_names) != num_classes:
                raise ValueError(f"{len(class_names)} class_names given for num_classes={num_classes}.")
        for value, what in (
            (patch_size, "patch_size"),
            (depth, "depth"),
            (channels, "channels"),
            (num_classes, "num_classes"),
        ):
            check_positive_int(value, what)
        if representation_size is not None:
            check_positive_int(representation_size, "representation_size")
        check_rate(drop_path_rate, "drop_path_rate")

        # Resolved now, so the model keeps the policy its layers were built with.
        dtype = keras.dtype_policies.get(dtype) if dtype is not None else keras.config.dtype_policy()
        images = keras.Input(shape=image_size + (channels,), name="images")
        x = images
        if image_mean is not None:
            x = ImageNormalization(image_mean, image_std, dtype=dtype, name="normalization")(x)
        x = PatchEncoder(
            patch_size,
            hidden_dim,
            dropout=dropout,
            cls_position_embedding=cls_position_embedding,
            dtype=dtype,
            name="patch_encoder",
        )(x)
        for i in range(depth):
            x = TransformerBlock(
                hidden_dim,
                num_heads,
                mlp_dim,
                dropout=dropout,
                attention_dropout=attention_dropout,
                # As timm: linspace(0, drop_path_rate, depth).
                drop_path_rate=drop_path_rate * i / max(depth - 1, 1),
                layer_norm_epsilon=layer_norm_epsilon,
                layer_scale=layer_scale,
                dtype=dtype,
                name=f"block_{i}",
            )(x)
        # Pooling before the final LayerNorm: equal for "token" (LayerNorm acts per
        # token) and timm's order for "gap" (its fc_norm).
        x = TokenPooling(pooling, dtype=dtype, name="pooling")(x)
        x = keras.layers.LayerNormalization(epsilon=layer_norm_epsilon, dtype=dtype, name="norm")(x)
        if representation_size is not None:
            x = keras.layers.Dense(
                representation_size,
                activation="tanh",
                kernel_initializer=weight_initializer(),
                dtype=dtype,
                name="pre_logits",
            )(x)
        if include_top:
            # float32 logits even under mixed precision, for a stable loss.
            x = keras.layers.Dense(
                num_classes,
                activation=classifier_activation,
                kernel_initializer=weight_initializer(),
                dtype="float32",
                name="head",
            )(x)
        kwargs.setdefault("name", "vit")
        super().__init__(inputs=images, outputs=x, **kwargs)
        self.dtype_policy = dtype

        # === Config ===
        self.image_size = image_size
        self.patch_size = patch_size
        self.hidden_dim = hidden_dim
        self.depth = depth
        self.num_heads = num_heads
        self.mlp_dim = mlp_dim
        self.num_classes = num_classes
        self.channels = channels
        self.pooling = pooling
        self.representation_size = representation_size
        self.include_top = include_top
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.drop_path_rate = drop_path_rate
        self.layer_norm_epsilon = layer_norm_epsilon
        self.classifier_activation = classifier_activation
        self.image_mean = None if image_mean is None else [float(m) for m in image_mean]
        self.image_std = None if image_std is None else [float(v) for v in image_std]
        self.class_names = class_names
        self.layer_scale = None if layer_scale is None else float(layer_scale)
        self.cls_position_embedding = bool(cls_position_embedding)

    @property
    def blocks(self):
        """The Transformer blocks, in order."""
        return [self.get_layer(f"block_{i}") for i in range(self.depth)]

    def get_config(self):
        return {
            "name": self.name,
            "trainable": self.trainable,
            "dtype": keras.dtype_policies.serialize(self.dtype_policy),
            "image_size": list(self.image_size),
            "patch_size": self.patch_size,
            "hidden_dim": self.hidden_dim,
            "depth": self.depth,
            "num_heads": self.num_heads,
            "mlp_dim": self.mlp_dim,
            "num_classes": self.num_classes,
            "channels": self.channels,
            "pooling": self.pooling,
            "representation_size": self.representation_size,
            "include_top": self.include_top,
            "dropout": self.dropout,
            "attention_dropout": self.attention_dropout,
            "drop_path_rate": self.drop_path_rate,
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "classifier_activation": self.classifier_activation,
            "image_mean": self.image_mean,
            "image_std": self.image_std,
            "class_names": self.class_names,
            "layer_scale": self.layer_scale,
            "cls_position_embedding": self.cls_position_embedding,
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if isinstance(config.get("dtype"), dict):
            config["dtype"] = keras.dtype_policies.deserialize(config["dtype"])
        return cls(**config)


def _vit_arguments():
    import inspect

    names = inspect.signature(ViT.__init__).parameters
    return sorted(n for n in names if n not in ("self", "kwargs"))


def create_model(name, **overrides):
    """Builds a named configuration, e.g. `create_model("vit_base_patch16_224")`.

    Args:
        name: a name from `keras_vit.list_models()`.
        **overrides: any `ViT` argument, such as `num_classes`, `image_size`,
            `channels`, `dropout`, `drop_path_rate`, `pooling`, `include_top`
            or `dtype`.

    Returns:
        A `ViT`, randomly initialised; load weights with `keras_vit.load_weights`.
    """
    config = configs.get_model_config(name)
    allowed = set(_vit_arguments()) | {"name", "trainable"}
    unknown = sorted(set(overrides) - allowed)
    if unknown:
        raise TypeError(
            f"create_model({name!r}) got unknown argument(s) {unknown}; "
            f"ViT takes {', '.join(_vit_arguments())}."
        )
    config.update(overrides)
    config.setdefault("name", name)
    return ViT(**config)


def resize_model(model, image_size):
    """Returns a copy of `model` for another image size, with the same weights.

    The position embeddings are resampled to the new patch grid (bicubic,
    [cls] kept), so a model trained at 224 runs or fine-tunes at 384.
    """
    config = model.get_config()
    config["image_size"] = list(_pair(image_size, "image_size"))
    resized = ViT.from_config(config)
    for source, target in zip(model.layers, resized.layers, strict=True):
        if isinstance(source, PatchEncoder):
            target.projection.set_weights(source.projection.get_weights())
            target.cls_token.assign(source.cls_token)
            target.position_embedding.assign(
                resample_position_embeddings(
                    keras.ops.convert_to_numpy(source.position_embedding),
                    new_grid=target.grid_size,
                    old_grid=source.grid_size,
                    num_prefix_tokens=source.position_prefix_tokens,
                )
            )
        else:
            target.set_weights(source.get_weights())
    return resized
