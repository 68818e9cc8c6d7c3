"""keras-vit's Keras layers, of every family: `from keras_vit.layers import PatchEncoder`.

Each is registered with Keras as `keras_vit>Name`, so saved models load wherever it lives.
"""

from keras_vit.model.layers import DropPath, ImageNormalization
from keras_vit.model.swin.layers import PatchMerging, SwinBlock, SwinPatchEmbedding, WindowAttention
from keras_vit.model.vit.layers import (
    DifferentialAttention,
    MultiHeadSelfAttention,
    ParallelScalingBlock,
    PatchEncoder,
    Patches,
    RelativePositionBias,
    ResNetV2Stem,
    ResPostBlock,
    StdConv2D,
    TokenPooling,
    TransformerBlock,
)

__all__ = [
    "DifferentialAttention",
    "DropPath",
    "ImageNormalization",
    "MultiHeadSelfAttention",
    "ParallelScalingBlock",
    "PatchEncoder",
    "PatchMerging",
    "Patches",
    "RelativePositionBias",
    "ResPostBlock",
    "ResNetV2Stem",
    "StdConv2D",
    "SwinBlock",
    "SwinPatchEmbedding",
    "TokenPooling",
    "TransformerBlock",
    "WindowAttention",
]
