"""The ViT model: any configuration, built as a functional Keras model."""

import keras

from keras_vit.model import configs
from keras_vit.model.checks import check_positive_int, check_rate
from keras_vit.model.layers import (
    ImageNormalization,
    PatchEncoder,
    TokenPooling,
    TransformerBlock,
    weight_initializer,
)
from keras_vit.model.pos_embed import resample_position_embeddings


def _distilled_heads(cls_features, distillation_features, num_classes, activation):
    """DeiT's two heads on the [cls] and distillation tokens, and their mean (timm's inference)."""

    def head(name):
        return keras.layers.Dense(
            num_classes, kernel_initializer=weight_initializer(), dtype="float32", name=name
        )

    logits = keras.layers.Average(dtype="float32", name="distilled_average")(
        [head("head")(cls_features), head("head_dist")(distillation_features)]
    )
    if activation is None:
        return logits
    return keras.layers.Activation(activation, dtype="float32", name="head_activation")(logits)


def distilled_heads(model):
    """A Keras model from a distilled ViT's images to each head's logits: `{"head", "head_dist"}`.

    It shares the ViT's layers: the distillation loss trains `head_dist` toward the teacher.
    """
    if not getattr(model, "distillation_token", False) or not model.include_top:
        raise ValueError(f"{model.name} has no distillation head (ViT(distillation_token=True)).")
    outputs = {name: model.get_layer(name).output for name in ("head", "head_dist")}
    return keras.Model(model.inputs, outputs, name=f"{model.name}_heads")


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
        class_token: bool, default True. False: no [cls] token (with `pooling="gap"`).
        register_tokens: int, default 0. Register tokens after the other prefix tokens
            (Darcet et al. 2024); they are dropped by the pooling.
        norm_before_pooling: bool, default False. Apply the final LayerNorm to every token
            before a `"gap"` pooling (timm's `fc_norm=False`) instead of to the pooled vector.
        distillation_token: bool, default False. DeiT's distilled layout: a second
            prefix token with its own head (`head_dist`); the model returns the mean of
            both heads' logits, as timm does at inference (`distilled_heads` gives each).
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
        distillation_token=False,
        class_token=True,
        register_tokens=0,
        norm_before_pooling=False,
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
        if pooling == "token" and not class_token:
            raise ValueError("pooling='token' takes the [cls] token: set class_token=True or pooling='gap'.")
        if distillation_token and (pooling != "token" or representation_size is not None):
            raise ValueError(
                "distillation_token needs pooling='token' and no representation_size, as DeiT has."
            )

        # Resolved now, so the model keeps the policy its layers were built with.
        dtype = keras.dtype_policies.get(dtype) if dtype is not None else keras.config.dtype_policy()
        images = keras.Input(shape=image_size + (channels,), name="images")
        x = images
        if image_mean is not None:
            x = ImageNormalization(image_mean, image_std, dtype=dtype, name="normalization")(x)
        encoder = PatchEncoder(
            patch_size,
            hidden_dim,
            dropout=dropout,
            cls_position_embedding=cls_position_embedding,
            distillation_token=distillation_token,
            class_token=class_token,
            register_tokens=register_tokens,
            dtype=dtype,
            name="patch_encoder",
        )
        x = encoder(x)
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
        # Pooling, then the final LayerNorm: equal for "token" (LayerNorm acts per token)
        # and timm's fc_norm for "gap"; norm_before_pooling is timm's gap with fc_norm=False.
        tokens = x
        norm = keras.layers.LayerNormalization(epsilon=layer_norm_epsilon, dtype=dtype, name="norm")
        prefix_tokens = encoder.num_prefix_tokens
        if norm_before_pooling:
            x = TokenPooling(pooling, prefix_tokens, dtype=dtype, name="pooling")(norm(tokens))
        else:
            x = norm(TokenPooling(pooling, prefix_tokens, dtype=dtype, name="pooling")(tokens))
        if representation_size is not None:
            x = keras.layers.Dense(
                representation_size,
                activation="tanh",
                kernel_initializer=weight_initializer(),
                dtype=dtype,
                name="pre_logits",
            )(x)
        if include_top and distillation_token:
            distilled = norm(TokenPooling("distillation", dtype=dtype, name="distillation_pooling")(tokens))
            x = _distilled_heads(x, distilled, num_classes, classifier_activation)
        elif include_top:
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
        self.distillation_token = bool(distillation_token)
        self.class_token = bool(class_token)
        self.register_tokens = int(register_tokens)
        self.norm_before_pooling = bool(norm_before_pooling)

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
            "distillation_token": self.distillation_token,
            "class_token": self.class_token,
            "register_tokens": self.register_tokens,
            "norm_before_pooling": self.norm_before_pooling,
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
            # The projection and the prefix tokens as they are; the grid's embeddings resampled.
            for source_weight, target_weight in zip(source.weights, target.weights, strict=True):
                if source_weight is not source.position_embedding:
                    target_weight.assign(source_weight)
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
