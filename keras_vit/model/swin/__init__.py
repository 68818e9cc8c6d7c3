"""The Swin Transformer family (Liu et al., 2021), with timm's names, weights and logits.

    model.py (Swin, resize_model), architecture.py (its arguments), configs.py (the named
    configs), layers.py, windows.py (window partition, shift and mask, in builtin ops),
    bias_table.py (resizing a bias table to another window), checkpoint.py (timm, Microsoft and
    transformers keys), complexity.py, features.py (the four stage maps)

`FAMILY` is what the rest of keras-vit asks (`keras_vit.model.family`). This module imports no
Keras; `Swin` is imported when first used.
"""

import importlib

from keras_vit.model.family import (
    ONE_D_WEIGHTS,
    TRANSFORMER_LAYOUT,
    TRANSFORMER_LORA_TARGETS,
    TRANSFORMER_QUANTIZATION_GROUPS,
    Family,
)
from keras_vit.model.swin import complexity
from keras_vit.model.swin.architecture import Architecture
from keras_vit.model.swin.configs import MODEL_CONFIGS

# An op of a Swin block (`stage_0_block_1`), by the names the converter gives it.
_BLOCK = r"/stage_\d+_block_\d+(_\d+)?/"


class SwinFamily(Family):
    name = "swin"
    configs = MODEL_CONFIGS
    architecture_class = Architecture
    complexity = complexity
    model_class_path = "keras_vit.model.swin.model:Swin"
    checkpoint_module = "keras_vit.model.swin.checkpoint"
    features_module = "keras_vit.model.swin.features"
    hub_module = "keras_vit.model.swin.hub_config"
    has_attention_maps = False
    # timm's no_weight_decay (the bias tables) and its 1-d rule: norms and biases.
    no_weight_decay = (*ONE_D_WEIGHTS, "relative_position_bias_table")
    # The Swin's own op groups, by the names its layers give their ops in the fp32 .tflite (no
    # [cls] token; windows, a shift and patch merging instead). The converter names a block's
    # output projection after the reshape that follows it (`stage_0_block_1/Reshape_2`), so it is
    # the block's FULLY_CONNECTED that is neither QKV nor the MLP's.
    quantization_groups = {
        "patch embedding": ((r"/patch_embed(_\d+)?/", "CONV_2D"),),
        "QKV projections": ((r"/attention(_\d+)?/qkv(_\d+)?/", "FULLY_CONNECTED"),),
        "out projections": ((_BLOCK + r"(?!fc[12](_\d+)?/|attention(_\d+)?/qkv)", "FULLY_CONNECTED"),),
        "attention matmuls": TRANSFORMER_QUANTIZATION_GROUPS["attention matmuls"],
        "position bias add": ((r"/attention(_\d+)?/add_1(;|$)", "ADD"),),
        # The cyclic shift (slices and concatenations) and back, and the shift mask's add. The
        # converter names a slice `strided_slice_3` or `strided_slice1`.
        "shift and mask": (
            (_BLOCK + r"(strided_slice|concat)(_?\d+)?(;|$)", "*"),
            (r"/attention(_\d+)?/add_2(;|$)", "ADD"),
        ),
        "softmax": TRANSFORMER_QUANTIZATION_GROUPS["softmax"],
        "patch merging reduction": ((r"/stage_\d+_merging(_\d+)?/reduction", "FULLY_CONNECTED"),),
        "MLP projections": TRANSFORMER_QUANTIZATION_GROUPS["MLP projections"],
        "GELU": TRANSFORMER_QUANTIZATION_GROUPS["GELU"],
        "residual adds": ((_BLOCK + r"add(_\d+)?(;|$)", "ADD"),),
        "LayerNorm statistics": TRANSFORMER_QUANTIZATION_GROUPS["LayerNorm statistics"],
        "LayerNorm normalisation": TRANSFORMER_QUANTIZATION_GROUPS["LayerNorm normalisation"],
        "pooling and head": (
            (r"/pooling(_\d+)?/", "MEAN"),
            *TRANSFORMER_QUANTIZATION_GROUPS["head"],
        ),
    }

    # Read from the Swin's sensitivity table (docs/benchmarks/int8.md: a Swin trained here on
    # Imagenette at 224 px, and the 64-px quickstart Swin). Its residual stream holds no outlier
    # channel, so the ViT's Hadamard rotation buys nothing and costs time and size: plain
    # dynamic-range int8 in every projection agrees with fp32 on 100% and 99.8% (rotated: 99.7%
    # and 99.6%, slower than fp32). `int8` is static int8 activations in the blocks' projections
    # and patch merging's reduction, float elsewhere: 99.7% and 100% at 0.66x and 0.61x fp32's
    # time. The head stays in float (on the 64-px Swin it alone costs 1 point); `int16x8` is the
    # 16-bit base, as for the ViT.
    quantization_recipes = {
        **Family.quantization_recipes,
        "dynamic": (((".*", "FULLY_CONNECTED"), "dynamic"),),
        "int8": tuple(
            (group, "int8")
            for group in ("QKV projections", "out projections", "MLP projections", "patch merging reduction")
        ),
    }
    lora_targets = TRANSFORMER_LORA_TARGETS
    model_parallel_layout = {
        "patch_embed/projection/kernel": (None, None, None, "model"),
        r"stage_\d+_merging/reduction/kernel": ("model", None),
        **TRANSFORMER_LAYOUT,
    }

    def columns(self, name):
        entry = self.architecture(self.config(name))
        return {
            "image_size": entry.image_size[0],
            "patch_size": entry.patch_size,
            "hidden_dim": entry.embed_dim,
            "depth": sum(entry.depths),
            "num_heads": entry.num_heads[0],
            "window_size": list(entry.window_size),
        }

    def layer_groups(self, model):
        # timm's group_matcher: the stem, then each block in order, a stage's patch merging with
        # its first block, the final norm with the last block; the head keeps the full rate.
        groups, index = {"patch_embed": 0}, 0
        for stage, depth in enumerate(model.depths):
            if stage:
                groups[f"stage_{stage}_merging"] = index + 1
            for block in range(depth):
                index += 1
                groups[f"stage_{stage}_block_{block}"] = index
        groups["norm"] = index
        return groups, index + 1

    def block_names(self, arguments):
        depths = self.architecture(arguments).depths
        return tuple(f"stage_{s}_block_{b}" for s, depth in enumerate(depths) for b in range(depth))

    def resize(self, model, image_size):
        from keras_vit.model.swin.model import resize_model

        return resize_model(model, image_size)


FAMILY = SwinFamily()


def __getattr__(name):
    """`Swin` and `resize_model`, imported (with Keras) on first use."""
    if name not in ("Swin", "resize_model"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.model"), name)
