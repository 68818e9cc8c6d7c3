"""The families keras-vit builds, and the name -> family lookup: `create_model` and
`list_models` live here, above the families (`keras_vit.model.vit`, `keras_vit.model.swin`).

    model = create_model("vit_small_patch16_224", num_classes=10)
    model = create_model("swin_tiny_patch4_window7_224.ms_in1k", pretrained=True)

The registry stands above the families and the modules that read hub repos (`pretrained`,
`hub_config`), which are handed the families; the checkpoint reader (`weights`) stands below the
families, and asks a model for its own. A pretrained name is three steps: resolve it (the
family, its arguments, where the weights are), build, load.

Keras-free until a model is built: `keras-vit models` reads the configs without TensorFlow.
"""

from keras_vit.model import family as family_module
from keras_vit.model import pretrained as hub_models
from keras_vit.model.eva import FAMILY as EVA
from keras_vit.model.swin import FAMILY as SWIN
from keras_vit.model.vit import FAMILY as VIT

FAMILIES = {family.name: family for family in (VIT, SWIN, EVA)}
_REQUIRED = object()
# Keras' own arguments, which every family's model takes besides its architecture's.
KERAS_ARGUMENTS = ("dtype", "name", "trainable")


def list_models():
    """Returns the names of all configurations, of every family, sorted."""
    return sorted(name for family in FAMILIES.values() for name in family.configs)


def all_configs():
    """`{config name: family}` of every family."""
    return {name: family for family in FAMILIES.values() for name in family.configs}


def family_named(name):
    """The family of a config name or of a timm `arch.tag`.

    Raises:
        ValueError: no family has the name; the message lists the closest names.
    """
    configs = all_configs()
    architecture = architecture_of(name)
    if architecture not in configs:
        raise ValueError(family_module.unknown_config(name, configs))
    return configs[architecture]


def family_of(model, default=_REQUIRED):
    """The family of a keras-vit model (its `family` attribute); `default` for any other Keras
    model (a user's own classifier runs, evaluates and exports too), when given.

    Raises:
        TypeError: not a model keras-vit builds, and no default.
    """
    family = family_module.of_model(model)
    if family is None:
        if default is not _REQUIRED:
            return default
        raise TypeError(f"{type(model).__name__} is not a keras-vit model (ViT, Swin, ...).")
    return family


def family_of_arguments(arguments):
    """The family whose model takes every one of `arguments` (a model's `get_config()` or a dict
    of its arguments), the ViT first: a dict of arguments every family has is a ViT's.

    Raises:
        ValueError: no family takes them all.
    """
    keys = set(arguments) - set(KERAS_ARGUMENTS)
    for family in FAMILIES.values():
        if keys <= set(family.arguments()):
            return family
    raise ValueError(f"No family of keras-vit takes all of {sorted(keys)}.")


def get_model_config(name):
    """The architecture of a named configuration, as its model's keyword arguments.

    Raises:
        ValueError: the name is unknown; the message lists the closest names.
    """
    return family_named(name).config(architecture_of(name))


def architecture_of(name):
    """The architecture a timm `arch.tag` names (`vit_small_patch16_224.augreg_in1k` ->
    `vit_small_patch16_224`); other names as they are."""
    architecture = str(name).split(".")[0]
    return architecture if architecture in all_configs() else str(name)


def create_model(name, pretrained=False, **overrides):
    """Builds a named configuration, e.g. `create_model("vit_base_patch16_224")`; with
    `pretrained=True`, downloads and loads its weights, normalisation and class names.

    Args:
        name: a name from `keras_vit.list_models()`; with `pretrained=True`, also timm's
            `arch.tag` (`vit_small_patch16_224.augreg_in21k_ft_in1k`), `hf-hub:org/repo[@revision]`
            or `local-dir:/path` (`keras_vit.model.pretrained`).
        pretrained: load pretrained weights from a model hub, through huggingface_hub's cache.
        **overrides: any argument of the family's model (`ViT`, `Swin`), such as `num_classes`,
            `image_size`, `channels`, `dropout`, `drop_path_rate`, `include_top` or `dtype`.
            With `pretrained=True`, another `num_classes` gives a new head and another
            `image_size` resampled position embeddings (ViT) or bias tables (Swin's window).

    Returns:
        A model of the name's family: pretrained, or randomly initialised (load weights with
        `keras_vit.load_weights`).
    """
    if pretrained:
        found = hub_models.what_to_build(name, overrides, FAMILIES.values())
        _check_arguments(found.family, name, overrides)
        return load_into(found.family.build(**found.arguments), found.weights_path())
    if str(name).startswith((hub_models.HUB_PREFIX, hub_models.LOCAL_PREFIX)):
        raise ValueError(f"{name} names pretrained weights: create_model({name!r}, pretrained=True).")
    family = family_named(name)
    _check_arguments(family, name, overrides)
    config = family.config(architecture_of(name))
    config.update(overrides)
    config.setdefault("name", architecture_of(name))
    return family.build(**config)


def register_with_keras():
    """Imports every family's model class, which registers it and its layers with Keras (as
    `package="keras_vit"`), so that `keras.models.load_model` reads any keras-vit file."""
    for family in FAMILIES.values():
        family.model_class()


def resize_model(model, image_size):
    """Returns a copy of `model` for another image size, with the same weights: a ViT's position
    embeddings resampled to the new patch grid (bicubic, [cls] kept), a Swin's windows kept."""
    return family_of(model).resize(model, image_size)


def read_hub_model(source):
    """A hub repo's `HubModel` (`keras_vit.model.pretrained.Source`), built by one of the families."""
    return hub_models.read_hub_model(source, FAMILIES.values())


def load_into(model, path):
    from keras_vit.model.weights import load_weights

    return load_weights(model, path)


def _check_arguments(family, name, overrides):
    allowed = set(family.arguments()) | set(KERAS_ARGUMENTS)
    unknown = sorted(set(overrides) - allowed)
    if unknown:
        raise TypeError(
            f"create_model({name!r}) got unknown argument(s) {unknown}; "
            f"{family.model_class_path.rpartition(':')[2]} takes "
            f"{', '.join(sorted(family.arguments() + ('dtype',)))}."
        )
