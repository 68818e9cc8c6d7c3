"""Writes keras-vit's table of pretrained tags, the label sets they use and the keyword arguments of
timm's ViT entry points, from the installed timm.

    .venv/bin/python scripts/generate_pretrained_table.py

First the keyword arguments each entry point of timm's `vision_transformer`, `deit` and
`vision_transformer_relpos` modules gives its model (`tables/timm_vit_entry_points.json`, its parts
by name, as `keras_vit.model.vit.timm_args` reads them): keras-vit builds every one whose parts it has, by its
timm name. Then, for every architecture keras-vit builds, of every family, that timm has
(`keras_vit.list_models()` and `timm.list_models()`), every tag timm has weights for on a hub or at a URL: its
repo, input size, class count, label set, and the normalisation, evaluation transform and licence
of its pretrained_cfg. The label sets (ImageNet-1k and the ImageNet variants these tags use) are
written as timm's `ImageNetInfo` gives them: each class's WordNet id and description. Run it again
after upgrading timm, and commit what it writes; keras-vit reads these files, never timm.
"""

import functools
import gzip
import inspect
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import timm  # noqa: E402
import torch  # noqa: E402
from timm.data import ImageNetInfo, infer_imagenet_subset  # noqa: E402
from timm.layers import mlp as timm_mlp  # noqa: E402
from timm.layers import norm as timm_norm  # noqa: E402
from timm.models import deit, get_pretrained_cfg, resnetv2  # noqa: E402
from timm.models import eva as timm_eva  # noqa: E402
from timm.models import vision_transformer as timm_vit  # noqa: E402
from timm.models import vision_transformer_hybrid as timm_hybrid  # noqa: E402
from timm.models import vision_transformer_relpos as timm_relpos  # noqa: E402

TABLES = os.path.join(ROOT, "keras_vit", "model", "tables")
ENTRY_POINTS_FILE = "timm_vit_entry_points.json"
# The same for timm's `eva` module (its `Eva`: keras-vit's Eva family).
EVA_ENTRY_POINTS_FILE = "timm_eva_entry_points.json"
# timm's modules whose entry points build a `VisionTransformer` (DeiT's distilled one too, the
# hybrids' with a CNN in their `HybridEmbed`) or a `VisionTransformerRelPos`.
VIT_MODULES = ("vision_transformer", "deit", "vision_transformer_relpos", "vision_transformer_hybrid")
# `VisionTransformerRelPos`' keyword arguments whose defaults differ from `VisionTransformer`'s, or
# that it alone has: written out for each of its entry points, with the class's defaults.
RELPOS_ARGUMENTS = (
    "global_pool",
    "init_values",
    "class_token",
    "fc_norm",
    "qkv_bias",
    "rel_pos_type",
    "rel_pos_dim",
    "shared_rel_pos",
    "block_fn",
)
# The pretrained_cfg fields each tag's entry carries.
PRETRAINED_FIELDS = ("mean", "std", "crop_pct", "crop_mode", "interpolation", "license")


class _Captured(Exception):
    pass


def entry_point_kwargs(name):
    """The keyword arguments timm's entry point `name` gives its model class (its own, with the
    default tag's input size and channels), its parts by name."""

    def model_class(**kwargs):
        raise _Captured(kwargs)

    relpos_defaults = inspect.signature(timm_relpos.VisionTransformerRelPos.__init__).parameters
    relpos_defaults = {key: relpos_defaults[key].default for key in RELPOS_ARGUMENTS}

    def relpos_class(**kwargs):
        raise _Captured({**relpos_defaults, **kwargs})

    saved = (
        timm_vit.VisionTransformer,
        deit.VisionTransformer,
        deit.VisionTransformerDistilled,
        timm_relpos.VisionTransformerRelPos,
        timm_hybrid.VisionTransformer,
    )
    timm_vit.VisionTransformer = deit.VisionTransformer = timm_hybrid.VisionTransformer = model_class
    deit.VisionTransformerDistilled = functools.partial(model_class, distilled=True)
    timm_relpos.VisionTransformerRelPos = relpos_class
    try:
        timm.create_model(name, pretrained=False)
    except _Captured as captured:
        kwargs = captured.args[0]
    else:
        raise RuntimeError(f"timm's {name} builds no VisionTransformer")
    finally:
        (
            timm_vit.VisionTransformer,
            deit.VisionTransformer,
            deit.VisionTransformerDistilled,
            timm_relpos.VisionTransformerRelPos,
            timm_hybrid.VisionTransformer,
        ) = saved
    kwargs.pop("num_classes", None)  # the tag's, not the architecture's
    return {key: _named(key, value) for key, value in kwargs.items()}


def eva_entry_point_kwargs(name):
    """The keyword arguments timm's `eva` entry point `name` gives its `Eva`, its parts by name."""

    def model_class(**kwargs):
        raise _Captured(kwargs)

    saved, timm_eva.Eva = timm_eva.Eva, model_class
    try:
        timm.create_model(name, pretrained=False)
    except _Captured as captured:
        kwargs = captured.args[0]
    else:
        raise RuntimeError(f"timm's {name} builds no Eva")
    finally:
        timm_eva.Eva = saved
    kwargs.pop("num_classes", None)
    return {key: _named(key, value) for key, value in kwargs.items()}


def _named(key, value):
    """A keyword argument's value as JSON: a part (a class, a partial) by its name."""
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_named(key, v) for v in value]
    if key in ("norm_layer", "embed_norm_layer"):
        return _norm_layer(value)
    if key == "embed_layer":
        return _embed_layer(value)
    if key == "act_layer":
        names = {torch.nn.GELU: "gelu", torch.nn.SiLU: "silu"}
        return names.get(value, getattr(value, "__name__", repr(value)))
    if key == "mlp_layer":
        if value is timm_mlp.Mlp:
            return "mlp"
        if value is timm_mlp.SwiGLU:
            return "swiglu"
        if isinstance(value, functools.partial) and value.func is timm_mlp.GluMlp:
            gate_last = value.keywords.get("gate_last", True)
            if value.keywords.get("act_layer") is torch.nn.SiLU and not gate_last:
                return "swiglu_packed"
    return getattr(value, "__name__", None) or repr(value)


def _embed_layer(value):
    """A hybrid's `HybridEmbed` by its backbone: timm's ResNetV2 of `_resnetv2` (its stage depths;
    its stem alone has none), else the backbone's class."""
    keywords = value.keywords if isinstance(value, functools.partial) else {}
    backbone = keywords.get("backbone")
    if backbone is None:
        return getattr(value, "__name__", repr(value))
    extra = {key: _named(key, v) for key, v in keywords.items() if key != "backbone"}
    if isinstance(backbone, resnetv2.ResNetV2):
        depths = [len(stage.blocks) for stage in backbone.stages]
        return {"name": "HybridEmbed", "backbone": "resnetv2", "depths": depths, **extra}
    stem_alone = ["conv", "norm", "pool"]  # create_resnetv2_stem's, without pre-activation
    children = [name for name, _ in backbone.named_children()]
    if isinstance(backbone, torch.nn.Sequential) and children == stem_alone:
        return {"name": "HybridEmbed", "backbone": "resnetv2", "depths": [], **extra}  # the stem alone
    return {"name": "HybridEmbed", "backbone": type(backbone).__name__, **extra}


def _norm_layer(value):
    keywords = value.keywords if isinstance(value, functools.partial) else {}
    cls = value.func if isinstance(value, functools.partial) else value
    if cls in (timm_norm.LayerNorm, torch.nn.LayerNorm):
        default = 1e-6 if cls is timm_norm.LayerNorm else 1e-5
        return {"name": "layernorm", "eps": keywords.get("eps", default)}
    if cls is timm_norm.RmsNorm:
        return {"name": "rmsnorm", "eps": keywords.get("eps", 1e-6)}
    return {"name": getattr(cls, "__name__", repr(cls)), **{k: repr(v) for k, v in keywords.items()}}


def write_entry_points():
    names = sorted(name for module in VIT_MODULES for name in timm.list_models(module=module))
    entry_points = {name: entry_point_kwargs(name) for name in names}
    with open(os.path.join(TABLES, ENTRY_POINTS_FILE), "w") as f:
        json.dump(entry_points, f, indent=1, sort_keys=True)
        f.write("\n")
    eva = {name: eva_entry_point_kwargs(name) for name in sorted(timm.list_models(module="eva"))}
    with open(os.path.join(TABLES, EVA_ENTRY_POINTS_FILE), "w") as f:
        json.dump(eva, f, indent=1, sort_keys=True)
        f.write("\n")
    return {**entry_points, **eva}


def tags_of(architecture):
    """`{"arch.tag": entry}` of the architecture's tags with weights on a hub or at a URL."""
    entries = {}
    for name in timm.list_pretrained(f"{architecture}.*"):
        config = get_pretrained_cfg(name).to_dict()
        if not config.get("hf_hub_id") and not config.get("url"):
            continue  # no weights
        # Weights at a URL only (I-JEPA's): downloaded from there, read as timm's filter reads them.
        where = {"repo": config["hf_hub_id"]} if config.get("hf_hub_id") else {"url": config["url"]}
        entries[name] = {
            **where,
            # The size, for `keras-vit models --pretrained`; the normalisation, the evaluation
            # transform and the licence as timm's pretrained_cfg gives them (a repo's own
            # config.json says the same, and is read for them when the model is built).
            "image_size": list(config["input_size"][1:]),
            "num_classes": config["num_classes"],
            "label_set": infer_imagenet_subset(config) if config["num_classes"] else None,
            **{field: _json(config.get(field)) for field in PRETRAINED_FIELDS},
        }
    return entries


def _json(value):
    return list(value) if isinstance(value, tuple) else value


def default_tag(architecture, entries):
    """timm's default tag for the architecture, when it has weights on a hub."""
    config = get_pretrained_cfg(architecture)
    name = f"{architecture}.{config.tag}" if config is not None and config.tag else None
    return name if name in entries else None


def main():
    entry_points = write_entry_points()
    # keras-vit's configs, with the entry points just written (imported only now).
    from keras_vit.model.pretrained import LABEL_SET_FILE, TABLE_FILE
    from keras_vit.model.registry import list_models

    tags, defaults = {}, {}
    # keras-vit's own small-image configs are not timm's.
    architectures = [name for name in list_models() if name in timm.list_models()]
    for architecture in architectures:
        entries = tags_of(architecture)
        tags.update(entries)
        if default := default_tag(architecture, entries):
            defaults[architecture] = default
    label_sets = sorted({entry["label_set"] for entry in tags.values() if entry["label_set"]})
    table = {
        "generated_by": "scripts/generate_pretrained_table.py",
        "timm_version": timm.__version__,
        "architectures": architectures,
        "defaults": defaults,
        "label_sets": {name: ImageNetInfo(name).num_classes() for name in label_sets},
        "tags": tags,
    }
    with open(os.path.join(TABLES, TABLE_FILE), "w") as f:
        json.dump(table, f, indent=1, sort_keys=True)
        f.write("\n")
    for name in label_sets:
        info = ImageNetInfo(name)
        pairs = zip(info.label_names(), info.label_descriptions(), strict=True)
        rows = [f"{wnid}\t{text}" for wnid, text in pairs]
        # mtime=0: the same names give the same bytes, so a rerun changes nothing in git.
        with gzip.GzipFile(os.path.join(TABLES, LABEL_SET_FILE.format(name)), "wb", mtime=0) as f:
            f.write(("\n".join(rows) + "\n").encode())
    print(
        f"{len(entry_points)} timm ViT entry points; {len(tags)} tags of {len(defaults)} architectures, "
        f"label sets {', '.join(label_sets)}: {TABLES}"
    )


if __name__ == "__main__":
    main()
