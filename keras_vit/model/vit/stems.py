"""The convolutional stems of hybrid ViTs (timm's `vision_transformer_hybrid`): a CNN before the
patch projection, whose feature map the projection turns into tokens (timm's `HybridEmbed`), or
that ends in the tokens' width itself (MobileCLIP's `ConvStem`).

`ResNetV2Stem` is timm's `ResNetV2` as its hybrid ViTs build it (`_resnetv2`: the original
R50+ViT-B/16 of Dosovitskiy et al. and the AugReg R26/R50 hybrids): no pre-activation, every
convolution a `StdConv2D` (weight standardisation) with TensorFlow's "same" padding, GroupNorm
with 32 groups, ReLU. Every op is a TFLite builtin on at most 5-D tensors (GroupNorm's groups).
"""

import keras
from keras import ops

from keras_vit.model.checks import check_positive_int
from keras_vit.model.vit.architecture import (
    RESNETV2_CHANNELS,
    RESNETV2_STEM_CHANNELS,
    resnetv2_channels,
    resnetv2_feature_size,
)

# timm's GroupNormAct for ResNetV2: 32 groups, PyTorch's default epsilon.
GROUPS, GROUP_NORM_EPSILON = 32, 1e-5
# timm's `StdConv2dSame(eps=1e-8)` of the hybrid ViTs.
STD_CONV_EPSILON = 1e-8


@keras.saving.register_keras_serializable(package="keras_vit")
class StdConv2D(keras.layers.Conv2D):
    """A `Conv2D` with weight standardisation (timm's `StdConv2dSame`, BiT's): each filter is
    brought to zero mean and unit variance over its inputs before it is applied, and the padding
    is TensorFlow's "same", as timm's. No bias by default.

    Args:
        filters, kernel_size, strides: as `keras.layers.Conv2D`'s.
        epsilon: float, default 1e-8. Added to each filter's variance.
    """

    def __init__(self, filters, kernel_size, strides=1, epsilon=STD_CONV_EPSILON, **kwargs):
        kwargs.setdefault("padding", "same")
        kwargs.setdefault("use_bias", False)
        super().__init__(filters, kernel_size, strides=strides, **kwargs)
        # === Config ===
        self.epsilon = float(epsilon)

    def convolution_op(self, inputs, kernel):
        mean = ops.mean(kernel, axis=(0, 1, 2), keepdims=True)
        variance = ops.var(kernel, axis=(0, 1, 2), keepdims=True)
        standardised = (kernel - mean) * ops.rsqrt(variance + ops.cast(self.epsilon, kernel.dtype))
        return super().convolution_op(inputs, standardised)

    def get_config(self):
        return {**super().get_config(), "epsilon": self.epsilon}


def _group_norm(layer, name):
    return keras.layers.GroupNormalization(
        groups=GROUPS, epsilon=GROUP_NORM_EPSILON, dtype=layer.dtype_policy, name=name
    )


@keras.saving.register_keras_serializable(package="keras_vit")
class ResNetV2Bottleneck(keras.layers.Layer):
    """timm's `Bottleneck` of a ResNetV2 without pre-activation (its hybrid ViTs'): 1x1, 3x3
    (strided) and 1x1 `StdConv2D`s, each followed by GroupNorm (ReLU after the first two), the
    shortcut added (through a strided 1x1 `StdConv2D` and GroupNorm in a stage's first block),
    then ReLU. Weights as timm's: `conv1`, `norm1`, ..., `downsample_conv`, `downsample_norm`.

    Args:
        filters: int. Output channels; the middle has a quarter of them.
        strides: int, default 1.
        downsample: bool, default False. Whether the shortcut is projected.
    """

    def __init__(self, filters, strides=1, downsample=False, **kwargs):
        super().__init__(**kwargs)
        check_positive_int(filters, "filters")
        # === Config ===
        self.filters = filters
        self.strides = strides
        self.downsample = bool(downsample)

        middle = filters // 4

        def conv(units, kernel, name, strides=1):
            return StdConv2D(units, kernel, strides=strides, dtype=self.dtype_policy, name=name)

        self.conv1, self.norm1 = conv(middle, 1, "conv1"), _group_norm(self, "norm1")
        self.conv2, self.norm2 = conv(middle, 3, "conv2", strides), _group_norm(self, "norm2")
        self.conv3, self.norm3 = conv(filters, 1, "conv3"), _group_norm(self, "norm3")
        if self.downsample:
            self.downsample_conv = conv(filters, 1, "downsample_conv", strides)
            self.downsample_norm = _group_norm(self, "downsample_norm")

    def build(self, input_shape):
        shape = tuple(input_shape)
        for conv, norm in ((self.conv1, self.norm1), (self.conv2, self.norm2), (self.conv3, self.norm3)):
            conv.build(shape)
            shape = conv.compute_output_shape(shape)
            norm.build(shape)
        if self.downsample:
            self.downsample_conv.build(input_shape)
            self.downsample_norm.build(self.downsample_conv.compute_output_shape(input_shape))

    def call(self, x):
        shortcut = self.downsample_norm(self.downsample_conv(x)) if self.downsample else x
        y = ops.relu(self.norm1(self.conv1(x)))
        y = ops.relu(self.norm2(self.conv2(y)))
        y = self.norm3(self.conv3(y))
        return ops.relu(y + shortcut)

    def compute_output_shape(self, input_shape):
        return self.conv3.compute_output_shape(self.conv2.compute_output_shape(input_shape))

    def get_config(self):
        config = super().get_config()
        config.update({"filters": self.filters, "strides": self.strides, "downsample": self.downsample})
        return config


@keras.saving.register_keras_serializable(package="keras_vit")
class ResNetV2Stem(keras.layers.Layer):
    """timm's ResNetV2 as the stem of a hybrid ViT (`vision_transformer_hybrid`'s `_resnetv2`):
    a 7x7 stride-2 `StdConv2D`, GroupNorm, ReLU and a 3x3 stride-2 max pooling ("same" padding),
    then a stage of `ResNetV2Bottleneck`s per entry of `depths` (256, 512, 1024 and 2048 wide;
    each after the first halves the map). `depths=()` is the stem alone (`vit_tiny_r_s16_p8`).

    Args:
        depths: list of ints. The blocks of each stage (R26: `[2, 2, 2, 2]`; R50+ViT-B/16:
            `[3, 4, 9]`; R50+ViT-L/32: `[3, 4, 6, 3]`).
    """

    # A patch projection follows it.
    projects = False

    def __init__(self, depths=(), **kwargs):
        super().__init__(**kwargs)
        depths = [int(depth) for depth in depths]
        if len(depths) > len(RESNETV2_CHANNELS):
            raise ValueError(f"A ResNetV2 has at most {len(RESNETV2_CHANNELS)} stages, got depths={depths}.")
        for depth in depths:
            check_positive_int(depth, "each of depths")
        # === Config ===
        self.depths = depths

        self.stem_conv = StdConv2D(
            RESNETV2_STEM_CHANNELS, 7, strides=2, dtype=self.dtype_policy, name="stem_conv"
        )
        self.stem_norm = _group_norm(self, "stem_norm")
        self.stem_pool = keras.layers.MaxPooling2D(
            3, strides=2, padding="same", dtype=self.dtype_policy, name="stem_pool"
        )
        self.blocks = []
        for stage, (depth, filters) in enumerate(zip(depths, RESNETV2_CHANNELS[: len(depths)], strict=True)):
            for index in range(depth):
                self.blocks.append(
                    ResNetV2Bottleneck(
                        filters,
                        strides=2 if stage and not index else 1,
                        downsample=not index,
                        dtype=self.dtype_policy,
                        name=f"stage_{stage}_block_{index}",
                    )
                )

    @property
    def channels(self):
        return resnetv2_channels(self.depths)

    def build(self, input_shape):
        self.stem_conv.build(input_shape)
        shape = self.stem_conv.compute_output_shape(input_shape)
        self.stem_norm.build(shape)
        shape = self.stem_pool.compute_output_shape(shape)
        for block in self.blocks:
            block.build(shape)
            shape = block.compute_output_shape(shape)

    def call(self, images):
        x = self.stem_pool(ops.relu(self.stem_norm(self.stem_conv(images))))
        for block in self.blocks:
            x = block(x)
        return x

    def compute_output_shape(self, input_shape):
        batch, height, width, _ = input_shape
        rows, cols = resnetv2_feature_size((height, width), self.depths)
        return (batch, rows, cols, self.channels)

    def get_config(self):
        return {**super().get_config(), "depths": list(self.depths)}


@keras.saving.register_keras_serializable(package="keras_vit")
class ConvStem(keras.layers.Layer):
    """MobileCLIP's convolutional stem (timm's `ConvStem` of `vit_base_mci_224`): three
    non-overlapping convolutions (kernel = stride = 4, 2, 2; no padding) to a quarter, a quarter
    and all of `hidden_dim` channels, the first two without bias and each followed by BatchNorm
    and GELU, the last with a bias. It projects to the tokens' width itself: the patch encoder
    adds no projection (timm's `HybridEmbed(proj=False)`). Weights as timm's: `conv_<i>`, `bn_<i>`.

    Args:
        hidden_dim: int. The tokens' width, the last convolution's channels.
    """

    KERNELS = (4, 2, 2)
    # It ends in the tokens' width: no projection after it.
    projects = True

    def __init__(self, hidden_dim, **kwargs):
        super().__init__(**kwargs)
        check_positive_int(hidden_dim, "hidden_dim")
        # === Config ===
        self.hidden_dim = hidden_dim

        widths = (hidden_dim // 4, hidden_dim // 4, hidden_dim)
        self.convs = [
            keras.layers.Conv2D(
                width, kernel, strides=kernel, use_bias=i == 2, dtype=self.dtype_policy, name=f"conv_{i}"
            )
            for i, (width, kernel) in enumerate(zip(widths, self.KERNELS, strict=True))
        ]
        self.norms = [
            keras.layers.BatchNormalization(
                epsilon=1e-5, momentum=0.9, dtype=self.dtype_policy, name=f"bn_{i}"
            )
            for i in range(2)
        ]

    def build(self, input_shape):
        shape = tuple(input_shape)
        for i, conv in enumerate(self.convs):
            conv.build(shape)
            shape = conv.compute_output_shape(shape)
            if i < len(self.norms):
                self.norms[i].build(shape)

    def call(self, images, training=None):
        x = images
        for i, conv in enumerate(self.convs):
            x = conv(x)
            if i < len(self.norms):
                x = keras.activations.gelu(self.norms[i](x, training=training), approximate=False)
        return x

    def compute_output_shape(self, input_shape):
        for conv in self.convs:
            input_shape = conv.compute_output_shape(input_shape)
        return input_shape

    def get_config(self):
        return {**super().get_config(), "hidden_dim": self.hidden_dim}


def build_stem(stem, stem_depths, hidden_dim, **kwargs):
    """The stem layer named `stem` (`ViT(stem=...)`) for a ViT `hidden_dim` wide."""
    if stem == "resnetv2":
        return ResNetV2Stem(stem_depths, **kwargs)
    if stem == "convstem":
        return ConvStem(hidden_dim, **kwargs)
    raise ValueError(f"stem must be None, 'resnetv2' or 'convstem', got {stem!r}.")
