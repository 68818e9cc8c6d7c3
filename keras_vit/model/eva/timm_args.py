"""timm's `Eva` keyword arguments (an entry point's, or a repo's `model_args`) as an Eva's, and
back. Most are the same names; the norm is a part (a class) in timm and a name here."""

from keras_vit.model.eva.architecture import ARGUMENTS

# timm's names that are keras-vit's under another name.
RENAMED = {
    "img_size": "image_size",
    "in_chans": "channels",
    "drop_rate": "dropout",
    "attn_drop_rate": "attention_dropout",
}
# timm's arguments that change nothing at inference on a fixed size: the patch grid follows the
# input (`dynamic_img_size`: the same tables for the size built), dropout of positions and
# patches, the head's initial scale.
IGNORED = (
    "dynamic_img_size",
    "pos_drop_rate",
    "patch_drop_rate",
    "proj_drop_rate",
    "head_init_scale",
    "num_classes",
)


class NotBuildable(ValueError):
    """timm's arguments name a part keras-vit's Eva does not have."""


def from_timm(kwargs, source):
    """An Eva's arguments from timm's keyword arguments (`norm_layer` by name, as the entry-point
    table writes it: `{"name": "layernorm" | "RmsNorm", "eps": ...}`)."""
    arguments = {}
    for key, value in kwargs.items():
        if key in IGNORED:
            continue
        if key == "norm_layer":
            arguments.update(_norm(value, source))
            continue
        name = RENAMED.get(key, key)
        if name not in ARGUMENTS:
            raise NotBuildable(
                f"{source} gives timm's Eva {key}={value!r}, which keras-vit's Eva does not have"
            )
        arguments[name] = value
    if arguments.get("rope_type", "cat") not in ("cat", "mixed", "dinov3") and arguments.get(
        "use_rot_pos_emb"
    ):
        raise NotBuildable(
            f"{source} has a {arguments['rope_type']!r} rotary embedding, which keras-vit does not build"
        )
    return arguments


def _norm(value, source):
    if isinstance(value, str):
        value = {"name": value}
    name = value.get("name", "").lower()
    if name not in ("layernorm", "rmsnorm"):
        raise NotBuildable(
            f"{source} normalises with {value.get('name')}, which keras-vit's Eva does not have"
        )
    default = 1e-6
    return {"norm": name, "layer_norm_epsilon": float(value.get("eps", default))}


def to_timm(arguments):
    """An Eva's arguments as timm's `model_args` (the norm as timm's config cannot name a class:
    left out; a model whose norm differs from its architecture's is refused by the caller)."""
    inverse = {ours: theirs for theirs, ours in RENAMED.items()}
    skip = ("norm", "layer_norm_epsilon", "image_mean", "image_std", "class_names", "license", "crop_pct")
    skip += (
        "crop_mode",
        "interpolation",
        "include_top",
        "classifier_activation",
        "num_classes",
        "image_size",
    )
    skip += ("channels",)
    return {inverse.get(k, k): v for k, v in arguments.items() if k not in skip}
