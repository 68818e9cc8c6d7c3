"""The Eva family on the hub: timm's `model_args` and transformers' `DINOv3ViTConfig` as an Eva's
arguments, and an Eva's arguments as timm's `model_args` (`keras_vit.model.hub_config` reads and
writes the rest of a repo's config).

A transformers `DINOv3ViTModel` repo is built as the Eva it is, with transformers' meaning of
its output: `pooler_output`, the [cls] token after the final norm (`global_pool="token"`), where
timm's DINOv3 entry points pool the patch mean."""

from keras_vit.model.eva import FAMILY, timm_args
from keras_vit.model.eva.configs import MODEL_CONFIGS

TRANSFORMERS_TYPES = ("dinov3_vit",)
# What `model_args` cannot change in timm (the norm is a class there).
_NOT_IN_TIMM = ("norm", "layer_norm_epsilon")


def timm_arguments(model_args, defaults, source):
    """timm's `model_args` as an Eva's arguments over the named architecture's `defaults`."""
    try:
        return timm_args.from_timm(model_args, source)
    except timm_args.NotBuildable as reason:
        raise ValueError(f"{reason}.") from None


def transformers_arguments(config, source, input_size=None):
    """A transformers `DINOv3ViTConfig` as an Eva's architecture: separate q/k/v (timm's
    `EvaAttention` when the key has no bias, `AttentionRope` when it has), DINOv3's rotary
    embedding, LayerScale, registers, [cls] pooling. `input_size` is not read: rotary tables fit
    any size, and the config's is the model's."""
    gated = bool(config.get("use_gated_mlp", False))
    activation = config.get("hidden_act", "gelu")
    biases_kept = config.get("proj_bias", True) and config.get("mlp_bias", True)
    if activation != ("silu" if gated else "gelu") or not biases_kept:
        raise ValueError(
            f"{source}: a DINOv3 with the {activation!r} activation{' (gated)' if gated else ''} and biases "
            f"proj={config.get('proj_bias', True)}, mlp={config.get('mlp_bias', True)}; keras-vit's Eva has "
            "gelu (silu when gated) and both biases."
        )
    biases = tuple(bool(config.get(f"{part}_bias", True)) for part in ("query", "key", "value"))
    kinds = {
        (True, False, True): ("eva", True),
        (True, True, True): ("rope", True),
        (False,) * 3: ("eva", False),
    }
    if biases not in kinds:
        raise ValueError(
            f"{source}: query, key, value biases {biases}; keras-vit's Eva has q and v, all or none."
        )
    attn_type, qkv_bias = kinds[biases]
    hidden, intermediate = config["hidden_size"], config["intermediate_size"]
    ratio = intermediate / hidden
    if int(hidden * ratio) != intermediate:  # the ratio timm's int() rounds back to the width
        ratio = (intermediate + 0.5) / hidden
    return dict(
        image_size=config.get("image_size", 224),
        patch_size=config.get("patch_size", 16),
        channels=config.get("num_channels", 3),
        embed_dim=hidden,
        depth=config["num_hidden_layers"],
        num_heads=config["num_attention_heads"],
        qkv_fused=False,
        qkv_bias=qkv_bias,
        attn_type=attn_type,
        mlp_ratio=ratio,
        # transformers' gated MLP keeps gate and up apart: timm's SwiGLU (aligned to 1: as it is).
        swiglu_mlp=gated,
        swiglu_align_to=1 if gated else 0,
        init_values=config.get("layerscale_value", 1.0),
        num_reg_tokens=config.get("num_register_tokens", 0),
        use_abs_pos_emb=False,
        use_rot_pos_emb=True,
        rope_type="dinov3",
        rope_temperature=config.get("rope_theta", 100.0),
        rope_rotate_half=True,
        global_pool="token",
        use_fc_norm=False,
        layer_norm_epsilon=config.get("layer_norm_eps", 1e-5),
        rope_shift_coords=config.get("pos_embed_shift"),
        rope_jitter_coords=config.get("pos_embed_jitter"),
        rope_rescale_coords=config.get("pos_embed_rescale"),
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
