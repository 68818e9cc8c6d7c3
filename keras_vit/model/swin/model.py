"""The Swin Transformer model: any configuration, built as a functional Keras model."""

import keras

from keras_vit.model.family_model import FamilyModel, normalized, set_signature
from keras_vit.model.layers import weight_initializer
from keras_vit.model.swin import FAMILY
from keras_vit.model.swin.architecture import Architecture
from keras_vit.model.swin.layers import PatchMerging, SwinBlock, SwinPatchEmbedding


@keras.saving.register_keras_serializable(package="keras_vit")
class Swin(FamilyModel):
    """Swin Transformer (Liu et al., 2021), weight-compatible with timm's `SwinTransformer`.

    Takes `(batch, height, width, channels)` float images and returns class logits (or
    probabilities with `classifier_activation="softmax"`). With `image_mean` and `image_std`
    the images are pixel values in [0, 255] and the model normalises them itself. With
    `include_top=False` it returns the pooled, normalised features of each image.

    Layers are named `patch_embed`, `stage_{s}_merging` (stages after the first),
    `stage_{s}_block_{b}`, `norm`, `pooling` and `head`; each stage's output is the feature map
    `keras_vit.features` returns.

    Args:
        image_size: int or (height, width). Each side must be a multiple of `patch_size`; a grid
            the windows do not tile is padded inside each block, as timm pads it.
        patch_size: int, default 4.
        embed_dim: int, default 96. The first stage's width; each later stage doubles it.
        depths: blocks per stage, default (2, 2, 6, 2).
        num_heads: heads per stage, default (3, 6, 12, 24).
        window_size: int, or one int per stage (Swin-S3), default 7. A stage whose grid is no
            larger than its window attends over the whole grid, with no shift.
        mlp_ratio: float, default 4. Each MLP's hidden width over its block's width.
        num_classes, channels, include_top, dropout, attention_dropout: as `keras_vit.ViT`'s.
        classifier_activation, image_mean, image_std, class_names: as `keras_vit.ViT`'s.
        license, crop_pct, crop_mode, interpolation: as `keras_vit.ViT`'s.
        drop_path_rate: float, default 0. Stochastic depth of the last block; it grows linearly
            from 0 over all blocks (timm's stagewise rates).
        layer_norm_epsilon: float, default 1e-5 (PyTorch's LayerNorm default, which Swin uses).
    """

    family_spec = FAMILY  # what the rest of keras-vit asks about the model
    family = FAMILY.name
    architecture_class = Architecture

    def __init__(self, dtype=None, **arguments):
        arch, dtype, images, keras_arguments = self._prologue(dtype, arguments)
        x = SwinPatchEmbedding(
            arch.patch_size, arch.embed_dim, arch.layer_norm_epsilon, dtype=dtype, name="patch_embed"
        )(normalized(images, arch, dtype))
        x = _stages(x, arch, dtype)
        outputs = _head(x, arch, dtype)
        self._epilogue(images, outputs, arch, dtype, keras_arguments)

    def stage_layers(self, stage):
        """The layers of stage `stage`, in order: its patch merging (after the first), its blocks."""
        names = [f"stage_{stage}_merging"] if stage else []
        names += [f"stage_{stage}_block_{b}" for b in range(self.depths[stage])]
        return [self.get_layer(name) for name in names]


set_signature(Swin)


def drop_path_rates(arch):
    """Each block's stochastic depth: linear from 0 to `drop_path_rate` over all blocks."""
    total = sum(arch.depths)
    return [arch.drop_path_rate * i / max(total - 1, 1) for i in range(total)]


def _stages(x, arch, dtype):
    """The stages: patch merging at the start of each stage after the first (timm's layout),
    then its blocks, every second one shifted by half a window."""
    rates = iter(drop_path_rates(arch))
    for stage, (depth, dim, grid, heads, window) in enumerate(
        zip(arch.depths, arch.stage_dims, arch.stage_grids, arch.num_heads, arch.window_size, strict=True)
    ):
        if stage:
            x = PatchMerging(
                arch.stage_dims[stage - 1],
                dim,
                arch.layer_norm_epsilon,
                dtype=dtype,
                name=f"stage_{stage}_merging",
            )(x)
        for block in range(depth):
            x = SwinBlock(
                dim,
                heads,
                grid,
                window,
                shift=0 if block % 2 == 0 else window // 2,
                mlp_ratio=arch.mlp_ratio,
                dropout=arch.dropout,
                attention_dropout=arch.attention_dropout,
                drop_path_rate=next(rates),
                layer_norm_epsilon=arch.layer_norm_epsilon,
                dtype=dtype,
                name=f"stage_{stage}_block_{block}",
            )(x)
    return x


def _head(x, arch, dtype):
    """LayerNorm, the mean over the grid, then the classifier (timm's `norm` and `head`)."""
    x = keras.layers.LayerNormalization(epsilon=arch.layer_norm_epsilon, dtype=dtype, name="norm")(x)
    x = keras.layers.GlobalAveragePooling2D(dtype=dtype, name="pooling")(x)
    if not arch.include_top:
        return x
    x = keras.layers.Dropout(arch.dropout, dtype=dtype, name="head_dropout")(x)
    # float32 logits even under mixed precision, for a stable loss.
    return keras.layers.Dense(
        arch.num_classes,
        activation=arch.classifier_activation,
        kernel_initializer=weight_initializer(),
        dtype="float32",
        name="head",
    )(x)


def resize_model(model, image_size, window_size=None):
    """A copy of a Swin for another image size (and optionally window), with the same weights:
    each bias table resized from its block's window to the new block's when they differ (timm's
    `set_input_size`, which passes the old window to `resize_rel_pos_bias_table`)."""
    from keras_vit.model.relative_position import resize_bias_table
    from keras_vit.model.weights import load_state, state_dict

    config = model.get_config()
    config["image_size"] = list(image_size) if not isinstance(image_size, int) else [image_size, image_size]
    if window_size is not None:
        config["window_size"] = window_size
    resized = Swin.from_config(config)
    state = state_dict(model)
    for stage in range(len(model.depths)):
        for block in range(model.depths[stage]):
            old = model.get_layer(f"stage_{stage}_block_{block}").effective_window
            new = resized.get_layer(f"stage_{stage}_block_{block}").effective_window
            key = f"layers.{stage}.blocks.{block}.attn.relative_position_bias_table"
            state[key] = resize_bias_table(state[key], new, old_window=old)
    return load_state(resized, state, source=f"{model.name} resized")
