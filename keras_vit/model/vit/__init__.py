"""The ViT family: ViT, DeiT, DeiT III, registers, timm's gap ViTs, CLIP, SigLIP, DINOv2 and every
other entry point of timm's `vision_transformer` and `deit` modules whose parts it has.

    model.py (ViT, resize_model, distilled_heads), architecture.py (its arguments), configs.py
    (the named configs: keras-vit's own and timm's entry points), timm_args.py (timm's keyword
    arguments as a ViT's), layers.py, checkpoint.py (timm, transformers and .npz keys),
    complexity.py, pos_embed.py, attention.py (attention maps and rollout), features.py

`FAMILY` is what the rest of keras-vit asks (`keras_vit.model.family`). This module imports no
Keras; `ViT`, `resize_model` and `distilled_heads` are imported when first used.
"""

import importlib

from keras_vit.model.family import (
    ONE_D_WEIGHTS,
    TRANSFORMER_LAYOUT,
    TRANSFORMER_LORA_TARGETS,
    TRANSFORMER_QUANTIZATION_GROUPS,
    Family,
)
from keras_vit.model.vit import complexity
from keras_vit.model.vit.architecture import Architecture
from keras_vit.model.vit.configs import MODEL_CONFIGS

# A hybrid's stem (`PatchEncoder`'s backbone) and SwiGLU's gate, by their ops' names.
_STEM = r"/patch_encoder(_\d+)?/backbone(_\d+)?/"
_GATE = r"/swiglu(_\d+)?/"


def _outside(scope, patterns):
    """A group's `(pattern, op)` pairs, less the ops under `scope` (a regex of their names)."""
    return tuple((rf"^(?!.*{scope}).*{pattern}", op) for pattern, op in patterns)


class ViTFamily(Family):
    name = "vit"
    configs = MODEL_CONFIGS
    architecture_class = Architecture
    complexity = complexity
    model_class_path = "keras_vit.model.vit.model:ViT"
    checkpoint_module = "keras_vit.model.vit.checkpoint"
    features_module = "keras_vit.model.vit.features"
    hub_module = "keras_vit.model.vit.hub_config"
    has_attention_maps = True
    # timm's no_weight_decay and its 1-d rule: norms, biases, prefix tokens (registers too),
    # position embeddings, LayerScale (a parallel block's `ls`) and differential attention's
    # lambdas and sub_norm.
    no_weight_decay = (
        *ONE_D_WEIGHTS,
        "cls_token",
        "dist_token",
        "reg_token",
        "position_embedding",
        "ls1",
        "ls2",
        "^ls$",
        "lambda_",
        "sub_norm",
    )
    # The parts some kinds add have groups of their own: a hybrid's CNN stem (every op of timm's
    # ResNetV2, its weight-standardised convolutions and GroupNorms, or of MobileCLIP's ConvStem),
    # SwiGLU's gate (the split, the activation and the product between fc1 and fc2) and a MAP
    # head's attention pooling (its latent's cross-attention and residual add; its MLP is in "MLP
    # projections", its LayerNorm in the LayerNorm groups). The stem's GroupNorms are named as a
    # block's LayerNorms (`norm1`) and both it and the gate may hold a GELU: the transformer's
    # groups leave them out, so that no op is in two groups.
    quantization_groups = {
        "patch projection": ((r"/patch_encoder(_\d+)?/projection(_\d+)?/", "CONV_2D"),),
        "hybrid stem": ((_STEM, "*"),),
        **TRANSFORMER_QUANTIZATION_GROUPS,
        **{
            group: _outside(_STEM, TRANSFORMER_QUANTIZATION_GROUPS[group])
            for group in ("LayerNorm statistics", "LayerNorm normalisation")
        },
        "GELU": _outside(f"({_STEM}|{_GATE})", TRANSFORMER_QUANTIZATION_GROUPS["GELU"]),
        "SwiGLU gate": ((_GATE, "*"),),
        "attention pooling": (
            (r"/pooling(_\d+)?/(q|kv|proj)(_\d+)?/", "FULLY_CONNECTED"),
            *((r"/pooling(_\d+)?/", op) for op in ("BATCH_MATMUL", "SOFTMAX")),
            (r"/pooling(_\d+)?/add(;|$)", "ADD"),
        ),
        "residual adds": ((r"/block_\d+(_\d+)?/add(_\d+)?(;|$)", "ADD"),),
        # A relative position bias (`position_bias="mlp"|"table"`): the converter folds the bias
        # itself into a constant (its MLP or table reads no input); what is left is its add to
        # the attention scores, whose range the bias, not the scores, may set.
        "relative position bias": ((r"/attention(_\d+)?/add(;|$)", "ADD"),),
    }
    # The base recipes, with the relative position bias' add declared in float for `int8` (the
    # scores it joins are float there too, and a table's values span a range of their own).
    quantization_recipes = {
        **Family.quantization_recipes,
        "int8": (*Family.quantization_recipes["int8"], ("relative position bias", "float")),
    }
    # fc2's input (GELU's output, with one unit at 212 in the real ViT-Ti's block 7) rotated in the
    # graph by a Hadamard of 64 instead of the recipe's online rotation in blocks of 256: on the
    # 3,825 held-out Imagenette photos 98.80% agreement against 98.43%, and 0.61-0.73x fp32's
    # batch-1 time against 0.83-0.94x on an AVX512-VNNI CPU (docs/benchmarks/int8.md, eighth pass).
    quantization_rotated_inputs = {"dynamic": ("fc2",), "int8": ("fc2",)}
    # `int8` from the residual stream rotated offline, the nine dearest projections' inputs in
    # float and AdaRound kernels (`export.rotated_int8`): on the real ViT-Ti's 3,525 held-out
    # photos 99.04% agreement at 0.60x fp32 on an AVX512-VNNI CPU, where the rules above give 98.8% at
    # 0.61-0.73x (docs/benchmarks/int8.md, twentieth pass); the rules stay for the ViTs it does not cover.
    quantization_rewrites = {"int8": "rotated stream"}
    head_layers = ("head", "head_dist", "pre_logits")
    # A parallel block's Dense layers too: its fused input projection (QKV and the MLP's hidden
    # units) for either target, its attention and MLP output projections (differential
    # attention's one fused `out_proj` for both).
    lora_targets = {
        "attention": (*TRANSFORMER_LORA_TARGETS["attention"], "in_proj", "attn_out_proj", "out_proj"),
        "mlp": (*TRANSFORMER_LORA_TARGETS["mlp"], "in_proj", "mlp_out_proj", "out_proj"),
    }
    model_parallel_layout = {
        "patch_encoder/projection/kernel": (None, None, None, "model"),
        **TRANSFORMER_LAYOUT,
        # A parallel block's fused input projection by output column, its output projections by
        # input row, as QKV and fc1, and proj and fc2.
        r".*/in_proj/kernel": (None, "model"),
        r".*/(attn_out_proj|mlp_out_proj|out_proj)/kernel": ("model", None),
        "head_dist/kernel": ("model", None),
    }

    def columns(self, name):
        entry = self.configs[name]
        return {
            "image_size": entry["image_size"],
            "patch_size": entry["patch_size"],
            "hidden_dim": entry["hidden_dim"],
            "depth": entry["depth"],
            "num_heads": entry["num_heads"],
            "mlp_dim": entry["mlp_dim"],
        }

    def layer_groups(self, model):
        # timm's group_matcher for the ViT: the stem (the patch embedding, a hybrid's stem, the
        # tokens, the position embeddings and CLIP's norm_pre: timm's stem pattern names it before
        # `^norm` could take it), then each block, the final norm with the last block (timm's
        # MATCH_PREV_GROUP); the head, an attention pooling, a norm on the pooled vector (timm's
        # `fc_norm`, which `^norm` does not match) and a shared relative position bias keep the
        # full rate.
        groups = {"patch_encoder": 0}
        if model.pre_norm:
            groups["norm_pre"] = 0
        groups.update({f"block_{i}": i + 1 for i in range(model.depth)})
        if model.final_norm and not model.architecture.norm_after_pooling:
            groups["norm"] = model.depth
        return groups, model.depth + 1

    def image_size_step(self, arguments):
        """The patch size, times a hybrid stem's reduction (its feature map's cell)."""
        arch = self.architecture(arguments)
        return arch.patch_size * arch.stem_reduction

    def takes_partial_patches(self, arguments):
        # The patch embedding's convolution, as timm's; a hybrid stem's feature map is sized for
        # whole cells.
        return self.architecture(arguments).stem is None

    def block_names(self, arguments):
        return tuple(f"block_{i}" for i in range(arguments["depth"]))

    def attention_grid(self, model):
        return tuple(model.get_layer("patch_encoder").grid_size)

    def attention_rollout(self, model):
        from keras_vit.model.vit.attention import AttentionRollout

        return AttentionRollout(model)

    def classifier_forward(self, model):
        from keras_vit.model.vit.classify import classifier_forward

        return classifier_forward(model)

    def distilled_heads(self, model):
        from keras_vit.model.vit.model import distilled_heads

        return distilled_heads(model)

    def resize(self, model, image_size):
        from keras_vit.model.vit.model import resize_model

        return resize_model(model, image_size)


FAMILY = ViTFamily()

_LAZY = {"ViT": "model", "resize_model": "model", "distilled_heads": "model"}


def __getattr__(name):
    """`ViT`, `resize_model` and `distilled_heads`, imported (with Keras) on first use."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
