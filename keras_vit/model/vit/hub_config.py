"""The ViT family on the hub: timm's `model_args` and transformers' ViT and DeiT configs as a
ViT's arguments, and a ViT's arguments as timm's `model_args` (`keras_vit.model.hub_config`
reads and writes the rest of a repo's config)."""

from keras_vit.model.vit import FAMILY
from keras_vit.model.vit.architecture import ARGUMENTS, Architecture
from keras_vit.model.vit.configs import MODEL_CONFIGS

# timm's VisionTransformer keyword arguments that are a ViT argument as they are.
_SAME = {
    "img_size": "image_size",
    "patch_size": "patch_size",
    "in_chans": "channels",
    "embed_dim": "hidden_dim",
    "depth": "depth",
    "num_heads": "num_heads",
    "class_token": "class_token",
    "reg_tokens": "register_tokens",
    "drop_rate": "dropout",
    "attn_drop_rate": "attention_dropout",
    "drop_path_rate": "drop_path_rate",
}
# Those read through a rule (`_from_timm`): the MLP's width from its ratio, LayerScale, the
# position embeddings of the prefix tokens, the pooling and the place of the final LayerNorm.
# `num_classes` is the config's own.
_RULED = ("mlp_ratio", "init_values", "no_embed_class", "global_pool", "fc_norm", "num_classes")
_POOLING = {"token": "token", "avg": "gap"}
_EMBED_CLASS = "no_embed_class"  # position embeddings on the patches only
_FC_NORM = "fc_norm"  # the final LayerNorm after a "gap" pooling (True) or on every token before it
# A ViT's arguments timm's `model_args` write as they are (the rest: `timm_model_args`).
_AS_IS = ("patch_size", "hidden_dim", "depth", "num_heads", "class_token", "register_tokens", "layer_scale")
_AS_TIMM = {ours: timm for timm, ours in _SAME.items() if ours in _AS_IS} | {"layer_scale": "init_values"}
# What a ViT has that timm's VisionTransformer cannot be given in `model_args`.
_NOT_IN_TIMM = ("representation_size", "distillation_token")
# transformers' model types of the family.
TRANSFORMERS_TYPES = ("vit", "deit")


def timm_kwargs(arguments):
    """A ViT's architecture as the keyword arguments of timm's `VisionTransformer` that build it:
    what a named config's timm entry point passes."""
    arch = Architecture(**{key: value for key, value in arguments.items() if key in ARGUMENTS})
    kwargs = {timm: getattr(arch, ours) for timm, ours in _SAME.items()}
    kwargs["img_size"] = list(arch.image_size)
    kwargs.update(
        mlp_ratio=arch.mlp_dim / arch.hidden_dim,
        init_values=arch.layer_scale,
        no_embed_class=not arch.cls_position_embedding,
        global_pool=timm_global_pool(arch.config()),
    )
    if arch.pooling == "gap":
        kwargs[_FC_NORM] = not arch.norm_before_pooling
    return kwargs


def timm_arguments(model_args, defaults, source):
    """timm's `model_args` as ViT arguments over the named architecture's `defaults`, as timm
    builds them: the entry point's own keyword arguments, `model_args` over them, then what
    derives from them (the MLP's width is `mlp_ratio` times the width)."""
    unknown = sorted(set(model_args) - set(_SAME) - set(_RULED))
    if unknown:
        raise ValueError(
            f"{source} builds its model with timm arguments keras-vit does not have ({', '.join(unknown)})."
        )
    named = timm_kwargs(defaults)
    kwargs = {**named, **model_args}
    arguments = {ours: kwargs[timm] for timm, ours in _SAME.items() if timm in model_args}
    width, ratio = kwargs["embed_dim"], kwargs["mlp_ratio"]
    if (width, ratio) != (named["embed_dim"], named["mlp_ratio"]):
        arguments["mlp_dim"] = int(width * ratio)  # as timm's Block: int(dim * mlp_ratio)
    if "init_values" in model_args:
        arguments["layer_scale"] = model_args["init_values"] or None  # timm: none for 0 or None
    if _EMBED_CLASS in model_args:
        arguments["cls_position_embedding"] = not model_args[_EMBED_CLASS]
    pool = kwargs["global_pool"]
    if pool not in _POOLING:
        raise ValueError(f"{source} pools with {pool!r}; keras-vit pools with 'token' or 'avg'.")
    arguments["pooling"] = _POOLING[pool]
    if kwargs.get(_FC_NORM) is not None and arguments["pooling"] == "gap":
        arguments["norm_before_pooling"] = not kwargs[_FC_NORM]
    return arguments


def transformers_arguments(config, source):
    """A transformers ViT or DeiT `config.json` as a ViT's architecture."""
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


def timm_model_args(config, named, architecture):
    """timm's `model_args` for where `config` (a ViT's) differs from the `named` architecture's
    (all its arguments). timm's LayerNorm epsilon is 1e-6 whatever a model's (a transformers
    repo's is 1e-12): a difference far below what logits are compared to."""
    differ = {key for key, value in named.items() if key in config and config[key] != value}
    cannot = sorted(differ & set(_NOT_IN_TIMM))
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
    if "cls_position_embedding" in differ:
        model_args[_EMBED_CLASS] = not config["cls_position_embedding"]
    if config["pooling"] == "gap" and config["norm_before_pooling"] != named.get(
        "norm_before_pooling", False
    ):
        model_args[_FC_NORM] = not config["norm_before_pooling"]
    return model_args


def timm_architecture(config, architectures):
    """The architecture of `architectures` (names timm has) a ViT's `config` is published as:
    its own name when it is one, else the nearest one with the same distillation token (which
    timm's model_args cannot add or remove)."""
    if config.get("name") in architectures:
        return config["name"]
    same_kind = [
        name
        for name in architectures
        if name in MODEL_CONFIGS
        and FAMILY.config(name).get("distillation_token", False) == config.get("distillation_token", False)
    ]
    return nearest_architecture(config, same_kind)


def nearest_architecture(arguments, names=None):
    """The named architecture (of `names`, by default all) that shares the most of `arguments` (a
    transformers repo's, which names none), preferring, among equals, the one at the nearest image
    size: training builds a named architecture and overrides where the repo differs."""
    size = arguments.get("image_size")
    size = size if isinstance(size, int) else (size or [None])[0]

    def shared(name):
        config = FAMILY.config(name)
        same = sum(config.get(key) == value for key, value in arguments.items() if key != "image_size")
        return same, -abs(config["image_size"] - size) if size else 0, name

    return max(names or MODEL_CONFIGS, key=shared)


def timm_global_pool(config):
    """timm's `global_pool` for a ViT's config."""
    return {value: key for key, value in _POOLING.items()}[config["pooling"]]


def num_features(config):
    return config["hidden_dim"]
