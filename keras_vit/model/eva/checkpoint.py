"""The Eva family's checkpoints: timm's keys (`timm/models/eva.py`), which `save_for_hf` writes
and timm's hub repos hold (timm's own `checkpoint_filter_fn` converted the original EVA, PE and
DINOv3 files into them).

`keras_vit.model.weights` reads the files and assigns; this module says which timm key goes to
which variable, in which layout (`keras_vit.model.state`).
"""

import re

import keras
import numpy as np

from keras_vit.model.state import CONV, linear
from keras_vit.model.vit.pos_embed import resample_position_embeddings

# The classifier head, by its timm prefix: left out of a state for other classes.
HEAD_PREFIXES = ("head",)


def canonical(state, source):
    """`state` in timm's keys: transformers' `DINOv3ViTModel` keys converted, the buffers the
    rotary embedding recomputes (timm's `rope.*` but the mixed kind's learned `rope.freqs`) and
    an EvaAttention's zero `k_bias` dropped."""
    if any(key.startswith("embeddings.") for key in state):
        state = _transformers_to_timm(state)
    return {
        k: v
        for k, v in state.items()
        if not (k.startswith("rope.") and k != "rope.freqs") and not k.endswith(".attn.k_bias")
    }


# transformers' DINOv3ViTModel names (`model.layer.N` in transformers 5, `layer.N` before), to timm's.
_LAYER = r"^(?:model\.)?layer\.(\d+)\."
_TRANSFORMERS_RENAMES = [
    (r"^embeddings\.cls_token$", "cls_token"),
    (r"^embeddings\.register_tokens$", "reg_token"),
    (r"^embeddings\.patch_embeddings\.", "patch_embed.proj."),
    (_LAYER + r"attention\.o_proj\.", r"blocks.\1.attn.proj."),
    (_LAYER + r"attention\.", r"blocks.\1.attn."),
    (_LAYER + r"layer_scale([12])\.lambda1$", r"blocks.\1.gamma_\2"),
    (_LAYER + r"mlp\.gate_proj\.", r"blocks.\1.mlp.fc1_g."),
    (_LAYER + r"mlp\.down_proj\.", r"blocks.\1.mlp.fc2."),
    (_LAYER, r"blocks.\1."),
]


def _transformers_to_timm(state):
    """A DINOv3ViTModel's state in timm's keys: `up_proj` is fc1 (fc1_x beside a gate), the
    mask token (pretraining's) and an empty register tensor left out."""
    gated = any(".mlp.gate_proj." in key for key in state)
    converted = {}
    for key, value in state.items():
        if key == "embeddings.mask_token" or (key == "embeddings.register_tokens" and value.shape[1] == 0):
            continue
        key = key.replace(".mlp.up_proj.", ".mlp.fc1_x." if gated else ".mlp.fc1.")
        for pattern, replacement in _TRANSFORMERS_RENAMES:
            key, count = re.subn(pattern, replacement, key)
            if count:
                break
        converted[key] = value
    return converted


def _norm(layer, prefix):
    if isinstance(layer, keras.layers.RMSNormalization):
        return [(f"{prefix}.weight", layer.scale, None)]
    return [(f"{prefix}.weight", layer.gamma, None), (f"{prefix}.bias", layer.beta, None)]


def targets(model, state=None):
    """(timm key, Keras variable, layout) of every variable but the head."""
    embed = model.get_layer("patch_embed")
    found = [("patch_embed.proj.weight", embed.projection.kernel, CONV)]
    if embed.projection_bias:
        found.append(("patch_embed.proj.bias", embed.projection.bias, None))
    for name, key in (("cls_token", "cls_token"), ("reg_token", "reg_token"), ("pos_embed", "pos_embed")):
        if hasattr(embed, name):
            found.append((key, getattr(embed, name), None))
    if model.use_rot_pos_emb and model.rope_type == "mixed":
        found.append(("rope.freqs", model.get_layer("rope").freqs, None))
    layers = {layer.name: layer for layer in model.layers}
    if "norm_pre" in layers:
        found += _norm(layers["norm_pre"], "norm_pre")
    for i in range(model.depth):
        found += _block(layers[f"block_{i}"], f"blocks.{i}")
    for name in ("norm", "fc_norm"):
        if name in layers:
            found += _norm(layers[name], name)
    if model.global_pool == "map":
        pool = layers["pooling"]
        found += [
            ("attn_pool.latent", pool.latent, None),
            *linear(pool.q, "attn_pool.q"),
            *linear(pool.kv, "attn_pool.kv"),
            *linear(pool.proj, "attn_pool.proj"),
            *_norm(pool.norm, "attn_pool.norm"),
            *linear(pool.fc1, "attn_pool.mlp.fc1"),
            *linear(pool.fc2, "attn_pool.mlp.fc2"),
        ]
    return found


def _block(block, prefix):
    attention = block.attention
    found = [*_norm(block.norm1, f"{prefix}.norm1")]
    if attention.qkv_fused:
        found += linear(attention.qkv, f"{prefix}.attn.qkv", bias=attention.qkv.use_bias)
        if attention.separate_bias:
            found += [
                (f"{prefix}.attn.q_bias", attention.q_bias, None),
                (f"{prefix}.attn.v_bias", attention.v_bias, None),
            ]
    else:
        for name in ("q_proj", "k_proj", "v_proj"):
            layer = getattr(attention, name)
            found += linear(layer, f"{prefix}.attn.{name}", bias=layer.use_bias)
    if attention.qk_norm:
        found += _norm(attention.q_norm, f"{prefix}.attn.q_norm") + _norm(
            attention.k_norm, f"{prefix}.attn.k_norm"
        )
    if attention.scale_norm:
        found += _norm(attention.inner_norm, f"{prefix}.attn.norm")
    found += linear(attention.proj, f"{prefix}.attn.proj")
    for name in ("gamma_1", "gamma_2"):
        if hasattr(block, name):
            found.append((f"{prefix}.{name}", getattr(block, name), None))
    found += _norm(block.norm2, f"{prefix}.norm2")
    if block.mlp_kind == "swiglu":
        found += linear(block.fc1_g, f"{prefix}.mlp.fc1_g") + linear(block.fc1_x, f"{prefix}.mlp.fc1_x")
    else:
        found += linear(block.fc1, f"{prefix}.mlp.fc1")
    if block.scale_mlp:
        found += _norm(block.mlp_norm, f"{prefix}.mlp.norm")
    return found + linear(block.fc2, f"{prefix}.mlp.fc2")


def optional_layers(model):
    """(timm prefix, Dense layer) of the layers a checkpoint may lack: the head."""
    return [("head", model.get_layer("head"))] if model.include_top else []


def without_unplaced(model, state, source):
    """`state` without a head the model has no place for."""
    if not model.include_top:
        state = {k: v for k, v in state.items() if not k.startswith("head.")}
    return state


def fit(key, value, model, source):
    """A checkpoint's value adapted to the model: absolute position embeddings resampled to its
    grid (timm's `resample_abs_pos_embed`), RGB patch filters summed for a grayscale model."""
    embed = model.get_layer("patch_embed")
    if key == "pos_embed" and value.shape[1] != embed.pos_embed.shape[1]:
        return resample_position_embeddings(
            value, new_grid=embed.grid_size, num_prefix_tokens=embed.position_prefix_tokens
        )
    if key == "patch_embed.proj.weight" and value.ndim == 4 and value.shape[1] == 3 and model.channels == 1:
        return np.sum(value, axis=1, keepdims=True)
    return value


def mismatch_hint(keys):
    """What a checkpoint's keys the model lacks or has no place for suggest."""
    if any(".attn.qkv." in key or key.startswith("rope.") for key in keys):
        return "Is it an Eva of the same kind (fused or separate qkv, its bias, its rotary embedding)?"
    return "Is it a checkpoint of timm's eva module of the same depth and width?"
