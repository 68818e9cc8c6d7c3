"""timm's `VisionTransformer` keyword arguments as a ViT's arguments, and back (keras-free).

timm builds a named ViT by calling its entry point, which passes its own keyword arguments
(`vit_base_patch16_clip_224`: `pre_norm=True`, `norm_layer=partial(LayerNorm, eps=1e-5)`, ...) with
a repo's `model_args` over them; the arguments that are parts (`act_layer`, `mlp_layer`,
`norm_layer`) are classes there and names here, as `scripts/generate_pretrained_table.py` writes
every entry point's (`tables/timm_vit_entry_points.json`) and as a repo's `config.json` may give
them: `act_layer` by timm's name ("quick_gelu"), `mlp_layer` as "mlp", "swiglu" or "swiglu_packed",
`norm_layer` as "layernorm" or `{"name": "layernorm", "eps": 1e-5}`.
"""

from keras_vit.model.vit.architecture import ARGUMENTS, Architecture

# timm's keyword arguments that are a ViT argument as they are.
SAME = {
    "img_size": "image_size",
    "patch_size": "patch_size",
    "in_chans": "channels",
    "embed_dim": "hidden_dim",
    "depth": "depth",
    "num_heads": "num_heads",
    "class_token": "class_token",
    "reg_tokens": "register_tokens",
    "qkv_bias": "qkv_bias",
    "proj_bias": "proj_bias",
    "pre_norm": "pre_norm",
    "final_norm": "final_norm",
    "drop_rate": "dropout",
    "attn_drop_rate": "attention_dropout",
    "drop_path_rate": "drop_path_rate",
    "scale_attn_norm": "scale_attention_norm",
    "scale_mlp_norm": "scale_mlp_norm",
    "pool_include_prefix": "pool_include_prefix",
}
# Those read through a rule (`from_timm`). `num_classes` is the config's own; `dynamic_img_size`
# changes nothing at the model's own size, and keras-vit resizes a model (`resize_model`) rather
# than its position embeddings at each call; `distilled` is timm's DeiT entry points'.
RULED = (
    "mlp_ratio",
    "init_values",
    "no_embed_class",
    "global_pool",
    "fc_norm",
    "act_layer",
    "mlp_layer",
    "norm_layer",
    "num_classes",
    "dynamic_img_size",
    "distilled",
    "block_fn",
    "rel_pos_type",
    "rel_pos_dim",
    "shared_rel_pos",
    "embed_layer",
    "attn_layer",
    "embed_norm_layer",
)
POOLINGS = {"token": "token", "avg": "gap", "map": "map", "": "none"}
ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_tanh": "gelu_tanh",
    "quick_gelu": "quick_gelu",
    "silu": "silu",
    "swish": "silu",
}
MLPS = ("mlp", "swiglu", "swiglu_packed")
# timm's blocks by their class names (`block_fn`): `VisionTransformer`'s and
# `VisionTransformerRelPos`' (the same blocks, with a relative position bias in the attention).
BLOCK_FNS = {
    "Block": "pre_norm",
    "RelPosBlock": "pre_norm",
    "ResPostBlock": "res_post",
    "ResPostRelPosBlock": "res_post",
    "ParallelScalingBlock": "parallel",
    "DiffParallelScalingBlock": "parallel",
}
# timm's `attn_layer` by name: its `Attention` (None, "attn") or `DiffAttention` ("diff").
ATTN_LAYERS = {None: "standard", "attn": "standard", "diff": "diff"}
# timm's `rel_pos_type` of `VisionTransformerRelPos`: "mlp" is `RelPosMlp` (its "cr" mode), any
# other name not starting with "mlp" `RelPosBias`; None is `VisionTransformer`'s absolute
# position embeddings (entry points of `vision_transformer_relpos` always name theirs).
TIMM_POSITION_BIASES = {None: None, "mlp": "mlp", "bias": "table"}
# timm's `RelPosMlp` width when `rel_pos_dim` is None.
REL_POS_DIM = 128
# timm's LayerNorm (`timm.layers.LayerNorm`), its ViT's default norm_layer, and its RmsNorm.
LAYER_NORM_EPS = 1e-6
# timm's norms by the names `norm_layer` gives them (the generator writes RmsNorm's class name).
NORM_NAMES = {"layernorm": "layernorm", "rmsnorm": "rmsnorm", "RmsNorm": "rmsnorm"}
# timm's defaults, for the keyword arguments an entry point leaves out.
DEFAULTS = {
    "img_size": 224,
    "patch_size": 16,
    "in_chans": 3,
    "embed_dim": 768,
    "depth": 12,
    "num_heads": 12,
    "mlp_ratio": 4.0,
    "qkv_bias": True,
    "proj_bias": True,
    "init_values": None,
    "class_token": True,
    "no_embed_class": False,
    "reg_tokens": 0,
    "pre_norm": False,
    "final_norm": True,
    "fc_norm": None,
    "global_pool": "token",
    "act_layer": "gelu",
    "mlp_layer": "mlp",
    "norm_layer": "layernorm",
    "distilled": False,
    "drop_rate": 0.0,
    "attn_drop_rate": 0.0,
    "drop_path_rate": 0.0,
    "scale_attn_norm": False,
    "scale_mlp_norm": False,
    "pool_include_prefix": False,
    "block_fn": "Block",
    "rel_pos_type": None,
    "rel_pos_dim": None,
    "shared_rel_pos": False,
    "embed_layer": None,
    "attn_layer": None,
    "embed_norm_layer": None,
}


class NotBuildable(ValueError):
    """timm keyword arguments that ask for a part keras-vit does not have: the message names it."""


def unknown(kwargs):
    """The keyword arguments keras-vit does not read, sorted."""
    return sorted(set(kwargs) - set(SAME) - set(RULED))


def from_timm(kwargs, source):
    """A ViT's arguments from timm's keyword arguments (any left out take timm's defaults).

    Raises:
        NotBuildable: an argument or a part keras-vit does not have; `source` names the model.
    """
    if unknown(kwargs):
        raise NotBuildable(
            f"{source} takes timm arguments keras-vit has no part for ({', '.join(unknown(kwargs))})."
        )
    kwargs = {**DEFAULTS, **kwargs}
    arguments = {ours: kwargs[timm] for timm, ours in SAME.items()}
    arguments["image_size"] = _pair(kwargs["img_size"])
    arguments["mlp_dim"] = int(kwargs["embed_dim"] * kwargs["mlp_ratio"])  # as timm's Block
    arguments["layer_scale"] = kwargs["init_values"] or None  # timm: none for 0 or None
    arguments["cls_position_embedding"] = not kwargs["no_embed_class"]
    arguments["distillation_token"] = bool(kwargs["distilled"])
    arguments["pooling"] = _choice(kwargs, "global_pool", POOLINGS, source)
    arguments["norm_before_pooling"] = None if kwargs["fc_norm"] is None else not kwargs["fc_norm"]
    arguments["activation"] = _choice(kwargs, "act_layer", ACTIVATIONS, source)
    arguments["mlp"] = _choice(kwargs, "mlp_layer", {name: name for name in MLPS}, source)
    arguments["norm"], arguments["layer_norm_epsilon"] = _norm(kwargs["norm_layer"], "norm_layer", source)
    arguments["embed_norm"] = _embed_norm(kwargs, arguments, source)
    arguments["block"] = _choice(kwargs, "block_fn", BLOCK_FNS, source)
    arguments["attention"] = _choice(kwargs, "attn_layer", ATTN_LAYERS, source)
    if kwargs["block_fn"] == "DiffParallelScalingBlock":  # its own attention, whatever attn_layer says
        arguments["attention"] = "diff"
    arguments["position_bias"] = _position_bias(kwargs["rel_pos_type"], source)
    arguments["position_bias_dim"] = kwargs["rel_pos_dim"] or REL_POS_DIM
    arguments["shared_position_bias"] = bool(kwargs["shared_rel_pos"])
    arguments["stem"], arguments["stem_depths"] = _stem(kwargs["embed_layer"], source)
    return arguments


def _stem(embed_layer, source):
    """(stem, stem_depths) of timm's `embed_layer`: None (its `PatchEmbed`), or a `HybridEmbed` over
    a ResNetV2, written `{"name": "HybridEmbed", "backbone": "resnetv2", "depths": [...]}`."""
    if embed_layer is None:
        return None, []
    backbone = embed_layer.get("backbone") if isinstance(embed_layer, dict) else None
    if backbone == "resnetv2":
        return backbone, list(embed_layer.get("depths", []))
    if backbone == "ConvStem" and embed_layer.get("proj") is False:  # MobileCLIP's
        return "convstem", []
    raise NotBuildable(
        f"{source} takes embed_layer={embed_layer!r}; keras-vit has timm's ResNetV2 and MobileCLIP's "
        f"ConvStem."
    )


def _position_bias(rel_pos_type, source):
    if rel_pos_type is None or rel_pos_type == "mlp":
        return rel_pos_type
    if rel_pos_type.startswith("mlp"):
        raise NotBuildable(f"{source} takes rel_pos_type={rel_pos_type!r}; keras-vit has 'mlp' and 'bias'.")
    return "table"


def timm_kwargs(arguments):
    """A ViT's architecture as the keyword arguments of timm's `VisionTransformer` that build it
    (all of them, in this module's names for parts); `from_timm` reads them back."""
    arch = Architecture(**{key: value for key, value in arguments.items() if key in ARGUMENTS})
    kwargs = {timm: getattr(arch, ours) for timm, ours in SAME.items()}
    pools = {ours: timm for timm, ours in POOLINGS.items()}
    kwargs.update(
        img_size=list(arch.image_size),
        mlp_ratio=arch.mlp_dim / arch.hidden_dim,
        init_values=arch.layer_scale,
        no_embed_class=not arch.cls_position_embedding,
        distilled=arch.distillation_token,
        global_pool=pools[arch.pooling],
        fc_norm=None if arch.norm_before_pooling is None else not arch.norm_before_pooling,
        act_layer=arch.activation,
        mlp_layer=arch.mlp,
        norm_layer={"name": arch.norm, "eps": arch.layer_norm_epsilon},
        embed_norm_layer={"name": arch.norm, "eps": arch.layer_norm_epsilon} if arch.embed_norm else None,
        block_fn=_block_fn(arch),
        rel_pos_type={ours: timm for timm, ours in TIMM_POSITION_BIASES.items()}[arch.position_bias],
        rel_pos_dim=arch.position_bias_dim,
        shared_rel_pos=arch.shared_position_bias,
        embed_layer=_embed_layer(arch),
        attn_layer="diff" if arch.attention == "diff" and arch.block != "parallel" else None,
    )
    return kwargs


def _embed_layer(arch):
    if arch.stem is None:
        return None
    if arch.stem == "convstem":
        return {"name": "HybridEmbed", "backbone": "ConvStem", "proj": False}
    return {"name": "HybridEmbed", "backbone": arch.stem, "depths": list(arch.stem_depths)}


def _block_fn(arch):
    """timm's block class of a ViT: `VisionTransformerRelPos`' with a relative position bias."""
    if arch.block == "parallel":
        return "DiffParallelScalingBlock" if arch.attention == "diff" else "ParallelScalingBlock"
    relative = "RelPos" if arch.position_bias else ""
    return {"pre_norm": f"{relative}Block", "res_post": f"ResPost{relative}Block"}[arch.block]


def _pair(size):
    return [size, size] if isinstance(size, int) else list(size)


def _choice(kwargs, key, choices, source):
    value = kwargs[key]
    if value is None and key == "act_layer":
        value = "gelu"
    if value not in choices:
        raise NotBuildable(
            f"{source} takes {key}={value!r}; keras-vit has {', '.join(repr(c) for c in choices)}."
        )
    return choices[value]


def _norm(norm_layer, key, source):
    """(kind, epsilon) of a norm given as "layernorm" (timm's, 1e-6), "rmsnorm" or {"name", "eps"}."""
    if norm_layer is None:
        norm_layer = "layernorm"
    if isinstance(norm_layer, str):
        norm_layer = {"name": norm_layer}
    if not isinstance(norm_layer, dict) or norm_layer.get("name") not in NORM_NAMES:
        raise NotBuildable(f"{source} takes {key}={norm_layer!r}; keras-vit's ViT has LayerNorm and RmsNorm.")
    return NORM_NAMES[norm_layer["name"]], float(norm_layer.get("eps", LAYER_NORM_EPS))


def _embed_norm(kwargs, arguments, source):
    """Whether the patch embedding ends in a norm (timm's `embed_norm_layer`): one like the
    model's other norms, as AIMv2's."""
    if kwargs["embed_norm_layer"] is None:
        return False
    if _norm(kwargs["embed_norm_layer"], "embed_norm_layer", source) != (
        arguments["norm"],
        arguments["layer_norm_epsilon"],
    ):
        raise NotBuildable(
            f"{source} takes an embed_norm_layer unlike its norm_layer; keras-vit's ViT has one kind of norm."
        )
    return True
