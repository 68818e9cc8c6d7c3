"""The Swin family on the hub: timm's `model_args` and transformers' `SwinConfig` as a Swin's
arguments, and a Swin's arguments as timm's `model_args` (`keras_vit.model.hub_config` reads
and writes the rest of a repo's config)."""

from keras_vit.model.swin import FAMILY
from keras_vit.model.swin.architecture import Architecture
from keras_vit.model.swin.configs import MODEL_CONFIGS

# timm's `model_args` for a Swin, as keras-vit's arguments.
TIMM_ARGUMENTS = {
    "img_size": "image_size",
    "patch_size": "patch_size",
    "in_chans": "channels",
    "embed_dim": "embed_dim",
    "depths": "depths",
    "num_heads": "num_heads",
    "window_size": "window_size",
    "mlp_ratio": "mlp_ratio",
    "drop_rate": "dropout",
    "attn_drop_rate": "attention_dropout",
    "drop_path_rate": "drop_path_rate",
    "num_classes": None,  # the config's own num_classes
    "global_pool": None,  # "avg", the one pooling a Swin has
}
# Those `timm_model_args` writes where a model differs from its named architecture.
_AS_TIMM = ("embed_dim", "depths", "num_heads", "window_size", "mlp_ratio", "patch_size")
TRANSFORMERS_TYPES = ("swin",)


def timm_arguments(model_args, defaults, source):
    """timm's `model_args` as a Swin's arguments over the architecture's `defaults`."""
    unknown = sorted(set(model_args) - set(TIMM_ARGUMENTS))
    if unknown:
        raise ValueError(
            f"{source} builds its Swin with timm arguments keras-vit does not have ({', '.join(unknown)})."
        )
    if model_args.get("global_pool", "avg") != "avg":
        raise ValueError(f"{source} pools with {model_args['global_pool']!r}; a Swin pools with 'avg'.")
    return {TIMM_ARGUMENTS[k]: v for k, v in model_args.items() if TIMM_ARGUMENTS.get(k)}


def transformers_arguments(config, source, input_size=None):
    """A transformers `SwinConfig` as a Swin's architecture (at its config's size: `input_size`,
    the image processor's, is not read)."""
    if config.get("hidden_act", "gelu") != "gelu":
        raise ValueError(
            f"{source} uses the {config['hidden_act']!r} activation; keras-vit's Swin uses gelu."
        )
    if not config.get("qkv_bias", True):
        raise ValueError(f"{source} has no query/key/value bias; keras-vit's Swin, as timm's, has one.")
    return dict(
        image_size=config.get("image_size", 224),
        patch_size=config.get("patch_size", 4),
        channels=config.get("num_channels", 3),
        embed_dim=config.get("embed_dim", 96),
        depths=list(config.get("depths", (2, 2, 6, 2))),
        num_heads=list(config.get("num_heads", (3, 6, 12, 24))),
        window_size=config.get("window_size", 7),
        mlp_ratio=config.get("mlp_ratio", 4.0),
        layer_norm_epsilon=config.get("layer_norm_eps", 1e-5),
    )


def timm_model_args(config, named, architecture):
    """timm's `model_args` for where `config` (a Swin's) differs from the `named` architecture's."""
    mine = Architecture(**{k: v for k, v in config.items() if k in named}).config()
    return {key: mine[key] for key in _AS_TIMM if mine[key] != named[key]}


def timm_global_pool(config):
    return "avg"


def num_features(config):
    return Architecture(
        **{k: v for k, v in config.items() if k in Architecture.__dataclass_fields__}
    ).num_features


def timm_architecture(config, architectures):
    """The architecture of `architectures` (names timm has) a Swin's `config` is published as:
    its own name when it is one, else the nearest."""
    if config.get("name") in architectures:
        return config["name"]
    return nearest_architecture(config, [name for name in architectures if name in MODEL_CONFIGS])


def nearest_architecture(arguments, names=None):
    """The named Swin (of `names`, by default all) that shares the most of `arguments`,
    preferring, among equals, the one at the nearest image size."""
    mine = FAMILY.architecture(arguments).config()

    def shared(name):
        config = FAMILY.architecture(FAMILY.config(name)).config()
        same = sum(config[key] == mine[key] for key in _AS_TIMM)
        return same, -abs(config["image_size"][0] - mine["image_size"][0]), name

    return max(names or MODEL_CONFIGS, key=shared)
