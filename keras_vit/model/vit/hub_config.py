"""The ViT family on the hub: timm's `model_args` and transformers' ViT and DeiT configs as a
ViT's arguments, and a ViT's arguments as timm's `model_args` (`keras_vit.model.hub_config`
reads and writes the rest of a repo's config)."""

import dataclasses

from keras_vit.model.vit import FAMILY, timm_args
from keras_vit.model.vit.architecture import Architecture
from keras_vit.model.vit.configs import MODEL_CONFIGS

# A ViT's arguments timm's `model_args` write as they are (the rest: `timm_model_args`).
_AS_IS = (
    "patch_size",
    "hidden_dim",
    "depth",
    "num_heads",
    "class_token",
    "register_tokens",
    "qkv_bias",
    "proj_bias",
    "pre_norm",
    "final_norm",
    "scale_attention_norm",
    "scale_mlp_norm",
    "pool_include_prefix",
)
_AS_TIMM = {ours: timm for timm, ours in timm_args.SAME.items() if ours in _AS_IS}
# What a ViT has that timm's VisionTransformer cannot be given in `model_args` (its parts are
# classes there: a model that differs in them is published as an architecture that has them).
_NOT_IN_TIMM = (
    "representation_size",
    "distillation_token",
    "mlp",
    "layer_norm_epsilon",
    "norm",
    "embed_norm",
    "block",
    "attention",
    "stem",
    "stem_depths",
)
# The parts a timm class has or has not (absolute position embeddings or a relative position
# bias: `VisionTransformer` or `VisionTransformerRelPos`): a model is published as one that has
# them.
_SAME_KIND = ("distillation_token", "mlp", "norm", "embed_norm", "block", "attention", "stem", "stem_depths")
# LayerNorm epsilons this close give the same logits to well under 1e-4.
_SAME_EPSILON = 1e-6
# transformers' model types of the family (`model_type` in a repo's config.json), each read by its
# own reader below: ViT and DeiT, DINOv2 (with registers), SigLIP's and CLIP's vision towers.
TRANSFORMERS_TYPES = (
    "vit",
    "deit",
    "dinov2",
    "dinov2_with_registers",
    "siglip_vision_model",
    "siglip",
    "clip_vision_model",
    "clip",
)
# transformers' activations (`hidden_act`) by keras-vit's names.
_TRANSFORMERS_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_new": "gelu_tanh",
    "quick_gelu": "quick_gelu",
    "silu": "silu",
    "swish": "silu",
}
# transformers' defaults for what a config.json leaves out (repos written by older versions keep
# only what differs from them): Dinov2Config, Dinov2WithRegistersConfig, SiglipVisionConfig,
# CLIPVisionConfig.
_DINOV2_DEFAULTS = dict(
    hidden_size=768, num_hidden_layers=12, num_attention_heads=12, num_channels=3, image_size=224,
    patch_size=14, hidden_act="gelu", layer_norm_eps=1e-6, mlp_ratio=4, qkv_bias=True,
    layerscale_value=1.0, use_swiglu_ffn=False,
)  # fmt: skip
_DINOV2_REGISTERS_DEFAULTS = dict(_DINOV2_DEFAULTS, patch_size=16, num_register_tokens=4)
_SIGLIP_DEFAULTS = dict(
    hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
    num_channels=3, image_size=224, patch_size=16, hidden_act="gelu_pytorch_tanh",
    layer_norm_eps=1e-6, vision_use_head=True,
)  # fmt: skip
_CLIP_DEFAULTS = dict(
    hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
    num_channels=3, image_size=224, patch_size=32, hidden_act="quick_gelu", layer_norm_eps=1e-5,
    projection_dim=512,
)  # fmt: skip
# The parts a tower has unless its reader says otherwise, all spelt out: training builds the
# nearest named architecture and overrides what differs, so no part of that one (a hybrid stem, a
# relative position bias) may stay because a reader left it unsaid.
_PLAIN_PARTS = {
    field.name: field.default
    for field in dataclasses.fields(Architecture)
    if field.name
    in (
        "pooling", "representation_size", "layer_scale", "cls_position_embedding",
        "distillation_token", "class_token", "register_tokens", "norm_before_pooling", "qkv_bias",
        "proj_bias", "pre_norm", "final_norm", "mlp", "block", "attention", "scale_attention_norm",
        "scale_mlp_norm", "position_bias", "shared_position_bias", "stem", "stem_depths",
    )
}  # fmt: skip
# How transformers resamples each type's position embeddings to another grid (its
# `interpolate_pos_encoding`): Dinov2, SigLIP and CLIP with PyTorch's bicubic without
# antialiasing, Dinov2WithRegisters with it (timm's, "bicubic").
_PLAIN_BICUBIC = "bicubic_no_antialias"


def timm_arguments(model_args, defaults, source):
    """timm's `model_args` as ViT arguments over the named architecture's `defaults`, as timm
    builds them: the entry point's own keyword arguments, `model_args` over them, then what
    derives from them (the MLP's width is `mlp_ratio` times the width)."""
    unknown = timm_args.unknown(model_args)
    if unknown:
        raise ValueError(
            f"{source} builds its model with timm arguments keras-vit does not have ({', '.join(unknown)})."
        )
    named = timm_args.timm_kwargs(defaults)
    arguments = timm_args.from_timm({**named, **model_args}, source)
    # timm's by the architecture's name, not a keyword argument
    interpolation = defaults.get("position_embedding_interpolation", "bicubic")
    arguments["position_embedding_interpolation"] = interpolation
    if "mlp_ratio" not in model_args and arguments["hidden_dim"] == defaults["hidden_dim"]:
        arguments["mlp_dim"] = defaults["mlp_dim"]  # the named width, not its ratio rounded back
    return arguments


def transformers_arguments(config, source, input_size=None):
    """A transformers `config.json` of the family's types as a ViT's architecture, each with its
    library's meaning of the output. `input_size`: the (height, width) the repo's image processor
    gives, which transformers runs the DINOv2, SigLIP and CLIP towers at (their position
    embeddings resampled as transformers resamples them); a ViT or DeiT keeps its config's size.
    An argument `num_classes` is the head the layout has whatever its labels (CLIP's projection)."""
    model_type = config["model_type"]
    heads, readable = config.get("architectures") or [], _MODELS.get(model_type)
    if readable and heads and not set(heads) & set(readable):
        raise ValueError(
            f"{source} holds a transformers {', '.join(heads)}; keras-vit reads "
            f"{' and '.join(readable)} of the {model_type!r} type: save that model's "
            f"backbone with save_pretrained and load the folder."
        )
    return _READERS[model_type](config, source, input_size)


def _vit(config, source, input_size):
    """transformers' ViT and DeiT: the [cls] token after the final norm, into the classifier."""
    if config.get("hidden_act", "gelu") != "gelu":
        raise ValueError(f"{source} uses the {config['hidden_act']!r} activation; keras-vit's ViT uses gelu.")
    heads = config.get("architectures") or []
    distilled = config["model_type"] == "deit" and any(name.endswith("WithTeacher") for name in heads)
    if config["model_type"] == "deit" and not distilled:
        raise ValueError(
            f"{source} is a DeiT classifier without its distillation head; keras-vit reads DeiT's "
            f"DeiTForImageClassificationWithTeacher checkpoints (both heads)."
        )
    return dict(
        image_size=config.get("image_size", 224),
        patch_size=config.get("patch_size", 16),
        hidden_dim=config["hidden_size"],
        depth=config["num_hidden_layers"],
        num_heads=config["num_attention_heads"],
        mlp_dim=config["intermediate_size"],
        channels=config.get("num_channels", 3),
        layer_norm_epsilon=config.get("layer_norm_eps", 1e-12),
        distillation_token=distilled,
    )


def _tower(config, defaults, source, input_size):
    """What every transformers vision tower shares: its size (the processor's when given),
    width, depth, heads and LayerNorm epsilon."""
    config = {**defaults, **config}
    activation = config["hidden_act"]
    if activation not in _TRANSFORMERS_ACTIVATIONS:
        raise ValueError(
            f"{source} uses the {activation!r} activation; keras-vit's ViT reads "
            f"{', '.join(sorted(_TRANSFORMERS_ACTIVATIONS))}."
        )
    return config, dict(
        _PLAIN_PARTS,
        image_size=list(input_size) if input_size else config["image_size"],
        patch_size=config["patch_size"],
        hidden_dim=config["hidden_size"],
        depth=config["num_hidden_layers"],
        num_heads=config["num_attention_heads"],
        channels=config["num_channels"],
        layer_norm_epsilon=config["layer_norm_eps"],
        activation=_TRANSFORMERS_ACTIVATIONS[activation],
    )


def _dinov2(config, source, input_size):
    """transformers' Dinov2Model: LayerScale, its SwiGLU (`use_swiglu_ffn`: timm's packed one, a
    width of two thirds rounded up to 8), `pooler_output` the [cls] token after the final norm."""
    registers = config["model_type"] == "dinov2_with_registers"
    defaults = _DINOV2_REGISTERS_DEFAULTS if registers else _DINOV2_DEFAULTS
    config, arguments = _tower(config, defaults, source, input_size)
    width = int(config["hidden_size"] * config["mlp_ratio"])
    swiglu = bool(config["use_swiglu_ffn"])
    if swiglu:
        width = 2 * ((int(width * 2 / 3) + 7) // 8 * 8)  # fc1 holds the gate and the value
    return dict(
        arguments,
        mlp_dim=width,
        mlp="swiglu_packed" if swiglu else "mlp",
        activation="silu" if swiglu else arguments["activation"],
        qkv_bias=config["qkv_bias"],
        layer_scale=config["layerscale_value"],
        # registers take no position embedding, and the [cls] token's is folded into it (timm's
        # `_convert_dinov2`): the position embeddings are the patches' alone
        register_tokens=config["num_register_tokens"] if registers else 0,
        cls_position_embedding=not registers,
        position_embedding_interpolation="bicubic" if registers else _PLAIN_BICUBIC,
        pooling="token",
    )


def _siglip(config, source, input_size):
    """transformers' SiglipVisionModel (and SiglipModel's vision tower): no [cls], the final norm
    on every token, `pooler_output` the attention-pooling head's (timm's `AttentionPoolLatent`);
    without a head (`vision_use_head=False`) every token is kept (its `last_hidden_state`)."""
    config, arguments = _tower(config.get("vision_config", config), _SIGLIP_DEFAULTS, source, input_size)
    return dict(
        arguments,
        mlp_dim=config["intermediate_size"],
        class_token=False,
        pooling="map" if config["vision_use_head"] else "none",
        position_embedding_interpolation=_PLAIN_BICUBIC,
    )


def _clip(config, source, input_size):
    """transformers' CLIPVisionModel (`pooler_output`: the [cls] token after `post_layernorm`) and
    CLIPModel's vision tower with its `visual_projection` as the head (`image_embeds` before
    CLIPModel divides them by their norm), as timm's CLIP image towers: a LayerNorm before the
    blocks (`pre_layrnorm`), no patch bias."""
    projected = config["model_type"] == "clip" or "CLIPVisionModelWithProjection" in (
        config.get("architectures") or []
    )
    config_top = config
    config, arguments = _tower(config.get("vision_config", config), _CLIP_DEFAULTS, source, input_size)
    arguments = dict(
        arguments,
        mlp_dim=config["intermediate_size"],
        pre_norm=True,
        pooling="token",
        position_embedding_interpolation=_PLAIN_BICUBIC,
    )
    if projected:
        arguments["num_classes"] = config_top.get("projection_dim", config["projection_dim"])
    return arguments


# The transformers classes of each new type whose layout and output keras-vit reads (a
# classifier or a backbone of the same type has other heads).
_MODELS = {
    "dinov2": ("Dinov2Model",),
    "dinov2_with_registers": ("Dinov2WithRegistersModel",),
    "siglip_vision_model": ("SiglipVisionModel",),
    "siglip": ("SiglipModel",),
    "clip_vision_model": ("CLIPVisionModel", "CLIPVisionModelWithProjection"),
    "clip": ("CLIPModel",),
}
_READERS = {
    "vit": _vit,
    "deit": _vit,
    "dinov2": _dinov2,
    "dinov2_with_registers": _dinov2,
    "siglip_vision_model": _siglip,
    "siglip": _siglip,
    "clip_vision_model": _clip,
    "clip": _clip,
}


def timm_model_args(config, named, architecture):
    """timm's `model_args` for where `config` (a ViT's) differs from the `named` architecture's
    (all its arguments). LayerNorm epsilons closer than `_SAME_EPSILON` count as the same (a
    transformers repo's 1e-12 as timm's 1e-6): a difference far below what logits are compared to."""
    differ = {key for key, value in named.items() if key in config and config[key] != value}
    if _same_epsilon(config, named):
        differ.discard("layer_norm_epsilon")
    # How position embeddings are resampled to another size: at the published size nothing is
    # resampled and timm's outputs are the model's; at another, timm resamples with the named
    # architecture's kernel (transformers' DINOv2, SigLIP and CLIP use their own, as they do
    # between themselves and timm).
    differ.discard("position_embedding_interpolation")
    cannot = sorted(differ & set(_NOT_IN_TIMM))
    if not _same_position_kind(config, named):
        cannot.append("position embeddings (absolute or relative)")
    if cannot:
        raise ValueError(
            f"timm cannot build this model: its {', '.join(cannot)} differ from {architecture}'s, and "
            f"timm's VisionTransformer takes no argument for them."
        )
    model_args = {_AS_TIMM[key]: config[key] for key in sorted(differ) if key in _AS_TIMM}
    if {"mlp_dim", "hidden_dim"} & differ:
        ratio = config["mlp_dim"] / config["hidden_dim"]
        if int(config["hidden_dim"] * ratio) != config["mlp_dim"]:
            raise ValueError(
                f"timm cannot build an MLP of {config['mlp_dim']} on a width of {config['hidden_dim']}."
            )
        model_args["mlp_ratio"] = ratio
    mine, theirs = timm_args.timm_kwargs(config), timm_args.timm_kwargs(named)
    keys = ["init_values", "no_embed_class", "global_pool", "fc_norm", "act_layer"]
    if named.get("position_bias"):  # VisionTransformerRelPos' own arguments
        keys += ["rel_pos_type", "rel_pos_dim", "shared_rel_pos"]
    for key in keys:
        if mine[key] != theirs[key]:
            model_args[key] = mine[key]
    return model_args


def timm_architecture(config, architectures):
    """The architecture of `architectures` (names timm has) a ViT's `config` is published as:
    its own name when it is one, else the nearest one with the same parts timm's model_args cannot
    change (the distillation token, the MLP's kind, the LayerNorm's epsilon)."""
    if config.get("name") in architectures:
        return config["name"]

    def same_kind(name):
        named = FAMILY.architecture(FAMILY.config(name)).config()
        return (
            all(named[key] == config.get(key, named[key]) for key in _SAME_KIND)
            and _same_epsilon(config, named)
            and _same_position_kind(config, named)
        )

    return nearest_architecture(
        config, [name for name in architectures if name in MODEL_CONFIGS and same_kind(name)]
    )


def _same_position_kind(config, named):
    """Both with absolute position embeddings, or both with a relative position bias."""
    return (config.get("position_bias") is None) == (named.get("position_bias") is None)


def _same_epsilon(config, named):
    return abs(config.get("layer_norm_epsilon", 1e-6) - named["layer_norm_epsilon"]) <= _SAME_EPSILON


def nearest_architecture(arguments, names=None):
    """The named architecture (of `names`, by default all) that shares the most of `arguments` (a
    transformers repo's, which names none), preferring, among equals, the one at the nearest image
    size: training builds a named architecture and overrides where the repo differs."""
    size = arguments.get("image_size")
    size = size if isinstance(size, int) else (size or [None])[0]

    def shared(name):
        config = FAMILY.architecture(FAMILY.config(name)).config()  # every argument, in normal form
        same = sum(config.get(key) == value for key, value in arguments.items() if key != "image_size")
        return same, -abs(config["image_size"][0] - size) if size else 0, name

    return max(names or MODEL_CONFIGS, key=shared)


def timm_global_pool(config):
    """timm's `global_pool` for a ViT's config."""
    return {value: key for key, value in timm_args.POOLINGS.items()}[config["pooling"]]


def num_features(config):
    return config["hidden_dim"]
