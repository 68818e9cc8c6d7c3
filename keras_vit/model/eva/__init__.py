"""The Eva family: timm's rotary-position ViTs (`timm/models/eva.py`): EVA-01, EVA02 and
EVA02-CLIP, DINOv3, the Perception Encoder (core, lang, spatial), ROPE-ViT (axial, mixed, with
absolute positions), timm's rope-reg gap ViTs, LingBot and Sapiens2, by their timm names.

    model.py (Eva, resize_model), architecture.py (its arguments: timm's `Eva`'s), configs.py (every
    timm entry point it builds), timm_args.py (timm's keyword arguments as an Eva's), rope.py (the
    rotary tables, in NumPy), layers.py (patch embedding, rotary embedding, attention, block),
    checkpoint.py (timm's keys), complexity.py, hub_config.py, features.py, attention.py (rollout),
    classify.py (what the exports run)

It reuses the ViT family's pooling parts (`TokenPooling`, `AttentionPoolLatent`, PE's head) and
position-embedding resampling, by their public names. `FAMILY` is what the rest of keras-vit
asks (`keras_vit.model.family`); this module imports no Keras.
"""

import importlib

from keras_vit.model.eva import complexity
from keras_vit.model.eva.architecture import Architecture
from keras_vit.model.eva.configs import MODEL_CONFIGS
from keras_vit.model.family import (
    ONE_D_WEIGHTS,
    TRANSFORMER_LAYOUT,
    TRANSFORMER_LORA_TARGETS,
    TRANSFORMER_QUANTIZATION_GROUPS,
    Family,
)

# An op of an Eva block, by the names the converter gives it.
_BLOCK = r"/block_\d+(_\d+)?/"


class EvaFamily(Family):
    name = "eva"
    configs = MODEL_CONFIGS
    architecture_class = Architecture
    complexity = complexity
    model_class_path = "keras_vit.model.eva.model:Eva"
    checkpoint_module = "keras_vit.model.eva.checkpoint"
    features_module = "keras_vit.model.eva.features"
    hub_module = "keras_vit.model.eva.hub_config"
    # Attention rollout as the ViT's (`attention.py`), over the blocks' rotary attention.
    has_attention_maps = True
    # timm's no_weight_decay (`pos_embed`, `cls_token`, `reg_token`, the mixed rotary
    # embedding's `freqs`) and its 1-d rule (norms, biases, LayerScale's gammas, q_bias, v_bias).
    no_weight_decay = (*ONE_D_WEIGHTS, "scale", "cls_token", "reg_token", "pos_embed", "freqs")
    no_weight_decay += ("gamma_1", "gamma_2", "q_bias", "v_bias")
    quantization_groups = {
        "patch projection": ((r"/patch_embed(_\d+)?/", "CONV_2D"),),
        "QKV projections": ((_BLOCK + r"attention(_\d+)?/(qkv|[qkv]_proj)", "FULLY_CONNECTED"),),
        "out projections": ((_BLOCK + r"attention(_\d+)?/proj", "FULLY_CONNECTED"),),
        "MLP projections": ((_BLOCK + r"(fc1|fc1_g|fc1_x|fc2)(_\d+)?/", "FULLY_CONNECTED"),),
        # The rotation: the tables' products, the swap of the halves (slices, a concatenation) or of
        # each interleaved pair (a product by a permutation matrix, `rotary_swap`).
        "rotary embedding": (
            (_BLOCK + r"attention(_\d+)?/(mul|split|concat|neg|strided_slice|rotary_swap)", "*"),
        ),
        "attention matmuls": TRANSFORMER_QUANTIZATION_GROUPS["attention matmuls"],
        "softmax": TRANSFORMER_QUANTIZATION_GROUPS["softmax"],
        "LayerNorm statistics": TRANSFORMER_QUANTIZATION_GROUPS["LayerNorm statistics"],
        "LayerNorm normalisation": TRANSFORMER_QUANTIZATION_GROUPS["LayerNorm normalisation"],
        "GELU": TRANSFORMER_QUANTIZATION_GROUPS["GELU"],
        "residual adds": ((_BLOCK + r"add(_\d+)?(;|$)", "ADD"),),
        "head": TRANSFORMER_QUANTIZATION_GROUPS["head"],
    }
    # From the family's sensitivity table (docs/benchmarks/int8.md, a DINOv3-kind Eva trained
    # here): dynamic-range int8 in every projection agrees on 100% with min/max weights (99.8%
    # rotated: no outlier channel to spread), and the 16-bit base on 100%.
    quantization_recipes = {
        **Family.quantization_recipes,
        "dynamic": (((".*", "FULLY_CONNECTED"), "dynamic"),),
        "int8": (((".*", "FULLY_CONNECTED"), "dynamic"),),
    }
    head_layers = ("head", "fc_norm")
    lora_targets = {
        "attention": (
            "attention/qkv",
            "attention/q_proj",
            "attention/k_proj",
            "attention/v_proj",
            "attention/proj",
        ),
        "mlp": TRANSFORMER_LORA_TARGETS["mlp"],
    }
    model_parallel_layout = {
        "patch_embed/projection/kernel": (None, None, None, "model"),
        **TRANSFORMER_LAYOUT,
        r".*/attention/[qkv]_proj/kernel": (None, "model"),
    }

    def columns(self, name):
        entry = self.architecture(self.config(name))
        return {
            "image_size": entry.image_size[0],
            "patch_size": entry.patch_size,
            "hidden_dim": entry.embed_dim,
            "depth": entry.depth,
            "num_heads": entry.num_heads,
            "rope": entry.rope_type if entry.use_rot_pos_emb else None,
        }

    def layer_groups(self, model):
        # timm's group_matcher: the stem (tokens, position embeddings, patch embedding, norm_pre),
        # then each block, the final norm with the last block; what it matches not (the pooling,
        # fc_norm, the head, the mixed rotary embedding's `rope.freqs`) keeps the full rate.
        groups = {"patch_embed": 0, "norm_pre": 0}
        groups.update({f"block_{i}": i + 1 for i in range(model.depth)})
        groups["norm"] = model.depth
        return groups, model.depth + 1

    def block_names(self, arguments):
        return tuple(f"block_{i}" for i in range(arguments["depth"]))

    def attention_grid(self, model):
        return tuple(model.get_layer("patch_embed").grid_size)

    def attention_rollout(self, model):
        from keras_vit.model.eva.attention import AttentionRollout

        return AttentionRollout(model)

    def takes_partial_patches(self, arguments):
        return True  # timm's PatchEmbed

    def classifier_forward(self, model):
        from keras_vit.model.eva.classify import classifier_forward

        return classifier_forward(model)

    def resize(self, model, image_size):
        from keras_vit.model.eva.model import resize_model

        return resize_model(model, image_size)


FAMILY = EvaFamily()


def __getattr__(name):
    """`Eva` and `resize_model`, imported (with Keras) on first use."""
    if name not in ("Eva", "resize_model"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.model"), name)
