"""The Swin family's checkpoints: timm's keys, and the other layouts turned into them
(Microsoft's original files, Hugging Face transformers' `SwinForImageClassification`).

`keras_vit.model.weights` reads the files and assigns; this module says which timm key goes to
which variable, in which layout (`keras_vit.model.state`).
"""

import logging
import re

import numpy as np

from keras_vit.model.relative_position import resize_bias_table
from keras_vit.model.state import CONV, CheckpointMismatchError, linear, norm

logger = logging.getLogger(__name__)

# The classifier head, by its timm prefix: left out of a state for other classes.
HEAD_PREFIXES = ("head.fc",)
# Buffers some files keep: computed from the window here.
_BUFFERS = ("relative_position_index", "attn_mask")


def canonical(state, source):
    """`state` in timm's keys: the buffers dropped, Microsoft's and transformers' keys converted."""
    if any(key.startswith(("swin.", "embeddings.")) for key in state):
        state = _transformers_to_original(state, source)
    state = {k: v for k, v in state.items() if not k.endswith(_BUFFERS)}
    # Microsoft's layout downsamples at the end of a stage (stage 0 has one), timm's at the start.
    if any(re.match(r"layers\.0\.downsample\.", key) for key in state):
        state = {_original_to_timm(key): value for key, value in state.items()}
    return state


def _original_to_timm(key):
    key = re.sub(r"^layers\.(\d+)\.downsample", lambda m: f"layers.{int(m.group(1)) + 1}.downsample", key)
    return re.sub(r"^head\.", "head.fc.", key)


# transformers' Swin names, over the key without its "swin." prefix, to Microsoft's.
_TRANSFORMERS_RENAMES = [
    (r"^embeddings\.patch_embeddings\.projection\.", "patch_embed.proj."),
    (r"^embeddings\.norm\.", "patch_embed.norm."),
    (r"^encoder\.layers\.(\d+)\.blocks\.(\d+)\.layernorm_before\.", r"layers.\1.blocks.\2.norm1."),
    (r"^encoder\.layers\.(\d+)\.blocks\.(\d+)\.layernorm_after\.", r"layers.\1.blocks.\2.norm2."),
    (
        r"^encoder\.layers\.(\d+)\.blocks\.(\d+)\.attention\.self\.relative_position_bias_table$",
        r"layers.\1.blocks.\2.attn.relative_position_bias_table",
    ),
    (
        r"^encoder\.layers\.(\d+)\.blocks\.(\d+)\.attention\.self\.(query|key|value)\.",
        r"layers.\1.blocks.\2.attn.\3.",
    ),
    (
        r"^encoder\.layers\.(\d+)\.blocks\.(\d+)\.attention\.output\.dense\.",
        r"layers.\1.blocks.\2.attn.proj.",
    ),
    (r"^encoder\.layers\.(\d+)\.blocks\.(\d+)\.intermediate\.dense\.", r"layers.\1.blocks.\2.mlp.fc1."),
    (r"^encoder\.layers\.(\d+)\.blocks\.(\d+)\.output\.dense\.", r"layers.\1.blocks.\2.mlp.fc2."),
    (r"^encoder\.layers\.(\d+)\.downsample\.", r"layers.\1.downsample."),
    (r"^layernorm\.", "norm."),
    (r"^classifier\.", "head."),
]


def _transformers_to_original(state, source):
    """transformers' `SwinModel` / `SwinForImageClassification` keys as Microsoft's: the same
    layout (downsampling at a stage's end), with separate query, key and value fused into qkv."""
    renamed = {}
    for key, value in state.items():
        key = re.sub(r"^swin\.", "", key)
        for pattern, replacement in _TRANSFORMERS_RENAMES:
            key, count = re.subn(pattern, replacement, key)
            if count:
                break
        renamed[key] = value
    for key in [
        k for k in renamed if re.fullmatch(r"layers\.\d+\.blocks\.\d+\.attn\.query\.(weight|bias)", k)
    ]:
        prefix, _, kind = key.rsplit(".", 2)
        parts = []
        for part in ("query", "key", "value"):
            if f"{prefix}.{part}.{kind}" not in renamed:
                raise CheckpointMismatchError(f"{source}: {prefix} has a query but no {part} projection.")
            parts.append(renamed.pop(f"{prefix}.{part}.{kind}"))
        renamed[f"{prefix}.qkv.{kind}"] = np.concatenate(parts)
    return renamed


def targets(model, state=None):
    """(timm key, Keras variable, layout) of every variable but the head."""
    embed = model.get_layer("patch_embed")
    found = [
        ("patch_embed.proj.weight", embed.projection.kernel, CONV),
        ("patch_embed.proj.bias", embed.projection.bias, None),
        *norm(embed.norm, "patch_embed.norm"),
    ]
    for stage in range(len(model.depths)):
        for layer in model.stage_layers(stage):
            found += _layer_targets(layer, stage)
    return found + norm(model.get_layer("norm"), "norm")


def _layer_targets(layer, stage):
    if layer.name.endswith("_merging"):
        prefix = f"layers.{stage}.downsample"
        return [
            *norm(layer.norm, f"{prefix}.norm"),
            *linear(layer.reduction, f"{prefix}.reduction", bias=False),
        ]
    prefix = f"layers.{stage}.blocks.{layer.name.rsplit('_', 1)[1]}"
    return [
        *norm(layer.norm1, f"{prefix}.norm1"),
        (f"{prefix}.attn.relative_position_bias_table", layer.attention.relative_position_bias_table, None),
        *linear(layer.attention.qkv, f"{prefix}.attn.qkv"),
        *linear(layer.attention.proj, f"{prefix}.attn.proj"),
        *norm(layer.norm2, f"{prefix}.norm2"),
        *linear(layer.fc1, f"{prefix}.mlp.fc1"),
        *linear(layer.fc2, f"{prefix}.mlp.fc2"),
    ]


def optional_layers(model):
    """(timm prefix, Dense layer) of the layers a checkpoint may lack: the head."""
    return [("head.fc", model.get_layer("head"))] if model.include_top else []


def without_unplaced(model, state, source):
    """`state` without a head the model has no place for."""
    if not model.include_top:
        state = {k: v for k, v in state.items() if not k.startswith("head.")}
    return state


def fit(key, value, model, source):
    """A checkpoint's value adapted to the model: a bias table resized to the block's window
    (timm's `resize_rel_pos_bias_table`), RGB patch filters summed for a grayscale model."""
    if key.endswith("relative_position_bias_table"):
        stage, block = re.match(r"layers\.(\d+)\.blocks\.(\d+)\.", key).groups()
        window = model.get_layer(f"stage_{stage}_block_{block}").effective_window
        expected = (2 * window[0] - 1) * (2 * window[1] - 1)
        if value.ndim == 2 and value.shape[0] != expected:
            logger.info("%s: resizing %s to a %dx%d window.", source, key, *window)
            return resize_bias_table(value, window)
        return value
    if key == "patch_embed.proj.weight" and value.ndim == 4 and value.shape[1] == 3 and model.channels == 1:
        return value.sum(axis=1, keepdims=True)
    return value


def mismatch_hint(keys):
    """What a checkpoint's keys the model lacks or has no place for suggest."""
    if any(key.startswith(("blocks.", "cls_token", "pos_embed")) for key in keys):
        return "It is a ViT checkpoint: use a vit_* or deit_* config."
    return "Is it a Swin checkpoint of the same depths and widths?"
