"""A hub repo's `config.json` as a model's arguments, and a model's arguments as timm's
`config.json`, for every family.

Two layouts are read:
- timm's (`timm.models.save_for_hf`): `architecture`, `num_classes`, `model_args`,
  `pretrained_cfg` (input size, mean, std, crop) and `label_names` when the repo has them;
- transformers' (`save_pretrained`): `model_type` and its own argument names, `id2label`, with
  mean, std and the evaluation transform from `preprocessor_config.json`.

The family of the architecture or model type reads its own arguments (its `hub_config.py`);
this module reads the classes, normalisation and evaluation transform, which every family
shares. timm's is written (`timm_config`), so timm and keras-vit both load what keras-vit publishes.
"""

import dataclasses
import difflib
import re

from keras_vit.model.family import of_model
from keras_vit.model.transform import DEFAULT_MEAN, DEFAULT_STD
from keras_vit.model.transform import FIELDS as TRANSFORM_FIELDS

# transformers' default names for classes it was given none for.
DEFAULT_LABEL = re.compile(r"LABEL_\d+")
# timm's evaluation transform where a `pretrained_cfg` says nothing (`timm.data.resolve_data_config`).
_TIMM_TRANSFORM_DEFAULTS = {"crop_pct": 0.875, "crop_mode": "center", "interpolation": "bicubic"}
# Pillow's resampling filters by number, as transformers' image processors record them.
_PIL_RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}


@dataclasses.dataclass(frozen=True)
class HubModel:
    """What a repo's config says: `family` (the `keras_vit.model.family.Family` that builds
    it), `arguments` (its architecture and evaluation transform, without its classes and
    normalisation), `num_classes` (0: no classifier), `class_names` (or None), `image_mean` and
    `image_std`, `license` (its pretrained_cfg's, or None) and `name` (timm's architecture, or
    the transformers model type)."""

    name: str
    arguments: dict
    num_classes: int
    class_names: list | None
    image_mean: list
    image_std: list
    family: object
    license: str | None = None


def read_config(config, source, families, preprocessor=None, architecture=None):
    """A `HubModel` from a repo's parsed `config.json` (and `preprocessor_config.json`);
    `source` names the repo in messages; `families`: those that may build it (the registry's).
    `architecture`: the one a timm tag names, built in place of the one the repo's config names
    (several tags share a repo), with the repo's `model_args`.

    Raises:
        ValueError: a config of another architecture, or of neither layout.
    """
    if architecture is not None and "architecture" in config:
        config = dict(config, architecture=architecture)
    if "architecture" in config:
        return _from_timm(config, source, families)
    if "model_type" in config:
        return _from_transformers(config, source, families, preprocessor or {})
    raise ValueError(
        f"{source}'s config.json is neither timm's (no 'architecture') nor transformers' (no "
        f"'model_type'): it is not a checkpoint keras-vit reads."
    )


def _from_timm(config, source, families):
    architecture = config["architecture"]
    configs = {name: family for family in families for name in family.configs}
    if architecture not in configs:
        close = difflib.get_close_matches(architecture, configs, n=3, cutoff=0.6)
        hint = f" (close: {', '.join(close)})" if close else ""
        raise ValueError(
            f"{source} holds a {architecture}, an architecture keras-vit does not build{hint}: "
            f"`keras-vit models` lists those it does."
        )
    family = configs[architecture]
    pretrained = config.get("pretrained_cfg", config)
    arguments = family.config(architecture)
    arguments.update(family.hub().timm_arguments(config.get("model_args", {}), arguments, source))
    if "input_size" in pretrained:
        arguments["image_size"] = list(pretrained["input_size"][1:])
    arguments.update({key: pretrained.get(key) or value for key, value in _TIMM_TRANSFORM_DEFAULTS.items()})
    num_classes = int(config.get("num_classes", pretrained.get("num_classes", 1000)))
    labels = config.get("label_descriptions") or config.get("label_names") or pretrained.get("label_names")
    if isinstance(labels, dict):  # {index: name}, as timm allows
        labels = [labels[key] for key in sorted(labels, key=int)]
    return HubModel(
        name=architecture,
        arguments=arguments,
        num_classes=num_classes,
        class_names=list(labels) if labels and len(labels) == num_classes else None,
        image_mean=list(pretrained.get("mean", DEFAULT_MEAN)),
        image_std=list(pretrained.get("std", DEFAULT_STD)),
        family=family,
        license=pretrained.get("license"),
    )


def _from_transformers(config, source, families, preprocessor):
    model_type = config["model_type"]
    family = next((f for f in families if model_type in f.hub().TRANSFORMERS_TYPES), None)
    if family is None:
        types = sorted(t for f in families for t in f.hub().TRANSFORMERS_TYPES)
        raise ValueError(
            f"{source} holds a transformers {model_type!r} model; keras-vit reads {', '.join(types)} ones."
        )
    heads = config.get("architectures") or []
    labels = config.get("id2label") or {}
    names = [labels[key] for key in sorted(labels, key=int)]
    classifies = any(name.endswith(("ForImageClassification", "WithTeacher")) for name in heads)
    arguments = family.hub().transformers_arguments(config, source, transformers_input_size(preprocessor))
    # A layout's own head (CLIP's projection) whatever its labels say; else the classifier's.
    num_classes = arguments.pop("num_classes", len(names) if classifies else 0)
    return HubModel(
        name=model_type,
        arguments=dict(arguments, **transformers_transform(preprocessor)),
        num_classes=num_classes,
        class_names=None if not names or all(DEFAULT_LABEL.fullmatch(n) for n in names) else names,
        image_mean=list(preprocessor.get("image_mean", DEFAULT_MEAN)),
        image_std=list(preprocessor.get("image_std", DEFAULT_STD)),
        family=family,
    )


def transformers_transform(preprocessor):
    """The evaluation transform of a transformers image processor: a resize to `size` (each side,
    or the shortest edge), then a centre crop to `crop_size` when `do_center_crop`."""
    size = preprocessor.get("size") or {}
    mode, scale = (
        ("center", size["shortest_edge"]) if "shortest_edge" in size else ("squash", size.get("height"))
    )
    crop = preprocessor.get("crop_size") if preprocessor.get("do_center_crop") else None
    resample = preprocessor.get("resample", 2)
    return dict(
        crop_pct=crop["height"] / scale if crop and scale else 1.0,
        crop_mode=mode,
        interpolation=_PIL_RESAMPLE.get(resample, f"Pillow filter {resample}"),
    )


def transformers_input_size(preprocessor):
    """The (height, width) a transformers image processor gives: its centre crop's when it crops,
    else its resize's; None when it says neither (no processor, or a shortest edge alone)."""
    size = preprocessor.get("crop_size") if preprocessor.get("do_center_crop") else preprocessor.get("size")
    if isinstance(size, int):
        return (size, size)
    if not size or "height" not in size:
        return None
    return (size["height"], size["width"])


def nearest_architecture(found):
    """The named architecture a `HubModel` is trained as: its own timm name, else (a transformers
    repo, which names none) the nearest of its family's."""
    if found.name in found.family.configs:
        return found.name
    return found.family.hub().nearest_architecture(found.arguments)


def timm_architecture(model, architectures):
    """The timm architecture (of `architectures`) a keras-vit model is published as. timm's own
    test models (`test_vit`, ...) are never the nearest: they are timm's fixtures, not a name a
    user would recognise (a model published under its own test name still keeps it)."""
    config = model.get_config()
    names = [n for n in architectures if not n.startswith("test_") or n == config.get("name")]
    return of_model(model).hub().timm_architecture(config, names)


def timm_config(model, architecture):
    """timm's `config.json` for a keras-vit model as `architecture` (a name timm has) with
    `model_args` for what differs from it, as timm's `save_for_hf` records them: what
    `timm.create_model("local-dir:...", pretrained=True)` builds.

    Raises:
        ValueError: the model has what timm cannot be given (named).
    """
    family = of_model(model)
    config = model.get_config()
    height, width = config["image_size"]
    named = family.architecture(family.config(architecture)).config()
    model_args = {
        "img_size": [height, width],
        "in_chans": config["channels"],
        "num_classes": config["num_classes"] if config["include_top"] else 0,
        **family.hub().timm_model_args(config, named, architecture),
    }
    global_pool = family.hub().timm_global_pool(config)
    if global_pool is not None:
        model_args["global_pool"] = global_pool
    pretrained = {
        "input_size": [config["channels"], height, width],
        "fixed_input_size": True,
        # The evaluation transform the model is read with (keras_vit.model.transform), timm's names.
        **{key: config[key] for key in TRANSFORM_FIELDS},
        # timm feeds (x / 255 - mean) / std: a model that normalises nothing takes x as it is.
        "mean": config["image_mean"] or [0.0] * config["channels"],
        "std": config["image_std"] or [1 / 255] * config["channels"],
        "num_classes": model_args["num_classes"],
        **({"license": config["license"]} if config.get("license") else {}),
        "first_conv": "patch_embed.proj",
        "classifier": family.checkpoint().HEAD_PREFIXES[0],
    }
    result = {
        "architecture": architecture,
        "num_classes": model_args["num_classes"],
        "num_features": family.hub().num_features(config),
        **({"global_pool": global_pool} if global_pool is not None else {}),
        "model_args": model_args,
        "pretrained_cfg": pretrained,
    }
    if config["class_names"] and config["include_top"]:
        result["label_names"] = list(config["class_names"])
    return result
