"""The ViT family's checkpoints: timm's keys, and the other layouts turned into them
(Hugging Face transformers' ViT, DeiT, DINOv2, SigLIP and CLIP, Google's `.npz` files, Apple's
MobileCLIP and AIMv2).

`keras_vit.model.weights` reads the files and assigns; this module says which timm key goes
to which variable, in which layout (`keras_vit.model.state`).
"""

import logging
import re

import numpy as np

from keras_vit.model.relative_position import resize_bias_table
from keras_vit.model.state import CONV, CheckpointMismatchError, linear, norm
from keras_vit.model.vit.pos_embed import resample_position_embeddings

logger = logging.getLogger(__name__)

# The classifier heads, by their timm prefix: left out of a state for other classes.
HEAD_PREFIXES = ("head", "head_dist")


def canonical(state, source):
    """`state` in timm's keys: transformers' and Google's `.npz` keys converted; BatchNorm's step
    counters (a MobileCLIP stem's) left out."""
    state = {key: value for key, value in state.items() if not key.endswith("num_batches_tracked")}
    if _MOBILECLIP_KEY in state:
        return _mobileclip_to_timm(state)
    if _AIMV2_KEY in state:
        return _aimv2_to_timm(state)
    if any("/" in key for key in state):
        return _npz_to_timm(state, source)
    if any(k.endswith(_CLIP_KEY) for k in state):
        return _clip_to_timm(state)
    if any(k.endswith("embeddings.cls_token") for k in state):
        return _transformers_to_timm(state)
    return state


def final_norm(model, state=None):
    """timm's name of the final LayerNorm: `fc_norm` when it acts on the pooled vector, else
    `norm` (a checkpoint that names it `fc_norm` alone is read that way)."""
    if state is not None:
        return "fc_norm" if "fc_norm.weight" in state and "norm.weight" not in state else "norm"
    return "fc_norm" if model.architecture.norm_after_pooling else "norm"


def targets(model, state=None):
    """(timm key, Keras variable, layout) of every variable but the optional layers."""
    return _targets(model, _encoder(model), final_norm(model, state))


def optional_layers(model):
    """(timm prefix, Dense layer) of the layers a checkpoint may lack: pre-logits and head(s)."""
    optional = []
    if model.representation_size is not None:
        optional.append(("pre_logits.fc", model.get_layer("pre_logits")))
    if model.include_top:
        optional.append(("head", model.get_layer("head")))
        if model.distillation_token:
            optional.append(("head_dist", model.get_layer("head_dist")))
    return optional


def without_unplaced(model, state, source):
    """`state` without the optional layers the model has no place for."""
    if model.representation_size is None and any(k.startswith("pre_logits.") for k in state):
        logger.warning("%s: ignoring the checkpoint's pre-logits layer; the model has none.", source)
        state = {k: v for k, v in state.items() if not k.startswith("pre_logits.")}
    if not model.include_top:
        state = {k: v for k, v in state.items() if not k.startswith(tuple(p + "." for p in HEAD_PREFIXES))}
    return state


def fit(key, value, model, source):
    """A checkpoint's value resampled or adapted to the model: position embeddings to its patch
    grid, RGB patch filters summed for a grayscale model (timm's `adapt_input_conv`)."""
    encoder = _encoder(model)
    if key == "pos_embed":
        return _fit_position_embeddings(
            value, encoder, source, model.architecture.position_embedding_interpolation
        )
    if key.endswith("relative_position_bias_table"):
        return _fit_bias_table(value, encoder.grid_size, encoder.num_prefix_tokens, source)
    grayscale = model.channels == 1 and encoder.backbone is None
    if key == "patch_embed.proj.weight" and value.ndim == 4 and grayscale:
        return value.sum(axis=1, keepdims=True) if value.shape[1] == 3 else value
    return value


def mismatch_hint(unused):
    """What a checkpoint's keys the model has no place for suggest."""
    if any(k.endswith(".ls1.gamma") for k in unused):
        return "It has LayerScale (DeiT III): use a deit3_* config, or ViT(layer_scale=...)."
    if "dist_token" in unused:
        return "It is a distilled DeiT: use a deit_*_distilled_* config, or ViT(distillation_token=True)."
    return "Is it a plain ViT checkpoint of the same depth?"


def _encoder(model):
    return model.get_layer("patch_encoder")


# Hugging Face transformers' ViT, DeiT and DINOv2 names (hub files use the first form,
# transformers 5's modules the second), as regular expressions over the key without its "vit."
# prefix.
_TRANSFORMERS_RENAMES = [
    (r"^embeddings\.register_tokens$", "reg_token"),  # Dinov2WithRegisters
    (r"^(?:encoder\.layer|layers)\.(\d+)\.layer_scale([12])\.lambda1$", r"blocks.\1.ls\2.gamma"),
    (r"^(?:encoder\.layer|layers)\.(\d+)\.norm([12])\.", r"blocks.\1.norm\2."),
    # DINOv2's MLP, and its SwiGLU (gate and value in one `weights_in`: timm's SwiGLUPacked)
    (r"^(?:encoder\.layer|layers)\.(\d+)\.mlp\.(?:fc1|weights_in)\.", r"blocks.\1.mlp.fc1."),
    (r"^(?:encoder\.layer|layers)\.(\d+)\.mlp\.(?:fc2|weights_out)\.", r"blocks.\1.mlp.fc2."),
    (r"^embeddings\.cls_token$", "cls_token"),
    (r"^embeddings\.distillation_token$", "dist_token"),  # DeiT
    (r"^embeddings\.position_embeddings$", "pos_embed"),
    (r"^embeddings\.patch_embeddings\.projection\.", "patch_embed.proj."),
    (r"^(?:encoder\.layer|layers)\.(\d+)\.layernorm_before\.", r"blocks.\1.norm1."),
    (r"^(?:encoder\.layer|layers)\.(\d+)\.layernorm_after\.", r"blocks.\1.norm2."),
    (
        r"^(?:encoder\.layer|layers)\.(\d+)\.attention\.(?:attention\.)?(query|key|value|[qkv]_proj)\.",
        r"blocks.\1.attn.\2.",
    ),
    (r"^(?:encoder\.layer|layers)\.(\d+)\.attention\.(?:output\.dense|o_proj)\.", r"blocks.\1.attn.proj."),
    (r"^(?:encoder\.layer\.(\d+)\.intermediate\.dense|layers\.(\d+)\.mlp\.fc1)\.", r"blocks.\1\2.mlp.fc1."),
    (r"^(?:encoder\.layer\.(\d+)\.output\.dense|layers\.(\d+)\.mlp\.fc2)\.", r"blocks.\1\2.mlp.fc2."),
    (r"^layernorm\.", "norm."),
    (r"^pooler\.dense\.", "pre_logits.fc."),
    (r"^(?:cls_)?classifier\.", "head."),
    (r"^distillation_classifier\.", "head_dist."),  # DeiT's second head
]


# Apple's MobileCLIP image encoder, as its own checkpoints name it (timm's `_convert_mobileclip`).
_MOBILECLIP_PREFIX = "image_encoder.model."
# Apple's own AIMv2 layout (`apple/aimv2-*`), renamed as timm's `_convert_aimv2` renames it: its
# SwiGLU's fc1 is the gate, fc3 the value.
_AIMV2_KEY = "preprocessor.patchifier.proj.weight"
_AIMV2_RENAMES = (
    ("norm_1", "norm1"),
    ("norm_2", "norm2"),
    ("preprocessor.patchifier.", "patch_embed."),
    ("preprocessor.pos_embed", "pos_embed"),
    ("trunk.", ""),
    ("post_trunk_norm.", "norm."),
    ("mlp.fc1", "mlp.fc1_g"),
    ("mlp.fc3", "mlp.fc1_x"),
)


def _aimv2_to_timm(state):
    renamed = {}
    for key, value in state.items():
        for old, new in _AIMV2_RENAMES:
            key = key.replace(old, new)
        renamed[key] = value
    return renamed


_MOBILECLIP_KEY = _MOBILECLIP_PREFIX + "patch_emb.0.block.conv.weight"
_MOBILECLIP_RENAMES = (
    ("patch_emb.", "patch_embed.backbone."),
    ("block.conv", "conv"),
    ("block.norm", "bn"),
    ("post_transformer_norm.", "norm."),
    ("pre_norm_mha.0", "norm1"),
    ("pre_norm_mha.1", "attn"),
    ("pre_norm_ffn.0", "norm2"),
    ("pre_norm_ffn.1", "mlp.fc1"),
    ("pre_norm_ffn.4", "mlp.fc2"),
    ("qkv_proj.", "qkv."),
    ("out_proj.", "proj."),
    ("transformer.", "blocks."),
)


def _mobileclip_to_timm(state):
    """Apple's MobileCLIP image encoder in timm's keys, as timm's `_convert_mobileclip`: its
    projection to the joint embedding becomes the head (no bias)."""
    converted = {}
    for key, value in state.items():
        if not key.startswith(_MOBILECLIP_PREFIX):
            continue
        key = key[len(_MOBILECLIP_PREFIX) :]
        for old, new in _MOBILECLIP_RENAMES:
            key = key.replace(old, new)
        if key == "pos_embed.pos_embed.pos_embed":
            key, value = "pos_embed", value[0]
        if "classifier.proj" in key:
            value = np.asarray(value).T
            converted[key.replace("classifier.proj", "head.bias")] = np.zeros(value.shape[0], value.dtype)
            key = key.replace("classifier.proj", "head.weight")
        converted[key] = value
    return converted


def _transformers_to_timm(state):
    """Converts a transformers `ViTModel` / `ViTForImageClassification` (or DeiT's
    `DeiTForImageClassificationWithTeacher`, `Dinov2Model`, `Dinov2WithRegistersModel`) state
    dict to timm's; the mask token (pretraining's) left out."""
    renamed = _renamed(
        {k: v for k, v in state.items() if k != "embeddings.mask_token"},
        r"^(?:vit|deit)\.",
        _TRANSFORMERS_RENAMES,
    )
    if "reg_token" in renamed:
        _fold_class_position(renamed)
    return _fused_qkv(renamed)


def _renamed(state, prefix, renames):
    """`state` with `prefix` dropped from its keys and the first of `renames` that matches applied."""
    renamed = {}
    for key, value in state.items():
        key = re.sub(prefix, "", key)
        for pattern, replacement in renames:
            key, count = re.subn(pattern, replacement, key)
            if count:
                break
        renamed[key] = value
    return renamed


def _fold_class_position(state):
    """DINOv2 with registers as timm's `_convert_dinov2` takes it: the registers have no position
    embedding and the [cls] token's is added to it, so the embeddings are the patches' alone
    (`no_embed_class`)."""
    if "pos_embed" not in state or "cls_token" not in state:
        return  # the missing key is reported by name when the state is assigned
    position = np.asarray(state["pos_embed"])
    state["cls_token"] = np.asarray(state["cls_token"]) + position[:, :1]
    state["pos_embed"] = position[:, 1:]


# transformers' CLIP and SigLIP vision towers (`CLIPVisionModel`, `SiglipVisionModel`, the
# `vision_model` of `CLIPModel` and `SiglipModel`), as regular expressions over the key without
# its "vision_model." prefix; SigLIP's attention-pooling head (`head.*`) is timm's `attn_pool`.
_CLIP_KEY = "embeddings.patch_embedding.weight"
_CLIP_RENAMES = [
    (r"^embeddings\.class_embedding$", "cls_token"),
    (r"^embeddings\.position_embedding\.weight$", "pos_embed"),
    (r"^embeddings\.patch_embedding\.", "patch_embed.proj."),
    (r"^pre_layrnorm\.", "norm_pre."),
    (r"^post_layernorm\.", "norm."),
    (r"^encoder\.layers\.(\d+)\.layer_norm([12])\.", r"blocks.\1.norm\2."),
    (r"^encoder\.layers\.(\d+)\.self_attn\.([qkv]_proj)\.", r"blocks.\1.attn.\2."),
    (r"^encoder\.layers\.(\d+)\.self_attn\.out_proj\.", r"blocks.\1.attn.proj."),
    (r"^encoder\.layers\.(\d+)\.mlp\.", r"blocks.\1.mlp."),
    (r"^head\.probe$", "attn_pool.latent"),
    (r"^head\.attention\.out_proj\.", "attn_pool.proj."),
    (r"^head\.layernorm\.", "attn_pool.norm."),
    (r"^head\.mlp\.", "attn_pool.mlp."),
    (r"^visual_projection\.", "head."),  # CLIPModel's projection to the joint embedding
]
# What a two-tower checkpoint holds beside the image tower: the text tower and the logit scale.
_TEXT_TOWER = re.compile(r"^(?:text_model\.|text_projection\.|logit_scale$|logit_bias$)")


def _clip_to_timm(state):
    """A transformers CLIP or SigLIP vision tower in timm's keys, as timm's CLIP and SigLIP image
    towers have them: the [cls] embedding and position table as tokens, the attention-pooling
    head's fused query/key/value split into timm's `q` and `kv`, CLIP's bias-free projection the
    head with a zero bias."""
    state = _renamed(
        {k: v for k, v in state.items() if not _TEXT_TOWER.match(k)}, r"^vision_model\.", _CLIP_RENAMES
    )
    if "cls_token" in state:
        state["cls_token"] = np.asarray(state["cls_token"]).reshape(1, 1, -1)
    if "pos_embed" in state:
        state["pos_embed"] = np.asarray(state["pos_embed"])[None]
    for kind in ("weight", "bias"):
        fused = state.pop(f"head.attention.in_proj_{kind}", None)
        if fused is not None:
            width = fused.shape[0] // 3
            state[f"attn_pool.q.{kind}"], state[f"attn_pool.kv.{kind}"] = fused[:width], fused[width:]
    if "head.weight" in state and "head.bias" not in state:
        state["head.bias"] = np.zeros(state["head.weight"].shape[0], np.float32)
    return _fused_qkv(state)


def _fused_qkv(renamed):
    """Separate query, key and value projections as timm's fused qkv."""
    names = {"query": "q_proj", "key": "k_proj", "value": "v_proj"}
    for key in [k for k in renamed if re.fullmatch(r"blocks\.\d+\.attn\.(query|q_proj)\.(weight|bias)", k)]:
        block, _, kind = key.rsplit(".", 2)
        parts = []
        for part in ("query", "key", "value"):
            part_key = next(
                (f"{block}.{n}.{kind}" for n in (part, names[part]) if f"{block}.{n}.{kind}" in renamed), None
            )
            if part_key is None:
                raise CheckpointMismatchError(f"{block} has a query but no {part} projection.")
            parts.append(renamed.pop(part_key))
        renamed[f"{block}.qkv.{kind}"] = np.concatenate(parts)
    return renamed


def _npz_to_timm(w, path):
    """Converts google-research/vision_transformer `.npz` keys to timm's, as timm's `_load_weights`."""
    prefix = next((p for p in ("", "opt/target/") if f"{p}embedding/kernel" in w), None)
    if prefix is None:
        hint = (
            " It looks like a big_vision checkpoint, which is not supported."
            if any(k.startswith("params/") for k in w)
            else ""
        )
        raise CheckpointMismatchError(f"{path} has no 'embedding/kernel': not a Google ViT checkpoint.{hint}")
    w = {k[len(prefix) :]: np.asarray(v, dtype=np.float32) for k, v in w.items() if k.startswith(prefix)}
    used = set()

    def take(key):
        if key not in w:
            raise CheckpointMismatchError(f"{path} lacks the key {key!r}.")
        used.add(key)
        return w[key]

    state = {
        "patch_embed.proj.weight": take("embedding/kernel").transpose(3, 2, 0, 1),
        "patch_embed.proj.bias": take("embedding/bias"),
        "cls_token": take("cls"),
        "pos_embed": take("Transformer/posembed_input/pos_embedding"),
        "norm.weight": take("Transformer/encoder_norm/scale"),
        "norm.bias": take("Transformer/encoder_norm/bias"),
    }
    for npz_name, timm_name in (("head", "head"), ("pre_logits", "pre_logits.fc")):
        if f"{npz_name}/kernel" in w:
            state[f"{timm_name}.weight"] = take(f"{npz_name}/kernel").T
            state[f"{timm_name}.bias"] = take(f"{npz_name}/bias")
    i = 0
    while f"Transformer/encoderblock_{i}/LayerNorm_0/scale" in w:
        src, dst = f"Transformer/encoderblock_{i}/", f"blocks.{i}."
        mha = src + "MultiHeadDotProductAttention_1/"
        qkv = [take(f"{mha}{n}/kernel") for n in ("query", "key", "value")]
        state[dst + "attn.qkv.weight"] = np.concatenate([k.reshape(k.shape[0], -1).T for k in qkv])
        state[dst + "attn.qkv.bias"] = np.concatenate(
            [take(f"{mha}{n}/bias").reshape(-1) for n in ("query", "key", "value")]
        )
        out = take(f"{mha}out/kernel")  # (heads, head_dim, dim)
        state[dst + "attn.proj.weight"] = out.reshape(-1, out.shape[-1]).T
        state[dst + "attn.proj.bias"] = take(f"{mha}out/bias")
        for ln, name in (("LayerNorm_0", "norm1"), ("LayerNorm_2", "norm2")):
            state[f"{dst}{name}.weight"] = take(f"{src}{ln}/scale")
            state[f"{dst}{name}.bias"] = take(f"{src}{ln}/bias")
        for r in range(2):
            state[f"{dst}mlp.fc{r + 1}.weight"] = take(f"{src}MlpBlock_3/Dense_{r}/kernel").T
            state[f"{dst}mlp.fc{r + 1}.bias"] = take(f"{src}MlpBlock_3/Dense_{r}/bias")
        i += 1
    unused = sorted(set(w) - used)
    if unused:
        raise CheckpointMismatchError(
            f"{path} has {len(unused)} key(s) that this ViT has no place for, e.g. {unused[:5]}."
        )
    return state


def _targets(model, encoder, final_norm_key):
    targets = []
    if encoder.stem == "resnetv2":
        targets += _resnetv2_targets(encoder.backbone, "patch_embed.backbone")
    elif encoder.stem == "convstem":
        targets += _convstem_targets(encoder.backbone, "patch_embed.backbone")
    if encoder.projection is not None:
        targets.append(("patch_embed.proj.weight", encoder.projection.kernel, CONV))
        if encoder.projection_bias:
            targets.append(("patch_embed.proj.bias", encoder.projection.bias, None))
    if encoder.norm is not None:
        targets += norm(encoder.norm, "patch_embed.norm")
    if encoder.position_embedding is not None:
        targets.append(("pos_embed", encoder.position_embedding, None))
    for key, present in (
        ("cls_token", "class_token"),
        ("dist_token", "distillation_token"),
        ("reg_token", "register_tokens"),
    ):
        if getattr(encoder, present):
            targets.append((key, getattr(encoder, key), None))
    if model.pre_norm:
        targets += norm(model.get_layer("norm_pre"), "norm_pre")
    if model.shared_position_bias:
        targets += _position_bias_targets(model.get_layer("position_bias"), "shared_rel_pos")
    for i, block in enumerate(model.blocks):
        p = f"blocks.{i}"
        if model.block == "parallel":
            targets += _parallel_block_targets(block, p)
            continue
        if block.attention_kind == "diff":
            targets += _differential_targets(block.attention.diff, f"{p}.attn")
        targets += norm(block.norm1, f"{p}.norm1")
        if block.attention.rel_pos is not None:
            targets += _position_bias_targets(block.attention.rel_pos, f"{p}.attn.rel_pos")
        targets += linear(block.attention.qkv, f"{p}.attn.qkv", bias=block.qkv_bias)
        if block.scale_attention_norm:
            targets += norm(block.attention.norm, f"{p}.attn.norm")
        if block.scale_mlp_norm:
            targets += norm(block.mlp_norm, f"{p}.mlp.norm")
        targets += linear(block.attention.proj, f"{p}.attn.proj", bias=block.proj_bias)
        targets += norm(block.norm2, f"{p}.norm2")
        for layer in [*block.mlp_hidden_layers, block.fc2]:
            targets += linear(layer, f"{p}.mlp.{layer.name}", bias=block.proj_bias)
        if block.has_layer_scale:
            targets += [(f"{p}.ls1.gamma", block.ls1, None), (f"{p}.ls2.gamma", block.ls2, None)]
    if model.final_norm:
        targets += norm(model.get_layer("norm"), final_norm_key)
    if model.pooling == "map":
        targets += _attention_pool_targets(model.get_layer("pooling"), "attn_pool")
    return targets


def _resnetv2_targets(stem, prefix):
    """timm's `ResNetV2` keys of a hybrid ViT's backbone (its `create_resnetv2_stem` alone when it
    has no stages: `conv`, `norm` without the `stem.`)."""
    base = f"{prefix}.stem" if stem.depths else prefix

    def conv_norm(conv, norm_layer, key_conv, key_norm):
        return [(f"{key_conv}.weight", conv.kernel, CONV)] + norm(norm_layer, key_norm)

    targets = conv_norm(stem.stem_conv, stem.stem_norm, f"{base}.conv", f"{base}.norm")
    for block in stem.blocks:
        stage, index = block.name.split("_")[1::2]
        p = f"{prefix}.stages.{stage}.blocks.{index}"
        if block.downsample:
            targets += conv_norm(
                block.downsample_conv, block.downsample_norm, f"{p}.downsample.conv", f"{p}.downsample.norm"
            )
        for i in (1, 2, 3):
            conv, norm_layer = getattr(block, f"conv{i}"), getattr(block, f"norm{i}")
            targets += conv_norm(conv, norm_layer, f"{p}.conv{i}", f"{p}.norm{i}")
    return targets


def _differential_targets(core, prefix):
    """timm's `DiffAttention` lambdas and `sub_norm` (a `DiffParallelScalingBlock`'s too)."""
    lambdas = [(f"{prefix}.{name}", getattr(core, name), None) for name in ("lambda_q1", "lambda_k1")]
    lambdas += [(f"{prefix}.{name}", getattr(core, name), None) for name in ("lambda_q2", "lambda_k2")]
    return lambdas + [(f"{prefix}.sub_norm.weight", core.sub_norm, None)]


def _parallel_block_targets(block, p):
    """timm's `ParallelScalingBlock` (and `DiffParallelScalingBlock`) keys."""
    targets = norm(block.in_norm, f"{p}.in_norm") + linear(block.in_proj, f"{p}.in_proj", bias=block.qkv_bias)
    if not block.qkv_bias:
        targets.append((f"{p}.mlp_bias", block.mlp_bias, None))
    if block.diff is not None:
        targets += _differential_targets(block.diff, p)
    for layer in (block.out_proj, block.attn_out_proj, block.mlp_out_proj):
        if layer is not None:
            targets += linear(layer, f"{p}.{layer.name}", bias=block.proj_bias)
    if block.layer_scale is not None:
        targets.append((f"{p}.ls.gamma", block.ls, None))
    return targets


def _convstem_targets(stem, prefix):
    """timm's `ConvStem` keys (`ConvNormAct`'s `conv` and `bn`, BatchNorm's running statistics)."""
    targets = []
    for i, conv in enumerate(stem.convs):
        targets.append((f"{prefix}.{i}.conv.weight", conv.kernel, CONV))
        if conv.use_bias:
            targets.append((f"{prefix}.{i}.conv.bias", conv.bias, None))
    for i, bn in enumerate(stem.norms):
        p = f"{prefix}.{i}.bn"
        targets += norm(bn, p)
        targets.append((f"{p}.running_mean", bn.moving_mean, None))
        targets.append((f"{p}.running_var", bn.moving_variance, None))
    return targets


def _position_bias_targets(bias, prefix):
    """timm's `RelPosMlp` (`mlp.fc1`, `mlp.fc2`) or `RelPosBias` (its table) keys."""
    if bias.kind == "table":
        return [(f"{prefix}.relative_position_bias_table", bias.relative_position_bias_table, None)]
    return linear(bias.bias_fc1, f"{prefix}.mlp.fc1") + linear(bias.bias_fc2, f"{prefix}.mlp.fc2")


def _attention_pool_targets(pool, prefix):
    """timm's `AttentionPoolLatent` keys."""
    targets = [(f"{prefix}.latent", pool.latent, None)]
    for layer, key in (
        (pool.q, "q"),
        (pool.kv, "kv"),
        (pool.proj, "proj"),
        (pool.fc1, "mlp.fc1"),
        (pool.fc2, "mlp.fc2"),
    ):
        targets += linear(layer, f"{prefix}.{key}")
    return targets + norm(pool.norm, f"{prefix}.norm")


def _fit_bias_table(table, grid, num_prefix_tokens, source):
    """A relative position bias table resized to the model's patch grid when its size differs, as
    timm's `checkpoint_filter_fn` (its [cls] token's three entries kept)."""
    extra = 3 * num_prefix_tokens
    if table.ndim != 2 or table.shape[0] == (2 * grid[0] - 1) * (2 * grid[1] - 1) + extra:
        return table
    logger.info("%s: resizing a relative position bias table to a %dx%d patch grid.", source, *grid)
    try:
        return resize_bias_table(table, grid, extra_entries=extra)
    except ValueError as error:
        raise CheckpointMismatchError(f"{source}: {error}") from None


def _fit_position_embeddings(pos_embed, encoder, source, interpolation):
    expected = tuple(encoder.position_embedding.shape)
    if pos_embed.shape == expected or pos_embed.ndim != 3 or pos_embed.shape[-1] != expected[-1]:
        return pos_embed  # equal, or a mismatch that the shape check reports
    prefix = encoder.position_prefix_tokens
    old_tokens = pos_embed.shape[1] - prefix
    side = int(round(old_tokens**0.5))
    if side * side != old_tokens:
        raise CheckpointMismatchError(
            f"{source}: 'pos_embed' has shape {pos_embed.shape}, which is no square patch grid "
            f"plus {prefix} [cls] token; the model's has shape {expected}."
        )
    logger.info(
        "%s: resampling position embeddings from a %dx%d to a %dx%d patch grid.",
        source,
        side,
        side,
        *encoder.grid_size,
    )
    return resample_position_embeddings(pos_embed, encoder.grid_size, (side, side), prefix, interpolation)
