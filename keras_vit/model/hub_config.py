"""A hub repo's `config.json` as a ViT's arguments, and a ViT's arguments as timm's `config.json`.

Two layouts are read:
- timm's (`timm.models.save_for_hf`): `architecture`, `num_classes`, `model_args`,
  `pretrained_cfg` (input size, mean, std, crop) and `label_names` when the repo has them;
- transformers' ViT and DeiT (`save_pretrained`): `model_type`, `image_size`, `patch_size`,
  `hidden_size` and the rest, `id2label`, with mean and std from `preprocessor_config.json`.

timm's is written (`timm_config`), so timm and keras-vit both load what keras-vit publishes.
"""

import dataclasses
import difflib
import re

from keras_vit.model.architecture import Architecture
from keras_vit.model.configs import MODEL_CONFIGS, get_model_config
from keras_vit.model.transform import FIELDS as TRANSFORM_FIELDS

# timm's `model_args` that keras-vit builds, as ViT arguments (`global_pool` is read apart).
_TIMM_ARGUMENTS = {
    "img_size": "image_size",
    "patch_size": "patch_size",
    "in_chans": "channels",
    "embed_dim": "hidden_dim",
    "depth": "depth",
    "num_heads": "num_heads",
    "mlp_ratio": None,  # read with the width, as mlp_dim
    "num_classes": None,  # the config's own num_classes
    "class_token": "class_token",
    "reg_tokens": "register_tokens",
    "init_values": "layer_scale",
    "drop_rate": "dropout",
    "attn_drop_rate": "attention_dropout",
    "drop_path_rate": "drop_path_rate",
}
_POOLING = {"token": "token", "avg": "gap"}
_EMBED_CLASS = "no_embed_class"  # position embeddings on the patches only
_FC_NORM = "fc_norm"  # the final LayerNorm after a "gap" pooling (True) or on every token before it
# A ViT's arguments timm's `model_args` write as they are (the rest: `_timm_model_args`).
_AS_IS = ("patch_size", "hidden_dim", "depth", "num_heads", "class_token", "register_tokens", "layer_scale")
_AS_TIMM = {ours: timm for timm, ours in _TIMM_ARGUMENTS.items() if ours in _AS_IS}
# What a ViT has that timm's VisionTransformer cannot be given in `model_args`.
_NOT_IN_TIMM = ("representation_size", "distillation_token")
# transformers' default names for classes it was given none for.
_DEFAULT_LABEL = re.compile(r"LABEL_\d+")
_TRANSFORMERS_TYPES = ("vit", "deit")
# timm's evaluation transform where a `pretrained_cfg` says nothing (`timm.data.resolve_data_config`).
_TIMM_TRANSFORM_DEFAULTS = {"crop_pct": 0.875, "crop_mode": "center", "interpolation": "bicubic"}
# Pillow's resampling filters by number, as transformers' image processors record them.
_PIL_RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}


@dataclasses.dataclass(frozen=True)
class HubModel:
    """What a repo's config says: `arguments` (a ViT's architecture and evaluation transform,
    without its classes and normalisation), `num_classes` (0: no classifier), `class_names` (or
    None), `image_mean` and `image_std`, and `name` (timm's architecture, or the transformers model
    type)."""

    name: str
    arguments: dict
    num_classes: int
    class_names: list | None
    image_mean: list
    image_std: list


def read_config(config, source, preprocessor=None):
    """A `HubModel` from a repo's parsed `config.json` (and `preprocessor_config.json`);
    `source` names the repo in messages.

    Raises:
        ValueError: a config of another architecture, or of neither layout.
    """
    if "architecture" in config:
        return _from_timm(config, source)
    if "model_type" in config:
        return _from_transformers(config, source, preprocessor or {})
    raise ValueError(
        f"{source}'s config.json is neither timm's (no 'architecture') nor transformers' (no "
        f"'model_type'): it is not a ViT checkpoint keras-vit reads."
    )


def _from_timm(config, source):
    architecture = config["architecture"]
    if architecture not in MODEL_CONFIGS:
        close = difflib.get_close_matches(architecture, MODEL_CONFIGS, n=3, cutoff=0.6)
        hint = f" (close: {', '.join(close)})" if close else ""
        raise ValueError(
            f"{source} holds a {architecture}, an architecture keras-vit does not build{hint}: "
            f"`keras-vit models` lists those it does."
        )
    pretrained = config.get("pretrained_cfg", config)
    arguments = get_model_config(architecture)
    arguments.update(_timm_model_arguments(config.get("model_args", {}), arguments, source))
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
        image_mean=list(pretrained.get("mean", (0.5, 0.5, 0.5))),
        image_std=list(pretrained.get("std", (0.5, 0.5, 0.5))),
    )


def _timm_model_arguments(model_args, defaults, source):
    """timm's `model_args` as ViT arguments over the architecture's `defaults`."""
    unknown = sorted(set(model_args) - set(_TIMM_ARGUMENTS) - {"global_pool", _EMBED_CLASS, _FC_NORM})
    if unknown:
        raise ValueError(
            f"{source} builds its model with timm arguments keras-vit does not have ({', '.join(unknown)})."
        )
    arguments = {_TIMM_ARGUMENTS[k]: v for k, v in model_args.items() if _TIMM_ARGUMENTS.get(k)}
    if "mlp_ratio" in model_args:
        width = arguments.get("hidden_dim", defaults["hidden_dim"])
        arguments["mlp_dim"] = int(round(width * model_args["mlp_ratio"]))
    if _EMBED_CLASS in model_args:
        arguments["cls_position_embedding"] = not model_args[_EMBED_CLASS]
    if "global_pool" in model_args:
        pool = model_args["global_pool"]
        if pool not in _POOLING:
            raise ValueError(f"{source} pools with {pool!r}; keras-vit pools with 'token' or 'avg'.")
        arguments["pooling"] = _POOLING[pool]
    if model_args.get(_FC_NORM) is not None and arguments.get("pooling", defaults.get("pooling")) == "gap":
        arguments["norm_before_pooling"] = not model_args[_FC_NORM]
    return arguments


def _from_transformers(config, source, preprocessor):
    model_type = config["model_type"]
    if model_type not in _TRANSFORMERS_TYPES:
        raise ValueError(
            f"{source} holds a transformers {model_type!r} model; keras-vit reads ViT and DeiT ones."
        )
    if config.get("hidden_act", "gelu") != "gelu":
        raise ValueError(f"{source} uses the {config['hidden_act']!r} activation; keras-vit's ViT uses gelu.")
    heads = config.get("architectures") or []
    distilled = model_type == "deit" and any(name.endswith("WithTeacher") for name in heads)
    if model_type == "deit" and not distilled:
        raise ValueError(
            f"{source} is a DeiT classifier without its distillation head; keras-vit reads DeiT's "
            f"DeiTForImageClassificationWithTeacher checkpoints (both heads)."
        )
    labels = config.get("id2label") or {}
    names = [labels[key] for key in sorted(labels, key=int)]
    classifies = any(name.endswith(("ForImageClassification", "WithTeacher")) for name in heads)
    return HubModel(
        name=model_type,
        arguments=dict(
            image_size=config.get("image_size", 224),
            patch_size=config.get("patch_size", 16),
            hidden_dim=config["hidden_size"],
            depth=config["num_hidden_layers"],
            num_heads=config["num_attention_heads"],
            mlp_dim=config["intermediate_size"],
            channels=config.get("num_channels", 3),
            layer_norm_epsilon=config.get("layer_norm_eps", 1e-12),
            distillation_token=distilled,
            **_transformers_transform(preprocessor),
        ),
        num_classes=len(names) if classifies else 0,
        class_names=None if not names or all(_DEFAULT_LABEL.fullmatch(n) for n in names) else names,
        image_mean=list(preprocessor.get("image_mean", (0.5, 0.5, 0.5))),
        image_std=list(preprocessor.get("image_std", (0.5, 0.5, 0.5))),
    )


def _transformers_transform(preprocessor):
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


def _timm_model_args(config, named, architecture):
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
        if get_model_config(name).get("distillation_token", False) == config.get("distillation_token", False)
    ]
    return nearest_architecture(config, same_kind)


def nearest_architecture(arguments, names=None):
    """The named architecture (of `names`, by default all) that shares the most of `arguments` (a
    transformers repo's, which names none), preferring, among equals, the one at the nearest image
    size: training builds a named architecture and overrides where the repo differs."""
    size = arguments.get("image_size")
    size = size if isinstance(size, int) else (size or [None])[0]

    def shared(name):
        config = get_model_config(name)
        same = sum(config.get(key) == value for key, value in arguments.items() if key != "image_size")
        return same, -abs(config["image_size"] - size) if size else 0, name

    return max(names or MODEL_CONFIGS, key=shared)


def timm_config(model, architecture):
    """timm's `config.json` for a keras-vit ViT as `architecture` (a name timm has) with
    `model_args` for what differs from it, as timm's `save_for_hf` records them: what
    `timm.create_model("local-dir:...", pretrained=True)` builds.

    Raises:
        ValueError: the model has what timm's ViT cannot be given (named).
    """
    config = model.get_config()
    height, width = config["image_size"]
    model_args = {
        "img_size": [height, width],
        "in_chans": config["channels"],
        "num_classes": config["num_classes"] if config["include_top"] else 0,
        "global_pool": {value: key for key, value in _POOLING.items()}[config["pooling"]],
        **_timm_model_args(config, Architecture(**get_model_config(architecture)).config(), architecture),
    }
    pretrained = {
        "input_size": [config["channels"], height, width],
        "fixed_input_size": True,
        # The evaluation transform the model is read with (keras_vit.model.transform), timm's names.
        **{key: config[key] for key in TRANSFORM_FIELDS},
        # timm feeds (x / 255 - mean) / std: a model that normalises nothing takes x as it is.
        "mean": config["image_mean"] or [0.0] * config["channels"],
        "std": config["image_std"] or [1 / 255] * config["channels"],
        "num_classes": model_args["num_classes"],
        "first_conv": "patch_embed.proj",
        "classifier": "head",
    }
    result = {
        "architecture": architecture,
        "num_classes": model_args["num_classes"],
        "num_features": config["hidden_dim"],
        "global_pool": model_args["global_pool"],
        "model_args": model_args,
        "pretrained_cfg": pretrained,
    }
    if config["class_names"] and config["include_top"]:
        result["label_names"] = list(config["class_names"])
    return result
