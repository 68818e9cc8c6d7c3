"""The ViT family on the hub: timm's `model_args` and transformers' ViT and DeiT configs as a
ViT's arguments, and a ViT's arguments as timm's `model_args` (`keras_vit.model.hub_config`
reads and writes the rest of a repo's config)."""

from keras_vit.model.vit import FAMILY, timm_args
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
    "position_embedding_interpolation",
)
# The parts a timm class has or has not (absolute position embeddings or a relative position
# bias: `VisionTransformer` or `VisionTransformerRelPos`): a model is published as one that has
# them.
_SAME_KIND = ("distillation_token", "mlp", "norm", "embed_norm", "block", "attention", "stem", "stem_depths")
# LayerNorm epsilons this close give the same logits to well under 1e-4.
_SAME_EPSILON = 1e-6
# transformers' model types of the family.
TRANSFORMERS_TYPES = ("vit", "deit")


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
    (all its arguments). LayerNorm epsilons closer than `_SAME_EPSILON` count as the same (a
    transformers repo's 1e-12 as timm's 1e-6): a difference far below what logits are compared to."""
    differ = {key for key, value in named.items() if key in config and config[key] != value}
    if _same_epsilon(config, named):
        differ.discard("layer_norm_epsilon")
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
