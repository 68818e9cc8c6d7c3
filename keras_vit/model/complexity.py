"""Analytic parameter counts and FLOPs of any ViT configuration.

FLOPs count each multiply-accumulate of the matrix products (patch
projection, QKV, attention scores, attention-weighted values, output
projection, MLP, pre-logits, head) as 2 floating-point operations, the
convention of MFU figures and of PyTorch's FlopCounterMode. Normalisation,
softmax, GELU and additions are left out: under 1% at real sizes. Training
costs about 3x the forward pass (forward, plus two products per weight
product backward).
"""

from keras_vit.model import configs

_DEFAULTS = dict(
    num_classes=1000,
    channels=3,
    representation_size=None,
    include_top=True,
    layer_scale=None,
    cls_position_embedding=True,
    distillation_token=False,
    class_token=True,
    register_tokens=0,
)


def _architecture(model_or_name, overrides):
    if isinstance(model_or_name, str):
        arch = dict(_DEFAULTS, **configs.get_model_config(model_or_name))
    elif hasattr(model_or_name, "get_config"):
        arch = dict(model_or_name.get_config())
    else:
        arch = dict(_DEFAULTS, **model_or_name)
    arch.update(overrides)
    size = arch["image_size"]
    arch["image_size"] = (size, size) if isinstance(size, int) else tuple(size)
    return arch


def _num_patches(arch):
    height, width = arch["image_size"]
    return (height // arch["patch_size"]) * (width // arch["patch_size"])


def _prefix_tokens(arch):
    """[cls], DeiT's distillation token, the registers."""
    return int(arch["class_token"]) + int(arch["distillation_token"]) + arch["register_tokens"]


def _heads(arch):
    return 2 if arch["distillation_token"] else 1


def parameter_count(model_or_name, **overrides):
    """Number of weights of a config name, a `ViT`, or a dict of `ViT` arguments."""
    a = _architecture(model_or_name, overrides)
    d, m, p, c = a["hidden_dim"], a["mlp_dim"], a["patch_size"], a["channels"]
    prefix = _prefix_tokens(a)
    position_tokens = _num_patches(a) + (prefix if a["cls_position_embedding"] else 0)
    embed = p * p * c * d + d + prefix * d + position_tokens * d
    block = 2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * m + m) + (m * d + d)
    if a["layer_scale"] is not None:
        block += 2 * d
    total = embed + a["depth"] * block + 2 * d
    features = d
    if a.get("representation_size"):
        total += d * a["representation_size"] + a["representation_size"]
        features = a["representation_size"]
    if a.get("include_top", True):
        total += _heads(a) * (features * a["num_classes"] + a["num_classes"])
    return total


def forward_flops(model_or_name, **overrides):
    """FLOPs of one image's forward pass (2 per multiply-accumulate)."""
    a = _architecture(model_or_name, overrides)
    d, m, p, c = a["hidden_dim"], a["mlp_dim"], a["patch_size"], a["channels"]
    n = _num_patches(a)
    t = n + _prefix_tokens(a)
    macs = n * p * p * c * d
    per_block = t * d * 3 * d + 2 * t * t * d + t * d * d + 2 * t * d * m
    macs += a["depth"] * per_block
    features = d
    if a.get("representation_size"):
        macs += d * a["representation_size"]
        features = a["representation_size"]
    if a.get("include_top", True):
        macs += _heads(a) * features * a["num_classes"]
    return 2 * macs


def training_flops(model_or_name, **overrides):
    """FLOPs of one image's training step: 3x the forward pass."""
    return 3 * forward_flops(model_or_name, **overrides)
