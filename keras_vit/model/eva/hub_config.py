"""The Eva family on the hub: timm's `model_args` as an Eva's arguments, and an Eva's arguments
as timm's `model_args` (`keras_vit.model.hub_config` reads and writes the rest of a repo's config).

transformers' `DINOv3ViTModel` layout is not read yet: timm's repos of the same weights are."""

from keras_vit.model.eva import FAMILY, timm_args
from keras_vit.model.eva.configs import MODEL_CONFIGS

TRANSFORMERS_TYPES = ()
# What `model_args` cannot change in timm (the norm is a class there).
_NOT_IN_TIMM = ("norm", "layer_norm_epsilon")


def timm_arguments(model_args, defaults, source):
    """timm's `model_args` as an Eva's arguments over the named architecture's `defaults`."""
    try:
        return timm_args.from_timm(model_args, source)
    except timm_args.NotBuildable as reason:
        raise ValueError(f"{reason}.") from None


def transformers_arguments(config, source):
    raise ValueError(
        f"{source}: keras-vit reads timm's layout of the Eva family's weights, not transformers'."
    )


def timm_model_args(config, named, architecture):
    """timm's `model_args` for where `config` (an Eva's) differs from the `named` architecture's."""
    mine = FAMILY.architecture(config).config()
    differ = {key for key, value in named.items() if key in mine and mine[key] != value}
    cannot = sorted(differ & set(_NOT_IN_TIMM))
    if cannot:
        raise ValueError(
            f"timm cannot build this model: its {', '.join(cannot)} differ from {architecture}'s."
        )
    return timm_args.to_timm({key: mine[key] for key in sorted(differ)})


def timm_global_pool(config):
    return config["global_pool"]


def num_features(config):
    return config["embed_dim"]


def timm_architecture(config, architectures):
    """Its own name when timm has it, else the nearest of timm's with the same norm."""
    if config.get("name") in architectures:
        return config["name"]
    mine = FAMILY.architecture(config).config()
    names = [
        name
        for name in architectures
        if name in MODEL_CONFIGS
        and all(FAMILY.architecture(FAMILY.config(name)).config()[k] == mine[k] for k in _NOT_IN_TIMM)
    ]
    return nearest_architecture(config, names)


def nearest_architecture(arguments, names=None):
    """The named Eva (of `names`, by default all) that shares the most of `arguments`."""
    mine = FAMILY.architecture(arguments).config()

    def shared(name):
        config = FAMILY.architecture(FAMILY.config(name)).config()
        return sum(config[key] == value for key, value in mine.items()), name

    return max(names or MODEL_CONFIGS, key=shared)
